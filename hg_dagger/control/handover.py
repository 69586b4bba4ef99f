"""The handover state machine and the correction windows it produces.

AUTONOMOUS -> WARNING -> HANDOVER_REQUESTED -> HUMAN (or EXPERT) -> RETURNING -> AUTONOMOUS, and SAFE_STOP
from any state. One machine drives ``num_envs`` envs; per-env state lives in numpy arrays so the common
tick (nothing changes) costs a few vector operations.

Rules that live here:
- While waiting for the person the env runs the policy, holds position, or is paused (``wait``; ``auto``: pause a
  local simulator, hold a robot, resolved by ``resolve_wait``). A request ends only by the person taking over
  (answered), declining it (declined: the student goes on), the wait limit (expired; off by default) or the end of
  the episode (expired): each ending is one ``RequestEnd`` with the ticks waited.
- t_handover is the t_action_apply of the first step whose applied action carried the operator's command.
- Switches never jump: the applied action blends (or ramps) from the last applied action to the new source
  over ``transition_ticks``; blended steps carry StepFlag.INTERPOLATED, and blended human steps also
  INCOMPLETE_INPUT (the person's command was not applied in full, so they are not training labels). A blended
  hand-back step applied neither the operator's nor the policy's action: the session records it with source
  safety_controller (the controller's command) and INTERPOLATED, never as the policy's.
- Control returns to the policy on the operator's return button, on release of a hold-to-intervene device,
  or automatically once the policy agreed with the operator for ``agree_ticks`` ticks and the confidence
  gate is back below its clear threshold (ThriftyDAgger's rule).
- Losing the device while HUMAN holds (or stops) the robot in the same tick and closes the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import ActionSource, ControlState, EndReason, RecoveryOutcome, StepFlag
from hg_dagger.contract.model import StrictModel
from hg_dagger.contract.schema import CorrectionWindow, new_id

AUTO = ControlState.AUTONOMOUS.code
WARNING = ControlState.WARNING.code
REQUESTED = ControlState.HANDOVER_REQUESTED.code
HUMAN = ControlState.HUMAN.code
RETURNING = ControlState.RETURNING.code
SAFE_STOP = ControlState.SAFE_STOP.code
EXPERT = ControlState.EXPERT.code

SRC_POLICY = ActionSource.POLICY.code
SRC_HUMAN = ActionSource.HUMAN.code
SRC_EXPERT = ActionSource.EXPERT.code
SRC_HOLD = ActionSource.SAFETY_CONTROLLER.code  # hold position: the controller's own command

_EMPTY = np.zeros(0, np.int64)
_GATE_TRIGGER = 2
_GATE_WARN = 1


class AutoReturn(StrictModel):
    enabled: bool = True
    agree_ticks: int = Field(default=5, ge=1)
    agree_tol: float = Field(default=0.15, gt=0, description="largest per-dim |policy - operator| (raw units) that counts as agreement")
    require_confident: bool = True


class HandoverConfig(StrictModel):
    wait: Literal["auto", "pause", "hold", "policy"] = Field(
        default="hold", description="while a request waits for the person: pause the simulator (nothing is stepped "
        "or recorded), hold position (stepped and recorded; on a robot its clock runs), or keep the policy running; "
        "auto: pause a local simulator with one env driven by a person's device, else hold")
    transition: Literal["blend", "ramp", "none"] = "blend"
    transition_ticks: int = Field(default=3, ge=0, description="blend length; for ramp, the most ticks before it snaps")
    ramp_max_delta: float = Field(default=0.2, gt=0, description="ramp: largest change per tick and dim")
    return_on_release: bool = True
    auto_return: AutoReturn = Field(default_factory=AutoReturn)
    on_device_loss: Literal["hold", "stop"] = "hold"
    wait_timeout_s: float | None = Field(default=None, gt=0, description="the wait limit: a request nobody takes "
                                         "over within this much control time expires (None: it waits for the person)")
    on_wait_timeout: Literal["stop", "policy"] = Field(
        default="stop", description="what an expired request does: SAFE_STOP (the episode ends as a safety stop) or "
        "let the student go on, as a declined request does")
    context_before: int = Field(default=25, ge=0)
    context_after: int = Field(default=25, ge=0)


def resolve_wait(cfg: HandoverConfig, *, world_clock: str, num_envs: int, person: bool) -> HandoverConfig:
    """``wait: auto`` made concrete: a local simulator with one env, answered by a person at a device, pauses while
    a request waits (the world waits for the person); a robot (``world_clock`` "live") or a batch of envs holds
    position, and so does a scripted operator (its timing is in ticks, and one that never answers must not stop
    a headless run for good)."""
    if cfg.wait != "auto":
        return cfg
    wait = "pause" if world_clock != "live" and num_envs == 1 and person else "hold"
    return cfg.model_copy(update={"wait": wait})


@dataclass(frozen=True)
class RequestEnd:
    """How one handover request ended: ``outcome`` answered | declined | expired, ``why`` the cause
    (operator_engaged, declined, wait_limit, episode_end, estop), ``wait_ticks`` the ticks it waited (paused or
    not), ``t_request`` when it was made (monotonic ns), ``step`` the episode step it was made at."""

    row: int
    outcome: str
    why: str
    wait_ticks: int
    t_request: int
    step: int
    reason: str  # the gate (or device_lost) that asked

    def values(self, step_dt: float, t_ns: int) -> dict:
        wall = (t_ns - self.t_request) / 1e9 if self.t_request != NO_TIME else None
        return {"outcome": self.outcome, "wait_ticks": self.wait_ticks, "wait_s": self.wait_ticks * step_dt,
                "wait_wall_s": wall, "requested_step": self.step, "gate_reason": self.reason}


@dataclass
class TickInputs:
    step: np.ndarray  # int64 [N] step index in each env's episode
    t_ns: int
    gate_level: np.ndarray  # uint8 [N] from the gate engine
    engaged: np.ndarray  # bool [N] the operator is giving commands (device engaged / expert ready)
    device_ok: np.ndarray  # bool [N] the operator's device (or expert) answered this tick
    return_button: np.ndarray  # bool [N]
    agree: np.ndarray  # bool [N] policy action agrees with the operator's command this tick
    confident: np.ndarray  # bool [N] confidence gate back below its clear threshold
    estop: np.ndarray  # bool [N]
    gate_trip: list[dict] | None = None  # per row {"reason", "values"} of the last gate edge
    t_warn: np.ndarray | None = None
    t_gate: np.ndarray | None = None
    decline: np.ndarray | None = None  # bool [N] the person let the student go on (DeclineRequest)


@dataclass
class Decision:
    state: np.ndarray  # uint8 [N] ControlState codes in force for this tick's action
    source: np.ndarray  # uint8 [N] ActionSource code of the command to apply (SAFETY_CONTROLLER = hold)
    paused: np.ndarray  # bool [N] waiting with wait="pause"
    rearm: np.ndarray  # int64 rows whose gates must be re-armed (policy fully back)
    device_lost: np.ndarray  # bool [N] lost the device while in control this tick
    transitions: list[tuple[int, int, int, str]] = field(default_factory=list)  # (row, from, to, why)
    requests_ended: list[RequestEnd] = field(default_factory=list)


@dataclass
class _Open:
    parent_step: int
    reason: str
    t_warn: int
    t_gate: int
    source: ActionSource
    start: int = -1
    t_handover: int = NO_TIME
    end: int = -1
    t_return: int = NO_TIME
    cause: str = ""
    window_id: str = field(default_factory=new_id)

    def values(self, num_steps: int | None = None) -> dict:
        """The window as a WINDOW_CLOSED event's values (the CorrectionWindow ``finish`` will store)."""
        start = self.start if num_steps is None else min(self.start, num_steps)
        end = self.end if num_steps is None else max(start, min(self.end, num_steps))
        return {"window_id": self.window_id, "parent_step_id": min(self.parent_step, start),
                "handover_start": start, "handover_end": end, "source": self.source.value,
                "gate_reason": self.reason, "t_warn": self.t_warn, "t_gate": self.t_gate, "t_handover": self.t_handover,
                "t_return": self.t_return, "cause": self.cause}


