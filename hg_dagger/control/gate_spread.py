"""The spread gate: a stochastic policy (a diffusion policy) asks for help where its own samples disagree.

One model, not an ensemble, but a stochastic one: asked for k samples of its chunk on one observation (one batch),
it answers with k different chunks where it is unsure which way to go, and with k alike ones where its training
data was clear. The policy measures their spread (policy.remote, ``sample_spread``: over the actions executed of
the chunk, the mean of the largest per-dimension standard deviation across the samples, as a fraction of the raw
action range) and reports it as its ``uncertainty`` when its server reports none of its own; this gate scores
that. It is quiet until a chunk with samples has come (a server that sends none never asks through it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hg_dagger.control.gate_scores import ConfidenceScorer
from hg_dagger.control.gate_thresholds import Calibration
from hg_dagger.control.gate_types import GATES, GateSpecBase, GateType


class SpreadGate(GateSpecBase):
    """Spread of the policy's action samples (its ``uncertainty`` when its server sends ``action_samples`` and no
    uncertainty of its own), as a fraction of the action range. ``calibration``: the quantile rule over autonomous
    steps, as for the confidence and chunk gates."""

    type: Literal["spread"] = "spread"
    trigger: float = Field(default=0.1, gt=0, description="fraction of the action range")
    calibration: Calibration | None = None


class SpreadScorer(ConfidenceScorer):
    """The confidence gate's scorer (NaN scores 0; autonomous samples kept for calibration) under its own name."""

    def values(self, row, inp):
        return {"sample_spread": float(inp.uncertainty[row])}


SPREAD = GATES.register("spread", GateType(SpreadGate, SpreadScorer, words="the policy's samples disagree"))

__all__ = ["SPREAD", "SpreadGate", "SpreadScorer"]
