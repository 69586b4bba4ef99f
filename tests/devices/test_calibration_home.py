"""Where device calibrations live: the config home's calibration/ ($XDG_CONFIG_HOME/hg-dagger/calibration), and
what happens to one an earlier version saved in ~/.config/hg_dagger/calibration (copied over on first use, the
old file left where it was)."""

from __future__ import annotations

import logging

import pytest

from hg_dagger.devices.calibration import (
    CALIBRATION_ENV,
    AxisCalibration,
    Calibration,
    default_calibration_dir,
    old_calibration_dir,
)


@pytest.fixture
def homes(tmp_path, monkeypatch):
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def _cal(key="03000000-abcd") -> Calibration:
    return Calibration(device_type="gamepad", device_key=key, name="pad", axes={0: AxisCalibration(center=0.1)})


def test_calibrations_live_in_the_config_home(homes, monkeypatch):
    assert default_calibration_dir() == homes / "xdg" / "hg-dagger" / "calibration"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert default_calibration_dir() == homes / "home" / ".config" / "hg-dagger" / "calibration"
    monkeypatch.setenv(CALIBRATION_ENV, str(homes / "mine"))
    assert default_calibration_dir() == homes / "mine"


def test_an_old_calibration_is_copied_to_the_config_home_on_first_use(homes, caplog):
    old = _cal().save(old_calibration_dir())
    assert old == homes / "home" / ".config" / "hg_dagger" / "calibration" / "gamepad_03000000-abcd.json"
    before = old.read_bytes()
    with caplog.at_level(logging.INFO):
        found = Calibration.find(default_calibration_dir(), "gamepad", "03000000-abcd")
    assert found == _cal() and any("copied to" in r.getMessage() for r in caplog.records)
    new = Calibration.path_for(default_calibration_dir(), "gamepad", "03000000-abcd")
    assert Calibration.load(new) == _cal() and old.read_bytes() == before  # the old file stays as it was
    # from now on the config home's copy counts: a recalibration there is not undone by the old file
    changed = _cal().model_copy(update={"name": "recalibrated"})
    changed.save(default_calibration_dir())
    assert Calibration.find(default_calibration_dir(), "gamepad", "03000000-abcd").name == "recalibrated"


def test_a_folder_of_ones_own_never_adopts_old_calibrations(homes, monkeypatch):
    _cal().save(old_calibration_dir())
    assert Calibration.find(homes / "elsewhere", "gamepad", "03000000-abcd") is None
    monkeypatch.setenv(CALIBRATION_ENV, str(homes / "env"))
    assert Calibration.find(default_calibration_dir(), "gamepad", "03000000-abcd") is None
    assert not (homes / "env").exists() and not (homes / "elsewhere").exists()


def test_an_old_calibration_that_cannot_be_copied_is_still_used(homes, caplog):
    _cal().save(old_calibration_dir())
    (homes / "xdg").mkdir()
    (homes / "xdg" / "hg-dagger").write_text("a file where the config home's folder would be")
    with caplog.at_level(logging.WARNING):
        assert Calibration.find(default_calibration_dir(), "gamepad", "03000000-abcd") == _cal()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "used from the old folder; could not copy it" in line
