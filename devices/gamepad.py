"""Gamepad through pygame's joystick events (SDL): axis maps per controller, calibration per GUID.

poll() drains the joystick events from pygame's event queue (JOYAXISMOTION, JOYBUTTONDOWN/UP,
JOYHATMOTION, JOYDEVICEADDED/REMOVED), updates the stick/button state, and runs the command
pipeline. JOYDEVICEREMOVED for our joystick marks the device lost: poll() returns None from then on.
One gamepad per process: poll() consumes every joystick event in the queue.

This module is the one place the devices import pygame: it hides pygame's import banner and starts
SDL with its dummy video driver (no window, and no probing of X11/Wayland, which prints
"XDG_RUNTIME_DIR is invalid or not set" where there is no desktop session). Other modules take
``pygame`` from here.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import COMMAND_AXES, HumanCommand
from hg_dagger.devices.base import Device, DeviceError
from hg_dagger.devices.calibration import (
    AxisCalibration,
    Calibration,
    CalibrationPhase,
    Calibrator,
    default_calibration_dir,
    fit_axes,
)
from hg_dagger.devices.configs import AxisName, GamepadConfig, GamepadMap
from hg_dagger.devices.processing import AxisNormalizer

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
import pygame as pygame  # noqa: E402  (re-exported: devices.discovery reaches pygame through here)

log = logging.getLogger(__name__)

JOY_EVENTS = (
    pygame.JOYAXISMOTION,
    pygame.JOYBUTTONDOWN,
    pygame.JOYBUTTONUP,
    pygame.JOYHATMOTION,
    pygame.JOYDEVICEADDED,
    pygame.JOYDEVICEREMOVED,
)


# Guards SDL's event queue between a Gamepad connecting (control thread) and a DeviceScanner
# refreshing SDL's device list (GUI thread); poll() itself never takes it.
SDL_LOCK = threading.RLock()
_connected_pads: weakref.WeakSet[Gamepad] = weakref.WeakSet()


def init_pygame_input() -> None:
    """Start SDL's event and joystick subsystems without opening a window.

    pygame's event queue needs the video subsystem. Nothing here draws, so SDL always gets its dummy
    video driver: a real one would probe X11/Wayland (noise on stderr where there is no desktop
    session) and gain nothing. The process environment is left as it was. Joystick events are
    delivered even when no SDL window has focus. Audio is never initialised.
    """
    os.environ.setdefault("SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS", "1")
    if not pygame.display.get_init():
        chosen = os.environ.get("SDL_VIDEODRIVER")
        os.environ["SDL_VIDEODRIVER"] = "dummy"
        try:
            pygame.display.init()
        finally:
            if chosen is None:
                del os.environ["SDL_VIDEODRIVER"]
            else:
                os.environ["SDL_VIDEODRIVER"] = chosen
    if not pygame.joystick.get_init():
        pygame.joystick.init()


def gamepad_polled() -> bool:
    """True while a connected Gamepad of this process drains pygame's joystick events in its poll()."""
    return any(pad.connected for pad in list(_connected_pads))


def select_map(maps: dict[str, GamepadMap], default: str, *, guid: str, name: str) -> str:
    """The map listing this GUID, else the first whose name pattern occurs in the controller name, else default."""
    for key, m in maps.items():
        if guid in m.guids:
            return key
    lowered = name.lower()
    for key, m in maps.items():
        if any(p.lower() in lowered for p in m.names):
            return key
    return default


