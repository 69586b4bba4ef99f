"""hg-dagger export --format rlinf: the shard RLinf's online DAgger loads from <data_path>/rank_<r>/id_<n> (LeRobot
v2.1 layout, frame keys state / actions / intervene_flag), holding only the labels training may use (the boundary
lerobot --labels trainable holds: reviewed and authorized, or certified), one shard episode per run of them. RLinf
itself (GPU, Ray) is not installed here: these tests read the files the way
its archived-shard reader does (info.json's data_path formatted with episode_chunk and episode_index,
meta/episodes.jsonl, meta/tasks.jsonl, parquet rows as Python values)."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from reviewed import approve, certify
from support.store import record, step

from hg_dagger.contract import ActionSource, LabelMask
from hg_dagger.datasets import ExportError, ExportItem, export_rlinf, select
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

pytestmark = [pytest.mark.subprocess]

EPISODES = [(0, 30, (5, 12)), (1, 17, None), (2, 41, (20, 33))]  # (seed, steps, human window)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The human windows of episodes 0 and 2 approved and authorized for training, QC passed."""
    path = tmp_path_factory.mktemp("rlinf") / "store"
    s = EpisodeStore.create(path)
    with s.recorder(on_full="block") as rec:
        for seed, n, w in EPISODES:
            record(rec, seed, n, image=True, window=w)
    s = EpisodeStore.open(path)
    for info in s.episodes():
        approve(s, info.episode_id)
    return EpisodeStore.open(path)


def _read_shard(shard):
    """What RLinf's archived-shard reader does with a shard folder."""
    info = json.loads((shard / "meta" / "info.json").read_text())
    episodes = [json.loads(x) for x in (shard / "meta" / "episodes.jsonl").read_text().splitlines() if x.strip()]
    tasks = {json.loads(x)["task_index"]: json.loads(x)["task"]
             for x in (shard / "meta" / "tasks.jsonl").read_text().splitlines() if x.strip()}
    out = []
    for e in episodes:
        path = shard / info["data_path"].format(episode_chunk=e["episode_index"] // info.get("chunks_size", 1000),
                                                episode_index=e["episode_index"])
        out.append((e, pq.read_table(path).to_pylist()))
    return info, tasks, out


def test_shard_holds_trainable_runs_with_rlinf_frame_keys(store, tmp_path):
    shard = tmp_path / "data" / "rank_0" / "id_0"  # a fresh folder: the parents are made
    summary = export_rlinf(select(store), shard)
    info, tasks, eps = _read_shard(shard)
    assert info["codebase_version"] == "v2.1" and info["fps"] == 50 and tasks == {0: "toy_reach"}
    infos = store.episodes()
    # episodes 0 and 2 have one human window each; episode 1 has no trainable step and yields nothing
    assert [(e["hg_dagger_episode_id"], e["hg_dagger_first_step"], e["length"]) for e, _ in eps] == [
        (infos[0].episode_id, 5, 7), (infos[2].episode_id, 20, 13)]
    assert summary.episodes == 2 and summary.frames == 20 == info["total_frames"]
    for k, (e, rows) in enumerate(eps):
        eid = e["hg_dagger_episode_id"]
        seed = [s for s, *_ in EPISODES][[i.episode_id for i in infos].index(eid)]
        a = store.read_steps(eid, ["obs/state", "applied_action", "action_source"])
        first = e["hg_dagger_first_step"]
        assert (store.labels(eid).mask[first:first + e["length"]] == LabelMask.TRAINABLE.code).all()
        for t, row in enumerate(rows):
            s = first + t
            np.testing.assert_array_equal(np.asarray(row["state"], np.float32), a["obs/state"][s])
            np.testing.assert_array_equal(np.asarray(row["actions"], np.float32), a["applied_action"][s])
            assert row["intervene_flag"] is True and a["action_source"][s] == ActionSource.HUMAN.code
            assert row["frame_index"] == t and row["episode_index"] == k and row["segment_id"] == 0
            assert np.float32(row["timestamp"]) == np.float32(t / 50)
            img = np.asarray(Image.open(io.BytesIO(row["image"]["bytes"])))
            np.testing.assert_array_equal(img, step(seed, s, image=True)["obs/rgb"])
    index = [row["index"] for _, rows in eps for row in rows]
    assert index == list(range(20))
    # what a LeRobot v2.1 reader needs besides: per-episode statistics and typed columns in every parquet
    stats = [json.loads(x) for x in (shard / "meta" / "episodes_stats.jsonl").read_text().splitlines()]
    assert [x["episode_index"] for x in stats] == [0, 1]
    for x, (e, rows) in zip(stats, eps, strict=True):
        st = np.array([r["state"] for r in rows])
        np.testing.assert_allclose(x["stats"]["state"]["mean"], st.mean(0), rtol=1e-6)
        assert x["stats"]["state"]["count"] == [e["length"]]
        assert np.array(x["stats"]["image"]["mean"]).shape == (3, 1, 1)
        assert set(x["stats"]) == set(info["features"])
    path = shard / info["data_path"].format(episode_chunk=0, episode_index=0)
    hf = json.loads(pq.read_schema(path).metadata[b"huggingface"])["info"]["features"]
    assert hf["image"] == {"_type": "Image"}
    assert hf["state"] == {"feature": {"dtype": "float32", "_type": "Value"}, "length": 31, "_type": "Sequence"}
    assert hf["index"] == {"dtype": "int64", "_type": "Value"}


