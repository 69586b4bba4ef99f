"""Buttons that act on the session: the e-stop, the episode controls and the mode selector.

Every button only puts a Command into the queue; what is enabled follows the newest snapshot's phase.
Questions about an episode (discard, a verdict) are non-modal dialogs that name the episode and hold
new episodes back while open; the e-stop reset is a window-modal question. None runs a nested event
loop, so the view keeps drawing while they are up.
"""

from __future__ import annotations

from PyQt6.QtCore import Qt, pyqtSignal
from PyQt6.QtGui import QFont
from PyQt6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.contract.enums import SessionMode
from hg_dagger.control.live import (
    AbortEpisode,
    ClearEStop,
    CommandQueue,
    DiscardEpisode,
    EStop,
    FlagCorrection,
    HandBack,
    HoldStarts,
    MarkOutcome,
    Pause,
    ReconnectPolicy,
    ResetEpisode,
    Resume,
    SetMode,
    Snapshot,
    StartEpisodes,
    TakeOver,
    UndoDiscard,
)
from hg_dagger.ui import style
from hg_dagger.ui.keymap import ESTOP_KEY

MODE_LABELS = {SessionMode.HUMAN_GATED: "Human-gated", SessionMode.EXPERT: "Automatic expert",
               SessionMode.STUDENT_ONLY: "Student only", SessionMode.TELEOP: "Teleoperated demonstrations"}


class EStopPanel(QWidget):
    """A large red e-stop named with its key; while latched it says so in a line that fits, with the source
    and reason beneath (cut to the width, in full as tooltip), and a separate, confirmed "Reset e-stop"
    sends ClearEStop."""

    def __init__(self, commands: CommandQueue, parent: QWidget | None = None, *, operator: str = "operator"):
        super().__init__(parent)
        self.commands = commands
        self.operator = operator
        self.button = QPushButton(f"E-STOP ({ESTOP_KEY})")
        self.button.setObjectName("estop")
        self.button.setToolTip(f"Emergency stop ({ESTOP_KEY} in the console)")
        self.button.setMinimumSize(200, 48)
        self.button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.button.clicked.connect(self.stop)
        f = QFont(self.button.font())
        f.setPointSize(18)
        f.setBold(True)
        self.button.setFont(f)
        self.detail = QLabel()
        self.detail.setObjectName("estop_detail")
        self.detail.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.detail.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.reset = QPushButton("Reset e-stop...")
        self.reset.setObjectName("estop_reset")
        self.reset.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.reset.clicked.connect(self.ask_reset)
        for w in (self.detail, self.reset):
            keep = w.sizePolicy()
            keep.setRetainSizeWhenHidden(True)  # latching must not move the button
            w.setSizePolicy(keep)
            w.setVisible(False)
        self.confirm: QMessageBox | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.button, 1)
        lay.addWidget(self.detail)
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

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        full = self.detail.toolTip()
        text = self.detail.fontMetrics().elidedText(full, Qt.TextElideMode.ElideRight, max(20, self.detail.width() - 4))
        if self.detail.text() != text:
            self.detail.setText(text)

    def _paint(self) -> None:
        if self.latched is None:
            self.button.setText(f"E-STOP ({ESTOP_KEY})")
            self.detail.setToolTip("")
            bg = style.SAFETY
        else:
            source, reason = self.latched
            self.button.setText("E-STOP LATCHED")
            self.detail.setToolTip(f"{source}: {reason}" if reason else source)
            bg = "#8b1414"
        self._elide()
        self.button.setStyleSheet(f"QPushButton#estop {{ {style.filled(bg)} border: 3px solid #5c0000; }}")
        self.detail.setVisible(self.latched is not None)
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


def short_id(episode_id: str | None) -> str:
    """How an episode or window id is shown to people: its first 8 characters."""
    return (episode_id or "-")[:8]


