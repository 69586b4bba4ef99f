"""hg-dagger export --format lerobot on a real zarr store: the LeRobot v3.0 files read back with pyarrow alone
equal the store, frames are contiguous with timestamp == frame_index / fps exactly (LeRobot's loader checks
neither), the label information is per frame, and bad input fails with one line and nothing written.
LeRobot's own loader reads the same export in tests/interop (`make test-interop`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from reviewed import approve
from support.store import fields, record, start, step

from hg_dagger.contract import ActionSource, EndReason, EpisodeEnd, LabelMask, LabelTarget
from hg_dagger.datasets import ExportError, ExportItem, export_lerobot, select
from hg_dagger.datasets.source import check_frames
from hg_dagger.errors import ContractError
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

FPS = 50.0
# (seed, steps, human window) of the toy_reach episodes, in recording order
EPISODES = [(0, 30, (5, 12)), (1, 17, None), (2, 41, (20, 33))]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Three toy_reach episodes with cameras, one of another task, one never committed; the windows of episodes 0
    and 2 are approved for training (layer v2), and episode 2 has a reviewer's layer v3 that excludes part of its
    window."""
    path = tmp_path_factory.mktemp("export") / "store"
    store = EpisodeStore.create(path)
    with store.recorder(on_full="block") as rec:
        for seed, n, w in EPISODES:
            record(rec, seed, n, image=True, window=w)
        record(rec, 3, 10, image=True, task="fetch_push")
    with store.recorder(on_full="block") as rec:  # begun, never ended: incomplete
        eid = rec.begin_episode(start(), fields(True))
        for t in range(5):
            rec.put(eid, step(9, t, image=True))
    store = EpisodeStore.open(path, mode="a")
    e0, _, e2 = (i.episode_id for i in store.episodes(task_id="toy_reach", complete=True))
    approve(store, e0)
    approve(store, e2)
    mask = store.labels(e2).mask.copy()
    mask[20:25] = LabelMask.EXCLUDED.code
    store.write_labels(e2, author="reviewer", mask=mask)
    return path


