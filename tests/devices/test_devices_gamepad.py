"""Gamepad through pygame's real event queue, with SDL's own virtual joystick standing in for the hardware.

SDL (the copy bundled with pygame) can attach a virtual joystick: it gets a GUID and a name, appears
in pygame.joystick, and SDL itself emits JOYDEVICEADDED / JOYAXISMOTION / JOYDEVICEREMOVED for it.
Events are also posted with pygame.event.post, the way recorded input is replayed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pygame
import pytest

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import ESTOP, GRIPPER, RETURN, TAKEOVER, HumanCommand
from hg_dagger.devices import Calibration, CommandPipeline, DeviceError, load_device_config, make_device
from hg_dagger.devices.configs import GamepadConfig
from hg_dagger.devices.gamepad import Gamepad
from hg_dagger.devices.processing import ProcessingConfig

DATA = Path(__file__).parents[1] / "data" / "devices"


def plain_config(tmp_path, **processing) -> GamepadConfig:
    """The shipped axis maps with neutral shaping, so expected values are easy to state."""
    shipped = load_device_config("gamepad")
    return shipped.model_copy(update={"processing": ProcessingConfig(**processing), "calibration_dir": tmp_path})


def post(kind: str, instance_id: int, **attrs) -> None:
    pygame.event.post(pygame.event.Event(getattr(pygame, kind), instance_id=instance_id, joy=instance_id, **attrs))


def connected_pad(pads, tmp_path, **processing) -> Gamepad:
    pads.attach()
    pad = make_device(plain_config(tmp_path, **processing))
    pad.connect()
    pygame.event.clear()  # SDL's own initial axis events
    return pad


def test_connect_without_any_joystick_names_the_problem(pads, tmp_path):
    pad = make_device(plain_config(tmp_path))
    with pytest.raises(DeviceError, match="no gamepad found"):
        pad.connect()
    assert not pad.connected and pad.poll() is None


def test_map_is_chosen_by_controller_name_and_guid(pads, tmp_path):
    pads.attach("Xbox 360 Controller", 0x045E, 0x028E)
    pads.attach("Wireless Controller", 0x054C, 0x09CC, buttons=13)
    pads.attach("Generic USB Joystick", 0x1234, 0x5678)
    chosen = []
    for index in range(3):
        pad = Gamepad(plain_config(tmp_path).model_copy(update={"index": index}))
        pad.connect()
        chosen.append(pad.map_name)
        assert pad.device_id == f"gamepad:{pad.guid}" and len(pad.guid) == 32
    assert chosen == ["xbox", "playstation", "xbox"]  # unknown name -> default_map

    wheel_guid = pygame.joystick.Joystick(2).get_guid()
    cfg = plain_config(tmp_path)
    cfg.maps["playstation"].guids.append(wheel_guid)
    pad = Gamepad(cfg.model_copy(update={"guid": wheel_guid}))
    pad.connect()
    assert pad.name == "Generic USB Joystick" and pad.map_name == "playstation"


def test_map_needing_more_axes_than_the_pad_has_is_refused(pads, tmp_path):
    pads.attach(axes=4)  # the xbox map reads axes 4 and 5
    with pytest.raises(DeviceError, match="uses axis 4, but 'Xbox 360 Controller' has 4 axis"):
        make_device(plain_config(tmp_path)).connect()


def test_posted_events_become_commands(pads, tmp_path):
    pad = connected_pad(pads, tmp_path)
    iid = pad._instance_id
    post("JOYAXISMOTION", iid, axis=1, value=-0.5)  # left stick half up -> +x
    post("JOYAXISMOTION", iid, axis=3, value=0.25)  # right stick right -> -yaw
    post("JOYHATMOTION", iid, hat=0, value=(0, 1))
    post("JOYBUTTONDOWN", iid, button=4)  # LB = hold
    t_before = now_ns()
    cmd = pad.poll()
    assert t_before <= cmd.t_device <= now_ns()  # stamped on our monotonic clock while polling
    assert isinstance(cmd, HumanCommand) and cmd.engaged and cmd.device_id == pad.device_id
    np.testing.assert_allclose(cmd.raw, [-0.5, 0, 0, 0, 1, 0.25, -1], atol=1e-6)  # as read, in x..gripper slots
    np.testing.assert_allclose(cmd.motion, [0.5, 0, 0, 0, 1, -0.25, -1], atol=1e-6)  # inverted per the map
    assert cmd.raw.dtype == np.float32 and cmd.motion.dtype == np.float32

    post("JOYBUTTONUP", iid, button=4)
    cmd = pad.poll()
    assert not cmd.engaged and not cmd.motion.any()  # released, no release delay configured
    assert cmd.raw[0] == pytest.approx(-0.5)  # raw still shows the stick


def test_events_of_other_joysticks_are_ignored(pads, tmp_path):
    pad = connected_pad(pads, tmp_path)
    other = pad._instance_id + 100
    post("JOYAXISMOTION", other, axis=1, value=-1.0)
    post("JOYBUTTONDOWN", other, button=6)
    post("JOYDEVICEREMOVED", other)
    cmd = pad.poll()
    assert cmd is not None and pad.connected
    assert not cmd.raw[:6].any() and not cmd.buttons


def test_button_tap_between_two_polls_is_not_lost(pads, tmp_path):
    pad = connected_pad(pads, tmp_path)
    post("JOYBUTTONDOWN", pad._instance_id, button=0)
    post("JOYBUTTONUP", pad._instance_id, button=0)
    assert pad.poll().buttons == {TAKEOVER}
    assert pad.poll().buttons == frozenset()


def test_recorded_session_replays_through_the_shipped_config(pads, tmp_path):
    pads.attach()
    cfg = load_device_config("gamepad")
    hold = cfg.processing.hold.model_copy(update={"release_delay_s": 0.0})
    cfg = cfg.model_copy(update={"calibration_dir": tmp_path,
                                 "processing": cfg.processing.model_copy(update={"hold": hold})})
    pad = make_device(cfg)
    pad.connect()
    pygame.event.clear()
    cmds = []
    for line in (DATA / "gamepad_xbox_session.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "poll" in rec:
            cmds.append(pad.poll())
            continue
        kind = rec.pop("event")
        if "value" in rec and isinstance(rec["value"], list):
            rec["value"] = tuple(rec["value"])
        post(kind, pad._instance_id, **rec)
    assert len(cmds) == 5
    # shipped shaping: deadzone 0.08, expo 0.4, max_rate 0.25 per tick on motion axes
    assert cmds[0].engaged and cmds[0].motion[0] == pytest.approx(0.25)  # full stick, rate limited
    assert cmds[1].motion[0] == pytest.approx(0.5)
    assert cmds[2].buttons == {TAKEOVER} and cmds[2].motion[0] == pytest.approx(0.75)
    assert cmds[2].raw[6] == 1.0 and cmds[2].motion[6] == pytest.approx(1.0)  # trigger: no rate limit on gripper
    assert cmds[3].raw[1] == pytest.approx(0.05) and cmds[3].motion[1] == 0.0  # inside the deadzone
    assert cmds[3].raw[3] == 1.0 and cmds[3].motion[3] == pytest.approx(0.25)  # hat -> roll, ramping
    assert not cmds[4].engaged and not cmds[4].motion.any() and cmds[4].buttons == {ESTOP}
    # human_command and motion differ by exactly the pipeline: replaying raw reproduces motion
    replay = CommandPipeline(cfg.processing, pad.pipeline.normalizer)
    holds = [True, True, True, True, False]
    for cmd, h in zip(cmds, holds, strict=True):
        motion, engaged = replay.process(cmd.raw, hold=h, t_ns=cmd.t_device)
        np.testing.assert_array_equal(motion, cmd.motion)
        assert engaged == cmd.engaged


def test_device_removed_event_means_lost(pads, tmp_path):
    pad = connected_pad(pads, tmp_path)
    post("JOYBUTTONDOWN", pad._instance_id, button=4)
    assert pad.poll().engaged
    post("JOYDEVICEREMOVED", pad._instance_id)
    assert pad.poll() is None
    assert not pad.connected
    assert pad.poll() is None  # stays lost until connect() again


def test_unplugging_the_sdl_joystick_is_detected(pads, tmp_path):
    pad = connected_pad(pads, tmp_path)
    pads.set_axis(pad._instance_id, 0, -32768)  # SDL generates the axis event itself
    pads.set_button(pad._instance_id, 4, True)
    pygame.event.pump()
    cmd = pad.poll()
    assert cmd.engaged and cmd.raw[1] == pytest.approx(-1.0, abs=1e-3)  # SDL: -32768 / 32767, as read
    assert cmd.motion[1] == pytest.approx(1.0)  # clipped to full scale by the pipeline
    pads.detach_all()  # SDL emits JOYDEVICEREMOVED
    assert pad.poll() is None and not pad.connected


def test_calibration_is_saved_per_guid_and_used(pads, tmp_path):
    pad = connected_pad(pads, tmp_path, hold={"engage_on": "always"})
    iid = pad._instance_id
    phases = []

    def operator(message: str) -> None:  # the person follows the prompts; their stick motion is posted
        phases.append(message)
        if len(phases) == 1:  # hands off: left stick rests off-center, trigger rests at -1
            post("JOYAXISMOTION", iid, axis=0, value=0.10)
            post("JOYAXISMOTION", iid, axis=1, value=-0.06)
            post("JOYAXISMOTION", iid, axis=5, value=-1.0)
        elif len(phases) == 2:  # full travel (this pad only reaches +-0.8 on axis 0)
            for axis, value in [(0, 0.8), (0, -0.7), (1, 0.9), (1, -1.0), (5, 1.0), (0, 0.1), (1, -0.06), (5, -1.0)]:
                post("JOYAXISMOTION", iid, axis=axis, value=value)

    cal = pad.calibrate(center_s=0.0, range_s=0.0, prompt=operator)
    assert len(phases) == 3 and "saved" in phases[2]
    path = Calibration.path_for(tmp_path, "gamepad", pad.guid)
    assert path.is_file() and Calibration.load(path) == cal
    assert cal.axes[0].center == pytest.approx(0.10) and cal.axes[0].max == pytest.approx(0.8)
    assert cal.axes[0].min == pytest.approx(-0.7) and cal.axes[1].center == pytest.approx(-0.06)
    assert cal.axes[3].min == -1.0 and cal.axes[3].max == 1.0  # never moved: nominal range

    cmd = pad.poll()  # at rest: off-center stick and released trigger read as zero motion / open gripper
    assert cmd.raw[1] == pytest.approx(0.10) and cmd.motion[1] == pytest.approx(0.0, abs=1e-6)
    assert cmd.motion[6] == pytest.approx(-1.0)

    # a new session with the same controller finds the file and reaches full scale at the measured ends
    again = Gamepad(plain_config(tmp_path, hold={"engage_on": "always"}))
    again.connect()
    assert again.calibration == cal
    post("JOYAXISMOTION", again._instance_id, axis=0, value=0.8)
    post("JOYAXISMOTION", again._instance_id, axis=5, value=1.0)
    cmd = again.poll()
    assert cmd.motion[1] == pytest.approx(-1.0) and cmd.motion[6] == pytest.approx(1.0)


def test_corrupt_calibration_file_names_the_file(pads, tmp_path):
    pads.attach()
    guid = pygame.joystick.Joystick(0).get_guid()
    path = Calibration.path_for(tmp_path, "gamepad", guid)
    path.write_text('{"device_type": "gamepad", "device_key": "x", "axes": {"0": {"center": "middle"}}}')
    with pytest.raises(DeviceError, match=str(path.name)):
        make_device(plain_config(tmp_path)).connect()


def test_named_buttons_cover_the_contract(pads, tmp_path):
    pad = connected_pad(pads, tmp_path)
    for b in (0, 1, 2, 6):
        post("JOYBUTTONDOWN", pad._instance_id, button=b)
    assert pad.poll().buttons == {TAKEOVER, RETURN, GRIPPER, ESTOP}


def test_cli_lists_pads_and_reports_missing_hardware_without_traceback(pads, capsys):
    from hg_dagger.cli import main

    assert main(["device", "calibrate", "gamepad"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no gamepad found") and "Traceback" not in err
    pads.attach("Wireless Controller", 0x054C, 0x09CC, buttons=13)
    assert main(["device", "list"]) == 0
    out = capsys.readouterr().out
    assert "'Wireless Controller'" in out and "map playstation" in out and "13 buttons" in out


def test_monitor_prints_live_commands_and_stops_on_loss(pads, tmp_path):
    from hg_dagger.devices.tools import monitor

    pad = connected_pad(pads, tmp_path)
    post("JOYBUTTONDOWN", pad._instance_id, button=4)
    post("JOYAXISMOTION", pad._instance_id, axis=1, value=-1.0)
    lines = []
    assert monitor(pad, seconds=0.05, hz=200, out=lines.append) == len(lines) >= 1
    assert lines[0].startswith("ENGAGED motion [+1.00")
    post("JOYDEVICEREMOVED", pad._instance_id)
    with pytest.raises(DeviceError, match="device lost"):
        monitor(pad, seconds=1.0, hz=200, out=lines.append)


def test_replugged_pad_is_used_again_after_connect(pads, tmp_path):
    pad = connected_pad(pads, tmp_path, hold={"engage_on": "always"})
    first_instance = pad._instance_id
    pads.detach_all()
    assert pad.poll() is None
    with pytest.raises(DeviceError, match="no gamepad found"):
        pad.connect()
    pads.attach()
    pad.connect()
    assert pad.connected and pad._instance_id != first_instance
    post("JOYAXISMOTION", pad._instance_id, axis=4, value=-0.5)  # right stick up -> +z
    assert pad.poll().motion[2] == pytest.approx(0.5)
