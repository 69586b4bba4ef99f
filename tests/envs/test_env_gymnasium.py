"""The gymnasium backend (real MuJoCo): any registered Gymnasium env with a Box action space, named by its id in a
task file of the user's. Gymnasium's own Pusher-v5 and Gymnasium-Robotics' AdroitHandDoor-v1 (which no other
backend wraps) from task files outside configs/tasks; determinism from the seed (what replay needs); the explicit
hold (a pause in simulation); and every misconfiguration - an unknown id, a discrete action space, observation
keys that do not cover the observation, bounds beyond the env's, a missing info key - as one line naming the file."""

from __future__ import annotations

from pathlib import Path

# Gymnasium's MuJoCo envs import glfw, which checks its library's version in a child process on first import: done
# here, at collection, so the tests below start no process of their own
import gymnasium.envs.mujoco.mujoco_rendering  # noqa: F401
import numpy as np
import pytest
import yaml

from hg_dagger.control.episodes import backend_versions
from hg_dagger.envs import BACKENDS, backend_spec, load_mapping, make_env
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.errors import ConfigError, EnvError

pytestmark = [pytest.mark.simulation]


def user_task(tmp_path: Path, src: str = "gym_pusher", task_id: str = "pusher", **changes) -> Path:
    """A copy of a shipped task file as a task file of the user's (outside configs/tasks), with ``changes``
    ("a.b": value) applied."""
    data = yaml.safe_load((TASKS_DIR / f"{src}.yaml").read_text())
    data["task_id"] = task_id
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        target = data
        for p in parents:
            target = target[p]
        target[leaf] = value
    path = tmp_path / f"{task_id}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rollout(env, steps: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    obs = [env.reset(seed=seed)[0]]
    for _ in range(steps):
        low, high = np.array(env.mapping.action.low), np.array(env.mapping.action.high)
        obs.append(env.step(rng.uniform(low, high, (env.num_envs, env.action_dim)).astype(np.float32)).obs)
    return obs


def test_pusher_from_a_task_file_of_the_users(tmp_path):
    path = user_task(tmp_path, horizon=6)
    m = load_mapping(path)
    assert m.source == str(path) and backend_spec(m) is BACKENDS.get("gymnasium")
    with make_env(path, num_envs=2, seed=3) as env:
        assert env.robot.startswith("Pusher-v5 (PusherEnv) model sha256:")
        obs, _ = env.reset(seed=3)
        assert {k: (v.shape, str(v.dtype)) for k, v in obs.items()} == {
            "qpos": ((2, 7), "float32"), "qvel": ((2, 7), "float32"), "fingertip": ((2, 3), "float32"),
            "object": ((2, 3), "float32"), "goal": ((2, 3), "float32")}
        np.testing.assert_allclose(obs["goal"][:, :2], [[0.45, -0.05]] * 2, atol=1e-6)  # Pusher's fixed goal
        still = np.zeros((2, 7), np.float32)
        for _ in range(6):
            res = env.step(still)
            dist = np.linalg.norm(res.final_obs["object"] - res.final_obs["goal"], axis=1)
            np.testing.assert_allclose(res.info["signals"]["progress"], -dist, atol=1e-5)  # info reward_dist
            np.testing.assert_array_equal(res.success, dist < 0.08)  # success: reward_dist >= -0.08
        assert res.truncated.all() and res.episode_start.all() and not res.terminated.any()  # the task's horizon
        assert not np.array_equal(res.obs["object"], res.final_obs["object"])  # fresh episodes, new cylinders
        view = env.render_view(1, 64)
        assert view.shape == (64, 64, 3) and view.dtype == np.uint8 and view.std() > 5
    v = backend_versions("gymnasium", "x")
    assert v.simulator.startswith("mujoco 3.3.0") and "gymnasium " in v.env and "gymnasium-robotics" in v.env


