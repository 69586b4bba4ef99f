"""The selected window's episode: a timeline coloured by what each step was, action plots and the step's picture.

Everything here is drawn from an EpisodeData read once when a window is selected; scrubbing (the slider,
Left/Right, Space to play at the recorded control rate) only moves cursors and swaps the frame. The picture is
the recorded camera frame, or for an episode recorded without a camera the scene re-rendered from its
recorded initial state and applied actions (review.render, on the SceneRenderer's thread; "rendering 40/150"
until it is ready).
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import QEvent, QObject, QPointF, QSize, Qt, QTimer, pyqtSignal
from PyQt6.QtGui import QColor, QImage, QKeyEvent, QPixmap
from PyQt6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSlider,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.contract.command import COMMAND_AXES
from hg_dagger.review.render import Scene
from hg_dagger.ui import style
from hg_dagger.ui.keys import is_text_input
from hg_dagger.ui.plots import legend_html
from hg_dagger.ui.review.model import STEP_KINDS, WAIT_MARKER, EpisodeData
from hg_dagger.ui.review.worker import SceneRenderer

MARKER_STYLE = {"gate_warning": (style.WARNING, "warn"), "gate_trigger": (style.SAFETY, "gate"),
                "estop": (style.SAFETY, "E-STOP"), "safety_clamp": (style.SAFETY, "clamp"),
                "handover_start": (style.HUMAN, ""), "handover_end": (style.POLICY, ""),
                WAIT_MARKER: (style.NEUTRAL, "")}
LABEL_TOP, LABEL_LOWER = 0.95, 0.8  # heights of a marker's label on the timeline (a fraction of the bar)
LEGEND_KINDS = ("policy", "human", "expert", "waiting", "handback", "safety")
_SHORTCUT_MODIFIERS = (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
                       | Qt.KeyboardModifier.MetaModifier)


def _rgba(colour: str, alpha: int) -> QColor:
    c = QColor(colour)
    c.setAlpha(alpha)
    return c


class SecondsAxis(pg.AxisItem):
    """An axis over steps that reads in seconds (step / control_hz), with ticks at round seconds."""

    def __init__(self, orientation="top", **kw):
        super().__init__(orientation, **kw)
        self.hz = 1.0

    def tickValues(self, minVal, maxVal, size):  # noqa: N802,N803 - pyqtgraph override
        return [(spacing * self.hz, [v * self.hz for v in values])
                for spacing, values in super().tickValues(minVal / self.hz, maxVal / self.hz, size)]

    def tickStrings(self, values, scale, spacing):  # noqa: N802 - pyqtgraph override
        return [f"{v / self.hz:g}" for v in values]


class Timeline(pg.PlotWidget):
    """One bar per step coloured by what the step was (STEP_KINDS), event markers, windows shaded with their
    context; steps along the bottom, seconds along the top. Pressing or dragging on it emits ``scrubbed(step)``."""

    scrubbed = pyqtSignal(int)

    def __init__(self, parent=None):
        self.seconds = SecondsAxis("top")
        super().__init__(parent, axisItems={"top": self.seconds})
        self.setBackground("w")
        self.setMinimumHeight(120)
        self.setMaximumHeight(150)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        plot = self.getPlotItem()
        plot.hideAxis("left")
        plot.showAxis("top")
        plot.setLabel("bottom", "step")
        plot.setLabel("top", "time (s)")
        self.setYRange(-0.35, 1.35, padding=0)
        self.colours: list[str] = []
        self.markers: list[tuple[int, str]] = []
        self.marker_texts: list[str] = []  # the label drawn at each marker
        self.marker_heights: list[float] = []  # where on the bar it is drawn (a fraction of the height)
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
        self.seconds.hz = max(float(data.control_hz), 1e-6)
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
        self.markers, self.marker_texts, self.marker_heights = [], [], []
        waits = 0
        runs = _marker_runs(data.markers)
        near = max(2, n // 30)  # labels closer than this (in steps) would be drawn over each other
        top: tuple[int, float] | None = None  # the last label drawn at the top: its step and height
        for m, run in zip(data.markers, runs, strict=True):
            colour, label = MARKER_STYLE.get(m.kind, (style.NEUTRAL, m.kind))
            position, fill = LABEL_TOP, None
            if label and m.kind != WAIT_MARKER:  # a run of the same marker on consecutive steps: one label
                label = "" if run == 0 else f"{label} x{run}" if run > 1 else label
                if label:  # a different marker's label just before at the top: this one a line lower
                    if top is not None and m.step - top[0] < near and top[1] == LABEL_TOP:
                        position = LABEL_LOWER
                    top = (m.step, position)
            if m.kind == WAIT_MARKER:
                # a wait that left no rows (the world paused) says it all; beside held steps a short label will do
                held = 0 < m.step <= n and data.kinds[m.step - 1] == "waiting"
                label = m.short if held else m.text
                position, fill = (0.3, 0.6)[waits % 2], _rgba("#ffffff", 210)  # neighbours alternate heights
                waits += 1
            line = pg.InfiniteLine(pos=m.step + 0.5, angle=90, pen=pg.mkPen(colour, width=2, style=Qt.PenStyle.DashLine),
                                   label=label or None, labelOpts={"position": position, "color": colour, "fill": fill})
            line.setToolTip(f"{m.text or m.kind} at step {m.step}" + (f": {m.reason}" if m.reason else ""))
            self._add(line)
            self.markers.append((m.step, m.kind))
            self.marker_texts.append(label)
            self.marker_heights.append(position)
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


def _marker_runs(markers) -> list[int]:
    """Per marker: the length of the run of same-kind markers on consecutive steps it starts, or 0 where it
    continues one (a clamp held for 25 steps is one "clamp x25", not 25 labels drawn over each other)."""
    runs = [1] * len(markers)
    head: dict[str, tuple[int, int]] = {}  # kind -> (index of the run's first marker, last step in the run)
    for i, m in enumerate(markers):
        first = head.get(m.kind)
        if first is not None and m.step - first[1] in (0, 1):
            runs[first[0]] += 1
            runs[i] = 0
            head[m.kind] = (first[0], m.step)
        else:
            head[m.kind] = (i, m.step)
    return runs


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
        self.legend: list[tuple[str, str, str]] = []  # (name, colour, line kind) of the curves shown

    def show_episode(self, data: EpisodeData) -> None:
        self.clear()
        self.plots, self.cursors, self.human_dims = [], [], []
        steps = np.arange(data.num_steps)
        human = np.flatnonzero(data.action_source == 1)
        self.human_steps = human
        last = len(data.action_names) - 1
        for i, name in enumerate(data.action_names):
            p = self.addPlot(row=i, col=0)
            p.setLabel("left", name)
            if i < len(data.action_ranges):
                lo, hi = data.action_ranges[i]
                p.getAxis("left").setToolTip(f"{name}: raw action, {lo:g} to {hi:g}"
                                             + (f" ({data.action_description})" if data.action_description else ""))
            if i == last:
                p.setLabel("bottom", "step")
            p.showGrid(x=True, y=True, alpha=0.2)
            p.setMouseEnabled(x=False, y=False)
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
        self.legend = self._legend(data, human.size > 0)

    def _legend(self, data: EpisodeData, human_applied: bool) -> list[tuple[str, str, str]]:
        """The curves the plots hold: the legend, shown in the caption above them (it wraps in a narrow pane and
        never covers a curve)."""
        entries = [("applied", style.APPLIED, "solid"), ("policy", style.POLICY, "solid")]
        if np.isfinite(data.expert).any():
            entries.append(("expert", style.EXPERT, "dashed"))
        if self.human_dims:
            entries.append(("human command", style.HUMAN, "dashed"))
        if human_applied:
            entries.append(("human applied", style.HUMAN, "marker"))
        return entries

    def set_step(self, step: int) -> None:
        for c in self.cursors:
            c.setValue(step)


class FrameView(QWidget):
    """The step's picture with a line saying what it is, and the step's state observations as text under it.

    The picture is the recorded camera frame, or, for an episode without one, its scene re-rendered through the
    simulator (``set_scene``); ``set_progress`` and ``set_no_scene`` say how that render goes."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.picture = QLabel()
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.picture.setMinimumSize(160, 120)
        # the layout sizes the picture, never the pixmap it holds (that would grow or shrink it step by step)
        self.picture.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
        self.picture.installEventFilter(self)
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.values = QLabel("")
        self.values.setWordWrap(True)
        self.values.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.values.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.values.setStyleSheet("font-family: monospace; font-size: 9pt;")
        scroll = QScrollArea()  # a long state vector scrolls instead of squeezing the picture
        scroll.setWidget(self.values)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setFixedHeight(96)
        self.values_area = scroll
        scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.picture, 1)
        lay.addWidget(self.caption)
        lay.addWidget(scroll)
        self.data: EpisodeData | None = None
        self.scene: Scene | None = None
        self.state = "none"  # recorded | rendering | rendered | no scene | none
        self.shown: np.ndarray | None = None  # the frame on screen (for its step)
        self.step = 0

    @property
    def frames(self) -> np.ndarray | None:
        if self.data is not None and self.data.images is not None:
            return self.data.images
        return self.scene.frames if self.scene is not None else None

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(420, 360)  # room for the picture beside the action plots

    def text(self) -> str:
        """The step's state observations as shown under the picture."""
        return self.values.text()

    def pixmap(self) -> QPixmap:
        """The picture on screen (null while there is none)."""
        return self.picture.pixmap()

    def set_episode(self, data: EpisodeData | None) -> None:
        self.data, self.scene, self.shown = data, None, None
        self.picture.clear()
        self.values.clear()
        self.values_area.setVisible(data is not None and data.images is None)
        if data is None:
            self.state = "none"
            self.caption.clear()
        elif data.images is not None:
            self.state = "recorded"
            self.caption.setText(f"camera {data.image_key} as recorded")
        else:
            self.state = "rendering"
            self.caption.setText("no camera recorded: re-rendering the scene from the recorded initial state")

    def set_progress(self, done: int, total: int) -> None:
        if self.state != "rendering":
            return
        self.picture.setText(f"rendering {done}/{total}")

    def set_scene(self, scene: Scene) -> None:
        if self.data is None or scene.episode_id != self.data.episode_id or self.data.images is not None:
            return
        self.scene, self.state = scene, "rendered"
        self.caption.setText("scene re-rendered from the recorded initial state and applied actions (no camera "
                             "was recorded)" + (f"; {note}" if (note := scene.note()) else ""))
        self.caption.setStyleSheet(f"color: {style.SAFETY};" if scene.diverged_at is not None else "")
        self.set_step(self.step)

    def set_no_scene(self, reason: str) -> None:
        if self.state != "rendering":
            return
        self.state = "no scene"
        self.picture.setText("no scene to show")
        self.caption.setText(reason)

    def set_step(self, step: int) -> None:
        self.step = step
        d = self.data
        if d is None:
            return
        frames = self.frames
        if frames is not None and 0 <= step < len(frames):
            self.shown = np.ascontiguousarray(frames[step])
            self._draw()
        if d.images is None:
            self.values.setText(d.obs_text(step))

    def _draw(self) -> None:
        frame = self.shown
        if frame is None:
            return
        h, w = frame.shape[:2]
        # PyQt takes any buffer (the array's memory, no copy); its stubs say bytes
        img = QImage(frame.data, w, h, 3 * w, QImage.Format.Format_RGB888).copy()  # type: ignore[call-overload]
        size = self.picture.size()
        self.picture.setPixmap(QPixmap.fromImage(img).scaled(
            max(size.width(), 64), max(size.height(), 64), Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation))

    def eventFilter(self, obj, ev):  # noqa: N802 - Qt override
        if obj is self.picture and ev.type() == QEvent.Type.Resize:
            self._draw()  # the caption's height changed, or the splitter moved: fit the picture again
        return False


