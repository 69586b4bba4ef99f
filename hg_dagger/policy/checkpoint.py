"""Student checkpoints: the file (policy.checkpoint_file: weights, normalization, mapping hash, lineage, extra)
and the student it holds (``load_student``). Layout and atomic writes: see policy.checkpoint_file."""

from __future__ import annotations

import os

from hg_dagger.policy.checkpoint_file import (
    FORMAT,
    KIND,
    check_mapping,
    read_checkpoint,
    record_promotion,
    save_checkpoint,
    snapshot_bytes,
    store_gate_thresholds,
)
from hg_dagger.policy.student import Student

__all__ = ["FORMAT", "KIND", "check_mapping", "load_student", "read_checkpoint", "record_promotion", "save_checkpoint",
           "snapshot_bytes", "store_gate_thresholds"]


def load_student(source: str | os.PathLike | bytes, mapping) -> Student:
    """A Student from a checkpoint file or snapshot bytes; refuses a different mapping."""
    return Student.load(source, mapping)
