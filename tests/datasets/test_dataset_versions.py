"""Dataset versions end to end on stores recorded for real (toy_reach, synthetic operator, an eager gate): after a
review, `dataset build` adds exactly the approved, authorized, QC-passed human labels to the previous version,
with lineage and leak-free splits; `train --dataset` trains on exactly those and stores the student's calibrated
gate thresholds with it; `report --dataset` reports it;
earlier versions never change; `auto` builds one version per iteration."""

from __future__ import annotations

import json

import pytest
from support.cli import cli_ok as _ok

from hg_dagger.contract import ActionSource, LabelMask
from hg_dagger.datasets.read import check
from hg_dagger.datasets.repository import load, trained_on
from hg_dagger.review.decisions import list_windows
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

def _human_steps(store: EpisodeStore, row) -> set[tuple[str, int]]:
    """Steps of a window that a person drove and the label rules make trainable."""
    src = store.read_steps(row.episode_id, ["action_source"])["action_source"]
    mask = store.labels(row.episode_id).mask
    return {(row.episode_id, t) for t in range(row.handover_start, row.handover_end)
            if src[t] == ActionSource.HUMAN.code and mask[t] == LabelMask.TRAINABLE.code}


def _record(store, gates, episodes):
    _ok("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", episodes, "--num-envs", "1",
        "--store", store, "--gates", gates, "--calibrate-steps", "0", "--quiet")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    gates = root / "gates.yaml"
    gates.write_text("kind: gates\nname: eager\ntask: toy_reach\ngates:\n"
                     "  - {type: confidence, trigger: 1.0e-9, debounce_ticks: 1}\n")
    store = root / "store"
    _record(store, gates, 3)
    return root, store, gates


