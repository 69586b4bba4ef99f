"""Experts: who labels an observation with the action that should have been taken.

``make_expert(task_id, kind)`` builds one (planners come from the expert registry, hg_dagger.experts.planners,
registered per backend or task); ``query_expert`` asks it, validates the answer and converts
it to the task's raw action space. See docs/experts.md for the contract.
"""

from __future__ import annotations

from hg_dagger.envs.mapping import known_tasks, load_mapping
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.experts.base import (
    ExpertActionProvider,
    ExpertQuery,
    is_bc_only,
    query_expert,
    require_relabeler,
)
from hg_dagger.experts.demo import Demo, DemoAdapter
from hg_dagger.experts.planners import EXPERTS, ExpertSpec, planner_spec
from hg_dagger.experts.policy import PolicyExpert

KINDS = ("planner", "policy", "demo")


def planner_tasks() -> list[str]:
    """Shipped task ids (configs/tasks) that a registered planner labels."""
    out = []
    for task in known_tasks():
        try:
            if planner_spec(load_mapping(task)) is not None:
                out.append(task)
        except HgDaggerError:  # a task whose file does not load has no planner either
            continue
    return out


def make_expert(task_id: str, kind: str = "planner", *, mapping=None, checkpoint=None, demos=None, **options):
    """An expert for ``task_id`` (its mapping is loaded from configs/tasks, or a task file, when not given).

    kind "planner": the planner registered for the task or its backend (hg_dagger.experts.planners: the Fetch
    planner, Meta-World's scripted policies, the toy IK, and plugins of the entry point group
    ``hg_dagger.experts``); "policy": ``PolicyExpert`` from ``checkpoint``, for any task; "demo": ``DemoAdapter``
    over ``demos`` (BC-only).
    """
    if kind == "planner":
        if mapping is None:
            try:
                mapping = load_mapping(task_id)
            except HgDaggerError:
                raise ConfigError(f"no planner expert for task {task_id!r}: no such task (known tasks: "
                                  f"{', '.join(known_tasks())})") from None
        found = planner_spec(mapping)
        if found is None:
            raise ConfigError(
                f"no planner expert for task {mapping.task_id!r} (backend {mapping.backend}): planners are registered "
                f"for {_planner_scopes()}; label it with a policy expert (a student checkpoint: expert {{kind: policy, "
                f"checkpoint: FILE}} in an auto config, expert_checkpoint in a run config) or register a "
                f"planner through the entry point group {EXPERTS.group!r}")
        return found[1].make(mapping, **options)
    if kind == "policy":
        if checkpoint is None:
            raise ConfigError(f"expert kind 'policy' for task {task_id!r} needs a checkpoint path")
        if mapping is None:
            mapping = load_mapping(task_id)
        return PolicyExpert.from_checkpoint(checkpoint, mapping)
    if kind == "demo":
        if not demos:
            raise ConfigError(f"expert kind 'demo' for task {task_id!r} needs demos")
        return DemoAdapter(demos, **options)
    raise ConfigError(f"unknown expert kind {kind!r}; known kinds: {', '.join(KINDS)}")


def _planner_scopes() -> str:
    """Where planners exist: 'backend fetch', 'task my_task', ..."""
    scopes = []
    for name in EXPERTS.names():
        spec = EXPERTS.get(name)
        where = f"tasks {', '.join(spec.tasks)}" if spec.tasks else f"backend {spec.backend}"
        scopes.append(f"{where} ({name})")
    return "; ".join(scopes) or "nothing"


__all__ = [
    "EXPERTS", "KINDS", "Demo", "DemoAdapter", "ExpertActionProvider", "ExpertQuery", "ExpertSpec", "PolicyExpert",
    "is_bc_only", "make_expert", "planner_spec", "planner_tasks", "query_expert", "require_relabeler",
]
