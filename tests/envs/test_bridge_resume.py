"""Resuming a robot that holds because its link was lost: the app's "Resume robot" button (a real Qt widget
under pytest-qt) and the control loop that carries the command to the session, on a real robot server."""

from __future__ import annotations

import pytest
from PyQt6.QtCore import Qt
from PyQt6.QtTest import QTest
from support.bridge import TOKEN, LinkProxy, Robot

from hg_dagger.contract.enums import EventKind
from hg_dagger.control import live
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs.bridge import BridgeEnv, RobotState
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui.controls import EpisodeControls

pytestmark = [pytest.mark.app, pytest.mark.subprocess]


def test_resume_button_is_offered_only_while_the_robot_holds_and_names_the_operator(qtbot):
    commands = live.CommandQueue()
    c = EpisodeControls(commands)
    qtbot.addWidget(c)
    assert not c.resume_robot.isEnabled()
    c.show_snapshot(live.Snapshot(phase="running", episode_id="e", operator="alice"))
    assert not c.resume_robot.isEnabled() and commands.drain() == []
    c.show_snapshot(live.Snapshot(phase="held", episode_id="e", operator="alice", message="robot is in hold"))
    assert c.resume_robot.isEnabled() and "robot is in hold" in c.resume_robot.toolTip()  # why it holds
    assert not c.take_over.isEnabled() and not c.start.isEnabled()  # nothing else moves the robot while it holds
    QTest.mouseClick(c.resume_robot, Qt.MouseButton.LeftButton)
    assert commands.drain() == [live.Resume(by="alice")]
    c.show_snapshot(live.Snapshot(phase="estopped", episode_id="e", operator="alice"))
    assert not c.resume_robot.isEnabled()  # an e-stop needs its own confirmed reset


def _build(port: int, store: str):
    env = BridgeEnv("toy_reach", port=port, token=TOKEN, request_timeout_s=2.0)
    gates = GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, gates=gates,
                          **{"operator.return_after_steps": 10_000, "operator.name": "bob"})
    rec = EpisodeStore.create(store).recorder(flush_interval_s=0.05)
    return build_session(cfg, rec, Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32)), env=env)


@pytest.mark.timeout(300)
def test_control_loop_shows_the_hold_and_resumes_only_on_the_command(tmp_path):
    robot = Robot(tmp_path, heartbeat=30.0)  # the cut is seen at once; no heartbeat loss by chance on a busy machine
    link = LinkProxy(robot.port)
    store = str(tmp_path / "store")
    loop = ControlLoop(lambda: _build(link.port, store), view_hz=0, store=store).start()
    try:
        loop.commands.put(live.StartEpisodes(1))
        snap = loop.slot.wait_for(lambda s: s.control_state == "human" and s.episode_step >= 3, 60)
        assert snap is not None, loop.slot.read()
        link.cut()  # the cable is pulled while the operator corrects
        held = loop.slot.wait_for(lambda s: s.phase == "held", 60)
        assert held is not None and "hold" in held.message, loop.slot.read()
        assert robot.wait_log("backend commanded to hold position")
        step = held.episode_step
        later = loop.slot.wait_for(lambda s: s.seq >= held.seq + 20, 60)  # the loop keeps its rate ...
        assert later.phase == "held" and later.episode_step == step  # ... and nothing moves or is recorded
        loop.commands.put(live.Resume(by="bob"))
        moving = loop.slot.wait_for(lambda s: s.phase == "running" and s.episode_step >= step + 5, 60)
        assert moving is not None, loop.slot.read()
    finally:
        loop.stop()
        link.close()
    assert loop.error == ""
    st = EpisodeStore.open(store)
    assert not validate_store(st)
    (info,) = st.episodes()
    (lost,) = [e for e in info.end.events if e.kind == EventKind.HEARTBEAT_LOSS]
    (note,) = [e for e in info.end.events if e.kind == EventKind.NOTE and e.reason.startswith("robot resumed")]
    assert note.values["resumed_by"] == "bob" and note.step == lost.step == step + 1  # the step that never ran
    with BridgeEnv(port=robot.port, token=TOKEN) as env:
        assert env.status()["resumed_by"] == "bob" and env.robot_state == RobotState.HOLD  # the app said bye
    robot.stop()
    assert "resumed by bob after hold (session from" in robot.log()


@pytest.mark.timeout(300)
def test_control_loop_survives_an_outage_while_the_robot_holds(tmp_path):
    robot = Robot(tmp_path, heartbeat=30.0)
    link = LinkProxy(robot.port)
    store = str(tmp_path / "store")
    loop = ControlLoop(lambda: _build(link.port, store), view_hz=0, store=store).start()
    try:
        loop.commands.put(live.StartEpisodes(1))
        assert loop.slot.wait_for(lambda s: s.phase == "running" and s.episode_step >= 3, 60) is not None
        link.down()  # the robot cannot be reached at all for a while
        held = loop.slot.wait_for(lambda s: s.phase == "held", 120)
        assert held is not None and "unreachable" in held.message, loop.slot.read()
        assert robot.wait_log("backend commanded to hold position")  # the robot saw its session go
        later = loop.slot.wait_for(lambda s: s.seq >= held.seq + 3, 120)  # the loop keeps going, retrying
        assert later is not None and later.phase == "held" and loop.alive
        loop.commands.put(live.Resume(by="bob"))  # still down: the resume fails, says why, nothing changes
        failed = loop.slot.wait_for(lambda s: s.seq > later.seq + 1 and "unreachable" in s.message, 120)
        assert failed is not None and failed.phase == "held"
        link.up()
        loop.commands.put(live.Resume(by="bob"))
        moving = loop.slot.wait_for(lambda s: s.phase == "running" and s.episode_step >= held.episode_step + 5, 120)
        assert moving is not None, loop.slot.read()
    finally:
        loop.stop()
        link.close()
        robot.stop()
    assert loop.error == ""
    (info,) = EpisodeStore.open(store).episodes()
    notes = [e for e in info.end.events if e.kind == EventKind.NOTE and e.reason.startswith("robot resumed")]
    assert [e.values["resumed_by"] for e in notes] == ["bob"] and "unreachable" in notes[0].values["after"]
    assert "resumed by bob after hold (session from" in robot.log()
