"""Driving the operator app in tests: wait for a snapshot of the control process, close the window."""

from __future__ import annotations

WAIT_MS = 180_000  # generous: the control process and training share a loaded 2-core machine


def wait_snap(qtbot, op, predicate, timeout=WAIT_MS):
    """Wait (processing Qt events) until the newest snapshot satisfies ``predicate``; return it."""
    box = {}

    def check():
        snap = op.loop.slot.read()
        assert snap.phase != "error", snap.message
        assert predicate(snap)
        box["snap"] = snap

    qtbot.waitUntil(check, timeout=timeout)
    return box["snap"]


def close_app(qtbot, op):
    """Close the main window and return the app's exit code."""
    codes = []
    op.finished.connect(codes.append)
    op.window.close()
    qtbot.waitUntil(lambda: bool(codes), timeout=60_000)
    return codes[0]
