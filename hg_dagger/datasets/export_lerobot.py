"""Export episodes as a LeRobot dataset, format v3.0 (what lerobot >= 0.4 reads with ``LeRobotDataset``).

Written with pyarrow alone (no lerobot, torch or datasets import): meta/info.json, meta/tasks.parquet,
meta/episodes/chunk-000/file-000.parquet, meta/stats.json, data/chunk-CCC/file-FFF.parquet. Camera frames are
LeRobot "image" features: PNG bytes inside the data parquet (lossless, so values compare equal; LeRobot's video
features are lossy AV1). One store episode is one LeRobot episode with every step; the label information travels
per frame (``trainable``, ``intervene_flag``, ``label_mask``, ``action_source``, ``segment_id``), so a consumer
selects its training frames itself. Columns: docs/datasets.md, "Exports".
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hg_dagger.contract import SCHEMA_VERSION
from hg_dagger.datasets.source import (
    EpisodeData,
    ExportError,
    ExportItem,
    abandon_output,
    check_frames,
    common_fps,
    finish_output,
    obs_fields,
    read_groups,
    start_output,
    task_text,
)

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk folder (LeRobot's default)
DATA_FILE_MB = 100  # a data file is closed once it holds about this much (LeRobot's default)
ROW_GROUP_ROWS = 65536
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
STATS_ROWS = 32768
IMAGE_STATS_FRAMES = 256  # frames per read group that image statistics sample


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency of the export extra
        raise ExportError("parquet exports (lerobot, rlinf) need pyarrow: pip install 'hg-dagger[export]'") from exc
    return pa, pq


@dataclass
class ExportSummary:
    """What an export wrote."""

    out: str
    format: str
    episodes: int
    frames: int
    tasks: int
    fps: float
    files: int
    trainable_frames: int = 0
    bytes: int = 0
    columns: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.format} export: {self.episodes} episodes, {self.frames} frames ({self.trainable_frames} "
                f"trainable), {self.tasks} task(s), fps {self.fps:g}, {self.files} files, "
                f"{self.bytes / 1e6:.1f} MB -> {self.out}")


def obs_column(key: str, image: bool) -> str:
    """LeRobot column of an observation key: observation.state, observation.robot.qpos, observation.images.rgb."""
    dotted = key.replace("/", ".")
    return f"observation.images.{dotted}" if image else f"observation.{dotted}"


class _Stats:
    """Running min / max / mean / std / count per feature (finite values only), LeRobot's stats.json layout."""

    def __init__(self):
        self.acc: dict[str, list] = {}

    def add(self, name: str, values: np.ndarray) -> None:
        for lo in range(0, len(values), STATS_ROWS):  # bounded temporaries: float64 copies of a slice at a time
            self._add(name, values[lo:lo + STATS_ROWS])

    def _add(self, name: str, values: np.ndarray) -> None:
        v = values.reshape(len(values), -1).astype(np.float64)
        ok = np.isfinite(v)
        z = np.where(ok, v, 0.0)
        lo = np.where(ok, v, np.inf).min(0)
        hi = np.where(ok, v, -np.inf).max(0)
        a = self.acc.get(name)
        part = [ok.sum(0), z.sum(0), (z * z).sum(0), lo, hi]
        if a is None:
            self.acc[name] = part
        else:
            a[0] += part[0]
            a[1] += part[1]
            a[2] += part[2]
            np.minimum(a[3], part[3], out=a[3])
            np.maximum(a[4], part[4], out=a[4])

    def add_images(self, name: str, frames: np.ndarray) -> None:
        """Per-channel statistics of frames scaled to [0, 1], as LeRobot stores them ((C, 1, 1)), from a sample:
        at most IMAGE_STATS_FRAMES frames of each batch and every 4th pixel row and column (LeRobot samples too)."""
        sample = frames[:: max(1, len(frames) // IMAGE_STATS_FRAMES), ::4, ::4]
        self.add(name, sample.reshape(-1, frames.shape[-1]).astype(np.float32) / np.float32(255.0))

    def to_json(self, image_keys: set[str]) -> dict:
        out = {}
        for name, (n, s, ss, lo, hi) in self.acc.items():
            cnt = np.maximum(n, 1)
            mean = s / cnt
            std = np.sqrt(np.maximum(ss / cnt - mean * mean, 0.0))
            stats = {"min": lo, "max": hi, "mean": mean, "std": std}
            if name in image_keys:
                stats = {k: v.reshape(-1, 1, 1) for k, v in stats.items()}
            out[name] = {k: np.where(np.isfinite(v), v, 0.0).tolist() for k, v in stats.items()}
            out[name]["count"] = [int(n.max(initial=0))]
        return out


class _DataWriter:
    """data/chunk-CCC/file-FFF.parquet files of about DATA_FILE_MB each; an episode never spans two files."""

    def __init__(self, root: Path, schema):
        self.root = root
        self.schema = schema
        self.chunk = self.file = 0
        self.writer = None
        self.file_bytes = 0
        self.pending: list = []
        self.pending_rows = 0
        self.files = 0

    def location(self, next_bytes: int) -> tuple[int, int]:
        """(chunk, file) the next episode goes to, opening a new file when the current one is full."""
        if self.writer is not None and self.file_bytes + next_bytes > DATA_FILE_MB * (1 << 20):
            self._close()
            self.file += 1
            if self.file == CHUNKS_SIZE:
                self.chunk, self.file = self.chunk + 1, 0
        return self.chunk, self.file

    def add(self, table) -> None:
        _, pq = _pa()
        if self.writer is None:
            path = self.root / DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, self.schema, compression="snappy")
            self.files += 1
            self.file_bytes = 0
        self.pending.append(table)
        self.pending_rows += table.num_rows
        self.file_bytes += table.nbytes
        if self.pending_rows >= ROW_GROUP_ROWS or self.file_bytes > DATA_FILE_MB * (1 << 20):
            self._flush()

    def _flush(self) -> None:
        pa, _ = _pa()
        if self.pending:
            self.writer.write_table(pa.concat_tables(self.pending), row_group_size=max(self.pending_rows, 1))
            self.pending, self.pending_rows = [], 0

    def _close(self) -> None:
        if self.writer is not None:
            self._flush()
            self.writer.close()
            self.writer = None

    def close(self) -> None:
        self._close()


def _encode_pngs(frames: np.ndarray) -> list[bytes]:
    """PNG bytes of each frame, encoded on all cores (Pillow's encoder releases the GIL)."""
    if len(frames) < 64:
        return [_png(f) for f in frames]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(_png, frames, chunksize=16))


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(frame if frame.shape[-1] != 1 else frame[..., 0])
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _feature(dtype: str, shape: tuple[int, ...], names=None) -> dict:
    return {"dtype": dtype, "shape": list(shape) if shape else [1], "names": names}


