"""Property tests for the contract, the label rules and config parsing.

Budgets are bounded for CI (derandomized, a few hundred examples in all); set HG_DAGGER_FUZZ_EXAMPLES for a
longer random run, e.g. HG_DAGGER_FUZZ_EXAMPLES=5000 pytest tests/contract/test_fuzz_contract.py."""

from __future__ import annotations

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fuzz import EXAMPLES, budget, yaml_values

from hg_dagger import config as config_io
from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EpisodeEnd,
    EpisodeStart,
    ExpertCertification,
    LabelMask,
    QCResult,
    ReplayStatus,
    ReviewDecision,
    ReviewStatus,
    StepFlag,
    TaskInfo,
    derive_labels,
    label_violations,
    training_selection,
)
from hg_dagger.contract.enums import EXCLUDING_FLAGS, EndReason
from hg_dagger.contract.labels import DISCARDED, certified_windows
from hg_dagger.errors import ConfigError

BUDGET = budget(60)
_TRAINABLE = LabelMask.TRAINABLE.code
OPERATOR, POLICY = "op1", "student-v3"


@st.composite
def episodes(draw):
    """One episode's label inputs: sources, validity, flags, windows (non-overlapping), certifications."""
    n = draw(st.integers(1, 40))
    source = np.array(draw(st.lists(st.sampled_from([s.code for s in ActionSource]), min_size=n, max_size=n)), np.uint8)
    valid = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    flag_bits = [0, *(f.value for f in StepFlag)]
    flags = np.array(draw(st.lists(st.sampled_from(flag_bits), min_size=n, max_size=n)), np.uint16)
    expert_valid = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6, unique=True)))
    windows = []
    for s, e in zip(cuts[::2], cuts[1::2], strict=False):
        if e > s:
            windows.append(CorrectionWindow(parent_episode_id="ep", parent_step_id=s, handover_start=s, handover_end=e,
                                            source=draw(st.sampled_from([ActionSource.HUMAN, ActionSource.EXPERT]))))
    certs = []
    for _ in range(draw(st.integers(0, 2))):
        s = draw(st.integers(0, n - 1))
        e = draw(st.integers(s + 1, n))
        certs.append(ExpertCertification(
            episode_id="ep", step_start=s, step_end=e,
            certifier=draw(st.sampled_from(["rev2", OPERATOR, "policy", POLICY, "planner:toy"])),
            method=draw(st.sampled_from(["independent_review", "replay_verified", "planner_auto", "eyeballed"])),
            executability_verified=draw(st.booleans())))
    mode = draw(st.sampled_from(list(CollectionMode)))
    quality = draw(st.sampled_from([[], [DISCARDED], ["estop"]]))
    return dict(action_source=source, valid=valid, step_flags=flags, expert_valid=expert_valid, windows=windows,
                certifications=certs, mode=mode, quality_flags=quality, operator=OPERATOR, policy_version=POLICY)


@BUDGET
@given(ep=episodes())
def test_derived_labels_obey_the_hard_rules(ep):
    labels = derive_labels(**ep)
    trainable = labels.mask == _TRAINABLE
    n = len(trainable)
    inside = np.zeros(n, bool)
    for w in ep["windows"]:
        inside[w.handover_start:w.handover_end] = True
    # never trainable: invalid or excluded-flag steps, eval or discarded episodes
    assert not (trainable & ~ep["valid"]).any()
    assert not (trainable & ((ep["step_flags"].astype(np.int64) & int(EXCLUDING_FLAGS)) != 0)).any()
    if ep["mode"] == CollectionMode.EVAL or DISCARDED in ep["quality_flags"]:
        assert not trainable.any()
    # a policy action outside windows is trainable only under a counting certification
    counting = np.zeros(n, bool)
    for c in ep["certifications"]:
        if c.certifier not in (OPERATOR, "policy", POLICY) and c.method != "eyeballed" and c.executability_verified:
            counting[c.step_start:c.step_end] = True
    policy = ep["action_source"] == ActionSource.POLICY.code
    assert not (trainable & policy & ~inside & ~counting).any()
    # inside a human window only the person's steps; inside an expert window only valid expert labels
    for w in ep["windows"]:
        sl = slice(w.handover_start, w.handover_end)
        if w.source == ActionSource.HUMAN:
            assert not (trainable[sl] & (ep["action_source"][sl] != ActionSource.HUMAN.code)).any()
        else:
            assert not (trainable[sl] & ~ep["expert_valid"][sl]).any()
    # a target exactly where trainable, and the derived mask never violates the rules it came from
    assert np.array_equal(labels.target != 0, trainable)
    assert label_violations(episode_id="ep", label_mask=labels.mask, **ep) == []


