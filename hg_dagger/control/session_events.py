"""The session's events: each goes to its row's open episode (and the incident file); handover transitions,
requests that ended, closed correction windows, device connects and losses. Mixed into control.session.Session,
whose state they read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hg_dagger import safety_log
from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.enums import ControlState, EventKind
from hg_dagger.contract.schema import Event
from hg_dagger.control.handover import EXPERT, HUMAN, SAFE_STOP, RequestEnd
from hg_dagger.control.session_state import SessionState

if TYPE_CHECKING:
    pass


class SessionEvents(SessionState):
    """Events of a Session (control.session); the state they use is the session's."""

    def _request_events(self, ended: list[RequestEnd], t_ns: int) -> None:
        """One REQUEST_END event per request that ended: how (answered, declined, expired) and how long it waited."""
        for e in ended:
            if self.eids[e.row] is None:
                continue
            values = e.values(self.mapping.dt, t_ns)
            self._event(e.row, EventKind.REQUEST_END, t_ns, e.why, "handover", values)
            field_name = f"requests_{e.outcome}"
            setattr(self.summary, field_name, getattr(self.summary, field_name) + 1)

    def _window_events(self, t_apply: np.ndarray | None, num_steps: int | None = None) -> None:
        """Each window as it closes becomes a WINDOW_CLOSED event: a run killed before the episode's commit still
        leaves its corrections' bounds and ids in the log (auditable, never trainable)."""
        for r, w in self.machine.take_closed():
            eid = self.eids[r]
            if eid is None:
                continue
            if self.machine.operator == "human":
                self.last_window_id = w.window_id
                self.window_episode[w.window_id] = eid
            values = w.values(num_steps)
            t_ns = w.t_return if w.t_return != NO_TIME else (int(t_apply[r]) if t_apply is not None else now_ns())
            self.writer.event(r, Event(kind=EventKind.WINDOW_CLOSED, step=values["handover_end"], t_ns=int(t_ns),
                                       reason=w.cause, source="handover",
                                       values={**values, "operator": self.machine.operator_name}))

    def _event(self, r: int, kind: EventKind, t_ns: int, reason: str = "", source: str = "",
               values: dict[str, Any] | None = None) -> None:
        self.writer.event(r, Event(kind=kind, step=int(self.ep_step[r]), t_ns=int(t_ns), reason=reason,
                                   source=source, values=values or {}))
        safety_log.event(kind, r, int(self.ep_step[r]), reason, source, values, self.eids[r])  # the incident file

    def _device_events(self, device_ok: np.ndarray, t_ns: int) -> None:
        changed: list[int] | np.ndarray = [] if device_ok is self._prev_device_ok else np.flatnonzero(device_ok != self._prev_device_ok)
        for r in changed:  # nothing changed when the operator handed out its shared read-only idle answer again
            r = int(r)
            kind = EventKind.DEVICE_CONNECT if device_ok[r] else EventKind.DEVICE_DISCONNECT
            self._event(r, kind, t_ns, source=self.operator.device_id(r),
                        values={"control_state": ControlState.from_code(int(self.machine.state[r])).value})
        frozen = not device_ok.flags.writeable and device_ok.base is None  # its own data, write-protected: kept
        self._prev_device_ok = device_ok if frozen else device_ok.copy()

    def _transition_events(self, d, t_ns: int) -> None:
        in_control = (HUMAN, EXPERT)
        kind = self.operator.kind
        for r, frm, to, why in d.transitions:
            if self.eids[r] is None:
                continue
            if to in in_control:  # who took control (after a lost device: who resumed)
                self.summary.context_switches += 1
                self._event(r, EventKind.HANDOVER_START, t_ns, why, kind,
                            {"operator": self.operator.name, "device": self.operator.device_id(r)})
            if frm in in_control:
                self._event(r, EventKind.HANDOVER_END, t_ns, why, kind)
                self.operator.release(r)
            if to == SAFE_STOP:
                ev = EventKind.ESTOP if why == "estop" else EventKind.NOTE
                src = self.safety.estop_source if why == "estop" else "handover"
                self._event(r, ev, t_ns, why if why != "estop" else (self.safety.estop_reason or "estop"), src,
                            {"from_state": ControlState.from_code(frm).value})
