"""Segments: the shared arrays one recorder session appends to, and their commit protocol.

Commit protocol (what makes kill -9 safe): a flush first grows the arrays if needed, then writes the new rows of
every field and of rows/episode + rows/step, then appends its records to the log, and only then rewrites the
segment's attributes with the new committed_rows / committed_log. Every object write is atomic (rename on local
disk, a single PUT on object storage), so a reader sees either the old or the new commit; rows or log records past
the committed counts are ignored.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from dataclasses import dataclass, field

import numpy as np
import zarr

from hg_dagger.contract.schema import EpisodeEnd, EpisodeStart, Event, FieldSpec
from hg_dagger.errors import StoreError
from hg_dagger.store import layout


def new_segment_id() -> str:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{os.urandom(4).hex()}"


class SegmentWriter:
    """Appends rows and log records to one new segment. Used only by the recorder's writer thread."""

    def __init__(self, root: zarr.Group, fields: dict[str, FieldSpec]):
        self.segment_id = new_segment_id()
        self.fields = fields
        self.group = root.require_group(layout.SEGMENTS).create_group(self.segment_id)
        self.arrays = {name: layout.create_field_array(self.group, spec) for name, spec in fields.items()}
        self.rows_episode = layout.create_index_array(self.group, "rows/episode")
        self.rows_step = layout.create_index_array(self.group, "rows/step")
        self.log = layout.create_log_array(self.group)
        self.capacity = 0
        self.rows = 0
        self.log_len = 0
        self.next_ordinal = 0
        self._meta = {
            "segment_id": self.segment_id,
            "format_version": layout.FORMAT_VERSION,
            "fields": [spec.model_dump(mode="json") for spec in fields.values()],
            "created_wall": _dt.datetime.now(_dt.UTC).isoformat(),
            "writer": {"host": socket.gethostname(), "pid": os.getpid()},
            "committed_rows": 0,
            "committed_log": 0,
            "closed": False,
        }
        self._write_meta()

    def _all_arrays(self) -> list[zarr.Array]:
        return [*self.arrays.values(), self.rows_episode, self.rows_step]

    def _write_meta(self) -> None:
        self.group.attrs.put({layout.SEGMENT_ATTR: self._meta})

    def flush(self, columns: dict[str, np.ndarray], episode: np.ndarray, step: np.ndarray, records: list[dict]):
        """Append k rows (columns hold every field, shape (k, ...)) and log records, then commit both."""
        k = len(episode)
        if k:
            end = self.rows + k
            if end > self.capacity:
                self.capacity = -(-end // layout.CAPACITY_STEP) * layout.CAPACITY_STEP
                for arr in self._all_arrays():
                    arr.resize((self.capacity, *arr.shape[1:]))
            for name, arr in self.arrays.items():
                arr[self.rows:end] = columns[name]
            self.rows_episode[self.rows:end] = episode
            self.rows_step[self.rows:end] = step
        if records:
            n = len(records)
            self.log.resize((self.log_len + n,))
            self.log[self.log_len:self.log_len + n] = np.array([layout.dumps(r) for r in records], dtype=object)
        if k or records:
            self.rows += k
            self.log_len += len(records)
            self._meta.update(committed_rows=self.rows, committed_log=self.log_len)
            self._write_meta()

    def close(self) -> None:
        """Trim the arrays to the committed rows (readers with plain zarr then see exact shapes) and seal."""
        for arr in self._all_arrays():
            if arr.shape[0] != self.rows:
                arr.resize((self.rows, *arr.shape[1:]))
        self.capacity = self.rows
        self._meta["closed"] = True
        self._write_meta()


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


@dataclass
class EpisodeRecord:
    """Everything the log says about one episode (the catalog entry behind EpisodeInfo)."""

    episode_id: str
    segment: SegmentView
    ordinal: int
    start: EpisodeStart
    events: list[Event] = field(default_factory=list)
    end: EpisodeEnd | None = None
    layer1: dict | None = None  # label layer v1 as stored


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
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._index_rows = -1

    def reload(self) -> None:
        """Re-read the segment attributes (committed counts move while a writer is active)."""
        segment_id = self.segment_id
        try:
            self.group = self._root[self.path]
            meta = dict(self.group.attrs)[layout.SEGMENT_ATTR]
            self.fields = {d["name"]: FieldSpec.model_validate(d) for d in meta["fields"]}
            self.committed_rows = int(meta["committed_rows"])
            self.committed_log = int(meta["committed_log"])
            self.closed = bool(meta.get("closed", False))
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"segment {segment_id}: unreadable segment metadata ({_one_line(exc)})") from exc

    def read_log(self) -> list[EpisodeRecord]:
        """Parse log records committed since the last call; returns episodes that appeared."""
        if self.committed_log <= self.log_read:
            return []
        try:
            raw = self.group["log"][self.log_read:self.committed_log]
        except Exception as exc:
            raise StoreError(f"segment {self.segment_id}: log unreadable ({type(exc).__name__}: {exc})") from exc
        new = []
        for i, text in enumerate(raw, start=self.log_read):
            try:
                rec = json.loads(str(text))
                kind, ordinal = rec["type"], int(rec["ep"])
            except Exception as exc:
                self.problems.append((None, f"segment {self.segment_id}: log record {i} is corrupt ({exc})"))
                continue
            ep = self.records.get(ordinal)
            try:
                if kind == "begin":
                    start = EpisodeStart.model_validate(rec["start"])
                    ep = EpisodeRecord(start.episode_id, self, ordinal, start)
                    self.records[ordinal] = ep
                    new.append(ep)
                elif ep is None:
                    self.problems.append((None, f"segment {self.segment_id}: log record {i} ({kind}) for unknown episode #{ordinal}"))
                elif kind == "event":
                    ep.events.append(Event.model_validate(rec["event"]))
                elif kind == "end":
                    ep.end = EpisodeEnd.model_validate(rec["end"])
                elif kind == "labels":
                    ep.layer1 = rec["layer"]
            except Exception as exc:
                eid = ep.episode_id if ep else rec.get("start", {}).get("episode_id", f"#{ordinal}")
                self.problems.append((eid, f"episode {eid}: {kind} record invalid: {_one_line(exc)}"))
        self.log_read = self.committed_log
        return new

    def index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(order, starts, ends): rows of episode ordinal k are order[starts[k]:ends[k]], in step order."""
        if self._index is None or self._index_rows != self.committed_rows:
            n = self.committed_rows
            try:
                ep = self.group["rows/episode"][:n].astype(np.int64)
                st = self.group["rows/step"][:n].astype(np.int64)
            except Exception as exc:
                raise StoreError(f"segment {self.segment_id}: row index unreadable ({_one_line(exc)})") from exc
            order = np.lexsort((st, ep))
            n_eps = max(self.records, default=-1) + 1
            keys = np.arange(n_eps)
            sorted_ep = ep[order]
            starts = np.searchsorted(sorted_ep, keys, side="left")
            ends = np.searchsorted(sorted_ep, keys, side="right")
            self._index = (order, starts, ends)
            self._index_rows = n
        return self._index

    def rows_of(self, ordinal: int) -> np.ndarray:
        order, starts, ends = self.index()
        if ordinal >= len(starts):
            return np.zeros(0, np.int64)
        return order[starts[ordinal]:ends[ordinal]]

    def steps_of(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) == 0:
            return np.zeros(0, np.int64)
        return read_rows(self.group["rows/step"], rows).astype(np.int64)


def read_rows(arr: zarr.Array, rows: np.ndarray) -> np.ndarray:
    """Read the given (sorted) rows; one contiguous slice when they are contiguous."""
    if len(rows) == 0:
        return np.zeros((0, *arr.shape[1:]), arr.dtype)
    if len(rows) > 1 and not np.all(np.diff(rows) > 0):
        return arr.get_orthogonal_selection((rows,))
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo == len(rows):
        return arr[lo:hi]
    if hi - lo <= 2 * len(rows):
        return arr[lo:hi][rows - lo]
    return arr.get_orthogonal_selection((rows,))


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
