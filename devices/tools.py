"""Operator-side helpers behind ``hg-dagger device``: list what is plugged in, calibrate, watch commands."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hg_dagger.devices.base import Device, DeviceError, make_device
from hg_dagger.devices.configs import DeviceConfig
from hg_dagger.devices.discovery import DeviceScanner


def connected_devices() -> list[str]:
    """One line per gamepad SDL sees and per 3Dconnexion device hidapi sees (with the map that would be used)."""
    scanner = DeviceScanner()
    lines = [d.describe() for d in scanner.scan() if d.kind != "keyboard"]
    return lines + scanner.problems


def calibrate(config: DeviceConfig | str | Path, *, prompt: Callable[[str], None] = print, **options: Any) -> Any:
    """Connect the configured device, run its calibration (saved to its calibration file), close it."""
    device = make_device(config)
    device.connect()
    try:
        return device.calibrate(prompt=prompt, **options)
    finally:
        device.close()


def monitor(device: Device, *, seconds: float, hz: float = 25.0, out: Callable[[str], None] = print) -> int:
    """Poll at ``hz`` for ``seconds`` and print each command (to check axis maps, signs and the deadman).

    Returns the number of commands read; raises DeviceError if the device is lost meanwhile.
    """
    period = 1.0 / hz
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cmd = device.poll()
        if cmd is None:
            raise DeviceError(f"{device.device_id or device.config.type}: device lost after {n} commands")
        n += 1
        # the formatter given in the call, so mypy checks it against numpy's formatter TypedDict
        motion, raw = (np.array2string(a, formatter={"float_kind": lambda v: f"{v:+.2f}"}) for a in (cmd.motion, cmd.raw))
        out(f"{'ENGAGED' if cmd.engaged else 'idle   '} motion {motion} raw {raw} {sorted(cmd.buttons)}")
        time.sleep(period)
    return n
