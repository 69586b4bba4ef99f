"""A tiny `auto` configuration on toy_reach for tests that need one real round quickly."""

from __future__ import annotations

import json

from hg_dagger.learn.auto import AutoConfig

TINY = {
    "task": "toy_reach", "certification": "planner_auto", "num_envs": 4, "seed": 3, "iterations": 1,
    "episodes_per_iteration": 4, "max_episode_steps": 25, "student": {"ensemble": 3, "hidden": [32, 32]},
    "train": {"steps": 30, "batch_size": 64, "log_every": 10},
    "eval": {"episodes": 4, "num_envs": 4, "max_steps": 25},
}


def tiny(**changes) -> AutoConfig:
    """TINY with ``changes`` (a dict value updates that section, anything else replaces the key)."""
    data = json.loads(json.dumps(TINY))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    return AutoConfig.model_validate(data)
