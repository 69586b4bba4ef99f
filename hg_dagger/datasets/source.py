"""What every export reads: the episodes to export (with their per-step label information), read in store order
with bounded memory, and the output folder written beside its final place and renamed into it at the end.

An export takes an iterable of ExportItem (a store, an episode id, and optionally the per-step ``trainable`` mask
the caller decided, e.g. a dataset manifest's authorization rule); without a mask the training boundary decides
(``training_mask``: the label layer's trainable steps that the contract's training rule allows). Every format
reads that one mask as ``EpisodeData.trainable``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hg_dagger.contract.enums import INTERVENTION_SOURCES, LabelMask, LabelTarget, StepFlag
from hg_dagger.contract.schema import FieldSpec
from hg_dagger.datasets.exporters import ExportError
from hg_dagger.envs.mapping import ExportNames, TaskMapping, load_mapping
from hg_dagger.errors import ConfigError, ContractError, EnvError, StoreError

if TYPE_CHECKING:  # the store (zarr) is loaded by whoever opens one, not when the commands list the formats
    from hg_dagger.store import EpisodeInfo, EpisodeStore

# Per-step fields every export reads besides the observations (all are contract step fields).
STEP_FIELDS = ("applied_action", "expert_action", "expert_valid", "expert_used", "policy_confidence", "action_source",
               "step_flags", "reward", "valid", "terminated", "truncated", "success")
_TRAINABLE = LabelMask.TRAINABLE.code
_CONTEXT = LabelMask.CONTEXT_ONLY.code
_EXPERT = LabelTarget.EXPERT_ACTION.code
LABELS = ("all", "trainable")  # what an export writes: every step, or only training-allowed labels
ROW_BUDGET_BYTES = 64 << 20  # rows read per store round trip: about this many bytes of step data


@dataclass(frozen=True)
class ExportItem:
    """One episode to export. ``trainable`` (bool per step) is the caller's training mask (a dataset version's
    rule); without it the training boundary decides (``training_mask``). ``label_version`` picks the label layer
    read for the mask and target codes (default: the latest)."""

    store: EpisodeStore
    episode_id: str
    trainable: np.ndarray | None = None
    label_version: int | None = None


@dataclass
class EpisodeData:
    """One episode read for export: its arrays (field name -> (T, ...)) and label information."""

    index: int  # position in the export (LeRobot episode_index, ODS row)
    item: ExportItem
    info: EpisodeInfo
    arrays: dict[str, np.ndarray]
    label_mask: np.ndarray  # uint8 LabelMask codes after the boundary: TRAINABLE exactly where `trainable`
    label_target: np.ndarray  # uint8 LabelTarget codes of the layer read (which array supervises a trainable step)
    label_version: int
    trainable: np.ndarray  # bool (T,): the labels training may use (training_mask), the one mask every format writes
    windows: list = field(default_factory=list)  # the label layer's CorrectionWindows
    extra: dict = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return self.info.num_steps

    @property
    def intervention(self) -> np.ndarray:
        """The executed action came from a person or the expert."""
        return np.isin(self.arrays["action_source"], INTERVENTION_SOURCES)

    def segments(self) -> np.ndarray:
        """int64 (T,): index of the maximal run of steps sharing the trainable flag and the action source, so a
        sequence window restricted to one segment never straddles a handover or mixes labels with context."""
        src = self.arrays["action_source"]
        change = np.ones(len(src), bool)
        change[1:] = (src[1:] != src[:-1]) | (self.trainable[1:] != self.trainable[:-1])
        return np.cumsum(change).astype(np.int64) - 1

    def continuity(self, first_id: int) -> np.ndarray:
        """int64 (T,): ids of the stretches of continuous recording, counting up from ``first_id``: a stretch
        ends at an invalid step (which gets -1) and before a step flagged DROPPED_FRAME_BEFORE."""
        valid = self.arrays["valid"].astype(bool)
        dropped = (self.arrays["step_flags"].astype(np.int64) & StepFlag.DROPPED_FRAME_BEFORE.value) != 0
        new = valid.copy()
        new[1:] &= ~valid[:-1] | dropped[1:]
        ids = first_id + np.cumsum(new) - 1
        return np.where(valid, ids, -1).astype(np.int64)

    def label_action(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """float32 (n, A): each step's label target (expert_action where the layer names it, else
        applied_action); a trainable step without a finite target is an error naming it."""
        sl = slice(lo, self.num_steps if hi is None else hi)
        expert = self.label_target[sl] == _EXPERT
        a = self.arrays
        target = np.where(expert[:, None], a["expert_action"][sl], a["applied_action"][sl]).astype(np.float32)
        bad = np.flatnonzero(self.trainable[sl] & ~np.isfinite(target).all(1))
        if len(bad):
            raise ExportError(f"episode {self.info.episode_id} step {sl.start + int(bad[0])}: trainable step without "
                              f"a finite label ({'expert_action' if expert[bad[0]] else 'applied_action'})")
        return target


def task_text(info: EpisodeInfo) -> str:
    """The task string exported for an episode: its language instruction, else its task id."""
    return info.start.task.language_instruction or info.start.task.task_id


def select(store: EpisodeStore, *, task_id: str | None = None, episodes: Sequence[str] | None = None) -> list[ExportItem]:
    """Items for the CLI: the named episodes (ids in the order given) or every complete episode of the store,
    optionally of one task. An unknown or incomplete episode is an error naming it."""
    if episodes:
        items = []
        for eid in episodes:
            if not store.has_episode(eid):
                raise ExportError(f"{store.url}: no episode {eid!r}")
            info = store.info(eid)
            if not info.complete:
                raise ExportError(f"{store.url}: episode {eid} is incomplete (never committed); it has no labels")
            if task_id is not None and info.task_id != task_id:
                raise ExportError(f"{store.url}: episode {eid} is of task {info.task_id!r}, not {task_id!r}")
            items.append(ExportItem(store, eid))
        return items
    infos = store.episodes(task_id=task_id, complete=True)
    if not infos:
        what = f" of task {task_id!r}" if task_id else ""
        raise ExportError(f"{store.url}: no complete episode{what} to export")
    return [ExportItem(store, i.episode_id) for i in infos]


def read_episodes(items: Iterable[ExportItem], obs_keys: Sequence[str] | None = None,
                  row_budget_bytes: int = ROW_BUDGET_BYTES) -> Iterator[EpisodeData]:
    """Episodes in the order given, each with STEP_FIELDS, its obs/<key> arrays and its training mask
    (EpisodeData.trainable; see read_groups)."""
    for group in read_groups(items, obs_keys, row_budget_bytes):
        yield from group


def read_groups(items: Iterable[ExportItem], obs_keys: Sequence[str] | None = None,
                row_budget_bytes: int = ROW_BUDGET_BYTES) -> Iterator[list[EpisodeData]]:
    """Episodes in the order given, in groups: consecutive items of one store are read together, about
    ``row_budget_bytes`` of step data at a time, with one block read per field (``iter_batches`` without
    shuffling), so memory stays bounded and many short episodes do not cost one store round trip each."""
    group: list[tuple[int, ExportItem, EpisodeInfo]] = []
    group_bytes = 0
    n = 0
    row_bytes: dict[tuple[int, str], int] = {}
    for item in items:
        info = episode_info(item)
        key = (id(item.store), info.segment_id)
        if key not in row_bytes:
            row_bytes[key] = _row_bytes(item.store, info)
        size = row_bytes[key] * info.num_steps
        if group and (group[0][1].store is not item.store or group_bytes + size > row_budget_bytes):
            yield list(_read_group(group, obs_keys))
            group, group_bytes = [], 0
        group.append((n, item, info))
        group_bytes += size
        n += 1
    if group:
        yield list(_read_group(group, obs_keys))


def episode_info(item: ExportItem) -> EpisodeInfo:
    """The episode's info, or an ExportError naming the episode when its store cannot read it."""
    try:
        info = item.store.info(item.episode_id)
    except StoreError as exc:
        raise ExportError(str(exc)) from exc
    if not info.complete:
        raise ExportError(f"{item.store.url}: episode {item.episode_id} is incomplete (never committed); "
                          "it has no labels and cannot be exported")
    if item.trainable is not None and np.shape(item.trainable) != (info.num_steps,):
        raise ExportError(f"episode {item.episode_id}: trainable mask has shape {np.shape(item.trainable)}, "
                          f"expected ({info.num_steps},)")
    return info


