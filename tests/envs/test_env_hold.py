"""A held robot is still, on every backend (real MuJoCo): after 12 full-speed steps, ``hold()`` and then 10
steps of the hold action (motion 0, gripper kept), the hand moves at most 2 mm from where ``observe()``
saw it at the hold; without ``hold()`` the same motion carries on for tens of mm. ``observe()`` reads the
simulator's state now, so it shows the held arm at rest."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.envs import make_env
from hg_dagger.envs.bridge import hold_action

pytestmark = [pytest.mark.simulation]

HELD_MM = 2.0
FULL_SPEED = {"fetch_reach": [1.0, 0.0, 0.0, 1.0], "mw_reach": [1.0, 0.0, 0.0, 1.0], "toy_reach": [1.0, 1.0]}
MOTION_STEPS, HELD_STEPS = 12, 10


def hand(task: str, obs: dict) -> np.ndarray:
    """Row 0's end effector (m): Fetch's grip site, Meta-World's hand, the toy arm's tip."""
    return np.asarray(obs["ee_pos"][0] if task == "toy_reach" else obs["observation"][0, :3], np.float64)


def drift_mm(env, task: str, hold: bool, seed: int = 3) -> float:
    """Largest distance (mm) the hand moves over the hold action's steps after full-speed motion,
    measured from where observe() sees it right after the motion (and the hold, if any)."""
    fast = np.array([FULL_SPEED[task]], np.float32)
    env.reset(seed=seed)
    for _ in range(MOTION_STEPS):
        env.step(fast)
    if hold:
        env.hold()
    start = hand(task, env.observe()[0])
    still = hold_action(list(env.mapping.action.names), fast, 1)
    return max(float(np.linalg.norm(hand(task, env.step(still).obs) - start)) * 1000 for _ in range(HELD_STEPS))


@pytest.mark.parametrize("task", ["fetch_reach", "mw_reach"])
def test_mujoco_hold_keeps_the_hand_within_2_mm(task):
    with make_env(task, num_envs=1, seed=0) as env:
        coasting, held = drift_mm(env, task, hold=False), drift_mm(env, task, hold=True)
    print(f"{task}: hand drift over {HELD_STEPS} hold-action steps after {MOTION_STEPS} full-speed steps: "
          f"{coasting:.1f} mm without hold(), {held:.2f} mm with it")
    assert coasting > 20.0  # without a hold the commanded but unfinished motion carries on ...
    assert held <= HELD_MM  # ... with one the hand stays where it was


def test_toy_hold_changes_nothing_and_nothing_moves():
    """The toy arm has no momentum (its action is the joint velocity of that step): not stepping is
    holding, the hold action moves nothing, and hold() must not reset or advance it."""
    with make_env("toy_reach", num_envs=1, seed=0) as env:
        assert drift_mm(env, "toy_reach", hold=False) == 0.0
        assert drift_mm(env, "toy_reach", hold=True) == 0.0
        before = env.observe()[0]
        env.hold()
        after = env.observe()[0]
        assert all(np.array_equal(after[k], v) for k, v in before.items())


def test_fetch_hold_zeroes_the_arm_and_pins_its_target_until_motion():
    with make_env("fetch_reach", num_envs=2, seed=0) as env:
        fast = np.array([FULL_SPEED["fetch_reach"]] * 2, np.float32)
        env.reset(seed=3)
        for _ in range(MOTION_STEPS):
            moving = env.step(fast).obs
        assert np.abs(moving["observation"][:, 5:8]).max() > 0.01  # grip velocity (m per step) while moving
        env.hold()
        held = env.observe()[0]
        # observe() reads the held arm: at rest but for the torso, which Fetch's model lifts at 3 mm/s
        assert np.abs(held["observation"][:, 5:8]).max() < 2e-4
        model, data = env.envs[0].model, env.envs[0].data
        arm = model.dof_damping < 1e5  # the base slides and torso lift are locked by the model, not commanded
        assert not data.qvel[arm].any()
        pinned = data.mocap_pos.copy()
        still = np.array([[0, 0, 0, 1.0]] * 2, np.float32)
        for _ in range(3):
            env.step(still)
            np.testing.assert_array_equal(data.mocap_pos, pinned)  # Fetch's own step no longer moves the target
        moved = np.array([[0, 0, 0, 1.0], [0, 1.0, 0, 1.0]], np.float32)  # row 1 commands motion: its hold ends
        env.step(moved)
        np.testing.assert_array_equal(data.mocap_pos, pinned)
        assert np.linalg.norm(env.envs[1].data.mocap_pos[0] - env.envs[1].data.body("robot0:gripper_link").xpos) > 0.01
        env.reset(seed=4, env_ids=[0])  # a reset ends row 0's hold: the stock target follows the gripper again
        env.step(still)
        np.testing.assert_allclose(data.mocap_pos[0], data.body("robot0:gripper_link").xpos, atol=0.01)
        assert not np.array_equal(data.mocap_pos, pinned)


def test_metaworld_hold_brakes_the_arm_until_motion_and_keeps_objects():
    with make_env("mw_pick_place", num_envs=1, seed=0) as env:
        model = env.envs[0].model
        damping = model.dof_damping.copy()
        obs, _ = env.reset(seed=3)
        fast = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
        for _ in range(5):
            obs = env.step(fast).obs
        env.hold()
        held = env.observe()[0]
        np.testing.assert_array_equal(held["observation"][0, 4:18], obs["observation"][0, 4:18])  # the object is left alone
        np.testing.assert_array_equal(held["observation"][0, 18:36], obs["observation"][0, 18:36])  # so is the frame stack
        assert (model.dof_damping[:7] >= 1e4).all()  # the arm's joints are braked while held
        env.step(np.array([[0, 0, 0, 1.0]], np.float32))
        assert (model.dof_damping[:7] >= 1e4).all()
        env.step(fast)  # commanded motion releases the brake
        np.testing.assert_array_equal(model.dof_damping, damping)
        env.hold()
        env.reset(seed=3)  # and so does a reset
        np.testing.assert_array_equal(model.dof_damping, damping)


@pytest.mark.parametrize("task", ["fetch_push", "mw_push", "fetch_pick_place_rgb"])
def test_observe_changes_nothing_before_or_after_a_hold(task):
    def run(env, observe: bool):
        env.reset(seed=1)
        rng = np.random.default_rng(0)
        for _ in range(4):
            obs = env.step(rng.uniform(-1, 1, (2, 4)).astype(np.float32)).obs
        if observe:
            for _ in range(2):  # nothing changed since the step: observe() is that step's observation
                now = env.observe()[0]
                for k, v in obs.items():
                    np.testing.assert_array_equal(now[k], v, err_msg=k)
        env.hold()
        if observe:
            first, second = env.observe()[0], env.observe()[0]  # read from the held simulator, twice
            for k, v in first.items():
                np.testing.assert_array_equal(second[k], v, err_msg=k)
        return env.step(rng.uniform(-1, 1, (2, 4)).astype(np.float32)).obs

    with make_env(task, num_envs=2, seed=0) as env, make_env(task, num_envs=2, seed=0) as twin:
        got, expected = run(env, observe=True), run(twin, observe=False)  # the same run without observe()
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
