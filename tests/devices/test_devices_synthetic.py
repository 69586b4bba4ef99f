"""The synthetic operator: request -> reaction delay -> correction, availability, noise, release, loss."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.command import RETURN
from hg_dagger.devices import (
    DeviceError,
    SyntheticConfig,
    SyntheticOperator,
    SyntheticOperatorRows,
    load_device_config,
    make_device,
)


class Expert:
    """A command function that records what it was asked."""

    def __init__(self, motion=(0.5, -0.25, 0.1, 0, 0, 0.2, 1.0)):
        self.motion = np.asarray(motion, np.float32)
        self.seen = []

    def __call__(self, obs_row):
        self.seen.append(obs_row)
        return self.motion.copy()


def run(op: SyntheticOperator, requested: list[bool]):
    out = []
    for t, req in enumerate(requested):
        op.observe({"t": t}, req)
        out.append(op.poll())
    return out


def test_no_request_no_correction_and_no_expert_calls():
    expert = Expert()
    op = SyntheticOperator(expert, reaction_delay_steps=0)
    cmds = run(op, [False] * 5)
    assert all(not c.engaged and not c.raw.any() and not c.motion.any() for c in cmds)
    assert expert.seen == [] and op.requests == 0


@pytest.mark.parametrize("delay", [0, 1, 4])
def test_engages_exactly_after_the_reaction_delay(delay):
    expert = Expert()
    op = SyntheticOperator(expert, reaction_delay_steps=delay)
    cmds = run(op, [False, False] + [True] * 8)
    engaged = [c.engaged for c in cmds]
    assert engaged.index(True) == 2 + delay and all(engaged[2 + delay :])
    first = cmds[2 + delay]
    np.testing.assert_allclose(first.motion, expert.motion)
    assert expert.seen[0] == {"t": 2 + delay}  # corrects the observation of that tick
    assert first.device_id == "synthetic:0"


def test_withdrawn_request_resets_the_reaction_timer():
    op = SyntheticOperator(Expert(), reaction_delay_steps=3)
    cmds = run(op, [True, True, False, True, True, True, True])
    assert [c.engaged for c in cmds] == [False] * 6 + [True]
    assert op.requests == 2 and op.answered == 1


def test_stays_engaged_until_released_then_needs_a_new_request():
    op = SyntheticOperator(Expert(), reaction_delay_steps=1)
    cmds = run(op, [True, True, False, False])
    assert [c.engaged for c in cmds] == [False, True, True, True]  # request gone, still correcting
    op.release()
    cmds = run(op, [False, True, True])
    assert [c.engaged for c in cmds] == [False, False, True]


def test_unavailable_operator_never_answers_a_request():
    expert = Expert()
    op = SyntheticOperator(expert, reaction_delay_steps=0, availability=0.0)
    assert not any(c.engaged for c in run(op, [True] * 50))
    assert op.requests == 1 and op.answered == 0 and expert.seen == []


def test_availability_is_a_per_request_probability_and_seeded():
    def answered(seed):
        op = SyntheticOperator(Expert(), reaction_delay_steps=0, availability=0.6, seed=seed)
        pattern = []
        for _ in range(300):
            op.observe(None, True)
            pattern.append(op.poll().engaged)
            op.release()
            op.observe(None, False)
        return pattern

    a, b, c = answered(1), answered(1), answered(2)
    assert a == b and a != c
    assert 0.5 < np.mean(a) < 0.7


def test_noise_on_motion_axes_only_and_reproducible():
    def motions(seed):
        op = SyntheticOperator(Expert(), reaction_delay_steps=0, noise_std=0.05, seed=seed)
        return np.array([c.raw for c in run(op, [True] * 400)])

    m = motions(3)
    dev = m - Expert().motion
    assert np.allclose(dev[:, 6], 0.0)  # gripper commands are not jittered
    assert 0.04 < dev[:, :6].std() < 0.06 and abs(dev[:, :6].mean()) < 0.01
    np.testing.assert_array_equal(m, motions(3))


def test_return_button_after_a_correction_budget():
    op = SyntheticOperator(Expert(), reaction_delay_steps=0, return_after_steps=3)
    cmds = run(op, [True] * 5)
    assert [RETURN in c.buttons for c in cmds] == [False, False, True, True, True]


def test_disconnect_means_lost_until_connect():
    op = SyntheticOperator(Expert(), reaction_delay_steps=0)
    assert op.connected and run(op, [True])[0].engaged
    op.disconnect()
    op.observe(None, True)
    assert op.poll() is None and not op.connected
    op.connect()
    assert op.poll().engaged


def test_bad_command_fn_output_is_a_device_error():
    op = SyntheticOperator(lambda row: np.zeros(4), reaction_delay_steps=0)
    op.observe(None, True)
    with pytest.raises(DeviceError, match=r"shape \(4,\), expected \(7,\)"):
        op.poll()


def test_built_from_the_shipped_config():
    with pytest.raises(DeviceError, match="command_fn"):
        make_device("synthetic")
    op = make_device("synthetic", command_fn=Expert())
    cfg = load_device_config("synthetic")
    assert isinstance(op, SyntheticOperator) and op.config == cfg
    cmds = run(op, [True] * (cfg.reaction_delay_steps + 1))
    assert [c.engaged for c in cmds].index(True) == cfg.reaction_delay_steps
    assert cmds[-1].motion[0] == pytest.approx(0.5, abs=0.3)  # rate limited toward the expert's 0.5


def test_drives_the_toy_arm_to_its_target_through_the_task_mapping():
    """Headless human-gated loop in miniature: the operator, fed by the planner expert, does the task."""
    from hg_dagger.envs import make_env
    from hg_dagger.experts import make_expert

    env = make_env("toy_reach", num_envs=1, seed=3)
    m = env.mapping
    expert = make_expert("toy_reach", mapping=m)

    def command_fn(obs_row):
        batch = {k: v[None] for k, v in obs_row.items()}
        return m.raw_to_human(expert.act(batch, env_ids=[0]).action)[0]

    op = SyntheticOperator(command_fn, reaction_delay_steps=4, noise_std=0.02, seed=0)
    obs, info = env.reset(seed=3)
    expert.reset([0], obs, info)
    engaged_at, success = None, False
    for t in range(m.horizon):
        op.observe({k: v[0] for k, v in obs.items()}, requested=True)
        cmd = op.poll()
        if cmd.engaged and engaged_at is None:
            engaged_at = t
        action = m.human_to_raw(cmd.motion[None]) if cmd.engaged else np.zeros((1, m.action_dim), np.float32)
        res = env.step(action)
        obs = res.obs
        if res.success[0]:
            success = True
            break
    env.close()
    assert engaged_at == 4
    assert success


def test_rows_answer_as_one_operator_per_row():
    """SyntheticOperatorRows (every row of a session at once) answers, waits, jitters and returns exactly as one
    SyntheticOperator per row with the same seed, whatever the other rows do."""
    cfg = SyntheticConfig(reaction_delay_steps=2, noise_std=0.05, availability=0.7, return_after_steps=4)
    seeds = [3, 8, 11, 20]
    rows = SyntheticOperatorRows(cfg, seeds)
    singles = [SyntheticOperator(Expert(), config=cfg.model_copy(update={"seed": s})) for s in seeds]
    rng = np.random.default_rng(0)
    motion = Expert().motion
    spoken = 0
    for _ in range(300):
        requested = rng.random(len(seeds)) < 0.5
        rows.observe(requested)
        for op, req in zip(singles, requested, strict=True):
            op.observe(None, bool(req))
        speak = rows.speaking().tolist()
        raw, ret = rows.commands(np.array(speak, np.int64), np.tile(motion, (len(speak), 1)))
        for r, op in enumerate(singles):
            cmd = op.poll()
            assert cmd.engaged == (r in speak)
            if r in speak:
                np.testing.assert_array_equal(cmd.raw, raw[speak.index(r)])
                assert (RETURN in cmd.buttons) == ret[speak.index(r)]
        spoken += len(speak)
        for r in np.flatnonzero(rng.random(len(seeds)) < 0.15):
            rows.release(r)
            singles[r].release()
    assert rows.requests.tolist() == [op.requests for op in singles]
    assert rows.answered.tolist() == [op.answered for op in singles]
    assert spoken > 100 and 0 < rows.answered.sum() < rows.requests.sum()  # answered some, declined some
