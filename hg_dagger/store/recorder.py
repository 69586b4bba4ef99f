"""The recorder: the control loop hands steps over in O(1); a background thread writes them to the store.

put() appends to a bounded in-memory queue and returns; it never touches the disk. put_rows() hands over one step of
each of k episodes as (k, ...) columns, as a vectorised control loop holds them: the writer keeps them whole instead of
one dict per row and field, which is what makes many envs cheap. The writer thread drains the
queue, turns steps into columns and commits them at most flush_interval_s later (see segment.py for the commit
protocol). When the queue is full, on_full="drop" drops the step, counts it and records it (a fill row with
valid=False keeps step numbering, a DROPPED_STEPS event, EpisodeEnd.dropped_steps); on_full="block" waits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Protocol

import numpy as np

from hg_dagger.contract.clock import now_ns, wall_stamp
from hg_dagger.contract.enums import EventKind
from hg_dagger.contract.labels import derive_labels
from hg_dagger.contract.schema import (
    CorrectionWindow,
    EpisodeEnd,
    EpisodeStart,
    Event,
    ExpertCertification,
    FieldSpec,
)
from hg_dagger.errors import ContractError, StoreError, failure_reason
from hg_dagger.store.columns import as_column, concat_parts, describe_value, field_error, stack_values
from hg_dagger.store.labels import LabelLayer
from hg_dagger.store.layout import array_fill, fill_rows
from hg_dagger.store.segment import SegmentWriter


class RecordTarget(Protocol):
    """What a recorder needs of its store (an ``EpisodeStore``, which builds it and so sits above this module)."""

    url: str

    @property
    def root(self) -> Any: ...

    def has_episode(self, episode_id: str, *, refresh: bool = True) -> bool: ...

    def invalidate(self) -> None: ...

log = logging.getLogger(__name__)

# The writer drains the queue in batches, not step by step: each wake-up takes the GIL from the control loop
# (which gives it up in every torch call), so waking once per tick made the student's act ~1.5x slower.
_DRAIN_INTERVAL_S = 0.02
_MAX_PENDING_BYTES = 64 << 20  # flush early when this much step data waits in memory (bounds memory at high rates)


@dataclass
class RecorderStats:
    queued_steps: int = 0  # accepted by put()
    dropped_steps: int = 0  # rejected by put() because the queue was full (on_full="drop")
    written_steps: int = 0  # committed to the store (including fill rows for dropped steps)
    committed_episodes: int = 0
    flushes: int = 0
    max_queue: int = 0


_LABEL_INPUTS = ("action_source", "valid", "step_flags", "expert_valid")


@dataclass(eq=False)
class _Episode:
    eid: str
    start: EpisodeStart
    fields: dict[str, FieldSpec]
    key: tuple[Any, ...]
    step_bytes: int = 0
    capacity: int = 0  # queue length at which put() drops or blocks, for this episode's step size
    next_step: int = 0  # control side: number of put() calls so far
    dropped: int = 0  # control side
    ended: bool = False  # control side
    error: Exception | None = None  # set by the writer (bad step); raised by the next call for this episode
    error_reported: bool = False
    # writer side
    segment: SegmentWriter | None = None
    ordinal: int = -1
    # (step_number, dict) from put() or (step_number, _Rows, row) from put_rows()
    pending: list[tuple[Any, ...]] = field(default_factory=list)
    flushed_next: int = 0  # next step number to be written
    dropped_steps: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    end_msg: tuple[Any, ...] | None = None
    label_cols: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in _LABEL_INPUTS})


@dataclass(eq=False)
class _Rows:
    """One put_rows() call: step ``steps[i]`` of episode ``eps[i]`` is row i of every column."""

    eps: list[_Episode]
    steps: list[int]
    cols: dict[str, Any]
    joined: dict[str, Any] | None = None  # writer side: the flush's columns of every batch of these fields
    offset: int = 0  # this batch's first row in ``joined``


class Recorder:
    """Streams episodes into an EpisodeStore. Obtain one with EpisodeStore.recorder(); use from one control thread.

    Arrays handed to put() are owned by the recorder afterwards: do not modify them in place. Call close() (or use
    a with-block): a process that exits without it is treated like a crash (see docs/data-format.md).
    """

    def __init__(
        self,
        store: RecordTarget,
        *,
        flush_interval_s: float = 0.5,
        queue_steps: int = 8192,
        on_full: Literal["drop", "block"] = "drop",
        queue_bytes: int = 256 << 20,
    ):
        if on_full not in ("drop", "block"):
            raise ValueError(f"on_full must be 'drop' or 'block', got {on_full!r}")
        if flush_interval_s <= 0 or queue_steps <= 0:
            raise ValueError("flush_interval_s and queue_steps must be positive")
        self._store = store
        self.flush_interval_s = float(flush_interval_s)
        self.queue_steps = int(queue_steps)
        self.queue_bytes = int(queue_bytes)
        self.on_full = on_full
        self.stats = RecorderStats()
        self._q: deque[Any] = deque()
        self._steps_in = 0  # control side: steps queued; with _steps_out (writer side) gives the queue length
        self._steps_out = 0
        self._keys: dict[tuple[int, ...], tuple[tuple[Any, ...], tuple[Any, ...], int]] = {}
        self._episodes: dict[str, _Episode] = {}
        self._seen: set[str] = set()
        self._segments: dict[tuple[Any, ...], SegmentWriter] = {}
        self._fatal: Exception | None = None
        # put_rows' last check of a row set, valid while no episode stopped taking steps since (the generation)
        self._rows_checked: tuple[tuple[str, ...], int, list[_Episode], int] | None = None
        self._generation = 0  # bumped when an episode ends or fails, and when the writer fails
        self._closing = False
        self._closed = False
        self._wake = threading.Event()  # set when the queue fills past a quarter of an episode's room, and at close
        self._thread = threading.Thread(target=self._run, name="hg-dagger-recorder", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ control-loop side

    def begin_episode(self, start: EpisodeStart, fields: dict[str, FieldSpec]) -> str:
        self._check_alive()
        eid = start.episode_id
        if eid in self._seen or self._store.has_episode(eid, refresh=False):
            raise ContractError(f"episode {eid}: episode_id already used in this store")
        if not fields:
            raise ContractError(f"episode {eid}: no fields given (use contract.step_fields(...))")
        for name, spec in fields.items():
            if name != spec.name:
                raise ContractError(f"episode {eid}: fields key '{name}' != FieldSpec.name '{spec.name}'")
        key, nbytes = self._field_key(fields)
        ep = _Episode(eid=eid, start=start, fields=dict(fields), key=key, step_bytes=nbytes,
                      capacity=max(1, min(self.queue_steps, self.queue_bytes // max(nbytes, 1))))
        self._episodes[eid] = ep
        self._seen.add(eid)
        self._q.append(("begin", ep))
        return eid

    def put(self, eid: str, step: dict[str, Any]) -> bool:
        """Hand one step over; returns False if it was dropped because the queue was full."""
        ep = self._open(eid)
        n = ep.next_step
        ep.next_step = n + 1
        if not self._room(ep.capacity):
            ep.dropped += 1
            self.stats.dropped_steps += 1
            return False
        self._q.append((ep, n, step))
        self._steps_in += 1
        self.stats.queued_steps += 1
        self._wake_if_filling(ep.capacity)
        return True

    def put_rows(self, eids: Sequence[str], columns: dict[str, Any]) -> bool:
        """Hand over the next step of each episode in ``eids`` (distinct, begun with the same fields): row i of every
        (k, ...) column belongs to eids[i]; a field left out is its fill value. Dropped as a whole when the queue is
        full (returns False), as k put() calls would be."""
        key = tuple(eids)
        checked = self._rows_checked
        if checked is not None and checked[1] == self._generation and checked[0] == key:
            eps, capacity = checked[2], checked[3]  # the same open episodes as the last call (the common tick)
        else:
            eps, capacity = self._check_row_set(eids)
            self._rows_checked = (key, self._generation, eps, capacity)
        if not eps:
            return True
        steps = [ep.next_step for ep in eps]
        for ep in eps:
            ep.next_step += 1
        if not self._room(capacity):
            for ep in eps:
                ep.dropped += 1
            self.stats.dropped_steps += len(eps)
            return False
        self._q.append(_Rows(eps, steps, dict(columns)))
        self._steps_in += len(eps)
        self.stats.queued_steps += len(eps)
        self._wake_if_filling(capacity)
        return True

    def _check_row_set(self, eids: Sequence[str]) -> tuple[list[_Episode], int]:
        """put_rows' episodes: each open, all begun with the same fields; and the queue room they share."""
        eps: list[_Episode] = []
        capacity = self.queue_steps
        for eid in eids:  # nothing changes before the whole set passed
            ep = self._open(eid)
            if eps and ep.key is not eps[0].key and ep.key != eps[0].key:
                raise ContractError(f"episode {ep.eid}: put_rows needs episodes begun with the same fields as "
                                    f"episode {eps[0].eid}")
            eps.append(ep)
            capacity = min(capacity, ep.capacity)
        return eps, capacity

    def _wake_if_filling(self, capacity: int) -> None:
        if (self._steps_in - self._steps_out) * 4 >= capacity and not self._wake.is_set():
            self._wake.set()

    def _room(self, capacity: int) -> bool:
        """Whether a step may be queued now: on_full="block" waits for room, "drop" says no when full."""
        if self._steps_in - self._steps_out < capacity:
            return True
        if self.on_full == "drop":
            return False
        self._wake.set()
        while self._steps_in - self._steps_out >= capacity and self._fatal is None:
            time.sleep(0.0002)
        return True

    def _field_key(self, fields: dict[str, FieldSpec]) -> tuple[tuple[Any, ...], int]:
        """The segment key of a field set and its bytes per step; the same FieldSpec objects give the same key
        object without dumping them again (episodes of one collector begin with one field dict)."""
        specs = tuple(fields.items())
        ids = tuple(id(spec) for _, spec in specs)
        hit = self._keys.get(ids)
        if hit is not None and all(a[0] == b[0] and a[1] is b[1] for a, b in zip(hit[0], specs, strict=True)):
            return hit[1], hit[2]
        key = tuple(sorted((n, s.model_dump_json()) for n, s in specs))
        nbytes = sum(math.prod(s.shape) * s.np_dtype.itemsize for _, s in specs)
        self._keys[ids] = (specs, key, nbytes)
        return key, nbytes

    def event(self, eid: str, event: Event) -> None:
        ep = self._open(eid)
        self._q.append(("event", ep, event))

    def end_episode(
        self,
        eid: str,
        end: EpisodeEnd,
        windows: Iterable[CorrectionWindow] = (),
        certifications: Iterable[ExpertCertification] = (),
    ) -> None:
        """Commit the episode (immutable from then on) and its label layer v1 (contract.derive_labels)."""
        ep = self._open(eid)
        windows, certifications = list(windows), list(certifications)
        total = ep.next_step
        for w in windows:
            if w.parent_episode_id != eid:
                raise ContractError(f"episode {eid}: window {w.window_id} has parent_episode_id {w.parent_episode_id}")
            if w.handover_end > total:
                raise ContractError(f"episode {eid}: window {w.window_id} ends at step {w.handover_end} > {total} steps")
        for c in certifications:
            if c.episode_id != eid:
                raise ContractError(f"episode {eid}: certification {c.cert_id} is for episode {c.episode_id}")
            if c.step_end > total:
                raise ContractError(f"episode {eid}: certification {c.cert_id} ends at step {c.step_end} > {total} steps")
        ep.ended = True
        self._generation += 1
        self._q.append(("end", ep, end, windows, certifications, total, ep.dropped))

    def close(self) -> None:
        """Drain the queue, commit, seal the segments and join the writer. Open episodes stay incomplete."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        self._thread.join()
        self._closed = True
        unended = [e.eid for e in self._episodes.values() if not e.ended and e.error is None]
        if unended:
            log.warning("recorder closed with %d episode(s) never ended; stored as incomplete: %s",
                        len(unended), ", ".join(unended[:5]))
        if self._fatal is not None:
            raise self._fatal
        errors = [e for e in self._episodes.values() if e.error is not None and not e.error_reported]
        for e in errors:
            e.error_reported = True
        if errors:
            raise ContractError("; ".join(str(e.error) for e in errors))

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queue_len(self) -> int:
        """Steps handed over and not yet taken by the writer."""
        return self._steps_in - self._steps_out

    def _open(self, eid: str) -> _Episode:
        """The episode ``eid`` if steps, events or its end may still be handed over; else raise why not."""
        ep = self._episodes.get(eid)
        if ep is None or ep.ended or ep.error is not None or self._fatal is not None:
            self._raise_for(eid, ep)
        return ep

    def _check_alive(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closing:
            raise StoreError("recorder is closed")

    def _raise_for(self, eid: str, ep: _Episode | None) -> NoReturn:
        self._check_alive()
        if ep is None and eid in self._seen:
            raise ContractError(f"episode {eid}: already ended")
        if ep is None:
            raise ContractError(f"episode {eid}: not begun with this recorder (call begin_episode first)")
        if ep.error is not None:
            ep.error_reported = True
            raise ep.error
        raise ContractError(f"episode {eid}: already ended")

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        drain_every = min(_DRAIN_INTERVAL_S, self.flush_interval_s / 2)
        last_flush = time.monotonic()
        dirty = False
        records: list[dict[str, Any]] = []
        touched: list[_Episode] = []
        batches: list[_Rows] = []
        pending_bytes = 0
        try:
            while True:
                drained = 0
                full = False  # stopped draining to flush: go on at once after the flush
                while self._q:
                    item = self._q.popleft()
                    drained += 1
                    if isinstance(item, _Rows):
                        self._steps_out += len(item.eps)
                        if self._check_rows(item):
                            batches.append(item)
                        for i, (ep, n) in enumerate(zip(item.eps, item.steps, strict=True)):
                            if ep.error is None:
                                if not ep.pending:
                                    touched.append(ep)
                                ep.pending.append((n, item, i))
                                pending_bytes += ep.step_bytes
                    elif isinstance(item[0], _Episode):
                        self._steps_out += 1
                        ep, n, step = item
                        if ep.error is None:
                            if not ep.pending:
                                touched.append(ep)
                            ep.pending.append((n, step))
                            pending_bytes += ep.step_bytes
                    else:
                        self._control(item, records, touched)
                    if pending_bytes >= _MAX_PENDING_BYTES:
                        full = True
                        break
                self.stats.max_queue = max(self.stats.max_queue, drained)
                dirty = dirty or drained > 0
                now = time.monotonic()
                closing = self._closing and not self._q
                if dirty and (closing or pending_bytes >= _MAX_PENDING_BYTES or now - last_flush >= self.flush_interval_s):
                    self._flush(records, touched, batches)
                    records, touched, batches, pending_bytes, dirty = [], [], [], 0, False
                    last_flush = now
                if closing:
                    for seg in self._segments.values():
                        seg.close()
                    return
                if not full:
                    self._wake.wait(drain_every)
                    self._wake.clear()
        except Exception as exc:  # I/O failure: nothing more can be committed; surface it to the caller
            log.error("recorder writer failed: %s", exc)
            self._fatal = exc if isinstance(exc, StoreError) else StoreError(
                f"{self._store.url}: recording failed ({failure_reason(exc)}); episodes committed before are kept, "
                "the ones in progress stay incomplete")
            self._fatal.__cause__ = exc
            self._generation += 1

    def _control(self, item: tuple[Any, ...], records: list[dict[str, Any]], touched: list[_Episode]) -> None:
        kind, ep = item[0], item[1]
        if kind == "begin":
            seg = self._segments.get(ep.key)
            if seg is None:
                seg = self._segments[ep.key] = SegmentWriter(self._store.root, ep.fields)
            ep.segment, ep.ordinal = seg, seg.next_ordinal
            seg.next_ordinal += 1
            records.append({"seg": seg, "type": "begin", "ep": ep.ordinal, "start": ep.start.model_dump(mode="json")})
        elif ep.error is not None:
            return
        elif kind == "event":
            ep.events.append(item[2])
            records.append({"seg": ep.segment, "type": "event", "ep": ep.ordinal, "event": item[2].model_dump(mode="json")})
        elif kind == "end":
            ep.end_msg = item[2:]
            if not ep.pending:
                touched.append(ep)

    def _check_rows(self, b: _Rows) -> bool:
        """Give a batch exactly its episodes' fields, cast to their dtypes; a column of the wrong shape or dtype
        poisons every episode of the batch from this step on (as a bad put() step does). False if it did."""
        k, fields = len(b.eps), b.eps[0].fields
        cols: dict[str, Any] = {}
        for name, spec in fields.items():
            col = b.cols.get(name)
            if col is None:
                cols[name] = fill_rows(spec, k)
                continue
            checked = as_column(col, spec)
            if checked is None or len(checked) != k:
                got = describe_value(col)
                for ep, n in zip(b.eps, b.steps, strict=True):
                    if ep.error is None:
                        ep.error = field_error(ep.eid, n, name, spec, f"{got} for {k} rows")
                        self._generation += 1
                return False
            cols[name] = checked
        b.cols = cols
        return True

    @staticmethod
    def _join(batches: list[_Rows]) -> None:
        """Concatenate the flush's batches per field set once, so each episode takes its rows with one index."""
        groups: dict[tuple[Any, ...], list[_Rows]] = {}
        for b in batches:
            groups.setdefault(b.eps[0].key, []).append(b)
        for group in groups.values():
            offset = 0
            for b in group:
                b.offset, offset = offset, offset + len(b.eps)
            joined = {name: concat_parts([b.cols[name] for b in group]) for name in group[0].cols}
            for b in group:
                b.joined = joined

    def _flush(self, records: list[dict[str, Any]], touched: list[_Episode], batches: list[_Rows]) -> None:
        blocks: dict[SegmentWriter, list[Any]] = {}
        self._join(batches)
        for ep in touched:
            if ep.error is not None and not ep.pending:
                continue
            cols, steps = self._columns(ep)
            if steps is not None and len(steps) and ep.segment is not None:
                blocks.setdefault(ep.segment, []).append((ep.ordinal, steps, cols))
            if ep.end_msg is not None and ep.error is None:
                records.extend(self._commit_records(ep))
        segs = list(dict.fromkeys([*blocks, *(r["seg"] for r in records)]))
        committed = sum(1 for r in records if r["type"] == "end")
        for seg in segs:
            bl = blocks.get(seg, [])
            if bl:
                columns = {name: concat_parts([b[2][name] for b in bl]) for name in seg.fields}
                episode = np.concatenate([np.full(len(b[1]), b[0], np.uint32) for b in bl])
                step = np.concatenate([b[1] for b in bl]).astype(np.uint32)
            else:
                columns, episode, step = {}, np.zeros(0, np.uint32), np.zeros(0, np.uint32)
            recs = [{k: v for k, v in r.items() if k != "seg"} for r in records if r["seg"] is seg]
            seg.flush(columns, episode, step, recs)
            self.stats.written_steps += len(episode)
        self.stats.committed_episodes += committed
        self.stats.flushes += 1
        for ep in touched:
            if ep.end_msg is not None:
                ep.pending.clear()
                ep.label_cols = {}
                if ep.error is None:
                    self._episodes.pop(ep.eid, None)
        self._store.invalidate()

    def _columns(self, ep: _Episode) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """Stack pending steps into columns; dropped step numbers become fill rows with valid=False.

        A step whose value does not match its FieldSpec poisons the episode: the steps before it are kept, the
        episode is never committed (it reads as incomplete) and the next call for it raises the error.
        """
        total = ep.end_msg[3] if ep.end_msg is not None else None
        pending, ep.pending = ep.pending, []
        stop = max(pending[-1][0] + 1 if pending else ep.flushed_next, total or 0)
        n = stop - ep.flushed_next
        if n <= 0:
            return {}, None
        rows: list[tuple[Any, ...] | None] = [None] * n
        for entry in pending:
            rows[entry[0] - ep.flushed_next] = entry
        joined = pending[0][1].joined if pending and len(pending[0]) == 3 else None
        if joined is not None and all(e is None or (len(e) == 3 and e[1].joined is joined) for e in rows):
            cols: dict[str, Any] = self._gather(ep, rows, joined)
        else:
            stacked = self._stack_rows(ep, rows)
            if ep.error is not None:
                self._generation += 1  # a bad step: put_rows checks this episode again
            if stacked is None:
                return {}, None
            cols, rows = stacked
            n = len(rows)
        gap = [i for i, s in enumerate(rows) if s is None]
        if gap and "valid" in cols:
            cols["valid"][gap] = False
        ep.dropped_steps.extend(ep.flushed_next + i for i in gap)
        steps = np.arange(ep.flushed_next, ep.flushed_next + n)
        for k in _LABEL_INPUTS:
            if k in cols:
                ep.label_cols[k].append(cols[k])
        ep.flushed_next += n
        return cols, steps

    @staticmethod
    def _gather(ep: _Episode, rows: list[tuple[Any, ...] | None], joined: dict[str, Any]) -> dict[str, Any]:
        """Columns of steps that all came from put_rows() in this flush: one fancy index per field."""
        have = [i for i, e in enumerate(rows) if e is not None]
        index = np.fromiter((e[1].offset + e[2] for e in rows if e is not None), np.int64, len(have))
        cols: dict[str, Any] = {}
        for name, spec in ep.fields.items():
            taken = joined[name][index]
            if len(have) == len(rows):
                cols[name] = taken
            else:  # dropped steps: fill rows
                col = fill_rows(spec, len(rows))
                col[have] = taken
                cols[name] = col
        return cols

    @staticmethod
    def _stack_rows(ep: _Episode, rows: list[tuple[Any, ...] | None]
                    ) -> tuple[dict[str, Any], list[tuple[Any, ...] | None]] | None:
        """Columns of steps from put() (or both kinds); a bad value cuts the rows before it (see _columns)."""
        cols: dict[str, Any] = {}
        for name, spec in ep.fields.items():
            fill_row = np.full(spec.shape, array_fill(spec), spec.np_dtype)
            vals = [fill_row if e is None else e[1].get(name, fill_row) if len(e) == 2 else e[1].cols[name][e[2]]
                    for e in rows]
            col = stack_values(vals, spec)
            if col is None:
                bad = next(i for i, v in enumerate(vals) if stack_values([v], spec) is None)
                ep.error = field_error(ep.eid, ep.flushed_next + bad, name, spec, describe_value(vals[bad]))
                rows = rows[:bad]
                cols = {k: v[:bad] for k, v in cols.items()}
                col = stack_values(vals[:bad], spec) if bad else None
                if col is None:
                    return None
            cols[name] = col
        return cols, rows

    def _commit_records(self, ep: _Episode) -> list[dict[str, Any]]:
        assert ep.end_msg is not None
        end, windows, certifications, total, dropped = ep.end_msg
        events = list(end.events) + [e for e in ep.events if e not in end.events]
        if dropped:
            events.append(Event(
                kind=EventKind.DROPPED_STEPS, step=max(0, min(ep.dropped_steps, default=0)), t_ns=now_ns(),
                reason=f"recorder queue full ({ep.capacity} steps, on_full=drop)", source="recorder",
                values={"count": int(dropped), "steps": [int(s) for s in ep.dropped_steps[:1000]]},
            ))
        quality = list(end.quality_flags) + (["dropped_steps"] if dropped and "dropped_steps" not in end.quality_flags else [])
        final = end.model_copy(update={"num_steps": int(total), "dropped_steps": int(end.dropped_steps + dropped),
                                       "events": events, "quality_flags": quality})
        EpisodeEnd.model_validate(final.model_dump())

        def col(name: str) -> np.ndarray:
            parts = ep.label_cols.get(name) or []
            if parts:
                return np.concatenate(parts)
            spec = ep.fields.get(name)
            return np.full(total, array_fill(spec) if spec else 0)

        labels = derive_labels(
            action_source=col("action_source"), valid=col("valid"), step_flags=col("step_flags"),
            expert_valid=col("expert_valid"), windows=windows, certifications=certifications, mode=ep.start.mode,
            quality_flags=final.quality_flags, operator=ep.start.operator, policy_version=ep.start.policy_version,
        )
        layer = LabelLayer(version=1, author="recorder", mask=labels.mask, target=labels.target, windows=windows,
                           certifications=certifications, created_wall=wall_stamp())
        seg = ep.segment
        return [
            {"seg": seg, "type": "end", "ep": ep.ordinal, "end": final.model_dump(mode="json")},
            {"seg": seg, "type": "labels", "ep": ep.ordinal, "layer": layer.to_json()},
        ]
