"""Meta-World tasks labelled by the scripted policies that ship with Meta-World (``metaworld.policies``).

They are state-conditioned by construction: each maps the current flat 39-d observation (hand, gripper,
object poses, goal) to an action (dx, dy, dz, grab effort) with no memory, so they relabel learner-visited
states as well as their own. Meta-World's policies take one row at a time; this class loops over rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hg_dagger.errors import ConfigError
from hg_dagger.experts.base import ExpertQuery, Obs

# Our task ids -> Meta-World environment names (the keys of metaworld.policies.ENV_POLICY_MAP).
MW_ENV_NAMES = {
    "mw_reach": "reach-v3",
    "mw_push": "push-v3",
    "mw_pick_place": "pick-place-v3",
    "mw_drawer_open": "drawer-open-v3",
}


def policy_for(env_name: str):
    from metaworld.policies import ENV_POLICY_MAP

    if env_name not in ENV_POLICY_MAP:
        raise ConfigError(f"Meta-World has no scripted policy for {env_name!r}")
    return ENV_POLICY_MAP[env_name]()


class MetaWorldExpert:
    """A bundled Meta-World scripted policy (raw action space: dx, dy, dz, grab in [-1, 1]); stateless."""

    output_space = "raw"
    bc_only = False

    def __init__(self, task: str, *, obs_key: str = "observation", env_name: str | None = None):
        if env_name is None:
            if task not in MW_ENV_NAMES:
                raise ConfigError(f"MetaWorldExpert: unknown task {task!r}; known: {', '.join(MW_ENV_NAMES)}")
            env_name = MW_ENV_NAMES[task]
        self.task = task
        self.env_name = env_name
        self.obs_key = obs_key
        self.policy = policy_for(env_name)

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Stateless."""

    def _flat(self, obs: Obs) -> np.ndarray:
        if self.obs_key in obs:
            return np.asarray(obs[self.obs_key], dtype=np.float64)
        states = [k for k, v in obs.items() if np.asarray(v).ndim == 2]
        if len(states) == 1:
            return np.asarray(obs[states[0]], dtype=np.float64)
        raise ConfigError(f"MetaWorldExpert({self.task}): no observation key {self.obs_key!r} (got {sorted(obs)})")

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        flat = self._flat(obs)
        action = np.zeros((len(flat), 4), dtype=np.float32)
        for i, row in enumerate(flat):
            action[i] = self.policy.get_action(row)
        return ExpertQuery(action=np.clip(action, -1.0, 1.0), valid=np.ones(len(flat), dtype=bool))
