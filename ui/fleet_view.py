"""The fleet view: one person, several robots (`hg-dagger app --robots N`, docs/fleet.md).

A grid of robot tiles (a small live view each, the robot's state in colour and words, its episodes and success
rate, its own one-click e-stop) and, beside it, the request queue in the order the person would take it, with
the gate that asked and how long it has waited. Clicking a tile (or its number key) takes that robot: it comes
up large in the console with its plots and device panel, and the person's keys reach it. P takes the top
request. Tiles never move: a request that arrives changes a tile's colour and the queue's text, never where
anything is, so nothing moves under the mouse.

Widgets read Snapshot.robots / .queue and send TakeRobot, StopRobot and ClearRobot.
"""

from __future__ import annotations

import math

from PyQt6.QtCore import QSize, Qt
from PyQt6.QtGui import QMouseEvent
from PyQt6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.control.live import (
    ClearRobot,
    CommandQueue,
    QueueEntry,
    RobotView,
    Snapshot,
    StopRobot,
    TakeRobot,
)
from hg_dagger.ui import style
from hg_dagger.ui.keymap import FLEET_STOP_KEY, FLEET_TAKE_KEY
from hg_dagger.ui.view import LiveView

# a robot's state -> (words, colour)
ROBOT_STATES: dict[str, tuple[str, str]] = {
    "autonomous": ("AUTONOMOUS", style.AUTONOMOUS),
    "waiting": ("WAITING", style.REQUEST),
    "human": ("HUMAN", style.HUMAN),
    "returning": ("RETURNING", style.POLICY),
    "held": ("HELD", style.EXPERT),
    "e-stop": ("E-STOP", style.SAFETY),
    "idle": ("IDLE", style.NEUTRAL),  # between episodes, or no episode left for it
}


def robot_style(state: str) -> tuple[str, str]:
    return ROBOT_STATES.get(state, (state.upper(), style.NEUTRAL))


def rate_text(v: RobotView) -> str:
    """Episodes and success rate in words: '3 episodes, 67% success'."""
    if not v.episodes:
        return "no episode ended yet"
    return f"{v.episodes} episode{'s' if v.episodes != 1 else ''}, {100 * v.successes / v.episodes:.0f}% success"


def queue_text(q: QueueEntry) -> str:
    why = q.reason or "gate"
    cause = " (constraint)" if q.constraint else ""
    return f"{q.rank}. robot {q.robot + 1}: {why}{cause}, waiting {q.wait_s:.1f} s"


class TileView(LiveView):
    """A robot's small live view."""

    MIN_SIDE = 96
    MESSAGE_PT = 9

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(160, 160)


class RobotTile(QFrame):
    """One robot: its view, its state, its figures, its e-stop; a click takes it."""

    def __init__(self, robot: int, commands: CommandQueue, parent: QWidget | None = None):
        super().__init__(parent)
        self.robot, self.commands = robot, commands
        self.setObjectName(f"robot_tile_{robot + 1}")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip(f"click (or press {robot + 1}) to take robot {robot + 1}")
        self.title = QLabel(f"Robot {robot + 1}")
        self.title.setStyleSheet("font-weight: bold;")
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)  # text never widens it
        self.state = QLabel()
        self.state.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.state.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.view = TileView()
        self.figures = QLabel()
        self.figures.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.wait = QLabel()  # its request: which gate asked, how long it has waited ("" without one)
        self.wait.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.wait.setStyleSheet(f"color: {style.REQUEST}; font-weight: bold;")
        self.stop = QPushButton(f"Stop {robot + 1}")
        self.stop.setObjectName(f"robot_stop_{robot + 1}")
        self.stop.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # a key press never lands on it
        self.stop.setFixedWidth(self.stop.fontMetrics().horizontalAdvance(f"Clear {robot + 1}") + 24)  # either text
        self.stop.clicked.connect(self._stop_clicked)
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.stop)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.setSpacing(2)
        lay.addLayout(head)
        lay.addWidget(self.state)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.figures)
        lay.addWidget(self.wait)
        self.last: RobotView | None = None
        self.selected = False
        self.serving = False
        self._paint("idle", False, False, False)

    def _stop_clicked(self) -> None:
        v = self.last
        if v is not None and v.stopped:
            self.commands.put(ClearRobot(self.robot))
        else:
            self.commands.put(StopRobot(self.robot))

    def mousePressEvent(self, ev: QMouseEvent | None) -> None:  # noqa: N802 - Qt override
        if ev is not None and ev.button() == Qt.MouseButton.LeftButton:
            self.commands.put(TakeRobot(self.robot))
        super().mousePressEvent(ev)

    def show_robot(self, v: RobotView, *, selected: bool, serving: bool) -> None:
        old = self.last
        self.last = v
        if old is None or (old.state, old.stopped) != (v.state, v.stopped) or (self.selected, self.serving) != (
                selected, serving):
            self._paint(v.state, v.stopped, selected, serving)
        self.figures.setText(rate_text(v))
        self.wait.setText(f"waiting {v.wait_s:.0f} s: {v.reason or 'gate'}" if v.wait_s is not None else "")
        self.view.set_frame(v.frame)

    def _paint(self, state: str, stopped: bool, selected: bool, serving: bool) -> None:
        self.selected, self.serving = selected, serving
        words, colour = robot_style(state)
        self.state.setText(words)
        self.title.setText(f"Robot {self.robot + 1}" + (" · yours" if serving else ""))
        self.state.setStyleSheet(style.filled(colour, radius=4, pt=10))
        border = style.HUMAN if serving else (style.POLICY if selected else "transparent")
        self.setStyleSheet(f"#{self.objectName()} {{ border: 3px solid {border}; border-radius: 6px; }}")
        self.stop.setText(f"Clear {self.robot + 1}" if stopped else f"Stop {self.robot + 1}")
        self.stop.setToolTip(f"clear robot {self.robot + 1}'s e-stop (Shift+{FLEET_STOP_KEY.upper()} on it)" if stopped
                             else f"e-stop robot {self.robot + 1} alone; the others run on "
                                  f"({FLEET_STOP_KEY.upper()} stops the robot on screen, Esc all)")
        self.stop.setStyleSheet("" if stopped else style.filled(style.SAFETY, radius=4))


