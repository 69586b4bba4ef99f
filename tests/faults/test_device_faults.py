"""Fault injection on the operator's device: the gamepad (an SDL virtual joystick, the `pads` fixture)
unplugged while the person holds control. The robot must hold in the very tick the loss is seen, the
loss must be recorded, and control comes back only when the person acts: plugging the pad back in is
not enough, they must grab it (hold to intervene) again, and the event names who took over."""

from __future__ import annotations

import numpy as np
import pygame
import pytest

from hg_dagger.contract.enums import ActionSource, ControlState, EventKind, LabelMask, StepFlag
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.run_config import load_run_config
from hg_dagger.devices import load_device_config, make_device
from hg_dagger.envs import make_env
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

ALWAYS = GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])
HUMAN, REQUESTED = ControlState.HUMAN.code, ControlState.HANDOVER_REQUESTED.code
SAFETY, OPERATOR = ActionSource.SAFETY_CONTROLLER.code, ActionSource.HUMAN.code
LB = 4  # hold to intervene (configs/devices/gamepad.yaml)


def _pad(pads, tmp_path):
    index = pads.attach()
    pad = make_device(load_device_config("gamepad").model_copy(update={"calibration_dir": tmp_path}))
    pad.connect()
    pygame.event.clear()  # SDL's own initial axis events
    return pad, pygame.joystick.Joystick(index).get_instance_id()


def _tick_until(s, pred, limit=300):
    for _ in range(limit):
        if pred():
            return
        s.tick()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("wait", ["hold", "pause"])
def test_gamepad_unplugged_mid_correction_holds_at_once_and_resumes_only_when_the_person_grabs_it(pads, tmp_path, wait):
    """hold (a robot): the held steps are recorded until the person acts; pause (the simulator): the tick that
    lost the device is held and recorded, then the world waits without steps until the person acts."""
    pad, iid = _pad(pads, tmp_path)
    env = make_env("toy_reach", num_envs=1, seed=0)
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, gates=ALWAYS,
                          **{"operator.type": "device", "operator.name": "op-pad", "handover.transition": "none",
                             "handover.wait": wait})
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    student = Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32))
    s = build_session(cfg, rec, student, env=env, operators=[pad])
    s.start(1)
    _tick_until(s, lambda: s.machine.state[0] == REQUESTED)
    pads.set_button(iid, LB, True)  # the person grabs the pad
    pads.set_axis(iid, 0, 20000)
    _tick_until(s, lambda: s.machine.state[0] == HUMAN)
    for _ in range(3):
        s.tick()
    assert s.last.action_source[0] == OPERATOR

    lost_at = int(s.ep_step[0])
    pads.detach_all()  # unplugged mid-correction: SDL emits JOYDEVICEREMOVED
    s.tick()
    assert s.machine.state[0] == REQUESTED and s.last.action_source[0] == SAFETY  # held in the same tick
    for _ in range(5):
        s.tick()  # the device is gone: nothing but the hold
    index = pads.attach()  # plugged back in and reconnected from the device panel ...
    iid = pygame.joystick.Joystick(index).get_instance_id()
    pad.connect()
    plugged_at = int(s.ep_step[0])
    for _ in range(10):
        s.tick()  # ... but nobody grabbed it: still holding
    assert s.machine.state[0] == REQUESTED and s.last.action_source[0] == SAFETY
    pads.set_button(iid, LB, True)  # the person acts
    _tick_until(s, lambda: s.machine.state[0] == HUMAN)
    resumed_at = int(s.ep_step[0]) - 1  # the step of the tick in which the person took control again
    s.tick()
    assert s.last.action_source[0] == OPERATOR
    s.close_all("test over")
    rec.close()
    s.close_operators()

    store = EpisodeStore.open(str(tmp_path / "store"))
    assert not validate_store(store)
    (info,) = store.episodes()
    d, lab = store.read_steps(info.episode_id), store.labels(info.episode_id)
    assert d["action_source"][lost_at] == SAFETY and d["step_flags"][lost_at] & int(StepFlag.DEVICE_LOST)
    assert (d["action_source"][lost_at:resumed_at] == SAFETY).all()  # held until the person acted
    np.testing.assert_array_equal(d["applied_action"][lost_at:resumed_at], 0.0)  # toy_reach's hold: zero velocity
    assert lab.mask[lost_at] == LabelMask.EXCLUDED.code
    events = info.end.events
    assert [e.step for e in events if e.kind == EventKind.DEVICE_DISCONNECT] == [lost_at]
    assert [e.step for e in events if e.kind == EventKind.DEVICE_CONNECT] == [plugged_at]
    starts = [e for e in events if e.kind == EventKind.HANDOVER_START]
    if wait == "hold":
        assert len(starts) == 2 and starts[1].step == resumed_at > plugged_at
    else:  # paused: no step between the lost one and the person's return
        assert len(starts) == 2 and starts[1].step == resumed_at == plugged_at == lost_at + 1
    assert starts[1].values == {"operator": "op-pad", "device": pad.device_id}  # who resumed
    assert lab.windows[1].gate_reason == "device_lost" and lab.windows[1].handover_start == resumed_at
