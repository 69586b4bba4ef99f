"""The calibration wizard driven step by step on an SDL virtual gamepad, as the app's device panel drives it.

Time is the wizard's injected clock (a number the test moves on), so phases end exactly where the test says.
"""

from __future__ import annotations

import json

import numpy as np
import pygame
import pytest

from hg_dagger.devices import Calibration, DeviceError, Keyboard, load_device_config, make_device
from hg_dagger.devices.tools import calibrate
from hg_dagger.devices.wizard import CalibrationWizard

FULL = 32767


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def gamepad_config(directory):
    return load_device_config("gamepad").model_copy(update={"calibration_dir": directory})


def at_rest(pads, iid) -> None:
    """Left stick resting off-center, right trigger released."""
    pads.set_axis(iid, 0, 3000)
    pads.set_axis(iid, 1, -2000)
    pads.set_axis(iid, 5, -32768)


def full_travel(pads, iid) -> None:
    """This pad's left stick reaches only about 80% to the right; every value is pumped into an event."""
    for axis, value in [(0, 26000), (0, -23000), (1, FULL), (1, -32768), (5, FULL), (0, 3000), (1, -2000), (5, -32768)]:
        pads.set_axis(iid, axis, value)
        pygame.event.pump()


def test_wizard_phases_progress_and_the_file_match_the_cli(pads, tmp_path):
    pads.attach()
    pad = make_device(gamepad_config(tmp_path / "panel"))
    pad.connect()
    iid = pad._instance_id
    clock = Clock()
    wizard = CalibrationWizard(pad, center_s=2.0, range_s=6.0, clock=clock)
    assert (wizard.phase, wizard.phase_number, wizard.progress) == ("center", (1, 2), 0.0)
    assert "untouched" in wizard.instructions and not wizard.finished

    at_rest(pads, iid)
    assert wizard.tick() == "center"
    clock.t = 1.0
    assert wizard.progress == pytest.approx(0.5)
    clock.t = 2.0
    assert wizard.tick() == "range"  # two samples at rest, time up
    assert wizard.phase_number == (2, 2) and wizard.progress == 0.0 and "full circle" in wizard.instructions
    with pytest.raises(DeviceError, match="calibration is 'range', not done"):
        wizard.result()

    full_travel(pads, iid)
    clock.t = 5.0
    assert wizard.tick() == "range" and wizard.progress == pytest.approx(0.5)
    clock.t = 8.0
    assert wizard.tick() == "done" and wizard.finished and wizard.progress == 1.0
    cal = wizard.result()
    path = Calibration.path_for(tmp_path / "panel", "gamepad", pad.guid)
    assert wizard.path == path and str(path) in wizard.instructions
    saved = json.loads(path.read_text())
    assert saved["device_type"] == "gamepad" and saved["device_key"] == pad.guid and saved["name"] == pad.name
    assert saved["axes"]["0"] == pytest.approx({"center": 3000 / FULL, "min": -23000 / FULL, "max": 26000 / FULL})
    assert saved["axes"]["1"]["center"] == pytest.approx(-2000 / FULL)
    assert saved["axes"]["3"] == {"center": 0.0, "min": -1.0, "max": 1.0}  # never moved: nominal range
    assert pad.calibration == cal and Calibration.load(path) == cal

    # `hg-dagger device calibrate` (tools.calibrate) with the same hands on the same pad writes the same file
    pad.close()
    prompts = []

    def operator(message: str) -> None:
        prompts.append(message)
        if len(prompts) == 1:
            at_rest(pads, iid)
        elif len(prompts) == 2:
            full_travel(pads, iid)

    pads.set_axis(iid, 0, 0)  # back to the state the first run started from
    pads.set_axis(iid, 1, 0)
    pygame.event.pump()
    calibrate(gamepad_config(tmp_path / "cli"), prompt=operator, center_s=0.0, range_s=0.0)
    assert len(prompts) == 3 and "saved" in prompts[2]
    cli_file = Calibration.path_for(tmp_path / "cli", "gamepad", pad.guid)
    assert cli_file.read_text() == path.read_text()


