"""Operator-side helpers behind ``hg-dagger device``: list what is plugged in, calibrate, watch commands."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hg_dagger.devices.base import Device, DeviceError, make_device
from hg_dagger.devices.configs import DeviceConfig, load_device_config


def connected_devices() -> list[str]:
    """One line per gamepad SDL sees and per 3Dconnexion device hidapi sees (with the map that would be used)."""
    import pygame

    from hg_dagger.devices.gamepad import init_pygame_input, select_map
    from hg_dagger.devices.spacemouse import KNOWN_PRODUCTS, find_spacemice

    lines = []
    init_pygame_input()
    pad_cfg = load_device_config("gamepad")
    for i in range(pygame.joystick.get_count()):
        j = pygame.joystick.Joystick(i)
        chosen = select_map(pad_cfg.maps, pad_cfg.default_map, guid=j.get_guid(), name=j.get_name())
        lines.append(
            f"gamepad {i}: {j.get_name()!r} guid {j.get_guid()} - {j.get_numaxes()} axes, "
            f"{j.get_numbuttons()} buttons, {j.get_numhats()} hats - map {chosen}"
        )
    try:
        mice = find_spacemice((0x046D, 0x256F), ())
    except OSError as exc:  # hidapi without access to the HID subsystem
        mice = []
        lines.append(f"spacemouse: hidapi could not enumerate devices ({exc})")
    for info in mice:
        name = KNOWN_PRODUCTS.get((info["vendor_id"], info["product_id"]), "?")
        path = info["path"].decode(errors="replace")
        lines.append(f"spacemouse: {name} {info['vendor_id']:04x}:{info['product_id']:04x} at {path}")
    return lines


def calibrate(config: DeviceConfig | str | Path, *, prompt: Callable[[str], None] = print, **options):
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
    fmt = {"float_kind": lambda v: f"{v:+.2f}"}
    while time.monotonic() < deadline:
        cmd = device.poll()
        if cmd is None:
            raise DeviceError(f"{device.device_id or device.config.type}: device lost after {n} commands")
        n += 1
        motion, raw = (np.array2string(a, formatter=fmt) for a in (cmd.motion, cmd.raw))
        out(f"{'ENGAGED' if cmd.engaged else 'idle   '} motion {motion} raw {raw} {sorted(cmd.buttons)}")
        time.sleep(period)
    return n
