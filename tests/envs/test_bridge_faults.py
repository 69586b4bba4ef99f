"""Robot faults across the bridge, on real server subprocesses: e-stop and sensor loss reach the app
as info["estop"] / info["sensor_loss"], refusals say the robot's state, and the operator's view is
the robot camera's last frame; a dropped link makes the robot hold its position (within 2 mm, on Fetch and
Meta-World) until a person resumes, and observe() shows it holding."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support.bridge import TOKEN, LinkProxy, Robot

from hg_dagger.envs import make_env
from hg_dagger.envs.bridge import BridgeEnv, BridgeError, ErrorCode, RobotState
from hg_dagger.envs.common import fit_image
from hg_dagger.errors import EnvError

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

# A robot driver we cannot run here, stood in for by the toy arm: on its 3rd step row 1's camera
# timestamp does not advance (a frozen sensor); on its 5th step it reports a hardware e-stop in row 1.
DRIVER = textwrap.dedent(
    """
    import signal, sys
    import numpy as np
    from hg_dagger.envs import make_env
    from hg_dagger.envs.base import VecEnv
    from hg_dagger.envs.bridge.server import BridgeServer, ServerConfig

    class Driver(VecEnv):
        def __init__(self):
            self.inner = make_env("toy_reach", num_envs=2, seed=0)
            self.num_envs, self.task_id, self.steps, self.t_obs = 2, "toy_reach", 0, None

        @property
        def mapping(self):
            return self.inner.mapping

        def reset(self, seed=None, env_ids=None):
            obs, info = self.inner.reset(seed=seed, env_ids=env_ids)
            self.t_obs = info["t_obs"].copy()
            return obs, info

        def step(self, action):
            res = self.inner.step(action)
            self.steps += 1
            if self.steps == 3:
                res.t_obs[1] = self.t_obs[1]
            if self.steps == 5:
                res.info["estop"] = np.array([False, True])
            self.t_obs = res.t_obs.copy()
            return res

    server = BridgeServer(Driver(), sys.argv[1].encode(), ServerConfig(port=0, heartbeat_timeout_s=5.0), seed=0)
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown())
    host, port = server.address
    print(f"listening on {host}:{port}", flush=True)
    server.serve_forever()
    """
)


@pytest.fixture
def robot(tmp_path):
    r = Robot(tmp_path, num_envs=2)
    yield r
    r.stop()


def _flags(info: dict, key: str) -> list[bool]:
    value = info[key]
    assert value.dtype == bool and value.shape == (2,)
    return value.tolist()


def test_robot_side_estop_shows_in_observations_and_refusals(robot):
    with robot.client() as env:
        obs, info = env.reset(seed=0)
        assert _flags(info, "estop") == [False, False] and _flags(info, "sensor_loss") == [False, False]
        res = env.step(np.zeros((2, 2), np.float32))
        assert _flags(res.info, "estop") == [False, False] and _flags(res.info, "sensor_loss") == [False, False]
        robot.proc.send_signal(signal.SIGUSR1)
        assert robot.wait_log("E-STOP: SIGUSR1 on the robot side")
        with pytest.raises(BridgeError, match="e-stop") as err:
            env.step(np.zeros((2, 2), np.float32))
        assert err.value.code == ErrorCode.STATE and err.value.robot_state == RobotState.ESTOP
        assert env.robot_state == RobotState.ESTOP
        _, info = env.observe()
        assert _flags(info, "estop") == [True, True]
        env.release_estop()
        env.resume()
        res = env.step(np.zeros((2, 2), np.float32))
        assert _flags(res.info, "estop") == [False, False]


def test_a_hold_refusal_is_not_an_estop(robot):
    with robot.client() as env:
        with pytest.raises(BridgeError, match="hold") as err:
            env.step(np.zeros((2, 2), np.float32))  # no reset yet: the robot holds
        assert err.value.code == ErrorCode.STATE and err.value.robot_state == RobotState.HOLD
        _, info = env.observe()
        assert _flags(info, "estop") == [False, False]


def test_driver_reported_stale_sensor_and_estop_reach_the_step_info(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen([sys.executable, str(script), TOKEN], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("listening on "), (line, (tmp_path / "driver.log").read_text())
        port = int(line.strip().rsplit(":", 1)[1])
        with BridgeEnv(port=port, token=TOKEN) as env:
            env.reset(seed=0)
            zero = np.zeros((2, 2), np.float32)
            seen = [env.step(zero).info for _ in range(5)]
            assert [_flags(i, "sensor_loss") for i in seen] == [[False, False]] * 2 + [[False, True]] + [[False, False]] * 2
            assert [_flags(i, "estop") for i in seen[:4]] == [[False, False]] * 4
            # the driver's e-stop latches the robot's: every row refuses motion from here on
            assert _flags(seen[4], "estop") == [True, True] and seen[4]["robot_state"] == RobotState.ESTOP
            with pytest.raises(BridgeError, match="e-stop") as err:
                env.step(zero)
            assert err.value.robot_state == RobotState.ESTOP
            assert env.status()["steps"] == 5
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        log.close()
    text = (tmp_path / "driver.log").read_text()
    assert "sensor loss in rows [1]" in text and "the robot reported an e-stop in rows [1]" in text


def test_view_is_the_robot_camera_when_the_task_has_one(tmp_path):
    state_only = Robot(tmp_path)
    camera = Robot(tmp_path, "fetch_pick_place_rgb")
    try:
        with state_only.client() as env:
            env.reset(seed=0)
            assert env.render_view(0, 256) is None
        with camera.client(task_id="fetch_pick_place_rgb") as env:
            obs, _ = env.reset(seed=3)
            view = env.render_view(0, 256)
            assert view.shape == (256, 256, 3) and view.dtype == np.uint8
            np.testing.assert_array_equal(view, fit_image(obs["rgb"][0], 256))
            res = env.step(np.array([[1.0, 0.0, 0.0, 0.0]], np.float32))
            np.testing.assert_array_equal(env.render_view(0, 200), fit_image(res.obs["rgb"][0], 200))
            assert not np.array_equal(env.render_view(0, 256), view)
            with pytest.raises(EnvError, match="row"):
                env.render_view(1, 256)
    finally:
        state_only.stop()
        camera.stop()


# ------------------------------------------------------------------ holding position
FULL_SPEED = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)  # dx at full speed (Fetch 5 cm, Meta-World 1 cm per step)
STILL = np.array([[0.0, 0.0, 0.0, 1.0]], np.float32)  # the hold action after it: no motion, gripper kept


def _hand_drift_mm(env, hold) -> float:
    """Largest hand distance (mm) over 10 STILL steps after 12 FULL_SPEED steps, from where observe() saw it
    after them; ``hold`` runs between the two (or not)."""
    env.reset(seed=3)
    for _ in range(12):
        env.step(FULL_SPEED)
    hold()
    start = env.observe()[0]["observation"][0, :3].copy()
    return max(float(np.linalg.norm(env.step(STILL).obs["observation"][0, :3] - start)) * 1000 for _ in range(10))


@pytest.mark.parametrize("task", ["fetch_reach", "mw_reach"])
def test_robot_told_to_hold_when_the_link_drops_keeps_its_position(tmp_path, task):
    robot = Robot(tmp_path, task, heartbeat=5.0)
    link = LinkProxy(robot.port)
    try:
        with BridgeEnv(task, port=link.port, token=TOKEN) as env, make_env(task, num_envs=1) as local:
            state = {}

            def cut_the_cable():  # right after full-speed motion
                link.cut()
                assert robot.wait_log("backend commanded to hold position")
                with pytest.raises(BridgeError, match="hold"):
                    env.step(STILL)
                state["held"] = env.status()
                env.resume(by="alice")

            held = _hand_drift_mm(env, cut_the_cable)
            coasting = _hand_drift_mm(local, lambda: None)  # the same motion, no hold
            print(f"{task} over the bridge: {held:.2f} mm held, {coasting:.1f} mm without hold")
            assert state["held"]["holds"] == 1 and state["held"]["steps"] == 12  # refused, not applied
            assert held <= 2.0 and coasting > 20.0
    finally:
        link.close()
        robot.stop()


def test_observe_reads_the_held_robot_not_the_last_reply(tmp_path):
    """Fetch reports the gripper's velocity: the last step's reply has it moving at full speed; once the
    robot holds, observe() reads the backend again and shows it at rest."""
    robot = Robot(tmp_path, "fetch_reach", heartbeat=5.0)
    link = LinkProxy(robot.port)
    try:
        with BridgeEnv("fetch_reach", port=link.port, token=TOKEN) as env:
            env.reset(seed=3)
            for _ in range(12):
                moving = env.step(FULL_SPEED).obs
            assert np.abs(moving["observation"][0, 5:8]).max() > 0.01  # m per step
            link.cut()
            assert robot.wait_log("backend commanded to hold position")
            held, info = env.observe()  # reconnects; the robot holds and does not move
            assert np.abs(held["observation"][0, 5:8]).max() < 2e-4  # the torso's slow lift is all that moves
            assert np.linalg.norm(held["observation"][0, :3] - moving["observation"][0, :3]) < 0.01
            assert info["robot_state"] == RobotState.HOLD and env.status()["steps"] == 12
            again, info2 = env.observe()
            assert info2["t_obs"][0] > info["t_obs"][0]  # a new sample each time
            np.testing.assert_allclose(again["observation"], held["observation"], atol=1e-6)  # of a still robot
    finally:
        link.close()
        robot.stop()
