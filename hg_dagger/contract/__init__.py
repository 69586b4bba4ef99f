"""The correction-data contract: schema, enums, label rules and the clock. Imports nothing of ours."""

from hg_dagger.contract.clock import NO_TIME, ClockMapping, now_ns
from hg_dagger.contract.command import COMMAND_DIM, HumanCommand
from hg_dagger.contract.enums import (
    ActionAlignment,
    ActionSource,
    CollectionMode,
    ControlState,
    EndReason,
    EventKind,
    LabelMask,
    LabelTarget,
    RecoveryOutcome,
    ReplayStatus,
    ReviewStatus,
    SessionMode,
    Split,
    StepFlag,
)
from hg_dagger.contract.labels import (
    Labels,
    TrainingBlock,
    TrainingRule,
    TrainingSelection,
    current_review,
    derive_labels,
    label_violations,
    training_selection,
)
from hg_dagger.contract.schema import (
    SCHEMA_VERSION,
    CorrectionWindow,
    EpisodeEnd,
    EpisodeStart,
    Event,
    ExpertCertification,
    FieldSpec,
    QCResult,
    ReviewDecision,
    TaskInfo,
    Versions,
    new_id,
    step_fields,
)

__all__ = [
    "COMMAND_DIM", "HumanCommand",
    "NO_TIME", "ClockMapping", "now_ns", "ActionAlignment", "ActionSource", "CollectionMode", "SessionMode", "ControlState",
    "EndReason", "EventKind", "LabelMask", "LabelTarget", "RecoveryOutcome", "ReplayStatus", "ReviewStatus",
    "Split", "StepFlag", "Labels", "TrainingBlock", "TrainingRule", "TrainingSelection", "current_review",
    "derive_labels", "label_violations", "training_selection", "SCHEMA_VERSION", "CorrectionWindow",
    "EpisodeEnd", "EpisodeStart", "Event", "ExpertCertification", "FieldSpec", "QCResult", "ReviewDecision",
    "TaskInfo", "Versions", "new_id", "step_fields",
]