@BUDGET
@given(ep=episodes(), data=st.data())
def test_a_stricter_mask_is_accepted_and_a_looser_one_is_named(ep, data):
    mask = derive_labels(**ep).mask.copy()
    n = len(mask)
    drop = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    stricter = np.where(drop & (mask == _TRAINABLE), LabelMask.EXCLUDED.code, mask).astype(np.uint8)
    assert label_violations(episode_id="ep", label_mask=stricter, **ep) == []
    looser = mask.copy()
    free = np.flatnonzero(looser != _TRAINABLE)
    if len(free):
        step = int(data.draw(st.sampled_from(free.tolist())))
        looser[step] = _TRAINABLE
        problems = label_violations(episode_id="ep", label_mask=looser, **ep)
        assert len(problems) == 1 and f"episode ep step {step}:" in problems[0]


@BUDGET
@given(ep=episodes(), data=st.data())
def test_the_training_boundary_only_ever_removes_labels(ep, data):
    labels = derive_labels(**ep)
    reviews = [ReviewDecision(window_id=w.window_id, reviewer=data.draw(st.sampled_from(["r", OPERATOR, " OP1"])),
                              status=data.draw(st.sampled_from(list(ReviewStatus))),
                              replay_training_authorized=data.draw(st.booleans())) for w in ep["windows"]
               if data.draw(st.booleans())]
    qc = [QCResult(episode_id="ep", window_id=w.window_id, passed=data.draw(st.booleans())) for w in ep["windows"]]
    roster = data.draw(st.none() | st.lists(st.sampled_from(["r", "R ", "other", OPERATOR]), max_size=2))
    sel = training_selection(mask=labels.mask, windows=ep["windows"], certifications=ep["certifications"],
                             reviews=reviews, qc=qc, replay_status=data.draw(st.sampled_from(list(ReplayStatus))),
                             operator=OPERATOR, policy_version=POLICY, reviewers=roster)
    assert not (sel.allowed & (labels.mask != _TRAINABLE)).any()
    assert np.array_equal(sel.allowed | (sel.blocks != 0), labels.mask == _TRAINABLE)
    assert not (sel.allowed & (sel.blocks != 0)).any()
    covered = certified_windows(ep["windows"], ep["certifications"], operator=OPERATOR, policy_version=POLICY)
    for w in ep["windows"]:  # a window whose latest decision is its operator's trains only if a planner certified it
        mine = [r for r in reviews if r.window_id == w.window_id]
        if mine and w.window_id not in covered and "".join(mine[-1].reviewer.split()).lower() == OPERATOR:
            assert not sel.allowed[w.handover_start:w.handover_end].any()


# ---------------------------------------------------------------------- schema round trips

ids = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)


@BUDGET
@given(task=ids, operator=ids, hz=st.floats(0.1, 2000), mode=st.sampled_from(list(CollectionMode)),
       reason=st.sampled_from(list(EndReason)), n=st.integers(0, 10_000), flags=st.lists(ids, max_size=3))
def test_episode_records_survive_a_json_round_trip(task, operator, hz, mode, reason, n, flags):
    start = EpisodeStart(task=TaskInfo(task_id=task), mode=mode, control_hz=hz, operator=operator)
    end = EpisodeEnd(end_reason=reason, task_success=reason == EndReason.SUCCESS, num_steps=n, quality_flags=flags)
    assert EpisodeStart.model_validate_json(start.model_dump_json()) == start
    assert EpisodeEnd.model_validate_json(end.model_dump_json()) == end


# ---------------------------------------------------------------------- config parsing

KIND_KEYS = {
    "run": ["task", "num_envs", "episodes", "seed", "gates", "handover", "safety", "operator", "realtime"],
    "gates": ["name", "task", "gates", "scene"],
    "auto": ["task", "mode", "certification", "num_envs", "iterations", "beta", "train", "replay"],
    "qc": ["latency_budget_ms", "latency_periods", "max_alignment_error_ms", "action_tolerance"],
}


@settings(parent=BUDGET, max_examples=EXAMPLES or 120)
@given(kind=st.sampled_from(sorted(KIND_KEYS)), data=st.data())
def test_any_config_file_is_valid_or_one_config_error_naming_the_file(tmp_path_factory, kind, data):
    keys = data.draw(st.lists(st.sampled_from(KIND_KEYS[kind] + ["unknown_key"]), max_size=4, unique=True))
    body = {"kind": kind, **{k: data.draw(yaml_values) for k in keys}}
    path = tmp_path_factory.mktemp("cfg") / f"{kind}.yaml"
    raw = data.draw(st.sampled_from(["yaml", "truncated", "bytes"]))
    text = yaml.safe_dump(body, allow_unicode=True)
    if raw == "truncated":
        path.write_text(text[: data.draw(st.integers(0, len(text)))])
    elif raw == "bytes":
        path.write_bytes(data.draw(st.binary(max_size=64)))
    else:
        path.write_text(text)
    if kind == "qc":
        from hg_dagger.review.qc_config import load_qc_config

        load = load_qc_config
    else:
        load = config_io.check
    try:
        load(path)
    except ConfigError as exc:
        assert str(path) in str(exc)
