"""Fault injection on the robot bridge: the link to the robot dropped (silent or cut) while a person holds
control, in the app's session and in a headless run. The robot server is a real `hg-dagger bridge serve`
subprocess; the link is a TCP relay the test breaks (tests/support/bridge.py.LinkProxy).

What must hold: the robot is told to hold, the event is recorded in the episode, and nothing moves
again until a person resumes (or a headless run was given the explicit resume_on_reconnect flag)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support.bridge import TOKEN, LinkProxy, Robot

from hg_dagger.contract.enums import ControlState, EndReason, EventKind
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs.bridge import BridgeEnv, RobotState
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

ALWAYS = GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])
HUMAN = ControlState.HUMAN.code


HEARTBEAT_S = 2.0  # the silent-link test waits for it; long enough that a loaded machine never trips it by chance


@pytest.fixture
def link(tmp_path, request):
    robot = Robot(tmp_path, heartbeat=getattr(request, "param", 30.0))  # cut links are seen at once, not by heartbeat
    proxy = LinkProxy(robot.port)
    yield robot, proxy
    proxy.close()
    robot.stop()


def _session(tmp_path, port, **env_kw):
    """A human-gated session on the robot: the gate always asks, the synthetic operator keeps control."""
    env = BridgeEnv("toy_reach", port=port, token=TOKEN, request_timeout_s=2.0, **env_kw)
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, gates=ALWAYS,
                          **{"operator.return_after_steps": 10_000, "handover.transition": "none"})
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    student = Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32))
    return env, rec, build_session(cfg, rec, student, env=env)


def _episodes(tmp_path):
    store = EpisodeStore.open(str(tmp_path / "store"))
    problems = validate_store(store)
    assert not problems, [str(p) for p in problems]
    return store.episodes()


def _events(info, kind):
    return [e for e in info.end.events if e.kind == kind]


@pytest.mark.parametrize("link", [HEARTBEAT_S], indirect=True)
def test_link_silent_during_a_handover_holds_the_robot_until_the_operator_resumes(tmp_path, link):
    robot, proxy = link
    env, rec, s = _session(tmp_path, proxy.port)
    s.start(1)
    for _ in range(300):
        if s.machine.state[0] == HUMAN:
            break
        s.tick()
    assert s.machine.state[0] == HUMAN  # mid-correction
    s.tick()
    before, obs_before = env.status(), env.observe()[0]
    step_at_loss = int(s.ep_step[0])

    proxy.freeze()  # the link goes silent: no bytes either way, nothing closes
    assert robot.wait_log("heartbeat lost", timeout=30)
    assert robot.wait_log("backend commanded to hold position", timeout=30)  # told to hold, not left to coast
    s.tick()  # the step times out, the client reconnects and finds the robot holding: refused, not resumed
    assert "hold" in s.robot_hold and s.running
    status = env.status()
    assert status["state"] == RobotState.HOLD and status["holds"] == 1 and status["steps"] == before["steps"]
    silent_ms = float(status["reason"].split("silent for ")[1].split(" ms")[0])
    assert silent_ms >= HEARTBEAT_S * 1000  # it held on the heartbeat timeout, not before
    for _ in range(5):  # nobody resumed: nothing moves and nothing is recorded
        s.tick()
    status = env.status()
    assert status["state"] == RobotState.HOLD and status["steps"] == before["steps"]
    assert all(np.array_equal(v, obs_before[k]) for k, v in env.observe()[0].items())
    assert int(s.ep_step[0]) == step_at_loss

    s.resume("alice")  # the operator's explicit action
    status = env.status()
    assert status["state"] == RobotState.RUNNING and status["resumed_by"] == "alice"
    for _ in range(5):
        s.tick()
    assert env.status()["steps"] == before["steps"] + 5 and s.machine.state[0] == HUMAN
    s.close_all("test over")
    rec.close()
    env.close()
    (info,) = _episodes(tmp_path)
    (lost,) = _events(info, EventKind.HEARTBEAT_LOSS)
    assert lost.source == "bridge" and lost.step == step_at_loss and "heartbeat lost" in lost.reason
    assert lost.values == {"robot_state": "hold", "control_state": "human"}
    (resumed,) = [e for e in _events(info, EventKind.NOTE) if e.reason.startswith("robot resumed")]
    assert resumed.reason == "robot resumed by alice" and resumed.step == step_at_loss
    assert resumed.values["resumed_by"] == "alice" and "heartbeat lost" in resumed.values["after"]
    assert robot.wait_log("resumed by alice after hold (heartbeat lost")


def _cut_after(proxy: LinkProxy, session, steps: int, how: str = "cut") -> threading.Thread:
    def cut():
        deadline = time.monotonic() + 120
        while session.summary.steps < steps and time.monotonic() < deadline:
            time.sleep(0.005)
        getattr(proxy, how)()

    t = threading.Thread(target=cut, daemon=True)
    t.start()
    return t


def test_headless_run_stops_when_the_link_drops_and_leaves_the_robot_holding(tmp_path, link):
    robot, proxy = link
    env, rec, s = _session(tmp_path, proxy.port)
    cutter = _cut_after(proxy, s, 10)
    summary = s.run(50, progress=False)  # nobody is there to resume: the run must stop, not spin or resume
    cutter.join(10)
    assert summary.stopped_by == "robot_hold" and summary.episodes < 50 and summary.estops == 0
    status = env.status()
    assert status["state"] == RobotState.HOLD and status["resumed_by"] == ""
    assert robot.wait_log("closed its connection without bye") and robot.wait_log("backend commanded to hold")
    rec.close()
    env.close()
    last = _episodes(tmp_path)[-1]
    assert last.end.end_reason == EndReason.SAFETY_STOP
    (lost,) = _events(last, EventKind.HEARTBEAT_LOSS)
    assert lost.source == "bridge" and "hold" in lost.reason
    assert not [e for e in _events(last, EventKind.NOTE) if e.reason.startswith("robot resumed")]


def test_headless_run_stops_cleanly_when_the_robot_cannot_be_reached(tmp_path, link):
    robot, proxy = link
    env, rec, s = _session(tmp_path, proxy.port, max_retries=2, backoff_s=0.01)
    cutter = _cut_after(proxy, s, 10, how="down")
    summary = s.run(50, progress=False)  # ends with the episodes kept, instead of an exception
    cutter.join(10)
    assert summary.stopped_by == "robot_hold" and "unreachable" in s.robot_hold
    assert robot.wait_log("backend commanded to hold position")  # the robot saw its session go
    rec.close()
    env.close()
    last = _episodes(tmp_path)[-1]
    assert last.end.end_reason == EndReason.SAFETY_STOP
    (lost,) = _events(last, EventKind.HEARTBEAT_LOSS)
    assert "unreachable" in lost.reason and lost.source == "bridge"


def test_headless_run_with_the_explicit_flag_resumes_and_records_who(tmp_path, link):
    robot, proxy = link
    env, rec, s = _session(tmp_path, proxy.port, resume_on_reconnect=True, client_name="night-run")
    s.start(3)
    for _ in range(10):
        s.tick()
    proxy.cut()
    assert robot.wait_log("closed its connection without bye")
    while s.running:  # what run() does after its start
        s.tick()
    assert s.summary.episodes == 3 and s.summary.stopped_by == "" and not s.robot_hold
    rec.close()
    env.close()
    notes = [(i, e) for i in _episodes(tmp_path) for e in _events(i, EventKind.NOTE)
             if e.reason.startswith("robot resumed")]
    assert len(notes) == 1
    info, note = notes[0]
    assert note.source == "bridge" and note.values["resumed_by"].startswith("night-run (resume_on_reconnect)")
    assert robot.wait_log("resumed by night-run (resume_on_reconnect) after hold")
