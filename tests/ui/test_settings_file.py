"""The app's settings as one pydantic model in one YAML file in the config home (no Qt here): where it lives, the
upgrade from the QSettings file of earlier versions (read once; a remembered pseudonym survives), a bad file (one
line per key naming the file, the key and what is allowed; defaults; the file kept before the first save over it),
and saves that never leave half a file."""

from __future__ import annotations

import logging
import os

import pytest

from hg_dagger.ui.settings import OLD_FILE_NAME, AppSettings, SettingsFile, default_path, old_values

# Qt's QDataStream bytes that crash the process inside QSettings' constructor (type 66, garbage payload)
CRASHING_VARIANT = bytes.fromhex("0000004236c342a4219c564686fea59211200e0e").decode("latin-1")
OLD = ("[General]\ntop=x\n\n[start]\nhost=\" 10.0.0.5\"\noperator=op-07\nport=9001\nbackend=bridge\n"
       "recent_stores=/data/a.zarr, \"/d/b,c.zarr\", \\xe9t\\xe9.zarr\ntask=toy_reach\ntoken_file=C:\\\\tok\\\\x\n"
       "weird=@Variant(" + CRASHING_VARIANT + ")\n\n[ui]\nsound=false\n\n[window]\ngeometry=@ByteArray(\\x1\\xd9\\xd0)\n")


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_settings_file_is_app_yaml_in_the_config_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "hg-dagger" / "app.yaml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")  # the XDG spec: a relative path is ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".config" / "hg-dagger" / "app.yaml"


def test_the_old_qsettings_file_is_read_once_and_the_pseudonym_survives_the_upgrade(tmp_path, caplog):
    old = tmp_path / OLD_FILE_NAME
    old.write_bytes(OLD.encode("utf-8"))
    with caplog.at_level(logging.INFO):
        s = SettingsFile(tmp_path / "app.yaml")
    start = s.data.start
    assert (start.operator, start.host, start.port, start.backend, start.task) == (
        "op-07", "10.0.0.5", 9001, "bridge", "toy_reach")
    assert start.recent_stores == ["/data/a.zarr", "/d/b,c.zarr", "été.zarr"] and start.token_file == r"C:\tok\x"
    assert s.data.ui.sound is False and s.data.window.geometry == ""  # layouts are not carried over
    assert warnings(caplog) == [] and any("read " in r.getMessage() and "once" in r.getMessage()
                                          for r in caplog.records)
    assert "CRASHING" not in (tmp_path / "app.yaml").read_text() and old.read_bytes() == OLD.encode("utf-8")
    # read once: app.yaml is what counts from now on
    old.write_text("[start]\noperator=someone-else\n")
    assert SettingsFile(tmp_path / "app.yaml").data.start.operator == "op-07"


def test_a_bad_value_in_the_old_file_is_one_line_and_its_default(tmp_path, caplog):
    (tmp_path / OLD_FILE_NAME).write_text("[start]\noperator=op-07\nport=abc\n[ui]\nsound=maybe\n")
    with caplog.at_level(logging.WARNING):
        s = SettingsFile(tmp_path / "app.yaml")
    lines = warnings(caplog)
    assert len(lines) == 2 and all(ln.startswith(f"settings {tmp_path / OLD_FILE_NAME}: key ") for ln in lines)
    assert s.data.start.operator == "op-07" and s.data.start.port == 7557 and s.data.ui.sound is True


def test_old_values_never_decode_what_qt_serialized():
    assert old_values("[start]\noperator=@Variant(\\0\\0\\0\\n)\nhost=h\n[window]\ngeometry=@ByteArray(x)\n") == {
        "start": {"host": "h"}}


def test_no_file_anywhere_is_the_defaults_and_nothing_is_written(tmp_path):
    s = SettingsFile(tmp_path / "app.yaml")
    assert s.data == AppSettings() and not (tmp_path / "app.yaml").exists()


def test_a_bad_file_is_kept_beside_before_the_first_save_over_it(tmp_path, caplog):
    path = tmp_path / "app.yaml"
    body = b"start:\n  operator: op-07\n  port: 70000\n"
    path.write_bytes(body)
    with caplog.at_level(logging.WARNING):
        s = SettingsFile(path)
    (line,) = warnings(caplog)
    assert line == (f"settings {path}: key start.port: Input should be less than or equal to 65535 (got 70000); "
                    "allowed: a whole number from 1 to 65535; using 7557")
    assert s.data.start.operator == "op-07" and path.read_bytes() == body  # nothing rewritten on reading
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert s.save()
    (kept,) = tmp_path.glob("app.yaml.damaged-*")
    assert kept.read_bytes() == body and kept.name in warnings(caplog)[0]
    assert SettingsFile(path).data == s.data
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        s.save()  # once kept, later saves are plain saves
    assert warnings(caplog) == [] and len(list(tmp_path.glob("app.yaml.damaged-*"))) == 1


@pytest.mark.parametrize("body", [b"\xff\xfe\x00garbage", b"start: [1, 2\n", b"- a list\n", b"start: 5\n",
                                  b"start:\n  operator:\n    nested: 1\n"])
def test_a_broken_file_is_one_line_naming_it_and_the_app_starts_with_defaults(tmp_path, caplog, body):
    path = tmp_path / "app.yaml"
    path.write_bytes(body)
    with caplog.at_level(logging.WARNING):
        s = SettingsFile(path)
    lines = warnings(caplog)
    assert len(lines) == 1 and lines[0].startswith(f"settings {path}: ") and "\n" not in lines[0], lines
    assert s.data == AppSettings() and path.read_bytes() == body


def test_a_save_that_cannot_be_written_is_one_warning_and_leaves_the_file(tmp_path, caplog, monkeypatch):
    import tempfile

    path = tmp_path / "app.yaml"
    path.write_text("start:\n  operator: op-07\n")
    s = SettingsFile(path)
    s.data.start.operator = "op-08"

    def refused(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)  # a read-only home
    with caplog.at_level(logging.WARNING):
        assert not s.save() and not s.save()
    (line,) = warnings(caplog)  # once, however often the app saves
    assert line.startswith(f"settings {path}: cannot be written (Permission denied)")
    assert path.read_text() == "start:\n  operator: op-07\n" and s.data.start.operator == "op-08"


def test_a_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "app.yaml"
    s = SettingsFile(path)
    s.data.start.operator = "op-07"
    s.save()
    before = path.read_bytes()

    def fail(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    s.data.start.operator = "op-08"
    assert not s.save()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["app.yaml"]


def test_assignments_are_checked(tmp_path):
    s = SettingsFile(tmp_path / "app.yaml")
    with pytest.raises(ValueError):
        s.data.start.port = 0
    with pytest.raises(ValueError):
        s.data.start.backend = "robot"
