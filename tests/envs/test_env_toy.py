"""The numpy toy backend against the VecEnv contract (fast; the MuJoCo backends have their own tests)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.envs.toy import forward, toy_ik_action
from hg_dagger.errors import EnvError


def test_expert_solves_every_episode():
    env = make_env("toy_reach", num_envs=16, seed=3)
    obs, _ = env.reset(seed=3)
    ended = success = 0
    for _ in range(env.mapping.horizon):
        res = env.step(toy_ik_action(obs, step_dt=env.mapping.dt))
        obs = res.obs
        ended += int((res.terminated | res.truncated).sum())
        success += int((res.success & (res.terminated | res.truncated)).sum())
    assert ended >= 16 and success == ended


def test_observations_are_consistent_with_kinematics():
    env = make_env("toy_reach", num_envs=4, seed=0)
    obs, info = env.reset(seed=0)
    np.testing.assert_allclose(forward(obs["qpos"].astype(np.float64)), obs["ee_pos"], atol=1e-5)
    assert info["t_obs"].dtype == np.int64 and info["t_obs"].shape == (4,)


def test_reset_is_deterministic_per_row():
    a, _ = make_env("toy_reach", num_envs=3, seed=11).reset(seed=11)
    b, _ = make_env("toy_reach", num_envs=3, seed=11).reset(seed=11)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    env = make_env("toy_reach", num_envs=3, seed=11)
    before, _ = env.reset(seed=11)
    after, _ = env.reset(seed=[11 + 1], env_ids=[1])  # row 1 alone, same seed as before: same start
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    moved, _ = env.reset(seed=99, env_ids=[2])
    np.testing.assert_array_equal(moved["target"][:2], before["target"][:2])
    assert not np.array_equal(moved["target"][2], before["target"][2])


@pytest.mark.parametrize(
    "action, match",
    [
        (np.zeros((2, 3), np.float32), "shape"),
        (np.zeros((3, 2), np.float32), "shape"),
        (np.zeros((2, 2), np.int64), "dtype"),
        (np.array([[0, 0], [np.nan, 0]], np.float32), r"NaN/inf in env rows \[1\]"),
        (np.array([[np.inf, 0], [0, 0]], np.float32), "NaN/inf"),
        ("left", "dtype|shape|array"),
    ],
)
def test_malformed_action_refused_before_the_simulator(action, match):
    env = make_env("toy_reach", num_envs=2, seed=0)
    obs, _ = env.reset(seed=0)
    with pytest.raises(EnvError, match=match):
        env.step(action)
    # the state did not move: a zero action from here gives the reset obs back
    res = env.step(np.zeros((2, 2), np.float32))
    np.testing.assert_allclose(res.obs["qpos"], obs["qpos"], atol=1e-6)


def test_out_of_bounds_action_is_clipped_like_every_source():
    env = make_env("toy_reach", num_envs=1, seed=0)
    obs, _ = env.reset(seed=0)
    big = env.step(np.array([[50.0, -50.0]], np.float32)).obs["qpos"]
    env.reset(seed=0)
    unit = env.step(np.array([[1.0, -1.0]], np.float32)).obs["qpos"]
    np.testing.assert_allclose(big, unit)


def test_mapping_mismatch_fails_at_construction(tmp_path):
    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    data["observation"][1]["shape"] = [3]
    data["export"]["names"]["ee_pos"] = ["ee_x", "ee_y", "ee_z"]  # a consistent mapping that the backend does not fit
    path = tmp_path / "toy_wrong.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(EnvError, match="ee_pos"):
        make_env(path, num_envs=2)


def test_unknown_task_lists_known():
    with pytest.raises(EnvError, match="toy_reach"):
        make_env("toy_rech")


def test_mapping_is_the_task_file():
    env = make_env("toy_reach", num_envs=1)
    assert env.mapping.hash == load_mapping("toy_reach").hash and env.action_dim == 2 and env.step_dt == 0.04
