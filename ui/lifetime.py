"""How the app's windows end: on Ctrl+C or SIGTERM as on their close button, and before the interpreter does.

Qt's event loop runs in C++, where Python's signal handlers never get a turn: without a timer that wakes the
interpreter, a Ctrl+C in the terminal does nothing until the next GUI event. The first signal closes the windows
(the operator app then ends its open episodes and stops its control process as on a normal quit); a second one,
for a close that hangs, ends the process at once. Stores stay readable either way (they are crash-safe).

A main window closed while episodes ran and left to the interpreter's exit made PyQt's exit cleanup crash in most
runs (a segmentation fault after the run's summary); delete_now() deletes it while Qt is still whole.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from PyQt6 import QtCore, QtWidgets

WAKE_MS = 200  # how late a signal may be seen; the timer costs nothing measurable
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def close_on_signals(app: QtWidgets.QApplication, close: Callable[[], None] | None = None) -> Iterator[None]:
    """Handlers for the length of the block (run ``app.exec()`` in it); the previous ones come back after it.
    ``close`` defaults to closing every window. Outside the main thread (where Python allows no handlers) it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    close = close or QtWidgets.QApplication.closeAllWindows

    def on_signal(signum: int, _frame: object) -> None:
        print(f"hg-dagger: {signal.Signals(signum).name}: closing (press Ctrl+C again to stop at once)",
              file=sys.stderr, flush=True)
        for s in SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        QtCore.QTimer.singleShot(0, close)  # not inside the handler: Qt may be in the middle of something

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    wake = QtCore.QTimer()  # owned here, not by app: PyQt's exit cleanup then never meets it
    wake.setInterval(WAKE_MS)
    wake.timeout.connect(lambda: None)
    wake.start()
    try:
        yield
    finally:
        wake.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def delete_now(widget: QtWidgets.QWidget | None) -> None:
    """Delete ``widget`` and its children now (after app.exec() has returned), not at interpreter exit."""
    if widget is None:
        return
    widget.deleteLater()
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete.value)
