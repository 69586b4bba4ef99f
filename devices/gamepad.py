"""Gamepad through pygame's joystick events (SDL): axis maps per controller, calibration per GUID.

poll() drains the joystick events from pygame's event queue (JOYAXISMOTION, JOYBUTTONDOWN/UP,
JOYHATMOTION, JOYDEVICEADDED/REMOVED), updates the stick/button state, and runs the command
pipeline. JOYDEVICEREMOVED for our joystick marks the device lost: poll() returns None from then on.
One gamepad per process: poll() consumes every joystick event in the queue.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import COMMAND_AXES, HumanCommand
from hg_dagger.devices.base import Device, DeviceError
from hg_dagger.devices.calibration import AxisCalibration, Calibration, default_calibration_dir, fit_axes
from hg_dagger.devices.configs import GamepadConfig, GamepadMap
from hg_dagger.devices.processing import AxisNormalizer

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
import pygame  # noqa: E402

log = logging.getLogger(__name__)

JOY_EVENTS = (
    pygame.JOYAXISMOTION,
    pygame.JOYBUTTONDOWN,
    pygame.JOYBUTTONUP,
    pygame.JOYHATMOTION,
    pygame.JOYDEVICEADDED,
    pygame.JOYDEVICEREMOVED,
)


def init_pygame_input() -> None:
    """Start SDL's event and joystick subsystems without opening a window.

    pygame's event queue needs the video subsystem; without a display the dummy driver serves.
    Joystick events are delivered even when no SDL window has focus.
    """
    os.environ.setdefault("SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS", "1")
    if not pygame.display.get_init():
        try:
            pygame.display.init()
        except pygame.error:
            os.environ["SDL_VIDEODRIVER"] = "dummy"
            pygame.display.init()
    if not pygame.joystick.get_init():
        pygame.joystick.init()


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
        self._joy = None
        self._instance_id: int | None = None
        self._guid = ""
        self._name = ""
        self._connected = False
        self.map_name = config.default_map
        self.calibration: Calibration | None = None
        self._axes: list[float] = []
        self._plan: tuple = ()
        self._named_buttons: tuple = ()
        self._hold_button: int | None = None
        self._hats: dict[int, tuple[int, int]] = {}
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
        init_pygame_input()
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
        log.info("gamepad %r connected (guid %s, map %s)", self._name, self._guid, self.map_name)

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

    def _check_map(self, joy) -> None:
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

    # -- calibration ----------------------------------------------------------------------------
    def _apply_calibration(self) -> None:
        """Build the pipeline's calibration stage from the calibration file and the axis map."""
        center = np.zeros(7)
        neg = np.ones(7)
        pos = np.ones(7)
        sign = np.ones(7)
        cal = self.calibration
        for slot, axis_name in enumerate(COMMAND_AXES):
            src = self.mapping.axes.get(axis_name)
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

    def calibrate(
        self, *, center_s: float = 2.0, range_s: float = 6.0, prompt: Callable[[str], None] = print
    ) -> Calibration:
        """Two phases: hands off (centers), then every stick and trigger through its full travel (ranges).

        Saves ``gamepad_<guid>.json`` in the calibration dir and uses it at once.
        """
        if not self._connected:
            raise DeviceError("calibrate() needs a connected gamepad: call connect() first")
        prompt("Calibrating: leave all sticks and triggers untouched.")
        center, lo1, hi1 = self._collect(center_s)
        prompt("Now move every stick around its full circle and press each trigger fully, several times.")
        _, lo2, hi2 = self._collect(range_s)
        if not self._connected:
            raise DeviceError(f"gamepad {self._name!r} was unplugged during calibration; nothing saved")
        axes = fit_axes(center, np.minimum(lo1, lo2), np.maximum(hi1, hi2))
        self.calibration = Calibration(device_type="gamepad", device_key=self._guid, name=self._name, axes=axes)
        path = self.calibration.save(self.config.calibration_dir or default_calibration_dir())
        self._apply_calibration()
        prompt(f"Calibration saved to {path}")
        return self.calibration

    def _collect(self, seconds: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Axis state samples every 10 ms for ``seconds``, and the extremes of every axis value seen."""
        lo = np.array(self._axes, np.float64)
        hi = lo.copy()
        samples = []
        deadline = time.monotonic() + seconds
        while True:
            for event in pygame.event.get(eventtype=JOY_EVENTS):
                self._handle(event)
                if event.type == pygame.JOYAXISMOTION and event.instance_id == self._instance_id:
                    lo[event.axis] = min(lo[event.axis], event.value)
                    hi[event.axis] = max(hi[event.axis], event.value)
            samples.append(list(self._axes))
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        return np.array(samples), lo, hi

    # -- polling --------------------------------------------------------------------------------
    def _handle(self, event) -> None:
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
            self._connected = False
            self._joy = None

    def _build_plan(self) -> None:
        """Where each command slot is read from, resolved once per connect (poll runs every tick)."""
        plan = []
        for slot, axis_name in enumerate(COMMAND_AXES):
            src = self.mapping.axes.get(axis_name)
            if src is None:
                continue
            if src.axis is not None:
                plan.append((slot, "axis", src.axis, 0))
            elif src.hat is not None:
                plan.append((slot, "hat", src.hat, 0 if src.hat_dir == "x" else 1))
            else:
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
        if not self._connected:
            return None
        down = self._held | self._pressed if self._pressed else self._held
        self._pressed = set()
        buttons = frozenset(name for name, b in self._named_buttons if b in down)
        return self._command(self.raw(), hold=self._hold_button in down, buttons=buttons, t_ns=now_ns())
