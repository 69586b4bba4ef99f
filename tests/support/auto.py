"""Rigs for tests of learning on toy_reach: a tiny `auto` configuration for one real round, a small student, and a
store the auto collector recorded."""

from __future__ import annotations

import json

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.experts import make_expert
from hg_dagger.learn.auto import AutoConfig
from hg_dagger.learn.collect import Collector, CollectStats
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore

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


def small_student(task: str = "toy_reach", *, seed: int = 0) -> Student:
    """An untrained student of two members and one 16-unit layer: what a test that needs a policy acting (or a
    trainer something to fit) uses, quick to build."""
    return Student.create(load_mapping(task), ensemble=2, hidden=(16,), seed=seed)


def collect_toy(path, *, episodes: int, num_envs: int = 4, max_steps: int = 30, beta: float = 1.0, reset_seed: int = 0,
                expert=None, certify: bool = False, student: Student | None = None) -> tuple[EpisodeStore, CollectStats]:
    """``episodes`` toy_reach episodes recorded by the auto collector into a new store at ``path``: the planner
    (or ``expert``) mixed with a small student at ``beta``, rows seeded from ``reset_seed``."""
    mapping = load_mapping("toy_reach")
    store = EpisodeStore.create(path)
    with make_env(mapping, num_envs=num_envs, seed=0) as env:
        rec = store.recorder()
        col = Collector(env, expert if expert is not None else make_expert("toy_reach", "planner", mapping=mapping),
                        rec, mode="dagger_sync", seed=0, certify=certify, max_episode_steps=max_steps)
        col.set_policy(student if student is not None else small_student(), iteration=0, beta=beta)
        stats = col.run(episodes=episodes, reset_seed=reset_seed)
        rec.close()
    return store, stats
