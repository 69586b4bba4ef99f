"""The backend registry: one record per simulator backend (kind "backends", entry point group ``hg_dagger.backends``).

A task file names its backend (``backend: fetch``); ``make_env`` builds it through the record, the task mapping
checks the name here when it is loaded, the episode writer records the versions of the record's packages, and
replay reads whether the backend's episodes can be re-run. A new backend is one module with a VecEnv plus one
``BACKENDS.register(name, BackendSpec(...))``, here for ours, through an entry point for other packages (see
docs/extending.md)::

    [project.entry-points."hg_dagger.backends"]
    my_sim = "my_package.sim:BACKEND"        # a BackendSpec

The factory of our own backends is a ``"module:attr"`` string, imported on first use, as entry points are: the
simulator packages (MuJoCo, Meta-World, EmbodiChain) load only when a task of theirs is built, and this module,
which the task mapping imports, imports no backend module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hg_dagger.registry import Registry

# What a row does while it is held (VecEnv.hold, then steps of the hold action: motion dims 0, gripper dims kept):
#   still  - the action is a per-step displacement or velocity with no momentum: the hold action moves nothing,
#            hold() has nothing to do (the toy arm)
#   pin    - hold() pins the arm where it is (MuJoCo mocap target, joint velocities zeroed) and hold-action steps
#            keep it pinned until a step commands motion (Fetch, Meta-World)
#   pause  - the simulator cannot hold by an action (torques, joint position targets): hold() pauses the rows
#            and hold-action steps leave the simulation where it is (no physics, no time, reward 0, info
#            "paused") until a step commands motion or the row resets (gymnasium)
#   none   - hold() does nothing and the hold action is stepped as it is: whether that holds depends on what the
#            task's actions mean (an external simulator driven by absolute joint targets, EmbodiChain)
HoldBehaviour = Literal["still", "pin", "pause", "none"]
HOLD_BEHAVIOURS: tuple[str, ...] = ("still", "pin", "pause", "none")


@dataclass(frozen=True)
class BackendSpec:
    """One simulator backend.

    factory: ``factory(mapping, num_envs=..., seed=..., **options) -> VecEnv`` (usually the VecEnv class), or a
        ``"module:attr"`` string naming it, imported on first use.
    simulator / env: the distributions that simulate and that define the env; their versions go into every
        episode (EpisodeStart.versions.simulator / .env; an empty ``env`` records hg_dagger itself) and into
        every replay verdict.
    replayable: whether an episode re-runs from its recorded seed and applied actions here (``hg-dagger
        replay``); ``not_replayable`` says why not.
    hold: what a held row does (see HoldBehaviour).
    install: how to get the packages, shown when the factory fails to import.
    """

    factory: Callable[..., Any] | str
    simulator: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    replayable: bool = True
    not_replayable: str = ""
    hold: HoldBehaviour = "none"
    install: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if self.hold not in HOLD_BEHAVIOURS:
            raise ValueError(f"BackendSpec.hold {self.hold!r}: one of {', '.join(HOLD_BEHAVIOURS)}")
        if not self.replayable and not self.not_replayable:
            raise ValueError("BackendSpec: a backend that is not replayable says why (not_replayable)")

    @property
    def packages(self) -> tuple[str, ...]:
        """Every distribution the backend needs, simulator first, each once."""
        return tuple(dict.fromkeys((*self.simulator, *self.env)))

    def load_factory(self) -> Callable[..., Any]:
        """The factory itself (a ``"module:attr"`` string is imported here; ImportError propagates)."""
        if not isinstance(self.factory, str):
            return self.factory
        module, _, attr = self.factory.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        factory: Callable[..., Any] = obj
        return factory


BACKENDS: Registry[BackendSpec] = Registry("backends", "backend")

BACKENDS.register("toy", BackendSpec(
    "hg_dagger.envs.toy:ToyReachEnv", simulator=("numpy",), hold="still",
    description="a planar 2-link arm in numpy (fast tests)"))
BACKENDS.register("fetch", BackendSpec(
    "hg_dagger.envs.fetch:FetchVecEnv", simulator=("mujoco",), env=("gymnasium", "gymnasium-robotics"), hold="pin",
    install="pip install mujoco==3.3.0 gymnasium-robotics",
    description="Gymnasium-Robotics Fetch Reach / Push / PickAndPlace (MuJoCo), signals and a held arm"))
BACKENDS.register("metaworld", BackendSpec(
    "hg_dagger.envs.metaworld:MetaWorldVecEnv", simulator=("mujoco",), env=("gymnasium", "metaworld"), hold="pin",
    install="pip install mujoco==3.3.0 metaworld==3.1.1",
    description="Meta-World v3 tasks, goal observable (MuJoCo)"))
BACKENDS.register("embodichain", BackendSpec(
    "hg_dagger.envs.embodichain:EmbodiChainEnv", simulator=("embodichain",), replayable=False, hold="none",
    not_replayable="EmbodiChain episodes cannot be replayed here (its simulator, dexsim, is not installed)",
    install="pip install embodichain (dexsim_engine comes from DexForce's package index; the PyPI package "
            "'dexsim' is unrelated)",
    description="an EmbodiChain EmbodiedEnv (GPU simulator dexsim)"))
BACKENDS.register("gymnasium", BackendSpec(
    "hg_dagger.envs.gymnasium_env:GymnasiumVecEnv", simulator=("mujoco",), env=("gymnasium", "gymnasium-robotics"),
    hold="pause", install="pip install 'gymnasium[mujoco]' gymnasium-robotics (or the package that registers the id)",
    description="any registered Gymnasium env with a Box action space, named by its id (backend_options.gym_id)"))


def known_backends() -> str:
    """The registered backend names, comma separated (plugins included), for messages."""
    return ", ".join(BACKENDS.names())


__all__ = ["BACKENDS", "HOLD_BEHAVIOURS", "BackendSpec", "HoldBehaviour", "known_backends"]
