"""Ctrl+C and SIGTERM close the windows inside close_on_signals, and the previous handlers come back after it."""

from __future__ import annotations

import os
import signal

import pytest
from PyQt6 import QtCore, QtWidgets

from hg_dagger.ui.lifetime import close_on_signals

pytestmark = [pytest.mark.app]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_closes_the_windows_and_the_old_handlers_return(qtbot, capfd, signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    window = QtWidgets.QWidget()
    qtbot.addWidget(window)
    window.show()
    app = QtWidgets.QApplication.instance()
    with close_on_signals(app):
        QtCore.QTimer.singleShot(50, lambda: os.kill(os.getpid(), signum))
        qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)
        assert signal.getsignal(signum) == signal.SIG_DFL, "a second Ctrl+C stops a close that hangs"
    assert {s: signal.getsignal(s) for s in before} == before
    assert f"{signal.Signals(signum).name}: closing" in capfd.readouterr().err


def test_a_custom_close_is_called_instead(qtbot):
    closed = []
    with close_on_signals(QtWidgets.QApplication.instance(), close=lambda: closed.append(True)):
        os.kill(os.getpid(), signal.SIGINT)
        qtbot.waitUntil(lambda: closed == [True], timeout=5000)
