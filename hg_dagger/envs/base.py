"""The env contract every backend (MuJoCo, Meta-World, toy, EmbodiChain, robot bridge) satisfies.

Batched and gymnasium-small: reset/step over ``num_envs`` rows. Observations are a dict of numpy
arrays with a leading batch dim, keyed by the task mapping's observation keys (a TensorDict view is
one call away: ``hg_dagger.envs.base.as_tensordict``). Actions are float32 [num_envs, action_dim]
in the task's canonical raw action space; policies, experts and people all reach it through the
same mapping (hg_dagger.envs.mapping).

Auto-reset is explicit. When row i finishes inside step(), step() resets it and returns the fresh
episode's first observation in ``obs[i]``; the observation that ended the episode is in
``final_obs[key][i]`` of the StepResult and its ``episode_start[i]`` is True. So the pre-action
observation of every stored step is always ``obs`` from the previous call, for that row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hg_dagger.errors import EnvError

Obs = dict[str, np.ndarray]


@dataclass
class StepResult:
    """One step of every row. What every backend must report is a typed field; ``info`` holds the optional rest:
    "alignment_error_ms" float32 [N], "transport_ns" int64 [N], "signals" dict of [N] arrays, and the robot
    faults "estop" (the robot is e-stopped or refuses motion for that row) and "sensor_loss" (that row's
    observation is stale or missing), bool [N], absent meaning all False (also in reset info)."""

    obs: Obs  # [N, ...] per key; rows that auto-reset hold the new episode's first obs
    reward: np.ndarray  # float32 [N]
    terminated: np.ndarray  # bool [N]
    truncated: np.ndarray  # bool [N]
    success: np.ndarray  # bool [N] task success after this step (of the episode that just stepped)
    final_obs: Obs  # the obs that ended the episode, valid in rows where terminated | truncated
    episode_start: np.ndarray  # bool [N] the row was auto-reset: obs[i] starts a new episode
    t_obs: np.ndarray  # int64 [N] when obs was sampled (monotonic ns, our clock)
    t_action_apply: np.ndarray  # int64 [N] when the action was applied (monotonic ns, our clock)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> np.ndarray:
        return self.terminated | self.truncated


class VecEnv(ABC):
    """A batch of ``num_envs`` copies of one task."""

    num_envs: int
    task_id: str
    # "stepped": the world waits for each step (a local simulator), so obs-to-apply latency moves nothing;
    # "live": it runs on its own clock (a robot), so late actions land in a different state than observed
    world_clock: str = "stepped"

    @property
    def robot(self) -> str:
        """What this env steps, for EpisodeStart.versions.robot: a simulator's model and the hash of its compiled
        assets (two runs with the same string stepped the same robot), or what a robot reports about itself."""
        return ""

    @property
    @abstractmethod
    def mapping(self):  # -> hg_dagger.envs.mapping.TaskMapping
        """The task's observation/action mapping (validated at construction)."""

    @property
    def action_dim(self) -> int:
        return self.mapping.action_dim

    @property
    def control_hz(self) -> float:
        return self.mapping.control_hz

    @property
    def step_dt(self) -> float:
        return 1.0 / self.mapping.control_hz

    @abstractmethod
    def reset(self, seed: int | Sequence[int] | None = None, env_ids: Sequence[int] | None = None) -> tuple[Obs, dict]:
        """Reset some (env_ids) or all rows. Returns the full batch obs and info (with "t_obs")."""

    pauses_rows: bool = False  # step(action, paused=mask) leaves the masked rows untouched (a simulator)

    @abstractmethod
    def step(self, action: np.ndarray) -> StepResult:
        """Apply one raw action per row. Call ``check_action`` first.

        A backend with ``pauses_rows`` also takes ``paused`` (bool [N]): those rows are not stepped (no physics,
        no time towards the horizon, their last observation, reward 0, never done, ``t_action_apply`` -1), so one
        row can wait for a person while the others run."""

    def observe(self) -> tuple[Obs, dict] | None:
        """Every row's current observation without stepping, with info["t_obs"] (and fault flags where
        the backend has them), or None when the backend cannot. Live loops call it at the start of a
        tick so the decision acts on a fresh sample: a robot's state moves between ticks; a
        simulator's is frozen, so its last observation is its current one."""
        return None

    def hold(self) -> None:  # noqa: B027 - optional hook
        """Safe stop: stop every row's motion now and hold position until the next ``step``.

        The robot bridge server calls it when it enters hold or e-stop (heartbeat loss, a lost
        session, ``bye``, an e-stop), so the robot stops because it was told to, not because commands
        happen to stop. A robot driver commands its hold (zero motion, brakes); a simulator that only
        advances on ``step`` already holds, so the default does nothing. Must not reset or advance."""

    def render_view(self, row: int = 0, size: int = 256) -> np.ndarray | None:
        """The scene of ``row`` as a person would watch it: uint8 [size, size, 3] RGB, upright.

        Not what the policy sees (state-only tasks get a picture too); None when the backend has no
        view. Call it from the thread that steps the env: GL renderers are created lazily in the
        calling thread and released by ``close()``."""
        check_view_args(row, size, self.num_envs, where=self.task_id)
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release simulator/network resources."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def check_action(self, action: Any) -> np.ndarray:
        """Refuse a malformed action before it reaches a simulator or robot."""
        return check_action(action, self.num_envs, self.action_dim, where=self.task_id)


def check_action(action: Any, num_envs: int, action_dim: int, *, where: str) -> np.ndarray:
    if not isinstance(action, np.ndarray):
        try:
            action = np.asarray(action.detach().cpu().numpy() if hasattr(action, "detach") else action)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            raise EnvError(f"{where}: action of type {type(action).__name__} is not an array") from exc
    if action.shape != (num_envs, action_dim):
        raise EnvError(f"{where}: action has shape {action.shape}, expected ({num_envs}, {action_dim})")
    if action.dtype.kind != "f":
        raise EnvError(f"{where}: action has dtype {action.dtype}, expected a float dtype")
    if not np.isfinite(action).all():
        rows = sorted({int(r) for r in np.argwhere(~np.isfinite(action))[:, 0]})
        raise EnvError(f"{where}: action has NaN/inf in env rows {rows}; refused before reaching the env")
    return action.astype(np.float32, copy=False)


def check_view_args(row: Any, size: Any, num_envs: int, *, where: str) -> None:
    """Refuse a view request for a row that does not exist or a size that is not a positive int."""
    if isinstance(row, bool) or not isinstance(row, int | np.integer) or not 0 <= int(row) < num_envs:
        raise EnvError(f"{where}: render_view row {row!r} out of range 0..{num_envs - 1}")
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or not 16 <= int(size) <= 4096:
        raise EnvError(f"{where}: render_view size {size!r} must be an int in 16..4096")


def fault_flags(info: dict, key: str, num_envs: int) -> np.ndarray:
    """info[key] ("estop" or "sensor_loss") as bool [num_envs]; a backend that does not report it means False."""
    value = info.get(key)
    if value is None:
        return np.zeros(num_envs, bool)
    return np.broadcast_to(np.asarray(value, dtype=bool), (num_envs,)).copy()


def as_tensordict(obs: Obs):
    """A TensorDict view (shares memory) of a batched numpy observation."""
    # torch, tensordict deferred: seconds to import; only the code that uses them loads them
    import torch
    from tensordict import TensorDict

    n = len(next(iter(obs.values())))
    return TensorDict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}, batch_size=[n])
