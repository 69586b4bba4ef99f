"""Export episodes as a LeRobot dataset, format v3.0 (what lerobot >= 0.4 reads with ``LeRobotDataset`` and
trains on with ``lerobot-train``).

Written with pyarrow alone (no lerobot, torch or datasets import): meta/info.json, meta/tasks.parquet,
meta/episodes/chunk-000/file-000.parquet, meta/stats.json (with quantiles), data/chunk-CCC/file-FFF.parquet, and
with ``video`` videos/<camera>/chunk-CCC/file-FFF.mp4 (PyAV). The state the policy sees is ``observation.state``
(the task mapping's flattened keys, named per dimension) and its goal ``observation.environment_state``; camera
frames are ``observation.images.<key>``, PNG bytes inside the parquet by default (lossless).

By default one store episode is one LeRobot episode with every step, and the label information travels per frame
(``trainable``: the training boundary, ``intervene_flag``, ``label_mask``, ``action_source``, ``segment_id``). With
``labels="trainable"`` only the labels training may use are written, each run of them one episode with the label
target as ``action``, for trainers without a per-frame mask. Columns: docs/datasets.md, "Exports".

This module writes the dataset (data files, meta/episodes, tasks, stats, info); the columns come from
lerobot_format, the mp4 files from lerobot_video, the statistics from feature_stats.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract import SCHEMA_VERSION
from hg_dagger.datasets.exporters import EXPORTERS, Exporter, ExportOption, ExportSummary, Training
from hg_dagger.datasets.feature_stats import FeatureStats
from hg_dagger.datasets.lerobot_format import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_MB,
    DATA_PATH,
    ENV_STATE,
    EPISODES_PATH,
    ROW_GROUP_ROWS,
    STATE,
    VIDEO_PATH,
    ColumnLayout,
    arrow_table,
    column_layout,
    episode_columns,
    lerobot_features,
    parquet_schema,
)
from hg_dagger.datasets.lerobot_video import VideoWriter, video_codec
from hg_dagger.datasets.parquet import pyarrow_modules
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
    nothing_trainable,
    obs_fields,
    read_groups,
    start_output,
    task_text,
)


class _DataWriter:
    """data/chunk-CCC/file-FFF.parquet files of about DATA_FILE_MB each; an episode never spans two files."""

    def __init__(self, root: Path, schema):
        self.root = root
        self.schema = schema
        self.chunk = self.file = 0
        self.writer: Any = None  # the open pq.ParquetWriter
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
        _, pq = pyarrow_modules()
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
        pa, _ = pyarrow_modules()
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
    pa, pq = pyarrow_modules()
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


def _write(pa, pq, items, root: Path, *, fps, robot_type, progress, trainable_only: bool, codec) -> ExportSummary:
    stats = FeatureStats()
    tasks: dict[str, int] = {}
    episodes_meta: dict[str, list] = {}
    writer: _DataWriter | None = None
    videos: VideoWriter | None = None
    features: dict | None = None
    layout: ColumnLayout | None = None
    index = 0
    trainable_total = 0
    source_eps = 0
    continuity = 0
    bar = None
    if progress:
        bar = tqdm(desc="export", unit="ep", mininterval=1.0)
    for group in read_groups(items):
        cols_list, frames_list, pieces_meta = [], [], []
        for ep in group:
            fps = common_fps(ep, fps)
            source_eps += 1
            if layout is None:
                specs = obs_fields(ep.item.store, ep.info.episode_id)
                layout = column_layout(ep, specs)
                features = lerobot_features(ep, specs, layout, codec, fps)
                schema = parquet_schema(pa, features)
                writer = _DataWriter(root, schema)
                videos = VideoWriter(root, codec, fps) if codec is not None else None
                first = ep.info.episode_id
            elif {n for n in ep.arrays if n.startswith("obs/")} != layout.obs_names:
                raise ExportError(f"episode {ep.info.episode_id}: observation keys differ from episode {first}'s")
            task = task_text(ep.info)
            task_index = tasks.setdefault(task, len(tasks))
            cont = ep.continuity(continuity)
            continuity = int(cont.max(initial=continuity - 1)) + 1
            if trainable_only:
                pieces = label_runs(ep.arrays["action_source"], ep.trainable, ep.windows)
            else:
                pieces = [(0, ep.num_steps)]
            for lo, hi in pieces:
                e = len(episodes_meta.get("episode_index", ()))
                cols = episode_columns(ep, lo, hi, layout, features, index, e, task_index, fps, cont,
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
                              trainable=int(ep.trainable[lo:hi].sum()))
                pieces_meta.append(e)
                index += hi - lo
                trainable_total += int(cols["trainable"].sum())
        if bar is not None:
            bar.update(len(group))
        if not cols_list:
            continue
        assert layout is not None and writer is not None  # set at the first episode
        cols = {c: np.concatenate([x[c] for x in cols_list]) for c in cols_list[0]}
        frames = {n: np.concatenate([x[n] for x in frames_list]) for n in layout.image_cols} if videos is None else {}
        check_frames(cols["episode_index"], cols["frame_index"], cols["index"], cols["timestamp"], fps,
                     where=f"episodes {group[0].info.episode_id}..{group[-1].info.episode_id}")
        for col, v in cols.items():
            stats.add(col, v)
        table = arrow_table(pa, cols, frames, layout.image_cols if videos is None else {}, schema)
        chunk, file = writer.location(table.nbytes)
        writer.add(table)
        episodes_meta["data/chunk_index"] += [chunk] * len(pieces_meta)
        episodes_meta["data/file_index"] += [file] * len(pieces_meta)
    if bar is not None:
        bar.close()
    if writer is None:
        raise ExportError("nothing to export: no episodes were given")
    assert layout is not None and features is not None  # set with the writer
    writer.close()
    n_eps = len(episodes_meta.get("episode_index", ()))
    if n_eps == 0:
        raise nothing_trainable(source_eps)
    training = Training.LABELS if trainable_only else Training.MASK
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
                      "training": training.value, "training_note": training.note,
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


EXPORTERS.register("lerobot", Exporter(
    write=export_lerobot,
    description="LeRobot v3.0 (lerobot >= 0.4, lerobot-train): every step with the training boundary per frame, or "
                "with --labels trainable only the labels training may use",
    training=lambda o: Training.LABELS if o.get("labels") == "trainable" else Training.MASK,
    options=(
        ExportOption("labels", "all = every step with the training boundary per frame (`trainable`); "
                     "trainable = only the labels training may use, each run of them one episode, action = the "
                     "label target (what lerobot-train, which has no per-frame mask, trains on)",
                     choices=LABELS, default="all"),
        ExportOption("video", "cameras as mp4 video (H.264 for OpenCV and browsers, AV1 for archives; lossy) "
                     "instead of PNG frames", choices=("h264", "av1")),
    )))
