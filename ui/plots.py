"""Live plots of the watched row: gate score against its thresholds, task progress, and each action dim.

Each plot keeps a ring buffer keyed by ``snap.seq`` (a snapshot is added once, however often the timer
sees it) and redraws by ``setData`` on curves made once; nothing new is created per frame.

Drawing is kept cheap because the window shares the CPU (and the interpreter lock) with the control
loop: x always spans the last ``WINDOW_S`` seconds, y ranges are fixed or grow to fit (a
``GrowingRange``, changed at most every ``RANGE_INTERVAL_S``) instead of auto-ranging every frame, and
the axes with their grid are cached as pixmaps, so a frame redraws the curves and little else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import QRectF, Qt, QTimer
from PyQt6.QtWidgets import QGraphicsItem, QLabel, QSizePolicy, QSplitter, QVBoxLayout, QWidget

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.live import Snapshot
from hg_dagger.ui import style

WINDOW_S = 10.0
ACTION_ROW_PX = 55  # the height one row of action plots needs to stay readable
CAPACITY = 2048
RANGE_INTERVAL_S = 0.5  # a growing y range changes at most this often (each change redraws its axis)
RANGE_MARGIN = 0.1  # share of the span added on each side when a range grows, so it rarely grows again


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
        return x[keep], self.v[idx[keep]]  # copy only the rows on show, not the whole ring


class GrowingRange:
    """A y range that grows to fit every value it is shown and never shrinks until ``reset``.

    Auto-ranging every frame redraws the axis (ticks, labels, grid) every frame; this range changes
    only when a value falls outside it, and then at most once per ``interval_s`` (a value that arrives
    sooner waits in ``pending`` until ``due_in`` says it may be applied). A growth adds ``margin`` of
    the new span on each side. ``include`` values (e.g. 0 for a score) are always inside.
    """

    def __init__(self, *, include: Iterable[float] = (), interval_s: float = RANGE_INTERVAL_S,
                 margin: float = RANGE_MARGIN, clock: Callable[[], int] = now_ns):
        self.include = tuple(float(v) for v in include)
        self.interval_ns = int(interval_s * 1e9)
        self.margin = margin
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        """Forget the range (a new episode): the next values set it afresh, at once."""
        self.lo: float | None = None
        self.hi: float | None = None
        self._want: tuple[float, float] | None = None
        self._changed_ns: int | None = None

    @property
    def range(self) -> tuple[float, float] | None:
        return None if self.lo is None or self.hi is None else (self.lo, self.hi)  # set together

    @property
    def pending(self) -> bool:
        """Values outside the range are waiting for the interval to pass."""
        return self._want is not None

    def add(self, values: np.ndarray | Sequence[float]) -> None:
        """Note values to fit (non-finite ones are ignored)."""
        v = np.asarray(values, np.float64).reshape(-1)
        v = v[np.isfinite(v)]
        if v.size == 0:
            return
        lo, hi = float(v.min()), float(v.max())
        if self.lo is not None and self.hi is not None and lo >= self.lo and hi <= self.hi:  # set together
            return
        if self._want is not None:
            lo, hi = min(lo, self._want[0]), max(hi, self._want[1])
        self._want = (lo, hi)

    def due_in(self) -> float:
        """Seconds until a pending growth may be applied (0 when it may be now)."""
        if self._want is None or self._changed_ns is None:
            return 0.0
        return max(0.0, (self._changed_ns + self.interval_ns - self.clock()) / 1e9)

    def apply(self) -> tuple[float, float] | None:
        """The new (lo, hi) when the range grew now; None when it did not (nothing new, or too soon)."""
        if self._want is None or self.due_in() > 0:
            return None
        lo, hi = self._want
        self._want = None
        lo, hi = min((lo, *self.include)), max((hi, *self.include))
        if self.lo is not None and self.hi is not None:  # set together
            lo, hi = min(lo, self.lo), max(hi, self.hi)
        span = hi - lo
        scale = max(abs(lo), abs(hi))
        # a flat or nearly flat line gets a span of its own scale, so noise in the 6th digit is not magnified
        pad = self.margin * span if span > 0.1 * scale else max(0.5 * scale, 1e-3)
        # grow only the sides that need it: a side already covering the data stays where it is
        new_lo = self.lo if self.lo is not None and lo >= self.lo else lo - pad
        new_hi = self.hi if self.hi is not None and hi <= self.hi else hi + pad
        self.lo, self.hi = new_lo, new_hi
        self._changed_ns = self.clock()
        return self.lo, self.hi


def _snap_time(snap: Snapshot) -> int:
    return snap.t_ns if snap.t_ns > 0 else now_ns()


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class Axis(pg.AxisItem):
    """An axis whose bounding rect (its own box joined with the view its grid spans) is kept until the
    axis or the view moves or resizes; Qt asks for it several times per axis per frame."""

    _br_key = None

    def boundingRect(self):
        view = self.linkedView()
        key = (self.geometry(), None if view is None else view.geometry(), self.grid)
        if key != self._br_key:
            self._br_key, self._br = key, super().boundingRect()
        return self._br


def _axes() -> dict[str, Axis]:
    return {"left": Axis("left"), "bottom": Axis("bottom")}


def _setup_plot(p: pg.PlotItem) -> None:
    """Grid, a fixed x window and no auto-range; axes (which draw the grid) cached as pixmaps, so a new
    curve does not replay every tick label and grid line."""
    p.showGrid(x=True, y=True, alpha=0.25)
    p.setXRange(-WINDOW_S, 0, padding=0)
    p.enableAutoRange(enable=False)
    p.setMouseEnabled(x=False, y=True)
    p.setMenuEnabled(False)
    p.hideButtons()  # no "auto-range" corner button: one click would bring back auto-ranging every frame
    for name in ("left", "bottom"):
        p.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)


class Curve(pg.PlotCurveItem):
    """A curve cheap to bound: its data bounds take one plain pass over the data (pyqtgraph's general
    version costs several NaN-aware reductions and a warnings context per call, for every curve every
    frame), and its bounding rect is the visible view (the ViewBox clips to it anyway) instead of one
    recomputed in data and pixel units at every new point."""

    def boundingRect(self):
        if self.xData is None or len(self.xData) == 0:
            return QRectF()
        vb = self.getViewBox()  # the curve sits in the ViewBox's data coordinates
        return vb.viewRect() if isinstance(vb, pg.ViewBox) else super().boundingRect()

    def show_data(self, x: np.ndarray, y: np.ndarray, *, sparse: bool = False) -> None:
        """``setData``; a ``sparse`` curve (the human command: NaN while nobody corrects) with nothing to
        draw is emptied once and then left alone, instead of being rebuilt and painted every frame."""
        if sparse and not np.isfinite(y).any():
            if self.xData is not None and len(self.xData):
                self.setData(x=np.zeros(0), y=np.zeros(0))
            return
        self.setData(x=x, y=y)

    def dataBounds(self, ax, frac=1.0, orthoRange=None):  # noqa: N803 - pyqtgraph's signature
        if frac != 1.0 or orthoRange is not None:
            return super().dataBounds(ax, frac, orthoRange)
        d = self.xData if ax == 0 else self.yData
        if d is None or len(d) == 0:
            return None, None
        d = d[np.isfinite(d)]
        return (None, None) if d.size == 0 else (float(d.min()), float(d.max()))


def _curve(p: pg.PlotItem, colour: str, name: str, *, dashed: bool = False, width: int = 1) -> Curve:
    pen = pg.mkPen(colour, width=width, style=Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine)
    c = Curve(pen=pen, name=name, connect="finite")
    p.addItem(c)
    return c


PLOT_MIN_PX = 70  # a plot (title, axes and area) never gets less: below it the curves are unreadable

_DASH = {"solid": "&#9472;&#9472;", "dashed": "&#9472; &#9472;", "marker": "&#9679;"}


def legend_html(entries) -> str:
    """Each (name, colour, "solid"|"dashed"|"marker") in its colour, as rich text for a title or a label. A legend in a
    title is never clipped by a small plot nor drawn over the curves."""
    return " &nbsp; ".join(f"<span style='color:{c}'>{_DASH[kind]} {name}</span>" for name, c, kind in entries)


def legend_title(title: str, entries) -> str:
    """A live plot's title that is its legend: the title, the time it shows, then the entries (legend_html)."""
    return f"<b>{title}</b> <span style='color:#666'>(last {WINDOW_S:g} s)</span> &nbsp; " + legend_html(entries)


