"""Live plots of the watched row: gate score against its thresholds, task progress, and each action dim.

Each plot keeps a ring buffer keyed by ``snap.seq`` (a snapshot is added once, however often the timer
sees it) and redraws by ``setData`` on curves made once; nothing new is created per frame.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import Qt
from PyQt6.QtWidgets import QSizePolicy, QSplitter, QVBoxLayout, QWidget

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.live import Snapshot
from hg_dagger.ui import style

WINDOW_S = 10.0
CAPACITY = 2048


class History:
    """A fixed-size ring of (time, values) rows; ``add`` ignores a seq it has already seen."""

    def __init__(self, width: int, capacity: int = CAPACITY):
        self.capacity = capacity
        self._reset(width)

    def _reset(self, width: int) -> None:
        self.width = width
        self.t = np.zeros(self.capacity, np.int64)
        self.v = np.full((self.capacity, width), np.nan, np.float32)
        self.n = 0
        self.head = 0
        self.last_seq: int | None = None

    def clear(self) -> None:
        self._reset(self.width)

    def __len__(self) -> int:
        return self.n

    def add(self, seq: int, t_ns: int, values: Sequence[float] | np.ndarray) -> bool:
        """Append one row unless ``seq`` was already added; a seq going back (a new run) starts afresh.

        Seq 0 is the slot's placeholder before the first tick and is never added."""
        if seq <= 0:
            return False
        if self.last_seq is not None:
            if seq == self.last_seq:
                return False
            if seq < self.last_seq:
                self.clear()
        row = np.asarray(values, np.float32).reshape(-1)
        if row.shape[0] != self.width:
            self._reset(row.shape[0])
        self.t[self.head] = t_ns
        self.v[self.head] = row
        self.head = (self.head + 1) % self.capacity
        self.n = min(self.n + 1, self.capacity)
        self.last_seq = seq
        return True

    def window(self, seconds: float = WINDOW_S) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the last ``seconds`` in time order: x in seconds relative to the newest (<= 0), values."""
        if self.n == 0:
            return np.zeros(0, np.float64), np.zeros((0, self.width), np.float32)
        start = (self.head - self.n) % self.capacity
        idx = (start + np.arange(self.n)) % self.capacity
        t = self.t[idx]
        x = (t - t[-1]) / 1e9
        keep = x >= -seconds
        return x[keep], self.v[idx][keep]


def _snap_time(snap: Snapshot) -> int:
    return snap.t_ns if snap.t_ns > 0 else now_ns()


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _plot_widget(title: str) -> pg.PlotWidget:
    w = pg.PlotWidget(background="w")
    w.setTitle(title, color="#222", size="11pt")
    w.showGrid(x=True, y=True, alpha=0.25)
    w.setXRange(-WINDOW_S, 0, padding=0)
    w.setMouseEnabled(x=False, y=True)
    w.setMenuEnabled(False)
    w.setLabel("bottom", "s")
    w.setMinimumHeight(90)
    return w


class GatePlot(QWidget):
    """The confidence gate's score (ensemble uncertainty) and the policy's confidence over the last ~10 s,
    with the gate's warn and trigger thresholds as labelled horizontal lines."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = History(2)
        self.plot = _plot_widget("Gate: uncertainty vs thresholds")
        self.plot.addLegend(offset=(8, 8))
        self.uncertainty = self.plot.plot(pen=pg.mkPen(style.POLICY, width=2), name="uncertainty")
        self.confidence = self.plot.plot(
            pen=pg.mkPen(style.POLICY, width=1, style=Qt.PenStyle.DashLine), name="confidence")
        self.lines: dict[str, pg.InfiniteLine] = {}
        for key, colour in (("warn", style.WARNING), ("trigger", style.SAFETY)):
            line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(colour, width=2, style=Qt.PenStyle.DashLine),
                                   label=key, labelOpts={"position": 0.08, "color": colour, "anchors": [(0, 1), (0, 1)]})
            line.setVisible(False)
            self.plot.addItem(line, ignoreBounds=True)
            self.lines[key] = line
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)

    def show_snapshot(self, snap: Snapshot) -> None:
        self.set_thresholds(snap.thresholds)
        if self.history.add(snap.seq, _snap_time(snap), (snap.uncertainty, snap.confidence)):
            x, v = self.history.window()
            self.uncertainty.setData(x, v[:, 0], connect="finite")
            self.confidence.setData(x, v[:, 1], connect="finite")

    def set_thresholds(self, thresholds: dict) -> None:
        for key, line in self.lines.items():
            value = _number((thresholds or {}).get(key))
            if value is None:
                line.setVisible(False)
                continue
            if line.value() != value or not line.isVisible():
                line.setValue(value)
                line.label.setFormat(f"{key} {value:.3g}")
                line.setVisible(True)


