"""Camera frames written as whole shard objects (hg_dagger.store.shards) must be exactly what zarr writes."""

from __future__ import annotations

import json
import time

import numpy as np
import zarr
from support.store import end, fields, start

from hg_dagger.store import EpisodeStore, layout
from hg_dagger.store.shards import FrameShardWriter


def _frames(n: int, shape=(16, 16, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def _pair(tmp_path, spec):
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "z"), mode="w")
    kw = layout.field_array_kwargs(spec)
    ours = root.create_array(**{**kw, "name": "ours"})
    theirs = root.create_array(**{**kw, "name": "theirs"})
    for a in (ours, theirs):
        a.resize((layout.CAPACITY_STEP, *a.shape[1:]))
    return ours, theirs


def _shards(path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_shard_objects_are_byte_identical_to_zarrs_own(tmp_path):
    spec = fields(image=True)["obs/rgb"]
    ours, theirs = _pair(tmp_path, spec)
    writer = FrameShardWriter(ours)
    assert (writer.chunk_rows, writer.shard_rows) == (16, 256)
    frames = _frames(700)
    pos = 0
    for k in (1, 5, 10, 16, 0, 31, 200, 256, 181):  # crosses chunk and shard boundaries, empty flush included
        part = frames[pos:pos + k]
        layout.gather(writer.append(list(part)))
        theirs[pos:pos + k] = part
        pos += k
        mine, zarrs = _shards(tmp_path / "z" / "ours" / "c"), _shards(tmp_path / "z" / "theirs" / "c")
        assert mine.keys() == zarrs.keys() and len(mine) == -(-pos // 256)
        assert mine == zarrs, f"shard objects differ after {pos} rows"
        np.testing.assert_array_equal(ours[:pos], frames[:pos])
    assert pos == 700 and writer.rows == 700


def test_committed_chunks_are_never_re_encoded(tmp_path):
    """A later flush rewrites the open shard object, but the bytes of chunks written before stay identical."""
    spec = fields(image=True)["obs/rgb"]
    ours, _ = _pair(tmp_path, spec)
    writer = FrameShardWriter(ours)
    frames = _frames(100, seed=3)
    layout.gather(writer.append(list(frames[:40])))  # chunks 0, 1 full; chunk 2 partial (8 rows)
    shard = tmp_path / "z" / "ours" / "c" / "0" / "0" / "0" / "0"
    first = shard.read_bytes()
    layout.gather(writer.append(list(frames[40:100])))
    second = shard.read_bytes()

    def chunks(data):
        index = np.frombuffer(data[-(16 * 16 + 4):-4], "<u8").reshape(16, 2)
        return [data[o:o + n] if o != np.iinfo(np.uint64).max else None for o, n in index]

    a, b = chunks(first), chunks(second)
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] is None and b[6] is not None
    np.testing.assert_array_equal(ours[:100], frames)


def test_supports_only_the_layout_it_reproduces(tmp_path):
    root = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    cam = root.create_array(**layout.field_array_kwargs(fields(image=True)["obs/rgb"]))
    assert FrameShardWriter.supports(cam)
    state = root.create_array(**layout.field_array_kwargs(fields()["obs/state"]))  # blosc, float32
    unsharded = root.create_array("u", shape=(0, 16, 16, 3), dtype="uint8", chunks=(16, 16, 16, 3))
    lz4 = root.create_array("l", shape=(0, 16, 16, 3), dtype="uint8", chunks=(16, 16, 16, 3),
                            shards=(256, 16, 16, 3), compressors=[zarr.codecs.BloscCodec(cname="lz4")])
    split_rows = root.create_array("s", shape=(0, 16, 16, 3), dtype="uint8", chunks=(16, 8, 16, 3),
                                   shards=(256, 16, 16, 3), compressors=[zarr.codecs.ZstdCodec(level=1)])
    for arr in (state, unsharded, lz4, split_rows):
        assert not FrameShardWriter.supports(arr), arr.path


def test_recorded_frames_read_back_with_plain_zarr(tmp_path):
    """Several flushes, two interleaved episodes, more than two shards: the documented zarr + numpy recipe
    returns every frame of every episode."""
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    n = 300
    want = {0: _frames(n, seed=10), 1: _frames(n, seed=11)}
    with store.recorder(flush_interval_s=0.01) as rec:
        eids = {k: rec.begin_episode(start(), fields(image=True)) for k in want}
        for t in range(n):
            for k, eid in eids.items():
                rec.put(eid, {"obs/rgb": want[k][t], "t_obs": t})
            if t % 70 == 69:  # let the writer commit what it has: flush boundaries at odd rows
                while rec.stats.written_steps < rec.stats.queued_steps:
                    time.sleep(0.005)
        for eid in eids.values():
            rec.end_episode(eid, end(n))
    assert rec.stats.flushes > 3

    root = zarr.open_group(str(path), mode="r")
    (sid,) = list(root["segments"].group_keys())
    seg = root[f"segments/{sid}"]
    meta = seg.attrs["hg_dagger_segment"]
    rows = meta["committed_rows"]
    assert rows == 2 * n and seg["data/obs/rgb"].shape[0] == rows  # closed: trimmed
    assert (path / "segments" / sid / "data" / "obs" / "rgb" / "c" / "2" / "0" / "0" / "0").is_file()
    records = [json.loads(r) for r in seg["log"][:meta["committed_log"]]]
    ordinal = {r["start"]["episode_id"]: r["ep"] for r in records if r["type"] == "begin"}
    ep, step = seg["rows/episode"][:rows], seg["rows/step"][:rows]
    frames = seg["data/obs/rgb"][:rows]
    for k, eid in eids.items():
        mine = np.flatnonzero(ep == ordinal[eid])
        mine = mine[np.argsort(step[mine])]
        np.testing.assert_array_equal(frames[mine], want[k])
    assert seg["log"].shape[0] == meta["committed_log"]  # the log's spare capacity is trimmed on close too
