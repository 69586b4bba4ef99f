"""Buttons that act on the session: the e-stop, the episode controls and the mode selector.

Every button only puts a Command into the queue; what is enabled follows the newest snapshot's phase.
Questions to the operator (discard reason, e-stop reset) are window-modal dialogs opened without a
nested event loop, so the view keeps drawing while they are up.
"""

from __future__ import annotations

from PyQt6.QtCore import Qt
from PyQt6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.control.live import (
    AbortEpisode,
    ClearEStop,
    CommandQueue,
    DiscardEpisode,
    EStop,
    HandBack,
    MarkOutcome,
    Pause,
    ResetEpisode,
    Resume,
    SetMode,
    Snapshot,
    StartEpisodes,
    TakeOver,
)
from hg_dagger.ui import style

MODES = (("human_gated", "Human-gated"), ("expert", "Automatic expert"), ("student_only", "Student only"),
         ("teleop", "Teleoperated demonstrations"))


class EStopPanel(QWidget):
    """A large red e-stop; while latched it names the source and reason, and a separate, confirmed
    "Reset e-stop" sends ClearEStop."""

    def __init__(self, commands: CommandQueue, parent: QWidget | None = None, *, operator: str = "operator"):
        super().__init__(parent)
        self.commands = commands
        self.operator = operator
        self.button = QPushButton("E-STOP")
        self.button.setObjectName("estop")
        self.button.setToolTip("Emergency stop (Esc)")
        self.button.setMinimumSize(200, 80)
        self.button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.button.clicked.connect(self.stop)
        self.reset = QPushButton("Reset e-stop...")
        self.reset.setObjectName("estop_reset")
        self.reset.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.reset.clicked.connect(self.ask_reset)
        self.reset.setVisible(False)
        self.confirm: QMessageBox | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.button, 1)
        lay.addWidget(self.reset)
        self.latched: tuple[str, str] | None = None
        self._paint()

    def stop(self) -> None:
        self.commands.put(EStop(source="app", reason="e-stop button"))

    def show_snapshot(self, snap: Snapshot) -> None:
        if snap.operator:
            self.operator = snap.operator  # who clears a latched e-stop is recorded
        if snap.estop != self.latched:
            self.latched = snap.estop
            self._paint()
            if self.latched is None and self.confirm is not None:
                self.confirm.close()

    def _paint(self) -> None:
        if self.latched is None:
            self.button.setText("E-STOP")
            bg = style.SAFETY
        else:
            source, reason = self.latched
            self.button.setText(f"E-STOP LATCHED ({source}: {reason})")
            bg = "#8b1414"
        self.button.setStyleSheet(f"QPushButton#estop {{ {style.filled(bg, pt=18)} border: 3px solid #5c0000; }}")
        self.reset.setVisible(self.latched is not None)

    def ask_reset(self) -> None:
        """Ask before clearing: the operator confirms the cause is dealt with."""
        if self.latched is None:
            return
        box = QMessageBox(QMessageBox.Icon.Warning, "Reset e-stop",
                          f"The e-stop was latched by {self.latched[0]}: {self.latched[1]}.\n\n"
                          "Is the robot and its surroundings safe to resume?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, self)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda result: self._answered(box, result))
        self.confirm = box
        box.open()

    def _answered(self, box: QMessageBox, result: int) -> None:
        if self.confirm is box:
            self.confirm = None
        if box.standardButton(box.clickedButton()) == QMessageBox.StandardButton.Yes:
            self.commands.put(ClearEStop(by=self.operator or "operator"))


RESUME_TIP = "The robot holds because its link was lost: resume it once it is safe (recorded with your name)"


def _button(text: str, tip: str = "") -> QPushButton:
    b = QPushButton(text)
    b.setMinimumHeight(36)
    b.setToolTip(tip)
    b.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # keys stay the robot's, never click a button
    return b


class EpisodeControls(QGroupBox):
    """Start N episodes, pause/resume, reset, abort, mark success/failure, discard, take over/hand back,
    and the mode for the next episode."""

    def __init__(self, commands: CommandQueue, parent: QWidget | None = None):
        super().__init__("Episodes", parent)
        self.commands = commands
        self.count = QSpinBox()
        self.count.setRange(1, 100_000)
        self.count.setValue(1)
        self.count.setToolTip("How many episodes to run")
        self.start = _button("Start", "Start the episodes")
        self.pause = _button("Pause", "Pause the control loop (the robot holds still)")
        self.reset = _button("Reset", "End the episode as an env reset and begin a fresh one")
        self.abort = _button("Abort", "End the episode as an operator abort")
        self.success = _button("Mark success", "End the episode now as a success")
        self.failure = _button("Mark failure", "End the episode now as a failure")
        self.discard = _button("Discard...", "End the episode and keep it out of training (asks why)")
        self.take_over = _button("Take over", "Take control from the policy (T)")
        self.hand_back = _button("Hand back", "Give control back to the policy (Enter)")
        self.resume_robot = _button("Resume robot", RESUME_TIP)
        self.operator = "operator"  # who resumes a held robot is recorded
        self.take_over.setStyleSheet(f"QPushButton:enabled {{ color: {style.HUMAN}; font-weight: bold; }}")
        self.hand_back.setStyleSheet(f"QPushButton:enabled {{ color: {style.POLICY}; font-weight: bold; }}")
        self.mode = QComboBox()
        for value, label in MODES:
            self.mode.addItem(label, value)
        self.mode.setToolTip("Takes effect at the next episode")
        self.mode.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.phase_label = QLabel()
        self.discard_dialog: QInputDialog | None = None
        self.paused = False

        self.start.clicked.connect(lambda: self.commands.put(StartEpisodes(self.count.value())))
        self.pause.clicked.connect(lambda: self.commands.put(Pause(not self.paused)))
        self.reset.clicked.connect(lambda: self.commands.put(ResetEpisode()))
        self.abort.clicked.connect(lambda: self.commands.put(AbortEpisode()))
        self.success.clicked.connect(lambda: self.commands.put(MarkOutcome(True)))
        self.failure.clicked.connect(lambda: self.commands.put(MarkOutcome(False)))
        self.discard.clicked.connect(self.ask_discard)
        self.take_over.clicked.connect(lambda: self.commands.put(TakeOver()))
        self.hand_back.clicked.connect(lambda: self.commands.put(HandBack()))
        self.resume_robot.clicked.connect(lambda: self.commands.put(Resume(by=self.operator)))
        self.mode.activated.connect(lambda i: self.commands.put(SetMode(self.mode.itemData(i))))

        grid = QGridLayout(self)
        row0 = QHBoxLayout()
        row0.addWidget(self.start)
        row0.addWidget(self.count)
        row0.addWidget(self.pause)
        grid.addLayout(row0, 0, 0, 1, 3)
        for i, b in enumerate((self.reset, self.abort, self.discard)):
            grid.addWidget(b, 1, i)
        grid.addWidget(self.success, 2, 0)
        grid.addWidget(self.failure, 2, 1)
        grid.addWidget(self.take_over, 3, 0)
        grid.addWidget(self.hand_back, 3, 1)
        grid.addWidget(self.resume_robot, 3, 2)
        grid.addWidget(QLabel("Mode:"), 4, 0)
        grid.addWidget(self.mode, 4, 1, 1, 2)
        grid.addWidget(self.phase_label, 5, 0, 1, 3)
        self.show_snapshot(Snapshot())

    def show_snapshot(self, snap: Snapshot) -> None:
        phase = snap.phase
        running, paused = phase == "running", phase == "paused"
        in_episode = snap.episode_id is not None and phase in ("running", "paused", "estopped")
        self.paused = paused
        self.start.setEnabled(phase == "idle")
        self.count.setEnabled(phase == "idle")
        self.pause.setEnabled(running or paused)
        self.pause.setText("Resume" if paused else "Pause")
        self.reset.setEnabled(in_episode and phase != "estopped")
        for b in (self.abort, self.discard, self.success, self.failure):
            b.setEnabled(in_episode)
        can_take = running and snap.mode in ("human_gated", "teleop") and snap.control_state in (
            "autonomous", "warning", "handover_requested", "returning")
        self.take_over.setEnabled(can_take)
        self.hand_back.setEnabled(running and snap.control_state == "human")
        self.resume_robot.setEnabled(phase == "held")
        self.resume_robot.setToolTip(f"{RESUME_TIP}.\n{snap.message}" if phase == "held" and snap.message else RESUME_TIP)
        self.operator = snap.operator or self.operator
        i = self.mode.findData(snap.mode)
        if i >= 0 and i != self.mode.currentIndex() and not self.mode.view().isVisible():
            self.mode.setCurrentIndex(i)
        self.mode.setEnabled(phase not in ("training", "stopped", "error"))
        self.phase_label.setText(f"Phase: {phase}")

    def ask_discard(self) -> None:
        """Ask why; an empty reason is refused (the dialog stays open with a hint)."""
        dlg = QInputDialog(self)
        dlg.setWindowTitle("Discard episode")
        dlg.setLabelText("Why discard this episode? (kept on disk, never trained on)")
        dlg.setWindowModality(Qt.WindowModality.WindowModal)
        dlg.setOption(QInputDialog.InputDialogOption.UsePlainTextEditForTextInput, False)
        dlg.accepted.connect(lambda: self._discard_answered(dlg))
        dlg.rejected.connect(lambda: self._forget(dlg))
        self.discard_dialog = dlg
        dlg.open()

    def _forget(self, dlg: QInputDialog) -> None:
        if self.discard_dialog is dlg:
            self.discard_dialog = None

    def _discard_answered(self, dlg: QInputDialog) -> None:
        reason = dlg.textValue().strip()
        if not reason:
            dlg.setLabelText("A reason is required to discard an episode. Why discard it?")
            dlg.open()
            return
        self._forget(dlg)
        self.commands.put(DiscardEpisode(reason))
