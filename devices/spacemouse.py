"""3Dconnexion SpaceMouse through HID (hidapi): 6-DoF reports parsed here, no driver needed.

Report formats (little-endian signed 16-bit counts, about +-350 at full deflection):
  split    : id 1 = translation x, y, z (7 bytes); id 2 = rotation rx, ry, rz (7 bytes)
  combined : id 1 = x, y, z, rx, ry, rz (13 bytes; newer wireless models)
  buttons  : id 3 = button bitmask, bit i = button i
Device frame as reported: x right, y toward the user, z down; rotations about those axes.
HumanCommand.raw holds the counts as read (gripper slot: the toggle state); scaling to [-1, 1],
center offsets and the frame transform are the command pipeline's job.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import GRIPPER, HumanCommand
from hg_dagger.devices.base import Device, DeviceError
from hg_dagger.devices.calibration import (
    AxisCalibration,
    Calibration,
    CalibrationPhase,
    Calibrator,
    default_calibration_dir,
)
from hg_dagger.devices.configs import SpaceMouseConfig
from hg_dagger.devices.processing import AxisNormalizer

log = logging.getLogger(__name__)

# Known 6-DoF products (vendor, product) -> name. The report format is told apart by length ("auto").
KNOWN_PRODUCTS: dict[tuple[int, int], str] = {
    (0x046D, 0xC626): "SpaceNavigator",
    (0x046D, 0xC627): "SpaceExplorer",
    (0x046D, 0xC628): "SpaceNavigator for Notebooks",
    (0x046D, 0xC629): "SpacePilot Pro",
    (0x046D, 0xC62B): "SpaceMouse Pro",
    (0x256F, 0xC62E): "SpaceMouse Wireless (cabled)",
    (0x256F, 0xC631): "SpaceMouse Pro Wireless (cabled)",
    (0x256F, 0xC632): "SpaceMouse Pro Wireless (receiver)",
    (0x256F, 0xC633): "SpaceMouse Enterprise",
    (0x256F, 0xC635): "SpaceMouse Compact",
    (0x256F, 0xC652): "Universal Receiver",
}

MAX_REPORTS_PER_POLL = 64  # bounds one poll's work even if the device floods


class HidHandle(Protocol):
    """The part of hidapi's ``hid.device`` we use."""

    def read(self, max_length: int) -> list[int]: ...

    def close(self) -> None: ...


class SpaceMouseParser:
    """State of one SpaceMouse built from its HID input reports."""

    def __init__(self, report_format: str = "auto"):
        self.report_format = report_format
        self.counts = np.zeros(6, np.float64)  # x, y, z, rx, ry, rz as read
        self.buttons = 0  # bitmask
        self.reports = 0

    def feed(self, report: bytes) -> bool:
        """Update from one report; False for a report id or length this parser does not know."""
        if not report:
            return False
        rid, n = report[0], len(report)
        if rid == 1 and n >= 13 and self.report_format != "split":
            self.counts[:] = struct.unpack_from("<6h", report, 1)
        elif rid == 1 and n >= 7 and self.report_format != "combined":
            self.counts[0:3] = struct.unpack_from("<3h", report, 1)
        elif rid == 2 and n >= 7 and self.report_format != "combined":
            self.counts[3:6] = struct.unpack_from("<3h", report, 1)
        elif rid == 3 and n >= 2:
            self.buttons = int.from_bytes(report[1:], "little")
        else:
            return False
        self.reports += 1
        return True

    def pressed(self, bit: int) -> bool:
        return bool(self.buttons >> bit & 1)


def find_spacemice(vendor_ids: Iterable[int], product_ids: Iterable[int]) -> list[dict[str, Any]]:
    """hidapi's entries for connected 6-DoF 3Dconnexion devices."""
    # hid deferred: the app extra (hidapi), optional
    import hid

    wanted = set(product_ids)
    found = []
    for vid in vendor_ids:
        for info in hid.enumerate(vid, 0):
            pid = info["product_id"]
            if (pid in wanted) if wanted else (vid, pid) in KNOWN_PRODUCTS:
                found.append(info)
    return found


