"""`hg-dagger review` on stores recorded for real (toy_reach, synthetic operator): listing windows,
decisions as append-only label layers, audit trails, bad input, and two reviewers deciding at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from support.cli import cli_ok as _ok
from support.cli import run_cli as _cli
from support.store import fields, start, step

from hg_dagger.contract.enums import LabelMask, ReviewStatus
from hg_dagger.review import decisions
from hg_dagger.review.decisions import ReviewError, WindowFilter, audit_trail, decide, list_windows
from hg_dagger.store import EpisodeStore
from hg_dagger.store.labels import LabelLayer

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _fails(*args, match: str):
    """An expected fault: exit 2, one readable line naming what is wrong, no traceback."""
    r = _cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and match in lines[0], r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Three toy_reach episodes, each with one correction window (an eager confidence gate)."""
    root = tmp_path_factory.mktemp("review")
    gates = root / "gates.yaml"
    gates.write_text("kind: gates\nname: eager\ntask: toy_reach\ngates:\n"
                     "  - {type: confidence, trigger: 1.0e-9, debounce_ticks: 1}\n")
    store = root / "store"
    r = _cli("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "3", "--num-envs", "2",
             "--store", store, "--gates", gates, "--calibrate-steps", "0", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["windows"] >= 3
    return store


@pytest.fixture
def store(recorded, tmp_path):
    """A fresh copy of the recorded store for each test."""
    path = tmp_path / "store"
    shutil.copytree(recorded, path)
    return path


def _windows(path):
    st = EpisodeStore.open(path)
    return {w.window_id: (e.episode_id, w) for e in st.episodes() for w in st.labels(e.episode_id).windows}


def _versions(path):
    st = EpisodeStore.open(path)
    return {e.episode_id: st.label_versions(e.episode_id) for e in st.episodes()}


def test_list_shows_every_window_pending_and_filters(store):
    windows = _windows(store)
    rows = json.loads(_ok("review", "list", store, "--json", "--quiet").stdout)
    assert {r["window_id"] for r in rows} == set(windows)
    for r in rows:
        eid, w = windows[r["window_id"]]
        assert r["episode_id"] == eid and r["task"] == "toy_reach" and r["operator"] == "synthetic"
        assert (r["handover_start"], r["handover_end"]) == (w.handover_start, w.handover_end)
        assert r["gate_reason"] == w.gate_reason == "confidence" and r["source"] == "human"
        assert r["outcome"] == w.outcome.value
        assert (r["status"], r["authorized"], r["reviewer"]) == ("pending", False, "")
        assert r["window_id"].startswith(r["short_id"]) and len(r["short_id"]) < len(r["window_id"])
    text = _ok("review", "list", store, "--quiet").stdout
    for wid in windows:
        assert wid[:12] in text
    assert text.splitlines()[-1] == f"{store}: {len(windows)} window(s) ({len(windows)} pending)"
    assert json.loads(_ok("review", "list", store, "--json", "--task", "fetch_push").stdout) == []
    assert json.loads(_ok("review", "list", store, "--json", "--operator", "nobody").stdout) == []
    assert len(json.loads(_ok("review", "list", store, "--json", "--operator", "synthetic").stdout)) == len(windows)
    assert json.loads(_ok("review", "list", store, "--json", "--status", "approved").stdout) == []


def test_decisions_are_new_layers_keeping_history_and_carrying_labels(store):
    windows = _windows(store)
    wid, (eid, _) = next(iter(windows.items()))
    before = EpisodeStore.open(store).labels(eid)
    out = json.loads(_ok("review", "approve", store, wid[:8], "--reviewer", "rev1", "--authorize", "--json").stdout)
    assert out["window_id"] == wid and out["status"] == "approved" and out["authorized"] and out["label_version"] == 2
    _ok("review", "reject", store, wid, "--reviewer", "rev2", "--reason", "jerky gripper")
    _ok("review", "needs-fix", store, wid, "--reviewer", "rev1", "--reason", "end too late")
    _ok("review", "approve", store, wid, "--reviewer", "rev3", "--no-authorize")

    st = EpisodeStore.open(store)
    assert st.label_versions(eid) == [1, 2, 3, 4, 5]
    layers = [st.labels(eid, v) for v in (2, 3, 4, 5)]
    assert [layer.author for layer in layers] == ["review:rev1", "review:rev2", "review:rev1", "review:rev3"]
    assert [len(layer.reviews) for layer in layers] == [1, 2, 3, 4]  # each keeps the ones before
    for layer in layers:
        assert layer.windows == before.windows and layer.qc == before.qc
        assert layer.certifications == before.certifications
        assert np.array_equal(layer.mask, before.mask) and np.array_equal(layer.target, before.target)
    assert st.labels(eid, 1).to_json() == before.to_json()  # the recorder's layer is untouched
    other = {e: v for e, v in _versions(store).items() if e != eid}
    assert all(v == [1] for v in other.values())  # other episodes untouched

    shown = json.loads(_ok("review", "show", store, wid, "--json").stdout)
    trail = [(t["reviewer"], t["status"], t["authorized"], t["reason"], t["version"]) for t in shown["trail"]]
    assert trail == [("rev1", "approved", True, "", 2), ("rev2", "rejected", False, "jerky gripper", 3),
                     ("rev1", "needs_fix", False, "end too late", 4), ("rev3", "approved", False, "", 5)]
    assert shown["current"]["status"] == "approved" and shown["current"]["reviewer"] == "rev3"
    assert not shown["current"]["authorized"]
    assert shown["episode"]["episode_id"] == eid and shown["episode"]["label_versions"] == [1, 2, 3, 4, 5]
    assert shown["window"]["window_id"] == wid

    text = _ok("review", "show", store, wid).stdout
    assert "audit trail (4 decision(s), oldest first)" in text
    assert text.index("rev2: rejected - jerky gripper") < text.index("rev1: needs_fix - end too late")

    rows = json.loads(_ok("review", "list", store, "--json", "--status", "approved").stdout)
    assert [(r["window_id"], r["reviewer"]) for r in rows] == [(wid, "rev3")]
    assert len(json.loads(_ok("review", "list", store, "--json", "--status", "pending").stdout)) == len(windows) - 1
    assert _ok("validate", store, "--quick").returncode == 0


def test_python_api_for_the_review_workspace(store):
    wids = list(_windows(store))
    row, version = decide(store, wids[0], ReviewStatus.APPROVED, "rev1", "clean", authorize=True)
    assert (row.status, row.authorized, row.reviewer, version) == (ReviewStatus.APPROVED, True, "rev1", 2)
    decide(store, wids[1][:10], "needs_fix", "rev2", "starts late")
    rows = list_windows(store, WindowFilter(status="needs_fix"))
    assert [r.window_id for r in rows] == [wids[1]]
    assert [r.window_id for r in list_windows(store, WindowFilter(status=ReviewStatus.PENDING))] == wids[2:]
    (entry,) = audit_trail(store, wids[0])
    assert entry.author == "review:rev1" and entry.decision.notes == "clean" and entry.decision.t_wall
    with pytest.raises(ReviewError, match="only an approval can authorize"):
        decide(store, wids[2], ReviewStatus.REJECTED, "rev1", "bad", authorize=True)
    with pytest.raises(ReviewError, match="unknown review status 'maybe'"):
        list_windows(store, WindowFilter(status="maybe"))


def test_bad_input_is_one_clear_error_and_loses_nothing(store, tmp_path):
    windows = _windows(store)
    wid = next(iter(windows))
    before = _versions(store)
    _fails("review", "list", tmp_path / "missing", match=f"{tmp_path / 'missing'}: no episode store here")
    _fails("review", "approve", store, "0123456789abcdef", "--reviewer", "rev1",
           match=f"{store}: no correction window '0123456789abcdef'")
    _fails("review", "show", store, wid[:7], match=f"window id '{wid[:7]}' is too short")
    _fails("review", "approve", store, wid, "--reviewer", "  ", match="a reviewer (pseudonym) is required")
    _fails("review", "reject", store, wid, "--reviewer", "rev1", match=f"a reason is required to reject window {wid} (episode {windows[wid][0]})")
    _fails("review", "needs-fix", store, wid, "--reviewer", "rev1", "--reason", "",
           match="a reason is required to send back window")
    r = _cli("review", "reject", store, wid, "--reviewer", "rev1", "--reason", "x", "--authorize")
    assert r.returncode == 2 and "unrecognized arguments: --authorize" in r.stderr  # reject never authorizes
    assert _versions(store) == before

    # an episode that was never committed: listed as not reviewable, its steps untouched
    st = EpisodeStore.open(store, mode="a")
    with st.recorder(flush_interval_s=0.01) as rec:
        eid = rec.begin_episode(start(), fields())
        for t in range(5):
            rec.put(eid, step(1, t))
    r = _ok("review", "list", store, "--quiet")
    assert r.stdout.splitlines()[-1].endswith("; 1 incomplete episode(s) not reviewable")
    _fails("review", "approve", store, "fedcba9876543210", "--reviewer", "rev1",
           match="windows of incomplete episodes cannot be reviewed until they are committed")
    assert EpisodeStore.open(store).label_versions(eid) == []

    # a store of another schema version
    meta_path = store / "zarr.json"
    meta = json.loads(meta_path.read_text())
    (key,) = [k for k, v in meta["attributes"].items() if isinstance(v, dict) and "schema_version" in v]
    meta["attributes"][key]["schema_version"] = "0.1"
    meta_path.write_text(json.dumps(meta))
    _fails("review", "approve", store, wid, "--reviewer", "rev1", match=f"{store}: schema_version '0.1' is not supported")


def test_ambiguous_prefix_names_both_windows(store):
    windows = _windows(store)
    wid, (eid, w) = next(iter(windows.items()))
    twin = w.model_copy(update={"window_id": wid[:8] + "0" * (len(wid) - 8)})
    if twin.window_id == wid:
        twin = w.model_copy(update={"window_id": wid[:8] + "1" * (len(wid) - 8)})
    EpisodeStore.open(store, mode="a").write_labels(eid, author="editor", windows=[w, twin])
    line = _fails("review", "approve", store, wid[:8], "--reviewer", "rev1", match=f"window id '{wid[:8]}' is ambiguous")
    assert wid in line and twin.window_id in line
    _ok("review", "approve", store, wid, "--reviewer", "rev1")  # the full id still works
    assert json.loads(_ok("review", "show", store, twin.window_id, "--json").stdout)["current"]["status"] == "pending"


def test_a_decision_written_from_a_stale_layer_is_reconciled(store):
    """Reviewer A reads the latest layer, reviewer B decides, A writes from what it read: A's check
    finds B's layer and writes the union, so the latest layer holds both decisions."""
    wid, (eid, _) = next(iter(_windows(store).items()))
    a = EpisodeStore.open(store, mode="a")
    stale = a.labels(eid)
    decide(store, wid, "rejected", "revB", "drifts")
    mine = decisions.ReviewDecision(window_id=wid, reviewer="revA", status=ReviewStatus.APPROVED, t_wall="t")
    assert decisions._append(a, eid, stale, [*stale.reviews, mine], author="review:revA") == 3
    assert [r.reviewer for r in a.labels(eid, 3).reviews] == ["revA"]  # B's decision missing here
    version = decisions._reconcile(a, eid, stale.version, author="review:revA")
    assert version == 4
    assert {r.reviewer for r in EpisodeStore.open(store).labels(eid).reviews} == {"revA", "revB"}
    assert [e.decision.reviewer for e in audit_trail(store, wid)] == ["revB", "revA"]


SCRIPT = textwrap.dedent("""
    import os, pathlib, sys, time
    from hg_dagger.review.decisions import decide
    store, wid, ready, go, reviewer, status = sys.argv[1:7]
    pathlib.Path(ready).touch()
    deadline = time.monotonic() + 300
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no start signal")
        time.sleep(0.001)
    for i in range(3):
        decide(store, wid, status, reviewer, f"{reviewer} round {i}")
""")


def _wait_for(paths, procs, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, "reviewer processes never became ready"
        for proc in procs:
            assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.01)


def test_two_reviewers_deciding_at_once_lose_nothing(store, tmp_path):
    """Two processes record three decisions each on one window, released together."""
    wid = next(iter(_windows(store)))
    go = tmp_path / "go"
    ready = [tmp_path / "ready_alice", tmp_path / "ready_bob"]
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(store), wid, str(flag), str(go), reviewer, status],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for flag, (reviewer, status) in zip(ready, (("alice", "rejected"), ("bob", "needs_fix")), strict=True)]
    try:
        _wait_for(ready, procs)
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = sorted((r, f"{r} round {i}") for r in ("alice", "bob") for i in range(3))
    assert sorted((e.decision.reviewer, e.decision.notes) for e in audit_trail(store, wid)) == want
    eid = _windows(store)[wid][0]
    latest = EpisodeStore.open(store).labels(eid)
    assert sorted((r.reviewer, r.notes) for r in latest.reviews if r.window_id == wid) == want  # current layer: all six
    assert _ok("validate", store, "--quick").returncode == 0


