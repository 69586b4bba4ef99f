"""Keyboard device (fed key presses by name, as the app does) and the device registry / config files."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from hg_dagger import config
from hg_dagger.contract.command import COMMAND_AXES, ESTOP, GRIPPER, RETURN, TAKEOVER, HumanCommand
from hg_dagger.devices import (
    DEVICE_TYPES,
    Device,
    DeviceError,
    Keyboard,
    KeyboardConfig,
    load_device_config,
    make_device,
)
from hg_dagger.devices.keyboard import key_layout
from hg_dagger.errors import ConfigError

pytestmark = [pytest.mark.subprocess]

CONFIGS = Path(config.CONFIG_DIR) / "devices"
GRIPPER_AXIS = COMMAND_AXES.index("gripper")


def keyboard(**processing) -> Keyboard:
    kb = Keyboard(KeyboardConfig(processing=processing or {"hold": {"engage_on": "button"}}))
    kb.connect()
    return kb


def test_keys_drive_axes_while_space_is_held():
    kb = keyboard()
    kb.press("W")
    kb.press("d")
    cmd = kb.poll()
    assert not cmd.engaged and not cmd.motion.any()  # not holding space: no intervention
    np.testing.assert_array_equal(cmd.raw, [1, -1, 0, 0, 0, 0, -1])
    kb.press("space")
    cmd = kb.poll()
    assert cmd.engaged and cmd.motion.tolist() == [1, -1, 0, 0, 0, 0, -1]
    kb.press("s")  # opposite keys cancel
    assert kb.poll().motion[0] == 0
    kb.release("space")
    assert not kb.poll().engaged


def test_escape_is_estop_and_taps_are_latched_until_polled():
    kb = keyboard()
    kb.press("escape")
    kb.release("escape")
    kb.press("t")
    kb.release("t")
    assert kb.poll().buttons == {ESTOP, TAKEOVER}
    assert kb.poll().buttons == frozenset()


def test_gripper_key_toggles_and_autorepeat_does_not():
    kb = keyboard()
    kb.press("space")  # the gripper key acts while the deadman is held
    kb.press("g")
    kb.press("g")  # auto-repeat while held
    cmd = kb.poll()
    assert cmd.raw[6] == 1 and GRIPPER in cmd.buttons
    kb.release("g")
    assert kb.poll().raw[6] == 1
    kb.press("g")
    assert kb.poll().raw[6] == -1


def test_gripper_key_while_the_student_drives_changes_nothing():
    """G pressed without the deadman leaves the state the next take-over starts from as it was."""
    kb = keyboard()
    kb.press("g")
    kb.release("g")
    cmd = kb.poll()
    assert cmd.raw[6] == -1 and not cmd.engaged
    kb.press("space")
    cmd = kb.poll()
    assert cmd.engaged and cmd.raw[6] == -1  # the take-over inherits the gripper open, as before the stray G
    kb.press("g")
    assert kb.poll().raw[6] == 1


def test_release_all_on_focus_loss():
    kb = keyboard(hold={"engage_on": "always"})
    kb.press("w")
    kb.release_all()
    assert not kb.poll().raw[:6].any()


def test_presses_from_another_thread():
    kb = keyboard(hold={"engage_on": "always"})
    t = threading.Thread(target=lambda: [kb.press(k) for k in ("w", "r", "q")])
    t.start()
    t.join()
    assert kb.poll().raw[[0, 2, 5]].tolist() == [1, 1, 1]


def test_shipped_layout_rotation_keys_return_keys_and_help_rows():
    kb = make_device("keyboard")
    kb.connect()
    for key in ("space", "right", "down", "q"):
        kb.press(key)
    cmd = kb.poll()
    assert cmd.raw.tolist() == [0, 0, 0, 1, 1, 1, -1]  # arrows roll/pitch, q yaw; gripper open
    kb.release_all()
    for key in ("enter", "b"):  # either key hands control back
        kb.press(key)
        assert kb.poll().buttons == {RETURN}
        kb.release(key)

    rows = key_layout(kb.config)
    keys = [k for k, _ in rows]
    assert rows[0] == ("Space", "hold to intervene (motion keys act only while held)")
    assert ("Esc", "emergency stop") in rows and ("Enter / B", "hand control back to the policy") in rows
    assert ("T", "take over from the policy") in rows and ("G", "toggle gripper open / closed") in rows
    assert {"W", "S", "A", "D", "R", "F", "Q", "E", "Up", "Down", "Left", "Right"} <= set(keys)
    assert len(keys) == len(set(keys))  # every key has one meaning


def test_cli_prints_the_key_layout(capsys):
    from hg_dagger.cli import main

    assert main(["device", "keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["Space", "hold", "to", "intervene", "(motion", "keys", "act", "only", "while", "held)"]
    assert any(line.startswith("Esc ") and line.endswith("emergency stop") for line in lines)
    assert main(["device", "keys", "gamepad"]) == 2
    assert "a keyboard config is needed, this one is type 'gamepad'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"axes": {"x": ["escape", "s"]}}, "axes.x: 'escape' is reserved for the emergency stop"),
        ({"hold_key": "Escape"}, "hold_key: 'escape' is reserved for the emergency stop"),
        ({"buttons": {"return": ["enter", "w"]}}, "buttons.return: key 'w' is already used by axes.x"),
    ],
)
def test_keyboard_config_refuses_esc_on_motion_and_keys_used_twice(tmp_path, update, message):
    path = tmp_path / "kb.yaml"
    path.write_text(yaml.safe_dump({"kind": "device", "type": "keyboard", **update}))
    with pytest.raises(ConfigError, match=rf"kb.yaml(.|\n)*{re.escape(message)}"):
        load_device_config(path)


def test_closed_keyboard_polls_none():
    kb = keyboard()
    kb.close()
    assert kb.poll() is None and not kb.connected


def test_make_device_from_name_path_dict_and_object():
    a = make_device("keyboard")
    b = make_device(CONFIGS / "keyboard.yaml")
    c = make_device({"type": "keyboard", "hold_key": "Shift"})
    d = make_device(KeyboardConfig())
    assert all(isinstance(x, Keyboard) and isinstance(x, Device) for x in (a, b, c, d))
    assert c.config.hold_key == "shift"
    home = make_device({"type": "keyboard", "calibration_dir": "~/cal"})
    assert home.config.calibration_dir == Path.home() / "cal"
    assert set(DEVICE_TYPES) == {"gamepad", "spacemouse", "keyboard", "synthetic"}
    with a:
        a.press("space")
        a.press("w")
        cmd = a.poll()
        assert isinstance(cmd, HumanCommand) and cmd.engaged and cmd.motion[0] == pytest.approx(0.2)  # max_rate


@pytest.mark.parametrize("name", ["gamepad", "spacemouse", "keyboard", "synthetic"])
def test_shipped_configs_pass_config_check(name):
    model = config.check(CONFIGS / f"{name}.yaml")
    assert model.root.type == name


def test_bad_device_configs_name_file_and_key(tmp_path):
    bad = tmp_path / "pad.yaml"
    bad.write_text("kind: device\ntype: gamepad\ndefault_map: nes\nmaps: {snes: {buttons: {estop: 3}}}\n")
    with pytest.raises(ConfigError, match=r"pad.yaml: key gamepad: default_map 'nes' is not one of maps: snes"):
        load_device_config(bad)
    bad.write_text("kind: device\ntype: keyboard\nbuttons: {panic: escape}\n")
    with pytest.raises(ConfigError, match=r"keyboard.buttons.panic"):
        config.check(bad)
    bad.write_text("kind: device\ntype: trackball\n")
    with pytest.raises(ConfigError, match="trackball"):
        make_device(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        make_device("no_such_device")


def test_unknown_registered_type_is_a_device_error():
    from hg_dagger.devices import device_class

    with pytest.raises(DeviceError, match="unknown device type 'trackball'; known types: gamepad"):
        device_class("trackball")


def test_devices_do_not_import_qt_or_the_control_loop():
    import subprocess
    import sys

    code = (
        "import sys, hg_dagger.devices, hg_dagger.devices.gamepad, hg_dagger.devices.spacemouse;"
        "bad=[m for m in sys.modules if m.startswith(('PyQt','hg_dagger.ui','hg_dagger.control','hg_dagger.store'))];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_shipped_keyboard_opens_and_closes_the_gripper_all_the_way():
    """Its motion keys drive at 60% of full speed, but the gripper toggle is an open/close command, not a speed:
    scaled like the motion it closed the fingers at -0.6, and a person's corrections taught the student so."""
    kb = make_device(str(CONFIGS / "keyboard.yaml"))
    kb.connect()
    kb.press("space")
    kb.press("w")
    for _ in range(10):  # past the motion's rate limit
        cmd = kb.poll()
    assert cmd.motion[0] == pytest.approx(0.6)
    assert abs(cmd.motion[GRIPPER_AXIS]) == pytest.approx(1.0)
    kb.press("g")
    kb.release("g")
    toggled = kb.poll()
    assert toggled.motion[GRIPPER_AXIS] == pytest.approx(-cmd.motion[GRIPPER_AXIS])
