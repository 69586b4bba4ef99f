"""Simulators pause one row of a batch: step(action, paused=mask) leaves the masked rows exactly where they were
(no physics, no time towards the horizon, reward 0, never done, no apply time) while the others step."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.envs import make_env


@pytest.mark.parametrize("task", [
    "toy_reach",
    pytest.param("fetch_pick_place", marks=pytest.mark.simulation),
    pytest.param("gym_pusher", marks=pytest.mark.simulation),
])
def test_a_paused_row_stays_where_it_is_while_the_others_step(task):
    with make_env(task, num_envs=3, seed=0) as env:
        assert env.pauses_rows
        rng = np.random.default_rng(0)
        m = env.mapping
        low, high = np.asarray(m.action.low, np.float32), np.asarray(m.action.high, np.float32)
        act = lambda: rng.uniform(low, high, (3, m.action_dim)).astype(np.float32)  # noqa: E731
        first = env.step(act())
        paused = np.array([False, True, False])
        before = {k: v[1].copy() for k, v in first.obs.items()}
        t_before = int(env._t[1])
        for _ in range(5):
            res = env.step(act(), paused=paused)
            for k, v in before.items():
                np.testing.assert_array_equal(res.obs[k][1], v, err_msg=k)
            assert res.reward[1] == 0 or task == "toy_reach"  # the toy's reward is its (unchanged) distance
            assert not res.terminated[1] and not res.truncated[1] and res.t_action_apply[1] == -1
        assert int(env._t[1]) == t_before  # no time towards the horizon
        moved = [k for k in before if not np.array_equal(res.obs[k][0], first.obs[k][0])]
        assert moved, "the rows that were not paused did not move"
        res = env.step(act())  # unpaused, it steps again
        assert res.t_action_apply[1] > 0 and int(env._t[1]) == t_before + 1
