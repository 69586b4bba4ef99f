"""The worker-local smoke test behind `hg-dagger check-env TASK`: build, reset, step, compare to the mapping.

Run it in the process that will drive the env (a Ray worker included) before trusting that
process's simulator: it catches a missing renderer, a mismatched simulator version or a mapping
that no longer matches the backend. Every failure raises EnvError with what did not match.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hg_dagger.contract.command import COMMAND_DIM
from hg_dagger.envs import BACKENDS, backend_spec, load_mapping, make_env
from hg_dagger.envs.base import StepResult, VecEnv
from hg_dagger.errors import EnvError

FAULT_KEYS = ("estop", "sensor_loss")  # optional; when present, bool [N]
VIEW_SIZE = 64


def _expect(cond: bool, what: str, task: str) -> None:
    if not cond:
        raise EnvError(f"check-env {task}: {what}")


def _check_step(env: VecEnv, res: StepResult, label: str) -> None:
    n, t = env.num_envs, env.task_id
    env.mapping.check_obs(res.obs, num_envs=n, where=f"check-env {t} ({label})")
    typed = (("reward", res.reward, np.float32), ("terminated", res.terminated, bool), ("truncated", res.truncated, bool),
             ("success", res.success, bool), ("episode_start", res.episode_start, bool),
             ("t_obs", res.t_obs, np.int64), ("t_action_apply", res.t_action_apply, np.int64))
    for name, arr, dtype in typed:
        _expect(isinstance(arr, np.ndarray) and arr.shape == (n,) and arr.dtype == dtype, f"{label}: {name} must be {np.dtype(dtype)}[{n}], got {getattr(arr, 'dtype', type(arr))}{list(getattr(arr, 'shape', []))}", t)
    for k in FAULT_KEYS:
        if k in res.info:
            v = np.asarray(res.info[k])
            _expect(v.shape == (n,) and v.dtype == bool, f"{label}: info[{k!r}] must be bool[{n}]", t)
    env.mapping.check_obs(res.final_obs, num_envs=n, where=f"check-env {t} ({label}) final_obs")
    for k, v in res.info.get("signals", {}).items():
        _expect(np.asarray(v).shape == (n,), f"{label}: signal {k!r} must have shape ({n},)", t)
    flat = env.mapping.flatten_obs(res.obs)
    _expect(flat.shape == (n, env.mapping.flat_dim) and bool(np.isfinite(flat).all()), f"{label}: flattened obs not finite [{n}, {env.mapping.flat_dim}]", t)


def smoke_test(task: str, *, num_envs: int = 2, steps: int = 5, seed: int = 0, log: Callable[[str], None] = print) -> None:
    """Reset/step smoke test of one task in this process; raises EnvError on the first mismatch."""
    with make_env(task, num_envs=num_envs, seed=seed) as env:
        m, t = env.mapping, env.task_id
        spec = backend_spec(m)
        log(f"backend {m.backend} (registered by {BACKENDS.origin(m.backend)}): hold {spec.hold}, "
            + ("replayable" if spec.replayable else f"not replayable: {spec.not_replayable}"))
        log(f"built {type(env).__name__} x{env.num_envs}: observations and timing match the mapping")
        obs_a, info = env.reset(seed=seed)
        m.check_obs(obs_a, num_envs=num_envs, where=f"check-env {t} reset")
        _expect(info.get("t_obs") is not None and np.asarray(info["t_obs"]).shape == (num_envs,), "reset info lacks t_obs[N]", t)
        obs_b, _ = env.reset(seed=seed)
        for k in obs_a:
            _expect(np.array_equal(obs_a[k], obs_b[k]), f"reset(seed={seed}) is not deterministic (key {k!r})", t)
        log(f"reset(seed={seed}) deterministic over {len(obs_a)} observation keys")
        rng = np.random.default_rng(seed)
        n, a = num_envs, m.action_dim
        sources = {
            "policy": lambda: m.policy_to_raw(rng.uniform(-1, 1, (n, a)).astype(np.float32)),
            "expert": lambda: m.expert_to_raw(rng.uniform(-1, 1, (n, a)).astype(np.float32)),
            "human": lambda: m.human_to_raw(rng.uniform(-1, 1, (n, COMMAND_DIM)).astype(np.float32)),
        }
        for label, make in sources.items():
            for _ in range(steps):
                res = env.step(make())
                _check_step(env, res, label)
        log(f"stepped {steps} x {len(sources)} action sources (policy, expert, human) through the mapping")
        _check_hold(env, spec.hold, res.obs, log)
        view = env.render_view(num_envs - 1, VIEW_SIZE)
        if view is None:
            log("no operator view (render_view gives None for this backend)")
        else:
            _expect(isinstance(view, np.ndarray) and view.shape == (VIEW_SIZE, VIEW_SIZE, 3) and view.dtype == np.uint8,
                    f"render_view must give uint8 [{VIEW_SIZE}, {VIEW_SIZE}, 3], got {getattr(view, 'dtype', type(view))}"
                    f"{list(getattr(view, 'shape', []))}", t)
            _expect(int(view.max()) != int(view.min()), "render_view gave a blank frame", t)
            log(f"operator view renders: uint8 [{VIEW_SIZE}, {VIEW_SIZE}, 3]")
        bad = np.zeros((n, a), np.float32)
        bad[-1, 0] = np.nan
        try:
            env.step(bad)
        except EnvError:
            log("NaN action refused before the simulator")
        else:
            raise EnvError(f"check-env {t}: a NaN action was accepted")
        try:
            env.step(np.zeros((n, a + 1), np.float32))
        except EnvError:
            log("wrong-shape action refused")
        else:
            raise EnvError(f"check-env {t}: an action of shape ({n}, {a + 1}) was accepted")
    _check_auto_reset(task, seed=seed, log=log)


def _check_hold(env: VecEnv, hold: str, last_obs: dict[str, np.ndarray], log: Callable[[str], None]) -> None:
    """The backend record's hold behaviour, where it can be checked without knowing the robot: after ``hold()``, a
    step of the hold action (every dim 0) leaves a ``still`` or ``pause`` backend's observation as it was."""
    t = env.task_id
    if hold not in ("still", "pause"):
        log(f"hold {hold}: not checked here" + (" (tests/envs/test_env_hold.py measures the pinned arms)"
                                                  if hold == "pin" else ""))
        return
    env.hold()
    seen = env.observe()
    before = seen[0] if seen is not None else last_obs
    res = env.step(np.zeros((env.num_envs, env.action_dim), np.float32))
    _check_step(env, res, "hold")
    rows = ~res.episode_start
    moved = [k for k in before if not np.array_equal(res.obs[k][rows], before[k][rows])]
    _expect(not moved, f"hold {hold}: a hold-action step after hold() changed {moved}", t)
    log(f"hold {hold}: after hold(), a hold-action step leaves every observation as it was")


def _check_auto_reset(task: str, *, seed: int, log: Callable[[str], None]) -> None:
    """A 2-step-horizon copy of the task must end, deliver final_obs and mark the fresh row."""
    mapping = load_mapping(task).model_copy(update={"horizon": 2})
    with make_env(mapping, num_envs=1, seed=seed) as env:
        zero = mapping.clip_raw(np.zeros((1, mapping.action_dim), np.float32))
        first = env.step(zero)
        _expect(not first.episode_start[0] and not first.truncated[0], "an episode ended before its horizon", task)
        last = env.step(zero)
        _expect(bool(last.truncated[0] or last.terminated[0]), "the episode did not end at its horizon", task)
        _expect(bool(last.episode_start[0]), "an auto-reset row is not marked episode_start", task)
        _check_step(env, last, "auto-reset")
        fresh = any(not np.array_equal(last.obs[k], last.final_obs[k]) for k in last.obs)
        _expect(fresh, "after auto-reset the row still holds the final observation", task)
    log("auto-reset: final_obs delivered, fresh row marked episode_start")