def _row_bytes(store: EpisodeStore, info: EpisodeInfo) -> int:
    return sum(int(np.prod(s.shape, dtype=np.int64)) * s.np_dtype.itemsize for s in store.fields(info.episode_id).values()) or 1


def obs_fields(store: EpisodeStore, episode_id: str) -> dict[str, FieldSpec]:
    """obs/<key> -> FieldSpec of one episode's observation fields."""
    return {n: s for n, s in store.fields(episode_id).items() if n.startswith("obs/")}


def _read_group(group: list[tuple[int, ExportItem, EpisodeInfo]], obs_keys: Sequence[str] | None) -> Iterator[EpisodeData]:
    store = group[0][1].store
    first = group[0][2].episode_id
    keys = list(obs_keys) if obs_keys is not None else [n[4:] for n in obs_fields(store, first)]
    names = [f"obs/{k}" for k in keys] + list(STEP_FIELDS)
    seg_fields: dict[str, dict] = {}
    for _, _item, info in group:
        if info.segment_id not in seg_fields:
            seg_fields[info.segment_id] = store.fields(info.episode_id)
        have = seg_fields[info.segment_id]
        missing = [n for n in names if n not in have]
        if missing:
            raise ExportError(f"{store.url}: episode {info.episode_id} has no field '{missing[0]}' "
                              f"(every exported episode needs the same observation keys: {', '.join(keys)})")
    infos = [info for _, _, info in group]
    total = sum(i.num_steps for i in infos)
    buffers: dict[int, dict] = {j: {} for j in range(len(group))}
    try:
        for batch in store.iter_batches(max(total, 1), episodes=infos, fields=names, shuffle=False,
                                        block_rows=max(total, 1)):
            epi = batch["episode_index"].numpy()
            step = batch["step"].numpy()
            order = np.lexsort((step, epi))
            epi, step = epi[order], step[order]
            flat = {n: batch[tuple(n.split("/"))].numpy()[order] for n in names}
            edges = np.concatenate([[0], np.flatnonzero(np.diff(epi)) + 1, [len(epi)]])
            for lo, hi in zip(edges[:-1], edges[1:], strict=True):
                if hi <= lo:
                    continue
                parts = buffers[int(epi[lo])]
                parts.setdefault("_step", []).append(step[lo:hi])
                for n in names:
                    parts.setdefault(n, []).append(flat[n][lo:hi])
    except StoreError as exc:
        raise ExportError(str(exc)) from exc
    for j, (n_out, item, info) in enumerate(group):
        parts = buffers.pop(j)
        steps = np.concatenate(parts.pop("_step")) if parts else np.zeros(0, np.int64)
        if len(steps) != info.num_steps or (len(steps) and np.any(np.sort(steps) != np.arange(info.num_steps))):
            raise ExportError(f"{store.url}: episode {info.episode_id}: read {len(steps)} steps, expected "
                              f"{info.num_steps} (store damaged?)")
        have = seg_fields[info.segment_id]
        if len(parts[names[0]]) == 1:  # the usual case: the episode came in one batch, already in step order
            arrays = {n: _restore_dtype(have[n].np_dtype, v[0]) for n, v in parts.items()}
        else:
            order = np.argsort(steps, kind="stable")
            arrays = {n: _restore_dtype(have[n].np_dtype, np.concatenate(v)[order]) for n, v in parts.items()}
        layer = store.labels(info.episode_id, item.label_version)
        trainable = training_mask(item, info, layer.mask)
        mask = np.where(trainable, _TRAINABLE, np.where(layer.mask == _TRAINABLE, _CONTEXT, layer.mask))
        yield EpisodeData(index=n_out, item=item, info=info, arrays=arrays, label_mask=mask.astype(np.uint8),
                          label_target=layer.target, label_version=layer.version, trainable=trainable,
                          windows=list(layer.windows))


