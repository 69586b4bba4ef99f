"""The correction-data contract: per-step array fields and the metadata records around them.

This module is the single home of field names, dtypes and shapes. The store, validate, readers,
exporters and docs/data-format.md all follow it. Bump SCHEMA_VERSION on any change to the layout.
"""

from __future__ import annotations

import uuid
from typing import Any, Self

import numpy as np
from pydantic import ConfigDict, Field, field_validator, model_validator

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import (
    ActionAlignment,
    ActionSource,
    CollectionMode,
    EndReason,
    EventKind,
    LabelMask,
    RecoveryOutcome,
    ReplayStatus,
    ReviewStatus,
    Split,
)
from hg_dagger.contract.model import StrictModel

SCHEMA_VERSION = "1.0"
SUPPORTED_SCHEMA_VERSIONS = ("1.0",)


def new_id() -> str:
    return uuid.uuid4().hex


class _Model(StrictModel):
    """Contract records: strict, and re-validated when a field is assigned."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


# --------------------------------------------------------------------------------------------
# Per-step array fields
# --------------------------------------------------------------------------------------------


class FieldSpec(_Model):
    """One per-step array: stored as data/<name> with shape (T, *shape)."""

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    fill: Any = None  # value meaning "absent" (NaN for floats, NO_TIME for times)
    description: str = ""
    image: bool = False  # uint8 HxWxC camera frames, stored compressed

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def check(self, value: Any, *, where: str) -> np.ndarray:
        """Coerce one step's value to this field's dtype/shape or raise naming the field."""
        arr = np.asarray(value)
        if arr.shape != tuple(self.shape):
            raise ValueError(f"{where}: field '{self.name}' has shape {arr.shape}, expected {tuple(self.shape)}")
        if arr.dtype != self.np_dtype:
            if not np.can_cast(arr.dtype, self.np_dtype, casting="same_kind"):
                raise ValueError(f"{where}: field '{self.name}' has dtype {arr.dtype}, expected {self.dtype}")
            arr = arr.astype(self.np_dtype)
        return arr


def _f(name: str, dtype: str, shape: tuple[int, ...] = (), fill: Any = None, description: str = "") -> FieldSpec:
    return FieldSpec(name=name, dtype=dtype, shape=shape, fill=fill, description=description)


def chunk_fields() -> dict[str, FieldSpec]:
    """The optional fields of an episode whose policy executes action chunks (a policy server's ACT or diffusion
    policy): which chunk each step's policy action came from. Only such episodes carry them, so the fields of
    every other episode, and what it stores, stay as they were."""
    return {f.name: f for f in (
        _f("chunk_id", "int64", fill=0, description="the chunk policy_action came from (from 1); 0 if none"),
        _f("chunk_index", "int32", fill=0, description="index of policy_action within its chunk"),
    )}


def step_fields(
    obs: dict[str, tuple[tuple[int, ...], str]],
    action_dim: int,
    human_command_dim: int = 7,
    *,
    chunks: bool = False,
) -> dict[str, FieldSpec]:
    """All per-step fields of an episode.

    obs: observation key -> (shape, dtype); uint8 arrays of rank 3 are camera images.
    All action fields are in the task's canonical raw action space (action_dim); human_command
    is the raw device value before scaling, limits, filtering and frame transforms.
    chunks: add chunk_fields() (a policy that executes action chunks).
    """
    a = (int(action_dim),)
    nan = float("nan")
    fields = [
        _f("t_obs", "int64", fill=NO_TIME, description="observation sampled (monotonic ns)"),
        _f("t_policy", "int64", fill=NO_TIME, description="policy produced its action for this obs"),
        _f("t_action_apply", "int64", fill=NO_TIME, description="controller applied applied_action"),
        _f("t_device", "int64", fill=NO_TIME, description="device timestamp of human_command, on our clock"),
        _f("inference_ns", "int64", fill=0, description="policy forward-pass time"),
        _f("transport_ns", "int64", fill=0, description="app -> robot transport time (0 in-process)"),
        _f("alignment_error_ms", "float32", fill=0.0, description="uncertainty of the robot->app clock mapping"),
        _f("policy_action", "float32", a, nan, "the student's action for this obs; never modified"),
        _f("policy_confidence", "float32", fill=nan, description="model confidence in [0, 1]; NaN if none"),
        _f("policy_uncertainty", "float32", fill=nan, description="ensemble disagreement; NaN if none"),
        _f("human_command", "float32", (int(human_command_dim),), nan, "raw device command; NaN if none"),
        _f("expert_action", "float32", a, nan, "expert/planner label for this obs; NaN if not queried"),
        _f("expert_valid", "bool", fill=False, description="expert returned a usable label"),
        _f("expert_used", "bool", fill=False, description="the expert's action was the one executed"),
        _f("applied_action", "float32", a, nan, "what reached the robot (seed 000: executed_action)"),
        _f("action_source", "uint8", fill=ActionSource.UNKNOWN.code, description="ActionSource code"),
        _f("control_state", "uint8", fill=0, description="ControlState code of the handover machine"),
        _f("step_flags", "uint16", fill=0, description="StepFlag bitmask (quality)"),
        _f("reward", "float32", fill=0.0),
        _f("valid", "bool", fill=True, description="the step's data is usable at all"),
        _f("terminated", "bool", fill=False),
        _f("truncated", "bool", fill=False),
        _f("success", "bool", fill=False, description="task success condition holds after this step"),
    ]
    for key, (shape, dtype) in obs.items():
        spec = FieldSpec(
            name=f"obs/{key}",
            dtype=str(np.dtype(dtype)),
            shape=tuple(int(s) for s in shape),
            fill=0,
            image=np.dtype(dtype) == np.uint8 and len(shape) == 3,
            description="camera image (H, W, C)" if len(shape) == 3 else "state observation",
        )
        fields.append(spec)
    if chunks:
        fields += chunk_fields().values()
    return {f.name: f for f in fields}


# --------------------------------------------------------------------------------------------
# Events, windows, certifications, reviews
# --------------------------------------------------------------------------------------------


class Event(_Model):
    """A discrete occurrence during an episode (gate, safety, device, data quality)."""

    kind: EventKind
    step: int = Field(ge=0)
    t_ns: int
    reason: str = ""
    source: str = ""  # e.g. gate name, device id, "keyboard", "bridge"
    values: dict[str, Any] = Field(default_factory=dict)


class CorrectionWindow(_Model):
    """A bounded correction [handover_start, handover_end) inside its parent episode."""

    window_id: str = Field(default_factory=new_id)
    parent_episode_id: str
    parent_step_id: int = Field(ge=0, description="step at which the gate fired")
    handover_start: int = Field(ge=0, description="first step with a correcting action applied")
    handover_end: int = Field(ge=0, description="first step after the correction (exclusive)")
    source: ActionSource = ActionSource.HUMAN  # HUMAN or EXPERT
    gate_reason: str = ""
    t_warn: int = NO_TIME
    t_gate: int = NO_TIME
    t_handover: int = NO_TIME  # first tick a correcting command was actually applied
    t_return: int = NO_TIME
    context_before: int = Field(default=0, ge=0, description="steps of observation context kept before")
    context_after: int = Field(default=0, ge=0, description="steps of observation context kept after")
    operator: str = ""
    outcome: RecoveryOutcome = RecoveryOutcome.NONE

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.handover_end < self.handover_start:
            raise ValueError(f"window {self.window_id}: handover_end {self.handover_end} < handover_start {self.handover_start}")
        if self.parent_step_id > self.handover_start:
            raise ValueError(f"window {self.window_id}: parent_step_id {self.parent_step_id} after handover_start {self.handover_start}")
        if self.source not in (ActionSource.HUMAN, ActionSource.EXPERT):
            raise ValueError(f"window {self.window_id}: source must be human or expert, got {self.source.value}")
        return self

    def steps(self) -> range:
        return range(self.handover_start, self.handover_end)


class ExpertCertification(_Model):
    """An independent record that actions in [step_start, step_end) are expert-quality labels.

    Without one, policy actions outside correction windows are never trainable.
    """

    cert_id: str = Field(default_factory=new_id)
    episode_id: str
    step_start: int = Field(ge=0)
    step_end: int = Field(ge=0)
    certifier: str = Field(min_length=1)
    method: str = Field(min_length=1, description="e.g. independent_review, replay_verified")
    executability_verified: bool

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.step_end < self.step_start:
            raise ValueError(f"certification {self.cert_id}: step_end < step_start")
        return self


class ReviewDecision(_Model):
    window_id: str
    reviewer: str = Field(min_length=1)
    status: ReviewStatus
    replay_training_authorized: bool = False
    notes: str = ""
    t_wall: str = ""  # ISO time of the decision, for audit only (never for ordering)


class QCResult(_Model):
    episode_id: str
    window_id: str | None = None
    passed: bool
    checks: dict[str, bool] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)


class ReplayCheck(_Model):
    """Whether an episode's recorded actions, re-run from its recorded initial state, reproduce its observations.

    Training may only trust what it can re-check; replay_mismatch names where the re-run first left the record.
    """

    status: ReplayStatus
    reason: str = ""  # why an episode is unverified or video_only
    first_divergent_step: int | None = Field(default=None, ge=0)
    key: str = ""  # the field that diverged first, e.g. "obs/observation"
    error: float | None = None  # largest absolute difference beyond tolerance at that step
    steps_checked: int = Field(default=0, ge=0)
    checked_with: dict[str, Any] = Field(default_factory=dict)  # task version, mapping hash, tolerances, packages
    t_wall: str = ""  # ISO time of the check, for audit only

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.status == ReplayStatus.REPLAY_MISMATCH and (self.first_divergent_step is None or not self.key):
            raise ValueError("a replay_mismatch needs first_divergent_step and key")
        if self.status != ReplayStatus.REPLAY_MISMATCH and self.first_divergent_step is not None:
            raise ValueError(f"first_divergent_step is only meaningful for replay_mismatch, not {self.status.value}")
        return self


# --------------------------------------------------------------------------------------------
# Episode metadata
# --------------------------------------------------------------------------------------------


class TaskInfo(_Model):
    task_id: str
    task_version: str = "1"
    language_instruction: str = ""
    scene_id: str = ""
    object_ids: list[str] = Field(default_factory=list)
    success_condition: str = ""


class Versions(_Model):
    robot: str = ""
    controller: str = ""
    env: str = ""
    simulator: str = ""


class EpisodeStart(_Model):
    """What is known when an episode begins; immutable afterwards."""

    schema_version: str = SCHEMA_VERSION
    episode_id: str = Field(default_factory=new_id)
    parent_episode_id: str | None = None
    parent_step_id: int | None = None
    task: TaskInfo
    versions: Versions = Field(default_factory=Versions)
    policy_version: str = ""
    mode: CollectionMode
    split: Split = Split.UNASSIGNED
    operator: str = ""  # pseudonym, never a real name
    control_hz: float = Field(gt=0)
    action_alignment: ActionAlignment = ActionAlignment.CURRENT_OBS
    mapping: dict[str, Any] = Field(default_factory=dict)
    mapping_hash: str = ""
    gate_config: dict[str, Any] = Field(default_factory=dict)  # thresholds, policy version, person available
    initial_state: dict[str, Any] = Field(default_factory=dict)  # seed and/or state arrays for replay
    iteration: int = 0
    beta: float | None = Field(default=None, ge=0.0, le=1.0)
    bc_only: bool = False  # open-loop demos: never relabel learner-visited states with them
    env_index: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _supported(cls, v: str) -> str:
        if v not in SUPPORTED_SCHEMA_VERSIONS:
            raise ValueError(f"schema_version {v!r} is not supported (supported: {', '.join(SUPPORTED_SCHEMA_VERSIONS)})")
        return v


class EpisodeEnd(_Model):
    """What is known when an episode is committed."""

    end_reason: EndReason
    task_success: bool
    recovery_outcome: RecoveryOutcome = RecoveryOutcome.NONE
    replay_status: ReplayStatus = ReplayStatus.UNVERIFIED
    review_status: ReviewStatus = ReviewStatus.PENDING
    replay_training_authorized: bool = False
    quality_flags: list[str] = Field(default_factory=list)
    num_steps: int = Field(ge=0)
    dropped_steps: int = Field(default=0, ge=0)
    events: list[Event] = Field(default_factory=list)


LABEL_VALUES = [m.value for m in LabelMask]
