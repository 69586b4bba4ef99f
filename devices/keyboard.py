"""Keyboard as an operator device, without any GUI toolkit: the app feeds key presses and releases by name.

Each command axis has a (positive key, negative key) pair; raw value = pressed(positive) - pressed(negative).
press()/release() may come from the GUI thread while poll() runs in the control thread.
"""

from __future__ import annotations

import threading

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import COMMAND_AXES, GRIPPER, HumanCommand
from hg_dagger.devices.base import Device
from hg_dagger.devices.configs import KeyboardConfig


class Keyboard(Device):
    config_class = KeyboardConfig

    def __init__(self, config: KeyboardConfig | None = None):
        super().__init__(config or KeyboardConfig())
        self.config: KeyboardConfig
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._pressed: set[str] = set()  # pressed since the last poll
        self._connected = False
        self._gripper_closed = False
        self._slots = [(i, *self.config.axes[a]) for i, a in enumerate(COMMAND_AXES) if a in self.config.axes]

    @property
    def device_id(self) -> str:
        return "keyboard"

    @property
    def connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        self.release_all()
        self.pipeline.reset()
        self._connected = True

    def close(self) -> None:
        self._connected = False

    def press(self, key: str) -> None:
        key = key.lower()
        with self._lock:
            if key not in self._held:  # auto-repeat is not a new press
                self._pressed.add(key)
            self._held.add(key)

    def release(self, key: str) -> None:
        with self._lock:
            self._held.discard(key.lower())

    def release_all(self) -> None:
        """Forget every held key (the app calls this when its window loses focus)."""
        with self._lock:
            self._held.clear()
            self._pressed.clear()

    def poll(self) -> HumanCommand | None:
        if not self._connected:
            return None
        with self._lock:
            down = self._held | self._pressed
            pressed = self._pressed
            self._pressed = set()
        cfg = self.config
        buttons = frozenset(name for name, key in cfg.buttons.items() if key in down)
        raw = np.zeros(7, np.float32)
        for slot, pos, neg in self._slots:
            raw[slot] = float(pos in down) - float(neg in down)
        if "gripper" not in cfg.axes:
            gripper_key = cfg.buttons.get(GRIPPER)
            if cfg.gripper_toggle:
                if gripper_key in pressed:
                    self._gripper_closed = not self._gripper_closed
            else:
                self._gripper_closed = gripper_key in down
            raw[6] = 1.0 if self._gripper_closed else -1.0
        hold = cfg.hold_key is not None and cfg.hold_key in down
        return self._command(raw, hold=hold, buttons=buttons, t_ns=now_ns())