def _plot_widget(title: str) -> pg.PlotWidget:
    w = pg.PlotWidget(background="w", axisItems=_axes())
    w.setTitle(title, color="#222", size="10pt")
    _setup_plot(w.getPlotItem())
    w.setMinimumHeight(PLOT_MIN_PX)
    return w


class _RangeTimer:
    """Applies a widget's pending range growths when they fall due, even if no new snapshot comes."""

    def __init__(self, parent: QWidget, apply: Callable[[], None]):
        self.timer = QTimer(parent)
        self.timer.setSingleShot(True)
        self.timer.timeout.connect(apply)

    def schedule(self, ranges: Iterable[GrowingRange]) -> None:
        waits = [r.due_in() for r in ranges if r.pending]
        if waits and not self.timer.isActive():
            self.timer.start(max(1, math.ceil(min(waits) * 1000)))


class GatePlot(QWidget):
    """The confidence gate's score (ensemble uncertainty) and the policy's confidence over the last ~10 s,
    with the gate's warn and trigger thresholds as labelled horizontal lines. The y range starts at 0 and
    grows to fit the score, the confidence and the thresholds; it is refitted at each new episode."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = History(2)
        self.yrange = GrowingRange(include=(0.0,))
        self._episode: str | None = None
        self.plot = _plot_widget(legend_title("Gate", (("uncertainty", style.POLICY, "solid"),
                                                       ("confidence", style.POLICY, "dashed"),
                                                       ("warn", style.WARNING, "dashed"),
                                                       ("trigger", style.SAFETY, "dashed"))))
        item = self.plot.getPlotItem()
        self.uncertainty = _curve(item, style.POLICY, "uncertainty", width=2)
        self.confidence = _curve(item, style.POLICY, "confidence", dashed=True)
        self.lines: dict[str, pg.InfiniteLine] = {}
        # the two labels sit at places apart along x, so they never overprint even when the band between
        # the lines is thin, each on the side of its line toward the middle of the plot, so never clipped
        for key, colour, pos in (("warn", style.WARNING, 0.12), ("trigger", style.SAFETY, 0.55)):
            anchors = [(0, 0), (0, 1)]  # under the line in the upper half of the plot, over it in the lower
            line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(colour, width=2, style=Qt.PenStyle.DashLine),
                                   label=key, labelOpts={"position": pos, "color": colour, "anchors": anchors})
            line.setVisible(False)
            for item in (line, line.label):  # drawn over by the curves every frame: blit, not redraw
                item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            self.plot.addItem(line, ignoreBounds=True)
            self.lines[key] = line
        self._timer = _RangeTimer(self, self._apply_range)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)

    def show_snapshot(self, snap: Snapshot) -> None:
        self.set_thresholds(snap.thresholds)
        if self.history.add(snap.seq, _snap_time(snap), (snap.uncertainty, snap.confidence)):
            x, v = self.history.window()
            self.uncertainty.show_data(x, v[:, 0])
            self.confidence.show_data(x, v[:, 1])
            if snap.episode_id != self._episode or len(self.history) == 1:
                self._episode = snap.episode_id
                self.yrange.reset()
                self.yrange.add(v)  # refit to what is on show
            else:
                self.yrange.add(v[-1])
        self.yrange.add([line.value() for line in self.lines.values() if line.isVisible()])
        self._apply_range()

    def _apply_range(self) -> None:
        r = self.yrange.apply()
        if r is not None:
            self.plot.setYRange(*r, padding=0)
        self._timer.schedule((self.yrange,))

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
    """The task's progress signal over the last ~10 s (higher is better; its units are the task's, e.g.
    minus the object's distance to the goal in metres), in a range that grows to fit each episode."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = History(1)
        self.yrange = GrowingRange()
        self._episode: str | None = None
        self.plot = _plot_widget(legend_title("Task progress", (("progress (higher is better)", style.AUTONOMOUS,
                                                                  "solid"),)))
        self.curve = _curve(self.plot.getPlotItem(), style.AUTONOMOUS, "progress")
        self._timer = _RangeTimer(self, self._apply_range)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)

    def show_snapshot(self, snap: Snapshot) -> None:
        if not self.history.add(snap.seq, _snap_time(snap), (snap.progress,)):
            return
        x, v = self.history.window()
        self.curve.show_data(x, v[:, 0])
        if snap.episode_id != self._episode or len(self.history) == 1:
            self._episode = snap.episode_id
            self.yrange.reset()
            self.yrange.add(v)
        else:
            self.yrange.add(v[-1])
        self._apply_range()

    def _apply_range(self) -> None:
        r = self.yrange.apply()
        if r is not None:
            self.plot.setYRange(*r, padding=0)
        self._timer.schedule([self.yrange])


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
    (orange, gaps where there is no human command) and applied (dark) action. Each dim's y range grows
    to fit its actions (the raw action bounds are not in the snapshot) and is refitted per episode."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = History(0)
        self.names: tuple[str, ...] = ()
        self.legend = QLabel(legend_title("Actions", (("policy", style.POLICY, "solid"), ("you", style.HUMAN, "solid"),
                                                      ("applied", style.APPLIED, "dashed"))))
        self.legend.setObjectName("action_legend")
        self.legend.setStyleSheet("background: white; color: #222; padding: 2px 6px;")
        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.setBackground("w")
        self.layout_widget.setMinimumHeight(ACTION_ROW_PX)
        self.plots: list[pg.PlotItem] = []
        self.curves: list[dict[str, Curve]] = []
        self.yranges: list[GrowingRange] = []
        self._episode: str | None = None
        self._timer = _RangeTimer(self, self._apply_ranges)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.legend)
        lay.addWidget(self.layout_widget)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def _build(self, names: tuple[str, ...]) -> None:
        self.layout_widget.clear()
        self.plots, self.curves = [], []
        self.yranges = [GrowingRange() for _ in names]
        self.names = names
        cols = 2 if len(names) > 1 else 1
        for i, name in enumerate(names):
            p = self.layout_widget.addPlot(row=i // cols, col=i % cols, title=name, axisItems=_axes())
            p.setTitle(name, size="8pt")
            _setup_plot(p)
            if i < len(names) - cols:  # the same time axis as the row below: its numbers only once, at the bottom
                p.getAxis("bottom").setStyle(showValues=False)
            self.plots.append(p)
            self.curves.append({
                "policy": _curve(p, style.POLICY, "policy"),
                "human": _curve(p, style.HUMAN, "human"),
                "applied": _curve(p, style.APPLIED, "applied", dashed=True),
            })
        rows = max(1, -(-len(names) // cols))
        self.layout_widget.setMinimumHeight(rows * ACTION_ROW_PX)

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
        if not self.history.add(snap.seq, _snap_time(snap), row):
            return
        x, v = self.history.window()
        refit = snap.episode_id != self._episode or len(self.history) == 1
        self._episode = snap.episode_id
        for i, curves in enumerate(self.curves):
            cols = v[:, i::n]  # policy, human, applied of dim i
            curves["policy"].show_data(x, cols[:, 0])
            curves["human"].show_data(x, cols[:, 1], sparse=True)
            curves["applied"].show_data(x, cols[:, 2])
            if refit:
                self.yranges[i].reset()
                self.yranges[i].add(cols)
            else:
                self.yranges[i].add(cols[-1])
        self._apply_ranges()

    def _apply_ranges(self) -> None:
        for p, r in zip(self.plots, self.yranges, strict=True):
            new = r.apply()
            if new is not None:
                p.setYRange(*new, padding=0)
        self._timer.schedule(self.yranges)


class PlotsPanel(QSplitter):
    """The three plot groups stacked; splitter handles let the operator give the actions more room."""

    actions: ActionPlots  # type: ignore[assignment]  # hides QWidget.actions() (the QActions, unused here)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Vertical, parent)
        self.setObjectName("plots_splitter")
        self.gate = GatePlot()
        self.progress = ProgressPlot()
        self.actions = ActionPlots()
        for i, (w, stretch) in enumerate(((self.gate, 1), (self.progress, 1), (self.actions, 2))):
            self.addWidget(w)
            self.setStretchFactor(i, stretch)  # the per-dimension action plots get half the height

        self.user_sized = False  # the person moved a handle (or their saved layout was restored): keep theirs
        self._rows = 0
        self.splitterMoved.connect(self._moved)

    def _moved(self, *_):
        self.user_sized = True

    @property
    def action_rows(self) -> int:
        n = len(self.actions.plots)
        return -(-n // 2) if n > 1 else n

    def fit(self) -> None:
        """Share the height by plot rows: the gate and the progress plot one each, the actions theirs."""
        rows = max(1, self.action_rows)
        total = sum(self.sizes())
        if total <= 0:
            return
        unit = total / (2 + rows)
        self.blockSignals(True)  # not the person's move
        self.setSizes([round(unit), round(unit), total - 2 * round(unit)])
        self.blockSignals(False)

    def show_snapshot(self, snap: Snapshot) -> None:
        self.gate.show_snapshot(snap)
        self.progress.show_snapshot(snap)
        self.actions.show_snapshot(snap)
        if self.action_rows != self._rows:
            self._rows = self.action_rows
            if not self.user_sized:
                self.fit()