def _frames(out) -> dict[str, np.ndarray]:
    """Every data parquet of an export, concatenated in file order, as numpy columns (images as PNG bytes)."""
    files = sorted((out / "data").glob("chunk-*/file-*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    cols = {}
    for name in table.column_names:
        col = table[name].combine_chunks()
        if name.startswith("observation.images."):
            cols[name] = [x["bytes"] for x in col.to_pylist()]
        elif pa.types.is_fixed_size_list(col.type):
            cols[name] = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
        else:
            cols[name] = col.to_numpy(zero_copy_only=False)
    return cols


def test_lerobot_export_equals_the_store(store_path, tmp_path):
    store = EpisodeStore.open(store_path)
    infos = store.episodes(task_id="toy_reach", complete=True)
    out = tmp_path / "lerobot"
    summary = export_lerobot(select(store, task_id="toy_reach"), out)
    lengths = [n for _, n, _ in EPISODES]
    assert summary.episodes == 3 and summary.frames == sum(lengths) and summary.fps == FPS

    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 50
    assert info["total_episodes"] == 3 and info["total_frames"] == sum(lengths) and info["total_tasks"] == 1
    assert info["features"]["observation.images.rgb"]["dtype"] == "image"
    # no task mapping recorded: the state is every non-camera key, named per dimension
    assert info["features"]["observation.state"] == {"dtype": "float32", "shape": [31],
                                                     "names": [f"state_{i}" for i in range(31)]}
    assert "observation.environment_state" not in info["features"]
    tasks = pq.read_table(out / "meta" / "tasks.parquet").to_pydict()
    assert tasks == {"task_index": [0], "task": ["toy_reach"]}
    eps = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    assert eps["length"] == lengths and eps["tasks"] == [["toy_reach"]] * 3
    assert eps["dataset_from_index"] == [0, 30, 47] and eps["dataset_to_index"] == [30, 47, 88]
    assert eps["hg_dagger/episode_id"] == [i.episode_id for i in infos]
    assert eps["hg_dagger/label_version"] == [2, 1, 3]  # the latest layers: approvals, episode 2's exclusion

    f = _frames(out)
    assert len(f["index"]) == sum(lengths)
    row = 0
    for k, (seed, n, window) in enumerate(EPISODES):
        eid = infos[k].episode_id
        sl = slice(row, row + n)
        stored = store.read_steps(eid, ["obs/state", "obs/rgb", "applied_action", "action_source"])
        np.testing.assert_array_equal(f["observation.state"][sl], stored["obs/state"])
        np.testing.assert_array_equal(f["action"][sl], stored["applied_action"])
        for t in range(n):
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(f["observation.images.rgb"][row + t]))),
                                          step(seed, t, image=True)["obs/rgb"], err_msg=f"episode {k} step {t}")
        trainable = selection(store, infos[k]).allowed  # the training boundary
        assert (trainable == (store.labels(eid).mask == LabelMask.TRAINABLE.code)).all()  # every label approved
        human = stored["action_source"] == ActionSource.HUMAN.code
        np.testing.assert_array_equal(f["trainable"][sl], trainable)
        np.testing.assert_array_equal(f["intervene_flag"][sl], trainable & human)
        np.testing.assert_array_equal(f["action_source"][sl], stored["action_source"])
        np.testing.assert_array_equal(f["label_mask"][sl], store.labels(eid).mask)
        np.testing.assert_array_equal(f["label_target"][sl], store.labels(eid).target)
        assert (f["label_target"][sl][trainable] == LabelTarget.APPLIED_ACTION.code).all()
        if window:
            assert human[window[0]:window[1]].all() and not human[:window[0]].any()
        # contiguity and timestamps, checked here because LeRobot's loader does not
        np.testing.assert_array_equal(f["frame_index"][sl], np.arange(n))
        np.testing.assert_array_equal(f["episode_index"][sl], np.full(n, k))
        np.testing.assert_array_equal(f["index"][sl], np.arange(row, row + n))
        assert f["timestamp"].dtype == np.float32
        np.testing.assert_array_equal(f["timestamp"][sl], (np.arange(n) / FPS).astype(np.float32))
        np.testing.assert_array_equal(f["task_index"][sl], np.zeros(n))
        # a segment never mixes action sources or labels with context
        seg = f["segment_id"][sl]
        assert np.all(np.diff(seg) >= 0) and seg[0] == 0
        for s in np.unique(seg):
            assert len(set(stored["action_source"][seg == s])) == 1 and len(set(trainable[seg == s])) == 1
        row += n
    assert f["trainable"].sum() == (12 - 5) + (33 - 25) > 0  # episode 2's steps 20..24 were excluded by review

    stats = json.loads((out / "meta" / "stats.json").read_text())
    np.testing.assert_allclose(stats["observation.state"]["mean"], f["observation.state"].mean(0), rtol=1e-5)
    assert stats["observation.state"]["count"] == [sum(lengths)]
    assert np.array(stats["observation.images.rgb"]["mean"]).shape == (3, 1, 1)
    for q in (1, 10, 50, 90, 99):  # exact here (fewer rows than the quantile sample holds)
        np.testing.assert_allclose(stats["observation.state"][f"q{q:02d}"],
                                   np.quantile(f["observation.state"].astype(np.float64), q / 100, axis=0), rtol=1e-6)
        np.testing.assert_allclose(stats["action"][f"q{q:02d}"], np.quantile(f["action"], q / 100, axis=0), rtol=1e-6)
        assert np.array(stats["observation.images.rgb"][f"q{q:02d}"]).shape == (3, 1, 1)


def test_caller_trainable_mask_overrides_the_label_layer(store_path, tmp_path):
    """A dataset manifest decides what is trainable (its authorization rule); the export carries it per frame."""
    store = EpisodeStore.open(store_path)
    info = store.episodes(task_id="toy_reach", complete=True)[0]
    mine = np.zeros(info.num_steps, bool)
    mine[6:9] = True
    export_lerobot([ExportItem(store, info.episode_id, trainable=mine)], tmp_path / "out")
    f = _frames(tmp_path / "out")
    np.testing.assert_array_equal(f["trainable"], mine)
    np.testing.assert_array_equal(f["intervene_flag"], mine)  # steps 6..8 lie in the human window
    np.testing.assert_array_equal(f["segment_accepted"], mine)
    assert json.loads((tmp_path / "out" / "meta" / "info.json").read_text())["hg_dagger"]["trainable_frames"] == 3