def test_a_window_of_a_discarded_episode_says_no_decision_trains_it(store):
    """The operator discards an episode after it ended (the app's undoable discard: a stricter label layer); its
    window still lists, with "no labels" where its training authorization would be, before and after a decision,
    and with the operator's reason, which later layers (a decision, QC) carry with the mask."""
    from hg_dagger.control.store_actions import StoreActions

    rows = list_windows(store)
    assert all(0 < r.trainable_steps <= r.handover_end - r.handover_start and r.auth == "no" for r in rows)
    gone = rows[0]
    actions = StoreActions(str(store), "synthetic", wait_s=30)
    actions.discard(gone.episode_id, "bumped the table")
    actions.close()
    assert any("discarded" in m for m in actions.take_messages())
    after = {r.window_id: r for r in list_windows(store)}
    assert after[gone.window_id].trainable_steps == 0 and after[gone.window_id].auth == "no labels"
    assert after[gone.window_id].excluded_why == "discarded by synthetic: bumped the table"
    assert all(r.auth == "no" and not r.excluded_why for wid, r in after.items() if r.episode_id != gone.episode_id)
    decide(store, gone.window_id, ReviewStatus.APPROVED, "rev-02", authorize=True)
    row = next(r for r in list_windows(store) if r.window_id == gone.window_id)
    assert row.authorized and row.auth == "no labels"  # approved and authorized, and still nothing to train
    assert row.excluded_why == "discarded by synthetic: bumped the table"
    listed = _ok("review", "list", store, "--quiet").stdout
    assert any(gone.short_id in line and "no labels" in line for line in listed.splitlines())
    shown = _ok("review", "show", store, gone.window_id).stdout
    assert "none of its steps is a trainable label: discarded by synthetic: bumped the table" in shown


