"""One person, several robots: the request queue and its allocation policy (issue 44, docs/fleet.md).

The session stays the arbiter of Engine.tick; with a fleet it asks ``FleetAllocator`` in ``decide`` which row's
request the person serves. Rows whose request waits in the queue pause (``wait: pause``) or hold; rows without a
request run on. The operator is shown only the served row's request (``allocate`` returns the handover states
the operator sees), and only the served row may take the person's hands (``hands``), so at most one robot is
under human control at a time. Requests expire by the handover machine's wait limit (``wait_timeout_s``), never
here.

Policies rank the queue:
- ``cur`` (C.U.R., Fleet-DAgger): constraint violations first (a request raised by a constraint or
  policy_failed gate), then uncertainty (the student's, now), then risk (the highest risk gate score, now),
  then waiting time;
- ``fcfs``: the request that came first;
- ``random``: a seeded draw.

Every decision is an event of the robot's episode (``take_events``: NOTE, source "fleet"): ``fleet:queued``
when a request joins the queue, ``fleet:allocated`` when the person takes it (queue length, rank, reason,
waited, policy, context switch), ``fleet:wait_flag`` when it waited past ``flag_wait_s``.

Headless, the person takes the top request as soon as they are free. At a console (``manual``) the person
chooses: ``pick(None)`` takes the top request, ``pick(row)`` any robot, one that has not asked included (a
pre-emption, kept until the person has driven it and let go, or picks another); the robot on their screen
(``selected``) is theirs whenever it asks while they serve nobody. ``ranked`` is the queue as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from hg_dagger.contract.model import StrictModel
from hg_dagger.control.handover import AUTO, HUMAN, REQUESTED

POLICIES = ("cur", "fcfs", "random")
CONSTRAINT_GATES = ("constraint", "policy_failed", "signal")  # gate types whose trip is a constraint violation
RISK_GATES = ("risk", "progress_eta")


class FleetConfig(StrictModel):
    """One person serves every env row of the run (``run --robots N``)."""

    allocation: Literal["cur", "fcfs", "random"] = Field(default="cur", description="how the request queue is ranked")
    flag_wait_s: float | None = Field(default=10.0, gt=0, description="a request that waited this long (control "
                                      "time) is flagged (fleet:wait_flag); None: never")
    seed: int = Field(default=0, description="the random policy's draws")


@dataclass
class Request:
    """One queued request's ranking inputs."""

    row: int
    order: int  # when it joined the queue (a counter: first come, first served)
    wait_s: float  # control time waited
    constraint: bool = False
    uncertainty: float = 0.0
    risk: float = 0.0


def rank(queue: list[Request], policy: str, rng: np.random.Generator) -> tuple[list[Request], str]:
    """The queue in the order the person takes it, and why the first is first."""
    if not queue:
        return [], ""
    if policy == "fcfs":
        return sorted(queue, key=lambda q: q.order), "first_come"
    if policy == "random":
        order = rng.permutation(len(queue))
        return [queue[i] for i in order], "random"
    ranked = sorted(queue, key=lambda q: (not q.constraint, -q.uncertainty, -q.risk, -q.wait_s, q.order))
    top = ranked[0]
    if len(ranked) == 1:
        return ranked, "only"
    nxt = ranked[1]
    if top.constraint != nxt.constraint:
        why = "constraint"
    elif top.uncertainty != nxt.uncertainty:
        why = "uncertainty"
    elif top.risk != nxt.risk:
        why = "risk"
    else:
        why = "wait"
    return ranked, why


def cur_inputs(gates, uncertainty: np.ndarray, row: int) -> tuple[bool, float, float]:
    """(constraint, uncertainty, risk) of ``row`` from the gate engine (control.gates.GateEngine): the gates that
    tripped its request, the student's uncertainty now, the highest risk-type gate score now."""
    tripped = (gates.trip[row].get("reason") or "").split("+")
    kinds = {g.name: getattr(g.spec, "type", "") for g in gates.gates}
    constraint = any(kinds.get(name) in CONSTRAINT_GATES for name in tripped)
    scores = gates.scores
    risk = max((float(scores[i, row]) for i, g in enumerate(gates.gates)
                if getattr(g.spec, "type", "") in RISK_GATES), default=0.0)
    return constraint, float(np.asarray(uncertainty)[row]), risk