def test_export_into_a_non_empty_folder_is_refused_and_writes_nothing(store_path, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    items = select(EpisodeStore.open(store_path), task_id="toy_reach")
    with pytest.raises(ExportError, match=f"{out}: folder is not empty"):
        export_lerobot(items, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and os.listdir(out) == ["mine.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    export_lerobot(items, empty)  # an empty folder is fine
    assert (empty / "meta" / "info.json").is_file()


def test_a_failing_export_leaves_nothing_behind(store_path, tmp_path):
    store = EpisodeStore.open(store_path)
    good = store.episodes(task_id="toy_reach", complete=True)[0].episode_id
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="no episode 'nope'"):
        export_lerobot([ExportItem(store, good), ExportItem(store, "nope")], out)
    with pytest.raises(ExportError, match=f"episode {good}: trainable mask has shape"):
        export_lerobot([ExportItem(store, good, trainable=np.ones(3, bool))], out)
    incomplete = store.episodes(complete=False)[0].episode_id
    with pytest.raises(ExportError, match=f"episode {incomplete} is incomplete"):
        export_lerobot([ExportItem(store, good), ExportItem(store, incomplete)], out)
    with pytest.raises(ExportError, match="no episodes"):
        export_lerobot([], out)
    assert list(tmp_path.iterdir()) == []  # neither the output nor a temporary sibling


def test_episodes_of_different_rates_are_refused(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(on_full="block") as rec:
        a = record(rec, 0, 5)
        b = rec.begin_episode(start().model_copy(update={"control_hz": 25.0}), fields())
        for t in range(5):
            rec.put(b, step(1, t))
        rec.end_episode(b, EpisodeEnd(end_reason=EndReason.SUCCESS, task_success=True, num_steps=5))
    store = EpisodeStore.open(tmp_path / "s")
    with pytest.raises(ExportError, match=f"episode {b}: control_hz 25 differs from the export's fps 50"):
        export_lerobot(select(store, episodes=[a, b]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_frame_checks_catch_what_lerobot_does_not(store_path):
    ep = np.array([0, 0, 0, 1, 1])
    frame = np.array([0, 1, 2, 0, 1])
    index = np.arange(5)
    ts = (frame / FPS).astype(np.float32)
    check_frames(ep, frame, index, ts, FPS, where="ok")
    with pytest.raises(ContractError, match="global index is not contiguous"):
        check_frames(ep, frame, index + np.array([0, 0, 0, 1, 1]), ts, FPS, where="x")
    with pytest.raises(ContractError, match="episode 1 frame_index is not contiguous at row 4"):
        check_frames(ep, np.array([0, 1, 2, 0, 2]), index, ts, FPS, where="x")
    jitter = ts.copy()
    jitter[2] = np.nextafter(jitter[2], np.float32(1))
    with pytest.raises(ContractError, match="episode 0 timestamp .* != frame_index / fps at row 2"):
        check_frames(ep, frame, index, jitter, FPS, where="x")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hg_dagger", "export", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_cli_exports_named_episodes_in_order_and_reports_bad_input(store_path, tmp_path):
    store = EpisodeStore.open(store_path)
    e0, _, e2 = (i.episode_id for i in store.episodes(task_id="toy_reach", complete=True))
    r = _cli(store_path, "--format", "lerobot", "--out", tmp_path / "out", "--episodes", e2, e0, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "lerobot export: 2 episodes, 71 frames" in r.stdout
    eps = pq.read_table(tmp_path / "out" / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    assert eps["hg_dagger/episode_id"] == [e2, e0]

    incomplete = store.episodes(complete=False)[0].episode_id
    for args, message in [
        (["--episodes", "nope"], "no episode 'nope'"),
        (["--episodes", incomplete], f"episode {incomplete} is incomplete"),
        (["--task", "no_such_task"], "no complete episode of task 'no_such_task'"),
        (["--episodes", e0, "--task", "fetch_push"], f"episode {e0} is of task 'toy_reach', not 'fetch_push'"),
    ]:
        r = _cli(store_path, "--format", "lerobot", "--out", tmp_path / "bad", "--quiet", *args)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr.count("\n") == 1
        assert not (tmp_path / "bad").exists()
    r = _cli(store_path, "--format", "lerobot", "--out", tmp_path / "out", "--quiet")
    assert r.returncode == 2 and "holds a LeRobot export already" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    r = _cli(tmp_path / "missing", "--format", "lerobot", "--out", tmp_path / "x", "--quiet")
    assert r.returncode == 2 and "no episode store here" in r.stderr
