"""The GUI side of the live seam: read the newest Snapshot on a QTimer and hand it to the views.

Reading a ``LatestSlot`` never blocks, so the timer never waits on the control thread. A snapshot is
handed on only when it is a new object, so an idle loop costs one comparison per tick.
"""

from __future__ import annotations

from PyQt6.QtCore import QObject, QTimer, pyqtSignal

from hg_dagger.control.live import LatestSlot, Snapshot


class SnapshotReader(QObject):
    """Emits ``snapshot(Snapshot)`` whenever the slot holds a newer snapshot than the last one emitted."""

    snapshot = pyqtSignal(object)

    def __init__(self, slot: LatestSlot, *, hz: float = 30.0, parent: QObject | None = None):
        super().__init__(parent)
        if not 1.0 <= hz <= 240.0:
            raise ValueError(f"refresh rate {hz} Hz is outside 1..240 Hz")
        self.slot = slot
        self._last: Snapshot | None = None
        self.timer = QTimer(self)
        self.timer.setInterval(max(1, round(1000.0 / hz)))
        self.timer.timeout.connect(self.poll)

    def start(self) -> None:
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    @property
    def last(self) -> Snapshot | None:
        return self._last

    def poll(self) -> None:
        snap = self.slot.read()
        if snap is not self._last:
            self._last = snap
            self.snapshot.emit(snap)
