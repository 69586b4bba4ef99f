"""Handover state machine: every transition, wait behaviour, smoothing at both switches, windows."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import (
    ActionSource,
    ControlState,
    EndReason,
    LabelMask,
    RecoveryOutcome,
    StepFlag,
)
from hg_dagger.contract.labels import derive_labels
from hg_dagger.control.handover import (
    SRC_EXPERT,
    SRC_HOLD,
    SRC_HUMAN,
    SRC_POLICY,
    AutoReturn,
    HandoverConfig,
    HandoverMachine,
    TickInputs,
)

S = ControlState
A = 2


class Driver:
    """Steps one machine tick by tick the way the session does, keeping what was applied."""

    def __init__(self, n=1, operator="human", **cfg):
        self.m = HandoverMachine(HandoverConfig(**cfg), num_envs=n, action_dim=A, step_dt=0.1, operator=operator)
        self.n = n
        self.step = np.zeros(n, np.int64)
        self.prev = np.zeros((n, A), np.float32)
        self.prev_ok = np.zeros(n, bool)
        self.sources, self.flags, self.applied, self.states = [], [], [], []

    def tick(self, level=0, engaged=False, ok=True, ret=False, agree=False, confident=True, estop=False,
             policy=(0.0, 0.0), human=(1.0, 1.0)):
        n = self.n
        arr = lambda v, dt=bool: np.broadcast_to(np.asarray(v, dt), (n,)).copy()  # noqa: E731
        x = TickInputs(step=self.step.copy(), t_ns=int(self.step[0]) * 10, gate_level=arr(level, np.uint8),
                       engaged=arr(engaged), device_ok=arr(ok), return_button=arr(ret), agree=arr(agree),
                       confident=arr(confident), estop=arr(estop),
                       gate_trip=[{"reason": "confidence", "values": {}}] * n,
                       t_warn=np.full(n, 5, np.int64), t_gate=np.full(n, 7, np.int64))
        d = self.m.update(x)
        pol = np.broadcast_to(np.asarray(policy, np.float32), (n, A))
        hum = np.broadcast_to(np.asarray(human, np.float32), (n, A))
        target = np.where((d.source == SRC_HUMAN)[:, None] | (d.source == SRC_EXPERT)[:, None], hum,
                          np.where((d.source == SRC_HOLD)[:, None], 0.0, pol)).astype(np.float32)
        out, flags = self.m.smooth(target, self.prev, self.prev_ok)
        self.m.note_applied(1000 + self.step)  # t_action_apply of this step
        self.prev, self.prev_ok = out.copy(), np.ones(n, bool)
        self.sources.append(d.source.copy())
        self.flags.append(flags.copy())
        self.applied.append(out.copy())
        self.states.append(d.state.copy())
        self.step += 1
        return d

    def state(self, r=0):
        return ControlState.from_code(int(self.m.state[r]))

    def finish(self, success=True, end=EndReason.SUCCESS, r=0):
        return self.m.finish(r, episode_id="ep", num_steps=int(self.step[r]), success=success, end_reason=end)


def test_warning_and_clear_without_handover():
    d = Driver()
    d.tick(level=1)
    assert d.state() == S.WARNING and d.sources[-1][0] == SRC_POLICY
    d.tick(level=0)
    assert d.state() == S.AUTONOMOUS
    assert d.finish()[0] == []


@pytest.mark.parametrize("wait,source,paused", [("hold", SRC_HOLD, False), ("policy", SRC_POLICY, False),
                                                ("pause", SRC_HOLD, True)])
def test_wait_behaviour_while_handover_requested(wait, source, paused):
    d = Driver(wait=wait)
    dec = d.tick(level=2)
    assert d.state() == S.HANDOVER_REQUESTED
    assert dec.source[0] == source and dec.paused[0] == paused


def test_takeover_window_times_and_return_button():
    d = Driver(transition="none")
    d.tick()  # step 0 autonomous
    d.tick(level=2)  # step 1 gate fires
    d.tick(level=2)  # step 2 still waiting
    d.tick(engaged=True)  # step 3 first human command applied
    assert d.state() == S.HUMAN and d.sources[-1][0] == SRC_HUMAN
    d.tick(engaged=True)  # step 4
    dec = d.tick(engaged=True, ret=True)  # step 5 back to the policy
    assert d.state() == S.AUTONOMOUS and dec.source[0] == SRC_POLICY and list(dec.rearm) == [0]
    d.tick()
    (w,), outcome = d.finish()
    assert (w.parent_step_id, w.handover_start, w.handover_end) == (1, 3, 5)
    assert w.t_handover == 1003 and w.t_return == 1005  # applied times, not the gate or click time
    assert w.t_gate == 7 and w.t_warn == 5 and w.gate_reason == "confidence"
    assert w.context_before == 3 and w.context_after == 2
    assert w.source == ActionSource.HUMAN and outcome == RecoveryOutcome.RECOVERY_SUCCESS


def test_blend_in_and_out_has_no_jump_and_is_flagged():
    d = Driver(transition="blend", transition_ticks=3)
    d.tick(policy=(0.0, 0.0))
    d.tick(level=2, policy=(0.0, 0.0))  # hold: 0
    for _ in range(6):
        d.tick(engaged=True, human=(1.0, -1.0))
    for _ in range(5):
        d.tick(ret=True, policy=(-1.0, 1.0))
    app = np.array([a[0] for a in d.applied])
    assert np.max(np.abs(np.diff(app, axis=0))) <= 0.5 + 1e-6  # steps of 1/(3+1) of a 2.0 swing
    np.testing.assert_allclose(app[2], [0.25, -0.25])
    np.testing.assert_allclose(app[5], [1.0, -1.0])
    flags = np.array([f[0] for f in d.flags])
    assert all(flags[i] & StepFlag.INCOMPLETE_INPUT for i in (2, 3, 4))
    assert not flags[5] and not flags[6]
    states = [ControlState.from_code(int(s[0])) for s in d.states]
    assert states[8:11] == [S.RETURNING] * 3 and states[11] == S.AUTONOMOUS
    assert all(flags[i] & StepFlag.INTERPOLATED and not flags[i] & StepFlag.INCOMPLETE_INPUT for i in (8, 9, 10))
    (w,), _ = d.finish()
    assert (w.handover_start, w.handover_end) == (2, 8)


def test_ramp_limits_change_per_tick():
    d = Driver(transition="ramp", transition_ticks=20, ramp_max_delta=0.3)
    d.tick(level=2)
    for _ in range(6):
        d.tick(engaged=True, human=(1.0, -1.0))
    app = np.array([a[0] for a in d.applied])
    assert np.max(np.abs(np.diff(app, axis=0))) <= 0.3 + 1e-6
    np.testing.assert_allclose(app[-1], [1.0, -1.0])
    assert not d.flags[-1][0]


def test_release_of_hold_to_intervene_returns():
    d = Driver(transition="none")
    d.tick(level=2)
    d.tick(engaged=True)
    d.tick(engaged=False)
    assert d.state() == S.AUTONOMOUS


def test_auto_return_needs_agreement_for_n_ticks_and_confidence():
    d = Driver(transition="none", return_on_release=False, auto_return=AutoReturn(agree_ticks=3))
    d.tick(level=2)
    d.tick(engaged=True)
    d.tick(engaged=True, agree=True)
    d.tick(engaged=True, agree=True)
    d.tick(engaged=True, agree=False)  # disagreement resets the count
    d.tick(engaged=True, agree=True)
    d.tick(engaged=True, agree=True, confident=False)  # not confident: does not count
    d.tick(engaged=True, agree=True)
    d.tick(engaged=True, agree=True)
    assert d.state() == S.HUMAN
    d.tick(engaged=True, agree=True)
    assert d.state() == S.AUTONOMOUS
    (w,), _ = d.finish()
    assert w.handover_end == 9


def test_device_loss_mid_correction_holds_in_the_same_tick():
    d = Driver(transition="none")
    d.tick(level=2)
    d.tick(engaged=True)
    d.tick(engaged=True)
    dec = d.tick(engaged=False, ok=False)  # step 3: device gone
    assert dec.device_lost[0] and dec.source[0] == SRC_HOLD and np.all(d.applied[-1] == 0)
    assert d.state() == S.HANDOVER_REQUESTED
    dec = d.tick(engaged=False, ok=False)
    assert dec.source[0] == SRC_HOLD  # keeps holding while waiting, even though wait is not "hold"-only
    d.tick(engaged=True)  # step 5 the device is back
    assert d.state() == S.HUMAN
    d.tick(engaged=True, ret=True)
    (w1, w2), _ = d.finish()
    assert (w1.handover_start, w1.handover_end, w1.outcome) == (1, 3, RecoveryOutcome.PARTIAL)
    assert (w2.parent_step_id, w2.handover_start, w2.handover_end, w2.gate_reason) == (3, 5, 6, "device_lost")


def test_device_loss_can_stop_instead():
    d = Driver(transition="none", on_device_loss="stop", wait="policy")
    d.tick(level=2)
    d.tick(engaged=True)
    dec = d.tick(engaged=True, ok=False)
    assert d.state() == S.SAFE_STOP and dec.source[0] == SRC_HOLD


@pytest.mark.parametrize("setup", ["autonomous", "warning", "requested", "human", "returning"])
def test_estop_from_any_state(setup):
    d = Driver(transition="blend", transition_ticks=3)
    if setup == "warning":
        d.tick(level=1)
    if setup in ("requested", "human", "returning"):
        d.tick(level=2)
    if setup in ("human", "returning"):
        d.tick(engaged=True)
    if setup == "returning":
        d.tick(ret=True)
        assert d.state() == S.RETURNING
    dec = d.tick(estop=True, engaged=True)
    assert d.state() == S.SAFE_STOP and dec.source[0] == SRC_HOLD
    d.tick(engaged=True, ret=True)
    assert d.state() == S.SAFE_STOP  # latched until the episode ends
    windows, outcome = d.finish(success=False, end=EndReason.SAFETY_STOP)
    if setup == "human":
        assert windows[0].outcome == RecoveryOutcome.SAFETY_STOP and windows[0].handover_end == 2


def test_wait_timeout_safe_stops_without_window():
    d = Driver(wait_timeout_s=0.3)
    d.tick(level=2)
    d.tick()
    d.tick()
    assert d.state() == S.HANDOVER_REQUESTED
    d.tick()
    assert d.state() == S.SAFE_STOP
    assert d.finish()[0] == []


def test_episode_ending_during_correction_closes_window_at_the_end():
    d = Driver(transition="none")
    d.tick(level=2)
    d.tick(engaged=True)
    d.tick(engaged=True)
    (w,), outcome = d.finish(success=False, end=EndReason.TIMEOUT)
    assert (w.handover_start, w.handover_end, w.context_after) == (1, 3, 0)
    assert w.t_return == NO_TIME and outcome == RecoveryOutcome.TIMEOUT


def test_expert_operator_takes_over_at_once_and_labels_come_from_the_expert():
    d = Driver(operator="expert", transition="blend", transition_ticks=2)
    dec = d.tick(level=2, engaged=True)
    assert d.state() == S.EXPERT and dec.source[0] == SRC_EXPERT
    assert not d.flags[-1][0] & StepFlag.INCOMPLETE_INPUT  # expert labels are expert_action, not applied
    (w,), _ = d.finish()
    assert w.source == ActionSource.EXPERT and w.handover_start == 0


def test_rows_are_independent():
    d = Driver(n=3, transition="none")
    d.tick(level=np.array([0, 2, 1]))
    assert [ControlState.from_code(int(s)) for s in d.m.state] == [S.AUTONOMOUS, S.HANDOVER_REQUESTED, S.WARNING]
    d.tick(engaged=np.array([True, True, False]))
    assert [ControlState.from_code(int(s)) for s in d.m.state] == [S.AUTONOMOUS, S.HUMAN, S.AUTONOMOUS]


def test_windows_give_trainable_labels_only_for_human_steps_inside():
    d = Driver(transition="blend", transition_ticks=2)
    for _ in range(3):
        d.tick()
    d.tick(level=2)
    for _ in range(6):
        d.tick(engaged=True)
    for _ in range(4):
        d.tick(ret=True)
    windows, _ = d.finish()
    src = np.array([s[0] for s in d.sources], np.uint8)
    flags = np.array([f[0] for f in d.flags], np.uint16)
    lab = derive_labels(action_source=src, valid=np.ones(len(src), bool), step_flags=flags,
                        expert_valid=np.zeros(len(src), bool), windows=windows, operator="op", policy_version="")
    trainable = np.flatnonzero(lab.mask == LabelMask.TRAINABLE.code)
    # human from step 4 to 9; the first two are blend steps (excluded)
    assert list(trainable) == [6, 7, 8, 9]
    assert all(lab.mask[i] == LabelMask.EXCLUDED.code for i in (4, 5))
    assert all(lab.mask[i] == LabelMask.CONTEXT_ONLY.code for i in (0, 1, 2, 3, 10, 11, 12, 13))
