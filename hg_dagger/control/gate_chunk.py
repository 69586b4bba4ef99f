"""The chunk gate: a single chunking model (a served ACT or diffusion policy) asks for help when it changes its plan.

Such a model reports no ensemble disagreement. What it does report, chunk after chunk, is a plan: a new chunk's first
actions are for steps the previous chunk already predicted. Where the two disagree, the model's prediction of its own
next steps was wrong, the same signal an ensemble's spread gives. The policy measures it (policy.remote,
``chunk_disagreement``: mean over the overlapping steps of the largest per-dimension difference, as a fraction of
the raw action range) and reports it as its ``uncertainty`` when its server reports none of its own; this gate scores
that. It is quiet until a row has two consecutive chunks to compare (after every reset or hand-back), so it needs no
grace period.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hg_dagger.control.gate_scores import ConfidenceScorer
from hg_dagger.control.gate_thresholds import Calibration
from hg_dagger.control.gate_types import GATES, GateSpecBase, GateType


class ChunkGate(GateSpecBase):
    """Disagreement between consecutive action chunks (the policy's ``uncertainty`` for a chunking policy without
    its own), as a fraction of the action range. ``calibration``: the quantile rule over autonomous steps, as for
    the confidence gate (the engine calibrates the first gate that scores the policy's uncertainty)."""

    type: Literal["chunk"] = "chunk"
    trigger: float = Field(default=0.25, gt=0, description="fraction of the action range")
    calibration: Calibration | None = None


class ChunkScorer(ConfidenceScorer):
    """The confidence gate's scorer (NaN scores 0; autonomous samples kept for calibration) under its own name."""

    def values(self, row, inp):
        return {"chunk_disagreement": float(inp.uncertainty[row])}


CHUNK = GATES.register("chunk", GateType(ChunkGate, ChunkScorer, words="the policy changed its plan"))

__all__ = ["CHUNK", "ChunkGate", "ChunkScorer"]
