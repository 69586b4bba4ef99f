"""Operators answer the tick the same way whatever they are: the real keyboard device, the toy planner
expert, and the config errors that name the key to fix."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.control.handover import AUTO, HUMAN
from hg_dagger.control.operators import DeviceOperator, ExpertOperator, make_operator
from hg_dagger.control.run_config import OperatorConfig
from hg_dagger.devices import Keyboard
from hg_dagger.envs import make_env
from hg_dagger.errors import ConfigError


@pytest.fixture(scope="module")
def env():
    e = make_env("toy_reach", num_envs=2, seed=0)
    yield e
    e.close()


def test_device_operator_grab_is_a_takeover_only_while_the_policy_drives_and_estop_is_reported(env):
    kb = Keyboard()
    kb.connect()
    op = DeviceOperator([kb, None], env.mapping)
    obs, _ = env.reset(seed=0)
    active = np.ones(2, bool)
    t = op.poll(obs, np.array([AUTO, AUTO], np.uint8), active)
    assert t.device_ok.tolist() == [True, False] and not t.takeover.any() and not t.estop_by
    kb.press("space")
    kb.press("d")
    t = op.poll(obs, np.array([AUTO, AUTO], np.uint8), active)
    assert t.takeover.tolist() == [True, False] and t.engaged.tolist() == [True, False]
    np.testing.assert_allclose(t.action[0], [0.0, -1.0], atol=1e-6)
    assert np.isnan(t.action[1]).all()
    kb.press("escape")
    t = op.poll(obs, np.array([HUMAN, AUTO], np.uint8), active)
    assert not t.takeover.any() and t.estop_by == "device:keyboard"
    state = op.device_state(0)
    assert state["connected"] and op.device_state(1) == {"kind": "none"}
    assert state["axes"][1] == -1.0 and state["axes"][0] == 0.0, "the panel's axes: 'd' is y-"
    assert len(state["deadzone"]) == 7 and "escape" not in state["buttons"] and "estop" in state["buttons"]


def test_expert_operator_answers_every_row_with_its_labels(env):
    from hg_dagger.experts import make_expert

    op = ExpertOperator(make_expert("toy_reach", kind="planner", mapping=env.mapping), env.mapping, 2)
    obs, _ = env.reset(seed=1)
    t = op.poll(obs, np.array([AUTO, HUMAN], np.uint8), np.ones(2, bool))
    assert op.role == "expert" and op.records_expert_labels and not op.person_available
    assert t.engaged.all() and t.expert_valid.all() and (t.device_ok == t.expert_valid).all()
    np.testing.assert_array_equal(t.action, t.expert_action)
    assert np.isfinite(t.action).all()


def test_make_operator_names_what_is_missing(env):
    with pytest.raises(ConfigError, match="one env"):
        make_operator(OperatorConfig(type="device", device="keyboard"), mapping=env.mapping, num_envs=2)
    with pytest.raises(ConfigError, match="operator.device"):
        make_operator(OperatorConfig(type="device"), mapping=env.mapping, num_envs=1)
    with pytest.raises(ConfigError, match="expert"):
        make_operator(OperatorConfig(type="expert"), mapping=env.mapping, num_envs=2)
    with pytest.raises(ConfigError, match="1 operator devices for 2 envs"):
        make_operator(OperatorConfig(), mapping=env.mapping, num_envs=2, devices=[Keyboard()])
