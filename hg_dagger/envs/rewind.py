"""Rewind one row of a simulator: a reset with the episode's seed, then its recorded applied actions again.

A deterministic simulator (a backend that replays: ``BackendSpec.replayable``) reaches the same state this way
as the episode did, so a person can correct from a moment before a failure instead of after it. The other rows
wait, paused (``VecEnv.pauses_rows``), so only the rewound robot moves; an env that cannot pause rows can rewind
only when it has one.
"""

from __future__ import annotations

import numpy as np

from hg_dagger.envs.backends import BACKENDS
from hg_dagger.errors import EnvError


def why_not_rewindable(env) -> str:
    """Why ``env`` cannot rewind a row ("" when it can)."""
    if getattr(env, "world_clock", "stepped") != "stepped":
        return "a robot cannot be rewound (only a simulator can go back in time)"
    backend = env.mapping.backend
    spec = BACKENDS.get(backend) if backend in BACKENDS else None
    if spec is None or not spec.replayable:
        return f"the {backend} backend does not re-run an episode from its seed and actions" + (
            f" ({spec.not_replayable})" if spec is not None and spec.not_replayable else "")
    if env.num_envs > 1 and not env.pauses_rows:
        return f"this {backend} env steps all {env.num_envs} rows together, so one cannot go back alone"
    return ""


def restore_row(env, row: int, seed: int, actions: np.ndarray) -> tuple[dict[str, np.ndarray], dict]:
    """Reset ``row`` with ``seed`` and step it through ``actions`` [k, A] (the others paused): the (obs, info) of
    the env afterwards, ``info["t_obs"]`` included. EnvError when the env cannot, or when the re-run ends the
    episode before its last action (the simulator did not reproduce the record)."""
    why = why_not_rewindable(env)
    if why:
        raise EnvError(why)
    n, a = env.num_envs, env.mapping.action_dim
    obs, info = env.reset(seed=[int(seed)], env_ids=[int(row)])
    info = dict(info)
    paused = np.ones(n, bool)
    paused[row] = False
    full = np.zeros((n, a), np.float32)
    for k, action in enumerate(np.asarray(actions, np.float32)):
        full[row] = action
        step = env.step(full, paused=paused) if env.pauses_rows else env.step(full)
        if (step.terminated[row] or step.truncated[row]) and k < len(actions) - 1:
            raise EnvError(f"rewinding row {row}: the simulator ended the episode at step {k}, the record went on")
        obs = step.obs
        info = {**step.info, "t_obs": step.t_obs, "success": step.success}
    return obs, info