def test_the_documented_command_works_on_a_fresh_folder_and_a_failure_leaves_nothing(store, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "DATA" / "rank_0" / "id_0"
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "export", str(store.url), "--format", "rlinf", "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (out / "meta" / "info.json").is_file() and (out / "meta" / "episodes_stats.jsonl").is_file()
    # nothing trainable: one line, and the folders made for it are gone again
    eid = store.episodes()[1].episode_id
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "export", str(store.url), "--format", "rlinf", "--out",
                        str(tmp_path / "NEW" / "rank_0" / "id_0"), "--episodes", eid, "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "has a label training may use" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DATA"]


def test_a_gap_in_the_mask_splits_the_run_and_nothing_trainable_is_an_error(store, tmp_path):
    eid = store.episodes()[1].episode_id
    mask = np.zeros(17, bool)
    mask[[2, 3, 4, 9, 10]] = True  # two runs: [2, 5) and [9, 11)
    export_rlinf([ExportItem(store, eid, trainable=mask)], tmp_path / "two")
    _, _, eps = _read_shard(tmp_path / "two")
    assert [(e["hg_dagger_first_step"], e["length"]) for e, _ in eps] == [(2, 3), (9, 2)]
    assert [r["segment_id"] for _, rows in eps for r in rows] == [0, 0, 0, 1, 1]
    assert not any(r["intervene_flag"] for _, rows in eps for r in rows)  # policy steps a caller certified
    with pytest.raises(ExportError, match="none of the 1 episode"):
        export_rlinf([ExportItem(store, eid)], tmp_path / "none")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two"]


