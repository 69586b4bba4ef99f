"""The training boundary: over random stores, reviews, QC results and replay checks, no label that is
unapproved, unauthorized, QC-failed or from a mismatched replay ever reaches a training batch.

The oracle below restates the rule step by step from the stored records, independently of
contract.training_selection, and is checked against what the real loader puts in a real LabelBuffer."""

from __future__ import annotations

import numpy as np
import pytest
import support.store as sh
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hg_dagger.contract import (
    ActionSource,
    CorrectionWindow,
    ExpertCertification,
    LabelMask,
    QCResult,
    ReplayStatus,
    ReviewDecision,
    ReviewStatus,
    TrainingRule,
)
from hg_dagger.contract.schema import ReplayCheck
from hg_dagger.learn.aggregate import LabelBuffer
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import load_labels

N = 20
SLOTS = ((2, 7), (10, 15))  # where windows may sit
FREE = (16, 19)  # policy steps an independent certification may cover
OPERATOR = "op1"

window_kind = st.sampled_from([None, "human", "expert"])
review = st.tuples(st.sampled_from(list(ReviewStatus)), st.booleans())
verdict = st.sampled_from([None, True, False])  # no QC result, passed, failed
episode = st.fixed_dictionaries({
    "kinds": st.tuples(window_kind, window_kind),
    "planner_cert": st.tuples(st.booleans(), st.booleans()),
    "reviews": st.tuples(st.lists(review, max_size=3), st.lists(review, max_size=3)),
    "window_qc": st.tuples(verdict, verdict),
    "episode_qc": verdict,
    "free_cert": st.booleans(),
    "replay": st.sampled_from([None, *ReplayStatus]),
})


def _record(store, seed: int, spec: dict) -> tuple[str, list[CorrectionWindow]]:
    """One episode whose steps in each window come from its source, labelled with the spec's review state."""
    kinds = {t: k for (s, e), k in zip(SLOTS, spec["kinds"], strict=True) if k for t in range(s, e)}
    with store.recorder() as rec:
        eid = rec.begin_episode(sh.start(operator=OPERATOR, policy_version="student-v1"), sh.fields())
        for t in range(N):
            kind = kinds.get(t)
            src = {"human": ActionSource.HUMAN, "expert": ActionSource.EXPERT}.get(kind, ActionSource.POLICY)
            step = sh.step(seed, t, source=src)
            if kind == "expert":
                step.update(expert_action=np.full(sh.ACTION_DIM, t, np.float32), expert_valid=True)
            rec.put(eid, step)
        windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=s, handover_start=s, handover_end=e,
                                    source=ActionSource.HUMAN if k == "human" else ActionSource.EXPERT)
                   for (s, e), k in zip(SLOTS, spec["kinds"], strict=True) if k]
        rec.end_episode(eid, sh.end(N), windows=windows)
    certs = [ExpertCertification(episode_id=eid, step_start=w.handover_start, step_end=w.handover_end,
                                 certifier="planner:toy", method="planner_auto", executability_verified=True)
             for w, on in zip(windows, _per_window(spec, "planner_cert"), strict=True)
             if on and w.source == ActionSource.EXPERT]
    if spec["free_cert"]:
        certs.append(ExpertCertification(episode_id=eid, step_start=FREE[0], step_end=FREE[1], certifier="rev2",
                                          method="independent_review", executability_verified=True))
    reviews = [ReviewDecision(window_id=w.window_id, reviewer=f"r{i}", status=status, replay_training_authorized=auth)
               for w, decisions in zip(windows, _per_window(spec, "reviews"), strict=True)
               for i, (status, auth) in enumerate(decisions)]
    qc = [QCResult(episode_id=eid, window_id=w.window_id, passed=passed)
          for w, passed in zip(windows, _per_window(spec, "window_qc"), strict=True) if passed is not None]
    if spec["episode_qc"] is not None:
        qc.append(QCResult(episode_id=eid, passed=spec["episode_qc"]))
    replay = None
    if spec["replay"] is not None:
        mismatch = spec["replay"] == ReplayStatus.REPLAY_MISMATCH
        replay = ReplayCheck(status=spec["replay"], first_divergent_step=3 if mismatch else None,
                             key="obs/state" if mismatch else "")
    store.write_labels(eid, author="test", certifications=certs, reviews=reviews, qc=qc, replay=replay)
    return eid, windows


def _per_window(spec: dict, key: str) -> list:
    """The spec's per-slot values for the slots that hold a window."""
    return [v for v, k in zip(spec[key], spec["kinds"], strict=True) if k]


def _may_train(spec: dict, windows: list[CorrectionWindow], step: int) -> bool:
    """The rule, restated: may this step of this episode be in a training batch?"""
    if spec["replay"] == ReplayStatus.REPLAY_MISMATCH or spec["episode_qc"] is False:
        return False
    for w, cert, decisions, wqc in zip(windows, _per_window(spec, "planner_cert"), _per_window(spec, "reviews"),
                                       _per_window(spec, "window_qc"), strict=True):
        if not w.handover_start <= step < w.handover_end:
            continue
        if wqc is False:
            return False
        if w.source == ActionSource.EXPERT and cert:
            return True
        if not decisions or decisions[-1] != (ReviewStatus.APPROVED, True):
            return False
        return w.source == ActionSource.EXPERT or (wqc is True and spec["episode_qc"] is True)
    return spec["free_cert"] and FREE[0] <= step < FREE[1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@pytest.mark.slow
@given(specs=st.lists(episode, min_size=1, max_size=3))
def test_no_unauthorized_label_reaches_a_training_batch(tmp_path_factory, specs):
    store = EpisodeStore.create(tmp_path_factory.mktemp("boundary") / "s")
    recorded = [(_record(store, seed, spec), spec) for seed, spec in enumerate(specs)]
    store = EpisodeStore.open(store.url)
    replay = LabelBuffer()
    replay.add(load_labels(store, store.info(eid), ["state"]) for (eid, _), _ in recorded)
    got = {(e.episode_id, int(s)) for e in replay.episodes for s in e.step}
    want = {(eid, t) for (eid, windows), spec in recorded for t in range(N) if _may_train(spec, windows, t)}
    assert got == want
    if got:  # and a batch drawn from it holds only those rows
        a = replay.arrays()
        rows = replay.sample(64, np.random.default_rng(0))
        ids = [replay.episodes[i].episode_id for i in a["episode"][rows]]
        assert {(e, int(s)) for e, s in zip(ids, a["step"][rows], strict=True)} <= want


def test_switching_the_rule_off_is_explicit_and_only_lifts_what_it_names(tmp_path):
    """Unreviewed labels train only when the rule says so; a replay mismatch still stops them."""
    store = EpisodeStore.create(tmp_path / "s")
    spec = {"kinds": ("human", None), "planner_cert": (False, False), "reviews": ([], []),
            "window_qc": (None, None), "episode_qc": None, "free_cert": False, "replay": ReplayStatus.REPLAY_MISMATCH}
    eid, windows = _record(store, 0, spec)
    info = EpisodeStore.open(store.url).info(eid)
    mask = store.labels(eid).mask
    assert (mask == LabelMask.TRAINABLE.code).sum() == 5
    assert len(load_labels(store, info, ["state"])) == 0
    lenient = TrainingRule(require_review=False, require_qc=False)
    assert len(load_labels(store, info, ["state"], lenient)) == 0  # the mismatch still holds
    anything = TrainingRule(require_review=False, require_qc=False, exclude_replay_mismatch=False)
    assert sorted(load_labels(store, info, ["state"], anything).step.tolist()) == list(range(*SLOTS[0]))