def export_lerobot(items: Iterable[ExportItem], out: str | os.PathLike, *, fps: float | None = None,
                   robot_type: str | None = None, progress: bool = False) -> ExportSummary:
    """Write the episodes of ``items`` (in that order) as a LeRobot v3.0 dataset at ``out``, a new or empty
    folder. Everything is written into a temporary sibling folder that is renamed into place at the end: a failed
    export leaves nothing at ``out``."""
    pa, pq = _pa()
    final, tmp = start_output(out)
    try:
        summary = _write(pa, pq, items, tmp, fps=fps, robot_type=robot_type, progress=progress)
        summary.out = str(final)
        finish_output(final, tmp)
    except BaseException:
        abandon_output(tmp)
        raise
    return summary


def _write(pa, pq, items, root: Path, *, fps, robot_type, progress) -> ExportSummary:
    stats = _Stats()
    tasks: dict[str, int] = {}
    episodes_meta: dict[str, list] = {}
    writer = None
    features: dict | None = None
    image_cols: dict[str, str] = {}
    obs_cols: dict[str, str] = {}
    index = 0
    trainable_total = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="export", unit="ep", mininterval=1.0)
    for group in read_groups(items):
        cols_list, frames_list = [], []
        for ep in group:
            fps = common_fps(ep, fps)
            if features is None:
                specs = obs_fields(ep.item.store, ep.info.episode_id)
                obs_cols = {n: obs_column(n[4:], s.image) for n, s in specs.items()}
                image_cols = {n: c for n, c in obs_cols.items() if specs[n].image}
                features = _features(ep, specs, obs_cols)
                schema = _schema(pa, features)
                writer = _DataWriter(root, schema)
                first = ep.info.episode_id
            elif {n for n in ep.arrays if n.startswith("obs/")} != set(obs_cols):
                raise ExportError(f"episode {ep.info.episode_id}: observation keys differ from episode {first}'s")
            task = task_text(ep.info)
            task_index = tasks.setdefault(task, len(tasks))
            cols_list.append(_episode_columns(ep, obs_cols, image_cols, features, index, task_index, fps))
            frames_list.append({name: ep.arrays[name] for name in image_cols})
            _episode_meta(episodes_meta, ep, task, index)
            index += ep.num_steps
            trainable_total += int(ep.trainable.sum())
        cols = {c: np.concatenate([x[c] for x in cols_list]) for c in cols_list[0]}
        frames = {n: np.concatenate([x[n] for x in frames_list]) for n in image_cols}
        check_frames(cols["episode_index"], cols["frame_index"], cols["index"], cols["timestamp"], fps,
                     where=f"episodes {group[0].info.episode_id}..{group[-1].info.episode_id}")
        _add_stats(stats, cols, frames, image_cols)
        table = _table(pa, cols, frames, image_cols, schema)
        chunk, file = writer.location(table.nbytes)
        writer.add(table)
        episodes_meta["data/chunk_index"] += [chunk] * len(group)
        episodes_meta["data/file_index"] += [file] * len(group)
        if bar is not None:
            bar.update(len(group))
    if bar is not None:
        bar.close()
    if writer is None:
        raise ExportError("nothing to export: no episodes were given")
    writer.close()
    n_eps = len(episodes_meta["episode_index"])
    _write_episodes(pa, pq, root, episodes_meta)
    _write_tasks(pa, pq, root, tasks)
    with open(root / "meta" / "stats.json", "w") as f:
        json.dump(stats.to_json(set(image_cols.values())), f, indent=2)
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": n_eps,
        "total_frames": index,
        "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILE_MB,
        "video_files_size_in_mb": 200,
        "fps": int(fps) if float(fps).is_integer() else float(fps),
        "splits": {"train": f"0:{n_eps}"},
        "data_path": DATA_PATH,
        "video_path": None,
        "features": features,
        "hg_dagger": {"exporter": "hg_dagger.datasets.export_lerobot", "schema_version": SCHEMA_VERSION,
                      "action": "applied_action", "timestamp": "frame_index / fps",
                      "trainable_frames": trainable_total},
    }
    with open(root / "meta" / "info.json", "w") as f:
        json.dump(info, f, indent=4)
    files = sum(len(fs) for _, _, fs in os.walk(root))
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(root) for x in fs)
    return ExportSummary(out=str(root), format="lerobot", episodes=n_eps, frames=index, tasks=len(tasks), fps=fps,
                         files=files, trainable_frames=trainable_total, bytes=size, columns=list(features))


