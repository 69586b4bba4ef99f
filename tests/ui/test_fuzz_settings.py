"""The app's settings file under garbage (hypothesis): values of the wrong kind, QSettings' own encodings gone
wrong (@Variant, @ByteArray), files cut short, random bytes. The start dialog and the console window always
open (offscreen, no display needed); every value they cannot use is one warning naming the file and the key,
and its default is used; a file the app itself wrote opens without a warning.

Budgets are bounded for CI (derandomized, tests/support/fuzz.py); HG_DAGGER_FUZZ_EXAMPLES=300 runs a longer
random search."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import budget, texts

from hg_dagger.control.live import CommandQueue, LatestSlot
from hg_dagger.devices.discovery import KEYBOARD
from hg_dagger.ui.main_window import MainWindow
from hg_dagger.ui.settings import app_settings
from hg_dagger.ui.start_dialog import StartDialog

pytestmark = [pytest.mark.simulation, pytest.mark.app]

KEYS = {"start": ["operator", "task", "backend", "host", "port", "token_file", "recent_stores"],
        "ui": ["sound"], "window": ["geometry", "split_main", "split_view", "plots"]}
values = st.one_of(
    texts, st.integers(-10**6, 10**6).map(str), st.sampled_from(["true", "false", "maybe", "", "7557", "0", "99999"]),
    st.binary(max_size=24).map(lambda b: "@ByteArray(" + b.decode("latin-1") + ")"),
    st.binary(max_size=24).map(lambda b: "@Variant(" + b.decode("latin-1") + ")"),
    st.binary(max_size=24).map(lambda b: "\\x40Variant(" + b.decode("latin-1") + ")"),  # the tag escaped
    st.sampled_from(["@Vari\\\nant(\\0\\0\\0\\x42)", "x\x0b@Variant(\\0\\0\\0\\x42)", "@DateTime(\\0\\0)",
                     "a, @Variant(\\0\\0\\0\\x42)"]),  # continued, after a separator Qt does not know, in a list
    st.sampled_from(["@Variant(\\0\\0\\0\\x7f\\0\\0\\0\\0)", "@Rect(1 2 3 4)", "@Size(10 x)", "@Point(x y)",
                     "@ByteArray(\\x1\\xd9\\xd0\\xcb)", "a, b, c", '"quoted, list"', "@Invalid()"]),
)


@st.composite
def settings_files(draw) -> bytes:
    how = draw(st.sampled_from(["ini", "ini", "ini", "cut", "bytes"]))
    if how == "bytes":
        return draw(st.binary(max_size=200))
    lines = []
    for group, keys in KEYS.items():
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from([f"[{group}]", f"[{group}", f"[{group}]]"])))
            for k in draw(st.lists(st.sampled_from(keys), max_size=4)):
                lines.append(f"{k}={draw(values)}")
    if draw(st.booleans()):
        lines.append(draw(texts))
    raw = "\n".join(lines).encode("utf-8", "surrogateescape")
    return raw[: draw(st.integers(0, len(raw)))] if how == "cut" else raw


def _open(qtbot, path):
    s = app_settings(path)
    dlg = StartDialog(settings=s, tasks=["toy_reach", "fetch_pick_place"])
    qtbot.addWidget(dlg)
    win = MainWindow(LatestSlot(), CommandQueue(), settings=s, scan=lambda: [KEYBOARD])
    qtbot.addWidget(win)
    win.show()
    return s, dlg, win


def _warnings(caplog, path) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("hg_dagger.ui")]
    assert all(ln.startswith(f"settings {path}: ") for ln in lines), lines
    return lines


@budget(15)
@given(body=settings_files())
def test_any_settings_file_opens_the_app_with_one_warning_per_bad_value(qtbot, tmp_path_factory, caplog, body):
    path = tmp_path_factory.mktemp("settings") / "hg-dagger.ini"
    path.write_bytes(body)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
        win.close()
    assert not any(tag in path.read_bytes() for tag in (b"@Variant(", b"@DateTime("))  # nothing Qt would deserialize
    lines = _warnings(caplog, path)
    keys = [ln.split(": ", 1)[1].split(" ", 1)[0] for ln in lines]
    assert len(keys) == len(set(keys)), lines  # one warning per key
    assert 1 <= dlg.port.value() <= 65535
    if "start/port" in keys:
        assert dlg.port.value() == 7557
    if "ui/sound" in keys:
        assert win.banner.sound_enabled
    assert all(isinstance(x, str) and x for x in dlg.recent_stores())


def test_a_settings_file_the_app_wrote_opens_without_a_warning(qtbot, tmp_path, caplog):
    path = tmp_path / "hg-dagger.ini"
    s, dlg, win = _open(qtbot, path)
    dlg.operator.setText("op-07")
    dlg.backend.setCurrentIndex(dlg.backend.findData("bridge"))
    dlg.port.setValue(9001)
    dlg.store.setEditText("/data/a.zarr")
    dlg.accept()
    win.close()  # saves the layout
    s.setValue("ui/sound", False)
    s.sync()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
    assert _warnings(caplog, path) == []
    assert (dlg.operator.text(), dlg.port.value(), dlg.recent_stores()) == ("op-07", 9001, ["/data/a.zarr"])
    assert not win.banner.sound_enabled
    win.close()


def test_wrong_values_are_named_once_and_replaced_by_defaults(qtbot, tmp_path, caplog):
    path = tmp_path / "hg-dagger.ini"
    path.write_text("[start]\nport=abc\nhost=@Variant(\\0\\0\\0\\x7f\\0)\nrecent_stores=@ByteArray(x)\n"
                    "[ui]\nsound=maybe\n[window]\ngeometry=hello\nsplit_main=@ByteArray(junk)\n")
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
        StartDialog(settings=s)  # read again: no second warning
    lines = _warnings(caplog, path)
    for key in ("start/port", "ui/sound", "window/geometry", "window/split_main", "start/recent_stores"):
        assert sum(f": {key} " in ln for ln in lines) == 1, (key, lines)
    assert dlg.port.value() == 7557 and win.banner.sound_enabled and dlg.recent_stores() == []
    win.close()


# Qt decodes @Variant(...) while it parses the file; these bytes (type 66 and a garbage payload) crash the process
# inside QSettings' constructor, so the check runs in a child process of its own.
CRASHING_VARIANT = bytes.fromhex("0000004236c342a4219c564686fea59211200e0e").decode("latin-1")
OPEN_THE_APP = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from PyQt6.QtWidgets import QApplication
app = QApplication([])
from hg_dagger.ui.settings import app_settings
from hg_dagger.ui.start_dialog import StartDialog
dlg = StartDialog(settings=app_settings(sys.argv[1]), tasks=["toy_reach"])
print("operator", dlg.operator.text(), "host", dlg.host.text())
"""