class ScrubKeys(QObject):
    """Left/Right step and Space plays/pauses anywhere in ``area`` but a text input (an application event
    filter, so a focused table, slider or button does not take them; Space never clicks a button there)."""

    def __init__(self, view: EpisodeView, area: QWidget):
        super().__init__(view)
        self.view, self.area = view, area

    def eventFilter(self, obj: QObject | None, ev: QEvent | None) -> bool:  # noqa: N802 - Qt override
        if not isinstance(ev, QKeyEvent):  # a key press or release always comes as a QKeyEvent
            return False
        t = ev.type()
        if t not in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease) or not isinstance(obj, QWidget):
            return False
        key = ev.key()
        if key not in (Qt.Key.Key_Left, Qt.Key.Key_Right, Qt.Key.Key_Space) or ev.modifiers() & _SHORTCUT_MODIFIERS:
            return False
        area = self.area
        if not area.isVisible() or not (obj is area or area.isAncestorOf(obj)):
            return False
        if is_text_input(obj) or is_text_input(QApplication.focusWidget()):
            return False
        if t == QEvent.Type.KeyPress:
            if key == Qt.Key.Key_Left:
                self.view.set_step(self.view.step - 1)
            elif key == Qt.Key.Key_Right:
                self.view.set_step(self.view.step + 1)
            elif not ev.isAutoRepeat():
                self.view.toggle_play()
        return True


