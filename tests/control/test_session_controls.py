"""The controls a live front end calls between ticks, and the env contract's fault keys, on the real
toy_reach env with a real store on tmp_path. Every store must pass validation."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import (
    ActionSource,
    CollectionMode,
    ControlState,
    EndReason,
    EventKind,
    LabelMask,
    StepFlag,
)
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig, OperatorGate
from hg_dagger.control.run_config import load_run_config
from hg_dagger.devices import Keyboard
from hg_dagger.envs import make_env
from hg_dagger.envs.base import StepResult, VecEnv
from hg_dagger.errors import HgDaggerError
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

HUMAN = ActionSource.HUMAN.code
EXPERT = ActionSource.EXPERT.code
TRAINABLE, EXCLUDED = LabelMask.TRAINABLE.code, LabelMask.EXCLUDED.code
ALWAYS = GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])
OPERATOR_ONLY = GateConfig(name="operator_only", gates=[OperatorGate()])


class FaultyEnv(VecEnv):
    """The real toy env, with the env contract's robot fault keys set on chosen steps (as a robot bridge would)."""

    def __init__(self, env, *, sensor_loss_at: int | None = None, estop_at: int | None = None):
        self.env, self.num_envs, self.task_id = env, env.num_envs, env.task_id
        self.sensor_loss_at, self.estop_at = sensor_loss_at, estop_at
        self.steps = 0

    @property
    def mapping(self):
        return self.env.mapping

    def reset(self, seed=None, env_ids=None):
        return self.env.reset(seed=seed, env_ids=env_ids)

    def step(self, action) -> StepResult:
        res = self.env.step(action)
        res.info["sensor_loss"] = np.full(self.num_envs, self.steps == self.sensor_loss_at)
        res.info["estop"] = np.full(self.num_envs, self.steps == self.estop_at)
        self.steps += 1
        return res


@pytest.fixture(scope="module")
def student():
    return Student.create(make_env("toy_reach", num_envs=1).mapping, seed=0, ensemble=3, hidden=(32, 32))


def _rig(tmp_path, student, *, env=None, operators=None, **over):
    over.setdefault("calibrate_steps", 0)
    over.setdefault("operator.return_after_steps", 12)
    cfg = load_run_config(None, "toy_reach", num_envs=1, **over)
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    env = env or make_env("toy_reach", num_envs=1, seed=0)
    return build_session(cfg, rec, student, env=env, operators=operators), rec


def _finish(tmp_path, rec):
    rec.close()
    store = EpisodeStore.open(str(tmp_path / "store"))
    problems = validate_store(store)
    assert not problems, [str(p) for p in problems]
    return store


def _keyboard_session(tmp_path, student, **kw):
    kb = Keyboard()
    kb.connect()
    s, rec = _rig(tmp_path, student, operators=[kb], gates=OPERATOR_ONLY,
                  **{"operator.type": "device", "handover.transition": "none", **kw})
    return s, rec, kb


def test_env_estop_latches_the_safety_stop_and_sensor_loss_excludes_the_step(tmp_path, student):
    env = FaultyEnv(make_env("toy_reach", num_envs=1, seed=0), sensor_loss_at=2, estop_at=6)
    s, rec, kb = _keyboard_session(tmp_path, student, env=env)
    kb.press("space")  # grab the device: a person drives from the first step
    kb.press("w")
    s.start(3)
    for _ in range(7):
        s.tick()
    assert s.running and not s.safety.estopped
    s.tick()  # the obs of step 6 says the robot is e-stopped
    assert s.safety.estopped and s.safety.estop_source == "bridge" and not s.running
    assert s.summary.stopped_by == "estop"
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    assert info.end.end_reason == EndReason.SAFETY_STOP and "estop" in info.end.quality_flags
    (ev,) = [e for e in info.end.events if e.kind == EventKind.ESTOP]
    assert ev.source == "bridge" and ev.step == 7
    d, lab = store.read_steps(info.episode_id), store.labels(info.episode_id)
    # the obs delivered by step 2 is stale: the step decided on it (3) is flagged and never a label
    flagged = np.flatnonzero(d["step_flags"] & int(StepFlag.SENSOR_LOSS))
    assert list(flagged) == [3]
    assert lab.mask[3] == EXCLUDED
    assert (lab.mask[[0, 1, 2, 4, 5, 6]] == TRAINABLE).all()
    assert d["control_state"][7] == ControlState.SAFE_STOP.code


