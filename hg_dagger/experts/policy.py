"""A trained student checkpoint acting as the expert (e.g. a strong policy labelling a weaker one)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hg_dagger.experts.base import ExpertQuery, Obs


class PolicyExpert:
    """One batched forward pass of a Student per query.

    It answers in the *policy* action space, so its labels reach raw space through the same
    ``mapping.policy_to_raw`` as the learner's own actions. Confidence is the ensemble's confidence.
    """

    output_space = "policy"
    bc_only = False

    def __init__(self, student):
        self.student = student

    @classmethod
    def from_checkpoint(cls, path: str | Path, mapping) -> PolicyExpert:
        """Load a checkpoint; refuses one trained under another mapping (ContractError, ConfigError)."""
        # deferred: policy imports torch; importing this module stays free of it
        from hg_dagger.policy import Student

        return cls(Student.load(path, mapping))

    @property
    def version(self) -> str:
        return self.student.version

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Stateless (a feed-forward policy)."""

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        out = self.student.act(obs)
        action = out.policy_action
        if action is None:  # a student that only reports raw actions: map back to policy space
            action = self.student.mapping.raw_to_policy(out.action)
        n = len(action)
        return ExpertQuery(
            action=np.asarray(action, dtype=np.float32),
            valid=np.ones(n, dtype=bool),
            confidence=np.asarray(out.confidence, dtype=np.float32),
            metadata={
                "policy_version": self.student.version,
                "inference_ns": int(out.inference_ns),
                "uncertainty": np.asarray(out.uncertainty, dtype=np.float32),
            },
        )
