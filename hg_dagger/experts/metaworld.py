"""Meta-World tasks labelled by the scripted policies that ship with Meta-World (``metaworld.policies``).

They are state-conditioned by construction: each maps the current flat 39-d observation (hand, gripper,
object poses, goal) to an action (dx, dy, dz, grab effort) with no memory, so they relabel learner-visited
states as well as their own. Meta-World's policies take one row at a time; this class loops over rows.
"""

from __future__ import annotations

import warnings
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

# Two state-conditioned fixes on top of the bundled policies, for the grasping tasks only:
# - hold: they keep chasing the goal with the hand after reaching it and can wander off again
#   (push-v3 lifts the puck once hand and puck drift apart). Inside this radius (m, object to goal;
#   inside Meta-World's success radius) the expert instead moves the hand so that the *object*
#   converges on the goal, keeping the scripted grab effort.
# - open (pick-place-v3): it starts closing the fingers 10 cm above the object, so a gripper that a
#   learner left half-closed lands on top of the object and stays there. Above an aligned object
#   resting on the table the fingers are kept open until the hand is down. (push-v3 keeps its own
#   effort: it drags the puck low with the hand high, which this rule would mistake for a descent.)
HOLD_RADIUS = {"push-v3": 0.045, "pick-place-v3": 0.04}
HOLD_GAIN = 10.0  # action per metre of object-to-goal error (Meta-World: 1.0 = 1 cm per step)
OPEN_ABOVE = ("pick-place-v3",)
HAND, OBJECT = slice(0, 3), slice(4, 7)
ALIGNED_XY = 0.02
DOWN_GAP = 0.05
RESTING_Z = 0.025  # object centre below this height: lying on the table, not held


def policy_for(env_name: str):
    # metaworld deferred: the sim extra, optional
    from metaworld.policies import ENV_POLICY_MAP

    # the bundled policies warn about their own gains on every call; the env clips actions anyway
    warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high", category=UserWarning)
    if env_name not in ENV_POLICY_MAP:
        raise ConfigError(f"Meta-World has no scripted policy for {env_name!r}")
    return ENV_POLICY_MAP[env_name]()  # type: ignore[abstract]  # the map holds concrete policy classes


class MetaWorldExpert:
    """A bundled Meta-World scripted policy (raw action space: dx, dy, dz, grab in [-1, 1]); stateless."""

    output_space = "raw"
    bc_only = False

    def __init__(self, task: str, *, obs_keys: tuple[str, ...] = ("observation", "desired_goal"), env_name: str | None = None):
        if env_name is None:
            if task not in MW_ENV_NAMES:
                raise ConfigError(f"MetaWorldExpert: unknown task {task!r}; known: {', '.join(MW_ENV_NAMES)}")
            env_name = MW_ENV_NAMES[task]
        self.task = task
        self.env_name = env_name
        self.obs_keys = tuple(obs_keys)
        self.policy = policy_for(env_name)
        self.hold_radius = HOLD_RADIUS.get(env_name)

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Stateless."""

    def _flat(self, obs: Obs) -> np.ndarray:
        """Meta-World's own flat observation: our keys (state 36, goal 3) concatenated back into 39 values."""
        missing = [k for k in self.obs_keys if k not in obs]
        if missing:
            raise ConfigError(f"MetaWorldExpert({self.task}): observation keys {missing} missing (got {sorted(obs)})")
        return np.concatenate([np.asarray(obs[k], dtype=np.float64) for k in self.obs_keys], axis=1)

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        flat = self._flat(obs)
        action = np.zeros((len(flat), 4), dtype=np.float32)
        for i, row in enumerate(flat):
            action[i] = self.policy.get_action(row)
        phase = np.full(len(flat), "scripted", dtype="<U8")
        hand, obj = flat[:, HAND], flat[:, OBJECT]
        if self.env_name in OPEN_ABOVE:
            above = (
                (np.linalg.norm(hand[:, :2] - obj[:, :2], axis=1) < ALIGNED_XY)
                & (hand[:, 2] - obj[:, 2] > DOWN_GAP)
                & (obj[:, 2] < RESTING_Z)
            )
            action[above, 3] = -1.0
            phase[above] = "open"
        if self.hold_radius is not None:
            to_goal = flat[:, -3:] - obj
            hold = np.linalg.norm(to_goal, axis=1) < self.hold_radius
            action[hold, :3] = np.clip(HOLD_GAIN * to_goal[hold], -1.0, 1.0)
            phase[hold] = "hold"
        return ExpertQuery(
            action=np.clip(action, -1.0, 1.0), valid=np.ones(len(flat), dtype=bool), metadata={"phase": phase}
        )
