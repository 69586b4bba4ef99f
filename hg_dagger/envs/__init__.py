"""Environments: the VecEnv contract, per-task mappings and the backends behind them.

``make_env(task, num_envs, seed)`` builds the task's backend from configs/tasks/<task>.yaml; simulator
packages are imported only when their backend is used.
"""

from __future__ import annotations

from pathlib import Path

from hg_dagger.envs.base import StepResult, VecEnv, as_tensordict, check_action
from hg_dagger.envs.mapping import TaskMapping, known_tasks, load_mapping
from hg_dagger.errors import EnvError


def make_env(task: str | Path | TaskMapping, num_envs: int = 1, seed: int | None = None, **options) -> VecEnv:
    """A VecEnv of ``num_envs`` rows for a task id, task YAML path or TaskMapping.

    The env is reset once and its observations, action dim and step_dt are checked against the
    mapping here, so a mismatch fails at construction. ``seed`` seeds row i with seed + i.
    """
    mapping = task if isinstance(task, TaskMapping) else load_mapping(task)
    if int(num_envs) < 1:
        raise EnvError(f"{mapping.task_id}: num_envs must be >= 1, got {num_envs}")
    if mapping.backend == "toy":
        from hg_dagger.envs.toy import ToyReachEnv

        env = ToyReachEnv(mapping, num_envs=num_envs, seed=seed, **options)
    elif mapping.backend == "fetch":
        from hg_dagger.envs.fetch import FetchVecEnv

        env = FetchVecEnv(mapping, num_envs=num_envs, seed=seed, **options)
    elif mapping.backend == "metaworld":
        from hg_dagger.envs.metaworld import MetaWorldVecEnv

        env = MetaWorldVecEnv(mapping, num_envs=num_envs, seed=seed, **options)
    elif mapping.backend == "embodichain":
        from hg_dagger.envs.embodichain import EmbodiChainEnv

        env = EmbodiChainEnv(mapping, num_envs=num_envs, seed=seed, **options)
    else:  # pragma: no cover - the mapping's Literal forbids it
        raise EnvError(f"{mapping.task_id}: unknown backend {mapping.backend!r}")
    try:
        obs, _ = env.reset(seed=seed)
        mapping.check_obs(obs, num_envs=env.num_envs, where=f"{mapping.source} vs the {mapping.backend} backend")
    except BaseException:
        env.close()
        raise
    return env


__all__ = [
    "StepResult", "TaskMapping", "VecEnv", "as_tensordict", "check_action", "known_tasks", "load_mapping", "make_env",
]
