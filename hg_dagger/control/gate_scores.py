"""What each gate scores: one scorer per gate type turns a tick's inputs (GateInputs) into a per-env score
(higher = worse) and, on a rising edge, the values that explain it. The engine (gates) applies the level logic.
The shipped gate types are registered at the bottom (gate_types.GATES: spec, scorer, grace, the operator's words)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hg_dagger.control.gate_specs import (
    ConfidenceGate,
    ConstraintGate,
    OperatorGate,
    PolicyFailedGate,
    ProgressEtaGate,
    ProgressStallGate,
    RiskGate,
    SignalGate,
)
from hg_dagger.control.gate_types import GATES, GateType
from hg_dagger.control.limits import CompiledLimits
from hg_dagger.control.risk_model import RiskModel
from hg_dagger.errors import ConfigError


@dataclass
class GateInputs:
    """What the gates see at one tick (all batched over envs)."""

    step: np.ndarray  # int64 [N] step index within each env's episode
    t_ns: int  # tick time (monotonic ns)
    action: np.ndarray  # float32 [N, A] the policy's proposed raw action
    uncertainty: np.ndarray  # float32 [N] ensemble disagreement (NaN = none)
    obs: dict[str, np.ndarray]
    signals: dict[str, np.ndarray] = field(default_factory=dict)
    takeover: np.ndarray | None = None  # bool [N] operator takeover
    prev_applied: np.ndarray | None = None  # float32 [N, A] last applied action
    prev_ok: np.ndarray | None = None  # bool [N] prev_applied is from this episode
    succeeding: np.ndarray | None = None  # bool [N] the task's success condition held after the last step
    steps_left: np.ndarray | None = None  # int64 [N] steps each episode has left before its cut (None: no limit)



class GateScorer:
    def __init__(self, spec, num_envs: int, step_dt: float, action_dim: int):
        self.spec = spec
        self.name = spec.name
        self.n = num_envs
        self.step_dt = step_dt
        self.warn = spec.warn
        self.trigger = spec.trigger

    def reset(self, rows: np.ndarray) -> None:
        """Forget per-env history (new episode, or control handed back to the policy)."""

    def score(self, inp: GateInputs, armed: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def values(self, row: int, inp: GateInputs) -> dict[str, Any]:
        return {}


class ConfidenceScorer(GateScorer):
    def __init__(self, spec: ConfidenceGate, *a):
        super().__init__(spec, *a)
        cal = spec.calibration
        self.recent = np.empty(cal.window if cal else 0, np.float32)
        self.recent_n = 0  # total samples seen; ring position = recent_n % window

    def score(self, inp, armed):
        u = np.asarray(inp.uncertainty, np.float32)
        return np.where(np.isfinite(u), u, 0.0).astype(np.float32)

    def values(self, row, inp):
        return {"uncertainty": float(inp.uncertainty[row])}

    def observe(self, u: np.ndarray) -> None:
        if self.recent.size == 0:
            return
        u = u[np.isfinite(u)][-self.recent.size :]
        pos = self.recent_n % self.recent.size
        first = min(len(u), self.recent.size - pos)
        self.recent[pos : pos + first] = u[:first]
        self.recent[: len(u) - first] = u[first:]
        self.recent_n += len(u)



class RiskScorer(GateScorer):
    def __init__(self, spec: RiskGate, *a):
        super().__init__(spec, *a)
        self.model = RiskModel.load(spec.model) if spec.model else None
        self.last = np.zeros(self.n, np.float32)

    def score(self, inp, armed):
        if self.model is None:
            return np.zeros(self.n, np.float32)
        self.last = self.model.predict(inp.obs)
        return self.last

    def values(self, row, inp):
        return {"risk": float(self.last[row])}


class StallScorer(GateScorer):
    def __init__(self, spec: ProgressStallGate, *a):
        super().__init__(spec, *a)
        self.best = np.full(self.n, np.nan, np.float64)
        self.best_step = np.zeros(self.n, np.int64)

    def reset(self, rows):
        self.best[rows] = np.nan

    def score(self, inp, armed):
        p = inp.signals.get(self.spec.signal)
        if p is None:
            return np.zeros(self.n, np.float32)
        p = np.asarray(p, np.float64)
        fresh = armed & np.isfinite(p) & ~np.isfinite(self.best)
        better = armed & np.isfinite(p) & np.isfinite(self.best) & (p > self.best + self.spec.min_delta)
        upd = fresh | better
        if inp.succeeding is not None:
            upd |= armed & np.isfinite(p) & np.asarray(inp.succeeding, bool)
        self.best[upd] = np.fmax(self.best[upd], p[upd])
        self.best_step[upd] = inp.step[upd]
        stalled = np.where(np.isfinite(self.best), (inp.step - self.best_step) * self.step_dt, 0.0)
        return stalled.astype(np.float32)

    def values(self, row, inp):
        return {"progress": float(np.asarray(inp.signals[self.spec.signal])[row]), "best_progress": float(self.best[row]),
                "best_step": int(self.best_step[row]), "stalled_s": float((inp.step[row] - self.best_step[row]) * self.step_dt)}


class EtaScorer(GateScorer):
    """Keeps each row's last ``window_s`` seconds of the signal (a ring over ticks) to measure its pace, and with
    a calibration the signal's value at each success onset (the goal is learned from those alone)."""

    def __init__(self, spec: ProgressEtaGate, *a):
        super().__init__(spec, *a)
        self.width = max(1, round(spec.window_s / self.step_dt))
        self.ring = np.zeros((self.width + 1, self.n), np.float64)
        self.seen = np.zeros(self.n, np.int64)  # ticks recorded since the row's last reset
        self.pace = np.zeros(self.n, np.float64)  # signal units per second over the window (for values)
        cal = spec.calibration
        self.onsets = np.empty(cal.window if cal else 0, np.float64)  # the signal where successes began
        self.onsets_n = 0
        self.was_succeeding = np.zeros(self.n, bool)
        self.goal = spec.goal  # in force: the configured goal until enough successes were seen

    def reset(self, rows):
        self.seen[rows] = 0

    def _learn_goal(self, p: np.ndarray, succeeding: np.ndarray | None) -> None:
        cal = self.spec.calibration
        if cal is None or succeeding is None:
            return
        now = np.asarray(succeeding, bool)
        onset = np.flatnonzero(now & ~self.was_succeeding & np.isfinite(p))
        self.was_succeeding = now.copy()
        for row in onset:
            self.onsets[self.onsets_n % self.onsets.size] = p[row]
            self.onsets_n += 1
        if onset.size and self.onsets_n >= cal.min_successes:
            self.goal = float(np.quantile(self.onsets[: min(self.onsets_n, self.onsets.size)], cal.quantile))

    def calibration_state(self) -> dict[str, Any]:
        """The goal in force and where it came from (for the gate config recorded with episodes)."""
        cal = self.spec.calibration
        learned = cal is not None and self.onsets_n >= cal.min_successes
        return {"goal": self.goal, "goal_source": "successes" if learned else "config", "successes": self.onsets_n}

    def score(self, inp, armed):
        out = np.zeros(self.n, np.float32)
        p = inp.signals.get(self.spec.signal)
        if p is None:
            return out
        p = np.asarray(p, np.float64)
        self._learn_goal(p, inp.succeeding)
        if inp.steps_left is None:
            return out
        slot = self.seen % (self.width + 1)
        ok = np.isfinite(p)
        self.ring[slot[ok], np.flatnonzero(ok)] = p[ok]
        self.seen[ok] += 1
        full = self.seen > self.width
        oldest = self.ring[self.seen % (self.width + 1), np.arange(self.n)]
        self.pace = np.where(full, (p - oldest) / (self.width * self.step_dt), 0.0)
        if self.goal is None:  # nothing learned yet and nothing configured: quiet
            return out
        left_s = np.asarray(inp.steps_left, np.float64) * self.step_dt
        remaining = self.goal - p
        rows = full & ok & (remaining > 0) & (left_s > 0)
        if inp.succeeding is not None:  # the task's own success condition holds: done, whatever the signal says
            rows &= ~np.asarray(inp.succeeding, bool)
        need = np.where(self.pace > 0, remaining / np.where(self.pace > 0, self.pace, 1.0), np.inf)
        ratio = np.minimum(need / np.where(left_s > 0, left_s, 1.0), self.spec.cap)
        out[rows] = ratio[rows]
        return out

    def values(self, row, inp):
        p = float(np.asarray(inp.signals[self.spec.signal])[row])
        return {"progress": p, "goal": self.goal, "pace_per_s": float(self.pace[row]),
                "seconds_left": float(np.asarray(inp.steps_left)[row] * self.step_dt)}


