"""Robot faults across the bridge, on real server subprocesses: e-stop and sensor loss reach the app
as info["estop"] / info["sensor_loss"], refusals say the robot's state, and the operator's view is
the robot camera's last frame."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from bridge_helpers import TOKEN, Robot

from hg_dagger.envs.bridge import BridgeError, ErrorCode, RobotState
from hg_dagger.envs.common import fit_image
from hg_dagger.errors import EnvError

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
                res.info["t_obs"][1] = self.t_obs[1]
            if self.steps == 5:
                res.info["estop"] = np.array([False, True])
            self.t_obs = res.info["t_obs"].copy()
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
        from hg_dagger.envs.bridge import BridgeEnv

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
