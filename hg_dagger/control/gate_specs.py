"""The gate specifications: one pydantic model per shipped gate type and the gate file (configs/gates/, kind: gates)
that lists the gates in force for a task and scene. Each type is one record of gate_types.GATES (its spec, its
scorer); the gate file reads each gate with the spec model of the type it names. What each gate scores lives in
gate_scores; the level logic in gates (the engine)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, SerializeAsAny, model_validator

from hg_dagger import config as config_io
from hg_dagger.contract.model import StrictModel
from hg_dagger.control.gate_thresholds import Calibration
from hg_dagger.control.gate_types import GateSpecBase, gate_spec
from hg_dagger.control.limits import ActionLimits
from hg_dagger.errors import ConfigError


class ConfidenceGate(GateSpecBase):
    """Ensemble disagreement (policy_uncertainty) against a threshold."""

    type: Literal["confidence"] = "confidence"
    trigger: float = Field(default=0.1, gt=0)
    calibration: Calibration | None = None


class RiskGate(GateSpecBase):
    """ThriftyDAgger's risk half: a learned estimate of the chance that the policy, left in control from
    this state, fails (a classifier fit on recorded outcomes, ``RiskModel``). The score is that
    probability; ``calibration`` sets the trigger to the (1 - target_rate) quantile of the risk of
    recent autonomous states, as for the confidence gate. Without a model the gate never fires."""

    type: Literal["risk"] = "risk"
    model: str | None = Field(default=None, description="a RiskModel file (.npz) written by RiskModel.save")
    trigger: float = Field(default=0.5, gt=0)
    calibration: Calibration | None = None


class ProgressStallGate(GateSpecBase):
    """The task's progress measure (info["signals"]["progress"]) has not improved by ``min_delta`` for
    ``trigger`` seconds of control time (the score is the stalled time in seconds). A task whose success
    condition holds is not stalled: holding the block at the goal cannot get it closer."""

    type: Literal["progress_stall"] = "progress_stall"
    signal: str = "progress"
    trigger: float = Field(default=2.0, gt=0, description="seconds without progress")
    min_delta: float = Field(default=1e-3, ge=0)


class EtaCalibration(StrictModel):
    """Where the progress-ETA gate's goal lies, learned from successful rollouts only: the ``quantile`` of the
    signal's value at the step the task's success condition began to hold, over the last ``window`` successes
    of the session (whoever drove). Failures never move it, so a student that fails often cannot talk the gate
    into quiet."""

    min_successes: int = Field(default=3, ge=1, description="successes before the learned goal replaces the "
                               "configured one (without a configured goal the gate is quiet until then)")
    quantile: float = Field(default=0.5, gt=0.0, lt=1.0)
    window: int = Field(default=200, ge=1)


class ProgressEtaGate(GateSpecBase):
    """The task will not be done in time at the pace of the last ``window_s`` seconds: the score is the time the
    remaining progress to ``goal`` needs at that pace over the time the episode has left (1.0 = just in time; no
    progress at all scores ``cap``). It sees a student that creeps or drifts, which a stall gate misses as long as
    it improves by ``min_delta`` now and then. Quiet at the goal (or while the task's success condition holds) and
    where the episode has no step limit. With ``calibration`` the goal is learned from successful rollouts."""

    type: Literal["progress_eta"] = "progress_eta"
    signal: str = "progress"
    goal: float | None = Field(default=None, description="the signal's value at which the task counts as done "
                               "(None: learned by ``calibration`` from successes; quiet until then)")
    calibration: EtaCalibration | None = None
    window_s: float = Field(default=1.0, gt=0, description="seconds over which the pace is measured")
    cap: float = Field(default=10.0, gt=0, description="score when the pace is zero or backwards")
    trigger: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _goal_or_calibration(self):
        if self.goal is None and self.calibration is None:
            raise ValueError(f"gate {self.name or self.type!r}: give a goal, or a calibration to learn it from "
                             f"successful rollouts")
        return self


class ConstraintGate(GateSpecBase):
    """The proposed action against the feasible set; the score is the largest normalized limit usage
    (1.0 = on a limit), so the default trigger 1.0 fires on or beyond a limit and warn 0.9 near it."""

    type: Literal["constraint"] = "constraint"
    trigger: float = Field(default=1.0, gt=0)
    warn: float | None = 0.9
    limits: ActionLimits


class SignalGate(GateSpecBase):
    """A simulator or bridge signal (info["signals"][signal]) against a threshold: imminent collision,
    object drop, contact force."""

    type: Literal["signal"] = "signal"
    signal: str
    trigger: float = 0.5


class PolicyFailedGate(GateSpecBase):
    """The policy has already failed: ``signal`` is set, or progress fell more than ``max_regression``
    below the best progress of this autonomous stretch. Fires at once (no warning)."""

    type: Literal["policy_failed"] = "policy_failed"
    signal: str = "policy_failed"
    progress_signal: str = "progress"
    max_regression: float | None = Field(default=None, gt=0)
    trigger: float = 0.5


class OperatorGate(GateSpecBase):
    """The operator asked for control: the takeover button, or grabbing a hold-to-intervene device."""

    type: Literal["operator"] = "operator"
    trigger: float = 0.5


GateItem = Annotated[SerializeAsAny[GateSpecBase], PlainValidator(gate_spec)]
"""One gate of a gate file: read with the spec model its ``type`` is registered with (gate_types.GATES), so a gate type
of another package needs no change here."""


class GateConfig(StrictModel):
    """configs/gates/<name>.yaml (kind: gates): the gates in force for a task and scene."""

    name: str = "default"
    task: str = ""
    scene: str = ""
    gates: list[GateItem] = Field(default_factory=list)
    grace_after_reset_s: float = Field(default=0.0, ge=0.0, description="control time after an episode begins "
                                       "before the confidence, risk and stall gates may ask for the person")
    grace_after_handback_s: float = Field(default=0.0, ge=0.0, description="the same after control came back "
                                          "to the policy (hand-back, or a declined or expired request)")

    @model_validator(mode="before")
    @classmethod
    def _extends(cls, data: Any) -> Any:
        if isinstance(data, dict) and "extends" in data:
            return with_base(data)
        return data

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


def _gate_name(g: Any) -> Any:
    return (g.get("name") or g.get("type")) if isinstance(g, dict) else None


def with_base(data: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A gate config that says ``extends: <name in configs/gates, or a path>`` is its base with its own keys on top:
    its ``gates`` replace the base's gates of the same name in place and add the others after them, so a variant
    lists only what it changes and a change to the base reaches every variant."""
    ref = data["extends"]
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"extends: give the name or path of a gate config, got {ref!r}")
    try:
        path = config_io.named_config("gates", ref, what="gate")
        base = config_io.read_yaml(path)
    except ConfigError as exc:
        raise ValueError(f"extends: {exc}") from None
    if str(path) in seen:
        raise ValueError(f"extends: {' -> '.join([*seen, str(path)])} is a cycle")
    base.pop("kind", None)
    if "extends" in base:
        base = with_base(base, (*seen, str(path)))
    own = list(data.get("gates") or [])
    by_name = {_gate_name(g): g for g in own}
    gates = [by_name.pop(_gate_name(g), g) for g in base.get("gates") or []]
    gates += [g for g in own if _gate_name(g) in by_name]
    merged = {**base, **{k: v for k, v in data.items() if k not in ("extends", "gates")}}
    merged["gates"] = gates
    return merged
