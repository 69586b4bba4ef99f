"""Waiting for a person: in simulation the world pauses while a request waits (no step, no row), on a robot it
holds and the step limit counts only steps that acted; a request ends only by take-over, decline, the wait limit
or the episode's end, each one request_end event with its wait; grace periods after a reset and a hand-back for
the predicting gates; the pause between queued episodes and HoldStarts in the live loop. Real toy_reach, real
stores, a real bridge subprocess for the robot."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.bridge import TOKEN, Robot

from hg_dagger.contract.enums import ActionSource, ControlState, EndReason, EventKind
from hg_dagger.control import live
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, ConstraintGate, GateConfig, OperatorGate
from hg_dagger.control.limits import ActionLimits
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.devices import Keyboard
from hg_dagger.envs import make_env
from hg_dagger.envs.bridge import BridgeEnv
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

REQUESTED = ControlState.HANDOVER_REQUESTED.code
AUTO = ControlState.AUTONOMOUS.code
HUMAN = ControlState.HUMAN.code
OPERATOR_ONLY = GateConfig(name="operator_only", gates=[OperatorGate()])
WAIT = 120.0


@pytest.fixture(scope="module")
def student():
    return Student.create(make_env("toy_reach", num_envs=1).mapping, seed=0, ensemble=3, hidden=(32, 32))


def _person(tmp_path, student, *, env=None, gates=OPERATOR_ONLY, **over):
    """A session answered by a person at the in-window keyboard (the app's default device)."""
    kb = Keyboard()
    kb.connect()
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, gates=gates,
                          **{"operator.type": "device", "handover.transition": "none", **over})
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    env = env or make_env("toy_reach", num_envs=1, seed=0)
    return build_session(cfg, rec, student, env=env, operators=[kb]), rec


def _finish(tmp_path, rec):
    rec.close()
    store = EpisodeStore.open(str(tmp_path / "store"))
    problems = validate_store(store)
    assert not problems, [str(p) for p in problems]
    return store


def _request_ends(info):
    return [e for e in info.end.events if e.kind == EventKind.REQUEST_END]


def test_the_simulator_pauses_while_a_request_waits_and_a_decline_lets_the_student_go_on(tmp_path, student):
    s, rec = _person(tmp_path, student)
    assert s.machine.cfg.wait == "pause", "the shipped run config pauses a simulator for a person's device"
    s.start(1)
    for _ in range(3):
        s.tick()
    s.press("takeover")
    s.tick()
    assert s.machine.state[0] == REQUESTED
    step, rows, obs = int(s.ep_step[0]), s.summary.steps, {k: v.copy() for k, v in s.obs.items()}
    for _ in range(60):  # the person looks away for 2.4 s of control time
        s.tick()
    assert s.machine.state[0] == REQUESTED, "a request never runs out on its own in simulation"
    assert int(s.ep_step[0]) == step and s.summary.steps == rows, "no step and no row while it waits"
    assert all(np.array_equal(obs[k], s.obs[k]) for k in obs), "no physics while it waits"
    assert s.request_wait_s() == pytest.approx(60 * s.mapping.dt)
    assert s.decline()
    s.tick()
    assert s.machine.state[0] == AUTO and s.summary.requests_declined == 1
    s.tick()
    assert int(s.ep_step[0]) > step, "the student goes on"
    assert not s.decline(), "nothing waits now"
    s.close_all("done")
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    (end,) = _request_ends(info)
    assert end.values["outcome"] == "declined" and end.reason == "declined"
    assert end.values["wait_ticks"] == 60 and end.values["wait_s"] == pytest.approx(60 * s.mapping.dt)
    assert end.values["requested_step"] == step and end.values["gate_reason"] == "operator"
    assert info.num_steps == s.summary.steps and not store.labels(info.episode_id).windows
    from hg_dagger.review.report import build_report

    counts = build_report(store, progress=False)["requests"]
    assert (counts["answered"], counts["declined"], counts["expired"]) == (0, 1, 0)


