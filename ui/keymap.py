"""Which control of the chosen device moves which action dimension of the current task, and how a person
takes over with it: the words the banner and the device panel show.

Read from the task mapping (``human.axes``: action dim -> command axis) and the device's config
(configs/devices/<type>.yaml, parsed through the device-type registry): the config names its own controls
(``axis_control``, ``takeover_hint``, ``handback_hint``, ``control_notes``), so nothing here knows a device kind.
No Qt here, so the rows can be checked without a window.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hg_dagger.contract.command import COMMAND_AXES
from hg_dagger.devices import operator_config
from hg_dagger.devices.configs import key_label
from hg_dagger.envs import load_mapping

DECLINE_KEY = "n"  # the window's key for "let the student go on" (not a keyboard-device key)
REWIND_KEY = "backspace"  # the window's key for "rewind and correct" while a request waits (simulation)
REWIND_S = 2.0  # how far a rewind goes back before the request
FLEET_TAKE_KEY = "p"  # one person, several robots: take the top request of the queue (docs/fleet.md)
FLEET_STOP_KEY = "x"  # e-stop the robot on screen alone (Shift+X clears it); Esc stops every robot
ESTOP_KEY = "Esc"  # the window's e-stop key (in the console, never in a dialog: there Esc closes the dialog)


@dataclass(frozen=True)
class KeyRow:
    """One action dimension of the task: its name, the command axis behind it, and the control that moves it."""

    dim: int
    action: str
    axis: str | None  # a COMMAND_AXES name, None where the person does not drive this dimension
    control: str  # e.g. "W / S", "left stick up/down", "-"

    @property
    def slot(self) -> int | None:
        """Index into DeviceState.axes (the device's 7 command axes)."""
        return COMMAND_AXES.index(self.axis) if self.axis in COMMAND_AXES else None


@functools.lru_cache(maxsize=16)
def _device_config(kind: str):
    """The config whose words describe a device of type ``kind``; None for an operator that is no device."""
    return operator_config(kind)


@functools.lru_cache(maxsize=32)
def _human_axes(task: str) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    m = load_mapping(task)
    return tuple(m.action.names), tuple(m.human.axes)


def axis_control(kind: str, axis: str | None) -> str:
    """The control of device ``kind`` that drives command ``axis`` ("-" where none does)."""
    cfg = _device_config(kind)
    return "-" if axis is None or cfg is None else cfg.axis_control(axis)


def task_key_rows(task: str, kind: str) -> list[KeyRow]:
    """One row per action dimension of ``task`` (action names from its mapping) for device ``kind``."""
    names, axes = _human_axes(task)
    return [KeyRow(i, n, a, axis_control(kind, a)) for i, (n, a) in enumerate(zip(names, axes, strict=True))]


def takeover_hint(kind: str) -> str:
    """How to take over with device ``kind``: "hold Space", "hold LB", "move the SpaceMouse cap"."""
    cfg = _device_config(kind)
    return cfg.takeover_hint() if cfg is not None else ""


def handback_hint(kind: str) -> str:
    """How to give control back with device ``kind``."""
    cfg = _device_config(kind)
    return cfg.handback_hint() if cfg is not None else ""


def device_keys_line(kind: str) -> str:
    """The device's other controls in one line (ask for control, hand back, the window's own keys), for under the
    key map; "" for a device whose controls are not keys of the window."""
    cfg = _device_config(kind)
    notes = cfg.control_notes() if cfg is not None else None
    if notes is None:
        return ""
    return " · ".join([*notes, f"{key_label(DECLINE_KEY)}: let the student go on", f"{ESTOP_KEY}: e-stop"])