class FleetPanel(QWidget):
    """The robot grid with the queue beside it (see the module docstring)."""

    def __init__(self, robots: int, commands: CommandQueue, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("fleet")
        self.commands = commands
        self.tiles = [RobotTile(r, commands) for r in range(robots)]
        grid = QGridLayout()
        grid.setSpacing(4)
        cols = max(1, math.ceil(math.sqrt(robots)))
        for r, tile in enumerate(self.tiles):
            tile.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
            tile.setMinimumWidth(130)  # its words are cut to the tile, never widen it: the grid never moves
            grid.addWidget(tile, r // cols, r % cols)
        for c in range(cols):
            grid.setColumnStretch(c, 1)
        for row in range(math.ceil(robots / cols)):
            grid.setRowStretch(row, 1)
        self.queue_title = QLabel("Requests")
        self.queue_title.setStyleSheet("font-weight: bold;")
        self.queue = QLabel("none waiting")
        self.queue.setObjectName("fleet_queue")
        self.queue.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.queue.setWordWrap(True)
        self.queue.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        self.queue.setMinimumWidth(200)
        self.queue_title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.queue_title.setWordWrap(True)
        self.hint = QLabel(f"{FLEET_TAKE_KEY.upper()}: take the top request · 1-{robots}: take a robot · "
                           f"{FLEET_STOP_KEY.upper()}: stop the robot on screen · Esc: stop all")
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet(f"color: {style.NEUTRAL};")
        side = QVBoxLayout()
        side.addWidget(self.queue_title)
        side.addWidget(self.queue, 1)
        side.addWidget(self.hint)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(grid, 3)
        lay.addLayout(side, 1)

    def show_snapshot(self, snap: Snapshot) -> None:
        for v in snap.robots:
            if v.robot < len(self.tiles):
                self.tiles[v.robot].show_robot(v, selected=v.robot == snap.robot, serving=v.robot == snap.serving)
        if snap.queue:
            policy = f" ({snap.allocation})" if snap.allocation else ""
            self.queue_title.setText(f"Requests: {len(snap.queue)} waiting{policy}: {FLEET_TAKE_KEY.upper()} takes "
                                     f"robot {snap.queue[0].robot + 1}")
            self.queue_title.setStyleSheet(style.filled(style.REQUEST, radius=4))
            self.queue.setText("\n".join(queue_text(q) for q in snap.queue))
        else:
            self.queue_title.setText("Requests")
            self.queue_title.setStyleSheet("font-weight: bold;")
            self.queue.setText("none waiting")

    def queue_lines(self) -> list[str]:
        text = self.queue.text()
        return [] if text == "none waiting" else text.splitlines()
