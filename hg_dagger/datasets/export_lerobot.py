"""Export episodes as a LeRobot dataset, format v3.0 (what lerobot >= 0.4 reads with ``LeRobotDataset`` and
trains on with ``lerobot-train``).

Written with pyarrow alone (no lerobot, torch or datasets import): meta/info.json, meta/tasks.parquet,
meta/episodes/chunk-000/file-000.parquet, meta/stats.json (with quantiles), data/chunk-CCC/file-FFF.parquet, and
with ``video`` videos/<camera>/chunk-CCC/file-FFF.mp4 (PyAV). The state the policy sees is ``observation.state``
(the task mapping's flattened keys, named per dimension) and its goal ``observation.environment_state``; camera
frames are ``observation.images.<key>``, PNG bytes inside the parquet by default (lossless).

By default one store episode is one LeRobot episode with every step, and the label information travels per frame
(``trainable``, ``intervene_flag``, ``label_mask``, ``action_source``, ``segment_id``). With
``labels="trainable"`` only the labels training may use are written, each run of them one episode with the label
target as ``action``, for trainers without a per-frame mask. Columns: docs/datasets.md, "Exports".
"""

from __future__ import annotations

import io
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hg_dagger.contract import SCHEMA_VERSION
from hg_dagger.datasets.sequences import label_runs
from hg_dagger.datasets.source import (
    LABELS,
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
    task_mapping,
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
QUANTILE_ROWS = 100_000  # rows per feature the quantiles are computed from
QUANTILES = (1, 10, 50, 90, 99)  # stats.json q01 ... q99
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
# --video NAME -> (PyAV encoder, LeRobot's video.codec name, encoder options)
VIDEO_CODECS = {"h264": ("libx264", "h264", {"crf": "18", "preset": "veryfast"}),
                "av1": ("libsvtav1", "av1", {"crf": "30", "preset": "8"})}
STATE = "observation.state"
ENV_STATE = "observation.environment_state"


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
    """Running min / max / mean / std / count per feature (finite values only), LeRobot's stats.json layout, and
    the quantiles LeRobot's QUANTILES / QUANTILE10 normalization reads (q01, q10, q50, q90, q99), from a seeded
    uniform sample of at most QUANTILE_ROWS rows per feature (exact below that)."""

    def __init__(self):
        self.acc: dict[str, list] = {}
        self.sample: dict[str, list] = {}  # name -> [rows seen, sample array]
        self.rng = np.random.default_rng(0)

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
        self._sample(name, np.where(ok, v, np.nan).astype(np.float32))

    def _sample(self, name: str, v: np.ndarray) -> None:
        """Reservoir sampling (algorithm R, vectorized per batch)."""
        seen, kept = self.sample.get(name, (0, v[:0]))
        room = max(QUANTILE_ROWS - len(kept), 0)
        kept = np.concatenate([kept, v[:room]])
        rest = v[room:]
        if len(rest):
            slot = self.rng.integers(0, seen + room + 1 + np.arange(len(rest)))
            take = slot < QUANTILE_ROWS
            kept[slot[take]] = rest[take]
        self.sample[name] = (seen + len(v), kept)

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
            kept = self.sample[name][1].astype(np.float64)
            for q in QUANTILES:
                if len(kept):
                    with warnings.catch_warnings():  # an all-NaN column gives NaN, written as 0 below
                        warnings.simplefilter("ignore", RuntimeWarning)
                        stats[f"q{q:02d}"] = np.nanquantile(kept, q / 100, axis=0)
                else:
                    stats[f"q{q:02d}"] = np.zeros_like(mean)
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
                   robot_type: str | None = None, progress: bool = False, labels: str = "all",
                   video: str | None = None) -> ExportSummary:
    """Write the episodes of ``items`` (in that order) as a LeRobot v3.0 dataset at ``out``, a new or empty
    folder. ``labels="trainable"``: only the labels training may use, each run of them (cut as dataset samples'
    runs are) one LeRobot episode whose ``action`` is the label target. ``video``: cameras as H.264 or AV1 mp4
    instead of PNG. Everything is written into a temporary sibling folder that is renamed into place at the
    end: a failed export leaves nothing at ``out``."""
    if labels not in LABELS:
        raise ExportError(f"labels must be one of {', '.join(LABELS)}, not {labels!r}")
    codec = video_codec(video) if video is not None else None
    pa, pq = _pa()
    final, tmp = start_output(out)
    try:
        summary = _write(pa, pq, items, tmp, fps=fps, robot_type=robot_type, progress=progress,
                         trainable_only=labels == "trainable", codec=codec)
        summary.out = str(final)
        finish_output(final, tmp)
    except BaseException:
        abandon_output(tmp)
        raise
    return summary


