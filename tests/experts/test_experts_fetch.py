"""The Fetch planner on real MuJoCo: success from reset and from states it did not choose.

Kept small (8 episodes per condition, horizon 150); benchmarks/bench_experts.py measures 100+ episodes.
"""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.control.expert_runs import run_expert
from hg_dagger.envs import make_env
from hg_dagger.experts import make_expert, query_expert
from hg_dagger.experts.fetch import GRIP, OBJECT

pytestmark = [pytest.mark.simulation]

TASKS = ["fetch_reach", "fetch_push", "fetch_pick_place"]


@pytest.fixture(scope="module")
def envs():
    made = {t: make_env(t, num_envs=8, seed=0) for t in TASKS}
    yield made
    for env in made.values():
        env.close()


@pytest.mark.parametrize("task", TASKS)
def test_planner_succeeds_from_reset(envs, task):
    rep = run_expert(envs[task], make_expert(task), episodes=8, seed=100)
    assert rep.episodes == 8
    assert rep.successes == 8, rep.failures
    assert rep.invalid_rows == 0


@pytest.mark.parametrize("task", TASKS)
def test_planner_recovers_after_random_actions(envs, task):
    """10-40 uniform random actions first: block knocked around, gripper half-closed, arm elsewhere."""
    rep = run_expert(envs[task], make_expert(task), episodes=8, seed=200, perturb_steps=(10, 40))
    assert rep.episodes == 8
    assert rep.success_rate >= 7 / 8, rep.failures


def test_pick_place_recovers_after_the_block_is_dropped_mid_air(envs):
    """Carry the block up, open the fingers so it falls, then hand control back to the planner."""
    env = envs["fetch_pick_place"]
    expert = make_expert("fetch_pick_place")
    ids = np.arange(env.num_envs)
    obs, _ = env.reset(seed=300)
    dropped = np.zeros(env.num_envs, bool)
    carried = np.zeros(env.num_envs, np.int64)
    releasing = np.zeros(env.num_envs, np.int64)
    for _ in range(env.mapping.horizon):
        q = query_expert(expert, obs, ids, env.mapping)
        action = q.action.copy()
        carried += q.metadata["phase"] == "carry"
        start = ~dropped & (carried >= 5)  # in the grasp and on its way for 5 steps
        releasing[start] = 6
        dropped |= start
        rel = releasing > 0
        action[rel] = [0.0, 0.0, 0.0, 1.0]  # stop and open: the block falls
        releasing[rel] -= 1
        res = env.step(action)
        if (res.terminated | res.truncated).any():
            break
        obs = res.obs
    # every row was made to drop its block, and every row still ends with the block on the goal
    assert dropped.all()
    assert res.truncated.all() and res.success.all()


def test_actions_depend_only_on_the_current_observation(envs):
    """No hidden plan: the same observation gets the same label whatever was asked before."""
    env = envs["fetch_pick_place"]
    expert = make_expert("fetch_pick_place")
    obs, _ = env.reset(seed=400)
    first = expert.act(obs, env_ids=np.arange(8)).action
    rng = np.random.default_rng(0)
    for _ in range(20):
        res = env.step(rng.uniform(-1, 1, (8, 4)).astype(np.float32))
        expert.act(res.obs, env_ids=np.arange(8))
    again = expert.act(obs, env_ids=np.arange(8)).action
    np.testing.assert_array_equal(first, again)
    # and rows are independent of each other: one row alone gets the label it got in the batch
    np.testing.assert_array_equal(expert.act({k: v[3:4] for k, v in obs.items()}, env_ids=[3]).action[0], first[3])


def test_unrecoverable_rows_are_invalid_with_a_reason(envs):
    env = envs["fetch_pick_place"]
    obs, _ = env.reset(seed=500)
    obs = {k: v.copy() for k, v in obs.items()}
    obs["observation"][2, OBJECT] = [1.3, 0.2, 0.1]  # fell off the table onto the floor
    obs["desired_goal"][5] = [2.5, 0.75, 0.5]  # out of the arm's reach
    q = query_expert(make_expert("fetch_pick_place"), obs, np.arange(8), env.mapping)
    assert "off the table" in q.invalid_reason[2]
    assert "out of the arm's reach" in q.invalid_reason[5]
    np.testing.assert_array_equal(np.flatnonzero(~q.valid), [2, 5])
    assert np.isfinite(q.action[q.valid]).all()


def test_a_block_held_beyond_the_table_edge_is_still_valid(envs):
    """Carried over the edge is recoverable (it is in the hand); lying there would not be."""
    env = envs["fetch_pick_place"]
    obs, _ = env.reset(seed=600)
    obs = {k: v.copy() for k, v in obs.items()}
    grip = obs["observation"][0, GRIP].copy()
    grip[0] = 1.6
    obs["observation"][0, GRIP] = grip
    obs["observation"][0, OBJECT] = grip
    obs["observation"][0, 9:11] = 0.024
    q = query_expert(make_expert("fetch_pick_place"), obs, np.arange(8), env.mapping)
    assert q.valid[0] and q.metadata["phase"][0] == "carry"
