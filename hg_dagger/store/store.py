"""EpisodeStore: create/open a store, list and filter episodes, load them, read and write label layers."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import zarr

from hg_dagger.contract.enums import EndReason, LabelMask, ReplayStatus
from hg_dagger.contract.schema import (
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    CorrectionWindow,
    EpisodeEnd,
    EpisodeStart,
    ExpertCertification,
    FieldSpec,
    QCResult,
    ReplayCheck,
    ReviewDecision,
)
from hg_dagger.errors import ContractError, StoreError
from hg_dagger.store import layout
from hg_dagger.store.batches import rebatch, to_tensordict
from hg_dagger.store.labels import LabelLayer
from hg_dagger.store.layer_rules import LABEL_INPUTS, fill_column, new_layer
from hg_dagger.store.recorder import Recorder
from hg_dagger.store.roster import parse_roster, roster_names
from hg_dagger.store.segment import EpisodeRecord, SegmentView, UncommittedSegment, read_many, read_rows

if TYPE_CHECKING:
    from tensordict import TensorDict
    from zarr.abc.store import Store

log = logging.getLogger(__name__)
_UNREAD = object()  # the reviewer roster is read on first use after each refresh


@dataclass(frozen=True)
class EpisodeInfo:
    """One catalog entry. An episode whose commit never happened (crash, kill -9, writer still running) has
    complete=False and an EpisodeEnd with end_reason=INCOMPLETE covering the steps that were flushed."""

    episode_id: str
    start: EpisodeStart
    end: EpisodeEnd
    complete: bool
    num_steps: int
    segment_id: str

    @property
    def task_id(self) -> str:
        return self.start.task.task_id


class EpisodeStore:
    """A zarr v3 episode store (layout: docs/data-format.md). Use create() or open(), not the constructor."""

    def __init__(self, url: str, zstore: Store, root: zarr.Group, mode: str):
        self.url = url
        self.mode = mode
        self._zstore = zstore
        self._root = root
        self._segs: dict[str, SegmentView] = {}
        self._eps: dict[str, EpisodeRecord] = {}
        self._damaged: list[tuple[str | None, str]] = []  # (episode_id or None, message)
        self._uncommitted: dict[str, str] = {}  # segment_id -> message (re-checked on every refresh)
        self._duplicates: list[str] = []
        self._dirty = True
        self._labelled: set[str] | None = None
        self._layer_cache: dict[tuple[str, int], LabelLayer] = {}
        self._roster: tuple[str, ...] | None | object = _UNREAD

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, url: str | os.PathLike[str], *, exist_ok: bool = False) -> EpisodeStore:
        """Create an empty store (mode "a"). With exist_ok=True an existing store is opened instead."""
        url = os.fspath(url)
        _refuse_a_file(url)
        zstore = layout.open_zarr_store(url, read_only=False)
        try:
            existing = zarr.open_group(zstore, mode="r")
        except Exception:
            existing = None
        if existing is not None:
            if exist_ok and layout.STORE_ATTR in existing.attrs:
                return cls.open(url, mode="a")
            raise StoreError(f"{url}: already exists (open it with EpisodeStore.open, or choose a new path)")
        try:
            # one write: a store killed while being created is either absent or complete (segments/ is created
            # again by the first recorder if it is missing)
            root = zarr.create_group(zstore, overwrite=False, attributes={layout.STORE_ATTR: {
                "format": layout.FORMAT, "format_version": layout.FORMAT_VERSION, "schema_version": SCHEMA_VERSION}})
            root.create_group(layout.SEGMENTS)
        except OSError as exc:  # full disk, read-only file system, no permission
            raise StoreError(f"{url}: cannot create an episode store here ({_os_reason(exc)})") from exc
        return cls(url, zstore, root, "a")

    @classmethod
    def open(cls, url: str | os.PathLike[str], mode: Literal["r", "a"] = "r") -> EpisodeStore:
        """Open an existing store. Raises StoreError naming the path if it is missing, not an episode store, of an
        unsupported schema version, or its root metadata is corrupt. Damaged segments or episodes do not prevent
        opening: they are listed in .damaged and reported by validate_store."""
        url = os.fspath(url)
        if mode not in ("r", "a"):
            raise ValueError(f"mode must be 'r' or 'a', got {mode!r}")
        _refuse_a_file(url)
        zstore = layout.open_zarr_store(url, read_only=True)  # a writable LocalStore would create a missing dir
        try:
            root = zarr.open_group(zstore, mode="r")
            meta = dict(root.attrs).get(layout.STORE_ATTR)
        except FileNotFoundError as exc:
            raise StoreError(f"{url}: no episode store here") from exc
        except Exception as exc:
            raise StoreError(f"{url}: not a readable zarr v3 store ({_one_line(exc)})") from exc
        if meta is None:
            raise StoreError(f"{url}: not an hg-dagger episode store (root attribute '{layout.STORE_ATTR}' missing)")
        if not isinstance(meta, dict):
            raise StoreError(f"{url}: root attribute '{layout.STORE_ATTR}' is not a mapping (got {type(meta).__name__})")
        if meta.get("format") != layout.FORMAT:
            raise StoreError(f"{url}: root attribute {layout.STORE_ATTR}.format is {meta.get('format')!r}, expected "
                             f"{layout.FORMAT!r}: not an hg-dagger episode store")
        if meta.get("schema_version") not in SUPPORTED_SCHEMA_VERSIONS:
            raise StoreError(f"{url}: schema_version {meta.get('schema_version')!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_SCHEMA_VERSIONS)})")
        if int(meta.get("format_version", -1)) != layout.FORMAT_VERSION:
            raise StoreError(f"{url}: store format_version {meta.get('format_version')!r} is not supported "
                             f"(this version reads {layout.FORMAT_VERSION})")
        if mode == "a":
            zstore = layout.open_zarr_store(url, read_only=False)
            root = zarr.open_group(zstore, mode="r+")
        store = cls(url, zstore, root, mode)
        store.refresh()
        for _eid, msg in store._damaged:
            log.warning("%s: %s", url, msg)
        for msg in store._uncommitted.values():
            log.debug("%s: %s", url, msg)
        return store

    def __repr__(self) -> str:
        return f"EpisodeStore({self.url!r}, mode={self.mode!r})"

    # ------------------------------------------------------------------ catalog

    def refresh(self) -> None:
        """Pick up segments, commits, label layers and the reviewer roster written since opening (by this or
        another process)."""
        self._labelled = None
        self._roster = _UNREAD
        try:
            names = [n for n in layout.list_dir(self._zstore, f"{layout.SEGMENTS}/")
                     if n != "zarr.json" and not n.endswith(".partial")]  # .partial: a write cut by a kill
        except Exception as exc:
            raise StoreError(f"{self.url}: cannot list segments ({_one_line(exc)})") from exc
        self._uncommitted = {}
        for sid in names:
            seg = self._segs.get(sid)
            try:
                if seg is None:
                    seg = SegmentView(self._root, sid)
                    self._segs[sid] = seg
                elif seg.closed and seg.log_read == seg.committed_log:
                    if seg.committed_log == 0:
                        self._uncommitted[sid] = _nothing_committed(sid)
                    continue
                else:
                    seg.reload()
                new = seg.read_log()
            except UncommittedSegment as exc:  # holds nothing; looked at again on the next refresh
                self._uncommitted[sid] = str(exc)
                continue
            except StoreError as exc:
                if (None, str(exc)) not in self._damaged:
                    self._damaged.append((None, str(exc)))
                continue
            if seg.committed_log == 0:  # its arrays exist, but no record is committed: it holds nothing (yet)
                self._uncommitted[sid] = _nothing_committed(sid)
            for ep in new:
                if ep.episode_id in self._eps:
                    self._duplicates.append(ep.episode_id)
                    self._damaged.append((ep.episode_id, f"episode {ep.episode_id}: id used twice "
                                                         f"(segments {self._eps[ep.episode_id].segment.segment_id} and {sid})"))
                    continue
                self._eps[ep.episode_id] = ep
            for problem in seg.problems:
                if problem not in self._damaged:
                    self._damaged.append(problem)
        self._dirty = False

    @property
    def root(self) -> zarr.Group:
        """The store's zarr root group (segments are written under it)."""
        return self._root

    def invalidate(self) -> None:
        """Forget the cached catalog: a recorder committed episodes, so the next read lists the segments again."""
        self._dirty = True

    def _catalog(self) -> dict[str, EpisodeRecord]:
        if self._dirty:
            self.refresh()
        return self._eps

    @property
    def damaged(self) -> list[tuple[str | None, str]]:
        """Problems found while reading the catalog: (episode_id or None, message)."""
        self._catalog()
        return list(self._damaged)

    @property
    def warnings(self) -> list[str]:
        """Conditions that are not damage: segments that hold nothing because they are being created or their
        creation was cut off (a kill, a full disk). Readers skip them; `hg-dagger validate` prints them."""
        self._catalog()
        return [self._uncommitted[sid] for sid in sorted(self._uncommitted)]

    @property
    def segments(self) -> list[str]:
        self._catalog()
        return sorted(self._segs)

    def has_episode(self, episode_id: str, *, refresh: bool = True) -> bool:
        return episode_id in (self._catalog() if refresh else self._eps)

    def _record(self, episode_id: str) -> EpisodeRecord:
        rec = self._catalog().get(episode_id)
        if rec is None:
            raise StoreError(f"{self.url}: no episode {episode_id!r}")
        return rec

    def info(self, episode_id: str) -> EpisodeInfo:
        return self._info(self._record(episode_id))

    def _info(self, rec: EpisodeRecord) -> EpisodeInfo:
        if rec.committed:
            end = rec.committed_end
            return EpisodeInfo(rec.episode_id, rec.start, end, True, end.num_steps, rec.segment.segment_id)
        n = len(rec.segment.rows_of(rec.ordinal))
        end = EpisodeEnd(end_reason=EndReason.INCOMPLETE, task_success=False, num_steps=n,
                         quality_flags=["incomplete"], events=list(rec.events))
        return EpisodeInfo(rec.episode_id, rec.start, end, False, n, rec.segment.segment_id)

    def episodes(
        self,
        *,
        task_id: str | None = None,
        mode: Any = None,
        split: Any = None,
        complete: bool | None = None,
        policy_version: str | None = None,
        operator: str | None = None,
        parent_episode_id: str | None = None,
        end_reason: Any = None,
        where: Callable[[EpisodeInfo], bool] | None = None,
    ) -> list[EpisodeInfo]:
        """Episodes in recording order, filtered by any of the given fields (enum or string values)."""
        out = []
        for rec in self._catalog().values():
            s = rec.start
            if task_id is not None and s.task.task_id != task_id:
                continue
            if mode is not None and s.mode.value != _val(mode):
                continue
            if split is not None and s.split.value != _val(split):
                continue
            if policy_version is not None and s.policy_version != policy_version:
                continue
            if operator is not None and s.operator != operator:
                continue
            if parent_episode_id is not None and s.parent_episode_id != parent_episode_id:
                continue
            is_complete = rec.committed
            if complete is not None and is_complete != complete:
                continue
            info = self._info(rec)
            if end_reason is not None and info.end.end_reason.value != _val(end_reason):
                continue
            if where is not None and not where(info):
                continue
            out.append(info)
        return out

    # ------------------------------------------------------------------ steps

    def fields(self, episode_id: str) -> dict[str, FieldSpec]:
        return dict(self._record(episode_id).segment.fields)

    def read_steps(
        self, episode_id: str, fields: Iterable[str] | None = None, steps: slice | Sequence[int] | None = None
    ) -> dict[str, np.ndarray]:
        """Raw per-step arrays of one episode as numpy (field name -> (T, ...)); steps selects a slice of steps."""
        rec = self._record(episode_id)
        seg = rec.segment
        rows = self._rows(rec)
        if steps is not None:
            rows = rows[steps] if isinstance(steps, slice) else rows[np.asarray(steps, np.int64)]
        names = list(seg.fields) if fields is None else list(fields)
        for name in names:
            if name not in seg.fields:
                raise StoreError(f"episode {episode_id}: no field '{name}' (fields: {', '.join(seg.fields)})")
        try:
            return dict(zip(names, read_many([seg.array(layout.data_path(n)) for n in names], rows), strict=True))
        except Exception:
            pass  # find the field that fails, to name it
        out = {}
        for name in names:
            try:
                out[name] = read_rows(seg.array(layout.data_path(name)), rows)
            except Exception as exc:
                raise StoreError(f"episode {episode_id}: field '{name}' unreadable in segment {seg.segment_id} "
                                 f"({_one_line(exc)})") from exc
        return out

    def _rows(self, rec: EpisodeRecord) -> np.ndarray:
        rows = rec.segment.rows_of(rec.ordinal)
        if rec.end is not None and len(rows) != rec.end.num_steps:
            raise StoreError(f"episode {rec.episode_id}: {len(rows)} stored steps but its end record says "
                             f"{rec.end.num_steps} (segment {rec.segment.segment_id} damaged)")
        return rows

    def load(
        self, episode_id: str, *, fields: Iterable[str] | None = None, steps: slice | Sequence[int] | None = None
    ) -> TensorDict:
        """One episode as a TensorDict [T]: every data field ("obs/rgb" becomes the nested key ("obs", "rgb")),
        plus "label_mask" and "label_target" (uint8 codes) from the latest label layer. uint16/uint32 arrays
        become int32/int64 tensors (torch has no arithmetic on them)."""
        arrays = self.read_steps(episode_id, fields, steps)
        layer = self.labels(episode_id)
        sel = slice(None) if steps is None else steps
        arrays["label_mask"] = layer.mask[sel]
        arrays["label_target"] = layer.target[sel]
        return to_tensordict(arrays)

    # ------------------------------------------------------------------ label layers

    def label_versions(self, episode_id: str) -> list[int]:
        rec = self._record(episode_id)
        versions = [1] if rec.committed else []
        if self._labelled is None:  # which episodes have layers >= 2: one listing per refresh
            self._labelled = set(layout.list_dir(self._zstore, f"{layout.LABELS}/"))
        if episode_id not in self._labelled:
            return versions
        prefix = f"{layout.LABELS}/{episode_id}/"
        for name in layout.list_dir(self._zstore, prefix):
            if name.startswith("v") and name.endswith(".json") and name[1:-5].isdigit():
                versions.append(int(name[1:-5]))
        return sorted(versions)

    def labels(self, episode_id: str, version: int | None = None) -> LabelLayer:
        """A label layer (the latest by default). Uncommitted episodes have only version 0: everything excluded."""
        rec = self._record(episode_id)
        versions = self.label_versions(episode_id)
        if not versions:
            if version not in (None, 0):
                raise StoreError(f"episode {episode_id}: incomplete, it has no label layer {version}")
            return LabelLayer.empty(len(rec.segment.rows_of(rec.ordinal)))
        v = versions[-1] if version is None else int(version)
        if v not in versions:
            raise StoreError(f"episode {episode_id}: no label layer {v} (layers: {versions})")
        cached = self._layer_cache.get((episode_id, v))
        if cached is not None:
            return cached
        try:
            if v == 1:
                data = rec.layer1
            else:
                raw = layout.get_bytes(self._zstore, f"{layout.LABELS}/{episode_id}/v{v}.json")
                data = None if raw is None else json.loads(raw)
            if not isinstance(data, dict):
                raise StoreError("missing, or not a JSON object")
            layer = LabelLayer.from_json(data)
        except Exception as exc:
            raise StoreError(f"episode {episode_id}: label layer {v} is corrupt ({_one_line(exc)})") from exc
        if len(layer.mask) != rec.committed_end.num_steps:
            raise StoreError(f"episode {episode_id}: label layer {v} covers {len(layer.mask)} steps, episode has "
                             f"{rec.committed_end.num_steps}")
        self._layer_cache[(episode_id, v)] = layer  # layers are immutable once written
        return layer

    def write_labels(
        self,
        episode_id: str,
        *,
        author: str,
        windows: Iterable[CorrectionWindow] | None = None,
        certifications: Iterable[ExpertCertification] | None = None,
        reviews: Iterable[ReviewDecision] | None = None,
        qc: Iterable[QCResult] | None = None,
        mask: np.ndarray | None = None,
        replay: ReplayCheck | None = None,
        note: str | None = None,
    ) -> int:
        """Add a label layer (never overwrites one); returns its version. Arguments left as None are carried over
        from the latest layer. Without a mask, mask and target follow contract.derive_labels; a given mask may
        only be stricter than those rules (ContractError otherwise). ``note`` says why the mask is stricter (an
        operator's discard reason); it travels with the mask: None keeps the latest layer's note when a mask is
        given (the latest mask carried over), and drops it when the mask is derived again."""
        self._writable()
        if not author:
            raise ContractError(f"episode {episode_id}: write_labels needs an author")
        rec = self._record(episode_id)
        if not rec.committed:
            raise ContractError(f"episode {episode_id}: incomplete (never committed); it cannot be labelled")
        end = rec.committed_end
        n = end.num_steps
        raw = self.read_steps(episode_id, [f for f in LABEL_INPUTS if f in rec.segment.fields])
        inputs = {k: raw.get(k, fill_column(rec.segment.fields.get(k), k, n)) for k in LABEL_INPUTS}
        given = {"windows": windows, "certifications": certifications, "reviews": reviews, "qc": qc}
        while True:
            # the new layer directly follows the one its carried-over parts come from: a layer another writer
            # adds in between takes our number, and we merge again from it (nothing it holds is dropped)
            prev = self.labels(episode_id)
            kept: dict[str, Any] = {k: (getattr(prev, k) if v is None else list(v)) for k, v in given.items()}
            layer = new_layer(episode_id, rec.start, end.quality_flags, n, inputs, prev.version + 1, author, mask,
                              replay=prev.replay if replay is None else replay,
                              note=note if note is not None else prev.note if mask is not None else "", **kept)
            key = f"{layout.LABELS}/{episode_id}/v{layer.version}.json"
            try:
                stored = layout.put_bytes(self._zstore, key, layout.dumps(layer.to_json()).encode(), exclusive=True)
            except OSError as exc:
                raise StoreError(f"{self.url}: episode {episode_id}: label layer {layer.version} not written "
                                 f"({_os_reason(exc)})") from exc
            if self._labelled is not None:
                # labels/<episode_id>/ exists now (ours, or another writer's that took our number): listing all of
                # labels/ again would cost time growing with the store on every write
                self._labelled.add(episode_id)
            if stored:
                return layer.version

    def replay_check(self, episode_id: str) -> ReplayCheck | None:
        """The latest replay verification of an episode (from its latest label layer); None if never replayed."""
        return self.labels(episode_id).replay

    def replay_status(self, episode_id: str) -> ReplayStatus:
        """The episode's current replay status: the latest check's, else the committed end record's (unverified)."""
        check = self.replay_check(episode_id)
        if check is not None:
            return check.status
        rec = self._record(episode_id)
        return rec.committed_end.replay_status if rec.committed else ReplayStatus.UNVERIFIED

    # ------------------------------------------------------------------ reviewer roster

    @property
    def reviewers(self) -> list[str] | None:
        """The store's reviewer roster: the pseudonyms whose training authorizations count; None when the store
        declares none (then anyone but a window's operator may authorize it). Read from the root attribute
        ``hg_dagger.reviewers`` (again after every refresh); StoreError naming the store if it is malformed."""
        if self._roster is _UNREAD:
            self._roster = self._read_roster()
        roster = self._roster
        return list(roster) if isinstance(roster, tuple) else None

    def _read_roster(self) -> tuple[str, ...] | None:
        try:
            raw = layout.get_bytes(self._zstore, "zarr.json")
            if raw is None:
                raise StoreError("zarr.json is missing")
            meta = json.loads(raw)["attributes"][layout.STORE_ATTR]
        except Exception as exc:
            raise StoreError(f"{self.url}: root metadata unreadable ({_one_line(exc)})") from exc
        return parse_roster(meta, self.url)

    def set_reviewers(self, reviewers: Iterable[str] | None) -> list[str] | None:
        """Declare the reviewer roster (pseudonyms, stripped, duplicates by case and whitespace dropped), or remove
        it with None. Returns the roster as stored. Takes effect for every later training selection, also on
        decisions made before: an authorization by someone off the roster authorizes nothing."""
        self._writable()
        names = None if reviewers is None else roster_names(reviewers, self.url)
        try:
            root = zarr.open_group(self._zstore, mode="r+")
            attrs: Any = dict(root.attrs)[layout.STORE_ATTR]  # a JSON object (hg_dagger.store)
            meta = dict(attrs)
            if names is None:
                meta.pop("reviewers", None)
            else:
                meta["reviewers"] = names
            root.update_attributes({layout.STORE_ATTR: meta})
        except OSError as exc:
            raise StoreError(f"{self.url}: reviewer roster not written ({_os_reason(exc)})") from exc
        self._roster = None if names is None else tuple(names)
        return None if names is None else list(names)

    # ------------------------------------------------------------------ writing and batches

    def recorder(self, flush_interval_s: float = 0.5, queue_steps: int = 8192, on_full: Literal["drop", "block"] = "drop",
                 queue_bytes: int = 256 << 20) -> Recorder:
        """A Recorder streaming new episodes into this store (see hg_dagger.store.recorder)."""
        self._writable()
        self._catalog()  # ids known now are refused by begin_episode without touching the disk again
        return Recorder(self, flush_interval_s=flush_interval_s, queue_steps=queue_steps, on_full=on_full,
                        queue_bytes=queue_bytes)

    def _writable(self) -> None:
        if self.mode != "a":
            raise StoreError(f"{self.url}: opened read-only (use EpisodeStore.open(url, mode='a'))")

    def iter_batches(
        self,
        batch_size: int,
        *,
        episodes: Iterable[EpisodeInfo | str] | None = None,
        fields: Iterable[str] | None = None,
        trainable_only: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        drop_last: bool = False,
        block_rows: int = 16384,
    ) -> Iterator[TensorDict]:
        """Step batches for training: TensorDict [B] with the fields, "label_mask", "label_target",
        "episode_index" (position in `episodes`) and "step". Reads whole row blocks per field (one zarr read
        per field and block) and shuffles within blocks and across block order. Default: all complete episodes."""
        infos = [self.info(e) if isinstance(e, str) else e for e in (episodes if episodes is not None else self.episodes(complete=True))]
        rng = np.random.default_rng(seed)
        by_seg: dict[str, list[tuple[int, EpisodeRecord]]] = {}
        for i, info in enumerate(infos):
            by_seg.setdefault(info.segment_id, []).append((i, self._record(info.episode_id)))
        if not by_seg:
            return
        common = set.intersection(*(set(self._segs[s].fields) for s in by_seg))
        names = sorted(common) if fields is None else list(fields)
        for n in names:
            if n not in common:
                raise StoreError(f"{self.url}: field '{n}' is not in every selected episode")
        blocks = []
        for sid, recs in by_seg.items():
            row_parts, meta_parts = [], []
            for i, rec in recs:
                r = self._rows(rec)
                layer = self.labels(rec.episode_id)
                m = np.stack([np.full(len(r), i, np.int64), np.arange(len(r)), layer.mask, layer.target], 1)
                if trainable_only:
                    keep = layer.mask == LabelMask.TRAINABLE.code
                    r, m = r[keep], m[keep]
                row_parts.append(r)
                meta_parts.append(m)
            rows = np.concatenate(row_parts)
            meta = np.concatenate(meta_parts)
            order = np.argsort(rows, kind="stable")
            rows, meta = rows[order], meta[order]
            for lo in range(0, len(rows), block_rows):
                blocks.append((sid, rows[lo:lo + block_rows], meta[lo:lo + block_rows]))
        if shuffle:
            rng.shuffle(blocks)
        yield from rebatch(self._read_blocks(blocks, names, rng if shuffle else None), batch_size, drop_last=drop_last)

    def _read_blocks(self, blocks: list[tuple[str, np.ndarray, np.ndarray]], names: list[str], rng: np.random.Generator | None) -> Iterator[dict[str, np.ndarray]]:
        """The fields of each row block, with its episode_index, step, label_mask and label_target (rows shuffled
        within the block with ``rng``)."""
        for sid, rows, meta in blocks:
            seg = self._segs[sid]
            try:
                data = dict(zip(names, read_many([seg.array(layout.data_path(n)) for n in names], rows), strict=True))
            except Exception as exc:
                raise StoreError(f"segment {sid}: fields unreadable ({_one_line(exc)})") from exc
            data["episode_index"], data["step"] = meta[:, 0], meta[:, 1]
            data["label_mask"], data["label_target"] = meta[:, 2].astype(np.uint8), meta[:, 3].astype(np.uint8)
            if rng is not None:
                perm = rng.permutation(len(rows))
                data = {k: v[perm] for k, v in data.items()}
            yield data


def _nothing_committed(segment_id: str) -> str:
    return str(UncommittedSegment(segment_id, "attributes with committed_log 0"))


def _refuse_a_file(url: str) -> None:
    """A local path that is a regular file is no store (zarr would fail on it with a bare OSError)."""
    path = layout.local_path(url)
    if path is not None and path.exists() and not path.is_dir():
        raise StoreError(f"{url}: is a file, not an episode store (a store is a folder: give an existing store or "
                         "a new path)")


def _os_reason(exc: OSError) -> str:
    return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")


def _val(v: Any) -> str:
    return str(getattr(v, "value", v))


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
