"""Camera frames through the per-chunk frame filter + zstd (hg_dagger.store.codecs): exact, smaller than PNG, the
filter used where it pays, and stores written before (zstd alone; the every-chunk row-median filter) still read."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from PIL import Image
from support.store import end, fields, start, step

from hg_dagger.contract import step_fields
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.store.codecs import (
    FRAME_FILTER,
    NO_PREDICTOR,
    ROW_MEDIAN,
    ROW_MEDIAN_PREDICTOR,
    choose_predictor,
    frame_filter_decode,
    frame_filter_encode,
    row_median_decode,
    row_median_encode,
)

pytestmark = [pytest.mark.simulation]

DATA = Path(__file__).parents[1] / "data"
# written by earlier recorders: zstd alone, then the row-median filter on every chunk; as they were written, two
# episodes "old0" and "old1" of 24 random 16x16 frames (rows 8.. of the second store's repeat row 7)
OLD_STORES = {"zstd alone": (DATA / "store_zstd_frames", ["bytes", "zstd"], False),
              "row median": (DATA / "store_row_median_frames", [ROW_MEDIAN, "bytes", "zstd"], True)}


def _noisy(n: int, size: int = 128, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus sensor-like noise (sigma 2), the frames zstd alone packed worst."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([120 + 80 * yy, 90 + 60 * xx, 140 - 50 * yy * xx], -1)
    return np.clip(base + rng.normal(0, 2.0, (n, size, size, 3)), 0, 255).astype(np.uint8)


def _rendered(n: int) -> np.ndarray:
    """Frames of the real MuJoCo Fetch camera while the arm moves."""
    from hg_dagger.envs import make_env

    env = make_env("fetch_pick_place_rgb", num_envs=1, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        rng = np.random.default_rng(0)
        out = []
        for _ in range(n):
            obs = env.step(rng.uniform(-1, 1, (1, env.action_dim)).astype(np.float32)).obs
            out.append(np.asarray(obs["rgb"][0]).copy())
        return np.stack(out)
    finally:
        env.close()


def _record(path, frames: np.ndarray) -> tuple[EpisodeStore, str]:
    store = EpisodeStore.create(path)
    spec = step_fields(obs={"state": ((31,), "float32"), "rgb": (frames.shape[1:], "uint8")}, action_dim=4)
    with store.recorder(flush_interval_s=0.01) as rec:
        eid = rec.begin_episode(start(), spec)
        for t, f in enumerate(frames):
            rec.put(eid, {**step(0, t), "obs/rgb": f})
        rec.end_episode(eid, end(len(frames)))
    return store, eid


def _frame_array_meta(path) -> dict:
    (meta,) = [p for p in Path(path).rglob("zarr.json") if p.parent.name == "rgb"]
    return json.loads(meta.read_text())


def _stored_frame_bytes(path) -> int:
    (meta,) = [p for p in Path(path).rglob("zarr.json") if p.parent.name == "rgb"]
    return sum(p.stat().st_size for p in (meta.parent / "c").rglob("*") if p.is_file())


@pytest.mark.parametrize("shape,dtype", [((5, 16, 16, 3), np.uint8), ((2, 1, 7, 3), np.uint8), ((3, 6, 1, 3), np.uint8),
                                         ((2, 9, 9), np.uint8), ((2, 8, 5, 1), np.uint16)])
def test_filter_round_trip_is_exact(shape, dtype):
    rng = np.random.default_rng(1)
    x = rng.integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    x[0, :, : shape[2] // 2] = 0  # flat area next to noise
    r = row_median_encode(x)
    assert r.shape == x.shape and r.dtype == x.dtype
    np.testing.assert_array_equal(row_median_decode(r), x)


def test_filter_predicts_from_the_row_above():
    """Pins the documented definition: row 0 as is, then v - median(up-left, up, up-right) mod 256."""
    x = np.array([[[10, 200, 30], [11, 199, 31]]], np.uint8)[..., None]  # one frame, 2 rows x 3 columns
    r = row_median_encode(x)[0, :, :, 0]
    # medians of the row above: (10,10,200) -> 10, (10,200,30) -> 30, (200,30,30) -> 30
    assert r.tolist() == [[10, 200, 30], [1, (199 - 30) % 256, 1]]


@pytest.mark.parametrize("kind", ["random", "noisy", "rendered"])
def test_recorder_to_reader_is_bit_exact(tmp_path, kind):
    n = 70  # chunks of 16 frames at 16x16 up to 128x128: a partial last chunk
    frames = {"random": lambda: np.random.default_rng(2).integers(0, 256, (n, 48, 40, 3), dtype=np.uint8),
              "noisy": lambda: _noisy(n, 64), "rendered": lambda: _rendered(n)}[kind]()
    store, eid = _record(tmp_path / "s", frames)
    codecs = _frame_array_meta(tmp_path / "s")["codecs"][0]["configuration"]["codecs"]
    assert [c["name"] for c in codecs] == ["bytes", FRAME_FILTER, "zstd"]
    back = EpisodeStore.open(tmp_path / "s").read_steps(eid, ["obs/rgb"])["obs/rgb"]
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, frames)
    assert validate_store(EpisodeStore.open(tmp_path / "s")) == []


def test_noisy_frames_cost_less_than_png(tmp_path):
    """The reason for the filter: zstd alone stored these at ~1.8x the bytes of PNG."""
    frames = _noisy(64)
    _record(tmp_path / "s", frames)

    def png(f):
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="PNG")  # Pillow's default level (6)
        return len(buf.getvalue())

    ours, theirs = _stored_frame_bytes(tmp_path / "s"), sum(png(f) for f in frames)
    assert ours < theirs, (ours, theirs)


@pytest.mark.parametrize("which", list(OLD_STORES))
def test_store_written_by_an_earlier_recorder_still_reads(tmp_path, which):
    """Its zarr.json names the codecs it was written with; it reads, validates, and takes a new recorder session
    whose segment uses the per-chunk frame filter."""
    source, names, flat_rows = OLD_STORES[which]
    path = tmp_path / "old"
    shutil.copytree(source, path)
    codecs = _frame_array_meta(path)["codecs"][0]["configuration"]["codecs"]
    assert [c["name"] for c in codecs] == names

    def written(seed):
        want = np.random.default_rng(seed).integers(0, 256, (24, 16, 16, 3), dtype=np.uint8)
        if flat_rows:
            want[:, 8:] = want[:, 7:8]
        return want

    store = EpisodeStore.open(path)
    infos = sorted(store.episodes(complete=True), key=lambda i: i.task_id)
    assert [i.task_id for i in infos] == ["old0", "old1"]
    for seed, info in enumerate(infos):
        np.testing.assert_array_equal(store.read_steps(info.episode_id, ["obs/rgb"])["obs/rgb"], written(seed))
    assert validate_store(store) == []
    for info in infos:
        assert store.read_steps(info.episode_id, ["reward"])["reward"].tolist() == list(range(24))

    new = np.random.default_rng(9).integers(0, 256, (20, 16, 16, 3), dtype=np.uint8)
    with EpisodeStore.open(path, mode="a").recorder() as rec:
        eid = rec.begin_episode(start(task="new"), fields(image=True))
        for t in range(20):
            rec.put(eid, {**step(5, t), "obs/rgb": new[t]})
        rec.end_episode(eid, end(20))
    store = EpisodeStore.open(path)
    np.testing.assert_array_equal(store.read_steps(eid, ["obs/rgb"])["obs/rgb"], new)
    np.testing.assert_array_equal(store.read_steps(infos[1].episode_id, ["obs/rgb"])["obs/rgb"], written(1))
    metas = sorted(json.dumps(json.loads(p.read_text())["codecs"]) for p in path.rglob("zarr.json")
                   if p.parent.name == "rgb")
    assert len(metas) == 2 and sum(FRAME_FILTER in m for m in metas) == 1


def _flat(n: int, size: int = 32) -> np.ndarray:
    """Rendered-like frames: flat colour areas with a moving square, most values equal to the one above."""
    out = np.full((n, size, size, 3), (40, 90, 160), np.uint8)
    for i in range(n):
        out[i, 4 + i % 8:12 + i % 8, 6:14] = (200, 30, 30)
    return out


def test_each_chunk_gets_the_predictor_its_first_frame_calls_for():
    assert choose_predictor(_noisy(4, 32)) == ROW_MEDIAN_PREDICTOR
    assert choose_predictor(_flat(4)) == NO_PREDICTOR
    assert choose_predictor(np.zeros((3, 1, 8, 3), np.uint8)) == NO_PREDICTOR  # one row: nothing to predict from
    for frames, predictor in ((_noisy(5, 32), ROW_MEDIAN_PREDICTOR), (_flat(5), NO_PREDICTOR)):
        data = frame_filter_encode(frames)
        assert data.dtype == np.uint8 and len(data) == 1 + frames.nbytes and data[0] == predictor
        body = data[1:].reshape(frames.shape)
        np.testing.assert_array_equal(body, row_median_encode(frames) if predictor else frames)
        np.testing.assert_array_equal(frame_filter_decode(data, frames.shape, frames.dtype), frames)


@pytest.mark.parametrize("shape,dtype", [((5, 16, 16, 3), np.uint8), ((2, 1, 7, 3), np.uint8), ((2, 9, 9), np.uint8),
                                         ((2, 8, 5, 1), np.uint16)])
def test_frame_filter_round_trip_is_exact(shape, dtype):
    rng = np.random.default_rng(3)
    for x in (rng.integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype), np.zeros(shape, dtype)):
        np.testing.assert_array_equal(frame_filter_decode(frame_filter_encode(x), shape, dtype), x)


def test_a_damaged_frame_filter_chunk_is_refused_by_name():
    data = frame_filter_encode(_flat(2))
    bad_predictor = data.copy()
    bad_predictor[0] = 7
    for bad in (bad_predictor, data[:-1]):
        with pytest.raises(ValueError, match=FRAME_FILTER):
            frame_filter_decode(bad, (2, 32, 32, 3), np.uint8)


def test_rendered_frames_cost_about_the_better_of_filter_and_no_filter(tmp_path):
    """The per-chunk choice: on rendered frames (where it skips the filter, and so half the encoding work) it costs
    at most 1% more than the better of zstd alone and the row-median filter on every chunk."""
    import numcodecs

    frames = _rendered(32)
    _record(tmp_path / "s", frames)
    zstd = numcodecs.Zstd(level=1, checksum=True)
    chunks = [np.ascontiguousarray(frames[i:i + 16]) for i in range(0, len(frames), 16)]
    alone = sum(len(zstd.encode(c)) for c in chunks)
    every_chunk = sum(len(zstd.encode(row_median_encode(c))) for c in chunks)
    ours = _stored_frame_bytes(tmp_path / "s") - 16 * 16 - 4  # less the shard's index and its checksum
    assert ours <= 1.01 * min(alone, every_chunk), (ours, alone, every_chunk)


def test_plain_zarr_reads_filtered_frames_with_the_codec_registered(tmp_path):
    """The reader's recipe in docs/data-format.md: zarr + numpy once hg_dagger.store.codecs is imported."""
    frames = _noisy(20, 32, seed=4)
    _record(tmp_path / "s", frames)
    root = zarr.open_group(str(tmp_path / "s"), mode="r")
    (sid,) = list(root["segments"].group_keys())
    arr = root[f"segments/{sid}/data/obs/rgb"]
    np.testing.assert_array_equal(arr[:20], frames)