def video_codec(name: str) -> tuple[str, str, dict]:
    """(PyAV encoder, LeRobot codec name, options) of ``--video NAME``; one line when PyAV or its encoder is
    missing, before anything is written."""
    if name not in VIDEO_CODECS:
        raise ExportError(f"--video {name}: unknown codec; choose {' or '.join(VIDEO_CODECS)}")
    encoder, lerobot_name, options = VIDEO_CODECS[name]
    try:
        import av
    except ImportError:
        raise ExportError(f"--video {name} needs PyAV: pip install 'hg-dagger[export]'") from None
    try:
        av.codec.Codec(encoder, "w")
    except Exception:  # av.codec.codec.UnknownCodecError, whose import path differs across PyAV versions
        raise ExportError(f"--video {name}: this machine's PyAV (av {av.__version__}) has no {encoder} encoder; "
                          "export without --video (PNG frames) or install a PyAV build with it") from None
    return encoder, lerobot_name, options


@dataclass
class _Layout:
    """How the store's observation keys become LeRobot columns."""

    composed: dict[str, tuple[list[str], list[str]]]  # observation.state / environment_state -> (keys, dim names)
    obs_cols: dict[str, str]  # obs/<key> -> per-key column (non-camera keys)
    image_cols: dict[str, str]  # obs/<key> -> observation.images.<key>
    action_names: list[str]
    obs_names: set[str] = field(default_factory=set)  # every obs/<key> field of the export


def _layout(ep: EpisodeData, specs) -> _Layout:
    """observation.state = the state the policy sees (the task mapping's flattened keys, in flatten order; without
    a known mapping every non-camera key in field order), observation.environment_state = the mapping's goal keys;
    the per-key columns and cameras keep their names."""
    mapping = task_mapping(ep.info, specs)
    plain = [n[4:] for n, sp in specs.items() if not sp.image]
    if mapping is not None:
        state = mapping.state_keys()
        env = list(mapping.export.environment_state)
        names = {k: mapping.dim_names(k) for k in state}
        action_names = list(mapping.action.names)
    else:
        state, env = plain, []
        action_names = [f"a{i}" for i in range(ep.arrays["applied_action"].shape[1])]
        names = {k: [f"{k}_{i}" for i in range(int(np.prod(specs[f"obs/{k}"].shape, dtype=np.int64)))] for k in state}
    missing = [k for k in state + env if f"obs/{k}" not in specs]
    if missing:
        raise ExportError(f"episode {ep.info.episode_id}: task {ep.info.start.task.task_id} exports observation key "
                          f"{missing[0]!r} as its state, but the episode has no field obs/{missing[0]}")
    if not state:
        raise ExportError(f"episode {ep.info.episode_id}: no non-camera observation key to export as {STATE}")
    composed = {STATE: (state, [x for k in state for x in names[k]])}
    if env:
        composed[ENV_STATE] = (env, [x for k in env for x in names.get(k) or mapping.dim_names(k)])
    obs_cols, image_cols = {}, {}
    for n, sp in specs.items():
        col = obs_column(n[4:], sp.image)
        if sp.image:
            image_cols[n] = col
        elif col in composed:  # a key named like a composed column: written once, if it is all of it
            if composed[col][0] != [n[4:]]:
                raise ExportError(f"episode {ep.info.episode_id}: observation key {n[4:]!r} would be exported as "
                                  f"{col}, which holds the keys {composed[col][0]}; rename the key")
        else:
            obs_cols[n] = col
    return _Layout(composed, obs_cols, image_cols, action_names, set(specs))