class EpisodeDialog(QDialog):
    """A question about one episode (or window), named in the dialog and fixed when it opened, whatever
    runs meanwhile. Not modal: the banner, the e-stop and the take-over stay within reach while it is open.

    ``ask_reason``: a reason field that must not be empty. ``answered(dialog)`` fires on OK."""

    answered = pyqtSignal(object)

    def __init__(self, parent: QWidget, *, title: str, question: str, target: str, ok: str,
                 ask_reason: bool = False, reason: str = "", choices: tuple[str, ...] = (), after_end: bool = True):
        super().__init__(parent)
        self.setObjectName("episode_dialog")
        self.setWindowTitle(title)
        self.setWindowModality(Qt.WindowModality.NonModal)
        self.target = target  # the episode (or window) id this dialog is about
        self.after_end = after_end  # the answer still applies once the episode has ended (a discard does)
        self.question = question
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setStyleSheet(f"color: {style.NEUTRAL};")
        self.reason: QLineEdit | None = None
        self.choice: QComboBox | None = None
        lay = QVBoxLayout(self)
        lay.addWidget(self.text)
        if choices:
            self.choice = QComboBox()
            for c in choices:
                self.choice.addItem(short_id(c), c)
            self.choice.currentIndexChanged.connect(self._choice_changed)
            lay.addWidget(self.choice)
        if ask_reason:
            self.reason = QLineEdit(reason)
            self.reason.setPlaceholderText("why (required)")
            lay.addWidget(self.reason)
        lay.addWidget(self.note)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        assert ok_button is not None  # the box is made with its Ok button
        ok_button.setText(ok)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.setMinimumWidth(420)
        self._refresh_text()

    def _choice_changed(self, _i: int) -> None:
        assert self.choice is not None  # connected only where the choice is made
        self.target = self.choice.currentData()
        self._refresh_text()

    def _refresh_text(self, hint: str = "") -> None:
        self.text.setText(self.question.format(id=short_id(self.target)) + (f"\n\n{hint}" if hint else ""))
        self._fit()

    def _fit(self) -> None:
        """Grow to the height the wrapped text needs at this width (a window does not by itself): a hint or a
        note that appears after the dialog opened would otherwise clip the question."""
        lay = self.layout()
        assert lay is not None  # the dialog is made with its layout
        need = lay.totalHeightForWidth(self.width())
        if need > self.height():
            self.resize(self.width(), need)

    def set_running(self, running: bool) -> None:
        """Say so when the named episode has ended meanwhile: the answer still goes to it, or (a verdict) it
        would be refused, so OK is off."""
        if running:
            note = ""
        elif self.after_end:
            note = f"Episode {short_id(self.target)} has ended; the answer still goes to it."
        else:
            note = f"Episode {short_id(self.target)} has ended; its record stays as it ended."
        if self.note.text() != note:
            self.note.setText(note)
            self._fit()
        ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        assert ok_button is not None  # the box is made with its Ok button
        ok_button.setEnabled(running or self.after_end)

    @property
    def reason_text(self) -> str:
        return self.reason.text().strip() if self.reason is not None else ""

    def accept(self) -> None:
        if self.reason is not None and not self.reason_text:
            self._refresh_text("A reason is required.")
            self.reason.setFocus()
            return
        self.answered.emit(self)
        super().accept()


WAITS_FOR_OPERATOR = "the robot waits for the operator"  # the phase line while a request waits (the strip asks)
RESUME_TIP = "The robot holds because its link was lost: resume it once it is safe (recorded with your name)"


def _button(text: str, tip: str = "") -> QPushButton:
    b = QPushButton(text)
    b.setMinimumHeight(30)
    b.setToolTip(tip)
    b.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # keys stay the robot's, never click a button
    return b


