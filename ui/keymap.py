"""Which control of the chosen device moves which action dimension of the current task, and how a person
takes over with it: the words the banner and the device panel show.

Read from the task mapping (``human.axes``: action dim -> command axis) and the device's config
(configs/devices/*.yaml); no Qt here, so the rows can be checked without a window.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hg_dagger.contract.command import COMMAND_AXES, GRIPPER, RETURN, TAKEOVER

DECLINE_KEY = "n"  # the window's key for "let the student go on" (not a keyboard-device key)
ESTOP_KEY = "Esc"  # the window's e-stop key (in the console, never in a dialog: there Esc closes the dialog)

# SDL's joystick layouts of the pads configs/devices/gamepad.yaml names (index -> what is printed on the pad)
_PAD_BUTTONS = {
    "xbox": {0: "A", 1: "B", 2: "X", 3: "Y", 4: "LB", 5: "RB", 6: "View", 7: "Menu"},
    "playstation": {0: "Cross", 1: "Circle", 2: "Triangle", 3: "Square", 4: "L1", 5: "R1", 8: "Share"},
}
_PAD_AXES = {0: ("left stick", "left/right"), 1: ("left stick", "up/down"), 2: ("left trigger", ""),
             3: ("right stick", "left/right"), 4: ("right stick", "up/down"), 5: ("right trigger", "")}
_CAP = {"x": "push the cap forward / back", "y": "push the cap left / right", "z": "lift / press the cap",
        "roll": "tilt the cap left / right", "pitch": "tilt the cap forward / back", "yaw": "twist the cap",
        "gripper": "cap button"}


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
    from hg_dagger.devices import load_device_config

    return load_device_config(kind)


@functools.lru_cache(maxsize=32)
def _human_axes(task: str) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    from hg_dagger.envs import load_mapping

    m = load_mapping(task)
    return tuple(m.action.names), tuple(m.human.axes)


def _key_label(key: str) -> str:
    from hg_dagger.devices.keyboard import key_label

    return key_label(key)


def _keys(keys) -> str:
    keys = [keys] if isinstance(keys, str) else list(keys)
    return " / ".join(_key_label(str(k)) for k in keys)


def _pad_button(cfg, index: int | None) -> str:
    m = cfg.default_map
    names = _PAD_BUTTONS.get(m, {})
    return names.get(index, f"button {index}")


def axis_control(kind: str, axis: str | None) -> str:
    """The control of device ``kind`` that drives command ``axis`` ("-" where none does)."""
    if axis is None:
        return "-"
    try:
        cfg = _device_config(kind)
    except Exception:  # an unknown kind (synthetic, expert, none) or a broken config: no key to name
        return "-"
    if kind == "keyboard":
        if axis in cfg.axes:
            return _keys(cfg.axes[axis])
        if axis == GRIPPER and GRIPPER in cfg.buttons:
            return _keys(cfg.buttons[GRIPPER]) + (" (toggle)" if cfg.gripper_toggle else " (hold)")
        return "-"
    if kind == "gamepad":
        src = cfg.maps[cfg.default_map].axes.get(axis)
        if src is None:
            return "-"
        if src.axis is not None:
            where, how = _PAD_AXES.get(src.axis, (f"axis {src.axis}", ""))
            return f"{where} {how}".strip()
        if src.hat is not None:
            return "d-pad " + ("left/right" if src.hat_dir == "x" else "up/down")
        pos, neg = src.buttons
        return f"{_pad_button(cfg, pos)} / {_pad_button(cfg, neg)}"
    if kind == "spacemouse":
        return _CAP.get(axis, "-")
    return "-"


def task_key_rows(task: str, kind: str) -> list[KeyRow]:
    """One row per action dimension of ``task`` (action names from its mapping) for device ``kind``."""
    names, axes = _human_axes(task)
    return [KeyRow(i, n, a, axis_control(kind, a)) for i, (n, a) in enumerate(zip(names, axes, strict=True))]


def takeover_hint(kind: str) -> str:
    """How to take over with device ``kind``: "hold Space", "hold LB", "move the SpaceMouse cap"."""
    try:
        cfg = _device_config(kind) if kind in ("keyboard", "gamepad", "spacemouse") else None
    except Exception:
        cfg = None
    if kind == "keyboard":
        hold = getattr(cfg, "hold_key", None)
        return f"hold {_key_label(hold)}" if hold else "press " + _keys(cfg.buttons.get(TAKEOVER, "t"))
    if kind == "gamepad":
        hold = cfg.maps[cfg.default_map].hold_button if cfg is not None else None
        return f"hold {_pad_button(cfg, hold)}" if hold is not None else "press A"
    if kind == "spacemouse":
        return "move the SpaceMouse cap"
    return ""


def handback_hint(kind: str) -> str:
    """How to give control back with device ``kind``."""
    try:
        cfg = _device_config(kind) if kind in ("keyboard", "gamepad", "spacemouse") else None
    except Exception:
        cfg = None
    if kind == "keyboard" and cfg is not None:
        ret = _keys(cfg.buttons[RETURN]) if RETURN in cfg.buttons else ""
        hold = f"let go of {_key_label(cfg.hold_key)}" if cfg.hold_key else ""
        return " or ".join(p for p in (hold, f"press {ret}" if ret else "") if p)
    if kind == "gamepad" and cfg is not None:
        m = cfg.maps[cfg.default_map]
        parts = [f"let go of {_pad_button(cfg, m.hold_button)}"] if m.hold_button is not None else []
        if RETURN in m.buttons:
            parts.append(f"press {_pad_button(cfg, m.buttons[RETURN])}")
        return " or ".join(parts)
    if kind == "spacemouse":
        return "let go of the cap"
    return ""


def device_keys_line(kind: str) -> str:
    """The device's other controls in one line (gripper, ask for control, hand back), for under the key map."""
    if kind != "keyboard":
        return ""
    try:
        cfg = _device_config(kind)
    except Exception:
        return ""
    parts = []
    if cfg.hold_key:
        parts.append(f"hold {_key_label(cfg.hold_key)}: steer")
    if TAKEOVER in cfg.buttons:
        parts.append(f"{_keys(cfg.buttons[TAKEOVER])}: ask for control")
    if RETURN in cfg.buttons:
        parts.append(f"{_keys(cfg.buttons[RETURN])}: hand back")
    parts.append(f"{_key_label(DECLINE_KEY)}: let the student go on")
    parts.append(f"{ESTOP_KEY}: e-stop")
    return " · ".join(parts)
