"""Splits and sequences of dataset versions: one parent episode and its windows never in two splits, isolated
dimensions and holdouts respected, across versions too (hypothesis properties over random episodes and
configs); the leakage check names the episode and both splits; sequences never straddle a handover boundary or
mix action sources."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hg_dagger.datasets.sequences import cut_sequences, pure_runs
from hg_dagger.datasets.splits import (
    Holdout,
    Placed,
    SplitConfig,
    SplitError,
    SplitItem,
    assign_splits,
    holdout_match,
    leaks,
)

OPS, SCENES, TASKS, DAYS, GATES = ["a", "b", "c", "d"], ["s1", "s2", "s3"], ["t1", "t2"], \
    ["2026-11-28", "2026-11-29", "2026-11-30"], ["confidence", "stall", "collision"]


@st.composite
def episodes(draw, n_max=30):
    n = draw(st.integers(1, n_max))
    items = []
    for i in range(n):
        parent = None
        if i and draw(st.booleans()) and draw(st.integers(0, 3)) == 0:
            parent = f"s0/e{draw(st.integers(0, i - 1))}"
        items.append(SplitItem(
            key=f"s0/e{i}", episode_id=f"e{i}", task=draw(st.sampled_from(TASKS)), scene=draw(st.sampled_from(SCENES)),
            objects=tuple(draw(st.lists(st.sampled_from(["cube", "cup", "ball"]), max_size=2, unique=True))),
            operator=draw(st.sampled_from(OPS)), day=draw(st.sampled_from(DAYS)), parent=parent,
            failure_modes=tuple(draw(st.lists(st.sampled_from(GATES), max_size=2, unique=True))),
            recorded=draw(st.sampled_from(["unassigned"] * 6 + ["val", "test"]))))
    return items


@st.composite
def configs(draw):
    v = draw(st.sampled_from([0.0, 0.2, 0.4]))
    t = draw(st.sampled_from([0.0, 0.2]))
    isolate = tuple(draw(st.lists(st.sampled_from(["task", "scene", "object", "operator", "day"]), max_size=2,
                                  unique=True)))
    hold = Holdout(operators=tuple(draw(st.lists(st.sampled_from(OPS), max_size=1))),
                   failure_modes=tuple(draw(st.lists(st.sampled_from(GATES), max_size=1))))
    return SplitConfig(val_fraction=v, test_fraction=t, isolate=isolate, holdout=hold, seed=draw(st.integers(0, 5)),
                       keep_recorded=draw(st.booleans()))


def _placed(items, assigned, windows_per_episode=3):
    """Every episode as its rollout sample plus a few window samples, all in the episode's split."""
    return [Placed(f"{it.episode_id}:{k}", it, assigned[it.key].split, k > 0 and assigned[it.key].split == "train")
            for it in items for k in range(windows_per_episode)]


def _check_assignment(items, cfg, assigned):
    assert set(assigned) >= {i.key for i in items}
    assert leaks(_placed(items, assigned), cfg) == []
    for dim in cfg.isolate:  # an isolated value lies in one split
        where: dict[str, set[str]] = {}
        for it in items:
            for v in it.values(dim):
                where.setdefault(v, set()).add(assigned[it.key].split)
        assert all(len(s) == 1 for s in where.values()), (dim, where)
    by_key = {i.key: i for i in items}
    for it in items:  # held-out operators and failure modes never train; a branch goes with its parent
        if holdout_match(it, cfg.holdout):
            assert assigned[it.key].split == "holdout"
        if it.parent in by_key:
            assert assigned[it.key].split == assigned[it.parent].split


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(items=episodes(), cfg=configs())
def test_splits_never_leak_an_episode_across_splits(items, cfg):
    try:
        assigned = assign_splits(items, cfg)
    except SplitError as exc:  # only when the config cannot be satisfied, and it says which part
        assert "cannot be satisfied" in str(exc) or "must be held out" in str(exc)
        return
    _check_assignment(items, cfg, assigned)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(items=episodes(n_max=40), cfg=configs(), cut=st.floats(0.1, 0.9))
def test_a_later_version_keeps_every_split_and_isolation(items, cfg, cut):
    k = max(1, int(len(items) * cut))
    first, later = items[:k], items[k:]
    try:
        v1 = assign_splits(first, cfg)
        v2 = assign_splits(later, cfg, inherited=v1)
    except SplitError:
        return
    assert all(v2[key].split == a.split for key, a in v1.items())  # nothing moves between versions
    _check_assignment(items, cfg, v2)
    earlier = {key: (a.split, "v1") for key, a in v1.items()}
    assert leaks(_placed(items, v2), cfg, earlier) == []