def test_a_take_over_after_a_long_look_away_still_gets_the_request(tmp_path, student):
    s, rec = _person(tmp_path, student)
    s.start(1)
    for _ in range(5):
        s.tick()
    s.press("takeover")
    s.tick()
    step = int(s.ep_step[0])
    for _ in range(200):  # 8 s at 25 Hz: longer than the episode's whole horizon would last if it counted
        s.tick()
    s.key("space", True)  # hold Space: the person takes over
    s.key("w", True)
    s.tick()
    assert s.machine.state[0] == HUMAN
    for _ in range(4):
        s.tick()
    s.key("space", False)  # release: hand back
    s.key("w", False)
    s.tick()
    s.close_all("done")
    assert s.summary.requests_answered == 1 and s.summary.requests_expired == 0
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    (end,) = _request_ends(info)
    assert end.values["outcome"] == "answered" and end.values["wait_ticks"] == 200
    (w,) = store.labels(info.episode_id).windows
    assert w.handover_start == step, "the correction starts at the state the gate asked about"
    from hg_dagger.review.report import build_report

    counts = build_report(store, progress=False)["requests"]
    assert counts["answered"] == 1 and counts["wait_to_take_over_p50_s"] == pytest.approx(200 * s.mapping.dt)
    d = store.load(info.episode_id, fields=["action_source", "control_state"])
    assert not (np.asarray(d["control_state"]) == REQUESTED).any(), "no row was recorded while it waited"
    assert (np.asarray(d["action_source"])[w.handover_start:w.handover_end] == ActionSource.HUMAN.code).any()


def test_a_lost_device_holds_on_its_own_tick_then_the_world_waits_for_the_person(tmp_path, student):
    s, rec = _person(tmp_path, student)
    kb = s.operator.devices[0]
    s.start(1)
    s.key("space", True)
    s.key("w", True)
    s.tick()
    assert s.machine.state[0] == HUMAN
    for _ in range(3):
        s.tick()
    lost_at = int(s.ep_step[0])
    kb.close()  # unplugged
    s.tick()
    assert s.machine.state[0] == REQUESTED and int(s.ep_step[0]) == lost_at + 1, "the loss tick holds, recorded"
    for _ in range(30):
        s.tick()
    assert int(s.ep_step[0]) == lost_at + 1, "then nothing steps while the person plugs it back in"
    kb.connect()
    s.key("space", True)
    s.tick()
    assert s.machine.state[0] == HUMAN and s.summary.requests_answered == 2
    s.close_all("done")
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    first, second = store.labels(info.episode_id).windows
    assert first.handover_end == lost_at and second.gate_reason == "device_lost"
    assert second.handover_start == lost_at + 1, "no row between the loss and the person's return"
    lost = [e for e in _request_ends(info) if e.values["gate_reason"] == "device_lost"]
    assert len(lost) == 1 and lost[0].values["outcome"] == "answered" and lost[0].values["wait_ticks"] == 30


def test_a_request_expires_when_its_episode_ends_and_at_the_wait_limit(tmp_path, student):
    s, rec = _person(tmp_path, student, **{"handover.wait_timeout_s": 0.4, "handover.on_wait_timeout": "policy"})
    s.start(2)
    s.tick()
    s.press("takeover")
    s.tick()
    for _ in range(9):
        s.tick()
    assert s.machine.state[0] == REQUESTED
    s.tick()  # 10 ticks = 0.4 s: the limit; with on_wait_timeout policy the student goes on
    assert s.machine.state[0] == AUTO and s.summary.requests_expired == 1 and s.running
    s.press("takeover")
    s.tick()
    first = s.eids[0]
    s.end_episode(0, EndReason.OPERATOR_ABORT, False)  # the episode ends while the second request waits
    assert s.summary.requests_expired == 2 and s.eids[0] != first
    s.close_all("done")
    store = _finish(tmp_path, rec)
    info = store.info(first)
    ends = _request_ends(info)
    assert [(e.values["outcome"], e.reason) for e in ends] == [("expired", "wait_limit"), ("expired", "episode_end")]
    assert ends[0].values["wait_ticks"] == 10