def _features(ep: EpisodeData, specs, obs_cols: dict[str, str]) -> dict:
    a = ep.arrays["applied_action"].shape[1]
    feats: dict[str, dict] = {}
    for name, col in obs_cols.items():
        spec = specs[name]
        if spec.image:
            feats[col] = {"dtype": "image", "shape": list(spec.shape), "names": ["height", "width", "channels"]}
        else:
            feats[col] = _feature(spec.dtype, tuple(spec.shape))
    feats["action"] = _feature("float32", (a,))
    feats["expert_action"] = _feature("float32", (a,))
    for col, dtype in (("expert_valid", "bool"), ("action_source", "int64"), ("intervene_flag", "bool"),
                       ("trainable", "bool"), ("label_mask", "int64"), ("label_target", "int64"), ("segment_id", "int64"),
                       ("segment_accepted", "bool"), ("continuity_id", "int64"), ("reward", "float32"),
                       ("done", "bool"), ("is_success", "bool"), ("timestamp", "float32"), ("frame_index", "int64"),
                       ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")):
        feats[col] = _feature(dtype, ())
    return feats


def _schema(pa, features: dict):
    fields = []
    for col, ft in features.items():
        if ft["dtype"] == "image":
            typ = _image_type(pa)
        else:
            base = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
            typ = base if ft["shape"] == [1] else pa.list_(base, int(np.prod(ft["shape"])))
        fields.append(pa.field(col, typ))
    return pa.schema(fields)


def _image_type(pa):
    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _episode_columns(ep: EpisodeData, obs_cols, image_cols, features, index0: int, task_index: int,
                     fps: float) -> dict[str, np.ndarray]:
    """Every non-image column of one episode as numpy, in the feature dtypes."""
    t = ep.num_steps
    frame = np.arange(t, dtype=np.int64)
    a = ep.arrays
    cols: dict[str, np.ndarray] = {}
    for name, col in obs_cols.items():
        if name not in image_cols:
            cols[col] = a[name]
    cols["action"] = a["applied_action"]
    cols["expert_action"] = a["expert_action"]
    cols["expert_valid"] = a["expert_valid"]
    cols["action_source"] = a["action_source"]
    cols["intervene_flag"] = ep.intervention & ep.trainable
    cols["trainable"] = ep.trainable
    cols["label_mask"] = ep.label_mask
    cols["label_target"] = ep.label_target
    cols["segment_id"] = ep.segments()
    cols["segment_accepted"] = ep.trainable
    cols["continuity_id"] = np.zeros(t, np.int64)
    cols["reward"] = a["reward"]
    cols["done"] = a["terminated"].astype(bool) | a["truncated"].astype(bool)
    cols["is_success"] = a["success"]
    cols["timestamp"] = (frame / fps).astype(np.float32)
    cols["frame_index"] = frame
    cols["episode_index"] = np.full(t, ep.index, np.int64)
    cols["index"] = index0 + frame
    cols["task_index"] = np.full(t, task_index, np.int64)
    out = {}
    for col, v in cols.items():
        ft = features[col]
        v = np.asarray(v).astype(ft["dtype"], copy=False)
        out[col] = v.reshape(t) if ft["shape"] == [1] else v.reshape(t, -1)
    return out


def _table(pa, cols: dict[str, np.ndarray], frames: dict[str, np.ndarray], image_cols, schema):
    """One arrow table of many episodes' rows; camera frames become PNG image structs."""
    by_col = {c: n for n, c in image_cols.items()}
    arrays = []
    for f in schema:
        if f.name in by_col:
            pngs = _encode_pngs(frames[by_col[f.name]])
            arrays.append(pa.array([{"bytes": b, "path": None} for b in pngs], type=f.type))
            continue
        v = cols[f.name]
        if v.ndim == 1:
            arrays.append(pa.array(v, type=f.type))
        else:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(v).reshape(-1)), v.shape[1]))
    return pa.Table.from_arrays(arrays, schema=schema)