def test_pusher_is_deterministic_from_its_seed_row_by_row(tmp_path):
    """What replay relies on: the same seed and actions give the same observations bit for bit, and row i seeded
    with seed + i is the same episode as a one-row env seeded with seed + i."""
    path = user_task(tmp_path)
    with make_env(path, num_envs=2, seed=0) as a, make_env(path, num_envs=2, seed=0) as b:
        for x, y in zip(rollout(a, 25, seed=7), rollout(b, 25, seed=7), strict=True):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
    with make_env(path, num_envs=2) as two, make_env(path, num_envs=1) as one:
        first, _ = two.reset(seed=40)
        alone, _ = one.reset(seed=[41], env_ids=[0])
        for k in first:
            np.testing.assert_array_equal(first[k][1], alone[k][0])


def test_adroit_door_a_gymnasium_robotics_env_no_other_backend_wraps(tmp_path):
    path = user_task(tmp_path, "gym_adroit_door", "door", horizon=5)
    with make_env(path, num_envs=2, seed=1) as env:
        assert env.robot.startswith("AdroitHandDoor-v1 (AdroitHandDoorEnv) model sha256:")
        obs, _ = env.reset(seed=1)
        assert obs["hand_qpos"].shape == (2, 27) and obs["door_open"].tolist() == [[-1.0], [-1.0]]
        for _ in range(5):
            res = env.step(np.zeros((2, 28), np.float32))
        assert res.success.dtype == bool and not res.success.any()  # Adroit's info "success": the door is shut
        assert res.truncated.all() and res.episode_start.all()
        np.testing.assert_allclose(res.final_obs["palm_to_handle"], res.final_obs["palm"] - res.final_obs["handle"],
                                   atol=1e-5)  # the keys split Adroit's 39 values in order


KITCHEN = """
kind: task
task_id: kitchen_microwave
backend: gymnasium
backend_options: {gym_id: FrankaKitchen-v1, make_kwargs: {tasks_to_complete: [microwave]}}
control_hz: 12.5
horizon: 3
observation:
  - {name: observation, shape: [59], dtype: float32}
  - {name: achieved_goal/microwave, shape: [1], dtype: float32}
  - {name: desired_goal/microwave, shape: [1], dtype: float32}
action:
  names: [j1, j2, j3, j4, j5, j6, j7, finger_l, finger_r]
  low: [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
  high: [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
human: {axes: [x, y, z, roll, pitch, yaw, gripper, null, null]}
"""


def test_a_dict_observation_is_read_by_key_paths(tmp_path):
    """FrankaKitchen-v1 observes {observation, achieved_goal: {task: ...}, desired_goal: {task: ...}} and acts in
    float64: the mapping's keys name its entries, and a key it does not have is one line listing the ones it has."""
    path = tmp_path / "kitchen.yaml"
    path.write_text(KITCHEN)
    with make_env(path, num_envs=1, seed=0) as env:
        obs = env.step(np.zeros((1, 9), np.float32)).obs
        assert obs["desired_goal/microwave"].dtype == np.float32 and obs["observation"].shape == (1, 59)
        assert float(obs["desired_goal/microwave"][0, 0]) == pytest.approx(-0.75)  # the open microwave's angle
    path.write_text(path.read_text().replace("achieved_goal/microwave", "achieved_goal/kettle"))
    with pytest.raises(EnvError, match=r"'achieved_goal/kettle' is not in FrankaKitchen-v1's observation "
                                       r"\(keys: achieved_goal, desired_goal, observation\)"):
        make_env(path, num_envs=1, seed=0)


