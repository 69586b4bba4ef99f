"""Which operator devices are available now, as records an app can list and poll about once a second.

    scanner = DeviceScanner()
    devices = scanner.scan()              # [DeviceInfo]; the in-window keyboard always comes first
    added, removed = scanner.changes()    # scan again and compare with the previous scan

The event-queue rule: pygame's event queue is process-wide and a Gamepad's poll() drains every
joystick event from it. The scanner never takes an event a polling gamepad needs. SDL notices a
plug or unplug only while someone pumps its events: while a Gamepad of this process is connected its
own poll() pumps (so the scanner only reads SDL's device list); while none is, the scanner pumps
itself and discards the queued joystick events nobody will read (a press from minutes ago must not
act when a gamepad connects later). A gamepad that is connected but not polled (a paused control
loop) hides plugs and unplugs until polling resumes. A scan reads names from SDL's open joysticks
and asks hidapi for 3Dconnexion devices: well under a millisecond to a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from hg_dagger.devices.configs import DeviceConfig, GamepadConfig, SpaceMouseConfig, load_device_config


@dataclass(frozen=True)
class DeviceInfo:
    """One available device, and how to build it."""

    kind: str  # keyboard | gamepad | spacemouse
    name: str  # for people: the controller's name, the SpaceMouse model
    device_id: str  # what HumanCommand.device_id will say: "keyboard", "gamepad:<guid>", "spacemouse:<vid>:<pid>:<serial>"
    config: str  # the device config it is built from (a name in configs/devices, or a path)
    index: int | None = None  # SDL joystick index (gamepad); shifts when others are unplugged
    path: str = ""  # hidraw path (SpaceMouse)
    map: str = ""  # the gamepad axis map that would be used
    detail: str = ""  # axes/buttons/hats of a gamepad

    def device_config(self) -> DeviceConfig:
        """The config, pinned to this very device (a gamepad by GUID, a SpaceMouse by path)."""
        cfg = load_device_config(self.config)
        if self.kind == "gamepad":
            return cfg.model_copy(update={"guid": self.device_id.partition(":")[2], "index": None})
        if self.kind == "spacemouse":
            return cfg.model_copy(update={"path": self.path})
        return cfg

    def describe(self) -> str:
        """One line, as ``hg-dagger device list`` prints it."""
        if self.kind == "gamepad":
            return f"gamepad {self.index}: {self.name!r} guid {self.device_id[8:]} - {self.detail} - map {self.map}"
        if self.kind == "spacemouse":
            return f"spacemouse: {self.name} {self.device_id[11:]} at {self.path}"
        return f"{self.kind}: {self.name}"


KEYBOARD = DeviceInfo(kind="keyboard", name="in-window keyboard", device_id="keyboard", config="keyboard")


@dataclass
class DeviceScanner:
    """Lists the keyboard, SDL's joysticks and hidapi's SpaceMice; cheap enough to call once a second."""

    gamepad_config: str | Path = "gamepad"
    spacemouse_config: str | Path = "spacemouse"
    gamepads: bool = True
    spacemice: bool = True
    devices: list[DeviceInfo] = field(default_factory=list)  # the last scan
    problems: list[str] = field(default_factory=list)  # why a kind could not be listed in the last scan

    def __post_init__(self) -> None:
        self._pad_cfg: GamepadConfig | None = None
        self._mouse_cfg: SpaceMouseConfig | None = None

    def scan(self) -> list[DeviceInfo]:
        problems: list[str] = []
        found = [KEYBOARD]
        if self.gamepads:
            found += self._scan_gamepads()
        if self.spacemice:
            found += self._scan_spacemice(problems)
        self.devices, self.problems = found, problems
        return found

    def changes(self) -> tuple[list[DeviceInfo], list[DeviceInfo]]:
        """Scan, and return (added, removed) since the previous scan, by device_id and index/path."""
        before = {(d.device_id, d.index, d.path): d for d in self.devices}
        after = {(d.device_id, d.index, d.path): d for d in self.scan()}
        return [d for k, d in after.items() if k not in before], [d for k, d in before.items() if k not in after]

    def _scan_gamepads(self) -> list[DeviceInfo]:
        # deferred: devices.gamepad imports pygame; importing this module stays free of it
        from hg_dagger.devices.gamepad import (
            JOY_EVENTS,
            SDL_LOCK,
            gamepad_polled,
            init_pygame_input,
            pygame,
            select_map,
        )

        if self._pad_cfg is None:
            # the gamepad file names type gamepad (a file of another type fails at cfg.maps, as untyped)
            self._pad_cfg = cast(GamepadConfig, load_device_config(self.gamepad_config))
        cfg = self._pad_cfg
        out = []
        with SDL_LOCK:
            init_pygame_input()
            if not gamepad_polled():
                pygame.event.pump()  # lets SDL see plugs and unplugs
                pygame.event.get(eventtype=JOY_EVENTS)
            count = pygame.joystick.get_count()
            for i in range(count):
                j = pygame.joystick.Joystick(i)
                guid, name = j.get_guid(), j.get_name()
                out.append(DeviceInfo(
                    kind="gamepad", name=name, device_id=f"gamepad:{guid}", config=str(self.gamepad_config), index=i,
                    map=select_map(cfg.maps, cfg.default_map, guid=guid, name=name),
                    detail=f"{j.get_numaxes()} axes, {j.get_numbuttons()} buttons, {j.get_numhats()} hats",
                ))
        return out

    def _scan_spacemice(self, problems: list[str]) -> list[DeviceInfo]:
        try:
            from hg_dagger.devices.spacemouse import KNOWN_PRODUCTS, find_spacemice
        except ImportError as exc:  # hidapi not installed
            problems.append(f"spacemouse: hidapi is not available ({exc})")
            return []
        if self._mouse_cfg is None:
            # the SpaceMouse file names type spacemouse (a file of another type fails at cfg.vendor_ids)
            self._mouse_cfg = cast(SpaceMouseConfig, load_device_config(self.spacemouse_config))
        cfg = self._mouse_cfg
        try:
            infos = find_spacemice(cfg.vendor_ids, cfg.product_ids)
        except (OSError, ImportError) as exc:  # hidapi without access to the HID subsystem
            problems.append(f"spacemouse: hidapi could not enumerate devices ({exc})")
            return []
        out = []
        for info in infos:
            vid, pid = info["vendor_id"], info["product_id"]
            out.append(DeviceInfo(
                kind="spacemouse", name=KNOWN_PRODUCTS.get((vid, pid), "3Dconnexion device"),
                device_id=f"spacemouse:{vid:04x}:{pid:04x}:{info.get('serial_number') or ''}",
                config=str(self.spacemouse_config), path=info["path"].decode(errors="replace"),
            ))
        return out
