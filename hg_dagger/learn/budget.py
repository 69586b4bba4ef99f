"""The task time budget: how many steps an episode has to succeed, in collection and in evaluation alike.

Its one home is the task's run config (configs/run/<task>.yaml, ``max_episode_steps``), else the task's horizon.
A gated session cuts its episodes there (end reason timeout, and the progress-ETA gate counts the time left to
it); closed-loop evaluation stops there; the learning benchmark and `auto` in mode human_gated read it from
here, so a student that succeeds only after the budget fails in both.
"""

from __future__ import annotations

from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError


def task_budget(task) -> int:
    """Steps an episode of ``task`` (a task id or a TaskMapping) has: the run config's ``max_episode_steps``,
    else the task's horizon."""
    # deferred: it loads the run config; the CLI imports this module for every command (tests/learn/test_eval.py)
    from hg_dagger.control.run_config import load_run_config

    mapping = load_mapping(task) if isinstance(task, str) else task
    steps = load_run_config(None, mapping.task_id).max_episode_steps
    return int(steps) if steps else int(mapping.horizon)


def check_one_budget(collect_steps: int | None, eval_steps: int | None, *, where: str) -> None:
    """Refuse collection and evaluation cut at different steps (one line naming both)."""
    if collect_steps and eval_steps and int(collect_steps) != int(eval_steps):
        raise ConfigError(f"{where}: collection episodes are cut at {collect_steps} steps and evaluation at "
                          f"{eval_steps}: one time budget for both (configs/run/<task>.yaml max_episode_steps)")
