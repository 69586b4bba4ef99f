"""Export episodes as an ODS-compatible TensorDict: EmbodiChain's resident-data layout ([episode, time] batch axes,
``obs/...``, ``actions``, ``valid``, ``continuity_id``, segment fields), saved with tensordict's own memmap format.

    OUT/ods.json    schema (for TensorDataSource), source_id, fps, task texts, one record per row (store, episode)
    OUT/data/       TensorDict.load_memmap(OUT/"data") -> TensorDict [episodes, max_steps]

Read it back with ``load_ods(OUT)`` and hand it to ``embodichain.data_pipeline.datasets.TensorDataSource(td,
schema=..., source_id=...)``. Layout ``padded``: one row per episode, padded to the longest (``valid`` false,
identifiers -1); ``ragged``: episodes packed end to end into rows as long as the longest episode, so short episodes
cost no padding each. Every episode is its own ``continuity_id`` stretch (a new one after an invalid step or a
dropped frame), so a sampled context never joins two episodes. Each step carries the DAgger schema of the ODS
integration: obs, expert_action, executed_action, expert_used, valid, confidence, episode_id, iteration,
policy_version, beta, terminated, truncated, success. ``trainable`` is the training boundary per step (labels
reviewed and authorized, or certified; source.training_mask). A segment is a maximal run of steps sharing the
action source and the trainable flag; ``segment_accepted`` is that flag, so
``SequenceSpecCfg(sampling_mode="segment")`` samples only authorized labels and never crosses a handover.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract import SCHEMA_VERSION
from hg_dagger.datasets.exporters import EXPORTERS, Exporter, ExportOption, ExportSummary, Training
from hg_dagger.datasets.source import (
    ExportError,
    ExportItem,
    abandon_output,
    common_fps,
    episode_info,
    finish_output,
    obs_fields,
    read_episodes,
    start_output,
    task_text,
)

FORMAT = "hg_dagger.ods_export"
FORMAT_VERSION = 1
LAYOUTS = ("padded", "ragged")
ACTION_SEMANTICS = "hg_dagger.applied_action"  # the task's raw action, as applied to the robot

# per-step fields besides obs/...: (dtype, padding value)
_FIELDS = {
    "actions": ("float32", 0), "valid": ("bool", False), "expert_action": ("float32", 0),
    "executed_action": ("float32", 0), "expert_valid": ("bool", False), "expert_used": ("bool", False),
    "confidence": ("float32", np.nan), "episode_id": ("int64", -1), "iteration": ("int64", -1),
    "policy_version": ("int64", -1), "beta": ("float32", np.nan), "action_source": ("int64", -1), "intervention": ("bool", False),
    "trainable": ("bool", False), "label_mask": ("int64", -1), "label_target": ("int64", -1), "rewards": ("float32", 0),
    "terminated": ("bool", False), "truncated": ("bool", False), "success": ("bool", False),
    "episode_step": ("int64", -1), "continuity_id": ("int64", -1), "segment_id": ("int64", -1),
    "segment_step": ("int64", -1), "segment_start": ("bool", False), "segment_end": ("bool", False),
    "segment_accepted": ("bool", False), "segment_attempt_id": ("int64", -1), "task_index": ("int64", -1), "subtask_index": ("int64", -1),
}


def export_ods(items: Iterable[ExportItem], out: str | os.PathLike, *, fps: float | None = None,
               progress: bool = False, layout: str = "padded") -> ExportSummary:
    """Write the episodes of ``items`` (in that order) at ``out``, a new or empty folder: one row each
    (``layout="padded"``) or packed end to end into rows (``"ragged"``); written into a temporary sibling that is
    renamed into place at the end, so a failed export leaves nothing there."""
    # torch, tensordict deferred: seconds to import; only the code that uses them loads them
    import torch
    from tensordict import TensorDict

    if layout not in LAYOUTS:
        raise ExportError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    items = list(items)
    if not items:
        raise ExportError("nothing to export: no episodes were given")
    infos = [episode_info(it) for it in items]  # fails before anything is written
    t_max = max(i.num_steps for i in infos)
    places = _places([i.num_steps for i in infos], t_max, ragged=layout == "ragged")
    n_rows = places[-1][0] + 1
    first = items[0]
    specs = obs_fields(first.store, first.episode_id)
    a_dim = first.store.fields(first.episode_id)["applied_action"].shape[0]
    final, tmp = start_output(out)
    writer = None
    try:
        skeleton = {k: _lazy(torch, (n_rows, t_max), dtype) for k, (dtype, _) in _FIELDS.items()}
        for key in ("actions", "expert_action", "executed_action"):
            skeleton[key] = _lazy(torch, (n_rows, t_max, a_dim), "float32")
        obs: dict = {}
        for name, spec in specs.items():
            node = obs
            *parents, leaf = name[4:].split("/")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = _lazy(torch, (n_rows, t_max, *spec.shape), spec.dtype)
        skeleton["obs"] = obs
        # memmap_like lays out tensordict's memmap folder (metadata and one file per leaf); the rows are then
        # written with plain file writes, not through the memory maps, so written pages never count as our RSS
        td = TensorDict(skeleton, batch_size=[n_rows, t_max]).memmap_like(prefix=tmp / "data", num_threads=0)
        writer = _RowWriter(td)
        del td
        tasks: dict[str, int] = {}
        versions: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        trainable_total = 0
        continuity = 0
        row_segments = [0] * n_rows  # segment ids already used in each row
        bar = None
        if progress:
            bar = tqdm(total=n_rows, desc="export", unit="ep", mininterval=1.0)
        for ep in read_episodes(items, obs_keys=[n[4:] for n in specs]):
            fps = common_fps(ep, fps)
            task_index = tasks.setdefault(task_text(ep.info), len(tasks))
            s = ep.info.start
            row, offset = places[ep.index]
            values, continuity, segments = _row_values(
                ep, specs, task_index, continuity=continuity, segment0=row_segments[row],
                version_index=versions.setdefault(s.policy_version, len(versions)))
            row_segments[row] += segments
            writer.put(row, offset, values)
            trainable_total += int(ep.trainable.sum())
            rows.append({"row": row, "offset": offset, "store": str(ep.item.store.url), "episode_id": ep.info.episode_id,
                         "num_steps": ep.num_steps, "label_version": ep.label_version,
                         "trainable_steps": int(ep.trainable.sum()), "task_id": s.task.task_id,
                         "policy_version": s.policy_version, "operator": s.operator, "mode": s.mode.value,
                         "iteration": int(s.iteration), "beta": s.beta, "mapping_hash": s.mapping_hash,
                         "end_reason": ep.info.end.end_reason.value, "task_success": bool(ep.info.end.task_success)})
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        writer.close()
        assert fps is not None  # common_fps set it from the first episode
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "schema_version": SCHEMA_VERSION,
            "source_id": _source_id(rows),
            "fps": fps,
            "layout": layout,
            "training": Training.MASK.value, "training_note": Training.MASK.note,
            "schema": _schema(specs, fps, a_dim),
            "policy_versions": list(versions),  # policy_version per step indexes this list; episode_id "episodes"
            "language": {"task": {str(i): t for t, i in tasks.items()}, "subtask": {"0": ""}},
            "episodes": rows,
        }
        with open(tmp / "ods.json", "w") as f:
            json.dump(meta, f, indent=2)
        files = sum(len(fs) for _, _, fs in os.walk(tmp))
        size = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(tmp) for x in fs)
        summary = ExportSummary(out=str(final), format="ods", episodes=len(rows), frames=sum(r["num_steps"] for r in rows),
                                tasks=len(tasks), fps=fps, files=files, trainable_frames=trainable_total, bytes=size,
                                columns=sorted(_FIELDS) + sorted(specs))
        finish_output(final, tmp)
    except BaseException:
        if writer is not None:
            writer.close()
        abandon_output(tmp)
        raise
    return summary


def _lazy(torch, shape, dtype: str):
    """A full-shape tensor without the memory (memmap_like only needs shape and dtype)."""
    return torch.zeros((), dtype=getattr(torch, str(np.dtype(dtype)))).expand(*shape)


def _places(lengths: list[int], width: int, *, ragged: bool) -> list[tuple[int, int]]:
    """(row, first step in the row) of each episode: one row each, or packed in order into rows of ``width``."""
    if not ragged:
        return [(i, 0) for i in range(len(lengths))]
    out, row, used = [], 0, 0
    for n in lengths:
        if used and used + n > width:
            row, used = row + 1, 0
        out.append((row, used))
        used += n
    return out


def _row_values(ep, specs, task_index: int, *, continuity: int, segment0: int,
                version_index: int) -> tuple[dict[tuple[str, ...], np.ndarray], int, int]:
    """One episode's values of every leaf (T rows each), keyed by the leaf's TensorDict key; the next free
    continuity id, and how many segment ids the episode used (they count on from ``segment0`` within its row)."""
    t = ep.num_steps
    a = ep.arrays
    actions = a["applied_action"].astype(np.float32)
    valid = a["valid"].astype(bool) & np.isfinite(actions).all(1)
    for name, spec in specs.items():
        if not spec.image and np.issubdtype(spec.np_dtype, np.floating):
            valid &= np.isfinite(a[name].reshape(t, -1)).all(1)
    segs = ep.segments()
    seg_start = np.ones(t, bool)
    seg_start[1:] = segs[1:] != segs[:-1]
    seg_end = np.ones(t, bool)
    seg_end[:-1] = segs[1:] != segs[:-1]
    first = np.maximum.accumulate(np.where(seg_start, np.arange(t), 0))
    cont = ep.continuity(continuity)
    cont = np.where(valid, cont, -1)  # a step whose values are not finite is marked like an invalid one
    s = ep.info.start
    values = {
        "actions": np.where(valid[:, None], actions, 0).astype(np.float32),
        "valid": valid,
        "expert_action": a["expert_action"].astype(np.float32),
        "executed_action": actions,
        "expert_valid": a["expert_valid"].astype(bool),
        "expert_used": a["expert_used"].astype(bool),
        "confidence": a["policy_confidence"].astype(np.float32),
        "episode_id": np.full(t, ep.index, np.int64),
        "iteration": np.full(t, int(s.iteration), np.int64),
        "policy_version": np.full(t, version_index, np.int64),
        "beta": np.full(t, np.nan if s.beta is None else s.beta, np.float32),
        "action_source": a["action_source"].astype(np.int64),
        "intervention": ep.intervention,
        "trainable": ep.trainable & valid,
        "label_mask": ep.label_mask.astype(np.int64),
        "label_target": ep.label_target.astype(np.int64),
        "rewards": a["reward"].astype(np.float32),
        "terminated": a["terminated"].astype(bool),
        "truncated": a["truncated"].astype(bool),
        "success": a["success"].astype(bool),
        "episode_step": np.arange(t, dtype=np.int64),
        "continuity_id": cont,
        "segment_id": segment0 + segs,
        "segment_step": np.arange(t, dtype=np.int64) - first,
        "segment_start": seg_start,
        "segment_end": seg_end,
        "segment_accepted": ep.trainable[first],
        "segment_attempt_id": np.zeros(t, np.int64),
        "task_index": np.full(t, task_index, np.int64),
        "subtask_index": np.zeros(t, np.int64),  # no subtask text: one empty entry, so language resolves
    }
    out: dict[tuple[str, ...], np.ndarray] = {(key,): v for key, v in values.items()}
    for name in specs:
        v = a[name]
        if np.issubdtype(v.dtype, np.floating):
            v = np.where(valid.reshape(t, *([1] * (v.ndim - 1))), v, 0).astype(v.dtype)
        out[("obs", *name[4:].split("/"))] = v
    return out, int(cont.max(initial=continuity - 1)) + 1, int(segs.max(initial=-1)) + 1


class _RowWriter:
    """Writes rows of a memmap TensorDict into its leaf files: episodes are put at (row, first step), a row is
    written whole, padded, once the next row begins (and at close)."""

    def __init__(self, td):
        self.t_max = td.batch_size[1]
        self.leaves = {}
        for key, leaf in td.items(include_nested=True, leaves_only=True):
            key = key if isinstance(key, tuple) else (key,)
            dtype = np.dtype(str(leaf.dtype).removeprefix("torch."))
            pad = _FIELDS[key[0]][1] if key[0] in _FIELDS else 0
            self.leaves[key] = (os.open(leaf.filename, os.O_WRONLY), dtype, tuple(leaf.shape[2:]), pad)
        self.row = None
        self.buf: dict = {}

    def put(self, row: int, offset: int, values: dict[tuple[str, ...], np.ndarray]) -> None:
        if row != self.row:
            self._flush()
            self.row = row
            self.buf = {key: np.full((self.t_max, *shape), pad, dtype) for key, (_, dtype, shape, pad) in self.leaves.items()}
        for key, full in self.buf.items():
            v = values[key]
            full[offset:offset + len(v)] = v

    def _flush(self) -> None:
        if self.row is None:
            return
        for key, (fd, *_rest) in self.leaves.items():
            data = self.buf[key].tobytes()
            offset = self.row * len(data)
            while data:
                n = os.pwrite(fd, data, offset)
                data, offset = data[n:], offset + n
        self.row, self.buf = None, {}

    def close(self) -> None:
        self._flush()
        for fd, *_ in self.leaves.values():
            os.close(fd)
        self.leaves = {}


def _schema(specs, fps: float, a_dim: int) -> dict:
    """The declaration TensorDataSource validates: action semantics and step_dt, pre-action observations."""
    dtypes = {str(s.dtype) for s in specs.values()}
    observation: dict = {"timing": "pre_action", "keys": [n[4:] for n in specs]}
    if len(dtypes) == 1:
        observation["dtype"] = dtypes.pop()
    return {"version": FORMAT_VERSION, "observation": observation,
            "action": {"semantics": ACTION_SEMANTICS, "step_dt": 1.0 / fps, "dtype": "float32",
                       "names": [f"a{i}" for i in range(a_dim)]}}


def _source_id(rows: list[dict]) -> str:
    """A stable identity of the exported content: the same episodes in the same order give the same id."""
    h = hashlib.sha256()
    for r in rows:
        h.update(f"{r['store']}\0{r['episode_id']}\0{r['label_version']}\0{r['trainable_steps']}\n".encode())
    return f"hg_dagger:{h.hexdigest()[:16]}"


def load_ods(path: str | os.PathLike) -> tuple:
    """(TensorDict [episodes, steps] backed by the memory maps, metadata dict with "schema", "source_id",
    "language" and "episodes") of an export; the TensorDict and schema go straight into TensorDataSource."""
    # tensordict deferred: it imports torch (seconds); only an ODS export loads it
    from tensordict import TensorDict

    root = Path(path)
    try:
        with open(root / "ods.json") as f:
            meta = json.load(f)
    except FileNotFoundError as exc:
        raise ExportError(f"{root}: no ods.json here (not an ODS export)") from exc
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{root}: ods.json is not an {FORMAT} version {FORMAT_VERSION} export")
    return TensorDict.load_memmap(root / "data"), meta


EXPORTERS.register("ods", Exporter(
    write=export_ods,
    description="ODS-compatible TensorDict for EmbodiChain's TensorDataSource, with the DAgger schema and the "
                "training boundary per step (segment sampling draws only trainable segments)",
    training=Training.MASK,
    options=(ExportOption("layout", "padded = one row per episode, padded to the longest; ragged = "
                          "episodes packed end to end into rows, each its own continuity stretch",
                          choices=LAYOUTS, default="padded"),)))
