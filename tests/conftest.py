"""Suite-wide settings: headless rendering, offscreen Qt, dummy SDL video/audio; shared fixtures."""

import os
import tempfile

import pytest

pytest_plugins = ["support.markers"]  # markers are facts: checked for every test

# never the user's config home (their configs would shadow the shipped ones; the app's settings, calibrations)
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="hg-dagger-tests-config-")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


@pytest.fixture
def pads(monkeypatch, tmp_path):
    """SDL virtual joysticks (tests/support/devices.py): none attached before or after the test, an empty
    pygame event queue, and calibrations saved under tmp_path, never in the user's folder."""
    import pygame
    from support.devices import VirtualPads

    monkeypatch.setenv("HG_DAGGER_CALIBRATION_DIR", str(tmp_path / "calibration"))
    v = VirtualPads()
    v.detach_all()
    pygame.event.clear()
    yield v
    v.detach_all()
    pygame.event.clear()


@pytest.fixture(scope="session")
def toy_student(tmp_path_factory):
    """A weak first student of toy_reach (3 planner demonstrations, 80 steps), as the app bootstraps one."""
    from hg_dagger.learn.rounds import bootstrap_student

    d = tmp_path_factory.mktemp("toy-student")
    res = bootstrap_student(task="toy_reach", store=str(d / "demos.zarr"), out_dir=str(d / "boot"), demos=3, steps=80,
                            report=lambda *_: None)
    return res["checkpoint"]


@pytest.fixture
def settings(tmp_path):
    """The app's settings in a file of the test's own, never the user's."""
    from hg_dagger.ui.settings import SettingsFile

    return SettingsFile(tmp_path / "app.yaml")
