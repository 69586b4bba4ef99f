"""What the gates and the handover machine say, readable from across the room.

GateLight is a large coloured box naming the control state with the gate's reason; HandoverBanner
is the strip that asks for the person: it flashes when a gate asks, beeps once (optional), counts the
seconds the request has waited and says how to take over; it says "you are in control" while the person
drives. Both keep one size whatever they say, so the console never moves under the mouse.
"""

from __future__ import annotations

from PyQt6.QtCore import Qt, QTimer, pyqtSignal
from PyQt6.QtGui import QFont, QFontMetrics
from PyQt6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.gate_types import operator_words
from hg_dagger.control.live import Snapshot
from hg_dagger.ui import style
from hg_dagger.ui.keymap import DECLINE_KEY, REWIND_S, handback_hint, takeover_hint, task_key_rows
from hg_dagger.ui.keys import typing_in_dialog

HANDOVER_REQUESTED = "handover_requested"


class GateLight(QFrame):
    """A big state indicator: headline and colour from the control state, the gate reason beneath."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("gate_light")
        self.headline = QLabel()
        self.headline.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.reason = QLabel()
        self.reason.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.reason.setWordWrap(True)
        for lab, pt in ((self.headline, 22), (self.reason, 12)):
            f = QFont(lab.font())
            f.setPointSize(pt)
            f.setBold(lab is self.headline)
            lab.setFont(f)
            lab.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.reason.setWordWrap(False)
        self.headline.setFixedHeight(QFontMetrics(self.headline.font()).height())
        self.reason.setFixedHeight(QFontMetrics(self.reason.font()).height())  # one line; cut, in full as tooltip
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.setSpacing(0)
        lay.addWidget(self.headline)
        lay.addWidget(self.reason)
        self.setFixedHeight(self.headline.height() + self.reason.height() + 8)
        self.state = ""
        self.colour = ""
        self._reason_text: str | None = None
        self.set_state("autonomous", "")

    def show_snapshot(self, snap: Snapshot) -> None:
        if snap.loading and snap.estop is None:
            self.set_state("loading", snap.message or "building the session: Start waits until it is ready")
            return
        if snap.phase in style.PHASES and snap.estop is None:
            self.set_state(snap.phase, snap.message)  # nothing is in control: say what the loop is doing
            return
        if snap.phase == "running" and snap.episode_id is None and snap.estop is None:
            wait = snap.next_start_in_s  # the watched row's last episode ended: nothing is in control there either
            self.set_state("between", style.next_episode_words(wait) if wait else "the next episode is starting")
            return
        reason = gate_words(snap.gate_reason)
        if snap.estop is not None:
            reason = f"e-stop: {snap.estop[1]}" if snap.estop[1] else "e-stop latched"
        headline = None
        if snap.control_state == "human" and snap.device.kind in ("synthetic", "expert"):
            headline = f"{snap.device.kind.upper()} OPERATOR IN CONTROL"  # not the person at the console
        self.set_state(snap.control_state, reason, headline)

    def set_state(self, state: str, reason: str, headline: str | None = None) -> None:
        text, colour = style.state_style(state)
        text = headline or text
        if state != self.state or text != self.headline.text():
            self.state = state
            self.colour = colour
            self.headline.setText(text)
            self.setAccessibleName(f"control state: {text}")
            self.setStyleSheet(f"#gate_light {{ background-color: {self.colour}; border-radius: 10px; }} "
                               f"#gate_light QLabel {{ color: {style.TEXT_ON_COLOUR}; background: transparent; }}")
        if reason != self._reason_text:
            self._reason_text = reason
            self.reason.setToolTip(reason)
            self._elide()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        """One line of reason, cut to the width (the whole of it is the tooltip)."""
        full = self._reason_text or " "
        text = self.reason.fontMetrics().elidedText(full, Qt.TextElideMode.ElideRight, max(40, self.reason.width() - 8))
        if self.reason.text() != text:
            self.reason.setText(text)


REQUEST_WORDS = {  # requests that no gate raised, in a person's words
    "rewind": "you went back to before the request: correct from here",
    "device_lost": "the device was lost while you were in control",
}


def gate_words(reason: str) -> str:
    """'confidence+progress_stall' -> 'the student is unsure here; no progress for a while (confidence,
    progress_stall)': the words are each gate type's own (gate_types.GATES, a plugin's included); a gate named in a
    config of one's own reads as its name."""
    names = [n for n in reason.split("+") if n]
    words = [REQUEST_WORDS.get(n) or operator_words(n) for n in names]
    if not any(words):
        return reason
    return f"{'; '.join(w or n for w, n in zip(words, names, strict=True))} ({', '.join(names)})"


class HandoverBanner(QFrame):
    """The strip above the console that asks for the person: always there, the same height whatever it says,
    so nothing in the window moves when a gate fires.

    Three looks: calm (nothing asked; a quiet line says where requests appear), request ("TAKE OVER!",
    flashing magenta, with the wait time, how to take over with the chosen device and a button to let the
    student go on), and human ("YOU ARE IN CONTROL", steady orange, how to hand back). ``alerted`` is
    emitted once per request (and the application beeps then, if ``sound_enabled``); ``declined`` when the
    person lets the student go on from the button.
    """

    alerted = pyqtSignal()
    declined = pyqtSignal()
    rewound = pyqtSignal()
    FLASH_MS = 300
    COLOURS = (style.REQUEST, style.REQUEST_DARK)
    HEADLINE_PT = 20
    HINT_PT = 11

    def __init__(self, parent: QWidget | None = None, *, sound_enabled: bool = True):
        super().__init__(parent)
        self.setObjectName("handover_banner")
        self.sound_enabled = sound_enabled
        self.label = QLabel()
        self.label.setObjectName("banner_headline")
        self.hint = QLabel()
        self.hint.setObjectName("banner_hint")
        for lab in (self.label, self.hint):
            lab.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
            lab.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)  # long text never widens it
        self.decline = QPushButton(f"Let the student go on ({DECLINE_KEY.upper()})")
        self.decline.setObjectName("decline")
        self.decline.setToolTip("Decline this request: the student keeps driving (the gate may ask again later)")
        self.decline.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.decline.clicked.connect(self.declined)
        self.rewind = QPushButton(f"Rewind {REWIND_S:g} s (Backspace)")
        self.rewind.setObjectName("rewind")
        self.rewind.setToolTip(f"Go back {REWIND_S:g} s before this request and correct from there (a new episode "
                               "branched from this one; the simulator waits for you)")
        self.rewind.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.rewind.clicked.connect(self.rewound)
        self.rewindable = False  # the snapshot says whether the session can rewind (a simulator that replays)
        for button in (self.decline, self.rewind):
            keep = button.sizePolicy()
            keep.setRetainSizeWhenHidden(True)  # hiding it must not move the text either
            button.setSizePolicy(keep)
        text = QVBoxLayout()
        text.setSpacing(0)
        text.addWidget(self.label)
        text.addWidget(self.hint)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(12, 4, 12, 4)
        lay.addLayout(text, 1)
        lay.addWidget(self.rewind)
        lay.addWidget(self.decline)
        self._fonts()
        self.flash = QTimer(self)
        self.flash.setInterval(self.FLASH_MS)
        self.flash.timeout.connect(self._tick)
        self.phase = 0  # which of COLOURS is on show
        self._t_request: int | None = None
        self._shown_since = 0
        self._wait_s: float | None = None
        self.active = False  # a request is on show
        self.look = ""  # calm | request | human
        self.device_kind = "keyboard"
        self._keymap: tuple[str, str] = ("", "")
        self.keys_text = ""  # the task's key map in one line ("W / S shoulder_vel · A / D elbow_vel")
        self.keymap_task = ""
        self._set_look("calm")

    def _fonts(self) -> None:
        """Fonts fixed here (not in the stylesheet), so the height reserved below fits them exactly."""
        for lab, pt in ((self.label, self.HEADLINE_PT), (self.hint, self.HINT_PT)):
            f = QFont(lab.font())
            f.setPointSize(pt)
            f.setBold(lab is self.label)
            lab.setFont(f)
            lab.setFixedHeight(QFontMetrics(f).height() + 2)
        lay = self.layout()
        assert lay is not None  # the banner is made with its layout
        m = lay.contentsMargins()
        self.setFixedHeight(self.label.height() + self.hint.height() + m.top() + m.bottom() + 4)

    @property
    def colour(self) -> str:
        return self.COLOURS[self.phase]

    def show_snapshot(self, snap: Snapshot) -> None:
        self.device_kind = snap.device.kind or self.device_kind
        if snap.rewindable != self.rewindable:
            self.rewindable = snap.rewindable
            self.rewind.setVisible(self.look == "request" and self.rewindable)
        if (snap.task, self.device_kind) != self._keymap:
            self._set_keymap(snap.task, self.device_kind)
        if snap.control_state == HANDOVER_REQUESTED and snap.estop is None:
            t_req = snap.t_request_ns
            self._wait_s = snap.request_wait_s
            if not self.active or (t_req is not None and t_req != self._t_request):
                self._begin(t_req)
            self._update_text()
            return
        if self.active:
            self._end()
        if snap.control_state == "human" and snap.estop is None and snap.phase == "running":
            self._set_look("human")
        else:
            self._set_look("calm", snap)

    def _set_keymap(self, task: str, kind: str) -> None:
        self._keymap = (task, kind)
        try:
            rows = task_key_rows(task, kind) if task else []
        except Exception:  # an unknown task config: the banner still asks, without the key map
            rows = []
        self.keys_text = "   ·   ".join(f"{r.control}: {r.action}" for r in rows if r.control != "-")
        self.keymap_task = task
        self.look = ""  # repaint the text with the new key map

    def elapsed_s(self) -> float:
        """How long the request has waited: the control loop's figure when it sends one (the simulator may
        be paused meanwhile), else the time since the request was stamped."""
        if self._wait_s is not None:
            return max(0.0, float(self._wait_s))
        start = self._t_request if self._t_request is not None else self._shown_since
        return max(0.0, (now_ns() - start) / 1e9)

    def _begin(self, t_request: int | None) -> None:
        self._t_request = t_request
        self._shown_since = now_ns()
        self.active = True
        self.phase = 0
        self._set_look("request")
        self.flash.start()
        if self.sound_enabled:
            QApplication.beep()
        self.alerted.emit()

    def _end(self) -> None:
        self.active = False
        self._wait_s = None
        self.flash.stop()

    def _tick(self) -> None:
        self.phase = 1 - self.phase
        self._paint()
        self._update_text()

    def _update_text(self) -> None:
        if self.look == "request":
            self._text(f"TAKE OVER!   waiting {self.elapsed_s():.1f} s", self._request_hint())

    def _request_hint(self) -> str:
        how = takeover_hint(self.device_kind)
        if not how:
            return f"the {self.device_kind or 'automatic'} operator answers   ·   {DECLINE_KEY.upper()}: let the student go on"
        window = self.window()
        assert window is not None  # window() is this widget itself when it has no parent
        if self.device_kind == "keyboard" and typing_in_dialog(window):
            return f"typing in a dialog: Tab out of the field, then {how} to take control   ·   " \
                "the robot holds while it waits"
        back = f"Backspace: rewind {REWIND_S:g} s   ·   " if self.rewindable else ""
        return (f"{how} to take control   ·   {DECLINE_KEY.upper()} or the button: let the student go on   ·   {back}"
                "the robot holds while it waits")

    def _set_look(self, look: str, snap: Snapshot | None = None) -> None:
        if look == "calm":
            loading = snap is not None and (snap.loading or snap.phase == "loading")
            how = takeover_hint(self.device_kind)
            keys = f"{how} to steer   ·   {self.keys_text}" if how and self.keys_text else ""
            if loading:
                self._text("Loading...", "building the simulator and the student: Start waits until they are ready")
            else:
                self._text("A request for you appears here",
                           keys or "the student drives; when a gate asks for you, this strip says how to take over")
        elif look == "human" and look != self.look:
            back = handback_hint(self.device_kind)
            steer = f"steer: {self.keys_text}" if self.keys_text else "steer the robot"
            # how to hand back first: a narrow window cuts the end of the line, and the keys are in the Device tab
            self._text("YOU ARE IN CONTROL", f"{back} to hand back   ·   {steer}" if back else steer)
        if look == self.look:
            return
        self.look = look
        self.decline.setVisible(look == "request")
        self.rewind.setVisible(look == "request" and self.rewindable)
        self._paint()

    def _text(self, headline: str, hint: str) -> None:
        if self.label.text() != headline:
            self.label.setText(headline)
        if self.hint.text() != hint:
            self.hint.setText(hint)

    def _paint(self) -> None:
        if self.look == "request":
            bg, fg = (self.COLOURS[0], style.TEXT_ON_COLOUR) if self.phase == 0 else (self.COLOURS[1], "#ffd6e8")
            border = "#ffffff"
        elif self.look == "human":
            bg, fg, border = style.HUMAN, "#1b1b1b", style.HUMAN
        else:
            bg, fg, border = style.CALM, style.NEUTRAL, style.CALM
        self.setAccessibleName(f"handover banner: {self.look}")
        self.setStyleSheet(f"#handover_banner {{ background-color: {bg}; border-radius: 10px; "
                           f"border: 3px solid {border}; }} "
                           f"#handover_banner QLabel {{ color: {fg}; background: transparent; }}")
