"""The gate engine: pluggable gates that ask for a person when failure looks likely.

Each gate turns one tick's inputs into a per-env *score* (higher = worse). The engine applies the
same level logic to every gate: a warning threshold below the trigger threshold, hysteresis (a level
is left only when the score falls ``hysteresis`` x threshold below it) and debounce (a rise must hold
for ``debounce_ticks`` ticks). The engine's level per env is the highest gate level; rising edges
become GATE_WARNING / GATE_TRIGGER events that carry the reason, t_warn, t_gate and the values that
tripped it. Gates are configured per task and scene in YAML (configs/gates/, kind: gates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import EventKind
from hg_dagger.contract.schema import Event
from hg_dagger.control.limits import ActionLimits, CompiledLimits
from hg_dagger.errors import ConfigError

OK, WARN, TRIGGER = 0, 1, 2


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _GateBase(_Strict):
    name: str = ""  # defaults to the type
    enabled: bool = True
    warn: float | None = None  # score at which a warning is raised; None = no warning level
    trigger: float
    hysteresis: float = Field(default=0.1, ge=0.0, lt=1.0, description="fraction of a threshold to fall below it to clear")
    debounce_ticks: int = Field(default=1, ge=1, description="consecutive ticks a rise must hold")

    @model_validator(mode="after")
    def _order(self):
        if self.warn is not None and self.warn > self.trigger:
            raise ValueError(f"gate {self.name or self.type!r}: warn {self.warn} is above trigger {self.trigger}")
        return self


class Calibration(_Strict):
    """ThriftyDAgger's rule: set the trigger to the (1 - target_rate) quantile of the uncertainty seen
    in recent autonomous data, so about ``target_rate`` of autonomous steps would ask for a person."""

    target_rate: float = Field(gt=0.0, lt=1.0)
    warn_rate: float | None = Field(default=None, gt=0.0, lt=1.0, description="warn quantile rate; default 2 x target")
    warn_band: float = Field(default=0.2, gt=0.0, lt=1.0, description="the warning sits at least this fraction of "
                             "the trigger below it, so amber always comes before a request")
    min_samples: int = Field(default=200, ge=1)
    window: int = Field(default=5000, ge=1, description="recent autonomous steps kept for calibration")


class ConfidenceGate(_GateBase):
    """Ensemble disagreement (policy_uncertainty) against a threshold."""

    type: Literal["confidence"] = "confidence"
    trigger: float = Field(default=0.1, gt=0)
    calibration: Calibration | None = None


class RiskGate(_GateBase):
    """ThriftyDAgger's risk half: a learned estimate of the chance that the policy, left in control from
    this state, fails (a classifier fit on recorded outcomes, ``RiskModel``). The score is that
    probability; ``calibration`` sets the trigger to the (1 - target_rate) quantile of the risk of
    recent autonomous states, as for the confidence gate. Without a model the gate never fires."""

    type: Literal["risk"] = "risk"
    model: str | None = Field(default=None, description="a RiskModel file (.npz) written by RiskModel.save")
    trigger: float = Field(default=0.5, gt=0)
    calibration: Calibration | None = None


class ProgressStallGate(_GateBase):
    """The task's progress measure (info["signals"]["progress"]) has not improved by ``min_delta`` for
    ``trigger`` seconds of control time (the score is the stalled time in seconds). A task whose success
    condition holds is not stalled: holding the block at the goal cannot get it closer."""

    type: Literal["progress_stall"] = "progress_stall"
    signal: str = "progress"
    trigger: float = Field(default=2.0, gt=0, description="seconds without progress")
    min_delta: float = Field(default=1e-3, ge=0)


class ConstraintGate(_GateBase):
    """The proposed action against the feasible set; the score is the largest normalized limit usage
    (1.0 = on a limit), so the default trigger 1.0 fires on or beyond a limit and warn 0.9 near it."""

    type: Literal["constraint"] = "constraint"
    trigger: float = Field(default=1.0, gt=0)
    warn: float | None = 0.9
    limits: ActionLimits


class SignalGate(_GateBase):
    """A simulator or bridge signal (info["signals"][signal]) against a threshold: imminent collision,
    object drop, contact force."""

    type: Literal["signal"] = "signal"
    signal: str
    trigger: float = 0.5


class PolicyFailedGate(_GateBase):
    """The policy has already failed: ``signal`` is set, or progress fell more than ``max_regression``
    below the best progress of this autonomous stretch. Fires at once (no warning)."""

    type: Literal["policy_failed"] = "policy_failed"
    signal: str = "policy_failed"
    progress_signal: str = "progress"
    max_regression: float | None = Field(default=None, gt=0)
    trigger: float = 0.5


class OperatorGate(_GateBase):
    """The operator asked for control: the takeover button, or grabbing a hold-to-intervene device."""

    type: Literal["operator"] = "operator"
    trigger: float = 0.5


GateSpec = Annotated[
    ConfidenceGate | RiskGate | ProgressStallGate | ConstraintGate | SignalGate | PolicyFailedGate | OperatorGate,
    Field(discriminator="type"),
]


GRACE_TYPES = ("confidence", "risk", "progress_stall")
"""Gates that predict trouble and so may wait a moment after a reset or a hand-back; the gates that see it
(constraint, signal, policy_failed) and the operator's own takeover are never delayed."""


