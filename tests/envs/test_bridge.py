"""The robot bridge end to end: a real `hg-dagger bridge serve` process on an ephemeral loopback port,
driven by BridgeEnv and by a raw socket that speaks (and breaks) the protocol on purpose."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
from support.bridge import TOKEN, LinkProxy, Robot

from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.bridge import BridgeEnv, BridgeError, ErrorCode, Msg, RobotState
from hg_dagger.envs.bridge.protocol import HEADER, PROTOCOL_VERSION, auth_digest, encode, recv_frame
from hg_dagger.envs.toy import toy_ik_action
from hg_dagger.errors import EnvError

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


@pytest.fixture
def robot(tmp_path):
    r = Robot(tmp_path)
    yield r
    r.stop()


# ------------------------------------------------------------------ a raw protocol peer
class Raw:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.challenge = recv_frame(self.sock, 4096)
        self.seq = 0

    def send(self, msg: dict) -> None:
        self.seq += 1
        msg.setdefault("seq", self.seq)
        self.sock.sendall(encode(msg))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict:
        return recv_frame(self.sock, 1 << 26)

    def request(self, msg: dict) -> dict:
        self.send(msg)
        return self.recv()

    def hello(self, token: str = TOKEN, version: int = PROTOCOL_VERSION) -> dict:
        return self.request({"type": Msg.HELLO, "version": version,
                             "digest": auth_digest(token.encode(), self.challenge["nonce"])})

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(4096):
                    return True
        except TimeoutError:
            return False
        except OSError:  # reset by peer
            return True

    def close(self) -> None:
        self.sock.close()


def authed(port: int) -> Raw:
    raw = Raw(port)
    welcome = raw.hello()
    assert welcome["type"] == Msg.WELCOME, welcome
    return raw


def robot_view(port: int) -> tuple[dict, dict]:
    """(status, obs reply) seen by a fresh authenticated session: how far has the robot moved?"""
    raw = authed(port)
    status = raw.request({"type": Msg.STATUS})
    obs = raw.request({"type": Msg.OBSERVE})
    raw.send({"type": Msg.BYE})
    raw.close()
    return status, obs


def assert_same_obs(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ------------------------------------------------------------------ end to end
def test_reset_step_match_the_in_process_backend_across_two_processes(tmp_path):
    robot = Robot(tmp_path, num_envs=2)
    local = make_env("toy_reach", num_envs=2, seed=0)
    try:
        with robot.client(task_id="toy_reach") as env:
            assert (env.num_envs, env.action_dim, env.mapping.hash) == (2, 2, local.mapping.hash)
            t0 = now_ns()
            obs, info = env.reset(seed=5)
            t1 = now_ns()
            ref, _ = local.reset(seed=5)
            assert_same_obs(obs, ref)
            # robot timestamps land inside our request window once mapped (+/- the mapping's error)
            err = env.clock.error_ns
            assert np.all(info["t_obs"] >= t0 - err) and np.all(info["t_obs"] <= t1 + err)
            assert np.all(info["t_action_apply"] == NO_TIME)
            finished = 0
            for _ in range(60):
                action = toy_ik_action(obs)
                t0 = now_ns()
                res = env.step(action)
                t1 = now_ns()
                want = local.step(action)
                assert_same_obs(res.obs, want.obs)
                np.testing.assert_array_equal(res.reward, want.reward)
                np.testing.assert_array_equal(res.terminated, want.terminated)
                np.testing.assert_array_equal(res.truncated, want.truncated)
                np.testing.assert_array_equal(res.episode_start, want.episode_start)
                np.testing.assert_array_equal(res.success, want.success)
                done = want.terminated | want.truncated
                for k in want.obs:  # the auto-reset rows carry the observation that ended the episode
                    np.testing.assert_array_equal(res.final_obs[k][done], want.final_obs[k][done])
                finished += int(done.sum())
                i = res.info
                assert res.t_obs.dtype == np.int64 and res.t_obs.shape == (2,)
                assert np.all(res.t_action_apply >= t0 - err) and np.all(res.t_action_apply <= res.t_obs)
                assert np.all(res.t_obs <= t1 + err)
                assert i["alignment_error_ms"].dtype == np.float32 and np.all(i["alignment_error_ms"] >= 0)
                assert np.all(i["transport_ns"] > 0) and np.all(i["transport_ns"] <= t1 - t0)
                np.testing.assert_array_equal(i["signals"]["progress"], want.info["signals"]["progress"])
                obs = res.obs
            assert finished > 0  # the IK expert reaches targets, so auto-reset was exercised
            assert env.status()["steps"] == 60
    finally:
        local.close()
        robot.stop()


def test_fetch_reach_over_the_bridge_matches_mujoco_in_process_and_reports_the_hold_action(tmp_path):
    robot = Robot(tmp_path, "fetch_reach")
    local = make_env("fetch_reach", num_envs=1, seed=0)
    try:
        with robot.client(task_id="fetch_reach") as env:
            obs, _ = env.reset(seed=11)
            assert_same_obs(obs, local.reset(seed=11)[0])
            actions = np.random.default_rng(0).uniform(-1, 1, (8, 1, 4)).astype(np.float32)
            for action in actions:
                res = env.step(action)
                want = local.step(action)
                assert_same_obs(res.obs, want.obs)  # same MuJoCo physics, bit for bit
                np.testing.assert_array_equal(res.reward, want.reward)
            # safe stop for Fetch: no end-effector motion, the gripper keeps its last command
            np.testing.assert_array_equal(env.status()["hold_action"], [[0.0, 0.0, 0.0, actions[-1, 0, 3]]])
    finally:
        local.close()
        robot.stop()


def test_clock_offset_estimate_is_within_its_error_bound(robot):
    # both processes read the same monotonic clock, so the true offset is 0 and the NTP bound must hold
    with robot.client(clock_pings=16) as env:
        for _ in range(3):
            clock = env.sync_clock()
            assert clock.error_ns > 0
            assert abs(clock.offset_ns) <= clock.error_ns + 1
            assert env.clock is clock


def test_client_refuses_wrong_task_and_mismatched_mapping(tmp_path, robot):
    with pytest.raises(BridgeError, match="serves task 'toy_reach', not 'fetch_reach'"):
        robot.client(task_id="fetch_reach")
    # a robot serving a different toy_reach config (other horizon) must not be driven with ours
    from hg_dagger.envs.mapping import TASKS_DIR

    other_dir = tmp_path / "other"
    other_dir.mkdir()
    text = (TASKS_DIR / "toy_reach.yaml").read_text().replace("horizon: 100", "horizon: 77")
    (other_dir / "toy_reach.yaml").write_text(text)
    other = Robot(other_dir, str(other_dir / "toy_reach.yaml"))
    try:
        with pytest.raises(EnvError, match="has hash .* ours"):
            other.client()
        with other.client(mapping=load_mapping(other_dir / "toy_reach.yaml")) as env:  # the robot's own config
            assert env.mapping.horizon == 77
    finally:
        other.stop()


# ------------------------------------------------------------------ refusals never move the robot
def test_bad_token_is_refused_logged_and_never_moves_the_robot(robot):
    before_status, before = robot_view(robot.port)
    raw = Raw(robot.port)
    reply = raw.hello(token="wrong")
    assert reply["type"] == Msg.ERROR and reply["code"] == ErrorCode.AUTH
    assert raw.closed_by_peer()
    with pytest.raises(BridgeError, match="refused the handshake: auth"):
        robot.client(token="also-wrong", max_retries=0)
    after_status, after = robot_view(robot.port)
    assert after_status["steps"] == before_status["steps"] == 0
    assert after_status["resets"] == before_status["resets"]
    assert after_status["refused"][ErrorCode.AUTH] == 2
    assert_same_obs(after["obs"], before["obs"])
    assert robot.wait_log("refused auth from 127.0.0.1")


def test_commands_without_handshake_or_with_wrong_version_are_refused(robot):
    _, before = robot_view(robot.port)
    raw = Raw(robot.port)
    assert raw.challenge["version"] == PROTOCOL_VERSION and len(raw.challenge["nonce"]) == 32
    reply = raw.request({"type": Msg.STEP, "action": np.ones((1, 2), np.float32)})
    assert reply["code"] == ErrorCode.NO_HANDSHAKE
    assert raw.closed_by_peer()
    raw = Raw(robot.port)
    reply = raw.request({"type": Msg.RESET, "seed": 1})
    assert reply["code"] == ErrorCode.NO_HANDSHAKE
    raw = Raw(robot.port)
    assert raw.hello(version=PROTOCOL_VERSION + 1)["code"] == ErrorCode.VERSION
    assert raw.closed_by_peer()
    status, after = robot_view(robot.port)
    assert status["steps"] == 0 and status["resets"] == 0
    assert_same_obs(after["obs"], before["obs"])
    assert robot.wait_log("refused no_handshake") and robot.wait_log("refused version")


def test_idle_unauthenticated_connections_cannot_keep_correct_clients_out(tmp_path):
    robot = Robot(tmp_path, "toy_reach", "--handshake-timeout", "60")  # idle peers are not timed out here
    try:
        _idle_peers_then_correct_clients(robot)
    finally:
        robot.stop()


def _idle_peers_then_correct_clients(robot):
    idle = [Raw(robot.port) for _ in range(16)]  # each got a challenge and owes a hello: every slot taken
    clients = 0
    for _ in range(32):  # a correct client takes the slot of the longest-waiting idle peer
        with robot.client(clock_pings=1) as env:
            assert env.robot_state == RobotState.HOLD
            clients += 1
    assert clients == 32
    assert idle[0].closed_by_peer()  # the longest-waiting idle peer lost its slot ...
    status, _ = robot_view(robot.port)
    assert status["refused"]["too_many_pending"] >= 1 and status["steps"] == 0  # ... and nothing moved
    assert status["sessions"] == 33
    assert robot.wait_log("still owes a hello")
    for raw in idle:
        raw.close()


def test_silent_unauthenticated_connection_is_closed_after_the_handshake_timeout(tmp_path):
    robot = Robot(tmp_path, "toy_reach", "--handshake-timeout", "0.3")
    try:
        raw = Raw(robot.port)
        assert raw.closed_by_peer()
        assert robot.wait_log("refused handshake_timeout")
    finally:
        robot.stop()


def test_oversized_frames_are_refused_before_they_are_read(tmp_path):
    robot = Robot(tmp_path, "toy_reach", "--max-frame-bytes", "65536")
    try:
        # before authentication the limit is tiny: a peer cannot make the robot buffer much
        raw = Raw(robot.port)
        raw.send_bytes(HEADER.pack(100_000) + b"\0" * 64)
        assert raw.recv()["code"] == ErrorCode.OVERSIZED
        assert raw.closed_by_peer()
        # after authentication the configured limit applies, and the session is dropped (robot holds)
        raw = authed(robot.port)
        assert raw.request({"type": Msg.RESET, "seed": 0})["state"] == RobotState.RUNNING
        _, before = robot_view(robot.port)
        raw = authed(robot.port)
        raw.request({"type": Msg.RESUME})
        raw.send({"type": Msg.STEP, "action": np.zeros((1, 70_000), np.float32)})
        assert raw.recv()["code"] == ErrorCode.OVERSIZED
        assert raw.closed_by_peer()
        status, after = robot_view(robot.port)
        assert status["steps"] == 0 and status["state"] == RobotState.HOLD
        assert_same_obs(after["obs"], before["obs"])
        assert robot.wait_log("refused oversized") and "65536" in robot.log()
    finally:
        robot.stop()


def test_malformed_messages_are_refused_and_the_session_survives(robot):
    raw = Raw(robot.port)
    raw.send_bytes(HEADER.pack(3) + b"\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    assert raw.recv()["code"] == ErrorCode.MALFORMED
    assert raw.closed_by_peer()  # unauthenticated: closed

    raw = authed(robot.port)
    assert raw.request({"type": Msg.RESET, "seed": 0})["type"] == Msg.OBS
    before = raw.request({"type": Msg.OBSERVE})
    for payload in (b"\xc1", b"\x93\x01\x02\x03", b"\x81\xa4type\x07"):  # garbage, a list, a non-string type
        raw.send_bytes(HEADER.pack(len(payload)) + payload)
        assert raw.recv()["code"] == ErrorCode.MALFORMED
    # ndarrays whose header does not fit their bytes: a truncated shape, a size mismatch, a banned dtype
    for data in (b"\x03<f4\x02" + (1).to_bytes(4, "little") + b"\x02\x00\x00",
                 b"\x03<f4\x02" + (1).to_bytes(4, "little") + (2).to_bytes(4, "little") + b"\0" * 4,
                 b"\x03|O8\x01" + (1).to_bytes(4, "little") + b"\0" * 8):
        body = msgpack.packb({"type": Msg.STEP, "seq": 99, "action": msgpack.ExtType(1, data)})
        raw.send_bytes(HEADER.pack(len(body)) + body)
        assert raw.recv()["code"] == ErrorCode.MALFORMED
    assert raw.request({"type": "teleport"})["code"] == ErrorCode.UNKNOWN_TYPE
    assert raw.request({"type": Msg.RESET, "seed": "zero"})["code"] == ErrorCode.MALFORMED
    assert raw.request({"type": Msg.RESET, "env_ids": [5]})["code"] == ErrorCode.BAD_REQUEST
    status = raw.request({"type": Msg.STATUS})  # the session is still up
    assert status["state"] == RobotState.RUNNING and status["steps"] == 0 and status["resets"] == 1
    assert_same_obs(raw.request({"type": Msg.OBSERVE})["obs"], before["obs"])
    assert robot.wait_log("refused malformed") and robot.wait_log("refused unknown_type")


def test_bad_field_values_are_refused_as_malformed_before_the_backend(robot):
    raw = authed(robot.port)
    assert raw.request({"type": Msg.RESET, "seed": 0})["state"] == RobotState.RUNNING
    before = raw.request({"type": Msg.OBSERVE})
    malformed = [
        {"type": Msg.RESET, "seed": -1}, {"type": Msg.RESET, "seed": [-5]}, {"type": Msg.RESET, "seed": True},
        {"type": Msg.RESET, "seed": 2**40}, {"type": Msg.RESET, "seed": 1.5}, {"type": Msg.RESET, "env_ids": [True]},
        {"type": Msg.STEP, "action": np.zeros((1, 2), np.float32), "cid": 7},
        {"type": Msg.STEP, "action": np.zeros((1, 2), np.float32), "cid": ""},
        {"type": Msg.STEP, "action": np.zeros((1, 2), np.float32), "cid": ["a"]},
        {"type": Msg.ESTOP, "reason": [1, 2]}, {"type": Msg.RESUME, "by": 5},
    ]
    for msg in malformed:
        reply = raw.request(msg)
        assert reply["type"] == Msg.ERROR and reply["code"] == ErrorCode.MALFORMED, (msg, reply)
    for msg in ({"type": Msg.RESET, "env_ids": [2**63]}, {"type": Msg.RESET, "env_ids": [0, 0]},
                {"type": Msg.RESET, "seed": [1, 2]}):
        assert raw.request(msg)["code"] == ErrorCode.BAD_REQUEST, msg
    for seq in ("1", 2.0, True, [1]):  # the protocol's seq is an int
        raw.send({"type": Msg.STATUS, "seq": seq})
        reply = raw.recv()
        assert reply["code"] == ErrorCode.MALFORMED and "re" not in reply
    status = raw.request({"type": Msg.STATUS})  # the session is still up, the robot never left running
    assert status["state"] == RobotState.RUNNING and status["holds"] == 0
    assert status["steps"] == 0 and status["resets"] == 1 and status["refused"][ErrorCode.MALFORMED] == 15
    assert_same_obs(raw.request({"type": Msg.OBSERVE})["obs"], before["obs"])
    assert raw.request({"type": Msg.RESET, "seed": 2**32 - 1})["state"] == RobotState.RUNNING  # the largest seed
    assert robot.wait_log("refused malformed") and "Traceback" not in robot.log() and "internal" not in robot.log()


def test_bad_actions_are_refused_client_side_and_robot_side(robot):
    with robot.client() as env:
        obs, _ = env.reset(seed=1)
        for action in (np.zeros((1, 3), np.float32), np.zeros((2, 2), np.float32), np.zeros((1, 2), np.int64),
                       np.array([[np.nan, 0.0]], np.float32), np.array([[0.0, np.inf]], np.float32)):
            with pytest.raises(EnvError, match="bridge|toy_reach"):
                env.step(action)
        status = env.status()
        assert status["steps"] == 0 and status["refused"] == {}  # never left our process
        raw = authed(robot.port)
        raw.request({"type": Msg.RESUME})
        for action in (np.zeros((1, 3), np.float32), np.array([[np.nan, 0.0]], np.float32),
                       np.array([[0.0, -np.inf]], np.float64), np.zeros((1, 2), np.int32), [[0.1, 0.2]], "up"):
            reply = raw.request({"type": Msg.STEP, "action": action})
            assert reply["type"] == Msg.ERROR and reply["code"] == ErrorCode.BAD_ACTION, reply
        after = raw.request({"type": Msg.OBSERVE})
        assert_same_obs(after["obs"], obs)
        assert raw.request({"type": Msg.STATUS})["refused"][ErrorCode.BAD_ACTION] == 6
        assert raw.request({"type": Msg.STATUS})["steps"] == 0
        assert robot.wait_log("refused bad_action") and "NaN/inf" in robot.log()


# ------------------------------------------------------------------ safe stop, e-stop, reconnect
def test_heartbeat_loss_puts_the_robot_in_safe_stop(tmp_path):
    timeout = 0.3
    robot = Robot(tmp_path, heartbeat=timeout)
    try:
        raw = authed(robot.port)
        assert raw.request({"type": Msg.RESET, "seed": 0})["state"] == RobotState.RUNNING
        assert raw.closed_by_peer()  # we stay silent: the robot drops the session ...
        assert robot.wait_log("heartbeat lost from 127.0.0.1")
        assert robot.wait_log("safe stop: holding position (heartbeat lost")
        assert robot.wait_log("backend commanded to hold position")  # the robot is told to hold, not left to coast
        raw2 = authed(robot.port)
        status = raw2.request({"type": Msg.STATUS})
        assert status["state"] == RobotState.HOLD and status["heartbeat_losses"] == 1 and status["holds"] == 1
        silent_ms = float(status["reason"].split("silent for ")[1].split(" ms")[0])
        assert silent_ms >= timeout * 1e3  # it did not trip early
        reply = raw2.request({"type": Msg.STEP, "action": np.ones((1, 2), np.float32)})
        assert reply["code"] == ErrorCode.STATE  # ... and refuses motion until told to resume
        assert raw2.request({"type": Msg.STATUS})["steps"] == 0
        resumed = raw2.request({"type": Msg.RESUME, "by": "alice"})
        assert resumed["state"] == RobotState.RUNNING and resumed["resumed_by"] == "alice"
        assert raw2.request({"type": Msg.STEP, "action": np.ones((1, 2), np.float32)})["type"] == Msg.OBS
        assert robot.wait_log("resumed by alice after hold (heartbeat lost")
    finally:
        robot.stop()


def test_client_heartbeat_keeps_an_idle_session_alive(tmp_path):
    robot = Robot(tmp_path, heartbeat=1.0)  # the client beats every 0.25 s: a busy machine's stalls stay below 1 s
    try:
        with robot.client() as env:
            env.reset(seed=0)
            time.sleep(4.0)  # idle for four heartbeat timeouts
            status = env.status()
            assert status["state"] == RobotState.RUNNING and status["heartbeat_losses"] == 0
            assert env.reconnects == 0
    finally:
        robot.stop()


def test_estop_latches_until_released_and_resumed(robot):
    with robot.client() as env:
        obs, _ = env.reset(seed=2)
        assert env.estop("operator pressed the button")["state"] == RobotState.ESTOP
        for call in (lambda: env.step(np.zeros((1, 2), np.float32)), lambda: env.reset(seed=0), env.resume):
            with pytest.raises(BridgeError, match="e-stop") as err:
                call()
            assert err.value.code == ErrorCode.STATE
        assert_same_obs(env.observe()[0], obs)
        assert env.release_estop()["state"] == RobotState.HOLD
        with pytest.raises(BridgeError, match="hold"):
            env.step(np.zeros((1, 2), np.float32))
        assert env.status()["steps"] == 0
        env.resume()
        env.step(np.full((1, 2), 0.5, np.float32))
        assert env.status()["steps"] == 1
    assert robot.wait_log("E-STOP: operator pressed the button")


def test_robot_side_estop_by_signal(robot):
    with robot.client() as env:
        env.reset(seed=0)
        robot.proc.send_signal(signal.SIGUSR1)
        assert robot.wait_log("E-STOP: SIGUSR1 on the robot side")
        assert env.status()["state"] == RobotState.ESTOP
        with pytest.raises(BridgeError, match="e-stop"):
            env.step(np.zeros((1, 2), np.float32))


def test_after_a_reconnect_the_robot_holds_until_a_person_resumes(tmp_path):
    robot = Robot(tmp_path, heartbeat=5.0)
    link = LinkProxy(robot.port)
    local = make_env("toy_reach", num_envs=1, seed=0)
    try:
        with BridgeEnv(port=link.port, token=TOKEN) as env:
            assert env.resume_on_reconnect is False  # the default: no automatic resume
            obs, _ = env.reset(seed=3)
            local.reset(seed=3)
            for i in range(6):
                if i == 3:
                    link.cut()
                    assert robot.wait_log("closed its connection without bye")
                    action = toy_ik_action(obs) * 0.3
                    with pytest.raises(BridgeError, match="hold .*lost") as err:
                        env.step(action)  # reconnected, but the robot keeps holding: the step is refused
                    assert err.value.code == ErrorCode.STATE and err.value.robot_state == RobotState.HOLD
                    status = env.status()
                    assert env.reconnects == 1 and status["steps"] == 3 and status["holds"] == 1  # nothing moved
                    assert_same_obs(env.observe()[0], obs)
                    assert env.resume(by="alice")["resumed_by"] == "alice"  # the operator's explicit action
                action = toy_ik_action(obs) * 0.3
                res = env.step(action)
                assert_same_obs(res.obs, local.step(action).obs)
                assert "robot_resumed" not in res.info
                obs = res.obs
            status = env.status()
            assert status["steps"] == 6 and status["state"] == RobotState.RUNNING and status["resumed_by"] == "alice"
        assert robot.wait_log("resumed by alice after hold (session from")
    finally:
        local.close()
        link.close()
        robot.stop()


def test_resume_on_reconnect_is_an_explicit_flag_and_says_who_resumed(tmp_path):
    robot = Robot(tmp_path, heartbeat=5.0)
    link = LinkProxy(robot.port)
    local = make_env("toy_reach", num_envs=1, seed=0)
    try:
        with BridgeEnv(port=link.port, token=TOKEN, resume_on_reconnect=True, client_name="night-run") as env:
            obs, _ = env.reset(seed=3)
            local.reset(seed=3)
            resumed = []
            for i in range(6):
                if i == 3:
                    link.cut()
                    assert robot.wait_log("closed its connection without bye")
                action = toy_ik_action(obs) * 0.3
                res = env.step(action)  # the interrupted step goes through once, without stepping twice
                assert_same_obs(res.obs, local.step(action).obs)
                resumed.append(res.info.get("robot_resumed", ""))
                obs = res.obs
            assert env.reconnects == 1
            assert resumed[:3] == ["", "", ""] and resumed[4:] == ["", ""]
            assert resumed[3].startswith("night-run (resume_on_reconnect) after: session from")
            status = env.status()
            assert status["steps"] == 6 and status["state"] == RobotState.RUNNING and status["sessions"] == 2
            assert status["resumed_by"] == "night-run (resume_on_reconnect)"
        assert robot.wait_log("resumed by night-run (resume_on_reconnect) after hold")
    finally:
        local.close()
        link.close()
        robot.stop()


def test_a_retried_step_is_applied_once(robot):
    raw = authed(robot.port)
    raw.request({"type": Msg.RESET, "seed": 0})
    first = raw.request({"type": Msg.STEP, "action": np.full((1, 2), 0.5, np.float32), "cid": "abc:1"})
    raw.close()
    raw = authed(robot.port)  # the reply was "lost": a new session re-sends the same command
    raw.request({"type": Msg.RESUME, "by": "test"})
    again = raw.request({"type": Msg.STEP, "action": np.full((1, 2), 0.5, np.float32), "cid": "abc:1"})
    assert again.get("replayed") is True
    assert_same_obs(again["obs"], first["obs"])
    assert raw.request({"type": Msg.STATUS})["steps"] == 1
    other = raw.request({"type": Msg.STEP, "action": np.full((1, 2), 0.5, np.float32), "cid": "abc:2"})
    assert "replayed" not in other and raw.request({"type": Msg.STATUS})["steps"] == 2


def test_a_step_applied_before_a_heartbeat_loss_is_refused_while_the_robot_holds(tmp_path):
    robot = Robot(tmp_path, heartbeat=0.3)
    try:
        raw = authed(robot.port)
        raw.request({"type": Msg.RESET, "seed": 0})
        step = {"type": Msg.STEP, "action": np.full((1, 2), 0.5, np.float32), "cid": "abc:1"}
        first = raw.request(dict(step))
        assert first["type"] == Msg.OBS and first["state"] == RobotState.RUNNING
        assert raw.closed_by_peer()  # its reply was "lost" and the app went silent: heartbeat loss
        assert robot.wait_log("heartbeat lost from 127.0.0.1")
        raw = authed(robot.port)
        again = raw.request(dict(step))  # the app re-sends the command it never saw answered
        assert again["type"] == Msg.ERROR and again["code"] == ErrorCode.STATE and again["state"] == RobotState.HOLD
        assert "heartbeat lost" in again["message"] and "'abc:1' was applied before it" in again["message"]
        assert "replayed" not in again
        status = raw.request({"type": Msg.STATUS})
        assert status["steps"] == 1 and status["state"] == RobotState.HOLD
        raw.request({"type": Msg.RESUME, "by": "alice"})  # once a person resumes, the retry is answered once
        replayed = raw.request(dict(step))
        assert replayed.get("replayed") is True and replayed["state"] == RobotState.RUNNING
        assert_same_obs(replayed["obs"], first["obs"])
        assert raw.request({"type": Msg.STATUS})["steps"] == 1
        raw.send({"type": Msg.BYE})
        raw.close()
    finally:
        robot.stop()


def test_client_reconnects_after_the_robot_server_restarts(tmp_path):
    robot = Robot(tmp_path)
    port = robot.port
    try:
        env = robot.client(max_retries=8, backoff_s=0.05)
        env.reset(seed=0)
        env.step(np.zeros((1, 2), np.float32))
        first_instance = env.status()["instance"]
        robot.stop()
        robot = Robot(tmp_path, port=port)
        assert robot.port == port
        assert env.status()["instance"] != first_instance  # status and e-stop work at once ...
        for call in (lambda: env.step(np.zeros((1, 2), np.float32)), env.resume):  # ... motion waits for reset
            with pytest.raises(BridgeError, match="restarted .* call reset"):
                call()
        obs, _ = env.reset(seed=0)
        env.step(np.zeros((1, 2), np.float32))
        status = env.status()
        assert status["instance"] != first_instance and status["steps"] == 1 and env.reconnects == 1
        env.close()
        robot.stop()
        with pytest.raises(BridgeError, match="unreachable after 3 attempts"):
            BridgeEnv(port=port, token=TOKEN, max_retries=2, backoff_s=0.01)
    finally:
        robot.stop()


# ------------------------------------------------------------------ the command line
def test_serve_without_a_token_fails_clearly_and_token_writes_a_private_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HG_DAGGER_BRIDGE_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "hg_dagger", "bridge", "serve", "toy_reach", "--port", "0"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert "no bridge token" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "hg_dagger", "bridge", "serve", "no_such_task", "--port", "0"],
                         capture_output=True, text=True, env=dict(env, HG_DAGGER_BRIDGE_TOKEN="t"), timeout=60)
    assert out.returncode == 2 and "unknown task 'no_such_task'" in out.stderr and "toy_reach" in out.stderr
    path = tmp_path / "tok"
    out = subprocess.run([sys.executable, "-m", "hg_dagger", "bridge", "token", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert len(path.read_text().strip()) == 64 and (path.stat().st_mode & 0o777) == 0o600


def test_robot_times_stay_inside_the_round_trip_whatever_the_clock_estimate(robot):
    """A loaded machine can skew the ping/pong offset by more than the time from a reply to the next act; the
    robot's times are still put inside the round trip that carried them (after the request left, before the reply
    arrived), so an observation never seems taken after the student acted on it."""
    from hg_dagger.contract.clock import ClockMapping

    with robot.client() as env:
        env.reset(seed=0)
        for skew_ms in (+5.0, -5.0):
            env._clock = ClockMapping(offset_ns=int(skew_ms * 1e6), error_ns=100_000)  # an estimate off by 5 ms
            for _ in range(5):
                t0 = now_ns()
                res = env.step(np.zeros((env.num_envs, env.mapping.action_dim), np.float32))
                t1 = now_ns()
                assert np.all((t0 <= res.t_action_apply) & (res.t_action_apply <= res.t_obs) & (res.t_obs <= t1))