def _add_stats(stats: _Stats, cols: dict[str, np.ndarray], frames: dict[str, np.ndarray], image_cols) -> None:
    for name, col in image_cols.items():
        stats.add_images(col, frames[name])
    for col, v in cols.items():
        stats.add(col, v)


def _episode_meta(meta: dict[str, list], ep: EpisodeData, task: str, index0: int) -> None:
    """One row of meta/episodes (data/chunk_index and data/file_index are added per group)."""
    s = ep.info.start
    row = {
        "episode_index": ep.index,
        "tasks": [task],
        "length": ep.num_steps,
        "dataset_from_index": index0,
        "dataset_to_index": index0 + ep.num_steps,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
        "hg_dagger/store": str(ep.item.store.url),
        "hg_dagger/episode_id": ep.info.episode_id,
        "hg_dagger/task_id": s.task.task_id,
        "hg_dagger/label_version": ep.label_version,
        "hg_dagger/trainable_frames": int(ep.trainable.sum()),
        "hg_dagger/policy_version": s.policy_version,
        "hg_dagger/operator": s.operator,
        "hg_dagger/mode": s.mode.value,
        "hg_dagger/iteration": int(s.iteration),
        "hg_dagger/mapping_hash": s.mapping_hash,
        "hg_dagger/end_reason": ep.info.end.end_reason.value,
        "hg_dagger/task_success": bool(ep.info.end.task_success),
    }
    for k, v in row.items():
        meta.setdefault(k, []).append(v)
    meta.setdefault("data/chunk_index", [])
    meta.setdefault("data/file_index", [])


def _write_episodes(pa, pq, root: Path, meta: dict[str, list]) -> None:
    path = root / EPISODES_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(meta), path, compression="snappy")


def _write_tasks(pa, pq, root: Path, tasks: dict[str, int]) -> None:
    """meta/tasks.parquet as pandas writes LeRobot's DataFrame (index = task text, column task_index): the
    pandas metadata makes ``pd.read_parquet`` give the task text back as the index, which LeRobot looks up."""
    names = list(tasks)
    table = pa.table({"task_index": pa.array([tasks[t] for t in names], pa.int64()), "task": pa.array(names, pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": None, "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    path = root / "meta" / "tasks.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
