"""Fetch backend on real MuJoCo: determinism, horizon and timing, signals, the lean RGB camera."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.errors import EnvError

pytestmark = [pytest.mark.simulation]


def _pick(obs: dict, phase: np.ndarray) -> np.ndarray:
    """A scripted grasp-and-lift (tests only): hover, descend open, close, lift."""
    o = obs["observation"]
    grip, rel = o[:, :3], o[:, 6:9]
    a = np.zeros((len(o), 4), np.float32)
    for i in range(len(o)):
        if phase[i] == 0:  # above the block, open
            a[i, :3] = np.clip((rel[i] + [0, 0, 0.08]) * 10, -1, 1)
            a[i, 3] = 1
            phase[i] += np.linalg.norm(rel[i, :2]) < 0.01 and abs(rel[i, 2] + 0.08) < 0.02
        elif phase[i] == 1:  # down around it
            a[i, :3] = np.clip(rel[i] * 10, -1, 1)
            a[i, 3] = 1
            phase[i] += np.linalg.norm(rel[i]) < 0.01
        elif phase[i] < 8:  # close for a few steps
            a[i, 3] = -1
            phase[i] += 1
        else:  # lift
            a[i, 2], a[i, 3] = 1.0, -1
            if grip[i, 2] > 0.6:
                a[i, 2] = 0
    return a


def test_reset_is_deterministic_and_rows_differ():
    a = make_env("fetch_push", num_envs=2, seed=4)
    b = make_env("fetch_push", num_envs=2, seed=4)
    oa, _ = a.reset(seed=4)
    ob, _ = b.reset(seed=4)
    for k in oa:
        np.testing.assert_array_equal(oa[k], ob[k])
    assert not np.array_equal(oa["achieved_goal"][0], oa["achieved_goal"][1])
    act = np.tile(np.array([[0.3, -0.2, 0.1, 1.0]], np.float32), (2, 1))
    for _ in range(3):
        ra, rb = a.step(act), b.step(act)
    for k in ra.obs:
        np.testing.assert_array_equal(ra.obs[k], rb.obs[k])


def test_timing_horizon_and_info_follow_the_mapping():
    env = make_env("fetch_reach", num_envs=2, seed=0)
    m = env.mapping
    assert (m.control_hz, m.horizon, env.step_dt) == (25, 150, 0.04)
    assert env.envs[0].dt == pytest.approx(0.04)
    res = env.step(np.zeros((2, 4), np.float32))
    assert res.reward.dtype == np.float32 and res.success.dtype == bool
    assert np.all(res.t_action_apply <= res.t_obs)
    np.testing.assert_allclose(
        res.info["signals"]["progress"],
        -np.linalg.norm(res.obs["achieved_goal"] - res.obs["desired_goal"], axis=1),
        rtol=1e-5,
    )


def test_grasp_lift_and_release_signals_a_drop():
    env = make_env("fetch_pick_place", num_envs=1, seed=2)
    obs, _ = env.reset(seed=2)
    phase = np.zeros(1, int)
    dropped, forces = [], []
    for _ in range(70):
        res = env.step(_pick(obs, phase))
        obs = res.obs
        dropped.append(bool(res.info["signals"]["object_dropped"][0]))
        forces.append(float(res.info["signals"]["contact_force"][0]))
    assert obs["achieved_goal"][0, 2] > 0.5, "the scripted grasp should have lifted the block"
    assert not any(dropped) and max(forces) > 0  # holding the block is contact, not a drop
    release = np.array([[0, 0, 0, 1.0]], np.float32)
    for _ in range(20):
        res = env.step(release)
        dropped.append(bool(res.info["signals"]["object_dropped"][0]))
    assert sum(dropped) == 1  # fires once, when the block lands


def test_task_progress_rises_while_the_gripper_reaches_for_the_block():
    """The stall gate's signal: before the grasp the block does not move (``progress`` stays flat), but the
    gripper closes in on it, and ``task_progress`` says so."""
    env = make_env("fetch_pick_place", num_envs=1, seed=3)
    obs, _ = env.reset(seed=3)
    phase = np.zeros(1, int)
    progress, task = [], []
    while phase[0] < 2:
        res = env.step(_pick(obs, phase))
        obs = res.obs
        progress.append(float(res.info["signals"]["progress"][0]))
        task.append(float(res.info["signals"]["task_progress"][0]))
        assert len(task) < 60, "the scripted reach should get around the block"
    o = obs["observation"][0]
    assert task[-1] == pytest.approx(progress[-1] - np.linalg.norm(o[0:3] - o[3:6]), abs=1e-5)
    assert max(progress) - min(progress) < 0.005  # the block did not move
    assert task[-1] - task[0] > 0.05  # the reach showed as progress
    reach = make_env("fetch_reach", num_envs=1, seed=0)  # no object: the same as progress
    res = reach.step(np.zeros((1, 4), np.float32))
    assert res.info["signals"]["task_progress"][0] == res.info["signals"]["progress"][0]


def test_rgb_variant_renders_lean_frames():
    env = make_env("fetch_pick_place_rgb", num_envs=2, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs["rgb"].shape == (2, 128, 128, 3) and obs["rgb"].dtype == np.uint8
    assert obs["rgb"].std() > 10  # a scene, not a blank frame
    model = env.envs[0].model
    assert model.vis.quality.shadowsize == 0 and model.vis.quality.offsamples == 0
    assert not np.array_equal(obs["rgb"][0], obs["rgb"][1])  # each row renders its own state
    res = env.step(np.tile(np.array([[1.0, 0, 0, 0]], np.float32), (2, 1)))
    assert not np.array_equal(res.obs["rgb"], obs["rgb"])
    for i, row in enumerate(env.envs):  # the rendered target marker sits at each row's goal
        np.testing.assert_allclose(row.data.site("target0").xpos, obs["desired_goal"][i], atol=1e-5)
    env.close()


def test_step_dt_mismatch_fails_at_construction(tmp_path):
    data = yaml.safe_load((TASKS_DIR / "fetch_reach.yaml").read_text())
    data.update(control_hz=50, step_dt=0.02)
    path = tmp_path / "fetch_fast.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(EnvError, match="step_dt 0.02"):
        make_env(load_mapping(path))


def test_nan_action_never_reaches_mujoco():
    env = make_env("fetch_reach", num_envs=2, seed=0)
    before = env.envs[1].data.qpos.copy()
    with pytest.raises(EnvError, match="rows"):
        env.step(np.array([[0, 0, 0, 0], [np.nan, 0, 0, 0]], np.float32))
    np.testing.assert_array_equal(env.envs[1].data.qpos, before)