READER = """
import json, sys, numpy as np, zarr
doc = open(sys.argv[1]).read()
code = doc.split("### Camera frame filter", 1)[1].split("```python", 1)[1].split("```", 1)[0]
exec(compile(code, "docs/data-format.md", "exec"))
zarr.config.set({"codecs": {"hg_dagger.frame_filter": "__main__.FrameFilter", "hg_dagger.row_median": "__main__.RowMedian"}})
out = {}
for path in sys.argv[2:]:
    root = zarr.open_group(path, mode="r")
    for sid in sorted(root["segments"].group_keys()):
        arr = root[f"segments/{sid}/data/obs/rgb"]
        names = [type(c).__name__ for c in arr.metadata.codecs[0].codecs]
        n = root[f"segments/{sid}"].attrs["hg_dagger_segment"]["committed_rows"]
        out[f"{path}:{sid}"] = (names, arr[:n].astype(np.int64).sum(axis=(1, 2, 3)).tolist())
print(json.dumps(out))
"""


@pytest.mark.subprocess
def test_the_documented_codecs_read_every_frame_format(tmp_path):
    """docs/data-format.md's reader classes, chosen over hg-dagger's own through zarr's config in a process of
    their own, decode a segment of each predictor and one written with the every-chunk filter."""
    import subprocess
    import sys

    frames = np.concatenate([_noisy(16, 32, seed=5), _flat(16)])  # one chunk of each predictor
    _record(tmp_path / "new", frames)
    old = tmp_path / "old"
    shutil.copytree(OLD_STORES["row median"][0], old)
    doc = Path(__file__).resolve().parents[2] / "docs" / "data-format.md"
    r = subprocess.run([sys.executable, "-c", READER, str(doc), str(tmp_path / "new"), str(old)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    read = json.loads(r.stdout)
    (new_names, new_sums), = [v for k, v in read.items() if k.startswith(str(tmp_path / "new"))]
    assert new_names == ["BytesCodec", "FrameFilter", "ZstdCodec"]
    assert new_sums == frames.astype(np.int64).sum(axis=(1, 2, 3)).tolist()
    (old_names, old_sums), = [v for k, v in read.items() if k.startswith(str(old))]
    assert old_names == ["RowMedian", "BytesCodec", "ZstdCodec"]
    want = [np.random.default_rng(seed).integers(0, 256, (24, 16, 16, 3), dtype=np.uint8) for seed in (0, 1)]
    for w in want:
        w[:, 8:] = w[:, 7:8]
    sums = [w.astype(np.int64).sum(axis=(1, 2, 3)).tolist() for w in want]
    assert old_sums in (sums[0] + sums[1], sums[1] + sums[0])