class GateConfig(_Strict):
    """configs/gates/<name>.yaml (kind: gates): the gates in force for a task and scene."""

    name: str = "default"
    task: str = ""
    scene: str = ""
    gates: list[GateSpec] = Field(default_factory=list)
    grace_after_reset_s: float = Field(default=0.0, ge=0.0, description="control time after an episode begins "
                                       "before the confidence, risk and stall gates may ask for the person")
    grace_after_handback_s: float = Field(default=0.0, ge=0.0, description="the same after control came back "
                                          "to the policy (hand-back, or a declined or expired request)")

    @model_validator(mode="after")
    def _unique(self) -> GateConfig:
        seen = set()
        for g in self.gates:
            if not g.name:
                g.name = g.type
            if g.name in seen:
                raise ValueError(f"two gates are named {g.name!r}; give each a unique name")
            seen.add(g.name)
        return self


# --------------------------------------------------------------------------------------------
# Tick inputs and outputs
# --------------------------------------------------------------------------------------------


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


@dataclass
class GateOutput:
    level: np.ndarray  # uint8 [N] OK / WARN / TRIGGER (0 for unarmed envs)
    warned: np.ndarray  # int64 rows whose level rose to WARN or above this tick
    triggered: np.ndarray  # int64 rows whose level rose to TRIGGER this tick
    events: list[tuple[int, Event]]  # (env row, event) for the rising edges


# --------------------------------------------------------------------------------------------
# Gate implementations
# --------------------------------------------------------------------------------------------


class _Gate:
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


class _Confidence(_Gate):
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


