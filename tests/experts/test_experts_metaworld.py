"""Meta-World's bundled scripted policies behind the expert contract, on real MuJoCo."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.control.expert_runs import run_expert
from hg_dagger.envs import make_env
from hg_dagger.errors import ConfigError
from hg_dagger.experts import make_expert, query_expert
from hg_dagger.experts.metaworld import MW_ENV_NAMES

pytestmark = [pytest.mark.simulation]

TASKS = sorted(MW_ENV_NAMES)


@pytest.mark.parametrize("task", TASKS)
def test_scripted_policy_succeeds_from_reset_and_after_random_actions(task):
    env = make_env(task, num_envs=4, seed=0)
    try:
        expert = make_expert(task, mapping=env.mapping)
        clean = run_expert(env, expert, episodes=4, seed=10)
        assert clean.successes == 4, clean.failures
        assert clean.invalid_rows == 0 and clean.latency_ns
        pushed = run_expert(env, expert, episodes=4, seed=20, perturb_steps=(10, 40))
        assert pushed.episodes == 4
        assert pushed.success_rate >= 3 / 4, pushed.failures
    finally:
        env.close()


def test_labels_equal_the_bundled_policy_on_the_flat_observation():
    from metaworld.policies import ENV_POLICY_MAP

    env = make_env("mw_reach", num_envs=3, seed=1)
    try:
        obs, _ = env.reset(seed=1)
        q = query_expert(make_expert("mw_reach", mapping=env.mapping), obs, np.arange(3), env.mapping)
        policy = ENV_POLICY_MAP["reach-v3"]()
        flat = np.concatenate([obs["observation"], obs["desired_goal"]], axis=1).astype(np.float64)
        expected = np.clip([policy.get_action(row) for row in flat], -1, 1)
        np.testing.assert_allclose(q.action, expected, rtol=1e-6)
        assert q.valid.all()
    finally:
        env.close()


def test_missing_observation_key_and_unknown_task_are_named():
    with pytest.raises(ConfigError, match="mw_stack"):
        make_expert("mw_stack")
    expert = make_expert("mw_push")
    with pytest.raises(ConfigError, match="desired_goal"):
        expert.act({"observation": np.zeros((1, 36), np.float32)}, env_ids=[0])