def test_on_a_robot_the_robot_holds_and_the_step_limit_counts_only_steps_that_acted(tmp_path, student):
    robot = Robot(tmp_path, heartbeat=5.0)
    try:
        env = BridgeEnv("toy_reach", port=robot.port, token=TOKEN)
        s, rec = _person(tmp_path, student, env=env, max_episode_steps=20)
        assert s.machine.cfg.wait == "hold", "wait auto holds a robot"
        s.start(1)
        for _ in range(5):
            s.tick()
        s.press("takeover")
        for _ in range(31):  # the request tick and 30 more: the robot holds, every tick recorded
            s.tick()
        assert s.machine.state[0] == REQUESTED
        s.decline()
        while s.running:
            s.tick()
        rec.close()
        env.close()
    finally:
        robot.stop()
    store = EpisodeStore.open(str(tmp_path / "store"))
    assert not validate_store(store)
    (info,) = store.episodes()
    d = store.load(info.episode_id, fields=["control_state", "action_source"])
    held = np.asarray(d["control_state"]) == REQUESTED
    assert held.sum() == 31 and (np.asarray(d["action_source"])[held] == ActionSource.SAFETY_CONTROLLER.code).all()
    assert info.end.end_reason == EndReason.TIMEOUT and info.num_steps == 20 + 31


def test_grace_after_a_reset_and_a_hand_back_delays_only_the_predicting_gates(tmp_path, student):
    always = GateConfig(name="eager", grace_after_reset_s=0.4, grace_after_handback_s=0.6,
                        gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])
    s, rec = _person(tmp_path, student, gates=always)
    s.start(1)
    for _ in range(12):
        s.tick()
    assert s.machine.state[0] == REQUESTED
    first = int(s.ep_step[0])
    s.decline()
    for _ in range(20):
        s.tick()
    second = int(s.ep_step[0])
    s.close_all("done")
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    triggers = [e.step for e in info.end.events if e.kind == EventKind.GATE_TRIGGER]
    assert triggers[:2] == [10, 10 + 15] == [first, second], "0.4 s = 10 steps after the reset, 0.6 s after"

    constraint = GateConfig(name="tight", grace_after_reset_s=2.0,
                            gates=[ConstraintGate(limits=ActionLimits(low=[-1e-6, -1e-6], high=[1e-6, 1e-6]))])
    s2, rec2 = _person(tmp_path / "b", student, gates=constraint)
    s2.start(1)
    s2.tick()
    assert s2.machine.state[0] == REQUESTED, "a constraint gate is never delayed"
    s2.close_all("done")
    _finish(tmp_path / "b", rec2)


def _toy_build(store: str, ready: threading.Event | None = None, **over):
    def build():
        if ready is not None:
            assert ready.wait(WAIT)
        cfg = load_run_config(None, "toy_reach", num_envs=1, seed=1, calibrate_steps=0, max_episode_steps=8,
                              gates=OPERATOR_ONLY, **over)
        env = make_env("toy_reach", num_envs=1, seed=1)
        return build_session(cfg, EpisodeStore.create(store, exist_ok=True).recorder(),
                             Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32)), env=env)

    return build


def test_the_live_loop_says_loading_pauses_between_episodes_and_holds_starts(tmp_path):
    store = str(tmp_path / "s.zarr")
    ready = threading.Event()
    loop = ControlLoop(_toy_build(store, ready, episode_gap_s=1.5), rate_hz=100, view_hz=0, store=store).start()
    try:
        first = loop.slot.read()
        assert first.loading and first.phase == "loading", "the window shows loading while the session builds"
        ready.set()
        assert loop.slot.wait_for(lambda s: s.phase == "idle" and not s.loading, WAIT) is not None
        loop.commands.put(live.StartEpisodes(3))
        gap = loop.slot.wait_for(lambda s: s.counters.episodes == 1 and s.episode_id is None, WAIT)
        assert gap is not None and gap.next_start_in_s is not None and 0 < gap.next_start_in_s <= 1.5
        assert gap.ended_episode_id is not None
        second = loop.slot.wait_for(lambda s: s.episode_id is not None and s.counters.episodes == 1, WAIT)
        assert second.episode_id != gap.ended_episode_id
        loop.commands.put(live.HoldStarts(True))  # a dialog opened: the running episode goes on, none begins
        held = loop.slot.wait_for(lambda s: s.counters.episodes == 2 and s.starts_held, WAIT)
        assert held is not None and held.next_start_in_s is None
        later = loop.slot.wait_for(lambda s: s.seq >= held.seq + 250, WAIT)  # 2.5 s, longer than the pause
        assert later.episode_id is None and later.counters.episodes == 2, "no episode begins while starts are held"
        loop.commands.put(live.HoldStarts(False))
        done = loop.slot.wait_for(lambda s: s.counters.episodes == 3 and s.phase == "idle", WAIT)
        assert done is not None and not done.starts_held
    finally:
        loop.stop()
    assert not validate_store(EpisodeStore.open(store))