class Gamepad(Device):
    config_class = GamepadConfig

    def __init__(self, config: GamepadConfig):
        super().__init__(config)
        self.config: GamepadConfig = config
        self._joy: pygame.joystick.JoystickType | None = None
        self._instance_id: int | None = None
        self._guid = ""
        self._name = ""
        self._connected = False
        self.map_name = config.default_map
        self.calibration: Calibration | None = None
        self._axes: list[float] = []
        self._plan: tuple[tuple[int, str, int, int], ...] = ()  # (slot, 'axis' | 'hat' | 'buttons', index, index)
        self._named_buttons: tuple[tuple[str, int], ...] = ()
        self._hold_button: int | None = None
        self._hats: dict[int, tuple[float, ...]] = {}
        self._held: set[int] = set()
        self._pressed: set[int] = set()  # pressed since the last poll, so a short tap is never lost

    # -- identity -------------------------------------------------------------------------------
    @property
    def device_id(self) -> str:
        return f"gamepad:{self._guid}" if self._guid else ""

    @property
    def guid(self) -> str:
        return self._guid

    @property
    def name(self) -> str:
        return self._name

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def mapping(self) -> GamepadMap:
        return self.config.maps[self.map_name]

    # -- lifecycle ------------------------------------------------------------------------------
    def connect(self) -> None:
        with SDL_LOCK:
            self._connect()
            _connected_pads.add(self)
        log.info("gamepad %r connected (guid %s, map %s)", self._name, self._guid, self.map_name)

    def _connect(self) -> None:
        init_pygame_input()
        # Joystick events queued before this connect (a press minutes ago) must not act now;
        # the state is read fresh below.
        pygame.event.pump()
        pygame.event.get(eventtype=JOY_EVENTS)
        count = pygame.joystick.get_count()
        if count == 0:
            raise DeviceError(
                "no gamepad found: SDL lists no joystick (check the cable or receiver, and on Linux read "
                "permission on /dev/input/event*)"
            )
        index = self._choose_index(count)
        joy = pygame.joystick.Joystick(index)
        joy.init()
        self._joy = joy
        self._instance_id = joy.get_instance_id()
        self._guid = joy.get_guid()
        self._name = joy.get_name()
        self.map_name = select_map(self.config.maps, self.config.default_map, guid=self._guid, name=self._name)
        self._check_map(joy)
        self._build_plan()
        self._axes = [joy.get_axis(i) for i in range(joy.get_numaxes())]
        self._hats = {i: tuple(joy.get_hat(i)) for i in range(joy.get_numhats())}
        self._held = {b for b in range(joy.get_numbuttons()) if joy.get_button(b)}
        self._pressed = set()
        directory = self.config.calibration_dir or default_calibration_dir()
        self.calibration = Calibration.find(directory, "gamepad", self._guid)
        if self.calibration is None:
            log.info("gamepad %r (%s): no calibration in %s; using nominal ranges", self._name, self._guid, directory)
        self._apply_calibration()
        self.pipeline.reset()
        self._connected = True

    def _choose_index(self, count: int) -> int:
        if self.config.guid is not None:
            for i in range(count):
                if pygame.joystick.Joystick(i).get_guid() == self.config.guid:
                    return i
            raise DeviceError(f"no gamepad with guid {self.config.guid} among {count} joystick(s)")
        index = self.config.index or 0
        if index >= count:
            raise DeviceError(f"gamepad index {index} requested, but SDL lists only {count} joystick(s)")
        return index

    def _check_map(self, joy: pygame.joystick.JoystickType) -> None:
        m = self.mapping
        counts = {"axis": joy.get_numaxes(), "hat": joy.get_numhats(), "button": joy.get_numbuttons()}
        used = [("axis", s.axis) for s in m.axes.values() if s.axis is not None]
        used += [("hat", s.hat) for s in m.axes.values() if s.hat is not None]
        used += [("button", b) for s in m.axes.values() if s.buttons for b in s.buttons]
        used += [("button", b) for b in m.buttons.values()]
        used += [("button", m.hold_button)] if m.hold_button is not None else []
        for kind, i in used:
            if i >= counts[kind]:
                raise DeviceError(
                    f"gamepad map {self.map_name!r} uses {kind} {i}, but {self._name!r} has {counts[kind]} {kind}(s)"
                )

    def close(self) -> None:
        self._connected = False
        self._joy = None
        _connected_pads.discard(self)

    # -- calibration ----------------------------------------------------------------------------
    def _apply_calibration(self) -> None:
        """Build the pipeline's calibration stage from the calibration file and the axis map."""
        center = np.zeros(7)
        neg = np.ones(7)
        pos = np.ones(7)
        sign = np.ones(7)
        cal = self.calibration
        for slot, axis_name in enumerate(COMMAND_AXES):
            src = self.mapping.axes.get(cast(AxisName, axis_name))  # COMMAND_AXES are the AxisNames
            if src is None:
                continue
            sign[slot] = -1.0 if src.invert else 1.0
            if src.axis is None:
                continue
            ac = cal.axis(src.axis) if cal else AxisCalibration()
            if src.trigger:  # rest (min) .. fully pressed (max) -> -1 .. +1
                center[slot] = (ac.min + ac.max) / 2
                neg[slot] = pos[slot] = (ac.max - ac.min) / 2
            else:
                center[slot] = ac.center
                neg[slot], pos[slot] = ac.center - ac.min, ac.max - ac.center
        self.set_normalizer(AxisNormalizer(center, neg, pos, sign))

    def calibrator(self, *, center_s: float = 2.0, range_s: float = 6.0, **options: Any) -> GamepadCalibrator:
        """Two phases: hands off (centers), then every stick and trigger through its full travel (ranges).

        ``calibrate()`` runs them blocking; finishing saves ``gamepad_<guid>.json`` in the calibration dir
        and uses it at once.
        """
        self._refuse_options(options)
        if not self._connected:
            raise DeviceError("calibration needs a connected gamepad: call connect() first")
        return GamepadCalibrator(self, center_s=center_s, range_s=range_s)

    # -- polling --------------------------------------------------------------------------------
    def _drain(self, on_axis: Callable[[int, float], None] | None = None) -> None:
        """Apply every queued joystick event; ``on_axis(axis, value)`` sees each axis value of ours."""
        for event in pygame.event.get(eventtype=JOY_EVENTS):
            self._handle(event)
            if on_axis is not None and event.type == pygame.JOYAXISMOTION and event.instance_id == self._instance_id:
                on_axis(event.axis, event.value)

    def axis_values(self) -> np.ndarray:
        """Every physical axis as last read (calibration is stored per physical axis)."""
        return np.array(self._axes, np.float64)

    def _handle(self, event: pygame.event.Event) -> None:
        t = event.type
        if t == pygame.JOYDEVICEADDED:
            return  # a new joystick is not ours until connect() picks it
        if getattr(event, "instance_id", None) != self._instance_id:
            return
        if t == pygame.JOYAXISMOTION:
            if event.axis < len(self._axes):
                self._axes[event.axis] = event.value
        elif t == pygame.JOYBUTTONDOWN:
            self._held.add(event.button)
            self._pressed.add(event.button)
        elif t == pygame.JOYBUTTONUP:
            self._held.discard(event.button)
        elif t == pygame.JOYHATMOTION:
            self._hats[event.hat] = tuple(event.value)
        elif t == pygame.JOYDEVICEREMOVED:
            log.warning("gamepad %r (%s) removed", self._name, self._guid)
            self.close()

    def _build_plan(self) -> None:
        """Where each command slot is read from, resolved once per connect (poll runs every tick)."""
        plan = []
        for slot, axis_name in enumerate(COMMAND_AXES):
            src = self.mapping.axes.get(cast(AxisName, axis_name))  # COMMAND_AXES are the AxisNames
            if src is None:
                continue
            if src.axis is not None:
                plan.append((slot, "axis", src.axis, 0))
            elif src.hat is not None:
                plan.append((slot, "hat", src.hat, 0 if src.hat_dir == "x" else 1))
            else:
                assert src.buttons is not None  # an AxisSource has exactly one of axis, hat, buttons
                plan.append((slot, "buttons", *src.buttons))
        self._plan = tuple(plan)
        m = self.mapping
        self._named_buttons = tuple(m.buttons.items())
        self._hold_button = m.hold_button

    def raw(self) -> np.ndarray:
        """The 7 command slots as read (before calibration and shaping)."""
        out = [0.0] * 7
        for slot, kind, a, b in self._plan:
            if kind == "axis":
                out[slot] = self._axes[a]
            elif kind == "hat":
                out[slot] = self._hats.get(a, (0, 0))[b]
            else:
                out[slot] = float(a in self._held) - float(b in self._held)
        return np.array(out, np.float32)

    def poll(self) -> HumanCommand | None:
        if not self._connected:
            return None
        for event in pygame.event.get(eventtype=JOY_EVENTS):
            self._handle(event)
        if not self.connected:  # the property: an event above may have closed it (the pad removed)
            return None
        down = self._held | self._pressed if self._pressed else self._held
        self._pressed = set()
        buttons = frozenset(name for name, b in self._named_buttons if b in down)
        return self._command(self.raw(), hold=self._hold_button in down, buttons=buttons, t_ns=now_ns())


