"""Experts: who labels an observation with the action that should have been taken.

``make_expert(task_id, kind)`` builds one; ``query_expert`` asks it, validates the answer and converts
it to the task's raw action space. See docs/experts.md for the contract.
"""

from __future__ import annotations

from hg_dagger.errors import ConfigError
from hg_dagger.experts.base import (
    ExpertActionProvider,
    ExpertQuery,
    is_bc_only,
    query_expert,
    require_relabeler,
)
from hg_dagger.experts.demo import Demo, DemoAdapter
from hg_dagger.experts.policy import PolicyExpert

KINDS = ("planner", "policy", "demo")


def planner_tasks() -> list[str]:
    from hg_dagger.experts.metaworld import MW_ENV_NAMES

    return ["fetch_pick_place", "fetch_pick_place_rgb", "fetch_push", "fetch_reach", *MW_ENV_NAMES, "toy_reach"]


def make_expert(task_id: str, kind: str = "planner", *, mapping=None, checkpoint=None, demos=None, **options):
    """An expert for ``task_id``.

    kind "planner": the task's scripted state-conditioned expert (Fetch planner, Meta-World scripted
    policy, toy IK); "policy": ``PolicyExpert`` from ``checkpoint`` (needs the task mapping, loaded
    from configs/tasks when not given); "demo": ``DemoAdapter`` over ``demos`` (BC-only).
    """
    if kind == "planner":
        if task_id.startswith("fetch_"):
            from hg_dagger.experts.fetch import FetchPlanner

            return FetchPlanner(task_id, **options)
        if task_id.startswith("mw_"):
            from hg_dagger.experts.metaworld import MetaWorldExpert

            env_name = options.pop("env_name", None)
            if env_name is None and mapping is not None:
                env_name = mapping.backend_options.get("env_name")
            return MetaWorldExpert(task_id, env_name=env_name, **options)
        if task_id == "toy_reach":
            from hg_dagger.experts.toy import ToyIKExpert

            if mapping is None:
                from hg_dagger.envs import load_mapping

                mapping = load_mapping(task_id)
            return ToyIKExpert(mapping)
        raise ConfigError(f"no planner expert for task {task_id!r}; planners exist for: {', '.join(planner_tasks())}")
    if kind == "policy":
        if checkpoint is None:
            raise ConfigError(f"expert kind 'policy' for task {task_id!r} needs a checkpoint path")
        if mapping is None:
            from hg_dagger.envs import load_mapping

            mapping = load_mapping(task_id)
        return PolicyExpert.from_checkpoint(checkpoint, mapping)
    if kind == "demo":
        if not demos:
            raise ConfigError(f"expert kind 'demo' for task {task_id!r} needs demos")
        return DemoAdapter(demos, **options)
    raise ConfigError(f"unknown expert kind {kind!r}; known kinds: {', '.join(KINDS)}")


__all__ = [
    "KINDS", "Demo", "DemoAdapter", "ExpertActionProvider", "ExpertQuery", "PolicyExpert", "is_bc_only",
    "make_expert", "planner_tasks", "query_expert", "require_relabeler",
]