class HandoverMachine:
    def __init__(self, config: HandoverConfig, *, num_envs: int, action_dim: int, step_dt: float,
                 operator: Literal["human", "expert"] = "human", operator_name: str = ""):
        self.cfg = config
        self.n, self.a = num_envs, action_dim
        self.step_dt = step_dt
        self.operator = operator
        self.operator_name = operator_name
        self._in_control = EXPERT if operator == "expert" else HUMAN
        self._src_operator = SRC_EXPERT if operator == "expert" else SRC_HUMAN
        self.state = np.full(num_envs, AUTO, np.uint8)
        self.wait_since = np.zeros(num_envs, np.int64)  # episode step the open request was made at
        self.wait_ticks = np.zeros(num_envs, np.int64)  # ticks the open request has waited (paused or not)
        self.t_request = np.full(num_envs, NO_TIME, np.int64)
        self.request_reason = [""] * num_envs  # the gate (or device_lost) that made the open request
        self.paused_ticks = np.zeros(num_envs, np.int64)  # ticks waited with the env paused (no step)
        self._ended: list[RequestEnd] = []  # requests ended outside update() (finish), handed out by take_requests
        self.agree_count = np.zeros(num_envs, np.int32)
        self.force_hold = np.zeros(num_envs, bool)
        self.trans_left = np.zeros(num_envs, np.int32)
        self.trans_total = np.zeros(num_envs, np.int32)
        self.trans_to_operator = np.zeros(num_envs, bool)
        self.anchor = np.zeros((num_envs, action_dim), np.float32)
        self._anchor_pending = np.zeros(num_envs, bool)
        self.open: list[_Open | None] = [None] * num_envs
        self.closed: list[list[_Open]] = [[] for _ in range(num_envs)]
        self.just_closed: list[tuple[int, _Open]] = []  # closed windows whose WINDOW_CLOSED event is not yet written
        self._apply_pending: list[tuple[int, _Open, str]] = []  # (row, window, "start"|"end") awaiting t_action_apply
        self._all_policy = np.full(num_envs, SRC_POLICY, np.uint8)
        self._no_rows = np.zeros(num_envs, bool)

    # ---- episode boundaries ----------------------------------------------------------------

    def reset(self, rows) -> None:
        """A new episode starts in these rows (after ``finish`` took the old one's windows)."""
        for r in np.asarray(rows, np.int64):
            self.state[r] = AUTO
            self.agree_count[r] = 0
            self.force_hold[r] = False
            self.trans_left[r] = 0
            self._anchor_pending[r] = False
            self.open[r] = None
            self.closed[r] = []

    def start_in_control(self, rows, *, step: int, t_ns: int, reason: str = "teleop") -> None:
        """Teleoperation: the operator holds control from ``step`` on, inside one window opened there."""
        for r in np.asarray(rows, np.int64):
            w = _Open(int(step), reason, int(t_ns), int(t_ns), self.open_source(), start=int(step))
            self.open[int(r)] = w
            self._apply_pending.append((int(r), w, "start"))
            self.state[int(r)] = self._in_control

    def request(self, rows, *, step: int, t_ns: int, reason: str) -> None:
        """A request no gate raised (a rewind): the rows wait for the operator from ``step``, as after a trigger."""
        for r in np.asarray(rows, np.int64).tolist():
            self.open[r] = _Open(int(step), reason, int(t_ns), int(t_ns), self.open_source())
            self._request(r, int(step), int(t_ns))
            self.state[r] = REQUESTED

    def in_correction(self, row: int) -> bool:
        w = self.open[row]
        return w is not None and w.start >= 0

    # ---- the tick --------------------------------------------------------------------------

    def update(self, x: TickInputs) -> Decision:
        if self._quiet(x):  # the common tick: the policy is in control everywhere and nothing asks for a change
            return Decision(self.state.copy(), self._all_policy.copy(), self._no_rows.copy(), _EMPTY, self._no_rows.copy(), [],
                            self.take_requests())
        st = self.state
        before = st.copy()
        transitions: list[tuple[int, int, int, str]] = []
        device_lost = np.zeros(self.n, bool)
        ended: list[RequestEnd] = self.take_requests()

        def go(r: int, to: int, why: str) -> None:
            if st[r] == REQUESTED and to != REQUESTED:
                outcome = {"operator_engaged": "answered", "declined": "declined"}.get(why, "expired")
                ended.append(self._request_end(r, outcome, "wait_limit" if why == "no_operator" else why))
            transitions.append((r, int(st[r]), to, why))
            st[r] = to

        # SAFE_STOP from any state
        for r in np.flatnonzero(x.estop & (st != SAFE_STOP)).tolist():
            self._close(int(r), x, "estop")
            go(int(r), SAFE_STOP, "estop")

        # policy in control: follow the gate level
        armed = (st == AUTO) | (st == WARNING)
        lvl = x.gate_level
        for r in np.flatnonzero(armed & (lvl >= _GATE_TRIGGER)).tolist():
            r = int(r)
            trip = (x.gate_trip[r] if x.gate_trip else None) or {}
            t_gate = int(x.t_gate[r]) if x.t_gate is not None else x.t_ns
            t_warn = int(x.t_warn[r]) if x.t_warn is not None else t_gate
            self.open[r] = _Open(int(x.step[r]), trip.get("reason", "gate"), t_warn, t_gate, self.open_source())
            self._request(r, int(x.step[r]), x.t_ns)
            go(r, REQUESTED, f"gate:{trip.get('reason', 'gate')}")
        warn_rows = armed & (lvl == _GATE_WARN) & (st == AUTO)
        ok_rows = armed & (lvl == 0) & (st == WARNING)
        for r in np.flatnonzero(warn_rows).tolist():
            go(int(r), WARNING, "gate_warning")
        for r in np.flatnonzero(ok_rows).tolist():
            go(int(r), AUTO, "gate_clear")

        # operator in control: device loss, return button / release, auto-return
        ctl = st == self._in_control
        ctl_old = ctl & (before == self._in_control)
        lost = ctl_old & ~x.device_ok
        for r in np.flatnonzero(lost).tolist():
            r = int(r)
            device_lost[r] = True
            self._close(r, x, "device_lost")
            if self.cfg.on_device_loss == "stop":
                go(r, SAFE_STOP, "device_lost")
            else:
                self.open[r] = _Open(int(x.step[r]), "device_lost", x.t_ns, x.t_ns, self.open_source())
                self._request(r, int(x.step[r]), x.t_ns)
                self.force_hold[r] = True
                go(r, REQUESTED, "device_lost")
        ar = self.cfg.auto_return
        good = x.agree & (x.confident if ar.require_confident else True)
        self.agree_count = np.where(ctl_old & good, self.agree_count + 1, 0).astype(np.int32)
        released = ~x.engaged if (self.cfg.return_on_release and self.operator == "human") else np.zeros(self.n, bool)
        want_back = ctl_old & ~lost & (x.return_button | released | (ar.enabled & (self.agree_count >= ar.agree_ticks)))
        for r in np.flatnonzero(want_back).tolist():
            r = int(r)
            why = "return_button" if x.return_button[r] else ("release" if released[r] else "auto_return")
            self._close(r, x, why)
            self.agree_count[r] = 0
            if self.cfg.transition != "none" and self.cfg.transition_ticks > 0:
                self._start_transition(r, to_operator=False)
                go(r, RETURNING, why)
            else:
                go(r, AUTO, why)

        # waiting for the operator (including rows that started waiting this tick)
        if x.decline is not None:  # the person lets the student go on: the request ends, nothing was corrected
            for r in np.flatnonzero((st == REQUESTED) & x.decline).tolist():
                r = int(r)
                self.open[r] = None
                self.force_hold[r] = False
                go(r, AUTO, "declined")
        waiting = st == REQUESTED
        take = waiting & x.engaged & x.device_ok
        take &= ~device_lost  # a device lost this tick cannot take over in the same tick
        for r in np.flatnonzero(take).tolist():
            r = int(r)
            w = self.open[r]
            assert w is not None  # a waiting row has its open request
            w.start = int(x.step[r])
            self._apply_pending.append((r, w, "start"))
            self.force_hold[r] = False
            self.agree_count[r] = 0
            if self.cfg.transition != "none" and self.cfg.transition_ticks > 0:
                self._start_transition(r, to_operator=True)
            go(r, self._in_control, "operator_engaged")
        still = (st == REQUESTED) & (before == REQUESTED)
        self.wait_ticks[still] += 1
        if self.cfg.wait == "pause":
            self.paused_ticks[still] += 1
        if self.cfg.wait_timeout_s is not None:
            late = (st == REQUESTED) & (self.wait_ticks * self.step_dt >= self.cfg.wait_timeout_s)
            for r in np.flatnonzero(late).tolist():
                r = int(r)
                self.open[r] = None
                self.force_hold[r] = False
                if self.cfg.on_wait_timeout == "policy":
                    go(r, AUTO, "no_operator")
                else:
                    go(r, SAFE_STOP, "no_operator")

        # a finished return blend hands over to the policy fully
        done = (before == RETURNING) & (st == RETURNING) & (self.trans_left <= 0)
        for r in np.flatnonzero(done).tolist():
            go(int(r), AUTO, "returned")
        rearm = np.array([r for r, f, t, _ in transitions if t == AUTO and f in (RETURNING, HUMAN, EXPERT, REQUESTED)],
                         np.int64)

        source = np.full(self.n, SRC_POLICY, np.uint8)
        source[st == self._in_control] = self._src_operator
        hold_wait = (st == REQUESTED) & (self.force_hold | (self.cfg.wait != "policy"))
        source[hold_wait | (st == SAFE_STOP) | device_lost] = SRC_HOLD
        # a lost device's own tick holds (recorded, flagged device_lost); after it the world waits like for any request
        paused = (st == REQUESTED) & ~device_lost & (self.cfg.wait == "pause")
        return Decision(st.copy(), source, paused, rearm, device_lost, transitions, ended)

    def _quiet(self, x: TickInputs) -> bool:
        return not (self.state.any() or x.gate_level.any() or x.estop.any() or self._ended)  # AUTO is code 0

    def _request(self, r: int, step: int, t_ns: int) -> None:
        w = self.open[r]
        self.request_reason[r] = w.reason if w is not None else ""
        self.wait_since[r] = step
        self.wait_ticks[r] = 0
        self.paused_ticks[r] = 0
        self.t_request[r] = t_ns

    def _request_end(self, r: int, outcome: str, why: str) -> RequestEnd:
        return RequestEnd(row=r, outcome=outcome, why=why, wait_ticks=int(self.wait_ticks[r]),
                          t_request=int(self.t_request[r]), step=int(self.wait_since[r]),
                          reason=self.request_reason[r])

    def take_requests(self) -> list[RequestEnd]:
        """Requests that ended outside ``update`` (their episode ended while they waited) and were not handed out."""
        out, self._ended = self._ended, []
        return out

    def waiting_s(self, row: int) -> float | None:
        """Control time the open request of ``row`` has waited (None without one)."""
        return float(self.wait_ticks[row] * self.step_dt) if self.state[row] == REQUESTED else None

    def open_source(self) -> ActionSource:
        return ActionSource.EXPERT if self.operator == "expert" else ActionSource.HUMAN

    # ---- smoothing at the switches ---------------------------------------------------------

    def _start_transition(self, r: int, *, to_operator: bool) -> None:
        self.trans_total[r] = self.trans_left[r] = self.cfg.transition_ticks
        self.trans_to_operator[r] = to_operator
        self._anchor_pending[r] = True

    def smooth(self, target: np.ndarray, prev_applied: np.ndarray, prev_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Blend or ramp rows that are switching source. Returns (command, step_flags uint16 [N])."""
        flags = np.zeros(self.n, np.uint16)
        rows = np.flatnonzero(self.trans_left > 0)
        if rows.size == 0:
            return target, flags
        out = target.copy()
        for r in rows:
            if self._anchor_pending[r]:
                self.anchor[r] = prev_applied[r] if prev_ok[r] else target[r]
                self._anchor_pending[r] = False
            if self.cfg.transition == "blend":
                i = self.trans_total[r] - self.trans_left[r] + 1
                alpha = i / (self.trans_total[r] + 1)
                out[r] = (1 - alpha) * self.anchor[r] + alpha * target[r]
                self.trans_left[r] -= 1
            else:  # ramp from the last applied action
                base = prev_applied[r] if prev_ok[r] else target[r]
                d = self.cfg.ramp_max_delta
                out[r] = base + np.clip(target[r] - base, -d, d)
                self.trans_left[r] -= 1
                if np.all(np.abs(target[r] - base) <= d):
                    self.trans_left[r] = 0
            if not np.array_equal(out[r], target[r]):
                flags[r] |= StepFlag.INTERPOLATED
                if self.trans_to_operator[r] and self.operator == "human":
                    flags[r] |= StepFlag.INCOMPLETE_INPUT
        return out, flags

    # ---- windows ---------------------------------------------------------------------------

    def _close(self, r: int, x: TickInputs, cause: str) -> None:
        w = self.open[r]
        self.open[r] = None
        self.trans_left[r] = 0
        if w is None or w.start < 0:
            return  # a request nobody took over: no correction happened (the gate event stays)
        w.end, w.cause = int(x.step[r]), cause
        self._apply_pending.append((r, w, "end"))
        self.closed[r].append(w)
        self.just_closed.append((r, w))

    def take_closed(self) -> list[tuple[int, _Open]]:
        """Windows closed since the last call, as (row, window); call after ``note_applied`` so t_return is set."""
        out, self.just_closed = self.just_closed, []
        return out

    def note_applied(self, t_action_apply: np.ndarray) -> None:
        """After env.step: stamp t_handover / t_return with the time the step's action was applied."""
        for r, w, which in self._apply_pending:
            if which == "start":
                w.t_handover = int(t_action_apply[r])
            else:
                w.t_return = int(t_action_apply[r])
        self._apply_pending.clear()

    def finish(self, row: int, *, episode_id: str, num_steps: int, success: bool, end_reason: EndReason
               ) -> tuple[list[CorrectionWindow], RecoveryOutcome]:
        """Close the episode in ``row``: its correction windows and the episode's recovery outcome."""
        w = self.open[row]
        if self.state[row] == REQUESTED:  # the episode ended while its request waited: it expired
            self._ended.append(self._request_end(row, "expired", "episode_end"))
        if w is not None and w.start >= 0:
            w.end, w.cause = num_steps, "episode_end"
            self.closed[row].append(w)
            self.just_closed.append((row, w))
        self.open[row] = None
        self._apply_pending = [p for p in self._apply_pending if p[0] != row]
        # the episode is over: nobody is asked for anything in this row until the next one begins (a row with no
        # next episode stays idle; an e-stop stays latched)
        if self.state[row] != SAFE_STOP:
            self.state[row] = AUTO
        self.agree_count[row] = 0
        self.force_hold[row] = False
        self.trans_left[row] = 0
        self._anchor_pending[row] = False
        out = []
        for w in self.closed[row]:
            start = min(w.start, num_steps)
            end = max(start, min(w.end, num_steps))
            out.append(CorrectionWindow(
                window_id=w.window_id, parent_episode_id=episode_id, parent_step_id=min(w.parent_step, start),
                handover_start=start,
                handover_end=end, source=w.source, gate_reason=w.reason, t_warn=w.t_warn, t_gate=w.t_gate,
                t_handover=w.t_handover, t_return=w.t_return, context_before=min(self.cfg.context_before, start),
                context_after=min(self.cfg.context_after, num_steps - end), operator=self.operator_name,
                outcome=_outcome(w.cause, success, end_reason)))
        self.closed[row] = []
        return out, (out[-1].outcome if out else RecoveryOutcome.NONE)


def _outcome(cause: str, success: bool, end_reason: EndReason) -> RecoveryOutcome:
    if cause == "estop" or end_reason == EndReason.SAFETY_STOP:
        return RecoveryOutcome.SAFETY_STOP
    if cause == "device_lost":
        return RecoveryOutcome.PARTIAL
    if success:
        return RecoveryOutcome.RECOVERY_SUCCESS
    if end_reason == EndReason.TIMEOUT:
        return RecoveryOutcome.TIMEOUT
    return RecoveryOutcome.FAILED_AGAIN
