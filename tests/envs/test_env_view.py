"""The operator's view (VecEnv.render_view): a real picture on every simulated backend, upright,
following the arm, created lazily in the calling thread and released by close()."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hg_dagger.envs import make_env
from hg_dagger.envs.common import fit_image
from hg_dagger.envs.toy import GOAL, HAND, toy_ik_action
from hg_dagger.errors import EnvError

pytestmark = [pytest.mark.simulation]


def _is_picture(img: np.ndarray, size: int) -> None:
    assert img.shape == (size, size, 3) and img.dtype == np.uint8
    assert img.std() > 10  # a scene, not a blank frame


def _upright(img: np.ndarray) -> bool:
    """Empty space (no skybox: black) above, table and floor below."""
    grey = img.astype(float).mean(axis=2)
    quarter = img.shape[0] // 4
    return grey[:quarter].mean() + 30 < grey[-quarter:].mean()


def _centroid(img: np.ndarray, colour) -> np.ndarray:
    rows, cols = np.nonzero(np.all(img == np.array(colour, np.uint8), axis=2))
    assert len(rows), f"no pixel of colour {colour}"
    return np.array([rows.mean(), cols.mean()])


# ------------------------------------------------------------------ toy
def test_toy_view_draws_the_arm_and_goal_where_they_are():
    env = make_env("toy_reach", num_envs=2, seed=3)
    obs, _ = env.reset(seed=3)
    size = 200
    img = env.render_view(0, size)
    _is_picture(img, size)
    extent = 1.15 * sum(env.links)

    def pixel(xy):  # world (x right, y up) -> (row, col)
        return np.array([(extent - xy[1]) / (2 * extent) * size, (xy[0] + extent) / (2 * extent) * size])

    np.testing.assert_allclose(_centroid(img, GOAL), pixel(obs["target"][0]), atol=2.0)
    np.testing.assert_allclose(_centroid(img, HAND), pixel(obs["ee_pos"][0]), atol=3.0)
    assert not np.array_equal(img, env.render_view(1, size))  # each row its own arm and goal
    for _ in range(5):
        obs = env.step(toy_ik_action(obs)).obs
    moved = env.render_view(0, size)
    assert not np.array_equal(moved, img)
    np.testing.assert_allclose(_centroid(moved, HAND), pixel(obs["ee_pos"][0]), atol=3.0)
    obs, _ = env.reset(seed=50)
    np.testing.assert_allclose(_centroid(env.render_view(0, size), GOAL), pixel(obs["target"][0]), atol=2.0)


@pytest.mark.parametrize("row, size", [(2, 256), (-1, 256), (0, 0), (0, 2.5), (True, 256)])
def test_bad_view_requests_are_refused_by_name(row, size):
    env = make_env("toy_reach", num_envs=2, seed=0)
    with pytest.raises(EnvError, match="render_view"):
        env.render_view(row, size)


def test_fit_image_crops_to_a_square_and_resamples_nearest():
    img = np.zeros((4, 8, 3), np.uint8)
    img[:, 2:6] = 200  # the centre square
    img[0, 2] = (1, 2, 3)
    out = fit_image(img, 8)
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    assert (out[:2, :2] == (1, 2, 3)).all() and (out[2:, 2:] == 200).all()
    np.testing.assert_array_equal(fit_image(out, 4), out[::2, ::2])


# ------------------------------------------------------------------ MuJoCo
@pytest.mark.parametrize("task, push", [("fetch_pick_place", [0.0, 0.0, 1.0, 0.0]), ("mw_push", [0.0, 0.0, 1.0, 0.0])])
def test_mujoco_view_is_upright_follows_the_arm_and_survives_reset(task, push):
    env = make_env(task, num_envs=2, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        img = env.render_view(0, 256)
        _is_picture(img, 256)
        assert _upright(img)
        np.testing.assert_array_equal(img, env.render_view(0, 256))  # a fixed camera: same state, same frame
        for _ in range(10):
            env.step(np.tile(np.array([push], np.float32), (2, 1)))
        moved = env.render_view(0, 256)
        assert np.abs(moved.astype(int) - img.astype(int)).sum(axis=2).astype(bool).mean() > 0.002
        env.reset(seed=0)
        again = env.render_view(0, 256)
        _is_picture(again, 256)
        assert not np.array_equal(again, moved)
        assert env.render_view(1, 320).shape == (320, 320, 3)  # one renderer per size
    finally:
        env.close()
    assert env.render_view(0, 256) is None  # closed: nothing to draw


def test_rendering_the_view_does_not_change_the_simulation():
    watched = make_env("fetch_pick_place_rgb", num_envs=1, seed=5)
    plain = make_env("fetch_pick_place_rgb", num_envs=1, seed=5)
    try:
        a, _ = watched.reset(seed=5)
        b, _ = plain.reset(seed=5)
        action = np.array([[0.4, -0.3, -0.5, -1.0]], np.float32)
        for _ in range(8):
            _is_picture(watched.render_view(0, 256), 256)
            ra, rb = watched.step(action), plain.step(action)
            for k in ra.obs:  # the policy's camera included
                np.testing.assert_array_equal(ra.obs[k], rb.obs[k], err_msg=k)
    finally:
        watched.close()
        plain.close()


def test_fetch_view_renders_in_a_thread_other_than_the_env_s():
    env = make_env("fetch_pick_place", num_envs=1, seed=1)  # built in this thread
    frames: list[np.ndarray] = []
    errors: list[BaseException] = []

    def worker():
        try:
            frames.append(env.render_view(0, 256))
            env.step(np.array([[1.0, 0.0, 0.0, 0.0]], np.float32))
            frames.append(env.render_view(0, 256))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and not errors, errors
    _is_picture(frames[0], 256)
    assert _upright(frames[0]) and not np.array_equal(frames[0], frames[1])
    np.testing.assert_array_equal(env.render_view(0, 256), frames[1])  # this thread's own renderer: same frame
    env.close()


def test_policy_camera_renders_when_another_thread_steps_the_env():
    stepped = make_env("fetch_pick_place_rgb", num_envs=1, seed=2)  # built (and its camera made) here
    reference = make_env("fetch_pick_place_rgb", num_envs=1, seed=2)
    action = np.array([[0.5, 0.2, -0.3, 1.0]], np.float32)
    results: list = []

    def worker():
        try:
            results.extend(stepped.step(action) for _ in range(3))
        except BaseException as exc:  # noqa: BLE001 - reported below
            results.append(exc)

    try:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive() and len(results) == 3 and not isinstance(results[-1], BaseException), results
        for res in results:
            want = reference.step(action)
            np.testing.assert_array_equal(res.obs["rgb"], want.obs["rgb"])  # the same frames as in the builder's thread
    finally:
        stepped.close()
        reference.close()
