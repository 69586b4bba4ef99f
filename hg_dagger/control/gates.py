"""The gate engine: pluggable gates that ask for a person when failure looks likely.

Each gate turns one tick's inputs into a per-env *score* (higher = worse). The engine applies the
same level logic to every gate: a warning threshold below the trigger threshold, hysteresis (a level
is left only when the score falls ``hysteresis`` x threshold below it) and debounce (a rise must hold
for ``debounce_ticks`` ticks). The engine's level per env is the highest gate level; rising edges
become GATE_WARNING / GATE_TRIGGER events that carry the reason, t_warn, t_gate and the values that
tripped it. Gates are configured per task and scene in YAML (configs/gates/, kind: gates; the specs in gate_specs),
scored in gate_scores and calibrated by the quantile rule of gate_thresholds; each type is one record of
gate_types.GATES.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import EventKind
from hg_dagger.contract.schema import Event
from hg_dagger.control.gate_scores import ConfidenceScorer, GateInputs, GateScorer
from hg_dagger.control.gate_specs import GateConfig, OperatorGate
from hg_dagger.control.gate_thresholds import CalibrationRefused, quantile_thresholds
from hg_dagger.control.gate_types import gate_type
from hg_dagger.errors import ConfigError

OK, WARN, TRIGGER = 0, 1, 2


@dataclass
class GateOutput:
    level: np.ndarray  # uint8 [N] OK / WARN / TRIGGER (0 for unarmed envs)
    warned: np.ndarray  # int64 rows whose level rose to WARN or above this tick
    triggered: np.ndarray  # int64 rows whose level rose to TRIGGER this tick
    events: list[tuple[int, Event]]  # (env row, event) for the rising edges



_NO_ROWS = np.zeros(0, np.int64)
_NO_ROWS.flags.writeable = False


def _steps(seconds: float, step_dt: float) -> int:
    return int(np.ceil(seconds / step_dt - 1e-9)) if seconds > 0 and step_dt > 0 else 0



# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


class GateEngine:
    """Runs every enabled gate each tick, batched over ``num_envs``; only *armed* envs (the policy in
    control) change level. Cheap on the hot path: per-gate numpy work, Python only on rising edges."""

    def __init__(self, config: GateConfig, *, num_envs: int, step_dt: float, action_dim: int):
        self.config = config
        self.n = num_envs
        specs = [g for g in config.gates if g.enabled]
        if not any(g.type == "operator" for g in config.gates):
            specs.append(OperatorGate(name="operator"))  # an operator can always take over
        self.gates: list[GateScorer] = [gate_type(g).scorer(g, num_envs, step_dt, action_dim) for g in specs]
        k = len(self.gates)
        self.step_dt = step_dt
        self._graced = np.array([gate_type(g.spec).grace for g in self.gates], bool)[:, None]
        self._grace_steps = {"reset": _steps(config.grace_after_reset_s, step_dt),
                             "handback": _steps(config.grace_after_handback_s, step_dt)}
        self.grace_until = np.zeros(num_envs, np.int64)  # episode step from which the graced gates may rise again
        self.gate_level = np.zeros((k, num_envs), np.uint8)
        self.pending = np.zeros((k, num_envs), np.int32)  # consecutive ticks a rise has held
        self.level = np.zeros(num_envs, np.uint8)
        self.t_warn = np.full(num_envs, NO_TIME, np.int64)
        self.t_gate = np.full(num_envs, NO_TIME, np.int64)
        self.trip: list[dict[str, Any]] = [dict() for _ in range(num_envs)]  # row -> the values of the last rising edge
        self.confidence = next((g for g in self.gates if isinstance(g, ConfidenceScorer)), None)
        self._scores = np.zeros((k, num_envs), np.float32)
        self._thresholds()

    def _thresholds(self) -> None:
        g = self.gates
        inf = np.float32(np.inf)
        self.trig = np.array([x.trigger for x in g], np.float32)[:, None]
        self.warn_t = np.array([inf if x.warn is None else x.warn for x in g], np.float32)[:, None]
        hyst = np.array([x.spec.hysteresis for x in g], np.float32)[:, None]
        self.trig_clear = self.trig * (1 - hyst)
        self.warn_clear = self.warn_t * (1 - hyst)
        self.debounce = np.array([x.spec.debounce_ticks for x in g], np.int32)[:, None]
        self._quiet_below = np.minimum.reduce([self.trig, self.warn_t, self.trig_clear, self.warn_clear])

    # ---- configuration in force ----------------------------------------------------------

    def thresholds(self) -> dict[str, dict[str, float | None]]:
        return {g.name: {"warn": g.warn, "trigger": g.trigger} for g in self.gates}

    def describe(self) -> dict[str, Any]:
        """The gate configuration in force, for EpisodeStart.gate_config."""
        gates = []
        for g in self.gates:
            d = g.spec.model_dump(mode="json")
            d["warn"], d["trigger"] = g.warn, g.trigger
            if hasattr(g, "calibration_state"):  # a goal learned from successes: the one in force
                d.update(g.calibration_state())
            gates.append(d)
        return {"name": self.config.name, "task": self.config.task, "scene": self.config.scene, "gates": gates}

    def set_threshold(self, name: str, *, trigger: float, warn: float | None) -> None:
        gate = next((g for g in self.gates if g.name == name), None)
        if gate is None:
            raise ConfigError(f"no gate named {name!r} (gates: {', '.join(g.name for g in self.gates)})")
        if warn is not None and warn > trigger:
            raise ConfigError(f"gate {name!r}: warn {warn} is above trigger {trigger}")
        gate.trigger, gate.warn = float(trigger), None if warn is None else float(warn)
        self._thresholds()

    def observe_autonomous(self, uncertainty: np.ndarray) -> None:
        """Keep uncertainties of steps the policy ran on its own, for calibration."""
        if self.confidence is not None:
            self.confidence.observe(np.asarray(uncertainty, np.float32).ravel())

    def calibrate(self, uncertainty: np.ndarray | None = None) -> dict[str, Any] | None:
        """Set the confidence gate's thresholds by the quantile rule (``quantile_thresholds``) from
        ``uncertainty`` (or the recent autonomous samples). Returns the new thresholds, None when there are
        too few samples, or, when the samples cannot set a usable gate, the thresholds in force unchanged
        with ``refused`` saying why."""
        g = self.confidence
        if g is None or g.spec.calibration is None:
            raise ConfigError("calibration needs a confidence gate with a 'calibration' section")
        if uncertainty is None:
            uncertainty = g.recent[: min(g.recent_n, g.recent.size)]
        return self.calibrate_gate(g.name, uncertainty)

    def adopt(self, stored: dict[str, Any] | None) -> dict[str, Any] | None:
        """Thresholds stored with a student (``{"confidence": {"trigger", "warn", ...}}``, see
        policy.checkpoint): set them on the gates of those types. Returns what was set (None: nothing stored)."""
        done = {}
        for g in self.gates:
            thr = (stored or {}).get(g.spec.type)
            if isinstance(thr, dict) and thr.get("trigger"):
                self.set_threshold(g.name, trigger=float(thr["trigger"]),
                                   warn=None if thr.get("warn") is None else float(thr["warn"]))
                done[g.name] = {"trigger": g.trigger, "warn": g.warn}
        return done or None

    def calibrate_gate(self, name: str, scores: np.ndarray) -> dict[str, Any] | None:
        """The quantile rule for any gate with a 'calibration' section (e.g. a risk gate): its trigger becomes
        the (1 - target_rate) quantile of ``scores`` (the gate's scores on autonomous states), so about
        target_rate of such states would ask for a person. None when there are too few samples."""
        g = next((x for x in self.gates if x.name == name), None)
        cal = getattr(g.spec, "calibration", None) if g is not None else None
        if g is None or cal is None:
            raise ConfigError(f"gate {name!r}: calibration needs a gate with a 'calibration' section "
                              f"(gates: {', '.join(x.name for x in self.gates)})")
        u = np.asarray(scores, np.float32)
        u = u[np.isfinite(u)]
        if u.size < cal.min_samples:
            return None
        try:
            res = quantile_thresholds(u, cal)
        except CalibrationRefused as exc:
            return {"trigger": g.trigger, "warn": g.warn, "samples": int(u.size), "target_rate": cal.target_rate,
                    "refused": f"gate {name!r}: calibration refused ({exc}); thresholds kept (warn {g.warn}, "
                               f"trigger {g.trigger})"}
        self.set_threshold(name, trigger=res["trigger"], warn=res["warn"])
        return res

    # ---- per-env state ---------------------------------------------------------------------

    def rearm(self, rows, *, grace: str | None = None, step: np.ndarray | int | None = None) -> None:
        """Clear levels, debounce counters and gate histories (episode start, or the policy is back). ``grace``
        "reset" or "handback" with the rows' current episode ``step``: the gates whose type has ``grace`` stay quiet
        for the configured grace period from there."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        if grace is not None:
            at = np.broadcast_to(np.asarray(0 if step is None else step, np.int64), (self.n,))[rows]
            self.grace_until[rows] = at + self._grace_steps[grace]
        self.gate_level[:, rows] = OK
        self.pending[:, rows] = 0
        self.level[rows] = OK
        self.t_warn[rows] = NO_TIME
        self.t_gate[rows] = NO_TIME
        for g in self.gates:
            g.reset(rows)

    @property
    def scores(self) -> np.ndarray:
        """float32 [gates, N]: each gate's score at the last update (read-only view)."""
        v = self._scores.view()
        v.flags.writeable = False
        return v

    def confident(self) -> np.ndarray:
        """bool [N]: the confidence gate's last score is back below its clear threshold (True without one)."""
        if self.confidence is None:
            return np.ones(self.n, bool)
        i = self.gates.index(self.confidence)
        clear = self.warn_clear[i, 0] if np.isfinite(self.warn_t[i, 0]) else self.trig_clear[i, 0]
        return self._scores[i] < clear

    # ---- the tick --------------------------------------------------------------------------

    def update(self, inp: GateInputs, armed: np.ndarray) -> GateOutput:
        k = len(self.gates)
        if k == 0:
            e = np.zeros(0, np.int64)
            return GateOutput(self.level.copy(), e, e, [])
        for i, g in enumerate(self.gates):
            self._scores[i] = g.score(inp, armed)
        s = self._scores
        if not self.level.any() and (s < self._quiet_below).all():
            # nothing warns and nothing did (a row's level is the max of its gates' levels): every level stays
            # OK, and no rise is pending; the common tick of a policy on course costs three array checks
            if self.pending.any():
                self.pending[:] = 0
            return GateOutput(self.level.copy(), _NO_ROWS, _NO_ROWS, [])
        up = np.where(s >= self.trig, TRIGGER, np.where(s >= self.warn_t, WARN, OK)).astype(np.uint8)
        hold = np.where(s >= self.trig_clear, TRIGGER, np.where(s >= self.warn_clear, WARN, OK)).astype(np.uint8)
        quiet = np.asarray(inp.step, np.int64) < self.grace_until
        if quiet.any():  # within a grace period: the predicting gates may not rise yet
            held = self._graced & quiet[None, :]
            up[held] = OK
            hold[held] = OK
        cur = self.gate_level
        target = np.maximum(up, np.minimum(cur, hold))
        rising = target > cur
        self.pending = np.where(rising, self.pending + 1, 0)
        accept = rising & (self.pending >= self.debounce)
        new = np.where(accept | ~rising, target, cur)
        self.pending[accept] = 0
        all_armed = armed.all()
        if not all_armed:
            new[:, ~armed] = cur[:, ~armed]
            self.pending[:, ~armed] = 0
        self.gate_level = new

        before = self.level
        level = new.max(axis=0)
        if not all_armed:
            level[~armed] = before[~armed]
        self.level = level
        warned = np.flatnonzero((level >= WARN) & (before < WARN))
        triggered = np.flatnonzero((level == TRIGGER) & (before < TRIGGER))
        events: list[tuple[int, Event]] = []
        if warned.size or triggered.size:
            self.t_warn[warned] = inp.t_ns
            self.t_gate[triggered] = inp.t_ns
            for row in warned:
                events.append((int(row), self._event(EventKind.GATE_WARNING, int(row), WARN, inp)))
            for row in triggered:
                events.append((int(row), self._event(EventKind.GATE_TRIGGER, int(row), TRIGGER, inp)))
        return GateOutput(level.copy(), warned, triggered, events)

    def _event(self, kind: EventKind, row: int, at: int, inp: GateInputs) -> Event:
        tripped = [(i, g) for i, g in enumerate(self.gates) if self.gate_level[i, row] >= at]
        values: dict[str, Any] = {}
        for i, g in tripped:
            v = {"score": float(self._scores[i, row]), "warn": g.warn, "trigger": g.trigger}
            v.update(g.values(row, inp))
            values[g.name] = v
        reason = "+".join(g.name for _, g in tripped)
        values["t_warn"] = int(self.t_warn[row])
        values["t_gate"] = int(self.t_gate[row])
        self.trip[row] = {"reason": reason, "values": values}
        return Event(kind=kind, step=int(inp.step[row]), t_ns=int(inp.t_ns), reason=reason, source="gates", values=values)
