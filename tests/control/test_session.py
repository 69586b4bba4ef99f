"""The session loop with real parts: the numpy toy env, a real student, the toy IK planner driving the
synthetic operator, the keyboard device, and a real zarr store on tmp_path. Every recorded episode must
pass the store's validation; labels come from the store (contract.derive_labels)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hg_dagger.contract.enums import (
    ActionSource,
    ControlState,
    EndReason,
    EventKind,
    LabelMask,
    LabelTarget,
    RecoveryOutcome,
    StepFlag,
)
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig, OperatorGate, ProgressEtaGate
from hg_dagger.control.run_config import load_run_config
from hg_dagger.devices import Keyboard
from hg_dagger.envs import make_env
from hg_dagger.errors import HgDaggerError
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

HUMAN = ActionSource.HUMAN.code
SAFETY = ActionSource.SAFETY_CONTROLLER.code
POLICY = ActionSource.POLICY.code
EXPERT = ActionSource.EXPERT.code
ALWAYS = GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])


@pytest.fixture(scope="module")
def student():
    return Student.create(make_env("toy_reach", num_envs=1).mapping, seed=0, ensemble=3, hidden=(32, 32))


class Rig:
    """A session on toy_reach recording into a fresh store under tmp_path."""

    def __init__(self, tmp_path, student, n=1, operators=None, **over):
        over.setdefault("calibrate_steps", 0)
        over.setdefault("operator.return_after_steps", 12)
        self.cfg = load_run_config(None, "toy_reach", num_envs=n, **over)
        self.store_path = tmp_path / "store"
        self.rec = EpisodeStore.create(str(self.store_path)).recorder(flush_interval_s=0.05)
        self.env = make_env("toy_reach", num_envs=n, seed=0)
        self.session = build_session(self.cfg, self.rec, student, env=self.env, operators=operators)


_rig = Rig


def _finish(rig):
    rig.rec.close()
    store = EpisodeStore.open(str(rig.store_path))
    problems = validate_store(store)
    assert not problems, [str(p) for p in problems]
    return store


def _data(store, eid):
    return store.read_steps(eid), store.labels(eid), store.info(eid)


def _events(info, kind):
    return [e for e in info.end.events if e.kind == kind]


def test_gated_run_records_windows_that_validate_and_label_only_human_steps(tmp_path, student):
    rig = _rig(tmp_path, student, n=2, gates=ALWAYS)
    summary = rig.session.run(3, progress=False)
    store = _finish(rig)
    assert summary.episodes == 3 and summary.windows >= 3
    infos = store.episodes()
    assert len(infos) == 3 and all(i.complete for i in infos)
    for info in infos:
        d, lab, _ = _data(store, info.episode_id)
        src = d["action_source"]
        # the policy keeps computing during human control: every step has its policy action
        assert np.isfinite(d["policy_action"]).all() and np.isfinite(d["applied_action"]).all()
        human = src == HUMAN
        assert np.isfinite(d["human_command"][human]).all()
        assert (d["t_device"][human] > 0).all()
        assert (d["control_state"][human] == ControlState.HUMAN.code).all()
        assert lab.windows, "an always-firing gate hands over in every episode"
        inside = np.zeros(len(src), bool)
        for w in lab.windows:
            inside[w.handover_start:w.handover_end] = True
            assert w.parent_episode_id == info.episode_id and w.parent_step_id <= w.handover_start
            # t_handover is when the first human command was applied, not when the gate fired
            assert w.t_handover == d["t_action_apply"][w.handover_start]
            assert w.t_gate <= w.t_handover
            assert d["control_state"][w.parent_step_id] == ControlState.HANDOVER_REQUESTED.code
            assert src[w.handover_start] == HUMAN
        trainable = lab.mask == LabelMask.TRAINABLE.code
        assert trainable.any()
        assert not (trainable & ~(inside & human)).any()  # policy actions are never trainable
        assert (lab.target[trainable] == LabelTarget.APPLIED_ACTION.code).all()
        assert not (trainable & ((d["step_flags"] & int(StepFlag.INCOMPLETE_INPUT)) != 0)).any()
        gc = info.start.gate_config
        assert gc["policy_version"] == student.version and gc["person_available"] is True
        assert gc["gates"][0]["trigger"] == pytest.approx(1e-9) and gc["handover"]["wait"] == "hold"
        kinds = {e.kind for e in info.end.events}
        assert {EventKind.GATE_TRIGGER, EventKind.HANDOVER_START} <= kinds


def test_shipped_toy_config_with_calibration_runs_and_validates(tmp_path, student):
    rig = _rig(tmp_path, student, n=4, calibrate_steps=100)
    cal = rig.session.calibrate(100)
    assert cal is not None and cal["samples"] >= 100
    summary = rig.session.run(4, progress=False)
    store = _finish(rig)
    assert summary.episodes == 4
    info = store.episodes()[0]
    assert info.start.gate_config["gates"][0]["trigger"] == pytest.approx(cal["trigger"])


def test_max_episode_steps_cuts_every_episode_there_as_a_timeout(tmp_path, student):
    """An untrained student rarely reaches the target in 9 steps: the cut ends those episodes, each row starts
    its next seed at once, and the store reads them as timeouts truncated at their last step."""
    rig = _rig(tmp_path, student, n=3, gates=ALWAYS, max_episode_steps=9, seed=20)
    summary = rig.session.run(7, progress=False)
    store = _finish(rig)
    infos = store.episodes()
    assert summary.episodes == 7 and len(infos) == 7
    assert sorted(i.start.initial_state["seed"] for i in infos) == list(range(20, 27))
    assert all(i.num_steps <= 9 for i in infos)
    cut = [i for i in infos if i.end.end_reason == EndReason.TIMEOUT]
    assert cut and all(i.num_steps == 9 for i in cut)
    for info in cut:
        d = store.read_steps(info.episode_id, ["truncated"])
        assert d["truncated"].tolist() == [False] * 8 + [True]


@pytest.mark.parametrize("max_steps", [None, 30])
def test_the_eta_gate_counts_the_time_left_to_the_episode_s_cut(tmp_path, student, max_steps):
    """The session tells the gates how long each episode has left: to the task's horizon, at which the simulator
    ends it, or to the run's own step limit. A goal no pace can reach makes the gate ask once its window is
    full, and its event says how many seconds were left."""
    eta = GateConfig(name="eta", gates=[ProgressEtaGate(goal=1000.0, window_s=0.2, trigger=1.0)])
    rig = _rig(tmp_path, student, n=2, gates=eta, max_episode_steps=max_steps, seed=5)
    rig.session.run(2, progress=False)
    store = _finish(rig)
    m = rig.env.mapping
    limit = max_steps or m.horizon
    asked = [e for i in store.episodes() for e in _events(i, EventKind.GATE_TRIGGER) if e.reason == "progress_eta"]
    assert asked
    for e in asked:
        assert e.values["progress_eta"]["seconds_left"] == pytest.approx((limit - e.step) * m.dt)


def test_an_episode_that_ends_while_waiting_for_the_operator_leaves_its_row_idle(tmp_path, student):
    """Every episode ends (cut at 6 steps) while its request waits for a slow operator (8 steps to react); rows
    with no next episode go idle, and an operator engaging there later finds nothing to take over."""
    rig = _rig(tmp_path, student, n=3, gates=ALWAYS, max_episode_steps=6, **{"operator.reaction_delay_steps": 8})
    summary = rig.session.run(4, progress=False)
    store = _finish(rig)
    assert summary.episodes == 4 and summary.windows == 0 and summary.human_steps == 0
    assert all(i.num_steps == 6 and i.end.end_reason == EndReason.TIMEOUT for i in store.episodes())
    for _ in range(12):  # idle rows keep ticking in an interactive session: nothing is requested there any more
        rig.session.tick()


def _tick_until(session, pred, limit=300):
    for _ in range(limit):
        if pred():
            return
        session.tick()
    raise AssertionError("condition not reached")


def test_device_loss_mid_correction_holds_within_the_tick(tmp_path, student):
    rig = _rig(tmp_path, student, gates=ALWAYS, **{"handover.transition": "none", "operator.return_after_steps": 50})
    s = rig.session
    s.start(1)
    _tick_until(s, lambda: s.machine.state[0] == ControlState.HUMAN.code)
    for _ in range(3):
        s.tick()
    lost_at = int(s.ep_step[0])
    s.operator.disconnect(0)
    s.tick()
    assert s.machine.state[0] == ControlState.HANDOVER_REQUESTED.code
    s.tick()
    s.operator.connect(0)
    _tick_until(s, lambda: not s.running)
    store = _finish(rig)
    info = store.episodes()[0]
    d, lab, _ = _data(store, info.episode_id)
    assert d["action_source"][lost_at] == SAFETY
    assert d["step_flags"][lost_at] & int(StepFlag.DEVICE_LOST)
    np.testing.assert_array_equal(d["applied_action"][lost_at], [0.0, 0.0])  # hold
    assert d["action_source"][lost_at + 1] == SAFETY  # still holding while the device is away
    assert [e.step for e in _events(info, EventKind.DEVICE_DISCONNECT)] == [lost_at]
    assert [e.step for e in _events(info, EventKind.DEVICE_CONNECT)] == [lost_at + 2]
    first, second = lab.windows[0], lab.windows[1]
    assert first.handover_end == lost_at and first.outcome == RecoveryOutcome.PARTIAL
    assert second.parent_step_id == lost_at and second.gate_reason == "device_lost"
    assert second.handover_start >= lost_at + 2  # the operator re-engages after its reaction delay
    assert (d["action_source"][lost_at:second.handover_start] == SAFETY).all()  # held the whole time
    assert lab.mask[lost_at] == LabelMask.EXCLUDED.code


def test_estop_from_another_thread_safe_stops_and_ends_the_run(tmp_path, student):
    rig = _rig(tmp_path, student, n=2, gates=ALWAYS)
    s = rig.session
    s.start(4)
    for _ in range(8):
        s.tick()
    t = threading.Thread(target=s.estop, args=("keyboard", "operator pressed escape"))
    t.start()
    t.join()
    s.tick()
    assert not s.running and s.summary.stopped_by == "estop"
    with pytest.raises(HgDaggerError, match="e-stop from keyboard is latched"):
        s.start(1)
    store = _finish(rig)
    infos = store.episodes()
    assert len(infos) == 2
    for info in infos:
        assert info.end.end_reason == EndReason.SAFETY_STOP
        (ev,) = _events(info, EventKind.ESTOP)
        assert ev.source == "keyboard" and ev.reason == "operator pressed escape" and ev.step == 8
        d, lab, _ = _data(store, info.episode_id)
        assert d["control_state"][-1] == ControlState.SAFE_STOP.code and d["action_source"][-1] == SAFETY
        np.testing.assert_array_equal(d["applied_action"][-1], [0.0, 0.0])
        for w in lab.windows:
            if w.handover_end == len(d["action_source"]) - 1:
                assert w.outcome == RecoveryOutcome.SAFETY_STOP


def test_keyboard_takeover_correction_return_and_estop_button(tmp_path, student):
    kb = Keyboard()
    kb.connect()
    gates = GateConfig(name="operator_only", gates=[OperatorGate()])
    rig = _rig(tmp_path, student, operators=[kb], gates=gates,
               **{"operator.type": "device", "handover.transition": "blend", "handover.transition_ticks": 2})
    s = rig.session
    s.start(2)
    for _ in range(3):
        s.tick()
    kb.press("space")  # hold-to-intervene: grabbing the device is a takeover
    kb.press("w")
    for _ in range(6):
        s.tick()
    assert s.machine.state[0] == ControlState.HUMAN.code
    kb.release("space")
    kb.release("w")
    for _ in range(4):
        s.tick()
    assert s.machine.state[0] == ControlState.AUTONOMOUS.code
    kb.press("escape")
    s.tick()
    assert s.summary.stopped_by == "estop"
    store = _finish(rig)
    info = store.episodes()[0]
    d, lab, _ = _data(store, info.episode_id)
    (w,) = lab.windows
    assert w.gate_reason == "operator" and w.parent_step_id == 3 and w.handover_start == 3
    human = np.flatnonzero(d["action_source"] == HUMAN)
    assert list(human) == list(range(3, 9))
    np.testing.assert_allclose(d["human_command"][5][:2], [1.0, 0.0])  # raw key value kept
    np.testing.assert_allclose(d["applied_action"][5], [1.0, 0.0], atol=1e-6)  # blend done after 2 ticks
    assert d["step_flags"][3] & int(StepFlag.INCOMPLETE_INPUT)  # blend step: not a label
    assert list(np.flatnonzero(lab.mask == LabelMask.TRAINABLE.code)) == [5, 6, 7, 8]
    (ev,) = _events(info, EventKind.ESTOP)
    assert ev.source == "device:keyboard"


def test_safety_clamps_mark_safety_controller_and_keep_both_actions(tmp_path, student):
    rig = _rig(tmp_path, student, gates=GateConfig(name="none", gates=[OperatorGate()]),
               **{"safety.limits": {"low": [-0.01, -0.01], "high": [0.01, 0.01]}})
    rig.session.run(1, progress=False)
    store = _finish(rig)
    info = store.episodes()[0]
    d, lab, _ = _data(store, info.episode_id)
    clamped = d["action_source"] == SAFETY
    assert clamped.all()  # the fresh student's actions exceed 0.01
    assert (np.abs(d["applied_action"]) <= 0.01 + 1e-7).all()
    assert (np.abs(d["policy_action"]) > 0.01).any(axis=1).all()  # the command is kept as it was
    assert ((d["step_flags"] & int(StepFlag.CLAMPED)) != 0).all()
    evs = _events(info, EventKind.SAFETY_CLAMP)
    assert len(evs) == len(clamped)
    np.testing.assert_allclose(evs[0].values["command"], d["policy_action"][0], rtol=1e-6)
    np.testing.assert_allclose(evs[0].values["applied"], d["applied_action"][0], rtol=1e-6)
    assert evs[0].reason == "action_bounds" and evs[0].values["command_source"] == "policy"
    assert not (lab.mask == LabelMask.TRAINABLE.code).any()


def test_pause_waits_without_stepping_the_env(tmp_path, student):
    rig = _rig(tmp_path, student, gates=ALWAYS,
               **{"handover.wait": "pause", "operator.reaction_delay_steps": 6})
    s = rig.session
    s.run(1, progress=False)
    store = _finish(rig)
    assert s.summary.paused_ticks >= 6
    d, lab, _ = _data(store, store.episodes()[0].episode_id)
    assert not (d["control_state"] == ControlState.HANDOVER_REQUESTED.code).any()
    assert lab.windows and lab.windows[0].parent_step_id == lab.windows[0].handover_start == 0


def test_keep_policy_running_while_waiting(tmp_path, student):
    rig = _rig(tmp_path, student, gates=ALWAYS, **{"handover.wait": "policy", "operator.reaction_delay_steps": 4})
    s = rig.session
    s.start(1)
    _tick_until(s, lambda: s.machine.state[0] == ControlState.HUMAN.code)
    s.estop("app")
    s.tick()
    store = _finish(rig)
    d, _, _ = _data(store, store.episodes()[0].episode_id)
    waiting = d["control_state"] == ControlState.HANDOVER_REQUESTED.code
    assert waiting.sum() >= 4 and (d["action_source"][waiting] == POLICY).all()
    np.testing.assert_allclose(d["applied_action"][waiting], d["policy_action"][waiting], rtol=1e-6)


def test_unavailable_operator_times_out_into_safe_stop_and_the_next_episode_starts(tmp_path, student):
    rig = _rig(tmp_path, student, gates=ALWAYS,
               **{"operator.availability": 0.0, "handover.wait_timeout_s": 0.2})
    summary = rig.session.run(2, progress=False)
    store = _finish(rig)
    assert summary.episodes == 2 and summary.windows == 0
    for info in store.episodes():
        assert info.start.gate_config["person_available"] is False
        assert info.end.end_reason == EndReason.SAFETY_STOP
        d, _, _ = _data(store, info.episode_id)
        assert d["control_state"][-1] == ControlState.SAFE_STOP.code
        assert (d["action_source"][1:] == SAFETY).all()  # held while nobody came


def test_expert_operator_windows_train_on_expert_labels(tmp_path, student):
    rig = _rig(tmp_path, student, n=2, gates=ALWAYS, **{"operator.type": "expert"})
    summary = rig.session.run(2, progress=False)
    store = _finish(rig)
    assert summary.windows >= 2
    for info in store.episodes():
        d, lab, _ = _data(store, info.episode_id)
        assert info.start.gate_config["person_available"] is False
        assert np.isfinite(d["expert_action"]).all() and d["expert_valid"].all()
        assert all(w.source == ActionSource.EXPERT for w in lab.windows)
        trainable = lab.mask == LabelMask.TRAINABLE.code
        assert trainable.any() and (lab.target[trainable] == LabelTarget.EXPERT_ACTION.code).all()
        used = d["action_source"] == EXPERT
        assert (d["expert_used"] == used).all()
        assert (d["control_state"][used] == ControlState.EXPERT.code).all()


def test_steps_over_the_latency_budget_are_flagged_and_excluded_inside_windows(tmp_path, student):
    rig = _rig(tmp_path, student, gates=ALWAYS, latency_budget_ms=1e-6)  # every step is "late"
    rig.session.run(1, progress=False)
    store = _finish(rig)
    d, lab, _ = _data(store, store.episodes()[0].episode_id)
    assert ((d["step_flags"] & int(StepFlag.LATENCY_EXCEEDED)) != 0).all()
    assert lab.windows and (d["action_source"] == HUMAN).any()
    assert not (lab.mask == LabelMask.TRAINABLE.code).any()
    assert (lab.mask == LabelMask.EXCLUDED.code).all()


def test_takeover_button_then_return_while_still_holding_does_not_grab_again(tmp_path, student):
    kb = Keyboard()
    kb.connect()
    rig = _rig(tmp_path, student, operators=[kb], gates=GateConfig(name="operator_only", gates=[OperatorGate()]),
               **{"operator.type": "device", "handover.transition": "none", "handover.return_on_release": False,
                  "handover.auto_return": {"enabled": False}})
    s = rig.session
    s.start(1)
    kb.press("space")
    kb.press("d")  # y axis -> elbow
    s.tick()  # grabbing the device: takeover
    assert s.machine.state[0] == ControlState.HUMAN.code
    for _ in range(3):
        s.tick()
    kb.press("b")  # return button while still holding
    s.tick()
    kb.release("b")
    for _ in range(3):
        s.tick()
    assert s.machine.state[0] == ControlState.AUTONOMOUS.code  # holding is not a new grab
    kb.press("t")  # the takeover button asks again; the held device takes over at once
    s.tick()
    kb.release("t")
    s.tick()
    assert s.machine.state[0] == ControlState.HUMAN.code
    s.estop("app")
    s.tick()
    store = _finish(rig)
    d, lab, _ = _data(store, store.episodes()[0].episode_id)
    assert [(w.handover_start, w.handover_end, w.gate_reason) for w in lab.windows] == [(0, 4, "operator"),
                                                                                       (8, 10, "operator")]
    np.testing.assert_allclose(d["applied_action"][1], [0.0, -1.0])


def test_shipped_run_configs_load_and_name_gate_configs_that_exist():
    from pathlib import Path

    from hg_dagger import config
    from hg_dagger.control.run_config import RunConfig, load_gate_config

    files = sorted(Path(config.CONFIG_DIR, "run").glob("*.yaml"))
    assert files
    for f in files:
        cfg = config.check(f)
        assert isinstance(cfg, RunConfig)
        gates = load_gate_config(cfg.gates, cfg.task)
        assert gates.task in ("", cfg.task)


def test_a_chunk_student_in_a_session_forgets_each_row_when_its_next_episode_begins(tmp_path):
    """The session tells the student where episodes begin: the policy action recorded at each episode's first
    step is the fresh chunk's own, whatever the row ran before; later steps blend the row's earlier chunks."""
    chunked = Student.create(make_env("toy_reach", num_envs=1).mapping, kind="mlp_chunk", seed=0, ensemble=2,
                             hidden=(16,))
    rig = _rig(tmp_path, chunked, n=2, gates=ALWAYS, max_episode_steps=6)
    rig.session.run(4, progress=False)
    store = _finish(rig)
    infos = store.episodes()
    assert len(infos) == 4
    keys = list(chunked.mapping.obs_spec())
    for info in infos:
        d = store.read_steps(info.episode_id)
        obs = {k: d[f"obs/{k}"] for k in keys}
        alone = np.stack([chunked.act({k: v[i : i + 1] for k, v in obs.items()}).policy_action[0]
                          for i in range(len(d["policy_action"]))])  # one row at a time: no rollout memory
        np.testing.assert_allclose(d["policy_action"][0], alone[0], atol=1e-6)
        assert not np.allclose(d["policy_action"][1:], alone[1:], atol=1e-6)