class RiskModel:
    """P(failure | state) as a one-hidden-layer MLP in numpy (cheap on the hot path, no torch import).

    Features are the observation keys it was fit on, flattened in order and standardized with the
    training data's mean/std; ``fit`` is full-batch Adam on the class-balanced logistic loss with an L2
    penalty (``l2``): a few hundred recorded states must not give saturated, overconfident risks, or the
    quantile calibration has nothing to separate."""

    def __init__(self, keys: list[str], mean: np.ndarray, std: np.ndarray, w1: np.ndarray, b1: np.ndarray,
                 w2: np.ndarray, b2: np.ndarray):
        self.keys, self.mean, self.std = list(keys), mean.astype(np.float32), std.astype(np.float32)
        self.w1, self.b1, self.w2, self.b2 = (a.astype(np.float32) for a in (w1, b1, w2, b2))

    @staticmethod
    def features(obs: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
        return np.concatenate([np.asarray(obs[k], np.float32).reshape(len(obs[k]), -1) for k in keys], axis=1)

    @classmethod
    def fit(cls, obs: dict[str, np.ndarray], failed: np.ndarray, *, keys: list[str] | None = None, hidden: int = 32,
            steps: int = 200, lr: float = 1e-2, l2: float = 1e-2, seed: int = 0) -> RiskModel:
        keys = list(keys or obs)
        x = cls.features(obs, keys).astype(np.float64)
        y = np.asarray(failed, np.float64).ravel()
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"risk model: {len(x)} states and {len(y)} outcomes")
        mean, std = x.mean(0), x.std(0) + 1e-6
        z = (x - mean) / std
        rng = np.random.default_rng(seed)
        params = [rng.normal(0, 1 / np.sqrt(z.shape[1]), (z.shape[1], hidden)), np.zeros(hidden),
                  rng.normal(0, 1 / np.sqrt(hidden), (hidden,)), np.zeros(1)]
        pos = y.mean()
        w = np.where(y > 0.5, 0.5 / max(pos, 1e-6), 0.5 / max(1 - pos, 1e-6)) / len(y)  # balanced classes
        m = [np.zeros_like(p) for p in params]
        v = [np.zeros_like(p) for p in params]
        for t in range(1, steps + 1):
            w1, b1, w2, b2 = params
            h = np.tanh(z @ w1 + b1)
            p = 1.0 / (1.0 + np.exp(-(h @ w2 + b2)))
            d = (p - y) * w  # d loss / d logit
            dh = np.outer(d, w2) * (1 - h**2)
            grads = [z.T @ dh + l2 * w1, dh.sum(0), h.T @ d + l2 * w2, np.array([d.sum()])]
            for i, g in enumerate(grads):
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                params[i] = params[i] - lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
        return cls(keys, mean, std, *params)

    def predict(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        z = (self.features(obs, self.keys) - self.mean) / self.std
        logit = np.tanh(z @ self.w1 + self.b1) @ self.w2 + self.b2
        return (1.0 / (1.0 + np.exp(-np.clip(logit, -30, 30)))).astype(np.float32)

    def save(self, path) -> None:
        with open(path, "wb") as f:
            np.savez(f, keys=np.array(self.keys), mean=self.mean, std=self.std, w1=self.w1, b1=self.b1, w2=self.w2,
                     b2=self.b2)

    @classmethod
    def load(cls, path) -> RiskModel:
        try:
            with np.load(path) as d:
                return cls([str(k) for k in d["keys"]], d["mean"], d["std"], d["w1"], d["b1"], d["w2"], d["b2"])
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"{path}: not a risk model file ({type(exc).__name__}: {exc})") from None


class _Risk(_Gate):
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


class _Stall(_Gate):
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


class _Constraint(_Gate):
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


class _Signal(_Gate):
    def score(self, inp, armed):
        s = inp.signals.get(self.spec.signal)
        if s is None:
            return np.zeros(self.n, np.float32)
        s = np.asarray(s, np.float32)
        return np.where(np.isfinite(s), s, 0.0).astype(np.float32)

    def values(self, row, inp):
        return {self.spec.signal: float(np.asarray(inp.signals[self.spec.signal])[row])}


class _Failed(_Gate):
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


class _Operator(_Gate):
    def score(self, inp, armed):
        if inp.takeover is None:
            return np.zeros(self.n, np.float32)
        return np.asarray(inp.takeover, np.float32)

    def values(self, row, inp):
        return {"takeover": True}


_IMPLS = {"confidence": _Confidence, "risk": _Risk, "progress_stall": _Stall, "constraint": _Constraint, "signal": _Signal,
          "policy_failed": _Failed, "operator": _Operator}


def _steps(seconds: float, step_dt: float) -> int:
    return int(np.ceil(seconds / step_dt - 1e-9)) if seconds > 0 and step_dt > 0 else 0


class CalibrationRefused(ValueError):
    """The samples cannot set a usable gate (no spread, nothing finite): the gate keeps its thresholds."""