class ConstraintScorer(GateScorer):
    def __init__(self, spec: ConstraintGate, num_envs, step_dt, action_dim):
        super().__init__(spec, num_envs, step_dt, action_dim)
        try:
            spec.limits.check_dim(action_dim, where=f"gate {spec.name!r}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.limits = CompiledLimits(spec.limits, action_dim)

    def score(self, inp, armed):
        return self.limits.usage(inp.action, inp.prev_applied, inp.prev_ok, inp.obs)

    def values(self, row, inp):
        return self.limits.explain(row, inp.action, inp.prev_applied, inp.prev_ok, inp.obs)


class SignalScorer(GateScorer):
    def score(self, inp, armed):
        s = inp.signals.get(self.spec.signal)
        if s is None:
            return np.zeros(self.n, np.float32)
        s = np.asarray(s, np.float32)
        return np.where(np.isfinite(s), s, 0.0).astype(np.float32)

    def values(self, row, inp):
        return {self.spec.signal: float(np.asarray(inp.signals[self.spec.signal])[row])}


class PolicyFailedScorer(GateScorer):
    def __init__(self, spec: PolicyFailedGate, *a):
        super().__init__(spec, *a)
        self.best = np.full(self.n, np.nan, np.float64)

    def reset(self, rows):
        self.best[rows] = np.nan

    def score(self, inp, armed):
        out = np.zeros(self.n, np.float32)
        s = inp.signals.get(self.spec.signal)
        if s is not None:
            out = np.maximum(out, np.nan_to_num(np.asarray(s, np.float32)))
        p = inp.signals.get(self.spec.progress_signal) if self.spec.max_regression else None
        if p is not None:
            p = np.asarray(p, np.float64)
            upd = armed & np.isfinite(p) & ~(p <= self.best)  # NaN best or better
            self.best[upd] = p[upd]
            fell = np.isfinite(p) & (self.best - p > self.spec.max_regression)
            out = np.maximum(out, fell.astype(np.float32))
        return out

    def values(self, row, inp):
        v: dict[str, Any] = {}
        if self.spec.signal in inp.signals:
            v[self.spec.signal] = float(np.asarray(inp.signals[self.spec.signal])[row])
        if self.spec.max_regression and self.spec.progress_signal in inp.signals:
            v["progress"] = float(np.asarray(inp.signals[self.spec.progress_signal])[row])
            v["best_progress"] = float(self.best[row])
        return v


class OperatorScorer(GateScorer):
    def score(self, inp, armed):
        if inp.takeover is None:
            return np.zeros(self.n, np.float32)
        return np.asarray(inp.takeover, np.float32)

    def values(self, row, inp):
        return {"takeover": True}


# Gates that predict trouble wait out the grace after a reset or a hand-back (grace=True); the gates that see it
# (constraint, signal, policy_failed) and the operator's own takeover are never delayed.
GATES.register("confidence", GateType(ConfidenceGate, ConfidenceScorer, grace=True,
                                      words="the student is unsure here"))
GATES.register("risk", GateType(RiskGate, RiskScorer, grace=True, words="a failure looks likely"))
GATES.register("progress_stall", GateType(ProgressStallGate, StallScorer, grace=True, words="no progress for a while"))
GATES.register("progress_eta", GateType(ProgressEtaGate, EtaScorer, grace=True, words="too slow to finish in time"))
GATES.register("constraint", GateType(ConstraintGate, ConstraintScorer, words="a command near a limit"))
GATES.register("signal", GateType(SignalGate, SignalScorer, named_words={"collision": "a collision is close",
                                                                         "object_drop": "the object was dropped"}))
GATES.register("policy_failed", GateType(PolicyFailedGate, PolicyFailedScorer, words="the task is going backwards"))
GATES.register("operator", GateType(OperatorGate, OperatorScorer, words="you asked for control"))
