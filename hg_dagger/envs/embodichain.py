"""EmbodiChain in both directions.

``EmbodiChainEnv`` wraps an EmbodiChain ``EmbodiedEnv`` (GPU simulator dexsim) as our VecEnv. It is
imported only when the task's backend is ``embodichain`` and needs ``embodichain`` plus its
simulator ``dexsim_engine`` (served by DexForce's own package index). EmbodiedEnv resets finished
rows inside step() and returns the next episode's observation, which loses the observation that
ended the episode; the adapter therefore switches that off (the flag EmbodiChain's own replay
wrapper uses) and resets finished rows itself, after keeping their final observation, exactly as the
VecEnv contract says. Observation keys in the mapping are paths into EmbodiChain's observation
TensorDict, e.g. ``robot/qpos``, ``robot/qvel``, ``robot/qf``, ``sensor/cam/color``. Timing is checked:
the mapping's step_dt must equal physics_dt x sim_steps_per_control.

``LearningVecEnvAdapter`` goes the other way: any of our VecEnvs satisfies EmbodiChain's
``LearningVecEnv`` protocol (embodichain/learning/rl/env.py), so EmbodiChain's SyncCollector can
drive it. It speaks the policy action space and the mapping's flattened observation, and sends
every action through ``mapping.policy_to_raw`` - the same clip path every other source takes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.envs.base import Obs, StepResult, VecEnv, check_view_args
from hg_dagger.envs.common import fit_image, image_keys, row_seeds, rows_of
from hg_dagger.envs.mapping import TaskMapping
from hg_dagger.errors import EnvError

NEEDS = (
    "the embodichain backend needs EmbodiChain and its simulator: pip install embodichain "
    "(dexsim_engine comes from DexForce's package index; the PyPI package 'dexsim' is unrelated)"
)


def _default_make(mapping: TaskMapping, num_envs: int, seed: int | None):
    """Build the EmbodiedEnv named by backend_options (gym_id + gym_config JSON)."""
    try:
        import embodichain.lab.gym  # noqa: F401 - registers EmbodiChain's envs; imports dexsim
        import gymnasium
        from embodichain.lab.gym.utils.gym_utils import config_to_cfg
    except ImportError as exc:
        raise EnvError(f"{mapping.source}: {NEEDS} ({exc})") from None
    opts = mapping.backend_options
    path = Path(str(opts.get("gym_config", "")))
    if not path.is_file():
        raise EnvError(f"{mapping.source}: backend_options.gym_config {str(path)!r} is not a file")
    cfg = config_to_cfg(json.loads(path.read_text()), source_path=path)
    cfg.num_envs = num_envs
    cfg.seed = seed
    return gymnasium.make(id=opts["gym_id"], cfg=cfg).unwrapped


def _get(td: Any, path: str):
    value = td
    for part in path.split("/"):
        value = value[part]
    return value


class EmbodiChainEnv(VecEnv):
    """An EmbodiedEnv behind the VecEnv contract (rows reset by us, so final_obs is kept)."""

    def __init__(
        self,
        mapping: TaskMapping,
        num_envs: int = 1,
        seed: int | None = None,
        make_fn: Callable[[TaskMapping, int, int | None], Any] | None = None,
    ):
        # torch deferred: seconds to import; only the code that runs a model loads it
        import torch

        self._torch = torch
        self.task_id = mapping.task_id
        self.num_envs = int(num_envs)
        self._mapping = mapping
        self.env = (make_fn or _default_make)(mapping, self.num_envs, seed)
        self.env._replay_no_auto_reset = True  # we reset finished rows ourselves (keeps final_obs)
        self.device = torch.device(getattr(self.env, "device", "cpu"))
        self._keys = [(k.name, np.dtype(k.dtype)) for k in mapping.observation]
        self._view_key = next(iter(image_keys(mapping)), None)  # a camera sensor the mapping already reads
        self._last_obs: Obs | None = None
        where = mapping.source
        if int(self.env.num_envs) != self.num_envs:
            raise EnvError(f"{where}: EmbodiedEnv has {self.env.num_envs} rows, asked for {self.num_envs}")
        step_dt = float(self.env.physics_dt) * int(self.env.cfg.sim_steps_per_control)
        if abs(step_dt - mapping.dt) > 1e-9:
            raise EnvError(
                f"{where}: step_dt {mapping.dt:g} s but EmbodiedEnv steps physics_dt {self.env.physics_dt:g} x "
                f"sim_steps_per_control {self.env.cfg.sim_steps_per_control} = {step_dt:g} s"
            )
        dim = int(np.prod(self.env.single_action_space.shape))
        if dim != mapping.action_dim:
            raise EnvError(f"{where}: action has {mapping.action_dim} names but EmbodiedEnv takes {dim} values")

    @property
    def mapping(self) -> TaskMapping:
        return self._mapping

    def _to_numpy(self, td: Any) -> Obs:
        out = {}
        for name, dtype in self._keys:
            try:
                value = _get(td, name)
            except KeyError:
                raise EnvError(f"{self._mapping.source}: observation {name!r} is not in EmbodiedEnv's observation") from None
            out[name] = value.detach().cpu().numpy().astype(dtype, copy=False)
        return out

    def _np(self, t: Any, dtype) -> np.ndarray:
        return t.detach().cpu().numpy().astype(dtype, copy=False).reshape(self.num_envs)

    def reset(self, seed=None, env_ids=None) -> tuple[Obs, dict]:
        rows = rows_of(env_ids, self.num_envs, where=self.task_id)
        seeds = row_seeds(seed, rows, where=self.task_id)
        # EmbodiChain seeds the whole simulator at once: one seed per reset call (the first row's).
        options = None if env_ids is None else {"reset_ids": self._torch.as_tensor(rows, device=self.device)}
        td, _ = self.env.reset(seed=seeds[0] if seeds else None, options=options)
        self._last_obs = self._to_numpy(td)
        return self._last_obs, {"t_obs": np.full(self.num_envs, now_ns(), dtype=np.int64)}

    def observe(self) -> tuple[Obs, dict] | None:
        if self._last_obs is None:
            return None
        return ({k: v.copy() for k, v in self._last_obs.items()},
                {"t_obs": np.full(self.num_envs, now_ns(), dtype=np.int64)})

    def render_view(self, row: int = 0, size: int = 256) -> np.ndarray | None:
        """The camera sensor's latest frame of ``row`` fitted to [size, size, 3]; None without an image key."""
        check_view_args(row, size, self.num_envs, where=self.task_id)
        if self._view_key is None or self._last_obs is None:
            return None
        return fit_image(self._last_obs[self._view_key][int(row)], int(size))

    def step(self, action: np.ndarray) -> StepResult:
        a = self._mapping.clip_raw(self.check_action(action))
        t_apply = now_ns()
        td, reward, terminated, truncated, info = self.env.step(self._torch.as_tensor(a, device=self.device))
        obs = self._to_numpy(td)
        t_obs = np.full(self.num_envs, now_ns(), dtype=np.int64)
        terminated, truncated = self._np(terminated, bool), self._np(truncated, bool)
        done = terminated | truncated
        final_obs = obs
        if done.any():
            rows = np.flatnonzero(done)
            fresh, _ = self.env.reset(options={"reset_ids": self._torch.as_tensor(rows, device=self.device)})
            obs = self._to_numpy(fresh)
            t_obs[rows] = now_ns()
        success = info.get("success", None) if hasattr(info, "get") else None
        self._last_obs = obs
        return StepResult(obs, self._np(reward, np.float32), terminated, truncated,
                          success=self._np(success, bool) if success is not None else np.zeros(self.num_envs, bool),
                          final_obs=final_obs, episode_start=done, t_obs=t_obs,
                          t_action_apply=np.full(self.num_envs, t_apply, dtype=np.int64))

    def close(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()


class LearningVecEnvAdapter:
    """Our VecEnv as EmbodiChain's LearningVecEnv: torch in, torch out, policy action space.

    Observations are the mapping's flattened, normalized vector ([N, flat_dim] float32), which
    EmbodiChain's collector wraps as the single group "obs". Finished rows auto-reset inside step()
    (as LearningVecEnv requires); their final observation is in info["final_obs"] (flattened).
    """

    def __init__(self, env: VecEnv, device: str | Any = "cpu"):
        # gymnasium deferred: the sim extra, optional; torch deferred: seconds to import; only the code that runs a model loads it
        import gymnasium as gym
        import torch

        self._torch = torch
        self.env = env
        self.mapping = env.mapping
        self.num_envs = env.num_envs
        self.device = torch.device(device)
        m = self.mapping
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (m.flat_dim,), np.float32)
        arr = m._arrays
        self.single_action_space = gym.spaces.Box(arr["pol_low"], arr["pol_high"], (m.action_dim,), np.float32)

    def _t(self, a: np.ndarray):
        return self._torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        env_ids = None if not options else options.get("reset_ids")
        if env_ids is not None and hasattr(env_ids, "tolist"):
            env_ids = env_ids.tolist()
        obs, info = self.env.reset(seed=seed, env_ids=env_ids)
        return self._t(self.mapping.flatten_obs(obs)), dict(info)

    def step(self, action):
        a = action.detach().cpu().numpy() if hasattr(action, "detach") else np.asarray(action)
        a = self.env.check_action(a)  # refuse NaN/shape before converting
        res = self.env.step(self.mapping.policy_to_raw(a))
        info = {**res.info, "final_obs": self._t(self.mapping.flatten_obs(res.final_obs)),
                "success": self._t(res.success), "episode_start": self._t(res.episode_start),
                "t_obs": res.t_obs, "t_action_apply": res.t_action_apply}
        return (
            self._t(self.mapping.flatten_obs(res.obs)),
            self._t(res.reward),
            self._t(res.terminated),
            self._t(res.truncated),
            info,
        )

    def close(self) -> None:
        self.env.close()