def test_tick_view_reports_the_last_tick(tmp_path, student):
    s, rec = _rig(tmp_path, student, gates=ALWAYS, **{"operator.reaction_delay_steps": 3})
    s.start(1)
    s.tick()
    v = s.last
    assert not v.paused and v.step.tolist() == [0] and v.t_action_apply.dtype == np.int64
    assert v.t_obs[0] <= v.t_policy[0] <= v.t_action_apply[0]
    assert v.gate_level.tolist() == [2] and v.gate_reason == ["confidence"]
    assert v.control_state.tolist() == [ControlState.HANDOVER_REQUESTED.code]
    assert v.t_request[0] != NO_TIME and v.t_handover[0] == NO_TIME
    assert np.isnan(v.operator_action).all() and np.isfinite(v.policy_action).all()
    assert v.progress.shape == (1,) and np.isnan(v.progress).all()  # no progress signal before the first step
    while s.last.action_source[0] != HUMAN:
        s.tick()
    v = s.last
    assert v.control_state[0] == ControlState.HUMAN.code and v.t_handover[0] == v.t_action_apply[0]
    assert np.isfinite(v.operator_action).all() and v.uncertainty.dtype == np.float32
    assert np.isfinite(v.progress).all()  # toy_reach reports progress
    step = int(v.step[0])
    s.close_all("test over")
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    d = store.read_steps(info.episode_id)
    np.testing.assert_array_equal(d["applied_action"][step], v.applied_action[0])
    assert d["t_action_apply"][step] == v.t_action_apply[0] and d["action_source"][step] == HUMAN
    assert info.end.end_reason == EndReason.OPERATOR_ABORT and not s.running
    assert any(e.kind == EventKind.NOTE and e.reason == "test over" for e in info.end.events)


def test_end_episode_closes_the_open_window_and_begins_the_next(tmp_path, student):
    s, rec = _rig(tmp_path, student, gates=ALWAYS, **{"operator.reaction_delay_steps": 2,
                                                       "operator.return_after_steps": 100})
    s.start(2)
    while s.last is None or s.last.action_source[0] != HUMAN:
        s.tick()
    for _ in range(5):  # past the blend into the person's command
        s.tick()
    first = s.eids[0]
    s.end_episode(0, EndReason.SUCCESS, True)
    assert s.running and s.eids[0] not in (None, first) and s.ep_step[0] == 0
    s.tick()
    s.end_episode(0, EndReason.FAILURE, False)
    assert not s.running
    with pytest.raises(HgDaggerError, match="no open episode"):
        s.end_episode(0, EndReason.FAILURE, False)
    store = _finish(tmp_path, rec)
    a, b = store.episodes()
    assert a.episode_id == first and a.end.end_reason == EndReason.SUCCESS and a.end.task_success
    assert b.end.end_reason == EndReason.FAILURE and b.end.num_steps == 1
    assert b.start.initial_state["seed"] != a.start.initial_state["seed"]
    (w,) = store.labels(first).windows
    assert w.handover_end == a.end.num_steps  # the open window closed at the episode's end
    assert (store.labels(first).mask == TRAINABLE).any()


def test_a_discarded_episode_is_kept_but_never_trainable(tmp_path, student):
    s, rec = _rig(tmp_path, student, gates=ALWAYS, **{"operator.reaction_delay_steps": 1})
    s.start(2)
    for _ in range(12):
        s.tick()
    gone = s.eids[0]
    s.discard_episode(0, "camera bumped")
    assert s.running
    s.close_all("done")
    store = _finish(tmp_path, rec)
    info = store.info(gone)
    assert info.end.end_reason == EndReason.OPERATOR_ABORT and "discarded" in info.end.quality_flags
    assert any(e.kind == EventKind.NOTE and e.reason == "camera bumped" for e in info.end.events)
    lab = store.labels(gone)
    d = store.read_steps(gone)
    assert lab.windows and (d["action_source"] == HUMAN).any()  # corrections happened and are kept
    assert not (lab.mask == TRAINABLE).any()


