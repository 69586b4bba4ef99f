"""Beta schedules: the probability that the expert's action is executed at a step, per iteration.

beta is drawn per env and per step (one coin per row), so a batch mixes expert and student rows.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hg_dagger.contract.model import StrictModel


class BetaSchedule(StrictModel):
    """constant: beta0 always; exponential: beta0 * decay**i; linear: beta0 -> beta_min over ``steps`` iterations."""

    kind: Literal["constant", "exponential", "linear"] = "exponential"
    beta0: float = Field(default=1.0, ge=0.0, le=1.0)
    decay: float = Field(default=0.5, ge=0.0, le=1.0, description="exponential: factor per iteration")
    steps: int = Field(default=5, gt=0, description="linear: iterations to reach beta_min")
    beta_min: float = Field(default=0.0, ge=0.0, le=1.0)

    def __call__(self, iteration: int) -> float:
        i = max(int(iteration), 0)
        if self.kind == "constant":
            b = self.beta0
        elif self.kind == "exponential":
            b = self.beta0 * self.decay**i
        else:
            b = self.beta0 + (self.beta_min - self.beta0) * min(i / self.steps, 1.0)
        return float(min(max(b, self.beta_min), 1.0))
