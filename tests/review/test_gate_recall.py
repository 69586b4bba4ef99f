"""Gate recall, precision and gate misses, read from a real store whose every gate event is known."""

from __future__ import annotations

import json

import pytest
from support.store import fields, start, step

from hg_dagger.contract import CollectionMode, EndReason, EpisodeEnd, Event, EventKind
from hg_dagger.review.recall import recall_figures
from hg_dagger.review.report import build_report, write_report
from hg_dagger.store import EpisodeStore

N = 10


def _trigger(at: int, reason: str) -> Event:
    return Event(kind=EventKind.GATE_TRIGGER, step=at, t_ns=at * 1000, reason=reason, source="gates")


def _episode(rec, seed: int, *, success: bool, events: list[Event], iteration: int, version: str,
             mode: CollectionMode = CollectionMode.HUMAN_GATED) -> str:
    eid = rec.begin_episode(start(mode=mode, iteration=iteration, policy_version=version), fields())
    for t in range(N):
        rec.put(eid, step(seed, t))
    rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.SUCCESS if success else EndReason.TIMEOUT,
                                    task_success=success, num_steps=N, events=events))
    return eid


@pytest.fixture
def store(tmp_path):
    """Round 1: e1 failed after the confidence gate asked at step 3 (caught); e2 failed, policy_failed marked
    the failure at step 5 and the confidence gate asked only at 7 (missed); e3 succeeded after a request
    at 2 and a take-over at 1. Round 2: e4 failed and no gate asked; e5 succeeded with a take-over only
    (a gate miss). Round 0: a failed planner demonstration (not a student episode)."""
    st = EpisodeStore.create(tmp_path / "s")
    ids = {}
    with st.recorder(flush_interval_s=0.01) as rec:
        ids["demo"] = _episode(rec, 0, success=False, events=[], iteration=0, version="",
                               mode=CollectionMode.EXPERT_DEMO)
        ids["e1"] = _episode(rec, 1, success=False, events=[_trigger(3, "confidence")], iteration=1, version="v1")
        ids["e2"] = _episode(rec, 2, success=False, events=[_trigger(5, "policy_failed"),
                                                            _trigger(7, "confidence+progress_stall")],
                             iteration=1, version="v1")
        ids["e3"] = _episode(rec, 3, success=True, events=[_trigger(1, "operator"), _trigger(2, "constraint")],
                             iteration=1, version="v1")
        ids["e4"] = _episode(rec, 4, success=False, events=[], iteration=2, version="v2")
        ids["e5"] = _episode(rec, 5, success=True, events=[_trigger(4, "operator")], iteration=2, version="v2")
    return st, ids


def test_recall_and_precision_count_requests_before_the_failure_point(store):
    st, ids = store
    fig = recall_figures(st.episodes())
    assert fig["episodes"] == 5  # the demonstration is not a student episode
    assert (fig["failed"], fig["caught"], fig["recall"]) == (3, 1, pytest.approx(1 / 3, abs=1e-6))
    # requests: e1's, e2's two (policy_failed's own trigger included), e3's constraint; take-overs are not requests
    assert (fig["requests"], fig["requests_before_failure"], fig["precision"]) == (4, 1, 0.25)
    assert sorted(fig["missed_episodes"]) == sorted([ids["e2"], ids["e4"]])
    assert fig["gate_miss"] is False  # gates asked in the store as a whole


def test_the_report_gives_recall_per_round_and_names_a_gate_miss_with_its_episodes(store, tmp_path):
    st, ids = store
    report = build_report(st)
    assert report["figures"]["gate_recall"] == pytest.approx(1 / 3, abs=1e-6)
    assert report["figures"]["gate_precision"] == 0.25
    rounds = {r["round"]: r for r in report["gate_recall"]["rounds"]}
    assert rounds["0:-"]["episodes"] == 0 and rounds["0:-"]["gate_miss"] is False
    r1, r2 = rounds["1:v1"], rounds["2:v2"]
    assert (r1["failed"], r1["caught"], r1["recall"], r1["requests"], r1["precision"]) == (2, 1, 0.5, 4, 0.25)
    assert r1["gate_miss"] is False and r1["missed_episodes"] == [ids["e2"]]
    assert (r2["failed"], r2["caught"], r2["recall"], r2["requests"], r2["precision"]) == (1, 0, 0.0, 0, None)
    assert r2["gate_miss"] is True and r2["missed_episodes"] == [ids["e4"]]
    paths = write_report(report, tmp_path / "out")
    page = paths["html"].read_text()
    assert "Gate recall per round" in page and "Gate miss in round 2:v2" in page and ids["e4"] in page
    assert json.loads(paths["json"].read_text())["gate_recall"]["rounds"][2]["gate_miss"] is True


def test_the_report_command_prints_recall_and_the_gate_miss(store, tmp_path, capsys):
    from hg_dagger.cli import main

    st, ids = store
    assert main(["report", str(st.url), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "gates: recall 33% (1/3 failed episodes asked for), precision 25% (1/4 requests before a failure)" in out
    assert "round 2:v2: recall 0% (0/1 failed episodes asked for)" in out and "GATE MISS" in out
    assert ids["e4"] in out
