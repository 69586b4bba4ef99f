"""Plays a human operator model (hg_dagger.control.human_model) into the real window as Qt key events.

    driver = ModelDriver(window, HumanOperatorModel(mapping, seed=3))
    driver.start()            # a QTimer in the GUI thread: read the newest Snapshot, play the keys due

Each key goes to the widget a person's keyboard would reach: the focused widget when it belongs to the
window (or to a dialog the window owns), the window otherwise; it passes the same application event
filters (the keyboard bridge) as a real key. The driver reads only ``window.slot`` and never calls into
the session or puts commands itself.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PyQt6.QtCore import QEvent, QObject, Qt, QTimer
from PyQt6.QtGui import QKeyEvent
from PyQt6.QtWidgets import QApplication, QWidget

from hg_dagger.control.human_model import DECLINE
from hg_dagger.ui.keymap import DECLINE_KEY
from hg_dagger.ui.keys import owned_by

if TYPE_CHECKING:
    from hg_dagger.ui.main_window import MainWindow

K = Qt.Key
_NAMED = {"space": K.Key_Space, "enter": K.Key_Return, "up": K.Key_Up, "down": K.Key_Down, "left": K.Key_Left,
          "right": K.Key_Right, "shift": K.Key_Shift, "tab": K.Key_Tab, "backspace": K.Key_Backspace,
          "escape": K.Key_Escape}


def qt_key(name: str) -> Qt.Key:
    """The Qt key for a keyboard device key name ('w', 'space', 'enter', ...)."""
    if len(name) == 1 and name.isalnum():
        return Qt.Key(ord(name.upper()))
    try:
        return _NAMED[name]
    except KeyError:
        raise ValueError(f"no Qt key for keyboard key {name!r}") from None


def _text(name: str) -> str:
    return " " if name == "space" else (name if len(name) == 1 else "")


class ModelDriver(QObject):
    """Ticks ``model`` from a QTimer (``period_ms``) and sends its key actions to ``window`` as key events."""

    def __init__(self, window: MainWindow, model, *, period_ms: int = 20, clock=time.monotonic):
        super().__init__(window)
        self.window = window
        self.model = model
        self.clock = clock
        self.played: list[tuple[float, str, bool, int]] = []  # (time, key, down, snapshot seq)
        self.timer = QTimer(self)
        self.timer.setInterval(period_ms)
        self.timer.timeout.connect(self.tick)

    def start(self) -> None:
        self.timer.start()

    def stop(self) -> None:
        """Stop ticking and let go of every key the model holds."""
        self.timer.stop()
        seq = self.window.slot.read().seq
        for a in self.model.release_all(self.clock()):
            self._send(a.key, a.down, seq)

    def tick(self) -> None:
        snap = self.window.slot.read()
        for a in self.model.step(snap, self.clock()):
            self._send(a.key, a.down, snap.seq)

    def _target(self) -> QWidget:
        w = QApplication.focusWidget()
        if w is not None and self._owned(w):
            return w
        modal = QApplication.activeModalWidget()
        if modal is not None and self._owned(modal):
            return modal
        return self.window

    def _owned(self, w: QWidget) -> bool:
        return owned_by(w, self.window)

    def _send(self, key: str, down: bool, seq: int) -> None:
        key = DECLINE_KEY if key == DECLINE else key
        kind = QEvent.Type.KeyPress if down else QEvent.Type.KeyRelease
        ev = QKeyEvent(kind, qt_key(key), Qt.KeyboardModifier.NoModifier, _text(key))
        QApplication.sendEvent(self._target(), ev)
        self.played.append((self.clock(), key, down, seq))
