"""The Device interface, and ``make_device``, which builds one through the record of its config ``type``
(DEVICE_TYPES in devices/configs.py).

Lifecycle: ``connect()`` opens the hardware, ``calibrate()`` measures and saves its calibration,
``poll()`` is called once per control tick and returns a HumanCommand, or None when the device is
gone (unplugged, read error, closed): the control loop then holds or stops the robot within that tick.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import HumanCommand
from hg_dagger.devices.calibration import Calibrator
from hg_dagger.devices.configs import (
    DEVICE_TYPES,
    DeviceConfig,
    DeviceType,
    load_device_config,
    parse_device_config,
)
from hg_dagger.devices.errors import DeviceError
from hg_dagger.devices.processing import AxisNormalizer, CommandPipeline
from hg_dagger.devices.wizard import CalibrationWizard

__all__ = ["DEVICE_TYPES", "Device", "DeviceError", "DeviceType", "device_class", "make_device"]


def device_class(type_name: str) -> type[Device]:
    """The Device class registered for config ``type`` (DEVICE_TYPES, plugins included)."""
    if type_name not in DEVICE_TYPES:
        raise DeviceError(f"unknown device type {type_name!r}; known types: {', '.join(DEVICE_TYPES.names())} "
                          f"(plugins register through the entry point group {DEVICE_TYPES.group!r})")
    cls: type[Device] = DEVICE_TYPES.get(type_name).device_class()
    return cls


def make_device(cfg: DeviceConfig | dict[str, Any] | str | Path, **kwargs: Any) -> Device:
    """Build (not connect) the device a config describes: a config object, a dict, or a YAML file path.

    Extra keyword arguments go to the device class (the synthetic operator needs ``command_fn``).
    """
    if isinstance(cfg, str | Path):
        cfg = load_device_config(cfg)
    elif isinstance(cfg, dict):
        cfg = parse_device_config(cfg, source="device config")
    return device_class(cfg.type).from_config(cfg, **kwargs)


class Device(ABC):
    """One operator input device. Subclasses read their hardware and hand raw values to ``_command``."""

    config_class: ClassVar[type[DeviceConfig]] = DeviceConfig

    def __init__(self, config: DeviceConfig):
        self.config = config
        self.pipeline = CommandPipeline(config.processing, extra_scale=self._extra_scale())

    @classmethod
    def from_config(cls, config: DeviceConfig, **kwargs: Any) -> Device:
        return cls(config, **kwargs)

    def _extra_scale(self) -> float | np.ndarray:
        return 1.0

    @property
    @abstractmethod
    def device_id(self) -> str:
        """Stable identity, e.g. 'gamepad:<guid>'; stored with every human command."""

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @abstractmethod
    def connect(self) -> None:
        """Open the device; raises DeviceError with a hint when none is found."""

    def calibrator(self, **options: Any) -> Calibrator | None:
        """This device's calibration as phases (see devices/wizard.py); None for devices that need none."""
        return None

    def _refuse_options(self, options: dict[str, Any]) -> None:
        """What Python raises for a keyword a subclass's ``calibrator`` does not name (it takes ``**options``, as here)."""
        if options:
            raise TypeError(f"{type(self).__name__}.calibrator() got an unexpected keyword argument {next(iter(options))!r}")

    def calibrate(self, *, prompt: Callable[[str], None] = print, **options: Any) -> Any:
        """Measure and save the calibration now, blocking (None for devices that need none)."""
        return CalibrationWizard(self, **options).run(prompt=prompt)

    @property
    def deadzone(self) -> np.ndarray:
        """Per command slot (x .. gripper), in the units of ``normalized``: what a live axes view draws as the dead band."""
        return np.array(self.config.processing.deadzone, np.float64)

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        """``HumanCommand.raw`` after calibration (center, range, sign): [7] in [-1, 1], where the deadzone applies.

        ``raw`` is in device units (SpaceMouse counts, uninverted sticks) and ``motion`` is zero while
        not engaged, so a live axes view draws this against ``deadzone``.
        """
        return self.pipeline.normalizer(raw)

    @abstractmethod
    def poll(self) -> HumanCommand | None:
        """Read everything pending and return this tick's command; None if the device is lost."""

    @abstractmethod
    def close(self) -> None: ...

    def set_ee_rotation(self, ee_rotation: np.ndarray) -> None:
        """Current end-effector orientation (3x3, base frame) for end-effector-frame teleoperation."""
        self.pipeline.set_ee_rotation(ee_rotation)

    def set_normalizer(self, normalizer: AxisNormalizer) -> None:
        self.pipeline.normalizer = normalizer

    def _command(self, raw: np.ndarray, *, hold: bool, buttons: frozenset[str], t_ns: int | None = None) -> HumanCommand:
        t = now_ns() if t_ns is None else t_ns
        raw = np.asarray(raw, np.float32)
        motion, engaged = self.pipeline.process(raw, hold=hold, t_ns=t)
        return HumanCommand(t_device=t, raw=raw, motion=motion, engaged=engaged, buttons=buttons, device_id=self.device_id)

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"<{type(self).__name__} {self.device_id or '?'} {state}>"
