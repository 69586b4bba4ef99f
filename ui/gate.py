"""What the gates and the handover machine say, readable from across the room.

GateLight is a large coloured box naming the control state with the gate's reason; HandoverBanner
appears when the policy asks for a person, flashes, beeps once (optional) and counts the seconds since
the request until the person has taken over or the request is withdrawn.
"""

from __future__ import annotations

from PyQt6.QtCore import Qt, QTimer, pyqtSignal
from PyQt6.QtWidgets import QApplication, QFrame, QLabel, QVBoxLayout, QWidget

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.live import Snapshot
from hg_dagger.ui import style

HANDOVER_REQUESTED = "handover_requested"


class GateLight(QFrame):
    """A big state indicator: headline and colour from the control state, the gate reason beneath."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("gate_light")
        self.setMinimumHeight(90)
        self.headline = QLabel()
        self.headline.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.reason = QLabel()
        self.reason.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.reason.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addWidget(self.headline)
        lay.addWidget(self.reason)
        self.state = ""
        self.colour = ""
        self._reason_text = None
        self.set_state("autonomous", "")

    def show_snapshot(self, snap: Snapshot) -> None:
        if snap.phase in style.PHASES and snap.estop is None:
            self.set_state(snap.phase, snap.message)  # nothing is in control: say what the loop is doing
            return
        reason = snap.gate_reason
        if snap.estop is not None:
            reason = f"e-stop: {snap.estop[1]}" if snap.estop[1] else "e-stop latched"
        self.set_state(snap.control_state, reason)

    def set_state(self, state: str, reason: str) -> None:
        if state != self.state:
            self.state = state
            text, self.colour = style.state_style(state)
            self.headline.setText(text)
            self.setAccessibleName(f"control state: {text}")
            self.setStyleSheet(f"#gate_light {{ background-color: {self.colour}; border-radius: 10px; }} "
                               f"#gate_light QLabel {{ color: {style.TEXT_ON_COLOUR}; background: transparent; }}")
            self.headline.setStyleSheet("font-size: 26pt; font-weight: bold;")
            self.reason.setStyleSheet("font-size: 13pt;")
        if reason != self._reason_text:
            self._reason_text = reason
            self.reason.setText(reason or " ")


class HandoverBanner(QFrame):
    """"Take over! 1.4 s": visible only while a handover is requested; flashes two colours on a timer.

    ``alerted`` is emitted once per request (and the application beeps then, if ``sound_enabled``).
    """

    alerted = pyqtSignal()
    FLASH_MS = 300
    COLOURS = (style.HUMAN, "#5a2a00")

    def __init__(self, parent: QWidget | None = None, *, sound_enabled: bool = True):
        super().__init__(parent)
        self.setObjectName("handover_banner")
        self.sound_enabled = sound_enabled
        self.label = QLabel()
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.addWidget(self.label)
        self.flash = QTimer(self)
        self.flash.setInterval(self.FLASH_MS)
        self.flash.timeout.connect(self._tick)
        self.phase = 0  # which of COLOURS is on show
        self._t_request: int | None = None
        self._shown_since = 0
        self.active = False
        self.setVisible(False)

    @property
    def colour(self) -> str:
        return self.COLOURS[self.phase]

    def show_snapshot(self, snap: Snapshot) -> None:
        if snap.control_state == HANDOVER_REQUESTED and snap.estop is None:
            t_req = snap.t_request_ns
            if not self.active or (t_req is not None and t_req != self._t_request):
                self._begin(t_req)
            self._update_text()
        elif self.active:
            self._end()

    def elapsed_s(self) -> float:
        start = self._t_request if self._t_request is not None else self._shown_since
        return max(0.0, (now_ns() - start) / 1e9)

    def _begin(self, t_request: int | None) -> None:
        self._t_request = t_request
        self._shown_since = now_ns()
        self.active = True
        self.phase = 0
        self._paint()
        self.setVisible(True)
        self.flash.start()
        if self.sound_enabled:
            QApplication.beep()
        self.alerted.emit()

    def _end(self) -> None:
        self.active = False
        self.flash.stop()
        self.setVisible(False)

    def _tick(self) -> None:
        self.phase = 1 - self.phase
        self._paint()
        self._update_text()

    def _update_text(self) -> None:
        self.label.setText(f"Take over! {self.elapsed_s():.1f} s")

    def _paint(self) -> None:
        bg, fg = (self.COLOURS[0], "#1b1b1b") if self.phase == 0 else (self.COLOURS[1], style.TEXT_ON_COLOUR)
        self.setStyleSheet(f"#handover_banner {{ background-color: {bg}; border-radius: 10px; }} "
                           f"#handover_banner QLabel {{ color: {fg}; font-size: 28pt; font-weight: bold; "
                           "background: transparent; }")
