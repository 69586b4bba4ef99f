"""Meta-World backend on real MuJoCo: seeding that works, lifted step limit, upright images."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import yaml

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.errors import EnvError

pytestmark = [pytest.mark.simulation]


def test_reset_seed_is_honoured_per_row():
    a, _ = make_env("mw_pick_place", num_envs=2, seed=10).reset(seed=10)
    b, _ = make_env("mw_pick_place", num_envs=2, seed=10).reset(seed=10)
    c, _ = make_env("mw_pick_place", num_envs=2, seed=20).reset(seed=20)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    obj = slice(4, 7)  # the puck position: randomised per seed
    assert not np.allclose(a["observation"][0, obj], a["observation"][1, obj])
    assert not np.allclose(a["observation"][:, obj], c["observation"][:, obj])


def test_flat_observation_is_metaworlds_vector_and_its_policy_solves_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from metaworld.policies import ENV_POLICY_MAP
    env = make_env("mw_reach", num_envs=2, seed=1)
    obs, _ = env.reset(seed=1)
    policy = ENV_POLICY_MAP["reach-v3"]()
    solved = np.zeros(2, bool)
    for _ in range(150):
        flat = env.mapping.flatten_obs(obs)
        assert flat.shape == (2, 39)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            act = np.stack([policy.get_action(f.astype(np.float64)) for f in flat]).astype(np.float32)
        res = env.step(env.mapping.expert_to_raw(act))
        obs = res.obs
        solved |= res.success
    assert solved.all()
    assert res.info["signals"]["progress"].max() > -0.05


def test_horizon_beyond_metaworlds_own_limit():
    env = make_env(load_mapping("mw_reach").model_copy(update={"horizon": 520}), num_envs=1, seed=0)
    zero = np.zeros((1, 4), np.float32)
    for _ in range(519):
        res = env.step(zero)
        assert not res.truncated[0]
    assert env.step(zero).truncated[0]


def test_camera_is_flipped_upright(tmp_path):
    data = yaml.safe_load((TASKS_DIR / "mw_pick_place.yaml").read_text())
    data["backend_options"].update(camera="corner", camera_flip="rot180")
    data["observation"].append({"name": "rgb", "shape": [96, 96, 3], "dtype": "uint8"})
    path = tmp_path / "mw_rgb.yaml"
    path.write_text(yaml.safe_dump(data))
    env = make_env(path, num_envs=1, seed=0)
    img = env.reset(seed=0)[0]["rgb"][0].astype(float)
    # upright: empty (black) space above, the table below; Meta-World's raw frame is the other way up
    assert img[:24].mean() < img[-24:].mean()
    env.close()


def test_unknown_metaworld_task_is_named(tmp_path):
    data = yaml.safe_load((TASKS_DIR / "mw_reach.yaml").read_text())
    data["backend_options"]["env_name"] = "reach-v9"
    path = tmp_path / "mw_bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(EnvError, match="reach-v9"):
        make_env(path)


def test_lift_then_release_signals_one_drop():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from metaworld.policies import ENV_POLICY_MAP
    env = make_env("mw_pick_place", num_envs=1, seed=3)
    obs, _ = env.reset(seed=3)
    rest = obs["observation"][0, 6]  # puck height on the table
    policy = ENV_POLICY_MAP["pick-place-v3"]()
    forces, dropped = [], []
    for _ in range(150):  # Meta-World's own policy grasps and lifts the puck
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            act = np.stack([policy.get_action(f.astype(np.float64)) for f in env.mapping.flatten_obs(obs)])
        res = env.step(env.mapping.expert_to_raw(act))
        obs = res.obs
        forces.append(float(res.info["signals"]["contact_force"][0]))
        dropped.append(bool(res.info["signals"]["object_dropped"][0]))
        if obs["observation"][0, 6] > rest + 0.06:
            break
    assert obs["observation"][0, 6] > rest + 0.06 and max(forces) > 0 and not any(dropped)
    open_gripper = np.array([[0, 0, 0, -1.0]], np.float32)
    for _ in range(40):
        dropped.append(bool(env.step(open_gripper).info["signals"]["object_dropped"][0]))
    assert sum(dropped) == 1


def test_task_progress_counts_the_reach_for_the_puck():
    """The stall gate's signal on Meta-World: while the hand approaches the puck, ``progress`` (the puck to the
    target) stays flat and ``task_progress`` rises; on a reach task the hand is what moves, so the two agree."""
    env = make_env("mw_push", num_envs=1, seed=2)
    obs, _ = env.reset(seed=2)
    progress, task = [], []
    for _ in range(25):
        o = obs["observation"][0]
        move = np.clip((o[4:7] + [0.0, 0.0, 0.06] - o[0:3]) * 20.0, -1.0, 1.0)  # above the puck, not touching it
        res = env.step(np.array([[*move, -1.0]], np.float32))
        obs = res.obs
        progress.append(float(res.info["signals"]["progress"][0]))
        task.append(float(res.info["signals"]["task_progress"][0]))
    o = obs["observation"][0]
    assert task[-1] == pytest.approx(progress[-1] - np.linalg.norm(o[0:3] - o[4:7]), abs=1e-5)
    assert max(progress) - min(progress) < 0.002  # the puck did not move
    assert task[-1] - task[0] > 0.05  # the reach showed as progress
    reach = make_env("mw_reach", num_envs=1, seed=0)
    reach.reset(seed=0)
    res = reach.step(np.zeros((1, 4), np.float32))
    assert res.info["signals"]["task_progress"][0] == res.info["signals"]["progress"][0]
