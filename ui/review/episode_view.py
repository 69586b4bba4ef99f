"""The selected window's episode: a timeline coloured by action source, action plots and the step's frame.

Everything here is drawn from an EpisodeData read once when a window is selected; scrubbing (the slider,
Left/Right, Space to play at the recorded control rate) only moves cursors and swaps the frame.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import QPointF, Qt, QTimer, pyqtSignal
from PyQt6.QtGui import QColor, QImage, QPixmap
from PyQt6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSlider,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.contract.command import COMMAND_AXES
from hg_dagger.ui import style
from hg_dagger.ui.review.model import SOURCE_COLOURS, SOURCE_NAMES, EpisodeData

MARKER_STYLE = {"gate_warning": (style.WARNING, "warn"), "gate_trigger": (style.SAFETY, "gate"),
                "estop": (style.SAFETY, "E-STOP"), "safety_clamp": (style.SAFETY, "clamp"),
                "handover_start": (style.HUMAN, ""), "handover_end": (style.POLICY, "")}


def _rgba(colour: str, alpha: int) -> QColor:
    c = QColor(colour)
    c.setAlpha(alpha)
    return c


class Timeline(pg.PlotWidget):
    """One bar per step coloured by action_source, event markers, windows shaded with their context; pressing or
    dragging on it emits ``scrubbed(step)``."""

    scrubbed = pyqtSignal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.setMaximumHeight(110)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.getPlotItem().hideAxis("left")
        self.setYRange(-0.35, 1.35, padding=0)
        self.colours: list[str] = []
        self.markers: list[tuple[int, str]] = []
        self.regions: list[tuple[int, int, str]] = []  # (start, end, "window" | "context")
        self.cursor = pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen(style.APPLIED, width=2))
        self.cursor.setZValue(10)
        self._items: list = []
        self.num_steps = 0

    def show_episode(self, data: EpisodeData, window_id: str | None) -> None:
        plot = self.getPlotItem()
        for item in self._items:
            plot.removeItem(item)
        self._items = []
        n = self.num_steps = data.num_steps
        self.colours = data.step_colours()
        x = np.arange(n) + 0.5
        bars = pg.BarGraphItem(x=x, height=np.ones(n), width=1.0, y0=np.zeros(n),
                               brushes=[pg.mkBrush(c) for c in self.colours], pens=[pg.mkPen(None)] * n)
        self._add(bars)
        self.regions = []
        for w in data.windows:
            mine = w.window_id == window_id
            lo, hi = w.handover_start, w.handover_end
            before, after = max(0, lo - w.context_before), min(n, hi + w.context_after)
            for a, b, kind, alpha in ((before, lo, "context", 40), (lo, hi, "window", 110 if mine else 45),
                                      (hi, after, "context", 40)):
                if b > a:
                    region = pg.LinearRegionItem((a, b), movable=False, brush=_rgba(style.APPLIED, alpha),
                                                 pen=pg.mkPen(style.APPLIED if mine and kind == "window" else None))
                    region.setZValue(-5)
                    self._add(region)
                    self.regions.append((a, b, kind))
        self.markers = []
        for m in data.markers:
            colour, label = MARKER_STYLE.get(m.kind, (style.NEUTRAL, m.kind))
            line = pg.InfiniteLine(pos=m.step + 0.5, angle=90, pen=pg.mkPen(colour, width=2, style=Qt.PenStyle.DashLine),
                                   label=label or None, labelOpts={"position": 0.95, "color": colour})
            line.setToolTip(f"{m.kind} at step {m.step}" + (f": {m.reason}" if m.reason else ""))
            self._add(line)
            self.markers.append((m.step, m.kind))
        self._add(self.cursor)
        self.setXRange(0, max(n, 1), padding=0.01)

    def _add(self, item) -> None:
        self.getPlotItem().addItem(item)
        self._items.append(item)

    def set_step(self, step: int) -> None:
        self.cursor.setValue(step + 0.5)

    def step_at(self, pos: QPointF) -> int:
        """The step under a point of the widget."""
        x = self.getPlotItem().vb.mapSceneToView(self.mapToScene(pos.toPoint())).x()
        return int(min(max(np.floor(x), 0), max(self.num_steps - 1, 0)))

    def mousePressEvent(self, ev):  # noqa: N802 - Qt override
        if ev.button() == Qt.MouseButton.LeftButton and self.num_steps:
            self.scrubbed.emit(self.step_at(ev.position()))
            ev.accept()
            return
        super().mousePressEvent(ev)

    def mouseMoveEvent(self, ev):  # noqa: N802 - Qt override
        if ev.buttons() & Qt.MouseButton.LeftButton and self.num_steps:
            self.scrubbed.emit(self.step_at(ev.position()))
            ev.accept()
            return
        super().mouseMoveEvent(ev)


class ActionPlots(pg.GraphicsLayoutWidget):
    """Per action dim: applied (dark), policy (blue), expert (purple), the operator's raw device command on the
    axis that drives the dim (orange dashed, device units); human-applied steps marked orange."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.plots: list[pg.PlotItem] = []
        self.cursors: list[pg.InfiniteLine] = []
        self.human_steps = np.zeros(0, np.int64)
        self.human_dims: list[int] = []  # action dims with a human command curve

    def show_episode(self, data: EpisodeData) -> None:
        self.clear()
        self.plots, self.cursors, self.human_dims = [], [], []
        steps = np.arange(data.num_steps)
        human = np.flatnonzero(data.action_source == 1)
        self.human_steps = human
        for i, name in enumerate(data.action_names):
            p = self.addPlot(row=i, col=0)
            p.setLabel("left", name)
            p.showGrid(x=True, y=True, alpha=0.2)
            p.setMouseEnabled(x=False, y=False)
            if i == 0:
                p.addLegend(offset=(5, 5))
            if self.plots:
                p.setXLink(self.plots[0])
            p.plot(steps, data.applied[:, i], pen=pg.mkPen(style.APPLIED, width=2), name="applied")
            p.plot(steps, data.policy[:, i], pen=pg.mkPen(style.POLICY, width=1), name="policy")
            if np.isfinite(data.expert[:, i]).any():
                p.plot(steps, data.expert[:, i], pen=pg.mkPen(style.EXPERT, width=1, style=Qt.PenStyle.DashLine),
                       name="expert")
            axis = data.human_axes[i] if i < len(data.human_axes) else None
            if data.human is not None and axis is not None and np.isfinite(data.human[:, axis]).any():
                p.plot(steps, data.human[:, axis], connect="finite", name=f"human command ({COMMAND_AXES[axis]})",
                       pen=pg.mkPen(style.HUMAN, width=1, style=Qt.PenStyle.DashLine))
                self.human_dims.append(i)
            if human.size:
                p.plot(human, data.applied[human, i], pen=None, symbol="o", symbolSize=5,
                       symbolBrush=style.HUMAN, symbolPen=None, name="human applied")
            cursor = pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen(style.APPLIED, width=1))
            p.addItem(cursor)
            self.plots.append(p)
            self.cursors.append(cursor)

    def set_step(self, step: int) -> None:
        for c in self.cursors:
            c.setValue(step)


