"""Keyboard as an operator device, without any GUI toolkit: the app feeds key presses and releases by name.

Each command axis has a (positive key, negative key) pair; raw value = pressed(positive) - pressed(negative).
``key_layout()`` lists the keys and what they do, for the app's help.
press()/release() may come from the GUI thread while poll() runs in the control thread.
"""

from __future__ import annotations

import threading

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import COMMAND_AXES, ESTOP, GRIPPER, RETURN, TAKEOVER, HumanCommand
from hg_dagger.devices.base import Device
from hg_dagger.devices.configs import KeyboardConfig, key_label


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
        buttons = frozenset(name for name, keys in cfg.buttons.items() if any(k in down for k in keys))
        raw = np.zeros(7, np.float32)
        for slot, pos, neg in self._slots:
            raw[slot] = float(pos in down) - float(neg in down)
        hold = cfg.hold_key is not None and cfg.hold_key in down
        if "gripper" not in cfg.axes:
            gripper_keys = cfg.buttons.get(GRIPPER, ())
            # with a deadman, the gripper key acts only while it is held: a press while the student drives
            # must not flip the state the next take-over starts from
            live = hold or cfg.hold_key is None
            if cfg.gripper_toggle:
                if live and any(k in pressed for k in gripper_keys):
                    self._gripper_closed = not self._gripper_closed
            elif live:
                self._gripper_closed = any(k in down for k in gripper_keys)
            raw[6] = 1.0 if self._gripper_closed else -1.0
        return self._command(raw, hold=hold, buttons=buttons, t_ns=now_ns())


_AXIS_MEANING = {
    "x": ("move forward (+x)", "move back (-x)"),
    "y": ("move left (+y)", "move right (-y)"),
    "z": ("move up (+z)", "move down (-z)"),
    "roll": ("roll right (+roll)", "roll left (-roll)"),
    "pitch": ("pitch nose down (+pitch)", "pitch nose up (-pitch)"),
    "yaw": ("yaw + (turn left)", "yaw - (turn right)"),
    "gripper": ("close gripper", "open gripper"),
}
_BUTTON_MEANING = {
    TAKEOVER: "take over from the policy",
    RETURN: "hand control back to the policy",
    ESTOP: "emergency stop",
}
def key_layout(config: KeyboardConfig | None = None) -> list[tuple[str, str]]:
    """(key, meaning) rows for a help dialog, in the order hold key, axes, buttons."""
    cfg = config or KeyboardConfig()
    rows = []
    if cfg.hold_key:
        rows.append((key_label(cfg.hold_key), "hold to intervene (motion keys act only while held)"))
    for axis in COMMAND_AXES:
        if axis in cfg.axes:
            for key, meaning in zip(cfg.axes[axis], _AXIS_MEANING[axis], strict=True):
                rows.append((key_label(key), meaning))
    for name, keys in cfg.buttons.items():
        if name == GRIPPER:
            meaning = "toggle gripper open / closed" if cfg.gripper_toggle else "close gripper while held"
        else:
            meaning = _BUTTON_MEANING[name]
        rows.append((" / ".join(key_label(k) for k in keys), meaning))
    return rows
