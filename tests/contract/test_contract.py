"""The contract's enums, field specs, metadata models and - above all - the label rules."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hg_dagger.contract import (
    ActionSource,
    ClockMapping,
    CollectionMode,
    CorrectionWindow,
    EpisodeStart,
    ExpertCertification,
    LabelMask,
    LabelTarget,
    StepFlag,
    TaskInfo,
    derive_labels,
    label_violations,
    step_fields,
)
from hg_dagger.contract.labels import CERTIFICATION_METHODS, DISCARDED, certification_problem

P, H, S, E = (ActionSource.POLICY.code, ActionSource.HUMAN.code, ActionSource.SAFETY_CONTROLLER.code, ActionSource.EXPERT.code)
T, C, X = LabelMask.TRAINABLE.code, LabelMask.CONTEXT_ONLY.code, LabelMask.EXCLUDED.code


def _labels(source, windows=(), certs=(), flags=None, valid=None, expert_valid=None, mode=CollectionMode.HUMAN_GATED):
    n = len(source)
    return derive_labels(
        action_source=np.asarray(source, np.uint8),
        valid=np.ones(n, bool) if valid is None else np.asarray(valid),
        step_flags=np.zeros(n, np.uint16) if flags is None else np.asarray(flags, np.uint16),
        expert_valid=np.zeros(n, bool) if expert_valid is None else np.asarray(expert_valid),
        windows=list(windows),
        certifications=list(certs),
        mode=mode,
        operator="op",
        policy_version="student-r1",
    )


def _window(start, end, gate=None, source=ActionSource.HUMAN):
    return CorrectionWindow(parent_episode_id="ep", parent_step_id=start if gate is None else gate,
                            handover_start=start, handover_end=end, source=source)


def test_policy_actions_of_a_successful_rollout_are_never_trainable():
    labels = _labels([P] * 10)
    assert (labels.mask == C).all()
    assert (labels.target == LabelTarget.NONE.code).all()


def test_human_actions_inside_the_window_are_trainable_and_policy_outside_is_context():
    src = [P, P, P, H, H, H, P, P]
    labels = _labels(src, [_window(3, 6, gate=2)])
    assert labels.mask.tolist() == [C, C, C, T, T, T, C, C]
    assert labels.target.tolist()[3:6] == [LabelTarget.APPLIED_ACTION.code] * 3


def test_window_end_is_exclusive_and_policy_steps_inside_a_window_stay_context():
    # step 5 is a blend tick driven by the policy inside the window: not a human label
    labels = _labels([P, H, H, H, H, P, H], [_window(1, 5)])
    assert labels.mask.tolist() == [C, T, T, T, T, C, C]


def test_human_action_outside_any_window_is_not_trainable():
    labels = _labels([H, H, P], [])
    assert (labels.mask != T).all()


def test_flagged_and_invalid_steps_inside_a_window_are_excluded():
    flags = [0, StepFlag.SENSOR_LOSS, StepFlag.LATENCY_EXCEEDED, StepFlag.INTERPOLATED, 0]
    valid = [True, True, True, True, False]
    labels = _labels([H] * 5, [_window(0, 5)], flags=flags, valid=valid)
    assert labels.mask.tolist() == [T, X, X, T, X]


def test_safety_controller_steps_inside_a_window_are_not_labels():
    labels = _labels([H, S, H], [_window(0, 3)])
    assert labels.mask.tolist() == [T, C, T]


def test_certification_is_the_only_way_policy_actions_become_trainable():
    cert = ExpertCertification(episode_id="ep", step_start=2, step_end=4, certifier="reviewer-7",
                               method="independent_review", executability_verified=True)
    labels = _labels([P] * 6, certs=[cert])
    assert labels.mask.tolist() == [C, C, T, T, C, C]
    unverified = cert.model_copy(update={"executability_verified": False})
    assert (_labels([P] * 6, certs=[unverified]).mask == C).all()


@pytest.mark.parametrize("change, why", [
    ({"certifier": "synthetic"}, "the episode's own operator"),
    ({"certifier": " Synthetic "}, "the episode's own operator"),
    ({"certifier": "student-r3"}, "the policy that acted"),
    ({"certifier": "policy"}, "the policy that acted"),
    ({"method": "looked_fine"}, "not one of independent_review, replay_verified, planner_auto"),
    ({"executability_verified": False}, "executability was not verified"),
])
def test_a_certification_that_is_not_independent_and_checked_grants_nothing(change, why):
    good = ExpertCertification(episode_id="ep", step_start=1, step_end=3, certifier="reviewer-7",
                               method="replay_verified", executability_verified=True)
    who = {"operator": "synthetic", "policy_version": "student-r3"}
    assert certification_problem(good, **who) is None
    cert = good.model_copy(update=change)
    assert why in certification_problem(cert, **who)
    src = np.full(4, P, np.uint8)
    common = dict(action_source=src, valid=np.ones(4, bool), step_flags=np.zeros(4, np.uint16),
                  expert_valid=np.zeros(4, bool), windows=[], certifications=[cert], **who)
    assert (derive_labels(**common).mask == C).all()
    granted = derive_labels(**{**common, "certifications": [good]}).mask
    assert granted.tolist() == [C, T, T, C]
    out = label_violations(episode_id="ep9", label_mask=granted, **common)
    assert out[0].startswith("episode ep9 step 1: trainable policy action outside any correction window")
    assert f"certification {cert.cert_id} does not count" in out[0] and why in out[0]


def test_every_certification_method_is_documented():
    assert set(CERTIFICATION_METHODS) == {"independent_review", "replay_verified", "planner_auto"}
    assert all(len(text) > 40 for text in CERTIFICATION_METHODS.values())


def test_expert_window_trains_on_valid_expert_labels_only():
    labels = _labels([P, E, P, E], [_window(0, 4, source=ActionSource.EXPERT)],
                     expert_valid=[True, True, False, True], mode=CollectionMode.DAGGER_SYNC)
    assert labels.mask.tolist() == [T, T, C, T]
    assert labels.target.tolist() == [LabelTarget.EXPERT_ACTION.code] * 2 + [0, LabelTarget.EXPERT_ACTION.code]


def test_evaluation_rollouts_are_never_training_data():
    labels = _labels([H, H], [_window(0, 2)], mode=CollectionMode.EVAL)
    assert (labels.mask == C).all()


def test_violations_name_episode_and_step_for_a_trainable_policy_action():
    src = np.array([P, H, P], np.uint8)
    stored = np.array([T, T, C], np.uint8)
    out = label_violations(episode_id="ep42", label_mask=stored, action_source=src, valid=np.ones(3, bool),
                           step_flags=np.zeros(3, np.uint16), expert_valid=np.zeros(3, bool),
                           windows=[_window(1, 2)], operator="op", policy_version="student-r1")
    assert out == ["episode ep42 step 0: trainable policy action outside any correction window without an expert certification"]


def test_a_stricter_stored_mask_is_not_a_violation():
    src = np.array([H, H], np.uint8)
    out = label_violations(episode_id="e", label_mask=np.array([X, C], np.uint8), action_source=src,
                           valid=np.ones(2, bool), step_flags=np.zeros(2, np.uint16),
                           expert_valid=np.zeros(2, bool), windows=[_window(0, 2)], operator="op",
                           policy_version="student-r1")
    assert out == []


@settings(max_examples=200, deadline=None)
@given(
    src=st.lists(st.sampled_from([P, H, S, E]), min_size=1, max_size=40),
    bounds=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=3),
)
def test_hard_rule_holds_for_any_episode(src, bounds):
    windows = [_window(min(a, b), max(a, b)) for a, b in bounds]
    labels = _labels(src, windows)
    for step, (code, mask) in enumerate(zip(src, labels.mask, strict=True)):
        inside = any(w.handover_start <= step < w.handover_end for w in windows)
        if mask == T:
            assert inside and code == H


def test_window_bounds_are_checked():
    with pytest.raises(ValidationError, match="handover_end"):
        _window(5, 3)
    with pytest.raises(ValidationError, match="parent_step_id"):
        CorrectionWindow(parent_episode_id="e", parent_step_id=9, handover_start=4, handover_end=6)
    with pytest.raises(ValidationError, match="source"):
        _window(0, 1, source=ActionSource.POLICY)


def test_unsupported_schema_version_is_refused_by_name():
    with pytest.raises(ValidationError, match="schema_version '0.9' is not supported"):
        EpisodeStart(schema_version="0.9", task=TaskInfo(task_id="t"), mode="human_gated", control_hz=25)


def test_field_specs_check_shape_and_dtype_by_name():
    fields = step_fields({"observation": ((25,), "float32"), "rgb": ((128, 128, 3), "uint8")}, action_dim=4)
    assert fields["obs/rgb"].image and not fields["obs/observation"].image
    assert fields["applied_action"].shape == (4,)
    with pytest.raises(ValueError, match="episode e step 3: field 'applied_action' has shape"):
        fields["applied_action"].check(np.zeros(3, np.float32), where="episode e step 3")
    with pytest.raises(ValueError, match="dtype"):
        fields["t_obs"].check(np.float64(1.5), where="x")
    assert fields["t_obs"].check(np.int32(5), where="x").dtype == np.int64


def test_enum_codes_are_stable():
    # on-disk codes: appending is fine, renumbering breaks every store ever written
    assert [a.value for a in ActionSource] == ["policy", "human", "safety_controller", "expert", "unknown"]
    assert [m.value for m in LabelMask] == ["trainable", "context_only", "excluded"]
    assert ActionSource.from_code(1) is ActionSource.HUMAN
    with pytest.raises(ValueError, match="not a valid ActionSource code"):
        ActionSource.from_code(9)


def test_clock_mapping_uses_the_fastest_exchange():
    # remote clock runs 1_000_000 ns behind; the second exchange has the smallest round trip
    exchanges = [(0, -1_000_000 + 400, 1000), (2000, 2000 - 1_000_000 + 50, 2100), (5000, 0, 9000)]
    m = ClockMapping.from_exchanges(exchanges)
    assert m.error_ns == 50
    assert abs(m.to_local(0) - 1_000_000) <= 50
    with pytest.raises(ValueError):
        ClockMapping.from_exchanges([])


def test_a_discarded_episode_has_no_trainable_step_and_a_looser_mask_is_a_violation():
    src = np.array([P, H, H, P], np.uint8)
    kept = _labels(src, [_window(1, 3)])
    assert list(kept.mask) == [C, T, T, C]
    n = len(src)
    common = dict(action_source=src, valid=np.ones(n, bool), step_flags=np.zeros(n, np.uint16),
                  expert_valid=np.zeros(n, bool), windows=[_window(1, 3)], operator="op", policy_version="student-r1")
    gone = derive_labels(**common, quality_flags=["estop", DISCARDED])
    assert (gone.mask == C).all() and (gone.target == LabelTarget.NONE.code).all()
    out = label_violations(episode_id="ep7", label_mask=kept.mask, quality_flags=[DISCARDED], **common)
    assert len(out) == 2 and all("discarded" in m and "ep7" in m for m in out)