def test_a_label_layer_note_travels_with_the_mask(store):
    """write_labels: a note given is stored with the layer; a later layer that carries the mask keeps it, one whose
    mask is derived again from the rules drops it; a layer written before notes existed reads as no note."""
    st = EpisodeStore.open(store, mode="a")
    eid = list_windows(st)[0].episode_id
    strict = st.labels(eid).mask.copy()
    strict[:] = np.where(strict == LabelMask.TRAINABLE.code, LabelMask.CONTEXT_ONLY.code, strict)
    v = st.write_labels(eid, author="operator:ana", mask=strict, note="discarded by ana: wrong block")
    assert st.labels(eid, v).note == "discarded by ana: wrong block"
    v = st.write_labels(eid, author="qc", mask=st.labels(eid).mask)  # carried: note kept
    assert st.labels(eid, v).note == "discarded by ana: wrong block"
    v = st.write_labels(eid, author="rules")  # mask from the rules again: the exclusion and its note are gone
    assert st.labels(eid, v).note == "" and (st.labels(eid, v).mask == LabelMask.TRAINABLE.code).any()
    layer = st.labels(eid, v)
    assert "note" not in layer.to_json()  # no key for no note: earlier layers' bytes stay as they were
    assert LabelLayer.from_json({**layer.to_json()}).note == ""
