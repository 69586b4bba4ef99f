"""The expert registry: scripted, state-conditioned planners registered per backend or per task (kind "experts",
entry point group ``hg_dagger.experts``).

``make_expert(task, "planner")`` finds the planner of a task here: a record whose ``tasks`` name the task id
wins over one for every task of the task's backend; ``accepts`` narrows a record to the tasks it can label
(Meta-World bundles scripted policies for some of its environments, the Fetch planner knows three tasks). Policy and
demo experts need no record: any task takes them (hg_dagger.experts.make_expert). A new planner is one module
plus one registration::

    EXPERTS.register("reacher_planner", ExpertSpec(make=ReacherPlanner, backend="gymnasium",
                                                   accepts=lambda m: m.backend_options.get("gym_id") == "Reacher-v5"))

A task with no planner (a Gymnasium env of the user's) is labelled by a policy expert: a student checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hg_dagger.envs.mapping import TaskMapping
from hg_dagger.errors import ConfigError
from hg_dagger.experts.fetch import FetchPlanner
from hg_dagger.experts.metaworld import MW_ENV_NAMES, MetaWorldExpert
from hg_dagger.experts.toy import ToyIKExpert
from hg_dagger.registry import Registry


@dataclass(frozen=True)
class ExpertSpec:
    """A planner: ``make(mapping, **options)`` builds it for one task of ``backend`` (every task of it, only
    ``tasks`` when given, and only those ``accepts(mapping)`` says yes to)."""

    make: Callable[..., Any]
    backend: str
    tasks: tuple[str, ...] = ()
    accepts: Callable[[TaskMapping], bool] | None = None
    description: str = ""

    def labels(self, mapping: TaskMapping) -> bool:
        """Whether this planner labels ``mapping``'s task."""
        if mapping.backend != self.backend or (self.tasks and mapping.task_id not in self.tasks):
            return False
        return self.accepts is None or bool(self.accepts(mapping))


EXPERTS: Registry[ExpertSpec] = Registry("experts", "expert")


def planner_spec(mapping: TaskMapping) -> tuple[str, ExpertSpec] | None:
    """(name, record) of the planner that labels ``mapping``'s task (one registered for the task id first, then one
    for every task of its backend), or None."""
    found = [(name, spec) for name in EXPERTS.names() if (spec := EXPERTS.get(name)).labels(mapping)]
    found.sort(key=lambda item: (not item[1].tasks, item[0]))
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------- our planners
FETCH_TASKS = {"FetchReach": "reach", "FetchPush": "push", "FetchPickAndPlace": "pick_place"}


def _fetch_task(mapping: TaskMapping) -> str:
    """The Fetch planner's task: from the task id (fetch_push, fetch_pick_place_rgb), else from the Gymnasium id."""
    name = mapping.task_id.removeprefix("fetch_").removesuffix("_rgb")
    if name in FetchPlanner.TASKS:
        return name
    gym_id = str(mapping.backend_options.get("gym_id", ""))
    return next((task for prefix, task in FETCH_TASKS.items() if gym_id.startswith(prefix)), name)


def _fetch(mapping: TaskMapping, **options: Any) -> FetchPlanner:
    return FetchPlanner(_fetch_task(mapping), **options)


def _metaworld(mapping: TaskMapping, **options: Any) -> MetaWorldExpert:
    env_name = options.pop("env_name", None) or mapping.backend_options.get("env_name")
    return MetaWorldExpert(mapping.task_id, env_name=env_name, **options)


def _metaworld_has_policy(mapping: TaskMapping) -> bool:
    """Meta-World bundles a scripted policy for this environment (checked without importing Meta-World when the
    name is one of ours)."""
    env_name = mapping.backend_options.get("env_name")
    if env_name in MW_ENV_NAMES.values():
        return True
    try:
        from metaworld.policies import ENV_POLICY_MAP
    except ImportError:
        return False
    return env_name in ENV_POLICY_MAP


def _toy(mapping: TaskMapping, **options: Any) -> ToyIKExpert:
    if options:
        raise ConfigError(f"the toy IK planner takes no options, got {sorted(options)}")
    return ToyIKExpert(mapping)


EXPERTS.register("toy_ik", ExpertSpec(_toy, backend="toy", description="analytic IK of the 2-link arm"))
EXPERTS.register("fetch_planner", ExpertSpec(
    _fetch, backend="fetch", accepts=lambda m: _fetch_task(m) in FetchPlanner.TASKS,
    description="scripted Fetch reach / push / pick-and-place"))
EXPERTS.register("metaworld_scripted", ExpertSpec(
    _metaworld, backend="metaworld", accepts=_metaworld_has_policy,
    description="Meta-World's bundled scripted policies"))


__all__ = ["EXPERTS", "ExpertSpec", "planner_spec"]