def test_expert_window_labels_are_the_expert_actions(tmp_path):
    """Classic DAgger: the policy may act while the expert labels; RLinf's `actions` must be the expert's label,
    and the LeRobot export names that target per frame."""
    from support.store import end, fields, start

    from hg_dagger.contract import CorrectionWindow, LabelTarget
    from hg_dagger.datasets import export_lerobot

    s = EpisodeStore.create(tmp_path / "s")
    with s.recorder(on_full="block") as rec:
        eid = rec.begin_episode(start(), fields())
        for t in range(12):
            x = step(4, t)
            if 3 <= t < 8:  # expert window: the expert labels, the policy's action is executed
                x |= {"expert_action": np.full(4, 100 + t, np.float32), "expert_valid": True}
            rec.put(eid, x)
        rec.end_episode(eid, end(12), windows=[CorrectionWindow(
            parent_episode_id=eid, parent_step_id=2, handover_start=3, handover_end=8, source=ActionSource.EXPERT)])
    s = EpisodeStore.open(tmp_path / "s")
    certify(s, eid)  # an automatic planner's window: certified, no reviewer needed
    assert (s.labels(eid).target[3:8] == LabelTarget.EXPERT_ACTION.code).all()
    export_rlinf(select(s), tmp_path / "shard")
    _, _, eps = _read_shard(tmp_path / "shard")
    ((e, rows),) = eps
    assert (e["hg_dagger_first_step"], e["length"]) == (3, 5)
    for t, row in enumerate(rows):
        np.testing.assert_array_equal(np.asarray(row["actions"], np.float32), np.full(4, 103 + t, np.float32))
        assert row["intervene_flag"] is False  # the policy's action was executed
    export_lerobot(select(s), tmp_path / "lerobot")
    data = pq.read_table(tmp_path / "lerobot" / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    assert data["label_target"][3:8] == [LabelTarget.EXPERT_ACTION.code] * 5
    assert data["trainable"] == [3 <= t < 8 for t in range(12)]


def test_a_reviewed_store_exports_exactly_its_trainable_frames(tmp_path):
    """Windows in every review state: approved (trainable), approved but not authorized, approved without QC,
    never reviewed, and self-approved by their operator. The shard holds exactly the steps the training boundary
    allows - the frames `train` and `export --format lerobot --labels trainable` take - and nothing else."""
    from support.store import end, fields, human_window, start

    from hg_dagger.datasets import export_lerobot

    s = EpisodeStore.create(tmp_path / "s")
    plans = {"approved": (0, 24, [(3, 9), (9, 14)]), "not_authorized": (1, 20, [(4, 10)]),
             "no_qc": (2, 18, [(2, 8)]), "unreviewed": (3, 16, [(5, 11)]), "self": (4, 22, [(6, 12)]),
             "approved_too": (5, 30, [(10, 19), (22, 27)])}
    ids = {}
    with s.recorder(on_full="block") as rec:
        for name, (seed, n, windows) in plans.items():
            eid = rec.begin_episode(start(operator="op-a"), fields(True))
            for t in range(n):
                human = any(a <= t < b for a, b in windows)
                rec.put(eid, step(seed, t, image=True, source=ActionSource.HUMAN if human else ActionSource.POLICY))
            rec.end_episode(eid, end(n), windows=[human_window(eid, a, b) for a, b in windows])
            ids[name] = eid
    s = EpisodeStore.open(tmp_path / "s")
    approve(s, ids["approved"])
    approve(s, ids["approved_too"])
    approve(s, ids["not_authorized"], authorize=False)
    approve(s, ids["no_qc"], qc=False)
    approve(s, ids["self"], reviewer="op-a")  # the window's own operator: authorizes nothing
    s = EpisodeStore.open(tmp_path / "s")
    want = {(i.episode_id, int(t)) for i in s.episodes() for t in np.flatnonzero(selection(s, i).allowed)}
    assert {eid for eid, _ in want} == {ids["approved"], ids["approved_too"]} and len(want) == 11 + 14
    summary = export_rlinf(select(s), tmp_path / "shard")
    _, _, eps = _read_shard(tmp_path / "shard")
    got = [(e["hg_dagger_episode_id"], e["hg_dagger_first_step"] + row["frame_index"]) for e, rows in eps for row in rows]
    assert len(got) == len(set(got)) and set(got) == want
    assert summary.frames == summary.trainable_frames == len(want)
    # one run per window, as lerobot --labels trainable cuts them: the adjacent windows [3, 9) and [9, 14) stay two
    spans = [(e["hg_dagger_episode_id"], e["hg_dagger_first_step"], e["length"]) for e, _ in eps]
    assert spans == [(ids["approved"], 3, 6), (ids["approved"], 9, 5), (ids["approved_too"], 10, 9),
                     (ids["approved_too"], 22, 5)]
    for e, rows in eps:  # each frame's values are the store's
        a = s.read_steps(e["hg_dagger_episode_id"], ["obs/state", "applied_action"])
        for row in rows:
            t = e["hg_dagger_first_step"] + row["frame_index"]
            np.testing.assert_array_equal(np.asarray(row["actions"], np.float32), a["applied_action"][t])
            np.testing.assert_array_equal(np.asarray(row["state"], np.float32), a["obs/state"][t])
            assert row["intervene_flag"] is True
    export_lerobot(select(s), tmp_path / "lerobot", labels="trainable")
    lr = pq.read_table(tmp_path / "lerobot" / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    assert list(zip(lr["hg_dagger/episode_id"], lr["hg_dagger/first_step"], lr["length"], strict=True)) == spans