def test_the_leakage_check_names_the_episode_and_both_splits():
    a = SplitItem(key="s0/ep-a", episode_id="ep-a", operator="alice")
    b = SplitItem(key="s0/ep-b", episode_id="ep-b", operator="alice", parent="s0/ep-a")
    cfg = SplitConfig(isolate=("operator",))
    found = leaks([Placed("ep-a:episode", a, "train", False), Placed("ep-a:w1", a, "val", False),
                   Placed("ep-b:w2", b, "test", True)], cfg, earlier={"s0/ep-b": ("train", "toy@v1")})
    text = "\n".join(found)
    assert "episode ep-a: in split train (sample ep-a:episode) and split val (sample ep-a:w1)" in text
    assert "episode ep-b: in split test, its parent episode ep-a in split train" in text
    assert "operator 'alice' in split test and in split train" in text
    assert "sample ep-b:w2 is trainable in split test" in text
    assert "episode ep-b: in split test, but in split train in toy@v1" in text


def test_unsatisfiable_configs_are_named():
    items = [SplitItem(key=f"s0/e{i}", episode_id=f"e{i}", task="t", operator="op") for i in range(5)]
    with pytest.raises(SplitError, match=r"1 group \(task\) cannot fill train \+ val"):
        assign_splits(items, SplitConfig(val_fraction=0.3, isolate=("task",)))
    with pytest.raises(SplitError, match="holdout.operators: no episode has operator 'nobody'"):
        assign_splits(items, SplitConfig(holdout=Holdout(operators=("nobody",))))
    with pytest.raises(SplitError, match="holdout.failure_modes: no window has gate reason 'stall'"):
        assign_splits(items, SplitConfig(holdout=Holdout(failure_modes=("stall",))))
    with pytest.raises(ValueError, match="leaves no room for train"):
        SplitConfig(val_fraction=0.5, test_fraction=0.5)
    # a new episode joining two groups already in different splits
    v1 = assign_splits([SplitItem(key="s0/x", episode_id="x", operator="p", scene="k1"),
                        SplitItem(key="s0/y", episode_id="y", operator="q", scene="k2")],
                       SplitConfig(val_fraction=0.5, isolate=("operator",)))
    assert {a.split for a in v1.values()} == {"train", "val"}
    with pytest.raises(SplitError, match="joins episodes already in two splits"):
        assign_splits([SplitItem(key="s0/z", episode_id="z", operator="p", scene="k2"),
                       SplitItem(key="s0/x", episode_id="x", operator="p", scene="k1"),
                       SplitItem(key="s0/y", episode_id="y", operator="q", scene="k2")],
                      SplitConfig(val_fraction=0.5, isolate=("operator", "scene")), inherited=v1)


def test_holdouts_by_value_and_period():
    cfg = SplitConfig(holdout=Holdout(operators=("carol",), failure_modes=("collision",),
                                      period={"start": "2026-11-30"}))
    items = [SplitItem(key="s0/a", episode_id="a", operator="carol", day="2026-11-01"),
             SplitItem(key="s0/b", episode_id="b", operator="dan", failure_modes=("collision",), day="2026-11-01"),
             SplitItem(key="s0/c", episode_id="c", operator="dan", day="2026-12-01"),
             SplitItem(key="s0/d", episode_id="d", operator="dan", day="2026-11-02")]
    got = assign_splits(items, cfg)
    assert [got[k].split for k in ("s0/a", "s0/b", "s0/c", "s0/d")] == ["holdout", "holdout", "holdout", "train"]
    assert "unseen operator 'carol'" in got["s0/a"].reason and "unseen failure mode" in got["s0/b"].reason
    assert "held-out period" in got["s0/c"].reason


# ---------------------------------------------------------------------- sequences


@settings(max_examples=200, deadline=None, derandomize=True)
@given(src=st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=80), data=st.data())
def test_sequences_never_straddle_a_boundary_or_mix_sources(src, data):
    n = len(src)
    src = np.asarray(src, np.uint8)
    keep = np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    bounds = data.draw(st.lists(st.integers(0, n), max_size=4))
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    runs = pure_runs(src, keep, bounds, lo, hi)
    covered = np.zeros(n, bool)
    for s, e in runs:
        assert lo <= s < e <= hi
        assert len(set(src[s:e].tolist())) == 1 and keep[s:e].all()
        assert not any(s < b < e for b in bounds)
        covered[s:e] = True
    want = np.zeros(n, bool)
    want[lo:hi] = keep[lo:hi]
    assert (covered == want).all()  # every kept step of the range is in exactly one run
    length = data.draw(st.integers(1, 6))
    stride = data.draw(st.integers(1, 6))
    for s, e in cut_sequences(runs, length, stride):
        assert e - s == length and any(a <= s and e <= b for a, b in runs)


def test_cut_sequences_example():
    src = np.array([0, 0, 1, 1, 1, 1, 1, 1, 0, 0], np.uint8)  # policy, a human window [2, 8), policy
    keep = src == 1
    runs = pure_runs(src, keep, boundaries=[2, 5, 8])  # a second window starts at 5
    assert runs == [(2, 5), (5, 8)]
    assert cut_sequences(runs, 2) == [(2, 4), (5, 7)]
    assert cut_sequences(runs, 2, stride=1) == [(2, 4), (3, 5), (5, 7), (6, 8)]
    assert cut_sequences(runs, 4) == [] and cut_sequences(runs, 4, keep_short=True) == [(2, 5), (5, 8)]
    with pytest.raises(ValueError):
        cut_sequences(runs, 0)
