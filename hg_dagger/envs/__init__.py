"""Environments: the VecEnv contract, per-task mappings and the backends behind them.

``make_env(task, num_envs, seed)`` builds the task's backend (configs/tasks/<task>.yaml or a task file of the
user's) through its record in the backend registry (hg_dagger.envs.backends); simulator packages are imported
only when their backend is used.
"""

from __future__ import annotations

from pathlib import Path

from hg_dagger.envs.backends import BACKENDS, BackendSpec
from hg_dagger.envs.base import StepResult, VecEnv, as_tensordict, check_action
from hg_dagger.envs.mapping import TaskMapping, known_tasks, load_mapping
from hg_dagger.errors import EnvError
from hg_dagger.registry import RegistryError


def backend_spec(task: str | Path | TaskMapping) -> BackendSpec:
    """The registry record of a task's backend (plugins of the entry point group ``hg_dagger.backends`` included);
    an unknown one is one line naming the task file and the known backends."""
    mapping = task if isinstance(task, TaskMapping) else load_mapping(task)
    try:
        return BACKENDS.get(mapping.backend)
    except RegistryError as exc:
        raise EnvError(f"{mapping.source}: {exc}") from None


def make_env(task: str | Path | TaskMapping, num_envs: int = 1, seed: int | None = None, **options) -> VecEnv:
    """A VecEnv of ``num_envs`` rows for a task id, task YAML path or TaskMapping.

    The env is reset once and its observations, action dim and step_dt are checked against the
    mapping here, so a mismatch fails at construction. ``seed`` seeds row i with seed + i.
    """
    mapping = task if isinstance(task, TaskMapping) else load_mapping(task)
    if int(num_envs) < 1:
        raise EnvError(f"{mapping.task_id}: num_envs must be >= 1, got {num_envs}")
    spec = backend_spec(mapping)
    try:
        factory = spec.load_factory()
    except ImportError as exc:
        hint = f"; {spec.install}" if spec.install else ""
        raise EnvError(f"{mapping.source}: the {mapping.backend} backend needs {', '.join(spec.packages) or 'a package'} "
                       f"({type(exc).__name__}: {exc}){hint}") from None
    env = factory(mapping, num_envs=num_envs, seed=seed, **options)
    try:
        obs, _ = env.reset(seed=seed)
        mapping.check_obs(obs, num_envs=env.num_envs, where=f"{mapping.source} vs the {mapping.backend} backend")
    except BaseException:
        env.close()
        raise
    return env


__all__ = [
    "BACKENDS", "BackendSpec", "StepResult", "TaskMapping", "VecEnv", "as_tensordict", "backend_spec", "check_action",
    "known_tasks", "load_mapping", "make_env",
]