@pytest.mark.subprocess
def test_a_value_that_crashes_qt_is_taken_out_and_the_file_kept(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "hg-dagger.conf"
    original = ("[start]\noperator=op-07\nhost=@Variant(" + CRASHING_VARIANT + ")\nport=9001\n").encode("utf-8")
    path.write_bytes(original)
    out = subprocess.run([sys.executable, "-c", OPEN_THE_APP, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "operator op-07 host 127.0.0.1" in out.stdout
    warnings = [ln for ln in out.stderr.splitlines() if ln.startswith(f"settings {path}: ")]
    assert len(warnings) == 1 and "start/host holds a Qt-serialized value" in warnings[0], out.stderr
    backups = list(tmp_path.glob("hg-dagger.conf.damaged-*"))
    assert [b.read_bytes() for b in backups] == [original]  # nothing lost
    assert path.read_bytes() == b"[start]\noperator=op-07\nport=9001\n"
    assert backups[0].name in warnings[0]


def test_a_one_entry_list_an_earlier_version_wrote_is_read_and_rewritten_as_text(qtbot, tmp_path, caplog):
    path = tmp_path / "hg-dagger.conf"
    path.write_text("[start]\noperator=op-07\nrecent_stores=@Variant(\\0\\0\\0\\t\\0\\0\\0\\x1\\0\\0\\0\\n\\0\\0\\0\\x18"
                    "\\0/\\0\\x64\\0\\x61\\0t\\0\\x61\\0/\\0\\x61\\0.\\0z\\0\\x61\\0r\\0r)\n")
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
    assert _warnings(caplog, path) == [] and not list(tmp_path.glob("*.damaged-*"))
    assert dlg.recent_stores() == ["/data/a.zarr"] and dlg.operator.text() == "op-07"
    assert "@Variant" not in path.read_text() and "/data/a.zarr" in path.read_text()
    win.close()