@dataclass
class FleetStats:
    allocations: int = 0
    context_switches: int = 0  # allocations to another robot than the one served last
    flagged: int = 0
    queue_max: int = 0
    busy_ticks: int = 0  # ticks the person served a robot (from taking its request to its hand-back)
    waiting_row_ticks: int = 0  # row-ticks spent in the queue or waiting for the person
    ticks: int = 0
    per_robot: dict[int, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "per_robot"},
                "per_robot": {str(k): dict(v) for k, v in sorted(self.per_robot.items())}}


class FleetAllocator:
    """The request queue of one person serving ``n`` robots (see the module docstring)."""

    def __init__(self, cfg: FleetConfig, n: int, step_dt: float, *, manual: bool = False):
        self.cfg, self.n, self.step_dt = cfg, n, step_dt
        self.manual = manual  # the person picks (a console); False: the top request is taken when they are free
        self.selected = 0  # manual: the robot on the person's screen
        self.ranked: list[Request] = []  # manual: the queue in the order the person would take it, as of the last tick
        self._preempt = False  # manual: the served robot was taken before it asked and has not been driven yet
        self._draw: dict[int, float] = {}  # manual random policy: one draw per queued request (a stable order)
        self.rng = np.random.default_rng([int(cfg.seed), 44])
        self.serving: int | None = None
        self.last_served: int | None = None
        self._order: dict[int, int] = {}  # row -> its position in arrival order while it waits
        self._count = 0
        self._flagged: set[int] = set()
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self.stats = FleetStats()

    def _robot(self, r: int) -> dict[str, int]:
        return self.stats.per_robot.setdefault(r, {"allocations": 0, "wait_ticks": 0, "flagged": 0})

    def allocate(self, state: np.ndarray, wait_ticks: np.ndarray, inputs, active: np.ndarray | None = None
                 ) -> np.ndarray:
        """Update the queue from the handover states before this tick and return the states the operator sees:
        the served row as it is, every other waiting row as autonomous (the person is elsewhere).
        ``inputs(row)`` gives C.U.R.'s (constraint, uncertainty, risk) of a queued row; ``active`` the rows with an
        open episode (a row without one asks nobody, whatever its state says)."""
        st = self.stats
        st.ticks += 1
        waiting = state == REQUESTED
        if active is not None:
            waiting &= active
        if self.serving is not None and state[self.serving] == HUMAN:
            self._preempt = False
        if self.serving is not None and (state[self.serving] not in (REQUESTED, HUMAN) and not self._preempt
                                         or (active is not None and not active[self.serving])):
            self.last_served, self.serving = self.serving, None  # handed back, declined, expired or ended
            self._preempt = False
        for r in list(self._order):
            if not waiting[r]:
                del self._order[r]
                self._flagged.discard(r)
        queued = [int(r) for r in np.flatnonzero(waiting) if int(r) != self.serving]
        for r in queued:
            if r not in self._order:
                self._order[r] = self._count
                self._draw[r] = float(self.rng.random()) if self.manual else 0.0
                self._count += 1
                self._events.append((r, "fleet:queued", {"queue_length": len(queued), "policy": self.cfg.allocation,
                                                         "serving": self.serving}))
        st.waiting_row_ticks += int(waiting.sum())
        for row in np.flatnonzero(waiting):
            self._robot(int(row))["wait_ticks"] += 1
        if self.cfg.flag_wait_s is not None:
            for r in queued:
                if r not in self._flagged and wait_ticks[r] * self.step_dt >= self.cfg.flag_wait_s:
                    self._flagged.add(r)
                    st.flagged += 1
                    self._robot(r)["flagged"] += 1
                    self._events.append((r, "fleet:wait_flag", {"wait_s": float(wait_ticks[r] * self.step_dt),
                                                                "limit_s": self.cfg.flag_wait_s}))
        st.queue_max = max(st.queue_max, len(queued))
        if self.manual:
            self._rank_manual(queued, wait_ticks, inputs)
            if self.serving is None and self.selected in queued:  # the robot on their screen asks: theirs
                self._serve(self.selected, "selected")
        elif self.serving is None and queued:
            reqs = [Request(r, self._order[r], float(wait_ticks[r] * self.step_dt), *inputs(r)) for r in queued]
            ranked, why = rank(reqs, self.cfg.allocation, self.rng)
            top = ranked[0]
            self.serving = top.row
            del self._order[top.row]
            switch = self.last_served is not None and self.last_served != top.row
            st.allocations += 1
            st.context_switches += int(switch)
            self._robot(top.row)["allocations"] += 1
            self._events.append((top.row, "fleet:allocated", {
                "policy": self.cfg.allocation, "queue_length": len(queued), "rank": 1, "reason": why,
                "waited_s": top.wait_s, "constraint": top.constraint, "uncertainty": top.uncertainty,
                "risk": top.risk, "context_switch": switch, "previous_robot": self.last_served,
                "queue": [q.row for q in ranked]}))
        if self.serving is not None:
            st.busy_ticks += 1
        seen = state.copy()
        others = waiting.copy()
        if self.serving is not None:
            others[self.serving] = False
        seen[others] = AUTO
        return seen

    def _rank_manual(self, queued: list[int], wait_ticks: np.ndarray, inputs) -> None:
        reqs = [Request(r, self._order[r], float(wait_ticks[r] * self.step_dt), *inputs(r)) for r in queued]
        if self.cfg.allocation == "random":
            self.ranked = sorted(reqs, key=lambda q: self._draw.get(q.row, 0.0))
        else:
            self.ranked = rank(reqs, self.cfg.allocation, self.rng)[0]

    def _serve(self, row: int, why: str) -> None:
        """The person takes ``row`` (manual): recorded like an allocation, with its rank in the queue (0: it had
        not asked)."""
        ranked = self.ranked
        pos = next((i + 1 for i, q in enumerate(ranked) if q.row == row), 0)
        q = ranked[pos - 1] if pos else Request(row, -1, 0.0)
        prev = self.serving if self.serving is not None else self.last_served
        switch = prev is not None and prev != row
        if self.serving is not None:
            self.last_served = self.serving
        self.serving, self.selected = row, row
        self._preempt = pos == 0
        self._order.pop(row, None)
        self.ranked = [x for x in ranked if x.row != row]
        st = self.stats
        st.allocations += 1
        st.context_switches += int(switch)
        self._robot(row)["allocations"] += 1
        self._events.append((row, "fleet:allocated", {
            "policy": self.cfg.allocation, "queue_length": len(ranked), "rank": pos, "reason": why,
            "waited_s": q.wait_s, "constraint": q.constraint, "uncertainty": q.uncertainty, "risk": q.risk,
            "context_switch": switch, "previous_robot": prev, "queue": [x.row for x in ranked]}))

    def waiting(self) -> list[int]:
        """The queued robots in the order their requests came."""
        return sorted(self._order, key=self._order.__getitem__)

    def pick(self, row: int | None) -> int:
        """The person takes the top request (``None``) or robot ``row`` (manual; between ticks): the robot they
        now serve. A robot that has not asked is a pre-emption (rank 0, reason ``preempt``)."""
        if row is None:
            if not self.ranked:
                raise ValueError("no request waits in the queue")
            row, why = self.ranked[0].row, "top"
        else:
            if not 0 <= row < self.n:
                raise ValueError(f"no robot {row + 1}: the fleet has robots 1 to {self.n}")
            queued = [q.row for q in self.ranked]
            why = "preempt" if row not in queued else ("top" if queued[0] == row else "picked")
        if row != self.serving:
            self._serve(row, why)
        self.selected = row
        return row

    def hands(self, op):
        """The person has one pair of hands: commands, takeovers and declines of any row but the served one are
        dropped (an OperatorTick, changed in place unless read-only)."""
        keep = np.zeros(self.n, bool)
        if self.serving is not None:
            keep[self.serving] = True
        decline = op.decline
        if keep.all() or not ((op.engaged | op.takeover) & ~keep).any() and (decline is None or not (decline & ~keep).any()):
            return op
        return replace(op, engaged=op.engaged & keep, takeover=op.takeover & keep,
                       decline=None if decline is None else decline & keep)

    def take_events(self) -> list[tuple[int, str, dict[str, Any]]]:
        out, self._events = self._events, []
        return out


__all__ = ["CONSTRAINT_GATES", "FleetAllocator", "FleetConfig", "FleetStats", "POLICIES", "Request", "cur_inputs",
           "rank"]
