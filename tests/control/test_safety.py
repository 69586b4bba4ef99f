"""Safety monitor: clamps on every action, hold, e-stop latch; independent of gates."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hg_dagger.control.limits import ActionLimits, StateBox
from hg_dagger.control.safety import SafetyConfig, SafetyMonitor
from hg_dagger.errors import ConfigError


def _mon(n=2, **lim):
    return SafetyMonitor(SafetyConfig(limits=ActionLimits(**lim)), num_envs=n, action_dim=2)


def test_velocity_bounds_clamp_and_report():
    m = _mon(low=[-0.5, -1], high=[0.5, 1])
    r = m.apply(np.array([[0.9, 0.2], [0.1, -0.3]], np.float32), {})
    np.testing.assert_allclose(r.applied, [[0.5, 0.2], [0.1, -0.3]])
    assert list(r.changed) == [True, False]
    assert dict((k, list(v)) for k, v in r.reasons)["action_bounds"] == [True, False]


def test_acceleration_limit_uses_last_applied_action_of_the_episode():
    m = _mon(max_delta=[0.2, 0.2])
    first = m.apply(np.array([[1.0, 0.0], [0.0, 0.0]], np.float32), {})
    assert not first.changed.any()  # nothing applied yet in this episode
    m.commit(first.applied)
    r = m.apply(np.array([[0.0, 0.0], [0.1, 0.5]], np.float32), {})
    np.testing.assert_allclose(r.applied, [[0.8, 0.0], [0.1, 0.2]], atol=1e-6)
    m.commit(r.applied)
    m.reset([1])  # row 1 starts a new episode: no reference any more
    r = m.apply(np.array([[0.8, 0.0], [-1.0, -1.0]], np.float32), {})
    np.testing.assert_allclose(r.applied[1], [-1.0, -1.0])


def test_workspace_box_keeps_predicted_state_inside():
    box = StateBox(obs_key="pos", index=[0, 1], action_index=[0, 1], gain=0.1, low=[0, 0], high=[1, 1])
    m = _mon(boxes=[box])
    obs = {"pos": np.array([[0.95, 0.5], [1.2, 0.5]], np.float32)}  # row 1 is already outside
    r = m.apply(np.array([[1.0, 0.3], [0.5, 0.0]], np.float32), obs)
    pred = obs["pos"] + 0.1 * r.applied
    assert np.all(pred <= 1.0 + 1e-6) and np.all(pred >= -1e-6)
    assert r.applied[1, 0] < 0  # pushed back towards the workspace
    assert list(r.changed) == [True, True]


def test_joint_limit_box_on_joint_observation():
    box = StateBox(name="joints", obs_key="qpos", index=[1], action_index=[1], gain=0.08, low=[-2.5], high=[2.5])
    m = _mon(boxes=[box])
    r = m.apply(np.array([[0.0, 1.0]], np.float32), {"qpos": np.array([[0.0, 2.45]], np.float32)})
    assert r.applied[0, 1] == pytest.approx((2.5 - 2.45) / 0.08, rel=1e-4)
    assert dict(r.reasons)["joints"][0]


def test_bounds_win_when_limits_conflict():
    box = StateBox(obs_key="pos", index=[0], action_index=[0], gain=0.1, low=[0], high=[1])
    m = _mon(n=1, low=[-0.5, -1], high=[0.5, 1], boxes=[box])
    r = m.apply(np.array([[0.0, 0.0]], np.float32), {"pos": np.array([[2.0]], np.float32)})
    assert r.applied[0, 0] == pytest.approx(-0.5)


def test_non_finite_command_becomes_hold():
    m = SafetyMonitor(SafetyConfig(hold_action=[0.0, None]), num_envs=2, action_dim=2)
    m.commit(np.array([[0.3, -1.0], [0.3, 1.0]], np.float32))
    r = m.apply(np.array([[np.nan, 0.1], [0.2, 0.2]], np.float32), {})
    np.testing.assert_allclose(r.applied[0], [0.0, -1.0])  # gripper-style dim keeps its last value
    assert list(r.changed) == [True, False]
    assert r.reasons[0][0] == "non_finite"


def test_hold_defaults_to_zero_motion():
    m = SafetyMonitor(SafetyConfig(), num_envs=3, action_dim=2)
    m.commit(np.ones((3, 2), np.float32))
    assert np.all(m.hold() == 0)


def test_disabled_monitor_passes_commands_through():
    m = SafetyMonitor(SafetyConfig(enabled=False, limits=ActionLimits(low=[-0.1, -0.1], high=[0.1, 0.1])),
                      num_envs=1, action_dim=2)
    r = m.apply(np.array([[0.9, 0.9]], np.float32), {})
    assert not r.changed.any() and r.applied[0, 0] == pytest.approx(0.9)


def test_estop_latch_from_another_thread_keeps_first_source():
    m = SafetyMonitor(SafetyConfig(), num_envs=1, action_dim=2)
    t = threading.Thread(target=m.request_estop, args=("keyboard", "space bar"))
    t.start()
    t.join()
    m.request_estop("bridge")
    assert m.estopped and m.estop_source == "keyboard" and m.estop_reason == "space bar"
    m.clear_estop()
    assert not m.estopped and m.estop_source == ""


def test_limits_that_do_not_fit_the_task_are_config_errors():
    with pytest.raises(ConfigError, match="max_delta has 3 values"):
        SafetyMonitor(SafetyConfig(limits=ActionLimits(max_delta=[1, 1, 1])), num_envs=1, action_dim=2)
    with pytest.raises(ConfigError, match="hold_action"):
        SafetyMonitor(SafetyConfig(hold_action=[0.0]), num_envs=1, action_dim=2)
    with pytest.raises(ValueError, match="low"):
        ActionLimits(low=[1.0, 0.0], high=[0.0, 1.0])
