"""Auto-reset label alignment, for every backend: final_obs is the observation that ended the episode,
and the returned row is the next episode's first observation (the pre-action obs of its first step)."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.envs import load_mapping, make_env

pytestmark = [pytest.mark.simulation]

CASES = {
    "toy_reach": dict(num_envs=3),
    "fetch_push": dict(num_envs=2),
    "fetch_pick_place_rgb": dict(num_envs=2),
    "mw_push": dict(num_envs=2),
}


def _short(task: str, horizon: int):
    return load_mapping(task).model_copy(update={"horizon": horizon})


def _actions(env, steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    m = env.mapping
    return [m.clip_raw(rng.uniform(-1, 1, (env.num_envs, env.action_dim)).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize("task", sorted(CASES))
def test_final_obs_and_fresh_row_are_the_right_observations(task):
    horizon, n = 3, CASES[task]["num_envs"]
    short = make_env(_short(task, horizon), num_envs=n, seed=7)  # truncates after `horizon` steps
    long = make_env(_short(task, 10 * horizon), num_envs=n, seed=7)  # same episodes, not cut
    acts = _actions(short, horizon + 1)
    for t in range(horizon):
        res = short.step(acts[t])
        ref = long.step(acts[t])
    assert np.all(res.truncated | res.terminated) and np.all(res.episode_start)
    for k, v in ref.obs.items():  # the episode-ending observation is delivered in final_obs
        np.testing.assert_array_equal(res.final_obs[k], v, err_msg=k)
    fresh, _ = long.reset()  # the same random stream draws the next episode's start
    for k, v in fresh.items():  # ...and that start is what step() returned in the row
        np.testing.assert_array_equal(res.obs[k], v, err_msg=k)
        assert not np.array_equal(res.obs[k], res.final_obs[k]) or k not in ("target", "desired_goal")
    # the next step starts from the fresh row: same result as stepping the reference from it
    nxt, ref_nxt = short.step(acts[horizon]), long.step(acts[horizon])
    assert not nxt.episode_start.any()
    for k, v in ref_nxt.obs.items():
        np.testing.assert_array_equal(nxt.obs[k], v, err_msg=k)


def test_only_finished_rows_reset():
    env = make_env("toy_reach", num_envs=4, seed=1)
    obs, _ = env.reset(seed=1)
    acts = np.zeros((4, 2), np.float32)
    env.step(acts)
    env.reset(seed=50, env_ids=[2])  # row 2 is one step behind the others now
    for _ in range(env.mapping.horizon - 2):
        res = env.step(acts)
    res = env.step(acts)
    assert res.truncated.tolist() == [True, True, False, True]
    assert res.episode_start.tolist() == [True, True, False, True]
