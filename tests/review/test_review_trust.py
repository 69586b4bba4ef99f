"""A reviewer is never the operator: over random stores, operators, reviewers (the operator's pseudonym in
other case and spacing too), reviewer rosters and decision orders, written through the real review layer and
store, the steps the trainer's loader lets in are exactly those the rule allows, restated here from its words:

  a window trains when its latest decision is an approval with training authorization by someone who is not
  the window's operator (pseudonyms compared without regard to case or whitespace) and, when the store
  declares a reviewer roster, is on it; an operator's own rejection of their window keeps it out for good.

Decisions the review layer refuses are also written by hand (as an older version or another tool might have):
they must authorize nothing either. Budgets are bounded for CI (derandomized); HG_DAGGER_FUZZ_EXAMPLES=500
runs a longer random search."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import support.store as sh
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import PEOPLE, budget, pseudonym
from support.fuzz import spell as _spell

from hg_dagger.contract import (
    ActionSource,
    CorrectionWindow,
    LabelMask,
    QCResult,
    ReviewDecision,
    ReviewStatus,
)
from hg_dagger.errors import StoreError
from hg_dagger.learn.aggregate import LabelBuffer
from hg_dagger.review.decisions import ReviewError, audit_trail, decide, flag_by_operator, list_windows
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import load_labels

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

BUDGET = budget(30)
N = 14
SLOTS = ((2, 6), (8, 12))


window_spec = st.fixed_dictionaries({"present": st.sampled_from([True, True, False]),
                                     "operator": st.sampled_from([None, None, *PEOPLE])})
decision = st.fixed_dictionaries({
    "window": st.sampled_from([0, 0, 0, 1, 1, 2, 3, 4, 5]),  # several decisions on one window, often
    "who": st.sampled_from(["operator", "operator", *PEOPLE]),  # "operator": the window's own, respelled
    "spelling": st.integers(0, 4),
    "status": st.sampled_from([ReviewStatus.APPROVED, ReviewStatus.APPROVED, ReviewStatus.REJECTED,
                               ReviewStatus.NEEDS_FIX]),
    "authorize": st.sampled_from([True, True, False]),
    "via": st.sampled_from(["decide", "decide", "hand", "hand", "flag"]),
})
case = st.fixed_dictionaries({
    "episodes": st.lists(st.fixed_dictionaries({"operator": st.sampled_from(["", *PEOPLE]),
                                                "windows": st.tuples(window_spec, window_spec)}),
                         min_size=1, max_size=3),
    "roster": st.none() | st.lists(pseudonym, min_size=1, max_size=3),
    "decisions": st.lists(decision, min_size=1, max_size=8),
})


def _key(name: str) -> str:
    return "".join(name.split()).lower()


def _record(store: EpisodeStore, seed: int, spec: dict) -> tuple[str, list[CorrectionWindow]]:
    """An episode whose steps in each present window are human, with passing QC for it and every window."""
    slots = [(s, e, w["operator"]) for (s, e), w in zip(SLOTS, spec["windows"], strict=True) if w["present"]]
    human = {t for s, e, _ in slots for t in range(s, e)}
    with store.recorder() as rec:
        eid = rec.begin_episode(sh.start(operator=spec["operator"], policy_version="student-v1"), sh.fields())
        for t in range(N):
            rec.put(eid, sh.step(seed, t, source=ActionSource.HUMAN if t in human else ActionSource.POLICY))
        windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=s, handover_start=s, handover_end=e,
                                    operator=op or "") for s, e, op in slots]
        rec.end_episode(eid, sh.end(N), windows=windows)
    qc = [QCResult(episode_id=eid, passed=True)] + [QCResult(episode_id=eid, window_id=w.window_id, passed=True)
                                                    for w in windows]
    store.write_labels(eid, author="qc:1", qc=qc)
    return eid, windows


def _apply(store: EpisodeStore, eid: str, w: CorrectionWindow, operator: str, roster, d: dict) -> tuple | None:
    """Make decision ``d`` through the real API; returns what got recorded (reviewer, status, authorized), if any."""
    status = d["status"]
    authorize = d["authorize"] and status == ReviewStatus.APPROVED
    own = operator and _key(d["reviewer"]) == _key(operator)
    if d["via"] == "flag":
        if own:
            flag_by_operator(store.url, w.window_id, d["reviewer"], "my correction was bad")
            return (d["reviewer"].strip(), ReviewStatus.REJECTED, False)
        with pytest.raises(ReviewError, match="only its operator can flag it"):
            flag_by_operator(store.url, w.window_id, d["reviewer"], "not mine")
        return None
    if d["via"] == "hand":  # what an older version (or a hand edit) may have left in a store
        st_ = EpisodeStore.open(store.url, mode="a")
        reviews = [*st_.labels(eid).reviews, ReviewDecision(window_id=w.window_id, reviewer=d["reviewer"], status=status,
                                                            replay_training_authorized=authorize, notes="by hand")]
        st_.write_labels(eid, author="hand", reviews=reviews)
        return (d["reviewer"], status, authorize)
    off_roster = roster is not None and authorize and _key(d["reviewer"]) not in {_key(r) for r in roster}
    if own or off_roster:
        with pytest.raises(ReviewError) as err:
            decide(store.url, w.window_id, status, d["reviewer"], "because", authorize)
        assert "\n" not in str(err.value)
        assert ("is the window's operator" if own else "is not on the store's reviewer roster") in str(err.value)
        return None
    decide(store.url, w.window_id, status, d["reviewer"], "because", authorize)
    return (d["reviewer"].strip(), status, authorize)


def _trains(operator: str, roster, made: list[tuple]) -> bool:
    """The rule, restated from its words (see the module docstring)."""
    if not made:
        return False
    if operator and any(s == ReviewStatus.REJECTED and _key(r) == _key(operator) for r, s, _ in made):
        return False
    reviewer, status, authorized = made[-1]
    if status != ReviewStatus.APPROVED or not authorized:
        return False
    if operator and _key(reviewer) == _key(operator):
        return False
    return roster is None or _key(reviewer) in {_key(r) for r in roster}


@BUDGET
@given(spec=case)
def test_trained_steps_are_the_independently_approved_ones(tmp_path_factory, spec):
    store = EpisodeStore.create(tmp_path_factory.mktemp("trust") / "s")
    recorded = [(_record(store, seed, ep), ep) for seed, ep in enumerate(spec["episodes"])]
    roster = spec["roster"]
    if roster is not None:
        store.set_reviewers(roster)
    slots = [(eid, w, w.operator or ep["operator"]) for (eid, windows), ep in recorded for w in windows]
    made: dict[str, list[tuple]] = {w.window_id: [] for _, w, _ in slots}
    if slots:
        for d in spec["decisions"]:
            eid, w, operator = slots[d["window"] % len(slots)]
            who = d["who"] if d["who"] != "operator" else operator or PEOPLE[0]
            got = _apply(store, eid, w, operator, roster, {**d, "reviewer": _spell(who, d["spelling"])})
            if got is not None:
                made[w.window_id].append(got)

    st_ = EpisodeStore.open(store.url)
    assert (st_.reviewers is None) == (roster is None)
    replay = LabelBuffer()
    replay.add(load_labels(st_, st_.info(eid), ["state"]) for (eid, _), _ in recorded)
    got = {(e.episode_id, int(s)) for e in replay.episodes for s in e.step}
    want = {(eid, t) for eid, w, operator in slots if _trains(operator, roster, made[w.window_id])
            for t in range(w.handover_start, w.handover_end)}
    assert got == want
    rows = {r.window_id: r for r in list_windows(st_)}
    for _eid, w, operator in slots:  # what `review list` says agrees
        assert rows[w.window_id].authorized == _trains(operator, roster, made[w.window_id]), w.window_id


# ---------------------------------------------------------------------- the roster in the store


def test_roster_is_stored_normalized_and_survives_reopening(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    assert store.reviewers is None
    assert store.set_reviewers([" Rev-1 ", "rev 2", "REV-1", "rev  2"]) == ["Rev-1", "rev 2"]
    assert EpisodeStore.open(tmp_path / "s").reviewers == ["Rev-1", "rev 2"]
    with pytest.raises(StoreError, match="empty reviewer pseudonym"):
        store.set_reviewers(["rev-1", " "])
    with pytest.raises(StoreError, match="at least one pseudonym"):
        store.set_reviewers([])
    with pytest.raises(StoreError, match="read-only"):
        EpisodeStore.open(tmp_path / "s").set_reviewers(["x"])
    assert EpisodeStore.open(tmp_path / "s").reviewers == ["Rev-1", "rev 2"]  # a refused change writes nothing
    store.set_reviewers(None)
    assert EpisodeStore.open(tmp_path / "s").reviewers is None


def test_a_malformed_roster_is_one_line_naming_the_store(tmp_path):
    import zarr

    store = EpisodeStore.create(tmp_path / "s")
    root = zarr.open_group(store.url, mode="r+")
    root.update_attributes({"hg_dagger": {**dict(root.attrs)["hg_dagger"], "reviewers": "rev-1"}})
    with pytest.raises(StoreError, match=r"hg_dagger.reviewers is not a list of reviewer pseudonyms") as err:
        _ = EpisodeStore.open(store.url).reviewers
    assert store.url in str(err.value)


# ---------------------------------------------------------------------- the public commands on a recorded store

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
EAGER = {"name": "eager", "task": "toy_reach", "gates": [{"type": "confidence", "trigger": 1e-9, "debounce_ticks": 1}]}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=ENV)


def _refused(r, match: str) -> str:
    """Exit 2 and one `error:` line saying why, no traceback."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and match in lines[0], r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two toy_reach episodes of the real gated session, the synthetic operator correcting: its windows."""
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    path = tmp_path_factory.mktemp("trust_cli") / "store"
    cfg = load_run_config(None, "toy_reach", episodes=2, num_envs=1, calibrate_steps=0, gates=EAGER,
                          **{"operator.return_after_steps": 12})
    run_gated(cfg, str(path), progress=False)
    rows = list_windows(path)
    assert len(rows) >= 2 and {r.operator for r in rows} == {"synthetic"}
    return path


