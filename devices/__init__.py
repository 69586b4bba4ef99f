"""Operator input devices (installed as hg_dagger.devices): gamepad, SpaceMouse, keyboard, synthetic operator.

    dev = make_device("gamepad")   # configs/devices/gamepad.yaml, or a path, a dict, a config object
    dev.connect(); dev.calibrate(); cmd = dev.poll(); dev.close()   # poll() -> HumanCommand | None (lost)

Hardware modules (pygame, hidapi) load only when their device type is built.
"""

from hg_dagger.devices.base import (
    DEVICE_TYPES,
    Device,
    DeviceError,
    device_class,
    make_device,
    register_device,
)
from hg_dagger.devices.calibration import AxisCalibration, Calibration, default_calibration_dir
from hg_dagger.devices.configs import (
    DeviceConfig,
    GamepadConfig,
    KeyboardConfig,
    SpaceMouseConfig,
    SyntheticConfig,
    load_device_config,
)
from hg_dagger.devices.keyboard import Keyboard
from hg_dagger.devices.processing import AxisNormalizer, CommandPipeline, ProcessingConfig
from hg_dagger.devices.synthetic import SyntheticOperator

__all__ = [
    "DEVICE_TYPES", "Device", "DeviceError", "device_class", "make_device", "register_device",
    "AxisCalibration", "Calibration", "default_calibration_dir",
    "DeviceConfig", "GamepadConfig", "KeyboardConfig", "SpaceMouseConfig", "SyntheticConfig", "load_device_config",
    "AxisNormalizer", "CommandPipeline", "ProcessingConfig", "Keyboard", "SyntheticOperator",
]
