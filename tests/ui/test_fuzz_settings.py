"""The app's settings file (app.yaml in the config home) under garbage (hypothesis): values of the wrong kind,
unknown keys, files cut short, random bytes. The start dialog and the console window always open (offscreen, no
display needed); every value they cannot use is one warning naming the file and the key, and its default is used;
the bad file is never overwritten silently (it is kept beside as app.yaml.damaged-<time> before the first save);
a file the app itself wrote opens without a warning.

Budgets are bounded for CI (derandomized, tests/support/fuzz.py); HG_DAGGER_FUZZ_EXAMPLES=300 runs a longer
random search."""

from __future__ import annotations

import logging

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import budget, texts, yaml_values

from hg_dagger.control.live import CommandQueue, LatestSlot
from hg_dagger.devices.discovery import KEYBOARD
from hg_dagger.ui.main_window import MainWindow
from hg_dagger.ui.settings import AppSettings, SettingsFile
from hg_dagger.ui.start_dialog import StartDialog

pytestmark = [pytest.mark.simulation, pytest.mark.app]

KEYS = {section: list(model.model_fields) for section, model in
        (("start", AppSettings.model_fields["start"].annotation), ("ui", AppSettings.model_fields["ui"].annotation),
         ("window", AppSettings.model_fields["window"].annotation))}
values = st.one_of(yaml_values, texts, st.integers(-10**6, 10**6), st.sampled_from([7557, 0, 99999, "bridge", "x"]),
                   st.lists(texts, max_size=10), st.sampled_from(["AAAA", "not base64!", "AdnQyw=="]))


@st.composite
def settings_files(draw) -> bytes:
    how = draw(st.sampled_from(["yaml", "yaml", "yaml", "cut", "bytes"]))
    if how == "bytes":
        return draw(st.binary(max_size=200))
    data: dict = {}
    for section, keys in KEYS.items():
        if draw(st.booleans()):
            data[section] = draw(st.one_of(
                st.dictionaries(st.sampled_from(keys + ["bogus"]), values, max_size=4), yaml_values))
    if draw(st.booleans()):
        data[draw(texts)] = draw(yaml_values)
    raw = yaml.safe_dump(data, allow_unicode=True).encode("utf-8")
    return raw[: draw(st.integers(0, len(raw)))] if how == "cut" else raw


def _open(qtbot, path):
    s = SettingsFile(path)
    dlg = StartDialog(settings=s, tasks=["toy_reach", "fetch_pick_place"])
    qtbot.addWidget(dlg)
    win = MainWindow(LatestSlot(), CommandQueue(), settings=s, scan=lambda: [KEYBOARD])
    qtbot.addWidget(win)
    win.show()
    return s, dlg, win


def _warnings(caplog, path) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("hg_dagger.ui")]
    assert all(ln.startswith(f"settings {path}: ") and "\n" not in ln for ln in lines), lines
    return lines


@budget(15)
@given(body=settings_files())
def test_any_settings_file_opens_the_app_with_one_warning_per_bad_value(qtbot, tmp_path_factory, caplog, body):
    folder = tmp_path_factory.mktemp("settings")
    path = folder / "app.yaml"
    path.write_bytes(body)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
        bad = _warnings(caplog, path)
        assert path.read_bytes() == body  # read, never rewritten on reading
        win.close()  # saves the layout
    keys = [ln.split(": ", 2)[1] for ln in bad]
    assert len(keys) == len(set(keys)), bad  # one warning per key
    assert 1 <= dlg.port.value() <= 65535
    assert all(isinstance(x, str) and x for x in dlg.recent_stores())
    kept = list(folder.glob("app.yaml.damaged-*"))
    if bad:  # the file as it was is kept beside the one the app saved, and a warning names it
        assert [k.read_bytes() for k in kept] == [body]
        assert any(kept[0].name in ln for ln in _warnings(caplog, path))
    else:
        assert kept == []
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = SettingsFile(path)  # what the app saved reads back without a warning
    assert _warnings(caplog, path) == [] and again.data == s.data


def test_a_settings_file_the_app_wrote_opens_without_a_warning(qtbot, tmp_path, caplog):
    path = tmp_path / "app.yaml"
    s, dlg, win = _open(qtbot, path)
    dlg.operator.setText("op-07")
    dlg.backend.setCurrentIndex(dlg.backend.findData("bridge"))
    dlg.port.setValue(9001)
    dlg.store.setEditText("/data/a.zarr")
    dlg.accept()
    win.close()  # saves the layout
    win.set_sound(False)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
    assert _warnings(caplog, path) == []
    assert (dlg.operator.text(), dlg.port.value(), dlg.recent_stores()) == ("op-07", 9001, ["/data/a.zarr"])
    assert not win.banner.sound_enabled and s.data.window.geometry
    win.close()


def test_wrong_values_are_named_once_with_what_is_allowed_and_replaced_by_defaults(qtbot, tmp_path, caplog):
    path = tmp_path / "app.yaml"
    path.write_text("start:\n  operator: op-07\n  port: abc\n  backend: robot\n  recent_stores: [/a.zarr, 5]\n"
                    "  bogus: 1\nui:\n  sound: maybe\nwindow:\n  geometry: 'not base64!'\n")
    with caplog.at_level(logging.WARNING):
        s, dlg, win = _open(qtbot, path)
        StartDialog(settings=s)  # read again: no second warning
    lines = _warnings(caplog, path)
    for key in ("start.port", "start.backend", "start.recent_stores", "start.bogus", "ui.sound", "window.geometry"):
        assert sum(f": key {key}" in ln for ln in lines) == 1, (key, lines)
    assert f"settings {path}: key start.backend: Input should be 'embedded' or 'bridge' (got 'robot'); using " \
           "'embedded'" in lines, lines
    assert any(ln.endswith("key start.port: Input should be a valid integer, unable to parse string as an integer "
                           "(got 'abc'); allowed: a whole number from 1 to 65535; using 7557") for ln in lines), lines
    assert any(ln.endswith("key start.bogus: unknown key (known keys here: backend, host, operator, policy, port, "
                           "recent_stores, task, token_file); ignored") for ln in lines), lines
    assert dlg.operator.text() == "op-07"  # the rest of the file still counts
    assert dlg.port.value() == 7557 and win.banner.sound_enabled and dlg.recent_stores() == []
    win.close()
