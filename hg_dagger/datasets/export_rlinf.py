"""Export the trainable labels of episodes as one RLinf online-DAgger LeRobot shard.

RLinf's DAgger actor with ``algorithm.dagger.online_lerobot`` (RLinf commit a3816b59, 2026-08) loads, at start-up,
the shards it finds under ``<data_path>/rank_<r>/id_<n>/`` before new episodes arrive. Its reader there
(``RollingLeRobotDataset.archived_shard_info`` / ``_load_archived_shard_episodes``) takes the LeRobot v2.1 layout,
not v3.0: ``meta/info.json`` (its ``data_path`` formatted with ``episode_chunk`` and ``episode_index``),
``meta/episodes.jsonl``, ``meta/tasks.jsonl`` and one parquet per episode (plus ``meta/episodes_stats.jsonl`` and
the ``datasets`` feature types in each parquet, which a LeRobot v2.1 reader also needs); its MLP student reads the frame keys
``state`` and ``actions`` (``prepare_lerobot_sft_batch``), and ``intervene_flag`` selects chunks when
``only_save_expert`` is set. RLinf's loss has no per-frame mask, so the shard is training data and holds only the
labels the training boundary allows, the same ones ``export_lerobot(labels="trainable")`` writes
(source.training_mask: reviewed and authorized, or certified; QC passed; replay not mismatched), cut into runs the
same way (sequences.label_runs: at correction window boundaries and action source changes); each run is one shard
episode (nothing is interpolated across a gap), with ``actions`` = the label target (``expert_action`` in expert
windows, else ``applied_action``). A selection without such a label is refused in one line.
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
from hg_dagger.datasets.exporters import EXPORTERS, Exporter, ExportSummary, Training
from hg_dagger.datasets.feature_stats import FeatureStats
from hg_dagger.datasets.parquet import encode_pngs, pyarrow_modules
from hg_dagger.datasets.sequences import label_runs
from hg_dagger.datasets.source import (
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

CODEBASE_VERSION = "v2.1"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"


def export_rlinf(items: Iterable[ExportItem], out: str | os.PathLike, *, fps: float | None = None,
                 robot_type: str = "hg_dagger", progress: bool = False) -> ExportSummary:
    """Write the runs of labels training may use of the episodes of ``items`` (in that order) as one shard at
    ``out`` (a new or empty folder; RLinf looks for shards at ``<data_path>/rank_<r>/id_<n>``). Written into a
    temporary sibling and renamed into place at the end. An export without a single such label is an error."""
    pa, pq = pyarrow_modules()
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
    tasks: dict[str, int] = {}
    episodes: list[dict] = []
    episode_stats: list[dict] = []
    features: dict | None = None
    schema: Any = None  # pyarrow schema
    state_keys: list[str] = []
    cams: dict[str, str] = {}
    index = 0
    source_eps = 0
    bar = None
    if progress:
        bar = tqdm(desc="export", unit="ep", mininterval=1.0)
    for group in read_groups(items):
        for ep in group:
            fps = common_fps(ep, fps)
            source_eps += 1
            if features is None:
                specs = obs_fields(ep.item.store, ep.info.episode_id)
                state_keys = [n for n, s in specs.items() if not s.image]
                images = [n for n, s in specs.items() if s.image]
                cams = {n: ("image" if i == 0 else f"extra_view_image-{i - 1}") for i, n in enumerate(images)}
                features = _features(ep, specs, state_keys, cams)
                schema = _schema(pa, features)
            task_index = tasks.setdefault(task_text(ep.info), len(tasks))
            for seg, (lo, hi) in enumerate(label_runs(ep.arrays["action_source"], ep.trainable, ep.windows)):
                cols = _columns(ep, lo, hi, seg, state_keys, len(episodes), index, task_index, fps)
                check_frames(cols["episode_index"], cols["frame_index"], cols["index"], cols["timestamp"], fps,
                             where=f"episode {ep.info.episode_id} steps [{lo}, {hi})")
                arrays = []
                for f in schema:
                    if f.name in cols:
                        v = cols[f.name]
                        arrays.append(pa.array(v, type=f.type) if v.ndim == 1 else pa.FixedSizeListArray.from_arrays(
                            pa.array(np.ascontiguousarray(v).reshape(-1)), v.shape[1]))
                    else:
                        name = next(n for n, c in cams.items() if c == f.name)
                        arrays.append(pa.array([{"bytes": b, "path": None} for b in encode_pngs(ep.arrays[name][lo:hi])],
                                               type=f.type))
                e = len(episodes)
                path = root / DATA_PATH.format(episode_chunk=e // CHUNKS_SIZE, episode_index=e)
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.Table.from_arrays(arrays, schema=schema), path, compression="snappy")
                stats = FeatureStats()
                for col, v in cols.items():
                    stats.add(col, v)
                for name, col in cams.items():
                    stats.add_images(col, ep.arrays[name][lo:hi])
                episode_stats.append({"episode_index": e, "stats": stats.to_json(set(cams.values()))})
                episodes.append({"episode_index": e, "tasks": [task_text(ep.info)], "length": int(hi - lo),
                                 "hg_dagger_store": str(ep.item.store.url), "hg_dagger_episode_id": ep.info.episode_id,
                                 "hg_dagger_first_step": int(lo), "hg_dagger_label_version": ep.label_version,
                                 "hg_dagger_policy_version": ep.info.start.policy_version})
                index += int(hi - lo)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    if features is None:
        raise ExportError("nothing to export: no episodes were given")
    if not episodes:
        raise nothing_trainable(source_eps)
    meta = root / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    with open(meta / "episodes.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in episodes)
    with open(meta / "episodes_stats.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in episode_stats)
    with open(meta / "tasks.jsonl", "w") as f:
        f.writelines(json.dumps({"task_index": i, "task": t}) + "\n" for t, i in tasks.items())
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(episodes),
        "total_frames": index, "total_tasks": len(tasks), "total_videos": 0,
        "total_chunks": (len(episodes) - 1) // CHUNKS_SIZE + 1, "chunks_size": CHUNKS_SIZE,
        "fps": int(fps) if float(fps).is_integer() else float(fps), "splits": {"train": f"0:{len(episodes)}"},
        "data_path": DATA_PATH, "video_path": None, "features": features,
        "hg_dagger": {"exporter": "hg_dagger.datasets.export_rlinf", "schema_version": SCHEMA_VERSION,
                      "state": [n[4:] for n in state_keys], "cameras": {c: n[4:] for n, c in cams.items()},
                      "actions": "label target: expert_action in expert windows, else applied_action",
                      "training": Training.LABELS.value, "training_note": Training.LABELS.note,
                      "source_episodes": source_eps},
    }
    with open(meta / "info.json", "w") as f:
        json.dump(info, f, indent=4)
    files = sum(len(fs) for _, _, fs in os.walk(root))
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(root) for x in fs)
    return ExportSummary(out=str(root), format="rlinf", episodes=len(episodes), frames=index, tasks=len(tasks),
                         fps=fps, files=files, trainable_frames=index, bytes=size, columns=list(features))


def _features(ep: EpisodeData, specs, state_keys: list[str], cams: dict[str, str]) -> dict:
    d = sum(int(np.prod(specs[n].shape, dtype=np.int64)) for n in state_keys)
    a = ep.arrays["applied_action"].shape[1]
    feats: dict[str, dict] = {}
    for name, col in cams.items():
        feats[col] = {"dtype": "image", "shape": list(specs[name].shape), "names": ["height", "width", "channel"]}
    feats["state"] = {"dtype": "float32", "shape": [d], "names": ["state"]}
    feats["actions"] = {"dtype": "float32", "shape": [a], "names": ["actions"]}
    for col, dtype in (("done", "bool"), ("is_success", "bool"), ("intervene_flag", "bool"), ("segment_id", "int64"),
                       ("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                       ("index", "int64"), ("task_index", "int64")):
        feats[col] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


def _schema(pa, features: dict):
    """The parquet schema, with the Hugging Face ``datasets`` feature types in its metadata (what LeRobot v2.1
    writes): ``datasets`` then reads the camera columns as images, not as untyped structs."""
    fields: list = []
    hf: dict[str, Any] = {}
    for col, ft in features.items():
        if ft["dtype"] == "image":
            typ = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            hf[col] = {"_type": "Image"}
        else:
            base = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
            typ = base if ft["shape"] == [1] else pa.list_(base, ft["shape"][0])
            value = {"dtype": ft["dtype"], "_type": "Value"}
            hf[col] = value if ft["shape"] == [1] else {"feature": value, "length": ft["shape"][0], "_type": "Sequence"}
        fields.append(pa.field(col, typ))
    return pa.schema(fields, metadata={b"huggingface": json.dumps({"info": {"features": hf}}).encode()})


def _columns(ep: EpisodeData, lo: int, hi: int, seg: int, state_keys, episode: int, index0: int, task_index: int,
             fps: float) -> dict[str, np.ndarray]:
    a = ep.arrays
    n = hi - lo
    sl = slice(lo, hi)
    state = np.concatenate([a[k][sl].reshape(n, -1).astype(np.float32) for k in state_keys], 1)
    actions = ep.label_action(lo, hi)
    frame = np.arange(n, dtype=np.int64)
    return {
        "state": state,
        "actions": actions,
        "done": (a["terminated"][sl] | a["truncated"][sl]).astype(bool),
        "is_success": a["success"][sl].astype(bool),
        "intervene_flag": ep.intervention[sl],
        "segment_id": np.full(n, seg, np.int64),
        "timestamp": (frame / fps).astype(np.float32),
        "frame_index": frame,
        "episode_index": np.full(n, episode, np.int64),
        "index": index0 + frame,
        "task_index": np.full(n, task_index, np.int64),
    }


EXPORTERS.register("rlinf", Exporter(
    write=export_rlinf,
    description="LeRobot v2.1 shard for RLinf's online DAgger (<data_path>/rank_0/id_<n>): only the labels training "
                "may use, as lerobot --labels trainable",
    training=Training.LABELS))