def training_mask(item: ExportItem, info: EpisodeInfo, layer_mask: np.ndarray) -> np.ndarray:
    """bool (T,): the labels training may use, the one rule every export applies: the caller's mask where it gave
    one (a dataset version's rule, re-checked when the version is read), else the label layer's trainable steps
    that the contract's training boundary allows (``contract.training_selection`` under the store's reviewer
    roster, through ``store.trainable.selection``, the reader the trainer uses: reviewed and authorized, or
    certified; QC passed; replay not mismatched)."""
    if item.trainable is not None:
        return np.asarray(item.trainable, bool)
    # deferred: the store (zarr) loads when an export reads one, not when the commands list the formats
    from hg_dagger.store.trainable import selection

    return (np.asarray(layer_mask) == _TRAINABLE) & selection(item.store, info).allowed


def nothing_trainable(episodes: int) -> ExportError:
    """The one line a training-labels export (Training.LABELS) gives when its selection holds no label training
    may use."""
    return ExportError(f"nothing to export: none of the {episodes} episode(s) has a label training may use "
                       "(reviewed and authorized, or certified; `hg-dagger report STORE` lists what stopped them)")


def task_mapping(info: EpisodeInfo, specs: dict) -> TaskMapping | None:
    """The TaskMapping an episode was recorded under (its stored copy; the shipped task's export naming when the
    stored copy predates it), or the shipped task's when the episode has none and the shipped observation keys
    fit the stored ones; None when neither is known (exports then name the state by key)."""
    try:
        shipped = load_mapping(info.start.task.task_id)
    except (ConfigError, EnvError):
        shipped = None
    mapping: TaskMapping | None = None
    if info.start.mapping:
        try:
            mapping = TaskMapping.from_metadata(info.start.mapping)
        except ConfigError:
            mapping = None
    if mapping is None:
        fits = shipped is not None and {f"obs/{k}": (tuple(s), str(d)) for k, (s, d) in shipped.obs_spec().items()} == {
            n: (tuple(sp.shape), str(sp.dtype)) for n, sp in specs.items()}
        return shipped if fits else None
    if mapping.export == ExportNames() and shipped is not None and shipped.hash == mapping.hash:
        return shipped
    return mapping