class GamepadCalibrator(Calibrator):
    """Centers from the hands-off samples; ranges from the extremes seen over both phases (every event counts)."""

    def __init__(self, pad: Gamepad, *, center_s: float, range_s: float):
        self.pad = pad
        self.phases = (
            CalibrationPhase("center", "Calibrating: leave all sticks and triggers untouched.", center_s),
            CalibrationPhase(
                "range", "Now move every stick around its full circle and press each trigger fully, several times.",
                range_s,
            ),
        )
        start = pad.axis_values()
        self.lo, self.hi = start.copy(), start.copy()
        self.center_samples: list[np.ndarray] = []

    def _extreme(self, axis: int, value: float) -> None:
        if axis < len(self.lo):
            self.lo[axis] = min(self.lo[axis], value)
            self.hi[axis] = max(self.hi[axis], value)

    def sample(self, phase: str) -> None:
        self.pad._drain(self._extreme)
        if not self.pad.connected:
            raise DeviceError(f"gamepad {self.pad.name!r} was unplugged during calibration; nothing saved")
        self.feed(phase, self.pad.axis_values())

    def feed(self, phase: str, values: HumanCommand | npt.ArrayLike) -> None:
        if isinstance(values, HumanCommand):  # polled elsewhere: the pad's state is what that poll read
            values = self.pad.axis_values()
        values = np.asarray(values, np.float64)
        if values.shape != self.lo.shape:
            raise DeviceError(f"calibration sample has {values.size} axes, the gamepad has {self.lo.size}")
        np.minimum(self.lo, values, out=self.lo)
        np.maximum(self.hi, values, out=self.hi)
        if phase == "center":
            self.center_samples.append(values)

    def finish(self) -> tuple[Calibration, Path]:
        pad = self.pad
        if not pad.connected:
            raise DeviceError(f"gamepad {pad.name!r} was unplugged during calibration; nothing saved")
        samples = self.center_samples or [pad.axis_values()]
        axes = fit_axes(np.array(samples), self.lo, self.hi)
        pad.calibration = Calibration(device_type="gamepad", device_key=pad.guid, name=pad.name, axes=axes)
        path = pad.calibration.save(pad.config.calibration_dir or default_calibration_dir())
        pad._apply_calibration()
        return pad.calibration, path
