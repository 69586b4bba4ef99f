"""The session driving a robot over the bridge (a real `hg-dagger bridge serve` subprocess): an e-stop on the
robot side reaches the session as an e-stop from the bridge, and the session's own e-stop latches the robot."""

from __future__ import annotations

import signal

import pytest
from support.bridge import TOKEN, Robot

from hg_dagger.contract.enums import EndReason, EventKind
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs.bridge import BridgeEnv, RobotState
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]


@pytest.fixture
def robot(tmp_path):
    r = Robot(tmp_path, heartbeat=5.0)
    yield r.proc, r.port, r
    r.stop()


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


def test_robot_side_estop_stops_the_session(tmp_path, robot):
    proc, port, server = robot
    env, rec, s = _session(tmp_path, port)
    s.start(3)
    for _ in range(10):
        s.tick()
    proc.send_signal(signal.SIGUSR1)
    assert server.wait_log("E-STOP", timeout=10.0)
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
    _, port, server = robot
    env, rec, s = _session(tmp_path, port)
    s.start(2)
    for _ in range(5):
        s.tick()
    s.estop("app", "stop button")
    s.tick()
    assert env.status()["state"] == RobotState.ESTOP
    assert server.wait_log("E-STOP", timeout=10.0)
    rec.close()
    env.close()
    (info,) = _check_store(tmp_path).episodes()
    assert info.end.end_reason == EndReason.SAFETY_STOP and info.end.num_steps == 6
