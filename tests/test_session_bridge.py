"""The session driving a robot over the bridge (a real `hg-dagger bridge serve` subprocess): an e-stop on the
robot side reaches the session as an e-stop from the bridge, and the session's own e-stop latches the robot."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from hg_dagger.contract.enums import EndReason, EventKind
from hg_dagger.control.gates import ConfidenceGate, GateConfig
from hg_dagger.control.session import build_session, load_run_config
from hg_dagger.envs.bridge import BridgeEnv, RobotState
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

TOKEN = "session-bridge-test-token"


@pytest.fixture
def robot(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    log = open(tmp_path / "robot.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hg_dagger", "bridge", "serve", "toy_reach", "--port", "0", "--token-file", str(token),
         "--num-envs", "1", "--seed", "0", "--heartbeat-timeout", "5"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ))
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    assert line.startswith("listening on "), line + (tmp_path / "robot.log").read_text()
    port = int(line.strip().rsplit(":", 1)[1])
    yield proc, port, tmp_path / "robot.log"
    proc.terminate()
    proc.wait(10)
    proc.stdout.close()
    log.close()


def _session(tmp_path, port):
    env = BridgeEnv("toy_reach", port=port, token=TOKEN)
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0,
                          gates=GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9)]))
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    student = Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32))
    return env, rec, build_session(cfg, rec, student, env=env)


def _check_store(tmp_path):
    store = EpisodeStore.open(str(tmp_path / "store"))
    assert not validate_store(store)
    return store


def _wait(path, text, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text():
            return True
        time.sleep(0.02)
    return False


def test_robot_side_estop_stops_the_session(tmp_path, robot):
    proc, port, log = robot
    env, rec, s = _session(tmp_path, port)
    s.start(3)
    for _ in range(10):
        s.tick()
    proc.send_signal(signal.SIGUSR1)
    assert _wait(log, "E-STOP")
    for _ in range(3):
        if s.running:
            s.tick()
    assert s.summary.stopped_by == "estop" and s.safety.estop_source == "bridge"
    rec.close()
    env.close()
    (info,) = _check_store(tmp_path).episodes()
    assert info.end.end_reason == EndReason.SAFETY_STOP and info.end.num_steps == 10
    (ev,) = [e for e in info.end.events if e.kind == EventKind.ESTOP]
    assert ev.source == "bridge" and "e-stop" in ev.reason


def test_session_estop_latches_the_robot(tmp_path, robot):
    _, port, log = robot
    env, rec, s = _session(tmp_path, port)
    s.start(2)
    for _ in range(5):
        s.tick()
    s.estop("app", "stop button")
    s.tick()
    assert env.status()["state"] == RobotState.ESTOP
    assert _wait(log, "E-STOP")
    rec.close()
    env.close()
    (info,) = _check_store(tmp_path).episodes()
    assert info.end.end_reason == EndReason.SAFETY_STOP and info.end.num_steps == 6