@pytest.fixture
def store(recorded, tmp_path):
    path = tmp_path / "store"
    shutil.copytree(recorded, path)
    return path


def _passing_qc(path) -> None:
    """Passing QC results for every episode and window (the training boundary's QC rule is met)."""
    st_ = EpisodeStore.open(path, mode="a")
    for info in st_.episodes(complete=True):
        layer = st_.labels(info.episode_id)
        st_.write_labels(info.episode_id, author="qc:1", qc=[QCResult(episode_id=info.episode_id, passed=True)] + [
            QCResult(episode_id=info.episode_id, window_id=w.window_id, passed=True) for w in layer.windows])


def _self_approve_by_hand(path, spelling: str = "Synthetic") -> dict[str, str]:
    """Approvals with training authorization by the windows' own operator, written as an older version would
    have: window id -> episode id."""
    st_ = EpisodeStore.open(path, mode="a")
    out = {}
    for info in st_.episodes(complete=True):
        layer = st_.labels(info.episode_id)
        mine = [ReviewDecision(window_id=w.window_id, reviewer=spelling, status=ReviewStatus.APPROVED,
                               replay_training_authorized=True) for w in layer.windows]
        st_.write_labels(info.episode_id, author="review:old", reviews=[*layer.reviews, *mine])
        out.update({w.window_id: info.episode_id for w in layer.windows})
    return out


