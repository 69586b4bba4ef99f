"""A policy behind a policy server speaking openpi's protocol (``ws://HOST:PORT``), acting like a student.

The protocol: on connect the server sends its metadata (one msgpack map); then each request is a msgpack map of
numpy arrays (one observation, or a batch when the metadata says ``"batch": true``) and each reply a map with
``actions``, a chunk [H, action_dim] (batched: [N, H, action_dim]), and optional ``server_timing``; a reply that is a
text frame is the server's error. Wire bytes: policy.wire; observation names: policy.features.

Chunks are executed through a per-row queue: the first ``n_action_steps`` actions of each chunk (the option, else
the server's metadata, else the whole chunk), one per tick; a row asks for a new chunk when its queue is empty.
``reset_rows`` (an episode begins) and ``drop_chunks`` (a handover, a hand-back) empty the rows' queues, so the
next action comes from a chunk computed on the current observation.

Asking ahead (``ask_ahead``): a row whose queue is down to ``ask_ahead`` actions sends its next request on that
tick's observation, and a worker thread that owns the connection (openpi's protocol: one request at a time per
connection, so every request goes through it) waits for the reply while the loop goes on with the queue. The
reply is taken when the queue runs out, aligned by the ticks executed since its observation: a chunk computed on
the observation of tick s holds the action for tick s first, so at tick t its first t - s actions are skipped and
a step's ``policy_action`` is what the policy proposed for that step. A row whose queue ran out before its reply
came waits for it and is ``late`` for that tick (the session flags the step ``latency_exceeded``); a reply with no
action left for the tick is dropped and the row asks again on the current observation. ``drop_chunks`` discards a
row's request in flight: a chunk computed before a handover is never executed after it. ``ask_ahead=None`` picks
the threshold from the measured round trip: ceil(round trip / control period) actions (at least 1), so the reply
has one control period to spare.

Consecutive chunks overlap where a chunk is longer than what is executed of it: the part not executed is what the
policy predicted for the steps the next chunk begins with. When the next chunk arrives, ``chunk_disagreement`` is
the mean over those overlapping steps of the largest per-dimension difference, each as a fraction of that
dimension's raw action range (NaN without a predecessor to compare: a row's first chunk, after a drop, or no
overlap). It holds while the chunk executes, and it is the ``uncertainty`` the policy reports when its server
reports none of its own, so a single chunking model can ask for help (the ``chunk`` gate, docs/gates.md).

A server whose metadata says ``"samples": K`` sends ``action_samples`` with each chunk: K samples of it [K, H, A]
(batched [N, K, H, A]), a stochastic policy's draws. ``sample_spread`` is then, over the actions executed of the
chunk, the mean of the largest per-dimension standard deviation across the samples, as a fraction of that
dimension's raw action range; it holds while the chunk executes, and it is the ``uncertainty`` reported (before
chunk disagreement) when the server reports none of its own (the ``spread`` gate).

Actions are taken as raw actions (what our LeRobot export writes as ``action``). A server that is unreachable,
dies, stalls past the timeout, answers with an error, or proposes an action of the wrong size or a non-finite
one raises ``PolicyError`` naming the server's address.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from hg_dagger.errors import ConfigError
from hg_dagger.policy.features import (
    TASK,
    check_features,
    declared_action_dim,
    task_features,
    task_text,
    wire_obs,
)
from hg_dagger.policy.heads import CHUNK_DECAY
from hg_dagger.policy.student import PolicyOutput
from hg_dagger.policy.wire import PolicyError, packb, plain, unpackb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyOptions:
    """How a policy spec is opened (``--policy-*`` options; each source reads the ones it needs)."""

    python: str | None = None  # lerobot:DIR: the Python (LeRobot's environment) that runs its server
    action_steps: int | None = None  # actions of each chunk executed before the next inference (None: the server's)
    timeout_s: float = 30.0  # the longest a reply may take before the server counts as stalled
    connect_timeout_s: float = 10.0  # opening the connection and receiving the metadata
    start_timeout_s: float = 300.0  # a server we start ourselves (lerobot:DIR): until it listens
    batch: bool | None = None  # one request for all rows that need a chunk (None: when the server says it can)
    temporal_ensemble: bool = False  # ask every tick; act on the weighted mean of what the recent chunks said about it
    ask_ahead: int | None = 0  # ask for the next chunk with this many actions left (0: when none is left; None: auto)

    def __post_init__(self):
        if self.action_steps is not None and self.action_steps < 1:
            raise ConfigError(f"--policy-action-steps must be >= 1, got {self.action_steps}")
        if self.ask_ahead is not None and self.ask_ahead < 0:
            raise ConfigError(f"--policy-ask-ahead must be >= 0 or auto, got {self.ask_ahead}")
        for name in ("timeout_s", "connect_timeout_s", "start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"policy option {name} must be > 0, got {getattr(self, name)}")


def metadata_version(meta: dict[str, Any]) -> str:
    """The policy version a server declares (``policy_version``, else ``version``), else a hash of its metadata."""
    for key in ("policy_version", "version"):
        v = meta.get(key)
        if isinstance(v, str | int) and not isinstance(v, bool) and str(v):
            return str(v)
    return f"meta-{metadata_hash(meta)[:12]}"


def metadata_hash(meta: dict[str, Any]) -> str:
    text = json.dumps(plain(meta), sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(eq=False)
class _Request:
    """One request: ``msg`` sent on the observation of tick ``tick`` for ``rows`` (batched: in that order); the
    worker fills ``reply`` or ``error`` and sets ``done``."""

    msg: dict[str, Any]
    rows: list[int]
    tick: int
    batched: bool
    t_submit_ns: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: PolicyError | None = None
    chunks: np.ndarray | None = None  # the reply's chunks [len(rows), H, A], checked once


def _positive_int(meta: dict[str, Any], key: str) -> int | None:
    v = meta.get(key)
    return int(v) if isinstance(v, int | np.integer) and not isinstance(v, bool) and v > 0 else None


class RemotePolicy:
    """A policy served over openpi's websocket protocol, bound to one task mapping (the engine's and the session's
    ``Policy``: ``act``, ``reset_rows``, ``version``; and ``drop_chunks`` for handovers). ``close`` ends the
    connection (and ``on_close``, e.g. stopping a server we started)."""

    reports_uncertainty = False  # its own (metadata "uncertainty": true), or chunk disagreement where chunks overlap

    def __init__(self, url: str, mapping, options: PolicyOptions | None = None, *,
                 on_close: Callable[[], None] | None = None, label: str | None = None):
        self.url = url
        self.label = label or url  # how errors name the policy
        self.mapping = mapping
        self.options = options or PolicyOptions()
        self._on_close = on_close
        self._ws = None
        self._worker: threading.Thread | None = None  # asking ahead: the thread that owns the connection
        opts = self.options
        try:
            self._ws = connect(url, open_timeout=opts.connect_timeout_s, compression=None, max_size=None)
            first = self._ws.recv(timeout=opts.connect_timeout_s)
        except TimeoutError:
            self.close()
            raise PolicyError(f"policy server {self.label} did not send its metadata within "
                              f"{opts.connect_timeout_s:g} s") from None
        except Exception as exc:  # refused, unreachable, a bad address, not a websocket server
            self.close()
            raise PolicyError(f"cannot reach policy server {self.label}: {_reason(exc)}") from None
        try:
            meta = unpackb(first) if isinstance(first, bytes) else None
        except Exception:
            meta = None
        if not isinstance(meta, dict):
            self.close()
            raise PolicyError(f"policy server {self.label} did not start with its metadata (a msgpack map); is it "
                              f"a policy server speaking openpi's protocol?")
        self.metadata: dict[str, Any] = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in meta.items()}
        try:
            self.names = check_features(self.metadata, mapping, where=f"policy server {self.label}")
        except ConfigError:
            self.close()
            raise
        self._feats = task_features(mapping)
        self._task = task_text(mapping)
        self.version = metadata_version(self.metadata)
        # with temporal ensembling every tick asks for a chunk, and a step's action averages the chunks that cover it
        self.action_steps = 1 if opts.temporal_ensemble else (
            opts.action_steps or _positive_int(self.metadata, "n_action_steps"))
        self.batch = bool(self.metadata.get("batch")) if opts.batch is None else bool(opts.batch)
        self.server_uncertainty = bool(self.metadata.get("uncertainty"))
        self.samples = _positive_int(self.metadata, "samples") or 0
        horizon = _positive_int(self.metadata, "chunk_size")
        self.overlaps = self.action_steps is not None and (horizon is None or horizon > self.action_steps)
        self.reports_uncertainty = self.server_uncertainty or self.overlaps or self.samples > 0
        thresholds = self.metadata.get("gate_thresholds")
        self.gate_thresholds: dict[str, Any] = plain(thresholds) if isinstance(thresholds, dict) else {}
        self.lineage: list[dict[str, Any]] = []
        self.round = 0
        self._a = mapping.action_dim
        low, high = np.asarray(mapping.action.low, np.float64), np.asarray(mapping.action.high, np.float64)
        span = np.broadcast_to(high - low, (self._a,))
        self._span = np.where(np.isfinite(span) & (span > 0), span, 1.0).astype(np.float32)
        self._n = 0
        self._queue: list[np.ndarray | None] = []  # per row: the actions left of its chunk [k, A]
        self._recent: list[list[list]] = []  # per row, temporal ensembling: [chunk, its age in ticks], oldest first
        self._tail: list[np.ndarray | None] = []  # per row: its chunk's actions past the queue (predicted, not run)
        self.chunk_disagreement = np.zeros(0, np.float32)  # per row: its chunk against its predecessor (NaN: none)
        self.sample_spread = np.zeros(0, np.float32)  # per row: its chunk's samples' spread (NaN: none)
        self._unc = np.zeros(0, np.float32)
        self._conf = np.zeros(0, np.float32)
        self.chunk_id = np.zeros(0, np.int64)  # per row: which chunk it executes (counts from 1; 0: none yet)
        self.chunk_index = np.zeros(0, np.int64)  # per row: the index within it of the action last returned
        self._chunks = 0
        self.requests = 0
        self.server_ms = 0.0  # the server's own inference time, summed over requests (when it reports it)
        self._t = 0  # act() calls so far: the tick a request's observation belongs to
        self._pending: list[_Request | None] = []  # per row: its request in flight (asked ahead)
        self.waited = np.zeros(0, bool)  # per row, this tick: its action waited for a reply
        self.late = np.zeros(0, bool)  # per row, this tick: its queue ran out before the reply asked ahead came
        self.wait_count = 0  # row-ticks that waited for a reply
        self.late_count = 0  # row-ticks that were late
        self.round_trip_s: float | None = None  # smoothed time from sending a request to its reply
        self._jobs: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        if opts.ask_ahead != 0:  # the connection is the worker's from here on
            self._worker = threading.Thread(target=self._work, name=f"policy {self.label}", daemon=True)
            self._worker.start()
        declared = declared_action_dim(self.metadata)
        log.info("policy %s at %s: version %s, %s, sends %s%s", self.metadata.get("policy_type", "?"), self.label,
                 self.version, f"{self.action_steps} action(s) per chunk" if self.action_steps else "whole chunks",
                 ", ".join(self.names), "" if declared is not None else " (the server declares no action size)")

    # ------------------------------------------------------------------ identity

    def content_hash(self) -> str:
        """A hash of the server's metadata (a server that reports the same metadata serves the same policy)."""
        return metadata_hash(self.metadata)

    def describe(self) -> dict[str, Any]:
        return {"source": self.label, "policy_version": self.version, "policy_type": self.metadata.get("policy_type"),
                "sends": list(self.names), "action_steps": self.action_steps, "batch": self.batch}

    # ------------------------------------------------------------------ rows

    def _resize(self, n: int) -> None:
        self._n = n
        self._queue = [None] * n
        self._tail = [None] * n
        self._recent = [[] for _ in range(n)]
        self.chunk_disagreement = np.full(n, np.nan, np.float32)
        self.sample_spread = np.full(n, np.nan, np.float32)
        self._unc = np.full(n, np.nan, np.float32)
        self._conf = np.full(n, np.nan, np.float32)
        self.chunk_id = np.zeros(n, np.int64)
        self.chunk_index = np.zeros(n, np.int64)
        self._pending = [None] * n
        self.waited = np.zeros(n, bool)
        self.late = np.zeros(n, bool)

    def reset_rows(self, rows: Sequence[int], num_envs: int) -> None:
        """Episodes begin in ``rows``: their queued actions are dropped."""
        if num_envs != self._n:
            self._resize(num_envs)
        self.drop_chunks(rows)

    def drop_chunks(self, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The rest of the rows' chunks is dropped (a handover, a hand-back), and a request in flight for them is
        discarded: their next action comes from a chunk computed on the observation of that tick, which no earlier
        chunk predicted for. Returns, per row, what was dropped (the chunk, its actions left, a request in flight)."""
        dropped: dict[int, dict[str, Any]] = {}
        for r in map(int, rows):
            if 0 <= r < self._n:
                q = self._queue[r]
                dropped[r] = {"chunk_id": int(self.chunk_id[r]), "actions_dropped": 0 if q is None else len(q),
                              "request_discarded": self._pending[r] is not None}
                self._queue[r] = None
                self._pending[r] = None  # its reply, when it comes, is never taken
                self._tail[r] = None
                self._recent[r] = []
                self.chunk_disagreement[r] = np.nan
                self.sample_spread[r] = np.nan
                if not self.server_uncertainty:
                    self._unc[r] = np.nan
        return dropped

    # ------------------------------------------------------------------ acting

    def act(self, obs: dict[str, np.ndarray]) -> PolicyOutput:
        t0 = time.perf_counter_ns()
        n = int(next(iter(obs.values())).shape[0])
        if n != self._n:
            self._resize(n)
        self._t += 1
        self.waited[:] = False
        self.late[:] = False
        need = []
        for r in range(n):
            q = self._queue[r]
            if q is not None and len(q):
                continue
            job = self._pending[r]
            if job is None or not self._took_ahead(r, job):
                need.append(r)
        if need:
            self._fill(obs, need)
            self.waited[need] = True
        self.wait_count += int(self.waited.sum())
        self.late_count += int(self.late.sum())
        action = np.empty((n, self._a), np.float32)
        for r in range(n):
            q = self._queue[r]
            assert q is not None  # filled above
            action[r] = q[0] if not self.options.temporal_ensemble else self._ensembled(r)
            self._queue[r] = q[1:]
        self.chunk_index += 1
        if self._worker is not None:
            self._ask_ahead(obs, n)
        return PolicyOutput(action=action, uncertainty=self._unc.copy(), confidence=self._conf.copy(),
                            inference_ns=time.perf_counter_ns() - t0,
                            policy_action=np.asarray(self.mapping.raw_to_policy(action), np.float32))

    def _ensembled(self, r: int) -> np.ndarray:
        """ACT's temporal ensemble: the weighted mean of what each recent chunk of the row predicted for this tick, a
        prediction made ``age`` ticks ago weighing exp(CHUNK_DECAY * age) (older a little heavier); then every chunk
        ages a tick, and one that has no prediction left is dropped."""
        live = [(chunk[age], math.exp(CHUNK_DECAY * age)) for chunk, age in self._recent[r] if age < len(chunk)]
        weights = np.array([w for _, w in live], np.float32)
        action = (np.stack([a for a, _ in live]) * weights[:, None]).sum(0) / weights.sum()
        for entry in self._recent[r]:
            entry[1] += 1
        self._recent[r] = [e for e in self._recent[r] if e[1] < len(e[0])]
        return action.astype(np.float32)

    def _fill(self, obs: dict[str, np.ndarray], rows: list[int]) -> None:
        """New chunks for ``rows`` computed on this tick's observation, waited for."""
        for job in self._requests(obs, rows):
            if self._worker is None:
                job.reply = self._request(job.msg)
            else:
                self._jobs.put(job)
                self._wait(job)
            for r in job.rows:
                self._take(r, job, 0)

    def _requests(self, obs: dict[str, np.ndarray], rows: list[int]) -> list[_Request]:
        """One batched request for ``rows``, or one request per row; each on this tick's observation."""
        groups = [rows] if self.batch else [[r] for r in rows]
        jobs = []
        for group in groups:
            msg: dict[str, Any] = wire_obs(obs, self._feats, self.names, group)
            if not self.batch:
                msg = {k: v[0] for k, v in msg.items()}  # one row
            msg[TASK] = self._task
            jobs.append(_Request(msg, group, self._t, self.batch, time.perf_counter_ns()))
        return jobs

    def _ask_ahead(self, obs: dict[str, np.ndarray], n: int) -> None:
        """Rows down to the threshold, with nothing in flight, send their next request on this tick's observation."""
        left = self.ahead_threshold()
        rows = [r for r in range(n) if self._pending[r] is None and _left(self._queue[r]) <= left]
        for job in self._requests(obs, rows) if rows else ():
            for r in job.rows:
                self._pending[r] = job
            self._jobs.put(job)

    def ahead_threshold(self) -> int:
        """The actions left at which a row asks ahead (the option, or auto: the measured round trip in ticks)."""
        if self.options.ask_ahead is not None:
            return self.options.ask_ahead
        if self.round_trip_s is None:
            return 1
        return max(1, math.ceil(self.round_trip_s / self.mapping.dt))  # the reply then has one tick to spare

    def _took_ahead(self, r: int, job: _Request) -> bool:
        """Row ``r``'s queue ran out: take the reply asked ahead (waiting for it when it is not there: the row is
        late); False when it holds no action for this tick (it came too late), so the row asks afresh."""
        self._pending[r] = None
        if not job.done.is_set():
            self.late[r] = self.waited[r] = True
        self._wait(job)
        skip = self._t - job.tick
        if skip >= self._chunks_of(job).shape[1]:
            self.late[r] = True
            return False
        self._take(r, job, skip)
        return True

    def _wait(self, job: _Request) -> None:
        if not job.done.wait(self.options.timeout_s + self.options.connect_timeout_s):
            raise PolicyError(f"policy server {self.label} did not answer within {self.options.timeout_s:g} s "
                              f"(stalled or overloaded)")
        if job.error is not None:
            raise job.error

    def _work(self) -> None:
        """The worker: sends each request and waits for its reply, one at a time, in the order they were asked."""
        while (job := self._jobs.get()) is not None:
            try:
                job.reply = self._request(job.msg)
                took = (time.perf_counter_ns() - job.t_submit_ns) / 1e9
                self.round_trip_s = took if self.round_trip_s is None else 0.8 * self.round_trip_s + 0.2 * took
            except PolicyError as exc:
                job.error = exc
            except Exception as exc:  # anything else the connection raises: the same one line
                job.error = PolicyError(f"policy server {self.label}: {_reason(exc)}")
            job.done.set()

    def _chunks_of(self, job: _Request) -> np.ndarray:
        if job.chunks is None:
            assert job.reply is not None  # done without an error
            chunks = self._actions(job.reply, batch=len(job.rows) if job.batched else None)
            job.chunks = chunks if job.batched else chunks[None]
        return job.chunks

    def _take(self, r: int, job: _Request, skip: int) -> None:
        """Row ``r`` executes its chunk from ``job``, whose first ``skip`` actions were for ticks already past."""
        i = job.rows.index(r)
        full = self._chunks_of(job)[i]
        reply = job.reply
        assert reply is not None  # taken after it came
        chunk = full[skip:]
        steps = len(chunk) if self.action_steps is None else min(self.action_steps, len(chunk))
        self.chunk_disagreement[r] = self._disagreement(self._tail[r], chunk)
        self._queue[r] = chunk[:steps]
        self._tail[r] = chunk[steps:] if steps < len(chunk) else None
        if self.options.temporal_ensemble:
            self._recent[r].append([full, skip])
        self._chunks += 1
        self.chunk_id[r] = self._chunks
        self.chunk_index[r] = skip - 1  # act() counts it to the index of the chunk's first action executed
        i_reply: int | None = i if job.batched else None
        samples = reply.get("action_samples")
        self.sample_spread[r] = np.nan if samples is None else self._spread(samples, i_reply, skip, steps)
        if not self.server_uncertainty:
            own = self.sample_spread[r]
            self._unc[r] = own if np.isfinite(own) else self.chunk_disagreement[r]
        for key, dest in (("uncertainty", self._unc), ("confidence", self._conf)):
            v = reply.get(key)
            if v is not None:
                arr = np.asarray(v, np.float32).reshape(-1)
                dest[r] = arr[i_reply if i_reply is not None and arr.size > 1 else 0]

    def _spread(self, samples: Any, i: int | None, skip: int, steps: int) -> float:
        """The mean over the executed actions of the largest per-dimension std across the samples, as fractions of
        the raw action range."""
        a = np.asarray(samples)
        if i is not None and a.ndim == 4:
            a = a[i]
        if a.ndim != 3 or a.shape[-1] != self._a or a.shape[0] < 2 or a.dtype.kind not in "fiu":
            raise PolicyError(f"policy server {self.label} sent action_samples of shape {list(a.shape)}; expected "
                              f"[K >= 2, H, A = {self._a}]" + (" per row" if i is not None else ""))
        if not np.isfinite(a).all():
            raise PolicyError(f"policy server {self.label} sent a non-finite action sample; the run stops")
        part = a[:, skip:skip + steps] if a.shape[1] > skip else a[:, -1:]
        return float((part.astype(np.float32).std(axis=0) / self._span).max(axis=-1).mean())

    def _disagreement(self, tail: np.ndarray | None, chunk: np.ndarray) -> float:
        """The mean over the overlapping steps of the largest per-dimension difference between what the previous
        chunk predicted and what the new one plans, as fractions of the raw action range; NaN without an overlap."""
        if tail is None or not len(tail):
            return float("nan")
        m = min(len(tail), len(chunk))
        return float((np.abs(chunk[:m] - tail[:m]) / self._span).max(axis=1).mean())

    def _request(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            raise PolicyError(f"policy server {self.label}: the connection is closed")
        try:
            self._ws.send(packb(msg))
            raw = self._ws.recv(timeout=self.options.timeout_s)
        except TimeoutError:
            raise PolicyError(f"policy server {self.label} did not answer within {self.options.timeout_s:g} s "
                              f"(stalled or overloaded)") from None
        except ConnectionClosed as exc:
            why = exc.rcvd.reason if exc.rcvd is not None and exc.rcvd.reason else "it stopped or crashed"
            raise PolicyError(f"policy server {self.label} closed the connection ({why})") from None
        except OSError as exc:
            raise PolicyError(f"policy server {self.label}: connection lost ({_reason(exc)})") from None
        self.requests += 1
        if isinstance(raw, str):
            last = next((ln.strip() for ln in reversed(raw.strip().splitlines()) if ln.strip()), "no message")
            raise PolicyError(f"policy server {self.label} failed to act: {last}")
        try:
            reply = unpackb(raw)
        except Exception as exc:
            raise PolicyError(f"policy server {self.label} sent an unreadable reply ({_reason(exc)})") from None
        if not isinstance(reply, dict) or "actions" not in reply:
            keys = ", ".join(map(str, reply)) if isinstance(reply, dict) else type(reply).__name__
            raise PolicyError(f"policy server {self.label} replied without 'actions' (got {keys})")
        reply = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in reply.items()}
        timing = reply.get("server_timing")
        if isinstance(timing, dict) and isinstance(timing.get("infer_ms"), int | float):
            self.server_ms += float(timing["infer_ms"])
        return reply

    def _actions(self, reply: dict[str, Any], *, batch: int | None) -> np.ndarray:
        """The reply's chunk(s) as float32 [H, A] (or [B, H, A] batched); one action [A] is a chunk of one."""
        a = np.asarray(reply["actions"])
        if a.dtype.kind not in "fiu":
            raise PolicyError(f"policy server {self.label} sent actions of dtype {a.dtype}")
        a = a.astype(np.float32)
        lead = () if batch is None else (batch,)
        if a.ndim == len(lead) + 1:
            a = a[..., None, :]
        if a.ndim != len(lead) + 2 or a.shape[:len(lead)] != lead or a.shape[-1] != self._a or a.shape[-2] < 1:
            want = "[H, A]" if batch is None else f"[{batch}, H, A]"
            raise PolicyError(f"policy server {self.label} sent actions of shape {list(a.shape)}; expected {want} "
                              f"with A = {self._a} (task {self.mapping.task_id})")
        if not np.isfinite(a).all():
            raise PolicyError(f"policy server {self.label} proposed a non-finite action "
                              f"({_first_bad(a)}); the run stops")
        return a

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()  # a request in flight ends with ConnectionClosed in the worker
            except Exception:  # the server is gone already
                pass
        worker, self._worker = self._worker, None
        if worker is not None:
            self._jobs.put(None)
            worker.join(timeout=5.0)
        hook, self._on_close = self._on_close, None
        if hook is not None:
            hook()

    def __enter__(self) -> RemotePolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _left(q: np.ndarray | None) -> int:
    return 0 if q is None else len(q)


def _first_bad(a: np.ndarray) -> str:
    idx = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
    return f"{a[idx]} at index {list(idx)}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


__all__ = ["PolicyOptions", "RemotePolicy", "metadata_hash", "metadata_version"]
