"""Usage classes and selection of dataset versions on small real stores (the recorder, zarr on tmp_path), and bad
input: a manifest naming a missing store or episode, a version that would change an existing one, a changed
manifest file, a split config that cannot be satisfied - each one clear line naming the item, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from support.store import ACTION_DIM, end, fields, record, start, step

from hg_dagger.contract import ActionSource, ExpertCertification, QCResult, ReviewDecision, ReviewStatus
from hg_dagger.datasets.build import build
from hg_dagger.datasets.manifest import (
    USAGES,
    DatasetConfig,
    DatasetError,
    SelectionConfig,
    read_manifest,
    write_exclusive,
)
from hg_dagger.datasets.read import check, export_items, sequences
from hg_dagger.datasets.repository import load
from hg_dagger.datasets.splits import SplitConfig
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _fails(*args, match: str) -> str:
    r = _cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and match in lines[0], r.stderr
    return lines[0]


def approve(st: EpisodeStore, eid: str, *, authorize: bool = True, qc: bool = True) -> None:
    layer = st.labels(eid)
    reviews = [ReviewDecision(window_id=w.window_id, reviewer="rev", status=ReviewStatus.APPROVED,
                              replay_training_authorized=authorize) for w in layer.windows]
    results = [QCResult(episode_id=eid, passed=True)] + [QCResult(episode_id=eid, window_id=w.window_id, passed=True)
                                                          for w in layer.windows] if qc else []
    st.write_labels(eid, author="rev", reviews=reviews, qc=results)


def _files(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _by_episode(m, kind="window"):
    return {s.episode_id: s for s in m.samples if s.kind == kind}


def test_usage_classes_and_why(tmp_path):
    st = EpisodeStore.create(tmp_path / "store")
    with st.recorder() as rec:
        ok = record(rec, 1, 30, window=(10, 20), operator="alice")
        held = record(rec, 2, 30, window=(5, 15), operator="bob", split="val")
        pending = record(rec, 3, 30, window=(5, 15), operator="bob")
        dup = record(rec, 1, 30, window=(10, 20), operator="alice")  # the same recorded actions as `ok`
        certified = record(rec, 4, 30, operator="carol")
        discarded_eid = rec.begin_episode(start(operator="dan"), fields())
        for t in range(20):
            rec.put(discarded_eid, step(5, t))
        e = end(20)
        rec.end_episode(discarded_eid, e.model_copy(update={"quality_flags": ["discarded"]}))
        cut = rec.begin_episode(start(operator="erin"), fields())
        for t in range(10):
            rec.put(cut, step(6, t))
    st = EpisodeStore.open(tmp_path / "store", mode="a")
    for eid in (ok, held, dup):
        approve(st, eid)
    st.write_labels(certified, author="rev", certifications=[ExpertCertification(
        episode_id=certified, step_start=0, step_end=12, certifier="rev", method="independent_review",
        executability_verified=True)], qc=[QCResult(episode_id=certified, passed=True)])

    m, written = build("u", [tmp_path / "store"])
    assert written
    w, ep = _by_episode(m), _by_episode(m, "episode")
    assert w[ok].usage == "trainable" and w[ok].runs == ((10, 20),) and "QC passed" in w[ok].why
    assert w[held].usage == "evaluation_only" and w[held].split == "val" and "recorded split val" in w[held].why
    assert ep[held].usage == "evaluation_only"
    assert w[pending].usage == "audit_only" and "not_reviewed" in w[pending].why
    assert w[dup].usage == "replay_only" and f"duplicate of sample {w[ok].id}" in w[dup].why
    c = _by_episode(m, "certification")[certified]
    assert c.usage == "trainable" and c.runs == ((0, 12),) and "independent_review" in c.why
    assert ep[discarded_eid].usage == "audit_only" and "discarded" in ep[discarded_eid].why
    assert ep[cut].usage == "audit_only" and "incomplete" in ep[cut].why and ep[cut].label_version == 0
    assert ep[ok].usage == "replay_only" and "never training targets" in ep[ok].why
    assert all(s.usage in USAGES for s in m.samples)  # exactly one class each
    # the ExportItems a dataset hands the exporters: the trainable runs as the per-step mask
    items = {i.episode_id: i for i in export_items(m)}
    assert set(items) == {ok, certified} and items[ok].trainable.sum() == 10 and items[ok].trainable[10:20].all()
    r = _cli("dataset", "export", "u@v1", "--root", tmp_path / "datasets", "--format", "ods", "--out",
             tmp_path / "ods", "--quiet")
    assert r.returncode == 0, r.stderr
    from hg_dagger.datasets import load_ods

    td, meta = load_ods(tmp_path / "ods")
    assert [e["episode_id"] for e in meta["episodes"]] == list(items) and int(td["trainable"].sum()) == 22
    assert sorted(sequences(m, 5)) == sorted([("s0", ok, 10, 15), ("s0", ok, 15, 20), ("s0", certified, 0, 5),
                                                 ("s0", certified, 5, 10)])


def test_quota_rounds_and_retention(tmp_path):
    st = EpisodeStore.create(tmp_path / "store")
    with st.recorder() as rec:
        eids = [record(rec, 10 + i, 20, window=(2, 8), operator="alice" if i % 2 else "bob", iteration=i // 2)
                for i in range(6)]  # rounds 0, 0, 1, 1, 2, 2
    st = EpisodeStore.open(tmp_path / "store", mode="a")
    for eid in eids:
        approve(st, eid)
    cfg = DatasetConfig(selection=SelectionConfig(stratify_by=("operator",), quota=2))
    m, _ = build("q", [tmp_path / "store"], config=cfg)
    trainable = [s for s in m.samples if s.usage == "trainable"]
    assert sorted(s.operator for s in trainable) == ["alice", "alice", "bob", "bob"]
    assert sum("quota 2 of stratum operator='alice' is full" in s.why for s in m.samples) == 1
    cfg = DatasetConfig(selection=SelectionConfig(rounds="recent", recent_rounds=1))
    m, _ = build("r", [tmp_path / "store"], config=cfg)
    assert {s.episode_id for s in m.samples if s.usage == "trainable"} == set(eids[4:])
    cfg = DatasetConfig(selection=SelectionConfig(retain_rounds=2))
    m, _ = build("k", [tmp_path / "store"], config=cfg)
    assert {s.episode_id for s in m.samples if s.usage == "trainable"} == set(eids[2:])
    assert all("retired by retention" in s.why for s in m.samples if s.kind == "window" and s.episode_id in eids[:2])
    again, written = build("k", [tmp_path / "store"])  # retired again for the same reason: nothing new
    assert not written and again.version == 1


def test_splits_in_a_built_version_are_leak_free_and_held_out_never_trains(tmp_path):
    st = EpisodeStore.create(tmp_path / "store")
    with st.recorder() as rec:
        eids = [record(rec, 20 + i, 20, window=(2, 8), operator=f"op{i % 4}") for i in range(12)]
    st = EpisodeStore.open(tmp_path / "store", mode="a")
    for eid in eids:
        approve(st, eid)
    cfg = DatasetConfig(splits=SplitConfig(val_fraction=0.3, isolate=("operator",),
                                              holdout={"operators": ["op3"]}))
    m, _ = build("s", [tmp_path / "store"], config=cfg)
    assert check(m) == []
    split_of_op: dict[str, set[str]] = {}
    for e in m.episodes:
        split_of_op.setdefault(e.operator, set()).add(e.split)
    assert all(len(v) == 1 for v in split_of_op.values()) and split_of_op["op3"] == {"holdout"}
    assert {"train", "val"} <= set().union(*split_of_op.values())
    assert all(s.split == "train" for s in m.samples if s.usage == "trainable")
    assert all(s.usage == "evaluation_only" for s in m.samples if s.operator == "op3")


def _small(tmp_path, name="store"):
    st = EpisodeStore.create(tmp_path / name)
    with st.recorder() as rec:
        eids = [record(rec, i, 20, window=(2, 8), operator="op") for i in range(3)]
    return EpisodeStore.open(tmp_path / name, mode="a"), eids


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    st, eids = _small(tmp_path)
    data = tmp_path / "datasets"
    m1, _ = build("toy", [tmp_path / "store"])
    v1 = (data / "toy" / "v1.json").read_bytes()

    # a version that would change an existing one
    approve(st, eids[0])
    line = _fails("dataset", "build", "toy", "--store", tmp_path / "store", "--version", "1", "--quiet",
                  match="toy@v1: exists with other content")
    assert "build v2" in line and (data / "toy" / "v1.json").read_bytes() == v1
    assert _files(data) == ["toy", "toy/v1.json"]
    _fails("dataset", "build", "toy", "--store", tmp_path / "store", "--version", "7", "--quiet",
           match="the next version of toy is v2")
    with pytest.raises(DatasetError, match="already exists"):
        write_exclusive(data / "toy" / "v1.json", "{}")
    assert (data / "toy" / "v1.json").read_bytes() == v1 and _files(data) == ["toy", "toy/v1.json"]

    # a split config that cannot be satisfied: named, nothing written
    _fails("dataset", "build", "other", "--store", tmp_path / "store", "--holdout-operators", "nobody", "--quiet",
           match="no episode has operator 'nobody'")
    _fails("dataset", "build", "other", "--store", tmp_path / "store", "--val-fraction", "0.5", "--isolate",
           "operator", "--quiet", match="1 group (operator) cannot fill train + val")
    _fails("dataset", "build", "toy", "--store", tmp_path / "store", "--val-fraction", "0.5", "--quiet",
           match="split config differs from the earlier version's")
    assert _files(data) == ["toy", "toy/v1.json"]

    # a changed manifest file is refused wherever it is read
    (data / "toy" / "v1.json").write_text(v1.decode().replace('"replay_only"', '"trainable"', 1))
    _fails("dataset", "show", "toy@v1", "--root", data, match="content does not match its hash")
    (data / "toy" / "v1.json").write_bytes(v1)

    # a manifest naming a missing episode (the store was replaced) or a missing store
    shutil.move(tmp_path / "store", tmp_path / "moved")
    _small(tmp_path)  # other episodes at the same path
    r = _cli("dataset", "check", "toy@v1", "--root", data)
    assert r.returncode == 2 and f"names episode {eids[0]}, not in store" in r.stderr and "Traceback" not in r.stderr
    line = _fails("dataset", "build", "toy", "--store", tmp_path / "store", "--quiet",
                  match="toy@v1: names episode ")
    assert line.split("names episode ")[1].split(",")[0] in eids and f"not in store {tmp_path / 'store'}" in line
    assert _files(data) == ["toy", "toy/v1.json"]
    shutil.rmtree(tmp_path / "store")
    _fails("train", "--dataset", "toy@v1", "--datasets-root", data, "--task", "toy_reach", "--out", tmp_path / "t",
           "--steps", "2", "--quiet", match="no episode store here")
    r = _cli("dataset", "check", "toy@v1", "--root", data)
    assert r.returncode == 2 and "store s0" in r.stderr and str(tmp_path / "store") in r.stderr
    _fails("dataset", "show", "nope@v1", "--root", data, match="dataset 'nope': no versions under")
    _fails("dataset", "show", "toy@v4", "--root", data, match="toy@v4: no such version")
    assert _files(data) == ["toy", "toy/v1.json"]


def test_check_fails_loudly_on_a_leaky_manifest(tmp_path):
    _small(tmp_path)
    m, _ = build("toy", [tmp_path / "store"])
    s = next(x for x in m.samples if x.kind == "window")
    bad = m.model_copy(update={"name": "leaky", "samples": tuple(
        x.model_copy(update={"split": "val"}) if x.id == s.id else x for x in m.samples)})
    bad = bad.model_copy(update={"hash": bad.content_hash()})
    path = tmp_path / "datasets" / "leaky" / "v1.json"
    write_exclusive(path, bad.model_dump_json())
    r = _cli("dataset", "check", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"episode {s.episode_id}: in split train (sample {s.episode_id}:episode) and split val (sample {s.id})" \
        in r.stderr
    r = _cli("dataset", "check", "toy", "--root", tmp_path / "datasets")
    assert r.returncode == 0 and "toy@v1: ok" in r.stdout


def test_manifest_round_trip_and_hash(tmp_path):
    _small(tmp_path)
    m, _ = build("toy", [tmp_path / "store"], author="me")
    again = read_manifest(tmp_path / "datasets" / "toy" / "v1.json")
    assert again == m and again.hash == again.content_hash() and again.author == "me"
    data = json.loads((tmp_path / "datasets" / "toy" / "v1.json").read_text())
    assert data["format"] == "hg_dagger.dataset" and data["samples"][0]["store"] == "s0"
    assert ACTION_DIM and ActionSource.HUMAN.value in {s["source"] for s in data["samples"]}


def test_config_file_and_its_errors(tmp_path):
    _small(tmp_path)
    good = tmp_path / "ds.yaml"
    good.write_text("kind: dataset\nselection: {task: toy_reach, quota: 1}\nsplits: {isolate: [operator]}\n")
    r = _cli("dataset", "build", "cfg", "--store", tmp_path / "store", "--config", good, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["dataset"] == "cfg@v1" and out["written"] and out["splits"] == {"train": 3}
    m = load(tmp_path / "datasets", "cfg")
    assert m.config.selection.quota == 1 and m.config.splits.isolate == ("operator",)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: dataset\nselection: {quota: -1}\n")
    _fails("dataset", "build", "x", "--store", tmp_path / "store", "--config", bad, match=str(bad))
    assert not (tmp_path / "datasets" / "x").exists()
