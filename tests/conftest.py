"""Suite-wide settings: headless rendering, offscreen Qt, dummy SDL video/audio; shared fixtures."""

import os

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


@pytest.fixture
def pads(monkeypatch, tmp_path):
    """SDL virtual joysticks (tests/device_helpers.py): none attached before or after the test, an empty
    pygame event queue, and calibrations saved under tmp_path, never in the user's folder."""
    import pygame
    from device_helpers import VirtualPads

    monkeypatch.setenv("HG_DAGGER_CALIBRATION_DIR", str(tmp_path / "calibration"))
    v = VirtualPads()
    v.detach_all()
    pygame.event.clear()
    yield v
    v.detach_all()
    pygame.event.clear()