def test_samples_polled_by_the_control_thread_can_be_fed(pads, tmp_path):
    pads.attach()
    pad = make_device(gamepad_config(tmp_path))
    pad.connect()
    iid = pad._instance_id
    wizard = CalibrationWizard(pad, center_s=0.0, range_s=0.0)
    at_rest(pads, iid)
    assert wizard.feed(pad.poll()) == "range"  # the poll read the pad; the wizard takes its state
    pads.set_axis(iid, 1, FULL)
    assert wizard.feed(pad.poll()) == "done"
    cal = wizard.result()
    assert cal.axes[0].center == pytest.approx(3000 / FULL) and cal.axes[1].max == pytest.approx(1.0)
    assert cal.axes[1].min == -1.0  # only moved up: the lower end keeps its nominal value


def test_unplugging_during_the_wizard_fails_without_saving(pads, tmp_path):
    pads.attach()
    pad = make_device(gamepad_config(tmp_path))
    pad.connect()
    clock = Clock()
    wizard = CalibrationWizard(pad, center_s=1.0, range_s=1.0, clock=clock)
    wizard.tick()
    pads.detach_all()
    assert wizard.tick() == "failed"
    assert "unplugged during calibration; nothing saved" in wizard.error and wizard.error in wizard.instructions
    clock.t = 5.0
    assert wizard.tick() == "failed"  # stays failed
    with pytest.raises(DeviceError, match="unplugged"):
        wizard.result()
    assert not list(tmp_path.iterdir())


def test_cancel_saves_nothing_and_a_keyboard_needs_no_steps(pads, tmp_path):
    pads.attach()
    pad = make_device(gamepad_config(tmp_path))
    pad.connect()
    wizard = CalibrationWizard(pad, center_s=0.0, range_s=0.0)
    wizard.cancel()
    assert wizard.tick() == "cancelled" and "nothing saved" in wizard.instructions
    assert not list(tmp_path.iterdir())

    kb = Keyboard()
    kb.connect()
    wizard = CalibrationWizard(kb)
    assert wizard.phase == "done" and wizard.result() is None and wizard.phase_number == (0, 0)
    assert wizard.instructions == "keyboard needs no calibration."
    assert kb.calibrate(prompt=pytest.fail) is None


def test_calibrating_a_pad_that_is_not_connected_names_the_fix(tmp_path):
    pad = make_device(gamepad_config(tmp_path))
    with pytest.raises(DeviceError, match="call connect"):
        CalibrationWizard(pad)


def test_live_axes_are_raw_after_calibration_and_deadzone_is_per_slot(pads, tmp_path):
    pads.attach()
    pad = make_device(gamepad_config(tmp_path))
    pad.connect()
    np.testing.assert_allclose(pad.deadzone, [0.08] * 6 + [0.0])  # configs/devices/gamepad.yaml
    iid = pad._instance_id
    wizard = CalibrationWizard(pad, center_s=0.0, range_s=0.0)
    at_rest(pads, iid)
    wizard.tick()
    full_travel(pads, iid)
    wizard.tick()
    assert wizard.phase == "done"

    at_rest(pads, iid)
    cmd = pad.poll()
    assert cmd.raw[1] == pytest.approx(3000 / FULL)  # y slot = axis 0 as read: off-center at rest
    np.testing.assert_allclose(pad.normalized(cmd.raw)[:6], 0.0, atol=1e-6)  # calibrated: rest is zero
    pads.set_axis(iid, 0, 26000)  # the measured right end of the stick
    cmd = pad.poll()
    assert pad.normalized(cmd.raw)[1] == pytest.approx(-1.0)  # full scale, sign of the map (right = -y)
    assert not cmd.engaged and not cmd.motion.any()  # motion is zero while not engaged: not what a live view draws
