"""Device configs (pydantic): one class per device ``type``, validated from YAML (``kind: device``).

Kept free of hardware imports so configs can be checked anywhere (``hg-dagger config check``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, RootModel, field_validator, model_validator

from hg_dagger import config as config_io
from hg_dagger.contract.command import COMMAND_AXES, ESTOP, GRIPPER, RETURN, TAKEOVER
from hg_dagger.contract.model import StrictModel
from hg_dagger.devices.processing import FrameConfig, HoldConfig, ProcessingConfig

ButtonName = Literal["takeover", "return", "estop", "gripper"]
AxisName = Literal["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
assert set(ButtonName.__args__) == {TAKEOVER, RETURN, ESTOP, GRIPPER}  # the contract's names
assert AxisName.__args__ == COMMAND_AXES


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
    def _one_or_more(cls, v):
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


# ---- synthetic operator ------------------------------------------------------------------------


class SyntheticConfig(DeviceConfig):
    type: Literal["synthetic"] = "synthetic"
    reaction_delay_steps: int = Field(5, ge=0)  # ticks from the handover request to the first correction
    noise_std: float = Field(0.0, ge=0.0)  # Gaussian noise on the 6 motion axes (not the gripper)
    availability: float = Field(1.0, ge=0.0, le=1.0)  # probability the person answers a given request
    seed: int = 0
    return_after_steps: int | None = Field(None, ge=1)  # hold RETURN from the Nth engaged tick on


AnyDeviceConfig = Annotated[
    Union[GamepadConfig, SpaceMouseConfig, KeyboardConfig, SyntheticConfig],  # noqa: UP007
    Field(discriminator="type"),
]


class DeviceFile(RootModel[AnyDeviceConfig]):
    """A device config file (``kind: device``): any device config, told apart by ``type``."""


def parse_device_config(data: dict, *, source: str) -> DeviceConfig:
    data = {k: v for k, v in data.items() if k != "kind"}
    return config_io.validate(DeviceFile, data, source=source).root


def load_device_config(path: str | Path) -> DeviceConfig:
    """Load a device YAML; a bare name (e.g. 'gamepad') means devices/<name>.yaml on the config search path."""
    path = Path(path)
    if not path.suffix and not path.exists():
        path = config_io.config_path("devices", str(path))
    return parse_device_config(config_io.read_yaml(path), source=str(path))


__all__ = [
    "AnyDeviceConfig", "AxisSource", "DeviceConfig", "DeviceFile", "FrameConfig", "GamepadConfig", "GamepadMap",
    "HoldConfig", "KeyboardConfig", "ProcessingConfig", "SpaceMouseConfig", "SyntheticConfig",
    "load_device_config", "parse_device_config",
]
