"""Segments: the shared arrays one recorder session appends to, and their commit protocol.

Commit protocol (what makes kill -9 safe): a flush first grows the arrays if needed, then writes the new rows of
every field and of rows/episode + rows/step, then appends its records to the log, and only then rewrites the
segment's attributes with the new committed_rows / committed_log. Every object write is atomic (rename on local
disk, a single PUT on object storage), so a reader sees either the old or the new commit; rows or log records past
the committed counts are ignored.

Creation protocol (what makes a kill or a full disk during creation harmless): the segment's group is created bare,
then every array, and only then are the segment attributes written. A group without them is *uncommitted*: it holds
nothing, readers skip it (docs/data-format.md) and validate only warns about it, so a creation cut short never
makes a store invalid.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
import socket
import time
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

from hg_dagger.contract.schema import EpisodeEnd, EpisodeStart, Event, FieldSpec
from hg_dagger.errors import StoreError
from hg_dagger.store import layout
from hg_dagger.store.shards import RowShardWriter, only_fill

log = logging.getLogger(__name__)


def new_segment_id() -> str:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{os.urandom(4).hex()}"


class SegmentWriter:
    """Appends rows and log records to one new segment. Used only by the recorder's writer thread."""

    def __init__(self, root: zarr.Group, fields: dict[str, FieldSpec]):
        self.segment_id = new_segment_id()
        self.fields = fields
        self.capacity = 0
        self.rows = 0
        self.log_len = 0
        self.next_ordinal = 0
        self._meta: dict[str, Any] = {
            "segment_id": self.segment_id,
            "format_version": layout.FORMAT_VERSION,
            "fields": [spec.model_dump(mode="json") for spec in fields.values()],
            "created_wall": _dt.datetime.now(_dt.UTC).isoformat(),
            "writer": {"host": socket.gethostname(), "pid": os.getpid()},
            "committed_rows": 0,
            "committed_log": 0,
            "closed": False,
        }
        segments = root.require_group(layout.SEGMENTS)
        try:
            # bare group first, then the arrays, then the attributes: readers only see a segment whose arrays exist
            self.group = segments.create_group(self.segment_id)
            made = layout.create_arrays(self.group, [
                *(layout.field_array_kwargs(spec) for spec in fields.values()),
                layout.index_array_kwargs("rows/episode"), layout.index_array_kwargs("rows/step"),
                layout.log_array_kwargs(),
            ])
            self._write_meta()
        except BaseException:
            _discard(root, f"{layout.SEGMENTS}/{self.segment_id}")
            raise
        self.arrays = dict(zip(fields, made[:len(fields)], strict=True))
        self.rows_episode, self.rows_step, self.log = made[len(fields):]
        self.log_capacity = 0
        # whole shard objects written directly (same bytes as zarr's, no shard of fill only; see shards.py), for every
        # array of a layout RowShardWriter reproduces; any other goes through zarr's setitem
        self._writers = {name: RowShardWriter(arr) for name, arr in self._named_rows().items()
                         if RowShardWriter.supports(arr)}

    def _named_rows(self) -> dict[str, zarr.Array[Any]]:
        """The arrays a flush appends rows to: every field, then the row index."""
        return {**self.arrays, "rows/episode": self.rows_episode, "rows/step": self.rows_step}

    def _write_meta(self) -> None:
        self.group.attrs.put({layout.SEGMENT_ATTR: self._meta})

    def flush(self, columns: dict[str, np.ndarray | list[np.ndarray]], episode: np.ndarray, step: np.ndarray,
              records: list[dict[str, Any]]) -> None:
        """Append k rows (columns hold every field, shape (k, ...), image fields may be lists of k frames) and
        log records, then commit both: every write of the flush completes before the segment attributes move."""
        k, n = len(episode), len(records)
        end = self.rows + k
        resizes = []
        if end > self.capacity:
            self.capacity = -(-end // layout.CAPACITY_STEP) * layout.CAPACITY_STEP
            resizes += [a.async_array.resize((self.capacity, *a.shape[1:])) for a in self._named_rows().values()]
        if self.log_len + n > self.log_capacity:
            self.log_capacity = -(-(self.log_len + n) // layout.LOG_CAPACITY_STEP) * layout.LOG_CAPACITY_STEP
            resizes.append(self.log.async_array.resize((self.log_capacity,)))
        if resizes:
            layout.gather(resizes)
        writes = []
        if k:
            sel = (slice(self.rows, end),)
            for name, arr in self._named_rows().items():
                col = episode if name == "rows/episode" else step if name == "rows/step" else columns[name]
                writer = self._writers.get(name)
                if writer is not None:
                    if writer.rows != self.rows:
                        raise StoreError(f"segment {self.segment_id}: {name} holds {writer.rows} rows, not {self.rows}")
                    writes += writer.append(col)
                    continue
                if isinstance(col, list):
                    col = np.stack(col)
                # rows past self.rows were never written and read as the fill value: all-fill columns need no write
                if not only_fill(col, arr.fill_value):
                    writes.append(arr.async_array.setitem(sel, col))
        if n:
            text = np.array([layout.dumps(r) for r in records], dtype=object)
            writes.append(self.log.async_array.setitem((slice(self.log_len, self.log_len + n),), text))
        if writes:
            layout.gather(writes)
        if k or n:
            self.rows += k
            self.log_len += n
            self._meta.update(committed_rows=self.rows, committed_log=self.log_len)
            self._write_meta()

    def close(self) -> None:
        """Trim the arrays to the committed rows (readers with plain zarr then see exact shapes) and seal."""
        resizes = [a.async_array.resize((self.rows, *a.shape[1:])) for a in self._named_rows().values() if a.shape[0] != self.rows]
        if self.log.shape[0] != self.log_len:
            resizes.append(self.log.async_array.resize((self.log_len,)))
        layout.gather(resizes)
        for writer in self._writers.values():  # nothing is appended after close
            writer.close()
        self.capacity, self.log_capacity = self.rows, self.log_len
        self._meta["closed"] = True
        self._write_meta()


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


class EpisodeRecord:
    """Everything the log says about one episode (the catalog entry behind EpisodeInfo). The end and label
    records are decoded on first use: opening a store with 10k episodes only decodes their starts."""

    def __init__(self, episode_id: str, segment: SegmentView, ordinal: int, start: EpisodeStart):
        self.episode_id, self.segment, self.ordinal, self.start = episode_id, segment, ordinal, start
        self.events: list[Event] = []
        self.end_text: str | None = None
        self.layer1_text: str | None = None
        self._end: EpisodeEnd | None = None
        self._layer1: dict[str, Any] | None = None

    @property
    def committed(self) -> bool:
        return self.end_text is not None and self.layer1_text is not None and self.end is not None

    @property
    def end(self) -> EpisodeEnd | None:
        if self._end is None and self.end_text is not None:
            try:
                head = _HEADER.match(self.end_text)
                body = self.end_text[head.end():] if head else ""
                if body.startswith('"end":') and body.endswith("}"):
                    self._end = EpisodeEnd.model_validate_json(body[len('"end":'):-1])
                else:
                    self._end = EpisodeEnd.model_validate(json.loads(self.end_text)["end"])
            except Exception as exc:
                self.segment.problems.append((self.episode_id, f"episode {self.episode_id}: end record invalid: "
                                                                f"{_one_line(exc)}"))
                self.end_text = None
        return self._end

    @property
    def committed_end(self) -> EpisodeEnd:
        """The end record of an episode its caller knows is committed (``committed``)."""
        end = self.end
        if end is None:
            raise StoreError(f"episode {self.episode_id}: not committed")
        return end

    @property
    def layer1(self) -> dict[str, Any] | None:
        if self._layer1 is None and self.layer1_text is not None:
            layer = json.loads(self.layer1_text)["layer"]
            self._layer1 = layer if isinstance(layer, dict) else None
        return self._layer1


_HEADER = re.compile(r'^\{"type":"(\w+)","ep":(\d+),')
_START_KEY = '"start":'


def _parse_start(text: str, head: re.Match[str] | None, rec: dict[str, Any] | None) -> EpisodeStart:
    """EpisodeStart of a begin record; our own records go straight through pydantic's JSON parser (fast)."""
    if rec is not None or head is None:
        return EpisodeStart.model_validate((rec if rec is not None else json.loads(text))["start"])
    body = text[head.end():]
    if not body.startswith(_START_KEY) or not body.endswith("}"):
        return EpisodeStart.model_validate(json.loads(text)["start"])
    return EpisodeStart.model_validate_json(body[len(_START_KEY):-1])


class UncommittedSegment(StoreError):
    """A segment that holds nothing: being created right now, or its creation was cut off (kill, full disk).
    Not damage: readers skip it and validate warns about it."""

    def __init__(self, segment_id: str, what: str):
        super().__init__(f"segment {segment_id}: uncommitted ({what}: being created, or its creation was cut off "
                         "by a kill or a full disk); it holds nothing and is skipped")
        self.segment_id = segment_id


class SegmentView:
    """Read side of one segment: committed counts, fields, parsed log and (lazily) the row index."""

    def __init__(self, root: zarr.Group, segment_id: str):
        self.segment_id = segment_id
        self.path = f"{layout.SEGMENTS}/{segment_id}"
        self._root = root
        self.reload()
        self.log_read = 0
        self.records: dict[int, EpisodeRecord] = {}
        self.problems: list[tuple[str | None, str]] = []  # (episode_id, message)
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._index_rows = -1
        self._arrays: dict[str, zarr.Array[Any]] = {}

    def reload(self) -> None:
        """Re-read the segment attributes (committed counts move while a writer is active). Raises
        UncommittedSegment for a segment whose creation has not finished (or was cut off), StoreError if its
        metadata is corrupt."""
        segment_id = self.segment_id
        try:
            group = self._root[self.path]
        except Exception as exc:
            if layout.get_bytes(self._root.store, f"{self.path}/zarr.json") is None:
                raise UncommittedSegment(segment_id, "a folder without group metadata") from None
            try:  # the writer may have created the group between the two reads
                group = self._root[self.path]
            except Exception:
                raise StoreError(f"segment {segment_id}: unreadable segment metadata ({_one_line(exc)})") from exc
        if not isinstance(group, zarr.Group):
            raise StoreError(f"segment {segment_id}: an array where the segment's group should be")
        self.group = group
        try:
            meta: Any = dict(self.group.attrs).get(layout.SEGMENT_ATTR)  # JSON, checked by the reads below
            if meta is None:
                raise UncommittedSegment(segment_id, f"a group without the '{layout.SEGMENT_ATTR}' attribute")
            fields: dict[str, FieldSpec] = {d["name"]: FieldSpec.model_validate(d) for d in meta["fields"]}
            committed_rows, committed_log = int(meta["committed_rows"]), int(meta["committed_log"])
            closed = bool(meta.get("closed", False))
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"segment {segment_id}: unreadable segment metadata ({_one_line(exc)})") from exc
        if committed_log == 0 and not closed and "log" not in self.group:
            # written by a version that gave the group its attributes before creating the arrays
            raise UncommittedSegment(segment_id, "attributes but no arrays")
        self.fields, self.committed_rows, self.committed_log, self.closed = fields, committed_rows, committed_log, closed

    def read_log(self) -> list[EpisodeRecord]:
        """Parse log records committed since the last call; returns episodes that appeared."""
        if self.committed_log <= self.log_read:
            return []
        try:
            log_array = self.group["log"]  # opened anew: the writer grows it
            assert isinstance(log_array, zarr.Array), "the segment's log is a group"
            raw = read_many([log_array], slice(self.log_read, self.committed_log))[0]
        except Exception as exc:
            raise StoreError(f"segment {self.segment_id}: log unreadable ({type(exc).__name__}: {exc})") from exc
        new = []
        for i, text in enumerate(raw, start=self.log_read):
            text = str(text)
            head = _HEADER.match(text)
            try:
                if head is None:  # written by another tool: decode it whole
                    rec = json.loads(text)
                    kind, ordinal = str(rec["type"]), int(rec["ep"])
                else:
                    kind, ordinal = head.group(1), int(head.group(2))
                    rec = json.loads(text) if kind == "event" else None
            except Exception as exc:
                self.problems.append((None, f"segment {self.segment_id}: log record {i} is corrupt ({_one_line(exc)})"))
                continue
            ep = self.records.get(ordinal)
            try:
                if kind == "begin":
                    start = _parse_start(text, head, rec)
                    ep = EpisodeRecord(start.episode_id, self, ordinal, start)
                    self.records[ordinal] = ep
                    new.append(ep)
                elif ep is None:
                    self.problems.append((None, f"segment {self.segment_id}: log record {i} ({kind}) for unknown episode #{ordinal}"))
                elif kind == "event":
                    ep.events.append(Event.model_validate(rec["event"]))
                elif kind == "end":
                    ep.end_text = text
                elif kind == "labels":
                    ep.layer1_text = text
            except Exception as exc:
                eid = ep.episode_id if ep else (rec or {}).get("start", {}).get("episode_id", f"#{ordinal}")
                self.problems.append((eid, f"episode {eid}: {kind} record invalid: {_one_line(exc)}"))
        self.log_read = self.committed_log
        return new

    def array(self, name: str) -> zarr.Array[Any]:
        """A field or index array of this segment (handles are cached: opening one costs a metadata read)."""
        arr = self._arrays.get(name)
        if arr is None:
            found = self.group[name]
            if not isinstance(found, zarr.Array):
                raise StoreError(f"segment {self.segment_id}: {name} is a group, not an array")
            arr = self._arrays[name] = found
        return arr

    def index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(order, starts, ends, steps): rows of episode ordinal k are order[starts[k]:ends[k]] in step order,
        their step numbers steps[starts[k]:ends[k]]."""
        if self._index is None or self._index_rows != self.committed_rows:
            n = self.committed_rows
            try:
                if n == 0:  # arrays may not exist yet in a segment killed while being created
                    ep = st = np.zeros(0, np.int64)
                else:
                    ep, st = read_many([self.array("rows/episode"), self.array("rows/step")], slice(0, n))
                    ep, st = ep.astype(np.int64), st.astype(np.int64)
            except Exception as exc:
                raise StoreError(f"segment {self.segment_id}: row index unreadable ({_one_line(exc)})") from exc
            order = np.lexsort((st, ep))
            n_eps = max(self.records, default=-1) + 1
            keys = np.arange(n_eps)
            sorted_ep = ep[order]
            starts = np.searchsorted(sorted_ep, keys, side="left")
            ends = np.searchsorted(sorted_ep, keys, side="right")
            self._index = (order, starts, ends, st[order])
            self._index_rows = n
        return self._index

    def rows_of(self, ordinal: int) -> np.ndarray:
        order, starts, ends, _ = self.index()
        if ordinal >= len(starts):
            return np.zeros(0, np.int64)
        return order[starts[ordinal]:ends[ordinal]]

    def steps_of(self, ordinal: int) -> np.ndarray:
        order, starts, ends, steps = self.index()
        if ordinal >= len(starts):
            return np.zeros(0, np.int64)
        return steps[starts[ordinal]:ends[ordinal]]


def _selection(rows: np.ndarray | slice) -> tuple[str, Any, np.ndarray | None]:
    """How to read `rows` (sorted row numbers or a slice): ('slice', sl, None) or ('span', sl, idx) or ('o', rows)."""
    if isinstance(rows, slice):
        return "slice", rows, None
    if len(rows) > 1 and not np.all(np.diff(rows) > 0):
        return "o", rows, None
    if len(rows) == 0:
        return "slice", slice(0, 0), None
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo == len(rows):
        return "slice", slice(lo, hi), None
    if hi - lo <= 2 * len(rows):
        return "span", slice(lo, hi), rows - lo
    return "o", rows, None


READ_TRIES = 5
"""Reads of a row range tried before an error is final (see read_many)."""


def read_many(arrays: list[zarr.Array[Any]], rows: np.ndarray | slice) -> list[np.ndarray]:
    """Read the same rows of several arrays with one round of concurrent reads.

    A live writer replaces a shard file atomically, but a reader takes a shard in two reads (its index, then
    the chunk's bytes): when the file is replaced between them the chunk decodes as garbage. That read is torn,
    not damaged, so it is tried again (READ_TRIES times, 10-80 ms apart) before the error stands."""
    kind, sel, idx = _selection(rows)
    for attempt in range(READ_TRIES):
        if kind == "o":
            coros = [a.async_array.get_orthogonal_selection((sel,)) for a in arrays]
        else:
            coros = [a.async_array.getitem((sel,)) for a in arrays]
        try:
            out = layout.gather(coros)
            break
        except Exception:  # noqa: BLE001 - a codec's error on a torn read; the last try raises it
            if attempt == READ_TRIES - 1:
                raise
            time.sleep(0.01 * 2**attempt)
    return [o[idx] if idx is not None else o for o in out]


def read_rows(arr: zarr.Array[Any], rows: np.ndarray) -> np.ndarray:
    return read_many([arr], rows)[0]


def _discard(root: zarr.Group, path: str) -> None:
    """Best effort: remove what a failed segment creation left (it is uncommitted either way; readers skip it),
    with the temporary file of a metadata write that the failure cut short beside it (zarr writes
    ``zarr.json`` of the parent group through ``zarr.<id>.partial``)."""
    parent, name = path.rsplit("/", 1)

    def left() -> list[str]:
        return [n for n in layout.list_dir(root.store, f"{parent}/")
                if n == name or (n.startswith("zarr.") and n.endswith(".partial"))]

    try:
        # zarr's writes of the failed creation run in threads that may still be finishing (one failure does not
        # wait for the others): remove, let them settle, and remove again what they wrote meanwhile
        for _ in range(20):
            for n in left():
                if n == name:
                    sync(root.store.delete_dir(path))
                else:
                    sync(root.store.delete(f"{parent}/{n}"))
            time.sleep(0.05)
            if not left():
                return
        log.warning("could not remove the uncommitted segment %s (still written to); readers skip it", path)
    except Exception as exc:  # noqa: BLE001 - the original failure is what the caller reports
        log.warning("could not remove the uncommitted segment %s (%s); readers skip it", path, _one_line(exc))


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
