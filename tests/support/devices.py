"""SDL's own virtual joysticks, the stand-in for a physical controller in the device tests.

SDL (the copy bundled with pygame) can attach a virtual joystick: it gets a GUID and a name, appears
in pygame.joystick, and SDL itself emits JOYDEVICEADDED / JOYAXISMOTION / JOYDEVICEREMOVED for it.
"""

from __future__ import annotations

import ctypes
import glob
import os

import pygame
import pytest

from hg_dagger.devices.gamepad import init_pygame_input


class _Desc(ctypes.Structure):
    """SDL_VirtualJoystickDesc (SDL >= 2.24)."""

    _fields_ = [
        ("version", ctypes.c_uint16), ("type", ctypes.c_uint16), ("naxes", ctypes.c_uint16),
        ("nbuttons", ctypes.c_uint16), ("nhats", ctypes.c_uint16), ("vendor_id", ctypes.c_uint16),
        ("product_id", ctypes.c_uint16), ("padding", ctypes.c_uint16), ("button_mask", ctypes.c_uint32),
        ("axis_mask", ctypes.c_uint32), ("name", ctypes.c_char_p), ("userdata", ctypes.c_void_p),
    ] + [(n, ctypes.c_void_p) for n in ("Update", "SetPlayerIndex", "Rumble", "RumbleTriggers", "SetLED", "SendEffect")]


def _sdl():
    libs = glob.glob(os.path.join(os.path.dirname(pygame.__file__), os.pardir, "pygame.libs", "libSDL2-2*"))
    if not libs:
        pytest.skip("pygame's bundled SDL library not found (virtual joystick unavailable)")
    sdl = ctypes.CDLL(libs[0])
    sdl.SDL_JoystickAttachVirtualEx.argtypes = [ctypes.POINTER(_Desc)]
    sdl.SDL_JoystickDetachVirtual.argtypes = [ctypes.c_int]
    sdl.SDL_JoystickFromInstanceID.restype = ctypes.c_void_p
    sdl.SDL_JoystickFromInstanceID.argtypes = [ctypes.c_int]
    sdl.SDL_JoystickSetVirtualAxis.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int16]
    sdl.SDL_JoystickSetVirtualButton.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint8]
    return sdl


class VirtualPads:
    """Attach/detach SDL virtual joysticks (the stand-in for a physical controller)."""

    def __init__(self):
        init_pygame_input()
        self.sdl = _sdl()
        self.held = []

    def attach(self, name="Xbox 360 Controller", vendor=0x045E, product=0x028E, axes=6, buttons=11, hats=1) -> int:
        """A generic SDL joystick with the Linux XInput layout: triggers (axes 2 and 5) rest at -1."""
        desc = _Desc(version=1, type=0, naxes=axes, nbuttons=buttons, nhats=hats, vendor_id=vendor,
                     product_id=product, name=name.encode())
        index = self.sdl.SDL_JoystickAttachVirtualEx(ctypes.byref(desc))
        assert index >= 0, "SDL refused to attach a virtual joystick"
        joy = pygame.joystick.Joystick(index)
        self.held.append(joy)  # keeps SDL's device open, so the values set below persist
        for trigger in (2, 5):
            if trigger < axes:
                self.set_axis(joy.get_instance_id(), trigger, -32768)
        pygame.event.pump()
        return index

    def detach_all(self) -> None:
        self.held.clear()
        for index in reversed(range(pygame.joystick.get_count())):
            self.sdl.SDL_JoystickDetachVirtual(index)
        pygame.event.pump()

    def set_axis(self, instance_id: int, axis: int, value: int) -> None:
        self.sdl.SDL_JoystickSetVirtualAxis(self.sdl.SDL_JoystickFromInstanceID(instance_id), axis, value)

    def set_button(self, instance_id: int, button: int, down: bool) -> None:
        self.sdl.SDL_JoystickSetVirtualButton(self.sdl.SDL_JoystickFromInstanceID(instance_id), button, int(down))