class EpisodeControls(QGroupBox):
    """Start N episodes, pause/resume, reset, abort, mark success/failure, discard, take over/hand back,
    flag the last correction, undo a discard, and the mode for the next episode.

    Every per-episode action names the episode it acts on (the box's title and its dialog) and sends that
    id, captured when the button was pressed; while one of its dialogs is open new episodes wait
    (HoldStarts), so the episode it names stays the one on show."""

    def __init__(self, commands: CommandQueue, parent: QWidget | None = None):
        super().__init__("Episodes", parent)
        self.commands = commands
        self.count = QSpinBox()
        self.count.setRange(1, 100_000)
        self.count.setValue(1)
        self.count.setToolTip("How many episodes to run")
        self.start = _button("Start", "Start the episodes")
        self.pause = _button("Pause", "Pause the control loop (the robot holds still)")
        self.reset = _button("Reset", "End this episode as an env reset and begin a fresh one")
        self.abort = _button("Abort", "End this episode as an operator abort")
        self.success = _button("Mark success...", "Record this episode as a success (asks first)")
        self.failure = _button("Mark failure...", "Record this episode as a failure (asks first)")
        self.discard = _button("Discard...", "Keep this episode out of training (asks why; undo in this sitting)")
        self.flag = _button("Flag last correction...", "Your last correction was bad: send it to review as "
                            "rejected by you, never trained on")
        self.undo = _button("Undo discard...", "Make an episode you discarded in this sitting trainable again")
        self.take_over = _button("Take over", "Take control from the policy (T)")
        self.hand_back = _button("Hand back", "Give control back to the policy (Enter)")
        self.resume_robot = _button("Resume robot", RESUME_TIP)
        self.reconnect = _button("Reconnect policy", "The policy's server stopped answering: once it runs again, "
                                 "connect to it again (it acts from the next episode)")
        self.reconnect.setVisible(False)  # offered only while the policy is lost
        self.operator = "operator"  # who resumes a held robot is recorded
        self.take_over.setStyleSheet(f"QPushButton:enabled {{ color: {style.HUMAN}; font-weight: bold; }}")
        self.hand_back.setStyleSheet(f"QPushButton:enabled {{ color: {style.POLICY}; font-weight: bold; }}")
        self.mode = QComboBox()
        for value, label in MODE_LABELS.items():
            self.mode.addItem(label, value.value)
        self.mode.setToolTip("Takes effect at the next episode")
        self.mode.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.phase_label = QLabel()
        self.phase_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.dialogs: list[EpisodeDialog] = []  # open per-episode dialogs (they hold new episodes back)
        self.other_dialogs: list[EpisodeDialog] = []  # flag / undo: about a window or an old episode
        self.paused = False
        self.episode_id: str | None = None  # the episode on show (what a button press names)
        self.discard_target: str | None = None  # that one, or between episodes the one that just ended
        self.window_id: str | None = None  # the operator's latest correction window
        self.discarded: tuple[str, ...] = ()
        self._holding = False
        self.dialog_anchor: QWidget | None = None  # the widget whose top-left corner the dialogs open at

        self.start.clicked.connect(lambda: self.commands.put(StartEpisodes(self.count.value())))
        self.pause.clicked.connect(lambda: self.commands.put(Pause(not self.paused)))
        self.reset.clicked.connect(lambda: self.commands.put(ResetEpisode(episode_id=self.episode_id)))
        self.abort.clicked.connect(lambda: self.commands.put(AbortEpisode(episode_id=self.episode_id)))
        self.success.clicked.connect(lambda: self.ask_outcome(True))
        self.failure.clicked.connect(lambda: self.ask_outcome(False))
        self.discard.clicked.connect(self.ask_discard)
        self.flag.clicked.connect(self.ask_flag)
        self.undo.clicked.connect(self.ask_undo)
        self.take_over.clicked.connect(lambda: self.commands.put(TakeOver()))
        self.hand_back.clicked.connect(lambda: self.commands.put(HandBack()))
        self.resume_robot.clicked.connect(lambda: self.commands.put(Resume(by=self.operator)))
        self.reconnect.clicked.connect(lambda: self.commands.put(ReconnectPolicy()))
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
        grid.addWidget(self.undo, 2, 2)
        grid.addWidget(self.take_over, 3, 0)
        grid.addWidget(self.hand_back, 3, 1)
        grid.addWidget(self.flag, 3, 2)
        grid.addWidget(self.resume_robot, 4, 2)
        grid.addWidget(QLabel("Mode:"), 4, 0)
        grid.addWidget(self.mode, 4, 1)
        grid.addWidget(self.phase_label, 5, 0, 1, 2)
        grid.addWidget(self.reconnect, 5, 2)
        self.show_snapshot(Snapshot())

    def show_snapshot(self, snap: Snapshot) -> None:
        phase = snap.phase
        loading = snap.loading or phase == "loading"
        running, paused = phase == "running", phase == "paused"
        in_episode = snap.episode_id is not None and phase in ("running", "paused", "estopped") and not loading
        self.paused = paused
        self.episode_id = snap.episode_id if in_episode else None
        # between episodes Discard... is for the one that just ended (its dialog says so)
        ended = snap.ended_episode_id if not in_episode and phase in ("idle", "paused") and not loading else None
        self.discard_target = self.episode_id or ended
        self.window_id = snap.last_window_id
        self.discarded = tuple(snap.discarded_this_sitting)
        title = (f"Episode {short_id(snap.episode_id)}" if in_episode else
                 f"Episode {short_id(ended)} (ended)" if ended else "Episodes")
        if self.title() != title:
            self.setTitle(title)
        self.start.setEnabled(phase == "idle" and not loading)
        self.start.setText("Loading..." if loading else "Start")
        self.count.setEnabled(phase == "idle" and not loading)
        self.pause.setEnabled(running or paused)
        self.pause.setText("Resume" if paused else "Pause")
        self.reset.setEnabled(in_episode and phase != "estopped")
        for b in (self.abort, self.success, self.failure):
            b.setEnabled(in_episode)
        self.discard.setEnabled(self.discard_target is not None and self.discard_target not in self.discarded)
        self.flag.setEnabled(bool(self.window_id) and not loading)
        self.undo.setEnabled(bool(self.discarded) and not loading)
        can_take = running and in_episode and snap.mode in (SessionMode.HUMAN_GATED, SessionMode.TELEOP) and snap.control_state in (
            "autonomous", "warning", "handover_requested", "returning")
        self.take_over.setEnabled(can_take)
        self.hand_back.setEnabled(running and snap.control_state == "human")
        self.resume_robot.setEnabled(phase == "held")
        if self.reconnect.isVisible() != bool(snap.policy_lost):
            self.reconnect.setVisible(bool(snap.policy_lost))
        self.resume_robot.setToolTip(f"{RESUME_TIP}.\n{snap.message}" if phase == "held" and snap.message else RESUME_TIP)
        self.operator = snap.operator or self.operator
        i = self.mode.findData(snap.next_mode)  # what the person chose, before its episode begins too
        popup = self.mode.view()
        assert popup is not None  # a combo box always has its popup's view
        if i >= 0 and i != self.mode.currentIndex() and not popup.isVisible():
            self.mode.setCurrentIndex(i)
        self.mode.setEnabled(phase not in ("training", "stopped", "error") and not loading)
        text = "Phase: loading (Start waits until the session is ready)" if loading else f"Phase: {phase}"
        if running and snap.control_state == "handover_requested" and snap.estop is None and not loading:
            text += f" · {WAITS_FOR_OPERATOR}"
        if snap.starts_held and not loading:
            text += " · new episodes wait while a dialog is open"
        elif snap.next_start_in_s is not None and not loading:
            text += f" · {style.next_episode_words(snap.next_start_in_s)}"
        if snap.next_mode != snap.mode and not loading:
            text += f" · {MODE_LABELS.get(SessionMode(snap.next_mode), snap.next_mode)} from the next episode"
        if self.phase_label.text() != text:
            self.phase_label.setText(text)
        for d in self.dialogs:
            d.set_running(snap.episode_id == d.target and phase in ("running", "paused"))

    # ---- per-episode dialogs -----------------------------------------------------------------
    def _open(self, dlg: EpisodeDialog, *, holds: bool) -> EpisodeDialog:
        """Show ``dlg`` where ``dialog_anchor`` says (the window puts it over the plots: the banner, the view,
        the e-stop and these buttons stay in sight and in reach); per-episode ones hold new episodes back until
        the last of them closes."""
        group = self.dialogs if holds else self.other_dialogs
        group.append(dlg)
        dlg.finished.connect(lambda _r: self._closed(dlg))
        if holds and not self._holding:
            self._holding = True
            self.commands.put(HoldStarts(True))
        dlg.show()
        anchor = self.dialog_anchor if self.dialog_anchor is not None else self
        top = anchor.mapToGlobal(anchor.rect().topLeft())
        dlg.move(top.x() + 8, top.y() + 8)
        # typing goes to the question at once (a window manager may not focus a new window by itself); while a
        # request waits or the person drives, the window still routes the robot's keys (MainWindow's filter)
        dlg.raise_()
        dlg.activateWindow()
        if dlg.reason is not None:
            dlg.reason.setFocus()
        return dlg

    def _closed(self, dlg: EpisodeDialog) -> None:
        for group in (self.dialogs, self.other_dialogs):
            if dlg in group:
                group.remove(dlg)
        if self._holding and not self.dialogs:
            self._holding = False
            self.commands.put(HoldStarts(False))
        window = self.window()
        assert window is not None  # window() is this widget itself when it has no parent
        if not self.dialogs and not self.other_dialogs and window is not self and window.isVisible():
            # the keyboard goes back to the window that routes the robot's keys: a desktop without a window
            # manager leaves the focus on the closed dialog, and Space would take over nothing
            window.raise_()
            window.activateWindow()

    def ask_outcome(self, success: bool) -> EpisodeDialog | None:
        if self.episode_id is None:
            return None
        word = "success" if success else "failure"
        dlg = EpisodeDialog(self, title=f"Mark {word}", question=f"End episode {{id}} now as a {word}?",
                            target=self.episode_id, ok=f"Mark {word}", after_end=False)
        dlg.answered.connect(lambda d: self.commands.put(MarkOutcome(success, episode_id=d.target)))
        return self._open(dlg, holds=True)

    def ask_discard(self) -> EpisodeDialog | None:
        """Ask why; an empty reason is refused (the dialog stays open with a hint)."""
        if self.discard_target is None:
            return None
        dlg = EpisodeDialog(self, title="Discard episode", question="Why discard episode {id}?\n"
                            "It is kept on disk and never trained on; you can undo it in this sitting.",
                            target=self.discard_target, ok="Discard", ask_reason=True)
        dlg.answered.connect(lambda d: self.commands.put(DiscardEpisode(d.reason_text, episode_id=d.target)))
        return self._open(dlg, holds=True)

    def ask_flag(self) -> EpisodeDialog | None:
        if not self.window_id:
            return None
        dlg = EpisodeDialog(self, title="Flag correction", question="Flag your correction {id} as bad?\n"
                            "It goes to review as rejected by you and is never trained on.",
                            target=self.window_id, ok="Flag as bad", ask_reason=True, reason="flagged by the operator")
        dlg.answered.connect(lambda d: self.commands.put(FlagCorrection(d.target, d.reason_text)))
        return self._open(dlg, holds=False)

    def ask_undo(self) -> EpisodeDialog | None:
        if not self.discarded:
            return None
        newest_first = tuple(reversed(self.discarded))
        dlg = EpisodeDialog(self, title="Undo discard", question="Make episode {id} trainable again?",
                            target=newest_first[0], ok="Undo discard", choices=newest_first)
        dlg.answered.connect(lambda d: self.commands.put(UndoDiscard(d.target)))
        return self._open(dlg, holds=False)