class EpisodeView(QWidget):
    """Timeline, scrubber, action plots and frame of one episode; ``step_changed(int)`` on every move."""

    step_changed = pyqtSignal(int)

    def __init__(self, parent=None, *, renderer: SceneRenderer | None = None):
        super().__init__(parent)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.data: EpisodeData | None = None
        self.step = 0
        self.renderer = renderer if renderer is not None else SceneRenderer(self)
        self.renderer.progress.connect(self._render_progress)
        self.renderer.rendered.connect(self._rendered)
        self.renderer.failed.connect(self._render_failed)
        self._scene_key: tuple[str, str] | None = None
        self.keys = ScrubKeys(self, self)
        app = QApplication.instance()
        assert app is not None  # widgets are made in a running application
        app.installEventFilter(self.keys)
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
        self.action_caption = QLabel("")
        self.action_caption.setWordWrap(True)
        self.frame = FrameView()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self._advance)
        scrub = QHBoxLayout()
        scrub.addWidget(self.play_button)
        scrub.addWidget(self.slider, 1)
        scrub.addWidget(self.step_label)
        split = QSplitter(Qt.Orientation.Horizontal)
        plots = QWidget()
        plots_lay = QVBoxLayout(plots)
        plots_lay.setContentsMargins(0, 0, 0, 0)
        plots_lay.addWidget(self.action_caption)
        plots_lay.addWidget(self.plots, 1)
        split.addWidget(plots)
        split.addWidget(self.frame)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        self.split = split
        self._split_placed = False
        legend = QLabel("  ".join(f'<span style="color:{STEP_KINDS[k][0]}">&#9632;</span> {STEP_KINDS[k][1]}'
                                  for k in LEGEND_KINDS))
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
        units = (f"actions ({html.escape(data.task_id or 'task')} raw units): {html.escape(data.action_description)}<br>"
                 if data.action_description else "")
        self.action_caption.setText(units + legend_html(self.plots.legend))
        self.frame.set_episode(data)
        self._show_scene(data)
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
        self.step_label.setText(f"step {step} / {d.num_steps - 1}, {step / max(d.control_hz, 1e-6):.2f} s  "
                                f"({d.step_text(step)})")
        self.step_changed.emit(step)

    def showEvent(self, event):  # noqa: N802 - Qt override
        super().showEvent(event)
        if not self._split_placed and self.split.width() > 0:
            self._split_placed = True  # plots 3 : picture 2 at first; the reviewer's splitter moves are kept
            w = self.split.width()
            self.split.setSizes([w * 3 // 5, w - w * 3 // 5])

    def scrub_keys_in(self, area: QWidget) -> None:
        """Let Left/Right/Space scrub wherever focus is in ``area`` (the workspace), not only on this view."""
        self.keys.area = area

    def shutdown(self) -> None:
        """Stop playback and the render thread."""
        self.stop()
        self.renderer.close()

    # ----------------------------------------------------------------------------------------- scene

    def _show_scene(self, data: EpisodeData) -> None:
        """Ask for the re-rendered scene of an episode recorded without a camera (cached, or rendered now)."""
        if data.images is not None or not data.store:
            self._scene_key = None
            self.renderer.cancel()
            return
        self._scene_key = (data.store, data.episode_id)
        scene = self.renderer.request(*self._scene_key)
        if scene is not None:
            self.frame.set_scene(scene)
        else:
            self.frame.set_progress(0, data.num_steps)

    def _render_progress(self, key, done: int, total: int) -> None:
        if key == self._scene_key:
            self.frame.set_progress(done, total)

    def _rendered(self, key, scene: Scene) -> None:
        if key == self._scene_key:
            self.frame.set_scene(scene)

    def _render_failed(self, key, reason: str) -> None:
        if key == self._scene_key:
            self.frame.set_no_scene(reason)

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