def quantile_thresholds(scores: np.ndarray, cal: Calibration) -> dict[str, Any]:
    """The quantile rule with a warning that leads: trigger = the (1 - target_rate) quantile of ``scores``, warn
    the lower of the (1 - warn_rate) quantile and trigger x (1 - warn_band), so the band is never empty. The
    measured spread comes with it (min, p50, p90, max), and the result must lie inside it: samples without
    spread or a trigger outside the range they span are refused (CalibrationRefused names why)."""
    u = np.asarray(scores, np.float64)
    u = u[np.isfinite(u)]
    if u.size == 0:
        raise CalibrationRefused("no finite samples")
    lo, hi = float(u.min()), float(u.max())
    spread = {"min": lo, "p50": float(np.quantile(u, 0.5)), "p90": float(np.quantile(u, 0.9)), "max": hi}
    trig = calibrate_threshold(u, cal.target_rate)
    warn = min(calibrate_threshold(u, cal.warn_rate or min(0.99, 2 * cal.target_rate)), trig * (1 - cal.warn_band))
    if hi - lo <= 1e-6 * max(1.0, abs(hi)):
        raise CalibrationRefused(f"the {u.size} samples do not vary (all {hi:.3g}): no quantile separates them")
    if not (lo <= trig <= hi) or trig <= 0:
        raise CalibrationRefused(f"trigger {trig:.3g} lies outside the measured range {lo:.3g}..{hi:.3g}")
    return {"trigger": trig, "warn": max(warn, 0.0), "samples": int(u.size), "target_rate": cal.target_rate,
            "uncertainty": spread}


def calibrate_threshold(uncertainty: np.ndarray, target_rate: float) -> float:
    """ThriftyDAgger's quantile rule: the threshold above which ``target_rate`` of the samples lie."""
    u = np.asarray(uncertainty, np.float64)
    u = u[np.isfinite(u)]
    if u.size == 0:
        raise ValueError("no finite uncertainty samples to calibrate from")
    if not 0.0 < target_rate < 1.0:
        raise ValueError(f"target_rate must be in (0, 1), got {target_rate}")
    return float(np.quantile(u, 1.0 - target_rate))


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
        self.gates: list[_Gate] = [_IMPLS[g.type](g, num_envs, step_dt, action_dim) for g in specs]
        k = len(self.gates)
        self.step_dt = step_dt
        self._graced = np.array([g.spec.type in GRACE_TYPES for g in self.gates], bool)[:, None]
        self._grace_steps = {"reset": _steps(config.grace_after_reset_s, step_dt),
                             "handback": _steps(config.grace_after_handback_s, step_dt)}
        self.grace_until = np.zeros(num_envs, np.int64)  # episode step from which the graced gates may rise again
        self.gate_level = np.zeros((k, num_envs), np.uint8)
        self.pending = np.zeros((k, num_envs), np.int32)  # consecutive ticks a rise has held
        self.level = np.zeros(num_envs, np.uint8)
        self.t_warn = np.full(num_envs, NO_TIME, np.int64)
        self.t_gate = np.full(num_envs, NO_TIME, np.int64)
        self.trip = [dict() for _ in range(num_envs)]  # row -> the values of the last rising edge
        self.confidence = next((g for g in self.gates if isinstance(g, _Confidence)), None)
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

    # ---- configuration in force ----------------------------------------------------------

    def thresholds(self) -> dict[str, dict[str, float | None]]:
        return {g.name: {"warn": g.warn, "trigger": g.trigger} for g in self.gates}

    def describe(self) -> dict[str, Any]:
        """The gate configuration in force, for EpisodeStart.gate_config."""
        gates = []
        for g in self.gates:
            d = g.spec.model_dump(mode="json")
            d["warn"], d["trigger"] = g.warn, g.trigger
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

    def calibrate_gate(self, name: str, scores: np.ndarray) -> dict[str, float] | None:
        """The quantile rule for any gate with a 'calibration' section (e.g. a risk gate): its trigger becomes
        the (1 - target_rate) quantile of ``scores`` (the gate's scores on autonomous states), so about
        target_rate of such states would ask for a person. None when there are too few samples."""
        g = next((x for x in self.gates if x.name == name), None)
        cal = getattr(g.spec, "calibration", None) if g is not None else None
        if cal is None:
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
        "reset" or "handback" with the rows' current episode ``step``: the GRACE_TYPES gates stay quiet for the
        configured grace period from there."""
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