def test_hold_pauses_the_simulation_row_by_row_until_motion(tmp_path):
    """Pusher's action is a torque: no action holds an arm in motion. hold() pauses every row; a hold-action
    step (motion 0) leaves its simulation exactly where it was and counts no time towards the horizon; a row
    given motion runs again while a paused one stays."""
    path = user_task(tmp_path, horizon=20)
    assert BACKENDS.get("gymnasium").hold == "pause"
    with make_env(path, num_envs=2, seed=0) as env:
        fast = np.full((2, 7), 1.5, np.float32)
        for _ in range(8):
            env.step(fast)
        env.hold()
        held = env.observe()[0]
        assert np.abs(held["qvel"]).max() > 0.1  # the arm was moving when it was held
        zero = np.zeros((2, 7), np.float32)
        for _ in range(30):  # more than the rest of the horizon: paused steps count no time
            res = env.step(zero)
            assert res.info["paused"].all() and not res.ended.any() and not res.reward.any()
            for k in held:
                np.testing.assert_array_equal(res.obs[k], held[k])
        moving = np.array([[1.0] * 7, [0.0] * 7], np.float32)
        res = env.step(moving)
        assert res.info["paused"].tolist() == [False, True]
        assert not np.array_equal(res.obs["qpos"][0], held["qpos"][0])
        np.testing.assert_array_equal(res.obs["qpos"][1], held["qpos"][1])
        for _ in range(11):  # row 0 counted 9 steps before: its horizon (20) ends it now; row 1 is still paused
            res = env.step(moving)
        assert res.truncated.tolist() == [True, False]


@pytest.mark.parametrize(("changes", "words"), [
    ({"backend_options.gym_id": "NoSuchEnv-v0"}, ["'NoSuchEnv-v0' is not a registered Gymnasium id", "NoSuchEnv"]),
    ({"backend_options.gym_id": "Pusher-v9"}, ["'Pusher-v9' is not a registered Gymnasium id", "v5"]),
    ({"backend_options.gym_id": "no_such_module:Thing-v0"}, ["module 'no_such_module' does not import"]),
    ({"backend_options.gym_id": "CartPole-v1"}, ["CartPole-v1 has action space Discrete(2)", "Box action space"]),
    ({"backend_options.gym_id": "Pendulum-v1"}, ["action has 7 names but Pendulum-v1 takes 1 values"]),
    ({"observation": [{"name": "qpos", "shape": [7]}, {"name": "rest", "shape": [15]}], "export.environment_state": []},
     ["cover 22 values in order", "Pusher-v5 observes 23"]),
    ({"action.high": [2.5] * 7}, ["outside Pusher-v5's bounds [-2, 2]", "'shoulder_pan'"]),
    ({"step_dt": 0.1, "control_hz": 10}, ["but Pusher-v5 steps 0.05 s"]),
    ({"backend_options.success": "is_success"}, ["success reads step info key 'is_success'", "reward_dist"]),
    ({"backend_options.success": {"key": "reward_dist", "above": 1}}, ["backend_options.success must be"]),
])
def test_a_misconfigured_gymnasium_task_is_one_line_naming_the_file(tmp_path, changes, words):
    path = user_task(tmp_path, **changes)
    with pytest.raises(EnvError) as err:
        with make_env(path, num_envs=1, seed=0) as env:
            env.step(np.zeros((1, env.action_dim), np.float32))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    assert all(w in msg for w in words), msg


def test_an_unknown_backend_in_a_task_file_is_one_line_naming_the_file_and_the_known_ones(tmp_path):
    path = user_task(tmp_path, backend="gymnasiun")
    with pytest.raises(ConfigError) as err:
        load_mapping(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: key backend")
    assert "'gymnasiun'" in msg and "embodichain, fetch, gymnasium, metaworld, toy" in msg
    assert "hg_dagger.backends" in msg


def test_every_backend_record_resolves_and_says_what_it_does():
    specs = {name: BACKENDS.get(name) for name in ("toy", "fetch", "metaworld", "embodichain", "gymnasium")}
    for name, spec in specs.items():
        assert callable(spec.load_factory()), name  # the "module:attr" names a class that imports here
    assert {name: spec.hold for name, spec in specs.items()} == {
        "toy": "still", "fetch": "pin", "metaworld": "pin", "embodichain": "none", "gymnasium": "pause"}
    assert [name for name, spec in specs.items() if not spec.replayable] == ["embodichain"]
    assert "dexsim" in specs["embodichain"].not_replayable
    # the versions an episode records are the record's packages, as they were before the registry
    assert backend_versions("fetch").env.startswith("gymnasium ") and "gymnasium-robotics" in backend_versions("fetch").env
    assert backend_versions("toy").simulator.startswith("numpy ") and backend_versions("toy").env.startswith("hg_dagger ")