class SpaceMouse(Device):
    config_class = SpaceMouseConfig

    def __init__(self, config: SpaceMouseConfig, hid_device: HidHandle | None = None, device_key: str = ""):
        """``hid_device``: an already-open HID handle (anything with read/close) instead of searching for one."""
        super().__init__(config)
        self.config: SpaceMouseConfig = config
        self.parser = SpaceMouseParser(config.report_format)
        self._handle: HidHandle | None = hid_device
        self._key = device_key or ("injected" if hid_device is not None else "")
        self._connected = False
        self._gripper_closed = False
        self._prev_buttons = 0
        self._pressed_bits = 0  # bits pressed since the last poll
        self.calibration: Calibration | None = None

    def _extra_scale(self) -> np.ndarray:
        t, r = self.config.translation_scale, self.config.rotation_scale
        return np.array([t, t, t, r, r, r, 1.0])

    @property
    def device_id(self) -> str:
        return f"spacemouse:{self._key}" if self._key else ""

    @property
    def connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        if self._handle is None:
            self._handle, self._key = self._open()
        directory = self.config.calibration_dir or default_calibration_dir()
        self.calibration = Calibration.find(directory, "spacemouse", self._key)
        self._apply_calibration()
        self.pipeline.reset()
        self._connected = True

    def _open(self) -> tuple[HidHandle, str]:
        # hid deferred: the app extra (hidapi), optional
        import hid

        cfg = self.config
        if cfg.path is not None:
            infos = [i for i in hid.enumerate() if i["path"].decode(errors="replace") == cfg.path]
        else:
            infos = find_spacemice(cfg.vendor_ids, cfg.product_ids)
        if not infos:
            raise DeviceError(
                "no SpaceMouse found: hidapi lists no 3Dconnexion 6-DoF device"
                + (f" at {cfg.path}" if cfg.path else f" (vendor ids {', '.join(hex(v) for v in cfg.vendor_ids)})")
                + "; on Linux check read permission on /dev/hidraw* (a udev rule)"
            )
        info = infos[0]
        handle = hid.device()
        try:
            handle.open_path(info["path"])
            handle.set_nonblocking(1)
        except OSError as exc:
            raise DeviceError(f"cannot open SpaceMouse {info['path']!r}: {exc} (permissions on /dev/hidraw*?)") from None
        key = f"{info['vendor_id']:04x}:{info['product_id']:04x}:{info.get('serial_number') or ''}"
        log.info("SpaceMouse %s opened (%s)", KNOWN_PRODUCTS.get((info["vendor_id"], info["product_id"]), "?"), key)
        return handle, key

    def close(self) -> None:
        self._connected = False
        if self._handle is not None:
            try:
                self._handle.close()
            except OSError:
                pass
        self._handle = None

    def _apply_calibration(self) -> None:
        fs = self.config.full_scale
        center = np.zeros(7)
        span = np.full(7, fs)
        span[6] = 1.0
        if self.calibration is not None:
            for i in range(6):
                ac = self.calibration.axis(i, AxisCalibration(center=0.0, min=-fs, max=fs))
                center[i] = ac.center
        self.set_normalizer(AxisNormalizer(center, span, span, 1.0))

    def _read_pending(self) -> bool:
        """Feed every pending report to the parser; False if the device failed (unplugged)."""
        try:
            for _ in range(MAX_REPORTS_PER_POLL):
                handle = self._handle
                assert handle is not None  # connected: connect() opened it before, close() clears both
                data = handle.read(64)
                if not data:
                    break
                self.parser.feed(bytes(data))
                self._pressed_bits |= self.parser.buttons & ~self._prev_buttons
                self._prev_buttons = self.parser.buttons
        except (OSError, ValueError) as exc:
            log.warning("SpaceMouse %s lost: %s", self._key, exc)
            self._connected = False
            return False
        return True

    def calibrator(self, *, center_s: float = 1.0, **options: Any) -> SpaceMouseCalibrator:
        """Hands off for ``center_s``: the mean of each axis at rest becomes its center offset (saved per device)."""
        self._refuse_options(options)
        if not self._connected:
            raise DeviceError("calibration needs a connected SpaceMouse: call connect() first")
        return SpaceMouseCalibrator(self, center_s=center_s)

    def poll(self) -> HumanCommand | None:
        if not self._connected or not self._read_pending():
            return None
        down = self.parser.buttons | self._pressed_bits
        pressed = self._pressed_bits
        self._pressed_bits = 0
        buttons = frozenset(name for bit, name in self.config.buttons.items() if down >> bit & 1)
        if self.config.gripper_toggle:
            if any(name == GRIPPER and pressed >> bit & 1 for bit, name in self.config.buttons.items()):
                self._gripper_closed = not self._gripper_closed
        else:
            self._gripper_closed = GRIPPER in buttons
        raw = np.empty(7, np.float32)
        raw[:6] = self.parser.counts
        raw[6] = 1.0 if self._gripper_closed else -1.0
        hb = self.config.hold_button
        hold = hb is not None and bool(down >> hb & 1)
        return self._command(raw, hold=hold, buttons=buttons, t_ns=now_ns())


class SpaceMouseCalibrator(Calibrator):
    """One phase, hands off: centers are the mean counts at rest; the range stays ``full_scale``."""

    def __init__(self, mouse: SpaceMouse, *, center_s: float):
        self.mouse = mouse
        self.phases = (CalibrationPhase("center", "Calibrating: do not touch the SpaceMouse cap.", center_s),)
        self.samples: list[np.ndarray] = []

    def sample(self, phase: str) -> None:
        if not self.mouse._read_pending():
            raise DeviceError(f"SpaceMouse {self.mouse._key} was unplugged during calibration; nothing saved")
        self.samples.append(self.mouse.parser.counts.copy())

    def feed(self, phase: str, values: HumanCommand | npt.ArrayLike) -> None:
        raw = values.raw if isinstance(values, HumanCommand) else values  # raw[:6] are the counts as read
        self.samples.append(np.asarray(raw, np.float64)[:6].copy())

    def finish(self) -> tuple[Calibration, Path]:
        m = self.mouse
        center = np.mean(self.samples, axis=0) if self.samples else m.parser.counts.copy()
        fs = m.config.full_scale
        axes = {i: AxisCalibration(center=float(c), min=-fs, max=fs) for i, c in enumerate(center)}
        m.calibration = Calibration(device_type="spacemouse", device_key=m._key, axes=axes)
        path = m.calibration.save(m.config.calibration_dir or default_calibration_dir())
        m._apply_calibration()
        return m.calibration, path