def test_app_buttons_take_over_and_hand_back(tmp_path, student):
    s, rec, kb = _keyboard_session(tmp_path, student, **{"handover.return_on_release": False,
                                                         "handover.auto_return": {"enabled": False}})
    s.start(1)
    s.tick()
    assert s.machine.state[0] == ControlState.AUTONOMOUS.code
    s.press("takeover")
    s.tick()
    assert s.machine.state[0] == ControlState.HANDOVER_REQUESTED.code
    s.key("space", True)  # the app's key events reach the in-window keyboard
    s.tick()
    assert s.machine.state[0] == ControlState.HUMAN.code
    s.press("return")
    s.tick()
    assert s.machine.state[0] == ControlState.AUTONOMOUS.code
    with pytest.raises(HgDaggerError, match="unknown operator button"):
        s.press("jump")
    s.close_all("done")
    store = _finish(tmp_path, rec)
    (w,) = store.labels(store.episodes()[0].episode_id).windows
    # a person's device in a simulator: the world paused while the request waited (no row), so the take-over is
    # the step the request was made at
    assert (w.parent_step_id, w.handover_start, w.handover_end, w.gate_reason) == (1, 1, 2, "operator")


def test_clear_estop_is_needed_before_start_and_is_recorded(tmp_path, student):
    s, rec = _rig(tmp_path, student, gates=ALWAYS)
    s.start(1)
    s.tick()
    s.estop("app", "button")
    s.tick()
    assert not s.running
    with pytest.raises(HgDaggerError, match="latched"):
        s.start(1)
    s.clear_estop("tester")
    assert s.summary.notes == ["estop cleared by tester"] and not s.safety.estopped
    s.start(1)
    assert s.running
    s.tick()
    s.close_all("done")
    store = _finish(tmp_path, rec)
    assert [i.end.end_reason for i in store.episodes()] == [EndReason.SAFETY_STOP, EndReason.OPERATOR_ABORT]


def test_student_swap_and_modes_take_effect_at_the_next_episode(tmp_path, student):
    s, rec, kb = _keyboard_session(tmp_path, student)
    other = Student.create(s.mapping, seed=1, ensemble=2, hidden=(16,))
    s.start(4)
    s.tick()
    s.set_student(other)
    s.set_mode("student_only")
    assert s.student is student  # not before the episode ends
    assert s.mode == "human_gated" and s.next_mode == "student_only"
    s.end_episode(0, EndReason.ENV_RESET, False)
    assert s.student is other and s.mode == "student_only"
    s.press("takeover")  # nobody answers in student_only: the gates are off
    for _ in range(5):
        s.tick()
    assert (s.machine.state == ControlState.AUTONOMOUS.code).all()
    s.set_mode("teleop")
    s.end_episode(0, EndReason.ENV_RESET, False)
    kb.press("space")
    kb.press("d")
    for _ in range(5):
        s.tick()
    s.set_mode("expert")
    s.end_episode(0, EndReason.ENV_RESET, False)
    assert s.operator.kind == "expert"
    s.close_all("done")
    store = _finish(tmp_path, rec)
    gated, evaluation, teleop, expert = store.episodes()
    assert gated.start.policy_version == student.version
    assert evaluation.start.policy_version == other.version and evaluation.start.mode == CollectionMode.EVAL
    assert not (store.labels(evaluation.episode_id).mask == TRAINABLE).any()
    assert teleop.start.gate_config["session_mode"] == "teleop"
    d, lab = store.read_steps(teleop.episode_id), store.labels(teleop.episode_id)
    assert (d["action_source"] == HUMAN).all() and (lab.mask == TRAINABLE).all()
    (w,) = lab.windows
    assert (w.handover_start, w.handover_end) == (0, 5)
    np.testing.assert_allclose(d["applied_action"][0], [0.0, -1.0])  # the person's command from the first step
    assert expert.start.gate_config["operator"]["kind"] == "expert"


def test_a_button_press_reaches_a_synthetic_operator_that_is_idle(tmp_path, student):
    """Between requests the synthetic operators hand out one read-only answer, tick after tick; the app's take-over
    button still reaches the session through it, and leaves it unchanged for the next tick."""
    s, rec = _rig(tmp_path, student, gates=OPERATOR_ONLY, **{"operator.reaction_delay_steps": 50})
    s.start(1)
    s.tick()
    idle = s.operator.poll_idle()
    assert idle is s.operator.poll_idle() and not idle.takeover.flags.writeable
    with pytest.raises(ValueError):
        idle.takeover[0] = True
    s.press("takeover")
    s.tick()
    assert s.machine.state[0] == ControlState.HANDOVER_REQUESTED.code
    assert not idle.takeover.any() and not idle.ret.any()  # the shared answer was copied, not written
    s.operator.disconnect(0)
    assert s.operator.poll_idle() is not idle and not s.operator.poll_idle().device_ok[0]  # a new answer
    s.close_all("done")
    store = _finish(tmp_path, rec)
    (info,) = store.episodes()
    assert [e.reason for e in info.end.events if e.kind == EventKind.GATE_TRIGGER] == ["operator"]
