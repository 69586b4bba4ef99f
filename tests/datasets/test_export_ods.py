"""hg-dagger export --format ods read back by EmbodiChain's own TensorDataSource (embodichain 0.3.2, installed
without its simulator): the resident [episode, time] TensorDict it validates and samples equals the store, and
segment sampling yields only authorized labels, never across a handover."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from reviewed import approve
from support.store import record

from hg_dagger.contract import ActionSource, LabelMask
from hg_dagger.datasets import ExportError, ExportItem, export_ods, load_ods, select
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

pytestmark = [pytest.mark.subprocess]

sources = pytest.importorskip("embodichain.data_pipeline.datasets")
TensorDataSource, SequenceSpecCfg = sources.TensorDataSource, sources.SequenceSpecCfg

EPISODES = [(0, 30, (5, 12)), (1, 17, None), (2, 41, (20, 33))]  # (seed, steps, human window)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """Episode 0's window approved for training; episode 2's never reviewed (labels, not trainable)."""
    base = tmp_path_factory.mktemp("ods")
    store = EpisodeStore.create(base / "store")
    with store.recorder(on_full="block") as rec:
        for seed, n, w in EPISODES:
            record(rec, seed, n, image=True, window=w)
    store = EpisodeStore.open(base / "store")
    approve(store, store.episodes()[0].episode_id)
    summary = export_ods(select(store), base / "ods")
    return store, base / "ods", summary


def _source(td, meta):
    return TensorDataSource(td, schema=meta["schema"], source_id=meta["source_id"],
                            metadata={"language": meta["language"]})


def test_tensor_data_source_reads_the_export_and_values_equal_the_store(export):
    store, out, summary = export
    td, meta = load_ods(out)
    assert summary.episodes == 3 and summary.frames == sum(n for _, n, _ in EPISODES)
    assert tuple(td.batch_size) == (3, 41) and meta["fps"] == 50.0
    src = _source(td, meta)  # validates schema, dtypes, finiteness of valid frames, continuity, frame ids
    assert [r["episode_id"] for r in meta["episodes"]] == [i.episode_id for i in store.episodes()]
    for row, (_seed, n, _w) in enumerate(EPISODES):
        eid = meta["episodes"][row]["episode_id"]
        a = store.read_steps(eid, ["obs/state", "obs/rgb", "applied_action", "action_source"])
        d = src.data[row]
        np.testing.assert_array_equal(d["obs", "state"][:n].numpy(), a["obs/state"])
        np.testing.assert_array_equal(d["obs", "rgb"][:n].numpy(), a["obs/rgb"])
        np.testing.assert_array_equal(d["actions"][:n].numpy(), a["applied_action"])
        np.testing.assert_array_equal(d["action_source"][:n].numpy(), a["action_source"])
        trainable = selection(store, store.info(eid)).allowed  # the training boundary, not the layer's labels
        assert trainable.any() == (row == 0) and (store.labels(eid).mask == LabelMask.TRAINABLE.code).any() == (row != 1)
        np.testing.assert_array_equal(d["trainable"][:n].numpy(), trainable)
        # the label codes agree: a label the boundary stops is context only, as the trainer's reader has it
        np.testing.assert_array_equal(d["label_mask"][:n].numpy() == LabelMask.TRAINABLE.code, trainable)
        np.testing.assert_array_equal(d["segment_accepted"][:n].numpy(), trainable)
        np.testing.assert_array_equal(d["label_target"][:n].numpy(), store.labels(eid).target)
        assert d["valid"][:n].all() and not d["valid"][n:].any()  # padding past the episode's end
        # one continuous recording per episode, each its own stretch; padding -1
        assert (d["continuity_id"][:n] == row).all() and (d["continuity_id"][n:] == -1).all()
        np.testing.assert_array_equal(d["episode_step"][:n].numpy(), np.arange(n))
        seg = d["segment_id"][:n].numpy()
        starts = d["segment_start"][:n].numpy()
        np.testing.assert_array_equal(np.flatnonzero(starts), np.flatnonzero(np.diff(seg, prepend=-1)))
        np.testing.assert_array_equal(d["segment_step"][:n].numpy(),
                                      np.arange(n) - np.maximum.accumulate(np.where(starts, np.arange(n), 0)))
    lang = src.resolve_language({"task_index": torch.tensor([0]), "subtask_index": torch.tensor([0])})
    assert lang["task"] == ["toy_reach"]


def test_segment_sampling_yields_only_trainable_human_labels(export):
    _, out, _ = export
    td, meta = load_ods(out)
    src = _source(td, meta)
    g = torch.Generator().manual_seed(0)
    batch = src.sample_context(512, SequenceSpecCfg(history_length=2, prediction_horizon=8, sampling_mode="segment"),
                               generator=g)
    sup = batch["loss_mask"]
    assert sup.any()
    assert batch["trainable"][sup].all()
    assert (batch["episode_id"][sup] == 0).all()  # episode 2's unreviewed window is never a target
    assert (batch["action_source"][sup] == ActionSource.HUMAN.code).all()
    seg = batch["segment_id"]
    for i in range(len(seg)):  # one context never spans two segments (a handover or a label boundary)
        assert len(torch.unique(seg[i][batch["valid"][i]])) == 1
    # episode mode samples everything valid, policy context included
    batch = src.sample_context(512, SequenceSpecCfg(history_length=1, prediction_horizon=1), generator=g)
    assert (~batch["trainable"][batch["loss_mask"]]).any()


def test_caller_mask_and_refusals(export, tmp_path):
    store, _, _ = export
    eid = store.episodes()[1].episode_id
    mask = np.zeros(17, bool)
    mask[3:6] = True
    export_ods([ExportItem(store, eid, trainable=mask)], tmp_path / "one")
    td, meta = load_ods(tmp_path / "one")
    np.testing.assert_array_equal(td["trainable"][0].numpy(), mask)
    assert meta["episodes"][0]["trainable_steps"] == 3
    with pytest.raises(ExportError, match="holds an ODS export already"):
        export_ods([ExportItem(store, eid)], tmp_path / "one")
    with pytest.raises(ExportError, match="not an ODS export"):
        load_ods(tmp_path)
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "export", str(store.url), "--format", "ods", "--out",
                        str(tmp_path / "cli"), "--episodes", eid, "--quiet"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "ods export: 1 episodes, 17 frames" in r.stdout, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli", "one"]


def test_the_dagger_schema_per_step_and_a_ragged_layout(tmp_path):
    """Every field of the ODS DAgger schema per step; `ragged` packs episodes into rows without padding each to
    the longest, and TensorDataSource still never samples a context across two episodes (continuity_id)."""
    from support.store import end, fields, start, step

    s = EpisodeStore.create(tmp_path / "s")
    lengths = [40, 6, 9, 12, 30]
    with s.recorder(on_full="block") as rec:
        for k, n in enumerate(lengths):
            eid = rec.begin_episode(start(policy_version=f"student-{k % 2}", iteration=k, beta=None if k == 1 else k / 10),
                                    fields())
            for t in range(n):
                x = step(k, t) | {"expert_action": np.full(4, 50 + t, np.float32), "expert_valid": True,
                                  "expert_used": t % 3 == 0, "policy_confidence": np.float32(t / 100)}
                if k == 4 and t == 10:
                    x["step_flags"] = np.uint16(1 << 4)  # DROPPED_FRAME_BEFORE: the recording is not continuous here
                rec.put(eid, x)
            rec.end_episode(eid, end(n))
    s = EpisodeStore.open(tmp_path / "s")
    infos = s.episodes()
    export_ods(select(s), tmp_path / "padded")
    summary = export_ods(select(s), tmp_path / "ragged", layout="ragged")
    assert summary.episodes == 5 and summary.frames == sum(lengths)
    pad, pad_meta = load_ods(tmp_path / "padded")
    td, meta = load_ods(tmp_path / "ragged")
    assert tuple(pad.batch_size) == (5, 40) and meta["layout"] == "ragged"
    assert tuple(td.batch_size) == (3, 40)  # [40], [6, 9, 12], [30]: 120 cells, not 200
    assert [(e["row"], e["offset"]) for e in meta["episodes"]] == [(0, 0), (1, 0), (1, 6), (1, 15), (2, 0)]
    src = _source(td, meta)
    _source(pad, pad_meta)
    for k, (e, info) in enumerate(zip(meta["episodes"], infos, strict=True)):
        n, row, off = lengths[k], e["row"], e["offset"]
        a = s.read_steps(info.episode_id, ["applied_action", "expert_action", "expert_used", "policy_confidence",
                                           "terminated", "truncated", "success"])
        d = src.data[row, off:off + n]
        np.testing.assert_array_equal(d["executed_action"].numpy(), a["applied_action"])
        np.testing.assert_array_equal(d["actions"].numpy(), a["applied_action"])
        np.testing.assert_array_equal(d["expert_action"].numpy(), a["expert_action"])
        np.testing.assert_array_equal(d["expert_used"].numpy(), a["expert_used"])
        np.testing.assert_array_equal(d["confidence"].numpy(), a["policy_confidence"])
        for key in ("terminated", "truncated", "success"):
            np.testing.assert_array_equal(d[key].numpy(), a[key])
        assert d["valid"].all()
        assert (d["episode_id"] == k).all() and meta["episodes"][k]["episode_id"] == info.episode_id
        assert (d["iteration"] == k).all()
        assert [meta["policy_versions"][int(v)] for v in d["policy_version"]] == [f"student-{k % 2}"] * n
        beta = d["beta"].numpy()
        assert np.isnan(beta).all() if k == 1 else np.allclose(beta, k / 10)
    cont = [src.data["continuity_id"][e["row"], e["offset"]:e["offset"] + n].tolist()
            for e, n in zip(meta["episodes"], lengths, strict=True)]
    assert cont[:4] == [[0] * 40, [1] * 6, [2] * 9, [3] * 12]
    assert cont[4] == [4] * 10 + [5] * 20  # a new stretch after the dropped frame
    g = torch.Generator().manual_seed(0)
    batch = src.sample_context(256, SequenceSpecCfg(history_length=4, prediction_horizon=8), generator=g)
    for i in range(len(batch["episode_id"])):  # a context never joins two episodes packed into one row
        assert len(torch.unique(batch["episode_id"][i][batch["valid"][i]])) == 1
