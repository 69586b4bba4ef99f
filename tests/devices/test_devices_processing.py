"""The shared command pipeline: deadzone, expo, scale, frame transforms, hold-to-intervene, rate limit."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from hg_dagger.devices.processing import (
    AxisNormalizer,
    CommandPipeline,
    CommandPipelines,
    ProcessingConfig,
    rpy_matrix,
)

MS = 1_000_000


def pipe(**cfg) -> CommandPipeline:
    cfg.setdefault("hold", {"engage_on": "always"})
    return CommandPipeline(ProcessingConfig(**cfg))


def vec(*values) -> np.ndarray:
    out = np.zeros(7, np.float32)
    out[: len(values)] = values
    return out


def test_deadzone_zeroes_small_input_and_stays_continuous():
    p = pipe(deadzone=0.1)
    assert p.shape(vec(0.09, -0.099))[:2].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(p.shape(vec(0.55, -0.55, 1.0, -1.0))[:4], [0.5, -0.5, 1.0, -1.0])
    assert p.shape(vec(0.1001))[0] == pytest.approx(0.0, abs=1e-3)  # no step at the edge


def test_expo_softens_the_center_and_keeps_the_ends():
    p = pipe(expo={"default": 0.0, "x": 1.0, "y": 0.5})
    out = p.shape(vec(0.5, 0.5, 0.5))
    assert out[0] == pytest.approx(0.125) and out[1] == pytest.approx(0.5 * 0.5 + 0.5 * 0.125) and out[2] == 0.5
    np.testing.assert_allclose(p.shape(vec(-1.0, 1.0))[:2], [-1.0, 1.0])


def test_scale_then_clip_to_unit_range():
    p = pipe(scale=[2, 0.5, 1, 1, 1, 1, 1])
    np.testing.assert_allclose(p.shape(vec(0.3, 0.8, 0.9))[:3], [0.6, 0.4, 0.9])
    assert p.shape(vec(0.8))[0] == 1.0


def test_normalizer_centers_and_uses_a_span_per_side():
    n = AxisNormalizer(center=0.1, neg_span=0.8, pos_span=0.6, sign=[-1, 1, 1, 1, 1, 1, 1])
    out = n(np.array([0.7, 0.7, -0.7, 0.1, 5.0, -5.0, 0.4]))
    np.testing.assert_allclose(out, [-1.0, 1.0, -1.0, 0.0, 1.0, -1.0, 0.5])


def test_rate_limit_ramps_and_restarts_from_rest_after_release():
    p = pipe(max_rate={"default": 0.25, "gripper": None}, hold={"engage_on": "button"})
    ramp = [p.process(vec(1.0, 0, 0, 0, 0, 0, 1.0), hold=True, t_ns=i)[0] for i in range(5)]
    assert [round(float(m[0]), 6) for m in ramp] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert all(m[6] == 1.0 for m in ramp)  # gripper unlimited
    down = p.process(vec(-1.0), hold=True, t_ns=10)[0]
    assert down[0] == pytest.approx(0.75)  # limited in both directions
    motion, engaged = p.process(vec(1.0), hold=False, t_ns=20)
    assert not engaged and not motion.any()
    assert p.process(vec(1.0), hold=True, t_ns=30)[0][0] == pytest.approx(0.25)


def test_hold_to_intervene_release_delay():
    p = pipe(hold={"engage_on": "button", "release_delay_s": 0.2})
    assert p.process(vec(0.5), hold=False, t_ns=0) == (pytest.approx(np.zeros(7)), False)
    assert p.process(vec(0.5), hold=True, t_ns=100 * MS)[1]
    motion, engaged = p.process(vec(0.5), hold=False, t_ns=250 * MS)  # released 150 ms ago
    assert engaged and motion[0] == pytest.approx(0.5)
    assert p.process(vec(0.5), hold=False, t_ns=300 * MS)[1]  # exactly the delay
    assert not p.process(vec(0.5), hold=False, t_ns=301 * MS)[1]


def test_engage_on_motion_ignores_deadzone_and_gripper():
    p = pipe(deadzone=0.1, hold={"engage_on": "motion", "release_delay_s": 0.0, "motion_threshold": 0.05})
    assert not p.process(vec(0.12), hold=False, t_ns=0)[1]  # 0.12 -> 0.022 after the deadzone
    assert not p.process(vec(0, 0, 0, 0, 0, 0, 1.0), hold=False, t_ns=1)[1]  # gripper alone does not engage
    assert p.process(vec(0, 0, 0, 0, 0, 0.5), hold=False, t_ns=2)[1]
    assert p.process(vec(), hold=True, t_ns=3)[1]  # a hold button still engages


def test_frame_rotation_applies_to_translation_and_rotation_not_gripper():
    p = pipe(frame={"rpy_deg": [0, 0, 90]})  # device x -> base y
    out = p.shape(vec(0.5, 0, 0, 0.3, 0, 0, 0.7))
    np.testing.assert_allclose(out, [0, 0.5, 0, 0, 0.3, 0, 0.7], atol=1e-9)
    q = pipe(frame={"rotation": [[0, -1, 0], [-1, 0, 0], [0, 0, -1]]})
    np.testing.assert_allclose(q.shape(vec(0.2, 0.4, 0.6, 0.1, 0, 0))[:4], [-0.4, -0.2, -0.6, 0], atol=1e-9)


def test_end_effector_frame_uses_the_current_ee_orientation():
    p = pipe(frame={"target": "ee"})
    np.testing.assert_allclose(p.shape(vec(0.5))[:3], [0.5, 0, 0])  # identity until told
    ee = rpy_matrix(0, 0, np.pi / 2)  # gripper yawed 90 deg in the base frame
    p.set_ee_rotation(ee)
    np.testing.assert_allclose(p.shape(vec(0.5))[:3], [0, -0.5, 0], atol=1e-9)  # base +x is ee -y
    base = pipe()
    base.set_ee_rotation(ee)  # ignored for target: base
    np.testing.assert_allclose(base.shape(vec(0.5))[:3], [0.5, 0, 0])


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"deadzone": 1.0}, "deadzone.x = 1.0 is out of range"),
        ({"expo": {"yaw": 1.5}}, "expo.yaw = 1.5"),
        ({"scale": [1, 2]}, "expected 7 values"),
        ({"deadzone": {"wrist": 0.1}}, "unknown axis name"),
        ({"max_rate": {"default": 0.2, "z": -1}}, "max_rate.z = -1.0 must be positive"),
        ({"frame": {"rotation": [[1, 0, 0], [0, 1, 0], [0, 0, -1]]}}, "not a proper rotation"),
        ({"frame": {"rotation": [[1, 0], [0, 1]]}}, "must be 3x3"),
        ({"hold": {"engage_on": "sometimes"}}, "engage_on"),
    ],
)
def test_invalid_processing_config_says_what_is_wrong(cfg, message):
    with pytest.raises(ValidationError, match=message):
        ProcessingConfig(**cfg)


@pytest.mark.parametrize("seed", range(6))
def test_row_pipelines_match_one_pipeline_per_row_bit_for_bit(seed):
    """CommandPipelines (the synthetic operators of a many-env session) is CommandPipeline on arrays: the same
    motion and engagement per row, tick after tick, whatever the processing config and whichever rows tick."""
    rng = np.random.default_rng(seed)
    cfg = ProcessingConfig(
        deadzone=rng.uniform(0, 0.3, 7).round(2).tolist(), expo=[0.0, 0.5, 0.0, 1.0, 0.2, 0.0, 0.7],
        scale=rng.uniform(0.5, 2.0, 7).tolist(), max_rate=[0.3, None, 0.1, 0.5, None, 0.2, None],
        hold={"engage_on": ["button", "motion", "always"][seed % 3], "release_delay_s": 0.08 * (seed % 2)},
        frame={"rpy_deg": [10.0 * seed, -20.0, 35.0]} if seed % 2 else {})
    norm = AxisNormalizer(center=rng.uniform(-0.2, 0.2, 7), neg_span=rng.uniform(0.5, 1.5, 7),
                          pos_span=rng.uniform(0.5, 1.5, 7), sign=rng.choice([-1.0, 1.0], 7))
    n = 6
    one = [CommandPipeline(cfg, normalizer=norm) for _ in range(n)]
    rows = CommandPipelines(cfg, n, normalizer=norm)
    t = 1_000_000_000
    for tick in range(60):
        t += 40_000_000
        ticking = np.flatnonzero(rng.random(n) < 0.7)
        raw = rng.normal(0, 0.8, (ticking.size, 7)).astype(np.float32)
        raw[rng.random(raw.shape) < 0.2] = 0.0  # rest values: deadzone and "no motion" cases
        hold = rng.random(ticking.size) < 0.6
        motion, engaged = rows.process(ticking, raw, hold=hold, t_ns=t)
        for i, r in enumerate(ticking):
            m, e = one[r].process(raw[i], hold=bool(hold[i]), t_ns=t)
            assert engaged[i] == e, (tick, r)
            np.testing.assert_array_equal(motion[i], m)
        if tick == 30:
            rows.reset([1, 4])
            one[1].reset()
            one[4].reset()


def test_row_pipelines_refuse_the_end_effector_frame():
    with pytest.raises(ValueError, match="frame.target 'ee'"):
        CommandPipelines(ProcessingConfig(frame={"target": "ee"}), 2)