def test_build_review_build_train_report(session):
    root, store, gates = session
    data = root / "datasets"  # the default: beside the store
    rows = list_windows(store)
    assert len(rows) >= 3

    # v1 before any review: every window is recorded, none trainable, each says why
    r = _ok("dataset", "build", "toy", "--store", store, "--quiet")
    assert "wrote toy@v1" in r.stdout
    v1_bytes = (data / "toy" / "v1.json").read_bytes()
    v1 = load(data, "toy@v1")
    assert v1.summary["usage"]["trainable"] == 0
    wins = {s.window_id: s for s in v1.samples if s.kind == "window"}
    assert set(wins) == {w.window_id for w in rows}
    assert all(s.usage == "audit_only" and "not_reviewed" in s.why for s in wins.values())
    assert all(s.usage == "replay_only" for s in v1.samples if s.kind == "episode")

    _ok("review", "approve", store, rows[0].window_id, "--reviewer", "rev-a", "--authorize")
    _ok("review", "reject", store, rows[1].window_id, "--reviewer", "rev-a", "--reason", "drifted off target")
    _ok("review", "approve", store, rows[2].window_id, "--reviewer", "rev-b")  # approved, not authorized
    r = _ok("dataset", "build", "toy", "--store", store, "--quiet")
    assert "wrote toy@v2" in r.stdout
    v2_qcless = load(data, "toy@v2")
    assert v2_qcless.summary["usage"]["trainable"] == 0  # QC has not run: the human window waits
    _ok("qc", store, "--quiet")
    r = _ok("dataset", "build", "toy", "--store", store, "--quiet")
    assert "wrote toy@v3" in r.stdout and "since v2" in r.stdout

    st = EpisodeStore.open(store)
    v3 = load(data, "toy@v3")
    trained = {(s.episode_id, t) for s in v3.samples if s.usage == "trainable" for a, b in s.runs for t in range(a, b)}
    assert trained == _human_steps(st, rows[0])  # exactly the approved, authorized, QC-passed human labels
    assert [s.window_id for s in v3.samples if s.usage == "trainable"] == [rows[0].window_id]
    by_window = {s.window_id: s for s in v3.samples if s.kind == "window"}
    assert by_window[rows[1].window_id].usage == "audit_only" and "rejected" in by_window[rows[1].window_id].why
    assert by_window[rows[2].window_id].usage == "audit_only" and "not_authorized" in by_window[rows[2].window_id].why
    # v2's samples are all in v3; v1's file never changed
    assert {s.id for s in v2_qcless.samples} <= {s.id for s in v3.samples}
    assert (data / "toy" / "v1.json").read_bytes() == v1_bytes
    assert v3.parent_version == 2 and v3.parent_hash == v2_qcless.hash
    # lineage: the policy's rollouts, its windows and labels, QC
    (lin,) = v3.lineage
    assert lin.episodes == 3 and lin.windows == len(rows) and lin.qc.get("passed", 0) == len(rows)
    assert lin.policy_version == st.info(rows[0].episode_id).start.policy_version
    # a sample names store, episode, label layer version, window and step range
    s0 = by_window[rows[0].window_id]
    assert s0.label_version == st.label_versions(rows[0].episode_id)[-1]
    assert s0.steps == (rows[0].handover_start, rows[0].handover_end) and v3.store_url(s0.store) == str(store)
    _ok("dataset", "check", "toy@v3", "--store", store)
    r = _ok("dataset", "build", "toy", "--store", store, "--quiet")
    assert "toy@v3 is current" in r.stdout and not (data / "toy" / "v4.json").exists()

    # train on the version: exactly its trainable samples, and the version is recorded
    r = _ok("train", "--dataset", "toy@v3", "--store", store, "--task", "toy_reach", "--out", root / "t",
            "--steps", "5", "--quiet")
    result = json.loads((root / "t" / "train.json").read_text())
    assert result["labels"] == len(trained) and result["dataset"]["ref"] == "toy@v3"
    assert result["dataset"]["hash"] == v3.hash and "toy@v3" in r.stdout
    from hg_dagger.policy.checkpoint import read_checkpoint

    ckpt = read_checkpoint(root / "t" / "student.pt")
    assert ckpt["extra"]["dataset"]["dataset"] == "toy@v3"
    # the student's gate thresholds are calibrated and stored with it, as `train --store` stores them
    # (this store is too small for the shipped gate's 100 samples: test_dataset_train.py has one that calibrates)
    cal = result["gate_calibration"]
    assert cal["store"] == str(store) and cal["message"] in r.stdout
    assert ckpt["extra"].get("gate_thresholds") == cal["thresholds"]
    r = _ok("dataset", "show", "toy@v3", "--store", store)
    assert f"trained policy {result['version']}" in r.stdout and "-> toy@v3" in r.stdout
    assert f"{lin.windows} windows" in r.stdout

    # the report of the version
    r = _ok("report", "--dataset", "toy@v3", "--datasets-root", data, "--out", root / "rep")
    rep = json.loads((root / "rep" / "report.json").read_text())
    assert rep["dataset"]["usage"]["trainable"] == 1 and rep["labels"]["allowed"] == len(trained)
    assert [v["version"] for v in rep["dataset"]["versions"]] == ["v1", "v2", "v3"]
    html = (root / "rep" / "report.html").read_text()
    assert "Dataset toy@v3" in html and "data:image/png;base64," in html

    # a new session is the next increment: v4 = v3 + its windows (pending), v3's trainable sample carried over
    _record(store, gates, 1)
    _ok("dataset", "build", "toy", "--store", store, "--quiet")
    v4 = load(data, "toy@v4")
    assert {s.id for s in v3.samples} < {s.id for s in v4.samples}
    assert [s for s in v4.samples if s.usage == "trainable"] == [s for s in v3.samples if s.usage == "trainable"]
    r = _ok("dataset", "diff", "toy@v3", "toy@v4", "--store", store)
    assert "+" in r.stdout and "0 episodes moved between splits" in r.stdout

    # a later rejection revokes the carried sample in the next version; v3 stays as it was
    _ok("review", "reject", store, rows[0].window_id, "--reviewer", "rev-c", "--reason", "second look")
    _ok("dataset", "build", "toy", "--store", store, "--quiet")
    v5 = load(data, "toy@v5")
    s = next(x for x in v5.samples if x.window_id == rows[0].window_id)
    assert s.usage == "audit_only" and s.why.startswith("revoked") and s.changed_in == 5
    assert load(data, "toy@v3").hash == v3.hash


def test_auto_builds_one_version_per_iteration(tmp_path):
    from support.auto import tiny

    from hg_dagger.learn.auto import AutoRun

    rows = AutoRun(tiny(iterations=2), tmp_path / "run").run(progress=False)
    assert [r["dataset"] for r in rows] == ["toy_reach@v1", "toy_reach@v2"]
    data = tmp_path / "run" / "datasets"
    v1, v2 = load(data, "toy_reach@v1"), load(data, "toy_reach@v2")
    assert {s.id for s in v1.samples} < {s.id for s in v2.samples}
    st = EpisodeStore.open(tmp_path / "run" / "store")
    # every iteration's planner-certified expert windows are trainable, and the versions name their rounds
    assert v2.summary["usage"]["trainable"] == len(st.episodes())
    assert [r.iteration for r in v2.lineage] == [0, 1]
    assert check(v2) == []
    trained = trained_on(data, v2)
    assert [t.policy_version for t in trained] == [rows[1]["policy_version"]]
    off = AutoRun(tiny(iterations=1, dataset_versions=False), tmp_path / "off").run(progress=False)
    assert "dataset" not in off[0] and not (tmp_path / "off" / "datasets").exists()