class ProgressPlot(QWidget):
    """Task progress (0..1 where the task reports it) over the last ~10 s."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = History(1)
        self.plot = _plot_widget("Task progress")
        self.plot.setYRange(0, 1.05, padding=0)
        self.curve = self.plot.plot(pen=pg.mkPen(style.AUTONOMOUS, width=2), name="progress")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)

    def show_snapshot(self, snap: Snapshot) -> None:
        if self.history.add(snap.seq, _snap_time(snap), (snap.progress,)):
            x, v = self.history.window()
            self.curve.setData(x, v[:, 0], connect="finite")


def _vec(a: np.ndarray | None, n: int) -> np.ndarray:
    if a is None:
        return np.full(n, np.nan, np.float32)
    a = np.asarray(a, np.float32).reshape(-1)
    if a.shape[0] != n:
        out = np.full(n, np.nan, np.float32)
        out[: min(n, a.shape[0])] = a[:n]
        return out
    return a


class ActionPlots(QWidget):
    """One small plot per action dim (titled by ``snap.action_names``) with the policy (blue), human
    (orange, gaps where there is no human command) and applied (dark) action."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = History(0)
        self.names: tuple[str, ...] = ()
        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.setBackground("w")
        self.layout_widget.setMinimumHeight(100)
        self.plots: list[pg.PlotItem] = []
        self.curves: list[dict[str, pg.PlotDataItem]] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.layout_widget)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def _build(self, names: tuple[str, ...]) -> None:

        self.layout_widget.clear()
        self.plots, self.curves = [], []
        self.names = names
        cols = 2 if len(names) > 3 else 1
        for i, name in enumerate(names):
            p = self.layout_widget.addPlot(row=i // cols, col=i % cols, title=name)
            p.showGrid(x=True, y=True, alpha=0.25)
            p.setXRange(-WINDOW_S, 0, padding=0)
            p.setMouseEnabled(x=False, y=True)
            p.setMenuEnabled(False)
            if i == 0:
                p.addLegend(offset=(4, 4))
            self.plots.append(p)
            self.curves.append({
                "policy": p.plot(pen=pg.mkPen(style.POLICY, width=2), name="policy"),
                "human": p.plot(pen=pg.mkPen(style.HUMAN, width=2), name="human"),
                "applied": p.plot(pen=pg.mkPen(style.APPLIED, width=1, style=Qt.PenStyle.DashLine), name="applied"),
            })

    def show_snapshot(self, snap: Snapshot) -> None:
        n = len(snap.action_names)
        if n == 0:
            for a in (snap.applied_action, snap.policy_action, snap.human_action):
                if a is not None:
                    n = int(np.asarray(a).size)
                    break
        names = tuple(snap.action_names) or tuple(f"a{i}" for i in range(n))
        if names != self.names:
            self._build(names)
            self.history = History(3 * n)
        if n == 0:
            return
        row = np.concatenate([_vec(snap.policy_action, n), _vec(snap.human_action, n), _vec(snap.applied_action, n)])
        if self.history.add(snap.seq, _snap_time(snap), row):
            x, v = self.history.window()
            for i, curves in enumerate(self.curves):
                curves["policy"].setData(x, v[:, i], connect="finite")
                curves["human"].setData(x, v[:, n + i], connect="finite")
                curves["applied"].setData(x, v[:, 2 * n + i], connect="finite")


class PlotsPanel(QSplitter):
    """The three plot groups stacked; splitter handles let the operator give the actions more room."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Vertical, parent)
        self.setObjectName("plots_splitter")
        self.gate = GatePlot()
        self.progress = ProgressPlot()
        self.actions = ActionPlots()
        for w in (self.gate, self.progress, self.actions):
            self.addWidget(w)
        self.setStretchFactor(2, 2)

    def show_snapshot(self, snap: Snapshot) -> None:
        self.gate.show_snapshot(snap)
        self.progress.show_snapshot(snap)
        self.actions.show_snapshot(snap)