def _write(pa, pq, items, root: Path, *, fps, robot_type, progress, trainable_only: bool, codec) -> ExportSummary:
    stats = _Stats()
    tasks: dict[str, int] = {}
    episodes_meta: dict[str, list] = {}
    writer = videos = None
    features: dict | None = None
    layout: _Layout | None = None
    index = 0
    trainable_total = 0
    source_eps = 0
    continuity = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="export", unit="ep", mininterval=1.0)
    for group in read_groups(items, allowed=trainable_only):
        cols_list, frames_list, pieces_meta = [], [], []
        for ep in group:
            fps = common_fps(ep, fps)
            source_eps += 1
            if layout is None:
                specs = obs_fields(ep.item.store, ep.info.episode_id)
                layout = _layout(ep, specs)
                features = _features(ep, specs, layout, codec, fps)
                schema = _schema(pa, features)
                writer = _DataWriter(root, schema)
                videos = _VideoWriter(root, codec, fps) if codec is not None else None
                first = ep.info.episode_id
            elif {n for n in ep.arrays if n.startswith("obs/")} != layout.obs_names:
                raise ExportError(f"episode {ep.info.episode_id}: observation keys differ from episode {first}'s")
            task = task_text(ep.info)
            task_index = tasks.setdefault(task, len(tasks))
            cont = ep.continuity(continuity)
            continuity = int(cont.max(initial=continuity - 1)) + 1
            if trainable_only:
                pieces = label_runs(ep.arrays["action_source"], ep.allowed, ep.windows)
            else:
                pieces = [(0, ep.num_steps)]
            for lo, hi in pieces:
                e = len(episodes_meta.get("episode_index", ()))
                cols = _episode_columns(ep, lo, hi, layout, features, index, e, task_index, fps, cont,
                                        label_action=trainable_only)
                frames = {name: ep.arrays[name][lo:hi] for name in layout.image_cols}
                for name, col in layout.image_cols.items():
                    stats.add_images(col, frames[name])
                if videos is not None:
                    for name, col in layout.image_cols.items():
                        videos.write(col, e, frames[name], episodes_meta)
                else:
                    frames_list.append(frames)
                cols_list.append(cols)
                _episode_meta(episodes_meta, ep, task, index, e, lo, hi,
                              trainable=int((ep.allowed if trainable_only else ep.trainable)[lo:hi].sum()))
                pieces_meta.append(e)
                index += hi - lo
                trainable_total += int(cols["trainable"].sum())
        if bar is not None:
            bar.update(len(group))
        if not cols_list:
            continue
        cols = {c: np.concatenate([x[c] for x in cols_list]) for c in cols_list[0]}
        frames = {n: np.concatenate([x[n] for x in frames_list]) for n in layout.image_cols} if videos is None else {}
        check_frames(cols["episode_index"], cols["frame_index"], cols["index"], cols["timestamp"], fps,
                     where=f"episodes {group[0].info.episode_id}..{group[-1].info.episode_id}")
        for col, v in cols.items():
            stats.add(col, v)
        table = _table(pa, cols, frames, layout.image_cols if videos is None else {}, schema)
        chunk, file = writer.location(table.nbytes)
        writer.add(table)
        episodes_meta["data/chunk_index"] += [chunk] * len(pieces_meta)
        episodes_meta["data/file_index"] += [file] * len(pieces_meta)
    if bar is not None:
        bar.close()
    if writer is None:
        raise ExportError("nothing to export: no episodes were given")
    writer.close()
    n_eps = len(episodes_meta.get("episode_index", ()))
    if n_eps == 0:
        raise ExportError(f"nothing to export: none of the {source_eps} episode(s) has a label training may use "
                          "(reviewed and authorized, or certified; `hg-dagger report STORE` lists what stopped them)")
    _write_episodes(pa, pq, root, episodes_meta)
    _write_tasks(pa, pq, root, tasks)
    with open(root / "meta" / "stats.json", "w") as f:
        json.dump(stats.to_json(set(layout.image_cols.values())), f, indent=2)
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
        "video_path": VIDEO_PATH if videos is not None else None,
        "features": features,
        "hg_dagger": {"exporter": "hg_dagger.datasets.export_lerobot", "schema_version": SCHEMA_VERSION,
                      "labels": "trainable" if trainable_only else "all",
                      "action": ("label target: expert_action where the label layer names it, else applied_action"
                                 if trainable_only else "applied_action"),
                      "state": layout.composed[STATE][0],
                      "environment_state": layout.composed.get(ENV_STATE, ([], []))[0],
                      "timestamp": "frame_index / fps", "trainable_frames": trainable_total,
                      # the declaration EmbodiChain's LeRobotDataSource takes (its default columns: observation.state,
                      # action)
                      "embodichain_schema": {
                          "version": 1,
                          "observation": {"timing": "pre_action", "dtype": "float32",
                                          "names": features[STATE]["names"]},
                          "action": {"semantics": "hg_dagger.label_target" if trainable_only else
                                     "hg_dagger.applied_action", "step_dt": 1.0 / fps, "dtype": "float32",
                                     "names": layout.action_names}},
                      "source_episodes": source_eps},
    }
    with open(root / "meta" / "info.json", "w") as f:
        json.dump(info, f, indent=4)
    files = sum(len(fs) for _, _, fs in os.walk(root))
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(root) for x in fs)
    return ExportSummary(out=str(root), format="lerobot", episodes=n_eps, frames=index, tasks=len(tasks), fps=fps,
                         files=files, trainable_frames=trainable_total, bytes=size, columns=list(features))


