"""Closed vocabularies of the correction-data contract.

Each enum is stored on disk as its uint8 ``code`` (per-step arrays) or its string value (metadata).
Codes are part of the on-disk format: never renumber, only append.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Self


class CodedEnum(str, Enum):
    """A string enum with a stable small-integer code for per-step arrays."""

    @property
    def code(self) -> int:
        return list(type(self)).index(self)

    @classmethod
    def from_code(cls, code: int) -> Self:
        members = list(cls)
        if not 0 <= int(code) < len(members):
            raise ValueError(f"{int(code)} is not a valid {cls.__name__} code (0..{len(members) - 1})")
        return members[int(code)]

    @classmethod
    def codes(cls) -> dict[str, int]:
        return {m.value: i for i, m in enumerate(cls)}


class ActionSource(CodedEnum):
    """Who produced the action that reached the robot at a step."""

    POLICY = "policy"
    HUMAN = "human"
    SAFETY_CONTROLLER = "safety_controller"
    EXPERT = "expert"
    UNKNOWN = "unknown"


# Action-source codes of a correction: the operator's or the expert's action ran instead of the policy's.
INTERVENTION_SOURCES = (ActionSource.HUMAN.code, ActionSource.EXPERT.code)


class LabelMask(CodedEnum):
    """What a training consumer may do with a step's action."""

    TRAINABLE = "trainable"
    CONTEXT_ONLY = "context_only"
    EXCLUDED = "excluded"


class ReplayStatus(str, Enum):
    REPLAYABLE = "replayable"
    VIDEO_ONLY = "video_only"
    REPLAY_MISMATCH = "replay_mismatch"
    UNVERIFIED = "unverified"


class EndReason(str, Enum):
    """Why an episode stopped recording (what happened to the run, not whether the task succeeded)."""

    SUCCESS = "success"
    TIMEOUT = "timeout"
    FAILURE = "failure"
    SAFETY_STOP = "safety_stop"
    OPERATOR_ABORT = "operator_abort"
    ENV_RESET = "env_reset"
    INCOMPLETE = "incomplete"  # the writer never committed the episode (crash, kill -9)


class RecoveryOutcome(str, Enum):
    """Result of a human or expert correction, kept apart from task success and data quality."""

    NONE = "none"  # no correction happened
    RECOVERY_SUCCESS = "recovery_success"
    PARTIAL = "partial"
    FAILED_AGAIN = "failed_again"
    TIMEOUT = "timeout"
    SAFETY_STOP = "safety_stop"


class ReviewStatus(str, Enum):
    """A reviewer's verdict on a correction window; stored by value (new members are appended)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    NEEDS_FIX = "needs_fix"  # sent back: the window's bounds or labels must be corrected before approval


class Split(str, Enum):
    UNASSIGNED = "unassigned"
    TRAIN = "train"
    VAL = "val"
    TEST = "test"
    HOLDOUT = "holdout"


# Splits whose episodes training never sees (evaluation's): the one list the dataset builder, the split rules and
# the trainer's offline hold-out all read.
HELD_OUT_SPLITS: tuple[Split, ...] = (Split.VAL, Split.TEST, Split.HOLDOUT)

class ActionAlignment(str, Enum):
    """Which observation an action answers; declared per task."""

    CURRENT_OBS = "current_obs"  # action t is computed from obs t and applied before obs t+1
    NEXT_OBS = "next_obs"  # action t is applied one observation later (pipelined control)


class CollectionMode(str, Enum):
    HUMAN_GATED = "human_gated"
    EXPERT_DEMO = "expert_demo"  # expert-only demonstrations: BC-only
    DAGGER_SYNC = "dagger_sync"
    DAGGER_ASYNC = "dagger_async"
    EVAL = "eval"  # student only; never trainable


class SessionMode(StrEnum):
    """Who acts in a live session's next episodes (`hg-dagger app --mode`, the app's mode box); a session that is
    not human-gated names its mode in the episode's gate_config (session_mode)."""

    HUMAN_GATED = "human_gated"  # the student acts; the gates hand over to the person
    EXPERT = "expert"  # the student acts; the gates hand over to the planner expert
    STUDENT_ONLY = "student_only"  # nobody takes over: evaluation episodes, never trainable
    TELEOP = "teleop"  # the person drives from the first step: demonstrations


class EventKind(str, Enum):
    GATE_WARNING = "gate_warning"
    GATE_TRIGGER = "gate_trigger"
    HANDOVER_START = "handover_start"
    HANDOVER_END = "handover_end"
    SAFETY_CLAMP = "safety_clamp"
    ESTOP = "estop"
    DEVICE_CONNECT = "device_connect"
    DEVICE_DISCONNECT = "device_disconnect"
    DROPPED_FRAMES = "dropped_frames"
    DROPPED_STEPS = "dropped_steps"  # recorder back-pressure
    HEARTBEAT_LOSS = "heartbeat_loss"
    NOTE = "note"
    WINDOW_CLOSED = "window_closed"  # a correction window's bounds and ids, recorded as it closes (kept by a killed run)
    REQUEST_END = "request_end"  # a handover request ended: values outcome answered|declined|expired and the wait


class StepFlag(int, Enum):
    """Bits of the per-step ``step_flags`` (uint16) quality bitmask."""

    SENSOR_LOSS = 1 << 0
    LATENCY_EXCEEDED = 1 << 1
    INTERPOLATED = 1 << 2
    RESAMPLED = 1 << 3
    DROPPED_FRAME_BEFORE = 1 << 4
    CLAMPED = 1 << 5
    DEVICE_LOST = 1 << 6
    INCOMPLETE_INPUT = 1 << 7

    @classmethod
    def names(cls, bits: int) -> list[str]:
        return [f.name.lower() for f in cls if bits & f.value]


# Flags that make a step unusable as a training label even inside a correction window.
EXCLUDING_FLAGS = (
    StepFlag.SENSOR_LOSS | StepFlag.LATENCY_EXCEEDED | StepFlag.DEVICE_LOST | StepFlag.INCOMPLETE_INPUT
)


class ControlState(CodedEnum):
    """States of the handover machine, stored per step as ``control_state``."""

    AUTONOMOUS = "autonomous"
    WARNING = "warning"
    HANDOVER_REQUESTED = "handover_requested"
    HUMAN = "human"
    RETURNING = "returning"
    SAFE_STOP = "safe_stop"
    EXPERT = "expert"  # automatic-expert modes


class LabelTarget(CodedEnum):
    """Which stored array is a trainable step's supervision target."""

    NONE = "none"
    APPLIED_ACTION = "applied_action"
    EXPERT_ACTION = "expert_action"


class Usage(StrEnum):
    """What a dataset version lets one of its samples be used for (a manifest sample's ``usage``). A StrEnum, so
    a manifest holds the plain value and text shows it as written (docs/datasets.md, "Usage classes")."""

    TRAINABLE = "trainable"
    REPLAY_ONLY = "replay_only"
    EVALUATION_ONLY = "evaluation_only"
    AUDIT_ONLY = "audit_only"
