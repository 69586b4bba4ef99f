"""DeviceScanner with SDL virtual joysticks plugged and unplugged, and `device list` in a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pygame
import pytest

from hg_dagger.contract.command import TAKEOVER
from hg_dagger.devices import load_device_config, make_device
from hg_dagger.devices.discovery import KEYBOARD, DeviceScanner
from hg_dagger.devices.gamepad import Gamepad

pytestmark = [pytest.mark.subprocess]


def scanner() -> DeviceScanner:
    return DeviceScanner(spacemice=False)  # hidapi sees this machine's real HID devices, if any


def test_keyboard_is_always_listed_and_pads_come_and_go(pads, tmp_path):
    s = scanner()
    assert s.scan() == [KEYBOARD]
    assert KEYBOARD.kind == "keyboard" and KEYBOARD.device_id == "keyboard" and KEYBOARD.config == "keyboard"

    pads.attach("Wireless Controller", 0x054C, 0x09CC, buttons=13)
    added, removed = s.changes()
    assert removed == [] and [d.kind for d in added] == ["gamepad"]
    pad = added[0]
    guid = pygame.joystick.Joystick(0).get_guid()
    assert pad.name == "Wireless Controller" and pad.device_id == f"gamepad:{guid}" and pad.index == 0
    assert pad.config == "gamepad" and pad.map == "playstation" and "13 buttons" in pad.detail

    pads.attach("Xbox 360 Controller")
    added, removed = s.changes()
    assert [(d.name, d.map, d.index) for d in added] == [("Xbox 360 Controller", "xbox", 1)] and removed == []
    assert [d.kind for d in s.devices] == ["keyboard", "gamepad", "gamepad"]

    pads.detach_all()
    added, removed = s.changes()
    assert added == [] and {d.name for d in removed} == {"Wireless Controller", "Xbox 360 Controller"}
    assert s.devices == [KEYBOARD]


def test_a_listed_pad_builds_the_device_pinned_to_it(pads, tmp_path):
    pads.attach("Xbox 360 Controller")
    pads.attach("Wireless Controller", 0x054C, 0x09CC, buttons=13)
    info = [d for d in scanner().scan() if d.name == "Wireless Controller"][0]
    cfg = info.device_config().model_copy(update={"calibration_dir": tmp_path})
    pad = make_device(cfg)
    pad.connect()
    assert isinstance(pad, Gamepad) and pad.device_id == info.device_id and pad.map_name == info.map
    assert make_device(KEYBOARD.device_config()).device_id == "keyboard"


def test_scanning_never_takes_events_from_a_polled_pad(pads, tmp_path):
    pads.attach()
    cfg = load_device_config("gamepad").model_copy(update={"calibration_dir": tmp_path})
    pad = make_device(cfg)
    pad.connect()
    pygame.event.clear()
    iid = pad._instance_id
    pads.set_button(iid, 0, True)  # takeover, pressed on the (virtual) device
    pygame.event.pump()  # SDL turns state changes into events when pumped
    pads.set_button(iid, 0, False)
    pads.set_axis(iid, 1, -32768)
    pygame.event.pump()
    s = scanner()
    for _ in range(3):  # the app polls about once a second, here between two ticks
        assert [d.kind for d in s.scan()] == ["keyboard", "gamepad"]
    cmd = pad.poll()
    assert cmd.buttons == {TAKEOVER} and cmd.raw[0] == pytest.approx(-1.0, abs=1e-3)


def test_presses_queued_while_no_pad_is_polled_are_dropped(pads, tmp_path):
    index = pads.attach()
    iid = pygame.joystick.Joystick(index).get_instance_id()
    pads.set_button(iid, 0, True)  # takeover pressed and released while nobody uses the pad
    pygame.event.pump()
    pads.set_button(iid, 0, False)
    pygame.event.pump()
    assert pygame.event.peek(pygame.JOYBUTTONDOWN)
    pad = make_device(load_device_config("gamepad").model_copy(update={"calibration_dir": tmp_path}))
    pad.connect()  # a press from before connect must not take over now
    assert TAKEOVER not in pad.poll().buttons

    pad.close()  # no pad polled: the scanner keeps the queue from filling with events nobody reads
    pads.set_button(iid, 0, True)
    pygame.event.pump()
    assert pygame.event.peek(pygame.JOYBUTTONDOWN)
    scanner().scan()
    assert not pygame.event.peek(pygame.JOYBUTTONDOWN)


def quiet_env() -> dict[str, str]:
    """The environment of a login without a desktop session: no XDG_RUNTIME_DIR, no SDL or pygame settings."""
    drop = ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER", "PYGAME_HIDE_SUPPORT_PROMPT", "DISPLAY",
            "WAYLAND_DISPLAY")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.parametrize("driver", [None, "wayland"])
def test_device_list_prints_no_banner_and_no_sdl_noise(driver):
    env = quiet_env()
    if driver:
        env["SDL_VIDEODRIVER"] = driver  # a desktop setting for other programs must not leak in
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "device", "list"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    both = r.stdout + r.stderr
    assert "pygame" not in both and "Hello from the pygame community" not in both
    assert "XDG_RUNTIME_DIR" not in both and r.stderr == ""
    assert r.stdout.strip()  # the answer itself is still printed