class _VideoWriter:
    """One mp4 per camera and LeRobot episode (videos/<camera>/chunk-CCC/file-FFF.mp4, FFF the episode's index
    within its chunk), frame i at pts i with time base 1 / fps, so frame times equal the rows' timestamps."""

    def __init__(self, root: Path, codec, fps: float):
        self.root = root
        self.encoder, self.name, self.options = codec
        self.fps = fps

    def write(self, col: str, episode: int, frames: np.ndarray, meta: dict[str, list]) -> None:
        from fractions import Fraction

        import av

        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration at info level
        chunk, file = divmod(episode, CHUNKS_SIZE)
        path = self.root / VIDEO_PATH.format(video_key=col, chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        rate = Fraction(self.fps).limit_denominator(1_000_000)
        with av.open(str(path), "w") as container:
            stream = container.add_stream(self.encoder, rate=rate, options=dict(self.options))
            stream.height, stream.width = int(frames.shape[1]), int(frames.shape[2])
            stream.pix_fmt = "yuv420p"
            stream.time_base = 1 / rate
            for i, f in enumerate(frames):
                rgb = f if f.shape[-1] == 3 else np.repeat(f[..., :1], 3, -1)
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts = i
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
        for k, v in ((f"videos/{col}/chunk_index", chunk), (f"videos/{col}/file_index", file),
                     (f"videos/{col}/from_timestamp", 0.0), (f"videos/{col}/to_timestamp", len(frames) / self.fps)):
            meta.setdefault(k, []).append(v)


def _features(ep: EpisodeData, specs, layout: _Layout, codec, fps: float) -> dict:
    a = ep.arrays["applied_action"].shape[1]
    feats: dict[str, dict] = {}
    for col, (_keys, names) in layout.composed.items():
        feats[col] = {"dtype": "float32", "shape": [len(names)], "names": names}
    for name, col in layout.image_cols.items():
        shape = list(specs[name].shape)
        feats[col] = {"dtype": "video" if codec else "image", "shape": shape, "names": ["height", "width", "channels"]}
        if codec and (shape[0] % 2 or shape[1] % 2):
            raise ExportError(f"{name}: camera frames are {shape[0]}x{shape[1]}; --video (yuv420p) needs an even "
                              "height and width; export without --video (PNG frames)")
        if codec:
            feats[col]["info"] = {"video.height": shape[0], "video.width": shape[1], "video.codec": codec[1],
                                  "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                                  "video.channels": 3, "has_audio": False}
    for name, col in layout.obs_cols.items():
        feats[col] = _feature(specs[name].dtype, tuple(specs[name].shape))
    feats["action"] = _feature("float32", (a,), layout.action_names)
    feats["expert_action"] = _feature("float32", (a,), layout.action_names)
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
        if ft["dtype"] == "video":  # in the mp4 files, not in the parquet
            continue
        if ft["dtype"] == "image":
            typ = _image_type(pa)
        else:
            base = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
            typ = base if ft["shape"] == [1] else pa.list_(base, int(np.prod(ft["shape"])))
        fields.append(pa.field(col, typ))
    return pa.schema(fields)


def _image_type(pa):
    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _episode_columns(ep: EpisodeData, lo: int, hi: int, layout: _Layout, features, index0: int, episode: int,
                     task_index: int, fps: float, continuity: np.ndarray, *, label_action: bool) -> dict[str, np.ndarray]:
    """Every non-camera column of steps [lo, hi) of one store episode (one LeRobot episode) as numpy, in the
    feature dtypes."""
    t = hi - lo
    sl = slice(lo, hi)
    frame = np.arange(t, dtype=np.int64)
    a = ep.arrays
    cols: dict[str, np.ndarray] = {}
    for col, (keys, _names) in layout.composed.items():
        cols[col] = np.concatenate([a[f"obs/{k}"][sl].reshape(t, -1).astype(np.float32) for k in keys], 1)
    for name, col in layout.obs_cols.items():
        cols[col] = a[name][sl]
    trainable = (ep.allowed if label_action else ep.trainable)[sl]
    cols["action"] = ep.label_action(lo, hi) if label_action else a["applied_action"][sl]
    cols["expert_action"] = a["expert_action"][sl]
    cols["expert_valid"] = a["expert_valid"][sl]
    cols["action_source"] = a["action_source"][sl]
    cols["intervene_flag"] = ep.intervention[sl] & trainable
    cols["trainable"] = trainable
    cols["label_mask"] = ep.label_mask[sl]
    cols["label_target"] = ep.label_target[sl]
    cols["segment_id"] = ep.segments()[sl]
    cols["segment_accepted"] = trainable
    cols["continuity_id"] = continuity[sl]
    cols["reward"] = a["reward"][sl]
    cols["done"] = a["terminated"][sl].astype(bool) | a["truncated"][sl].astype(bool)
    cols["is_success"] = a["success"][sl]
    cols["timestamp"] = (frame / fps).astype(np.float32)
    cols["frame_index"] = frame
    cols["episode_index"] = np.full(t, episode, np.int64)
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


def _episode_meta(meta: dict[str, list], ep: EpisodeData, task: str, index0: int, episode: int, lo: int, hi: int,
                  *, trainable: int) -> None:
    """One row of meta/episodes for steps [lo, hi) of a store episode (data/chunk_index and data/file_index are
    added per group)."""
    s = ep.info.start
    row = {
        "episode_index": episode,
        "tasks": [task],
        "length": hi - lo,
        "dataset_from_index": index0,
        "dataset_to_index": index0 + hi - lo,
        "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 0,
        "hg_dagger/store": str(ep.item.store.url),
        "hg_dagger/episode_id": ep.info.episode_id,
        "hg_dagger/task_id": s.task.task_id,
        "hg_dagger/first_step": int(lo),
        "hg_dagger/end_step": int(hi),
        "hg_dagger/label_version": ep.label_version,
        "hg_dagger/trainable_frames": trainable,
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
