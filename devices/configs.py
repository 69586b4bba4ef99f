"""Device configs (pydantic) and the device-type registry: one record per device ``type`` (``DEVICE_TYPES``, entry
point group ``hg_dagger.devices``), whose config class validates a device file (``kind: device``).

A config also says, in the operator's words, which control drives each command axis and how to take over and hand
back (``axis_control``, ``takeover_hint``, ``handback_hint``, ``control_notes``): the app's key map asks the config
instead of knowing device kinds. Kept free of hardware imports so configs can be checked anywhere (``hg-dagger
config check``); a device class is named as ``"module:Class"`` and imported only when one is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import Field, RootModel, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from hg_dagger import config as config_io
from hg_dagger.contract.command import COMMAND_AXES, ESTOP, GRIPPER, RETURN, TAKEOVER
from hg_dagger.contract.model import StrictModel
from hg_dagger.devices.processing import FrameConfig, HoldConfig, ProcessingConfig
from hg_dagger.errors import ConfigError
from hg_dagger.registry import Registry, RegistryError

ButtonName = Literal["takeover", "return", "estop", "gripper"]
AxisName = Literal["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
assert set(get_args(ButtonName)) == {TAKEOVER, RETURN, ESTOP, GRIPPER}  # the contract's names
assert get_args(AxisName) == COMMAND_AXES


class DeviceConfig(StrictModel):
    """Fields every device has."""

    type: str
    name: str = ""  # a label for people
    processing: ProcessingConfig = Field(default_factory=ProcessingConfig)
    calibration_dir: Path | None = None  # default: $HG_DAGGER_CALIBRATION_DIR or ~/.config/hg-dagger/calibration

    @field_validator("calibration_dir")
    @classmethod
    def _expand_home(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None

    # The operator's words, for the app's banner and device panel; a device type overrides what it can say.
    def axis_control(self, axis: str) -> str:
        """The control that drives command ``axis`` ("W / S", "left stick up/down"); "-" where none does."""
        return "-"

    def takeover_hint(self) -> str:
        """How a person takes over ("hold Space"); "" where the device has no such control."""
        return ""

    def handback_hint(self) -> str:
        """How a person hands control back ("let go of LB or press B"); "" where it has none."""
        return ""

    def control_notes(self) -> list[str] | None:
        """The device's other controls, one phrase each ("T: ask for control"), for a line under the key map;
        None where the device has no such line (its controls are not keys of the app's window)."""
        return None


def key_label(key: str) -> str:
    """How a key name is shown to people: 'w' -> 'W', 'escape' -> 'Esc'."""
    return _KEY_LABELS.get(key, key.upper() if len(key) == 1 else key.capitalize())


def key_labels(keys: str | Iterable[str]) -> str:
    """One key or several, as people read them: "Enter / B"."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    return " / ".join(key_label(str(k)) for k in keys)


_KEY_LABELS = {"escape": "Esc", "enter": "Enter", "space": "Space", "up": "Up", "down": "Down", "left": "Left",
               "right": "Right", "shift": "Shift", "tab": "Tab", "backspace": "Backspace"}


# ---- gamepad -----------------------------------------------------------------------------------


class AxisSource(StrictModel):
    """Where one command axis comes from: an analog axis, one direction of a hat, or a +/- button pair."""

    axis: int | None = Field(None, ge=0)
    hat: int | None = Field(None, ge=0)
    hat_dir: Literal["x", "y"] = "x"
    buttons: tuple[int, int] | None = None  # (positive, negative) button indices
    invert: bool = False
    trigger: bool = False  # analog trigger: rest..fully pressed maps to -1..+1

    @model_validator(mode="after")
    def _one_source(self) -> AxisSource:
        given = [k for k in ("axis", "hat", "buttons") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of axis, hat, buttons (got {', '.join(given) or 'none'})")
        if self.trigger and self.axis is None:
            raise ValueError("trigger: true needs an analog axis")
        return self


class GamepadMap(StrictModel):
    """Axis and button layout of one controller family, chosen by GUID or by name."""

    guids: list[str] = []  # exact SDL GUIDs
    names: list[str] = []  # case-insensitive substrings of the controller name
    axes: dict[AxisName, AxisSource] = {}
    buttons: dict[ButtonName, int] = {}
    hold_button: int | None = None  # hold-to-intervene (deadman) button


class GamepadConfig(DeviceConfig):
    type: Literal["gamepad"] = "gamepad"
    index: int | None = Field(None, ge=0)  # which joystick; default: first one (or the one with `guid`)
    guid: str | None = None
    maps: dict[str, GamepadMap] = Field(min_length=1)
    default_map: str

    @model_validator(mode="after")
    def _default_exists(self) -> GamepadConfig:
        if self.default_map not in self.maps:
            raise ValueError(f"default_map {self.default_map!r} is not one of maps: {', '.join(self.maps)}")
        return self

    def button_label(self, index: int | None) -> str:
        """What is printed on button ``index`` of the default map's pad ("LB"), else "button <index>"."""
        if index is None:
            return f"button {index}"
        return _PAD_BUTTONS.get(self.default_map, {}).get(index, f"button {index}")

    def axis_control(self, axis: str) -> str:
        src = self.maps[self.default_map].axes.get(cast(AxisName, axis))  # a name that is no axis: None
        if src is None:
            return "-"
        if src.axis is not None:
            where, how = _PAD_AXES.get(src.axis, (f"axis {src.axis}", ""))
            return f"{where} {how}".strip()
        if src.hat is not None:
            return "d-pad " + ("left/right" if src.hat_dir == "x" else "up/down")
        pos, neg = src.buttons or (None, None)
        return f"{self.button_label(pos)} / {self.button_label(neg)}"

    def takeover_hint(self) -> str:
        m = self.maps[self.default_map]
        if m.hold_button is not None:
            return f"hold {self.button_label(m.hold_button)}"
        return f"press {self.button_label(m.buttons[TAKEOVER])}" if TAKEOVER in m.buttons else ""

    def handback_hint(self) -> str:
        m = self.maps[self.default_map]
        parts = [f"let go of {self.button_label(m.hold_button)}"] if m.hold_button is not None else []
        if RETURN in m.buttons:
            parts.append(f"press {self.button_label(m.buttons[RETURN])}")
        return " or ".join(parts)


# SDL's joystick layouts of the pads configs/devices/gamepad.yaml names (index -> what is printed on the pad)
_PAD_BUTTONS = {
    "xbox": {0: "A", 1: "B", 2: "X", 3: "Y", 4: "LB", 5: "RB", 6: "View", 7: "Menu"},
    "playstation": {0: "Cross", 1: "Circle", 2: "Triangle", 3: "Square", 4: "L1", 5: "R1", 8: "Share"},
}
_PAD_AXES = {0: ("left stick", "left/right"), 1: ("left stick", "up/down"), 2: ("left trigger", ""),
             3: ("right stick", "left/right"), 4: ("right stick", "up/down"), 5: ("right trigger", "")}


# ---- SpaceMouse --------------------------------------------------------------------------------

# 3Dconnexion's two USB vendor ids (the older products carry Logitech's).
SPACEMOUSE_VENDORS = (0x046D, 0x256F)


class SpaceMouseConfig(DeviceConfig):
    type: Literal["spacemouse"] = "spacemouse"
    vendor_ids: list[int] = list(SPACEMOUSE_VENDORS)
    product_ids: list[int] = []  # empty: any 3Dconnexion 6-DoF device in the known-product table
    path: str | None = None  # a specific hidraw path (from `hid.enumerate()`)
    report_format: Literal["auto", "split", "combined"] = "auto"
    full_scale: float = Field(350.0, gt=0)  # counts at full deflection
    translation_scale: float = Field(1.0, gt=0)
    rotation_scale: float = Field(1.0, gt=0)
    buttons: dict[int, ButtonName] = {0: TAKEOVER, 1: GRIPPER}  # bit index -> name
    gripper_toggle: bool = True  # the GRIPPER button toggles the gripper axis between -1 (open) and +1
    hold_button: int | None = None
    processing: ProcessingConfig = Field(
        default_factory=lambda: ProcessingConfig(hold=HoldConfig(engage_on="motion", release_delay_s=0.5))
    )

    def axis_control(self, axis: str) -> str:
        return _CAP.get(axis, "-")

    def takeover_hint(self) -> str:
        return "move the SpaceMouse cap"

    def handback_hint(self) -> str:
        return "let go of the cap"


_CAP = {"x": "push the cap forward / back", "y": "push the cap left / right", "z": "lift / press the cap",
        "roll": "tilt the cap left / right", "pitch": "tilt the cap forward / back", "yaw": "twist the cap",
        "gripper": "cap button"}


# ---- keyboard ----------------------------------------------------------------------------------


# The app handles Esc itself (emergency stop); it may only ever mean the e-stop button here.
ESTOP_KEY = "escape"


class KeyboardConfig(DeviceConfig):
    """Key names are lower case, as the app reports them ('w', 'space', 'escape', 'enter', 'up', 'shift')."""

    type: Literal["keyboard"] = "keyboard"
    axes: dict[AxisName, tuple[str, str]] = {  # (positive key, negative key)
        "x": ("w", "s"),
        "y": ("a", "d"),
        "z": ("r", "f"),
        "roll": ("right", "left"),
        "pitch": ("down", "up"),
        "yaw": ("q", "e"),
    }
    # one key or a list of keys per button
    buttons: dict[ButtonName, tuple[str, ...]] = {
        TAKEOVER: ("t",), RETURN: ("enter", "b"), ESTOP: (ESTOP_KEY,), GRIPPER: ("g",),
    }
    hold_key: str | None = "space"
    gripper_toggle: bool = True

    @field_validator("buttons", mode="before")
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {b: (keys,) if isinstance(keys, str) else keys for b, keys in v.items()}
        return v

    @model_validator(mode="after")
    def _lower(self) -> KeyboardConfig:
        self.axes = {a: (p.lower(), n.lower()) for a, (p, n) in self.axes.items()}
        self.buttons = {b: tuple(k.lower() for k in keys) for b, keys in self.buttons.items()}
        self.hold_key = self.hold_key.lower() if self.hold_key else None
        uses = [(f"axes.{a}", k) for a, pair in self.axes.items() for k in pair]
        uses += [(f"buttons.{b}", k) for b, keys in self.buttons.items() for k in keys]
        uses += [("hold_key", self.hold_key)] if self.hold_key else []
        seen: dict[str, str] = {}
        for where, key in uses:
            if key == ESTOP_KEY and where != f"buttons.{ESTOP}":
                raise ValueError(f"{where}: {ESTOP_KEY!r} is reserved for the emergency stop")
            if key in seen:
                raise ValueError(f"{where}: key {key!r} is already used by {seen[key]}")
            seen[key] = where
        return self

    def axis_control(self, axis: str) -> str:
        if axis in self.axes:
            return key_labels(self.axes[axis])
        if axis == GRIPPER and GRIPPER in self.buttons:
            return key_labels(self.buttons[GRIPPER]) + (" (toggle)" if self.gripper_toggle else " (hold)")
        return "-"

    def takeover_hint(self) -> str:
        if self.hold_key:
            return f"hold {key_label(self.hold_key)}"
        return f"press {key_labels(self.buttons[TAKEOVER])}" if TAKEOVER in self.buttons else ""

    def handback_hint(self) -> str:
        ret = f"press {key_labels(self.buttons[RETURN])}" if RETURN in self.buttons else ""
        hold = f"let go of {key_label(self.hold_key)}" if self.hold_key else ""
        return " or ".join(p for p in (hold, ret) if p)

    def control_notes(self) -> list[str] | None:
        notes = [f"hold {key_label(self.hold_key)}: steer"] if self.hold_key else []
        if TAKEOVER in self.buttons:
            notes.append(f"{key_labels(self.buttons[TAKEOVER])}: ask for control")
        if RETURN in self.buttons:
            notes.append(f"{key_labels(self.buttons[RETURN])}: hand back")
        return notes


# ---- synthetic operator ------------------------------------------------------------------------


class SyntheticConfig(DeviceConfig):
    type: Literal["synthetic"] = "synthetic"
    reaction_delay_steps: int = Field(5, ge=0)  # ticks from the handover request to the first correction
    noise_std: float = Field(0.0, ge=0.0)  # Gaussian noise on the 6 motion axes (not the gripper)
    availability: float = Field(1.0, ge=0.0, le=1.0)  # probability the person answers a given request
    seed: int = 0
    return_after_steps: int | None = Field(None, ge=1)  # hold RETURN from the Nth engaged tick on


# ---- the device-type registry ------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceType:
    """One device type: what ``type: NAME`` in a device file means.

    config: the DeviceConfig class that validates the file; its ``axis_control``, ``takeover_hint``,
        ``handback_hint`` and ``control_notes`` are the words the app shows for the device.
    device: the Device class built from a config (``from_config(config, **kwargs)``), or ``"module:Class"``,
        imported when the first one is built, so hardware libraries (pygame, hidapi) load only then.
    """

    config: type[DeviceConfig]
    device: Callable[..., Any] | str
    description: str = ""

    def __post_init__(self) -> None:
        is_config = isinstance(self.config, type) and issubclass(self.config, DeviceConfig)
        kind = self.config.model_fields.get("type") if is_config else None
        if kind is None or not isinstance(kind.default, str):
            raise RegistryError(f"device type {self.config!r}: the config is a DeviceConfig model with a "
                                f"'type: Literal[\"<name>\"] = \"<name>\"' field")

    def device_class(self) -> Any:
        """The device class itself (a ``"module:Class"`` string is imported here; ImportError propagates)."""
        if not isinstance(self.device, str):
            return self.device
        module, _, name = self.device.partition(":")
        return getattr(importlib.import_module(module), name)


DEVICE_TYPES: Registry[DeviceType] = Registry("devices", "device type")


class DeviceFile(RootModel[DeviceConfig]):
    """A device config file (``kind: device``): its ``type`` picks a registered device type, whose config class
    validates the rest (errors keyed under the type, as ``gamepad.default_map``)."""

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> DeviceFile:
        if isinstance(obj, DeviceConfig):
            return cls.model_construct(obj)
        name = obj.get("type") if isinstance(obj, dict) else None
        try:
            config_class = DEVICE_TYPES.get(name).config if isinstance(name, str) else None
        except RegistryError as exc:
            raise _file_error(name, str(exc)) from None
        if config_class is None:
            known = ", ".join(DEVICE_TYPES.names())
            raise _file_error(obj if name is None else name, f"a device file names its type (one of: {known})")
        try:
            return cls.model_construct(config_class.model_validate(obj, *args, **kwargs))
        except ValidationError as err:
            # each ErrorDetails also carries msg, which from_exception_data does not read
            errors = cast(list[InitErrorDetails], [{**e, "loc": (name, *e["loc"])} for e in err.errors(include_url=False)])
            raise ValidationError.from_exception_data(cls.__name__, errors) from None


def _file_error(got: Any, message: str) -> ValidationError:
    """A ValidationError at key ``type`` (so the one line names the file and the key)."""
    error = PydanticCustomError("device_type", message.replace("{", "{{").replace("}", "}}"))
    return ValidationError.from_exception_data("DeviceFile", [{"type": error, "loc": ("type",), "input": got}])


def parse_device_config(data: dict[str, Any], *, source: str) -> DeviceConfig:
    data = {k: v for k, v in data.items() if k != "kind"}
    return config_io.validate(DeviceFile, data, source=source).root


def load_device_config(path: str | Path) -> DeviceConfig:
    """Load a device YAML; a bare name (e.g. 'gamepad') means devices/<name>.yaml on the config search path."""
    path = Path(path)
    if not path.suffix and not path.exists():
        path = config_io.config_path("devices", str(path))
    return parse_device_config(config_io.read_yaml(path), source=str(path))


def operator_config(type_name: str) -> DeviceConfig | None:
    """The config whose words the app shows for a device of ``type_name``: devices/<type_name>.yaml on the search
    path, else the type's defaults; None for a name that is no device type (an expert, no operator) or a type
    with neither."""
    if type_name not in DEVICE_TYPES:
        return None
    try:
        return load_device_config(type_name)
    except ConfigError:
        pass
    try:
        # the type's defaults: validated from no keys (a type's config class may require some)
        return DEVICE_TYPES.get(type_name).config.model_validate({})
    except ValidationError:  # a type whose config has required keys, and no file of that name
        return None


DEVICE_TYPES.register("gamepad", DeviceType(GamepadConfig, "hg_dagger.devices.gamepad:Gamepad",
                                            description="a game controller through SDL (pygame)"))
DEVICE_TYPES.register("spacemouse", DeviceType(SpaceMouseConfig, "hg_dagger.devices.spacemouse:SpaceMouse",
                                               description="a 3Dconnexion 6-DoF mouse through hidapi"))
DEVICE_TYPES.register("keyboard", DeviceType(KeyboardConfig, "hg_dagger.devices.keyboard:Keyboard",
                                             description="the app window's keyboard, fed key presses by name"))
DEVICE_TYPES.register("synthetic", DeviceType(SyntheticConfig, "hg_dagger.devices.synthetic:SyntheticOperator",
                                              description="a simulated person driven by a planner's commands"))


__all__ = [
    "DEVICE_TYPES", "AxisSource", "DeviceConfig", "DeviceFile", "DeviceType", "FrameConfig", "GamepadConfig",
    "GamepadMap", "HoldConfig", "KeyboardConfig", "ProcessingConfig", "SpaceMouseConfig", "SyntheticConfig",
    "key_label", "key_labels", "load_device_config", "operator_config", "parse_device_config",
]
