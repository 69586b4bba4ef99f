"""The session's front-end controls: what an app, a script or a test calls between ticks (e-stop, resume, decline,
take-over buttons, per-episode verdicts, operator, student, mode and device changes). Mixed into
control.session.Session, whose state they read and change; call them from the thread that ticks."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hg_dagger import safety_log
from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.enums import (
    EndReason,
    EventKind,
    SessionMode,
)
from hg_dagger.control.handover import (
    REQUESTED,
)
from hg_dagger.control.live import DeviceState
from hg_dagger.control.operators import DeviceOperator, Operator
from hg_dagger.control.session_state import SessionState
from hg_dagger.devices import make_device
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.experts import make_expert

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

BUTTONS = ("takeover", "return")


class SessionControls(SessionState):
    """Controls of a Session (control.session); the state they use is the session's."""

    def estop(self, source: str = "app", reason: str = "") -> None:
        """Emergency stop from the keyboard, the app's button or any other thread."""
        self.safety.request_estop(source, reason)

    def clear_estop(self, by: str) -> None:
        """The explicit reset a latched e-stop needs before ``start`` works again; recorded with who did it."""
        if not self.safety.estopped:
            return
        note = f"estop cleared by {by}"
        rows = [r for r in range(self.n) if self.eids[r] is not None]
        for r in rows:
            self._event(r, EventKind.NOTE, now_ns(), note, by)
        if not rows:
            self.summary.notes.append(note)
            safety_log.note(note, by)
        self.safety.clear_estop()
        self.summary.stopped_by = ""

    def resume(self, by: str) -> None:
        """The explicit action a robot hold needs (the app's resume button): the robot resumes and every open
        episode records who resumed it. A hold is never lifted by the session itself."""
        if not self.robot_hold:
            return
        robot_resume = getattr(self.env, "resume", None)
        if robot_resume is not None:
            robot_resume(by=by)
        values = {"resumed_by": by, "after": self.robot_hold}
        rows = [r for r in range(self.n) if self.eids[r] is not None]
        for r in rows:
            self._event(r, EventKind.NOTE, now_ns(), f"robot resumed by {by}", "operator", values)
        if not rows:
            self.summary.notes.append(f"robot resumed by {by}")
            safety_log.note(f"robot resumed by {by} (after: {self.robot_hold})", by)
        self.robot_hold = ""

    def decline(self) -> bool:
        """The person lets the student go on: every waiting request ends as declined on the next tick. False
        (and nothing happens) when no request waits."""
        if not ((self.machine.state == REQUESTED) & self.writer.active()).any():
            return False
        self._decline = True
        return True

    def hold_starts(self, hold: bool) -> None:
        """While held, episodes queued to begin wait (a running one goes on); released, they begin when due."""
        self.starts_held = bool(hold)

    def press(self, button: str) -> None:
        """The app's take-over / hand-back buttons: count as that operator button on the next tick."""
        if button not in BUTTONS:
            raise HgDaggerError(f"unknown operator button {button!r}: expected one of {', '.join(BUTTONS)}")
        self._pressed.add(button)

    def end_episode(self, row: int, reason: EndReason, success: bool) -> None:
        """End ``row``'s episode now (operator abort, verdict, reset) and begin the next one if any remain."""
        self._end_now(row, EndReason(reason), bool(success))

    def stop_row(self, row: int, by: str) -> None:
        """One robot's e-stop (a fleet's, the others run on): its episode ends as a safety stop with a NOTE naming
        who stopped it, and the row stays where it is, not stepped and with no new episode, until ``clear_row``
        or a fresh ``start``."""
        if row in self.stopped_rows:
            return
        self.stopped_rows.add(row)
        if self.eids[row] is not None:  # the event reaches the incident file too
            self._event(row, EventKind.NOTE, now_ns(), f"e-stop of robot {row + 1}", by, {"robot": row, "estop": True})
            self._end(row, EndReason.SAFETY_STOP, False)
        else:
            safety_log.note(f"e-stop of robot {row + 1}", by)
        self._queued.pop(row, None)

    def clear_row(self, row: int, by: str) -> None:
        """The explicit reset a row's e-stop needs; its next episode begins at once if the run wants more."""
        if row not in self.stopped_rows:
            raise HgDaggerError(f"robot {row + 1} is not e-stopped")
        self.stopped_rows.discard(row)
        safety_log.note(f"e-stop of robot {row + 1} cleared by {by}", by)
        if self.running and self.eids[row] is None and self._target > self._started + len(self._queued):
            self._queued[row] = now_ns()

    def discard_episode(self, row: int, reason: str, *, final: bool = True) -> str:
        """End ``row``'s episode as an operator abort, discarded: kept on disk, never trainable. ``final``: the
        quality flag "discarded" (no undo); otherwise the caller keeps it out of training with a label layer
        (control.store_actions, undoable). Returns the episode id."""
        eid = self.eids[row]
        if eid is None:
            raise HgDaggerError(f"no open episode in env row {row} to discard")
        self._event(row, EventKind.NOTE, now_ns(), reason or "discarded", "operator",
                    {"discarded": True, "undoable": not final})
        self._end_now(row, EndReason.OPERATOR_ABORT, False, flags=["discarded"] if final else None)
        return eid

    def close_all(self, reason: str) -> None:
        """Stop without losing data: every open episode ends as an operator abort; no new one begins."""
        self._target = self._started
        self._queued.clear()
        t = now_ns()
        for r in range(self.n):
            if self.eids[r] is not None:
                self._event(r, EventKind.NOTE, t, reason, "operator")
                self._end(r, EndReason.OPERATOR_ABORT, False)

    def add_episodes(self, episodes: int) -> None:
        """Record ``episodes`` more while running (rows pick them up as their episodes end)."""
        self._target += int(episodes)

    def set_operator(self, operator: Operator) -> None:
        """Who answers from the next episode begin on (the mode decides whether gates ask it)."""
        if operator.n != self.n:
            raise ConfigError(f"the operator answers {operator.n} envs, the env has {self.n}")
        if operator.role == "human":
            self._pending["person"] = operator
        self._pending["operator"] = operator

    def set_student(self, student) -> None:
        """Act with ``student`` from the next episode begin on; its policy_version goes in EpisodeStart."""
        self._pending["student"] = student

    @property
    def next_mode(self) -> SessionMode:
        """The mode the next episode begins in: a mode set now waits for that begin."""
        return SessionMode(self._pending.get("mode", self.mode))

    def set_mode(self, mode: str) -> None:
        """A SessionMode (or its value), from the next episode begin on."""
        try:
            mode = SessionMode(mode)
        except ValueError:
            raise HgDaggerError(f"unknown mode {mode!r}: expected one of {', '.join(SessionMode)}") from None
        if mode == SessionMode.EXPERT and self.expert is None:
            self.expert = make_expert(self.mapping.task_id, kind="planner", mapping=self.mapping)
        self._pending["mode"] = mode

    def set_device(self, name: str) -> None:
        """Switch the person's device (a name in configs/devices or a path) from the next episode on."""
        if self.n != 1:
            raise HgDaggerError(f"a live device drives one env; the env has {self.n}")
        dev = make_device(name)
        dev.connect()
        self.set_operator(DeviceOperator([dev], self.mapping, self.operator.name))

    def key(self, key: str, down: bool) -> None:
        """A key event from the app's window, for the in-window keyboard device."""
        person = self._pending.get("person", self._person)
        if person is not None:
            person.key(key, down)

    def release_keys(self) -> None:
        person = self._pending.get("person", self._person)
        if person is not None:
            person.release_keys()

    def poll_idle(self) -> None:
        """Between episodes: keep the device live for the operator's panel; its e-stop button still stops."""
        t = (self._pending.get("operator") or self.operator).poll_idle()
        if t.estop_by:
            self.safety.request_estop(t.estop_by, "device e-stop button")

    def device_state(self):
        return DeviceState(**(self._pending.get("operator") or self.operator).device_state(0))

    def close_operators(self) -> None:
        seen = set()
        for op in (self.operator, self._person, self._pending.get("operator"), self._pending.get("person")):
            if op is not None and id(op) not in seen:
                seen.add(id(op))
                op.close()
