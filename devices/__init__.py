"""Operator input devices (installed as hg_dagger.devices): gamepad, SpaceMouse, keyboard, synthetic operator.

    dev = make_device("gamepad")   # configs/devices/gamepad.yaml, or a path, a dict, a config object
    dev.connect(); dev.calibrate(); cmd = dev.poll(); dev.close()   # poll() -> HumanCommand | None (lost)
    DeviceScanner().scan()          # what is plugged in now, as DeviceInfo records (the keyboard always)
    CalibrationWizard(dev).tick()   # calibration step by step, for a device panel

Each device type is one record of DEVICE_TYPES (its config class and device class; other packages register
theirs through the entry point group ``hg_dagger.devices``, docs/extending.md "A device"). Hardware modules
(pygame, hidapi) load only when their device type is built.
"""

from hg_dagger.devices.base import (
    DEVICE_TYPES,
    Device,
    DeviceError,
    DeviceType,
    device_class,
    make_device,
)
from hg_dagger.devices.calibration import (
    AxisCalibration,
    Calibration,
    CalibrationPhase,
    Calibrator,
    default_calibration_dir,
)
from hg_dagger.devices.configs import (
    DeviceConfig,
    GamepadConfig,
    KeyboardConfig,
    SpaceMouseConfig,
    SyntheticConfig,
    load_device_config,
    operator_config,
)
from hg_dagger.devices.discovery import DeviceInfo, DeviceScanner
from hg_dagger.devices.keyboard import Keyboard, key_layout
from hg_dagger.devices.processing import AxisNormalizer, CommandPipeline, CommandPipelines, ProcessingConfig
from hg_dagger.devices.synthetic import SyntheticOperator, SyntheticOperatorRows
from hg_dagger.devices.wizard import CalibrationWizard

__all__ = [
    "DEVICE_TYPES", "Device", "DeviceError", "DeviceType", "device_class", "make_device", "operator_config",
    "AxisCalibration", "Calibration", "CalibrationPhase", "Calibrator", "CalibrationWizard", "default_calibration_dir",
    "DeviceInfo", "DeviceScanner", "key_layout",
    "DeviceConfig", "GamepadConfig", "KeyboardConfig", "SpaceMouseConfig", "SyntheticConfig", "load_device_config",
    "AxisNormalizer", "CommandPipeline", "CommandPipelines", "ProcessingConfig", "Keyboard", "SyntheticOperator",
    "SyntheticOperatorRows",
]
