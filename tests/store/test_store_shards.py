"""Rows written as whole shard objects (hg_dagger.store.shards): camera frames and numeric columns must be exactly
what zarr writes and reads, fill-only chunks and shards left out."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zarr
from support.store import end, fields, start, step

from hg_dagger.contract.schema import FieldSpec
from hg_dagger.store import EpisodeStore, layout
from hg_dagger.store.segment import SegmentWriter
from hg_dagger.store.shards import RowShardWriter


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
    writer = RowShardWriter(ours)
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
    writer = RowShardWriter(ours)
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
    state = root.create_array(**layout.field_array_kwargs(fields()["obs/state"]))  # bytes + blosc, float32
    index = root.create_array(**layout.index_array_kwargs("rows/episode"))
    lz4 = root.create_array("l", shape=(0, 16, 16, 3), dtype="uint8", chunks=(16, 16, 16, 3),
                            shards=(256, 16, 16, 3), compressors=[zarr.codecs.BloscCodec(cname="lz4")])
    for arr in (cam, state, index, lz4):
        assert RowShardWriter.supports(arr), arr.path
    unsharded = root.create_array("u", shape=(0, 16, 16, 3), dtype="uint8", chunks=(16, 16, 16, 3))
    split_rows = root.create_array("s", shape=(0, 16, 16, 3), dtype="uint8", chunks=(16, 8, 16, 3),
                                   shards=(256, 16, 16, 3), compressors=[zarr.codecs.ZstdCodec(level=1)])
    big_endian = root.create_array("b", shape=(0,), dtype="uint16", chunks=(64,), shards=(256,),
                                   serializer=zarr.codecs.BytesCodec(endian="big"), compressors=[layout.NUMERIC_CODEC])
    two_compressors = root.create_array("t", shape=(0,), dtype="uint16", chunks=(64,), shards=(256,),
                                        compressors=[layout.NUMERIC_CODEC, zarr.codecs.ZstdCodec()])
    filtered_multibyte = root.create_array("f", shape=(0, 4, 4, 1), dtype="uint16", chunks=(4, 4, 4, 1),
                                           shards=(16, 4, 4, 1), compressors=[layout.IMAGE_FILTER, layout.IMAGE_CODEC])
    strings = root.create_array("v", shape=(0,), dtype=str, chunks=(64,), shards=(256,))
    for arr in (unsharded, split_rows, big_endian, two_compressors, filtered_multibyte, strings):
        assert not RowShardWriter.supports(arr), arr.path


# ------------------------------------------------------------------------------------------------
# Numeric columns and the row index
# ------------------------------------------------------------------------------------------------

FLUSHES = (700, 1, 323, 1500, 4000, 0, 3000, 900, 5000, 2047)  # 17471 rows: three shards of 8192, odd boundaries


def _bits(a: np.ndarray) -> np.ndarray:
    """Values as their bit patterns: NaN equals itself, -0.0 differs from 0.0."""
    return a.view(f"u{a.dtype.itemsize}")


def _random(dtype: str, shape: tuple[int, ...], n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((n, *shape)).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, (n, *shape)).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (n, *shape), dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype, shape, kind", [
    ("float32", (4,), "field"), ("float32", (2, 3), "field"), ("bool", (), "field"), ("uint8", (), "field"),
    ("uint16", (), "field"), ("uint32", (), "field"), ("int64", (), "field"), ("uint32", (), "index"),
    ("float32", (3,), "custom"), ("uint16", (5,), "zstd"),
])
def test_numeric_shard_objects_are_byte_identical_to_zarrs_own(tmp_path, dtype, shape, kind):
    """Every flush leaves exactly the shard objects zarr's own setitem leaves, for the store's numeric layouts and
    for blosc and zstd settings other than the store's (read off the array's metadata, not assumed)."""
    spec = FieldSpec(name="x", dtype=dtype, shape=shape)
    kw = {"field": layout.field_array_kwargs(spec), "index": layout.index_array_kwargs("x")}.get(kind) or dict(
        shape=(0, *shape), dtype=dtype, chunks=(100, *shape), shards=(500, *shape), config=layout.WRITE_CONFIG,
        compressors=[zarr.codecs.BloscCodec(cname="lz4", clevel=7, shuffle="bitshuffle", blocksize=256)]
        if kind == "custom" else [zarr.codecs.ZstdCodec(level=5, checksum=True)])
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "z"), mode="w")
    ours, theirs = (root.create_array(**{**kw, "name": name}) for name in ("ours", "theirs"))
    total = sum(FLUSHES)
    for a in (ours, theirs):
        a.resize((total, *shape))
    writer = RowShardWriter(ours)
    values = _random(dtype, shape, total, seed=len(shape) + np.dtype(dtype).itemsize)
    pos = 0
    for k in FLUSHES:
        layout.gather(writer.append(values[pos:pos + k]))
        theirs[pos:pos + k] = values[pos:pos + k]
        pos += k
        mine, zarrs = _shards(tmp_path / "z" / "ours" / "c"), _shards(tmp_path / "z" / "theirs" / "c")
        assert len(mine) == -(-pos // writer.shard_rows) and mine == zarrs, f"shard objects differ after {pos} rows"
    np.testing.assert_array_equal(_bits(zarr.open_array(tmp_path / "z" / "ours", mode="r")[:]), _bits(values))
    writer.close()
    with pytest.raises(RuntimeError):
        writer.append(values[:1])


def _specs() -> dict[str, FieldSpec]:
    """A field of every kind the recorder stores, with the fills the schema gives them."""
    nan = float("nan")
    return {s.name: s for s in [
        FieldSpec(name="vec", dtype="float32", shape=(4,), fill=nan),
        FieldSpec(name="mat", dtype="float32", shape=(2, 3), fill=0.0),
        FieldSpec(name="valid", dtype="bool", fill=True),
        FieldSpec(name="flag", dtype="bool", fill=False),
        FieldSpec(name="code", dtype="uint8", fill=255),
        FieldSpec(name="bits", dtype="uint16", fill=0),
        FieldSpec(name="count", dtype="uint32", fill=0),
        FieldSpec(name="t", dtype="int64", fill=-1),
        FieldSpec(name="never", dtype="float32", shape=(7,), fill=nan),
    ]}


def _columns(specs: dict[str, FieldSpec], n: int) -> dict[str, np.ndarray]:
    """n rows of every field: data with stretches of fill (whole chunks, whole shards, parts of chunks)."""
    cols = {name: layout.fill_rows(spec, n) for name, spec in specs.items()}
    cols["vec"][:] = _random("float32", (4,), n, 1)
    cols["vec"][3072:4096] = np.nan  # all of chunk 3: left out of shard 0's index
    cols["vec"][5000:5100] = np.nan  # part of a chunk: stored inside it
    cols["mat"][:] = _random("float32", (2, 3), n, 2)
    cols["mat"][1024:2048] = 0.0
    cols["mat"][1500] = -0.0  # the only non-fill value of chunk 1 (its bits differ from the fill's)
    cols["valid"][:] = True
    cols["valid"][[7, 9000, 17000]] = False  # a few data rows in each shard
    cols["flag"][:] = _random("bool", (), n, 3)
    cols["code"][10:20] = 3  # data only in the first flush; everything after is fill
    cols["bits"][:] = _random("uint16", (), n, 4)
    cols["count"][:] = np.arange(n, dtype=np.uint32)
    cols["t"][8192 + 100:] = np.arange(n - 8292) * 1000  # shard 0 all fill, data from inside shard 1
    return cols


def _index_entries(shard_file, chunks_per_shard: int) -> np.ndarray:
    data = shard_file.read_bytes()
    return np.frombuffer(data[-(16 * chunks_per_shard + 4):-4], "<u8").reshape(chunks_per_shard, 2)


def test_segment_numeric_columns_read_back_with_plain_zarr(tmp_path):
    """SegmentWriter over several flushes across chunk and shard boundaries: plain zarr reads every committed row
    exactly as written (bit for bit), the fill value where only fill was written, after each flush and after close
    trims the arrays; fill-only chunks and shards cost no bytes and no files."""
    specs = _specs()
    total = sum(FLUSHES)
    want = _columns(specs, total)
    episode = (np.arange(total) // 1000).astype(np.uint32)
    step = (np.arange(total) % 1000).astype(np.uint32)
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "s"), mode="w")
    seg = SegmentWriter(root, specs)
    base = tmp_path / "s" / "segments" / seg.segment_id

    def check(rows: int) -> None:
        group = zarr.open_group(tmp_path / "s", mode="r")[f"segments/{seg.segment_id}"]
        assert group.attrs["hg_dagger_segment"]["committed_rows"] == rows
        for name in specs:
            got = group[f"data/{name}"][:rows]
            np.testing.assert_array_equal(_bits(got), _bits(want[name][:rows]), err_msg=f"{name} after {rows} rows")
        np.testing.assert_array_equal(group["rows/episode"][:rows], episode[:rows])
        np.testing.assert_array_equal(group["rows/step"][:rows], step[:rows])

    pos = 0
    for k in FLUSHES:
        seg.flush({name: col[pos:pos + k] for name, col in want.items()}, episode[pos:pos + k], step[pos:pos + k], [])
        pos += k
        check(pos)
        assert not (base / "data" / "t" / "c" / "0").exists()  # shard 0 of t holds only fill
    seg.close()
    check(total)
    group = zarr.open_group(tmp_path / "s", mode="r")[f"segments/{seg.segment_id}"]
    for name, spec in specs.items():  # trimmed: the whole array is the committed rows, fill read as such
        arr = group[f"data/{name}"]
        assert arr.shape == (total, *spec.shape)
        np.testing.assert_array_equal(_bits(arr[:]), _bits(want[name]))
    assert np.signbit(group["data/mat"][1500]).all()

    def shards(name):
        return sorted(p.relative_to(base / name / "c").parts[0] for p in (base / name / "c").rglob("*") if p.is_file())

    assert not (base / "data" / "never" / "c").exists()
    assert shards("data/t") == ["1", "2"]
    assert shards("data/code") == ["0"]
    assert shards("data/vec") == shards("rows/episode") == ["0", "1", "2"]
    vec0 = _index_entries(base / "data" / "vec" / "c" / "0" / "0", 8)
    assert (vec0[3] == np.iinfo(np.uint64).max).all() and (vec0[[0, 1, 2, 4, 5, 6, 7]] != np.iinfo(np.uint64).max).all()
    code0 = _index_entries(base / "data" / "code" / "c" / "0", 8)
    assert (code0[1:] == np.iinfo(np.uint64).max).all() and code0[0, 1] < 200
    mat0 = _index_entries(base / "data" / "mat" / "c" / "0" / "0" / "0", 8)
    assert (mat0 != np.iinfo(np.uint64).max).all()  # chunk 1 holds one -0.0: stored


def test_recorded_fill_fields_have_no_files(tmp_path):
    """Fields an episode never sets (human_command, expert_action, ...) read as their fill and leave no shard
    objects; the fields it does set read back as put."""
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder(flush_interval_s=0.01) as rec:
        eid = rec.begin_episode(start(), fields())
        for t in range(1500):
            rec.put(eid, step(0, t))
            if t % 500 == 499:
                while rec.stats.written_steps < rec.stats.queued_steps:
                    time.sleep(0.005)
        rec.end_episode(eid, end(1500))
    assert rec.stats.flushes >= 3
    root = zarr.open_group(str(path), mode="r")
    (sid,) = list(root["segments"].group_keys())
    seg = root[f"segments/{sid}"]
    data = path / "segments" / sid / "data"
    for name in ("human_command", "expert_action", "t_device", "expert_valid", "policy_confidence"):
        assert not any(p.is_file() for p in (data / name).rglob("*") if p.name != "zarr.json"), name
        spec = fields()[name]
        np.testing.assert_array_equal(seg[f"data/{name}"][:], layout.fill_rows(spec, 1500))
    np.testing.assert_array_equal(seg["data/obs/state"][:], np.stack([step(0, t)["obs/state"] for t in range(1500)]))
    np.testing.assert_array_equal(seg["data/t_obs"][:], [step(0, t)["t_obs"] for t in range(1500)])
    assert sorted(p.name for p in (data / "t_obs" / "c").iterdir()) == ["0"]


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