def _labels_in(path, row) -> int:
    """How many trainable labels a window (a WindowRow) holds."""
    mask = EpisodeStore.open(path).labels(row.episode_id).mask
    return int((mask[row.handover_start:row.handover_end] == LabelMask.TRAINABLE.code).sum())


def _versions(path) -> dict[str, list[int]]:
    st_ = EpisodeStore.open(path)
    return {i.episode_id: st_.label_versions(i.episode_id) for i in st_.episodes()}


def test_review_refuses_the_operator_as_reviewer_in_any_spelling(store):
    wid = list_windows(store)[0].window_id
    before = _versions(store)
    for who in ("synthetic", "SYNTHETIC", " Synthetic ", "syn thetic"):
        line = _refused(_cli("review", "approve", store, wid, "--reviewer", who, "--authorize"),
                        "is the window's operator")
        assert wid in line and "a reviewer is never the operator" in line
    _refused(_cli("review", "reject", store, wid, "--reviewer", "synthetic", "--reason", "mine"),
             "is the window's operator")
    assert _versions(store) == before  # nothing written
    r = _cli("review", "approve", store, wid, "--reviewer", "rev-1", "--authorize")
    assert r.returncode == 0, r.stderr


def test_a_self_approval_in_a_store_authorizes_nothing_anywhere(store, tmp_path):
    _passing_qc(store)
    windows = _self_approve_by_hand(store)
    spans = {r.window_id: _labels_in(store, r) for r in list_windows(store)}
    assert all(spans.values())

    # train: nothing may be trained on, and the line says why
    line = _refused(_cli("train", "--store", store, "--task", "toy_reach", "--out", tmp_path / "t", "--steps", "5",
                         "--quiet"), "no label of task toy_reach may be trained on")
    assert "self_review" in line
    # report: names the block, per window
    r = _cli("report", store, "--out", tmp_path / "r", "--quiet")
    assert r.returncode == 0, r.stderr
    for wid, eid in windows.items():
        assert f"window {wid} (episode {eid}): approval authorizes nothing: reviewer 'Synthetic' is the window's " \
               "operator" in r.stdout
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["labels"]["allowed"] == 0 and report["labels"]["self_review"] == report["labels"]["labels"] > 0
    assert all(w["stopped_by"].get("self_review") == w["labels"] and not w["authorized"] for w in report["windows"])
    # validate: one violation per self-approved window, naming episode and window
    r = _cli("validate", store, "--quick")
    assert r.returncode == 1, r.stdout + r.stderr
    for wid, eid in windows.items():
        assert any(ln.startswith(f"episode {eid} ") and f"window {wid}: approved by 'Synthetic', the window's "
                   "operator" in ln for ln in r.stdout.splitlines()), r.stdout
    # review list: the authorization is void
    rows = json.loads(_cli("review", "list", store, "--json", "--quiet").stdout)
    assert {r["window_id"] for r in rows} == set(windows)
    assert all(not r["authorized"] and "is the window's operator" in r["problem"] for r in rows)
    text = _cli("review", "list", store, "--quiet").stdout.splitlines()
    assert all(" void " in ln for ln in text if ln[:12] in {w[:12] for w in windows})
    # dataset build: no trainable sample
    r = _cli("dataset", "build", "ds", "--store", store, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["usage"].get("trainable", 0) == 0, r.stdout

    # one window approved by someone else trains, and only it
    wid = next(iter(windows))
    decide(store, wid, ReviewStatus.APPROVED, "rev-1", authorize=True)
    r = _cli("train", "--store", store, "--task", "toy_reach", "--out", tmp_path / "t2", "--steps", "5", "--quiet")
    assert r.returncode == 0, r.stderr
    trained = json.loads((tmp_path / "t2" / "train.json").read_text())
    assert trained["labels"] == spans[wid] < sum(spans.values())


def test_the_roster_decides_whose_authorization_counts(store, tmp_path):
    _passing_qc(store)
    rows = list_windows(store)
    wid = rows[0].window_id
    r = _cli("store", "reviewers", store)
    assert r.returncode == 0 and "no reviewer roster" in r.stdout
    r = _cli("store", "reviewers", store, "--set", "rev-1, Rev-2")
    assert r.returncode == 0 and "reviewer roster (2): rev-1, Rev-2" in r.stdout, r.stdout + r.stderr
    _refused(_cli("review", "approve", store, wid, "--reviewer", "rev-3", "--authorize"),
             "reviewer 'rev-3' is not on the store's reviewer roster (rev-1, Rev-2)")
    assert _cli("review", "approve", store, wid, "--reviewer", "rev-3").returncode == 0  # approving alone is fine
    assert _cli("review", "approve", store, wid, "--reviewer", " REV-2 ", "--authorize").returncode == 0

    def allowed():
        from hg_dagger.store.trainable import selection

        st_ = EpisodeStore.open(store)
        return sum(selection(st_, i).counts()["allowed"] for i in st_.episodes(complete=True)), \
            sum(selection(st_, i).counts()["reviewer_not_listed"] for i in st_.episodes(complete=True))

    n = _labels_in(store, rows[0])
    assert allowed() == (n, 0)
    # the roster changes: the authorization by someone no longer on it stops counting
    assert _cli("store", "reviewers", store, "--set", "rev-1").returncode == 0
    assert allowed() == (0, n)
    r = _cli("report", store, "--out", tmp_path / "r", "--quiet")
    assert f"window {wid} (episode {rows[0].episode_id}): approval authorizes nothing: reviewer 'REV-2' is not on " \
           "the store's reviewer roster (rev-1)" in r.stdout
    r = _cli("store", "reviewers", store, "--clear")
    assert r.returncode == 0 and "no reviewer roster" in r.stdout
    assert allowed() == (n, 0)
    _refused(_cli("store", "reviewers", store, "--set", "rev-1,,rev-2"), "empty reviewer pseudonym")
    assert EpisodeStore.open(store).reviewers is None


def test_an_operator_flags_their_own_correction_and_it_never_trains(store):
    from hg_dagger.store.trainable import selection

    _passing_qc(store)
    row = list_windows(store)[0]
    with pytest.raises(ReviewError, match="only its operator can flag it"):
        flag_by_operator(store, row.window_id, "rev-1", "not mine")
    with pytest.raises(ReviewError, match="a reason is required"):
        flag_by_operator(store, row.window_id, "synthetic", " ")
    flagged, version = flag_by_operator(store, row.window_id, " Synthetic", "I overshot")
    assert flagged.status == ReviewStatus.REJECTED and flagged.reviewer == "Synthetic"
    decide(store, row.window_id, ReviewStatus.APPROVED, "rev-1", authorize=True)  # later, by a reviewer
    st_ = EpisodeStore.open(store)
    counts = selection(st_, st_.info(row.episode_id)).counts()
    assert counts["allowed"] == 0 and counts["rejected"] == _labels_in(store, row) > 0
    again = next(r for r in list_windows(store) if r.window_id == row.window_id)
    assert again.status == ReviewStatus.REJECTED and not again.authorized
    trail = [(e.decision.reviewer, e.decision.status, e.author) for e in audit_trail(store, row.window_id)]
    assert trail == [("Synthetic", ReviewStatus.REJECTED, "operator:Synthetic"),
                     ("rev-1", ReviewStatus.APPROVED, "review:rev-1")]
    assert st_.label_versions(row.episode_id)[-1] >= version


def test_an_operators_rejection_stops_a_certified_window_too():
    """A certification covering a window lets it train without a reviewer, but not against its operator's flag."""
    from hg_dagger.contract import ExpertCertification, ReplayStatus, training_selection

    w = CorrectionWindow(parent_episode_id="ep", parent_step_id=2, handover_start=2, handover_end=6, operator="op-a")
    cert = ExpertCertification(episode_id="ep", step_start=0, step_end=8, certifier="rev-1",
                               method="independent_review", executability_verified=True)
    mask = np.full(8, LabelMask.CONTEXT_ONLY.code, np.uint8)
    mask[2:6] = LabelMask.TRAINABLE.code
    qc = [QCResult(episode_id="ep", passed=True), QCResult(episode_id="ep", window_id=w.window_id, passed=True)]

    def allowed(reviews):
        return int(training_selection(mask=mask, windows=[w], certifications=[cert], reviews=reviews, qc=qc,
                                      replay_status=ReplayStatus.UNVERIFIED, operator="synthetic",
                                      policy_version="p").allowed.sum())

    assert allowed([]) == 4
    flag = ReviewDecision(window_id=w.window_id, reviewer=" OP-A", status=ReviewStatus.REJECTED, notes="bad")
    assert allowed([flag]) == 0
    other = ReviewDecision(window_id=w.window_id, reviewer="rev-2", status=ReviewStatus.REJECTED, notes="bad")
    assert allowed([other]) == 4  # a reviewer's rejection does not override a certification (as before)