def _restore_dtype(want: np.dtype, a: np.ndarray) -> np.ndarray:
    """iter_batches widens uint16/uint32 for torch; give them their stored dtype back."""
    return a if a.dtype == want else a.astype(want)


# ---------------------------------------------------------------------- output folder


_CREATED: dict[Path, list[Path]] = {}  # temporary folder -> parent folders start_output made for it
_EXPORT_MARKERS = {"meta/info.json": "a LeRobot export", "ods.json": "an ODS export"}


def start_output(out: str | os.PathLike) -> tuple[Path, Path]:
    """(final path, temporary sibling to write into). Refuses a file or a non-empty folder at ``out``; missing
    parent folders are made (and removed again if the export fails)."""
    final = Path(out).absolute()
    _check_target(final)
    made = []
    parent = final.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise ExportError(f"{parent}: is not a folder; the export cannot be written under it")
    for d in reversed(made):
        d.mkdir()
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    _CREATED[tmp] = made
    return final, tmp


def _check_target(final: Path) -> None:
    if final.is_file() or final.is_symlink():
        raise ExportError(f"{final}: exists and is not a folder; choose a new output folder")
    if final.is_dir() and any(final.iterdir()):
        what = next((kind for marker, kind in _EXPORT_MARKERS.items() if (final / marker).is_file()), None)
        if what:
            raise ExportError(f"{final}: holds {what} already; export into a new or empty folder (remove the old "
                              "one first to replace it)")
        raise ExportError(f"{final}: folder is not empty; export into a new or empty folder")


def finish_output(final: Path, tmp: Path) -> None:
    """Move the finished export into place in one rename (an empty folder at ``final`` is replaced)."""
    _check_target(final)
    if final.is_dir():
        final.rmdir()
    os.replace(tmp, final)
    _CREATED.pop(tmp, None)


@contextmanager
def output_folder(out: str | os.PathLike) -> Iterator[Path]:
    """``with output_folder(out) as tmp:`` write the export into ``tmp``; it is renamed to ``out`` (a new or empty
    folder) when the block ends, and removed, with the parent folders made for it, when the block fails."""
    final, tmp = start_output(out)
    try:
        yield tmp
        finish_output(final, tmp)
    except BaseException:
        abandon_output(tmp)
        raise


def abandon_output(tmp: Path) -> None:
    """Remove a failed export's temporary folder and the parent folders made for it."""
    shutil.rmtree(tmp, ignore_errors=True)
    for d in _CREATED.pop(tmp, []):
        try:
            d.rmdir()
        except OSError:  # no longer empty: something else wrote there meanwhile
            break


def common_fps(eps: EpisodeData, fps: float | None) -> float:
    """The export's frame rate: the first episode's control_hz unless given; every episode must match it."""
    hz = float(eps.info.start.control_hz)
    if fps is None:
        return hz
    if abs(hz - fps) > 1e-9 * fps:
        raise ExportError(f"episode {eps.info.episode_id}: control_hz {hz:g} differs from the export's fps {fps:g} "
                          "(export episodes of one rate together)")
    return fps


def check_frames(episode_index: np.ndarray, frame_index: np.ndarray, index: np.ndarray, timestamp: np.ndarray,
                 fps: float, *, where: str) -> None:
    """The invariants LeRobot's loader assumes but does not check: per episode frame_index 0..T-1 without gaps,
    a global index that counts up by one, and timestamp == frame_index / fps exactly (float32)."""
    if len(index) and np.any(np.diff(index) != 1):
        raise ContractError(f"{where}: global index is not contiguous")
    starts = np.ones(len(episode_index), bool)
    starts[1:] = episode_index[1:] != episode_index[:-1]
    expect = np.arange(len(frame_index)) - np.maximum.accumulate(np.where(starts, np.arange(len(frame_index)), 0))
    if np.any(frame_index != expect):
        bad = int(np.flatnonzero(frame_index != expect)[0])
        raise ContractError(f"{where}: episode {int(episode_index[bad])} frame_index is not contiguous at row {bad}")
    want = (frame_index / fps).astype(np.float32)
    if np.any(timestamp != want):
        bad = int(np.flatnonzero(timestamp != want)[0])
        raise ContractError(f"{where}: episode {int(episode_index[bad])} timestamp {float(timestamp[bad])!r} != "
                            f"frame_index / fps at row {bad}")
