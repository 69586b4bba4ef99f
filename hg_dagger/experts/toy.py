"""The toy 2-link arm's analytic-IK expert behind the expert contract."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hg_dagger.envs.toy import LINKS, MAX_SPEED, toy_ik_action
from hg_dagger.experts.base import ExpertQuery, Obs


class ToyIKExpert:
    """Joint-velocity commands toward the IK solution of the current target (raw space, stateless).

    Targets beyond the arm's reach (|target| > sum of link lengths) are invalid: IK would only pull them in.
    """

    output_space = "raw"
    bc_only = False

    def __init__(self, mapping=None):
        opts = mapping.backend_options if mapping is not None else {}
        self.links = tuple(float(x) for x in opts.get("link_lengths", LINKS))
        self.max_speed = float(opts.get("max_speed", MAX_SPEED))
        self.step_dt = float(mapping.dt) if mapping is not None else 0.04

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Stateless."""

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        action = toy_ik_action(obs, links=self.links, max_speed=self.max_speed, step_dt=self.step_dt)
        reach = np.linalg.norm(np.asarray(obs["target"], dtype=np.float64), axis=1)
        valid = reach <= sum(self.links)
        reasons = {
            int(e): f"target at distance {r:.3f} m is beyond the arm's reach {sum(self.links):.3f} m"
            for e, r, ok in zip(np.asarray(env_ids).tolist(), reach, valid, strict=True)
            if not ok
        }
        action[~valid] = 0.0
        return ExpertQuery(action=action, valid=valid, metadata={"invalid_reason": reasons})