class FrameView(QLabel):
    """The step's camera frame, or its observation values as text where the episode has no camera."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setMinimumSize(200, 160)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.data: EpisodeData | None = None

    def set_episode(self, data: EpisodeData | None) -> None:
        self.data = data
        self.clear()

    def set_step(self, step: int) -> None:
        d = self.data
        if d is None:
            return
        if d.images is not None:
            frame = np.ascontiguousarray(d.images[step])
            h, w = frame.shape[:2]
            img = QImage(frame.data, w, h, 3 * w, QImage.Format.Format_RGB888).copy()
            pix = QPixmap.fromImage(img)
            self.setPixmap(pix.scaled(max(self.width(), 64), max(self.height(), 64),
                                      Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.FastTransformation))
        else:
            self.setText(d.obs_text(step))


class EpisodeView(QWidget):
    """Timeline, scrubber, action plots and frame of one episode; ``step_changed(int)`` on every move."""

    step_changed = pyqtSignal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.data: EpisodeData | None = None
        self.step = 0
        self.title = QLabel("select a window")
        self.title.setWordWrap(True)
        self.privacy = QLabel("")
        self.timeline = Timeline()
        self.timeline.scrubbed.connect(self.set_step)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setEnabled(False)
        self.slider.valueChanged.connect(self.set_step)
        self.play_button = QPushButton("Play")
        self.play_button.setCheckable(True)
        self.play_button.setEnabled(False)
        self.play_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.play_button.toggled.connect(self._play_toggled)
        self.step_label = QLabel("-")
        self.plots = ActionPlots()
        self.frame = FrameView()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self._advance)
        scrub = QHBoxLayout()
        scrub.addWidget(self.play_button)
        scrub.addWidget(self.slider, 1)
        scrub.addWidget(self.step_label)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.plots)
        split.addWidget(self.frame)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        legend = QLabel("  ".join(f'<span style="color:{SOURCE_COLOURS[c]}">&#9632;</span> {SOURCE_NAMES[c]}'
                                  for c in (0, 1, 3, 2)))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.title)
        lay.addWidget(self.privacy)
        lay.addWidget(self.timeline)
        lay.addWidget(legend)
        lay.addLayout(scrub)
        lay.addWidget(split, 1)

    def show_episode(self, data: EpisodeData, window_id: str | None = None, step: int = 0) -> None:
        self.stop()
        self.data = data
        self.title.setText(f"episode {data.episode_id}: {data.num_steps} steps at {data.control_hz:g} Hz"
                           + (f", camera {data.image_key}" if data.image_key else "")
                           + f"; {data.mode or '-'}, operator {data.operator or '-'}, policy {data.policy_version or '-'}")
        self.privacy.setText(f"privacy: {data.privacy}")
        self.timeline.show_episode(data, window_id)
        self.plots.show_episode(data)
        self.frame.set_episode(data)
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(data.num_steps - 1, 0))
        self.slider.blockSignals(False)
        self.slider.setEnabled(data.num_steps > 0)
        self.play_button.setEnabled(data.num_steps > 1)
        self.step = -1
        self.set_step(min(max(step, 0), max(data.num_steps - 1, 0)))

    def set_step(self, step: int) -> None:
        d = self.data
        if d is None or d.num_steps == 0:
            return
        step = int(min(max(step, 0), d.num_steps - 1))
        if step == self.step:
            return
        self.step = step
        if self.slider.value() != step:
            self.slider.setValue(step)  # re-enters with the same step and returns above
        self.timeline.set_step(step)
        self.plots.set_step(step)
        self.frame.set_step(step)
        src = SOURCE_NAMES.get(int(d.action_source[step]), "?")
        self.step_label.setText(f"step {step} / {d.num_steps - 1}  ({src})")
        self.step_changed.emit(step)

    # ----------------------------------------------------------------------------------------- playback

    @property
    def playing(self) -> bool:
        return self.timer.isActive()

    def toggle_play(self) -> None:
        self.play_button.setChecked(not self.play_button.isChecked())

    def stop(self) -> None:
        self.play_button.setChecked(False)

    def _play_toggled(self, on: bool) -> None:
        if on and self.data is not None:
            if self.step >= self.data.num_steps - 1:
                self.set_step(0)
            self.timer.start(max(1, round(1000.0 / max(self.data.control_hz, 1e-3))))
            self.play_button.setText("Pause")
        else:
            self.timer.stop()
            self.play_button.setText("Play")

    def _advance(self) -> None:
        if self.data is None or self.step >= self.data.num_steps - 1:
            self.stop()
            return
        self.set_step(self.step + 1)

    def keyPressEvent(self, event):
        key = event.key()
        if key == Qt.Key.Key_Left:
            self.set_step(self.step - 1)
        elif key == Qt.Key.Key_Right:
            self.set_step(self.step + 1)
        elif key == Qt.Key.Key_Space:
            self.toggle_play()
        else:
            super().keyPressEvent(event)
