"""The device-type registry: each shipped type's record builds its device from its file, and each config names
its own controls in the operator's words (what the banner and the device panel show), so the app's key map needs
no device kinds of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from hg_dagger import config
from hg_dagger.devices import (
    DEVICE_TYPES,
    DeviceConfig,
    DeviceType,
    GamepadConfig,
    Keyboard,
    KeyboardConfig,
    SpaceMouseConfig,
    SyntheticConfig,
    load_device_config,
    make_device,
    operator_config,
)
from hg_dagger.devices.gamepad import Gamepad
from hg_dagger.devices.spacemouse import SpaceMouse
from hg_dagger.devices.synthetic import SyntheticOperator
from hg_dagger.errors import ConfigError
from hg_dagger.registry import RegistryError

CONFIGS = Path(config.CONFIG_DIR) / "devices"
AXES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")


@pytest.mark.parametrize(("name", "config_class", "device_class"), [
    ("gamepad", GamepadConfig, Gamepad), ("spacemouse", SpaceMouseConfig, SpaceMouse),
    ("keyboard", KeyboardConfig, Keyboard), ("synthetic", SyntheticConfig, SyntheticOperator)])
def test_each_shipped_type_is_one_record_of_its_config_and_device_class(name, config_class, device_class):
    record = DEVICE_TYPES.get(name)
    assert record.device_class() is device_class and DEVICE_TYPES.origin(name) == "hg_dagger"
    cfg = load_device_config(CONFIGS / f"{name}.yaml")
    assert type(cfg) is record.config and isinstance(cfg, config_class)


def test_the_shipped_configs_name_their_controls():
    pad = load_device_config("gamepad")
    assert [pad.axis_control(a) for a in AXES] == [
        "left stick up/down", "left stick left/right", "right stick up/down", "d-pad left/right", "d-pad up/down",
        "right stick left/right", "right trigger"]
    assert (pad.takeover_hint(), pad.handback_hint(), pad.control_notes()) == (
        "hold LB", "let go of LB or press B", None)
    ps = pad.model_copy(update={"default_map": "playstation"})
    assert (ps.takeover_hint(), ps.handback_hint()) == ("hold L1", "let go of L1 or press Circle")

    kb = load_device_config("keyboard")
    assert [kb.axis_control(a) for a in AXES] == ["W / S", "A / D", "R / F", "Right / Left", "Down / Up", "Q / E",
                                                  "G (toggle)"]
    assert (kb.takeover_hint(), kb.handback_hint()) == ("hold Space", "let go of Space or press Enter / B")
    assert kb.control_notes() == ["hold Space: steer", "T: ask for control", "Enter / B: hand back"]

    mouse = load_device_config("spacemouse")
    assert mouse.axis_control("yaw") == "twist the cap" and mouse.takeover_hint() == "move the SpaceMouse cap"
    synthetic = load_device_config("synthetic")
    assert (synthetic.axis_control("x"), synthetic.takeover_hint(), synthetic.handback_hint()) == ("-", "", "")


def test_the_words_follow_the_config_not_the_kind():
    """Without a hold key the keyboard takes over by its takeover key, and hands back by its return key only; a pad
    map without a hold button takes over by its takeover button; a pad axis on buttons names them."""
    kb = KeyboardConfig(hold_key=None, buttons={"takeover": "k", "return": "l"}, gripper_toggle=False)
    assert (kb.takeover_hint(), kb.handback_hint(), kb.axis_control("gripper")) == ("press K", "press L", "-")
    kb = KeyboardConfig(buttons={"gripper": ["g", "h"]}, gripper_toggle=False)
    assert kb.axis_control("gripper") == "G / H (hold)" and kb.control_notes() == ["hold Space: steer"]
    pad = GamepadConfig(default_map="xbox", maps={"xbox": {"buttons": {"takeover": 3, "return": 1},
                                                          "axes": {"z": {"buttons": [5, 4]}}}})
    assert (pad.takeover_hint(), pad.handback_hint(), pad.axis_control("z")) == ("press Y", "press B", "RB / LB")
    assert pad.axis_control("x") == "-"


def test_the_words_of_a_kind_come_from_its_file_else_its_defaults(tmp_path, monkeypatch):
    assert operator_config("expert") is None and operator_config("none") is None  # operators that are no device
    assert isinstance(operator_config("keyboard"), KeyboardConfig)
    own = tmp_path / "configs" / "devices"
    own.mkdir(parents=True)
    (own / "keyboard.yaml").write_text("kind: device\ntype: keyboard\nhold_key: shift\n")
    monkeypatch.chdir(tmp_path)  # ./configs comes first on the search path
    assert operator_config("keyboard").takeover_hint() == "hold Shift"
    (own / "keyboard.yaml").write_text("kind: device\ntype: keyboard\nhold_key: [1]\n")  # broken: the defaults speak
    assert operator_config("keyboard").takeover_hint() == "hold Space"
    (own / "gamepad.yaml").write_text("kind: device\ntype: gamepad\n")  # broken, and a pad has no defaults
    assert operator_config("gamepad") is None


def test_make_device_builds_through_the_record(tmp_path):
    kb = make_device({"type": "keyboard", "hold_key": "shift"})
    assert isinstance(kb, Keyboard) and kb.config.hold_key == "shift"
    bad = tmp_path / "dev.yaml"
    bad.write_text("kind: device\nname: nothing\n")
    with pytest.raises(ConfigError, match=r"dev.yaml: key type: a device file names its type \(one of: gamepad, "):
        load_device_config(bad)
    bad.write_text("kind: device\ntype: trackball\n")
    with pytest.raises(ConfigError) as err:
        make_device(bad)
    line = str(err.value)
    assert "\n" not in line and "dev.yaml: key type: unknown device type 'trackball'" in line
    assert "gamepad, keyboard, spacemouse, synthetic" in line and "'hg_dagger.devices'" in line


def test_a_record_needs_a_device_config_that_names_its_type():
    for config_class in (DeviceConfig, dict):  # the base's type has no default; not a DeviceConfig at all
        with pytest.raises(RegistryError, match="a DeviceConfig model with a 'type: Literal"):
            DeviceType(config_class, Keyboard)
    assert DeviceType(KeyboardConfig, Keyboard).device_class() is Keyboard
