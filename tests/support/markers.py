"""Markers are facts: a test that starts a process, builds MuJoCo physics, starts Ray or builds Qt widgets without
its marker fails, so the fast tier (`make test-fast`, which deselects them) stays fast and means what it says.

A test asking for pytest-qt's ``qtbot`` without ``app`` fails collection; the rest is checked while the test runs
(child processes and MuJoCo data are refused at their constructor, Ray and a Qt application are looked for when the
test ends)."""

from __future__ import annotations

import multiprocessing.process
import subprocess
import sys

import pytest

WHAT = {
    "subprocess": "starts a child process",
    "simulation": "builds MuJoCo physics",
    "ray": "starts Ray",
    "app": "builds a Qt application",
}


class MarkerMissing(AssertionError):
    """A test did what one of the suite's markers declares without carrying that marker."""


def _message(node_id: str, marker: str) -> str:
    return f"{node_id} {WHAT[marker]} without @pytest.mark.{marker} (tests/support/markers.py)"


def pytest_collection_modifyitems(config, items) -> None:
    unmarked = [item.nodeid for item in items
                if "qtbot" in getattr(item, "fixturenames", ()) and item.get_closest_marker("app") is None]
    if unmarked:
        raise pytest.UsageError("\n".join(_message(node_id, "app") for node_id in unmarked))


# libraries that start a short-lived helper process to look something up about the machine, once per process
# (ctypes' library search runs ldconfig or gcc, platform runs `uname`/`file`, glfw's loader asks a child Python for
# the library's version when gymnasium's MuJoCo envs are first imported): not a process the test starts
PROBES = ("ctypes.util", "platform", "glfw.library")


def _from_probe() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") in PROBES:
            return True
        frame = frame.f_back
    return False


def _refuse(node_id: str, marker: str, original=None):
    def refuse(*args, **kwargs):
        if original is not None and _from_probe():
            return original(*args, **kwargs)
        raise MarkerMissing(_message(node_id, marker))

    return refuse


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _qt_application() -> object | None:
    widgets = sys.modules.get("PyQt6.QtWidgets")
    return None if widgets is None else widgets.QApplication.instance()


@pytest.fixture(autouse=True)
def _markers_are_facts(request, monkeypatch):
    node = request.node
    missing = {m for m in WHAT if node.get_closest_marker(m) is None}
    if "subprocess" in missing and "ray" in missing:  # a Ray runtime is processes: `ray` says so already
        monkeypatch.setattr(subprocess.Popen, "__init__", _refuse(node.nodeid, "subprocess", subprocess.Popen.__init__))
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse(node.nodeid, "subprocess"))
    mujoco = sys.modules.get("mujoco")
    if "simulation" in missing and mujoco is not None:
        monkeypatch.setattr(mujoco.MjData, "__init__", _refuse(node.nodeid, "simulation"))
    ray_before, qt_before = _ray_running(), _qt_application()
    yield
    if "ray" in missing and _ray_running() and not ray_before:
        raise MarkerMissing(_message(node.nodeid, "ray"))
    if "app" in missing and qt_before is None and _qt_application() is not None:
        raise MarkerMissing(_message(node.nodeid, "app"))


def pytest_sessionstart(session) -> None:
    """MuJoCo is imported up front (where installed), so the constructor above is guarded from the first test on."""
    try:
        import mujoco  # noqa: F401 - imported for its MjData, guarded per test
    except ImportError:
        pass
