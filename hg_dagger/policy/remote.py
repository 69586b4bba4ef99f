"""A policy behind a policy server speaking openpi's protocol (``ws://HOST:PORT``), acting like a student.

The protocol: on connect the server sends its metadata (one msgpack map); then each request is a msgpack map of
numpy arrays (one observation, or a batch when the metadata says ``"batch": true``) and each reply a map with
``actions``, a chunk [H, action_dim] (batched: [N, H, action_dim]), and optional ``server_timing``; a reply that is a
text frame is the server's error. Wire bytes: policy.wire; observation names: policy.features.

Chunks are executed through a per-row queue: the first ``n_action_steps`` actions of each chunk (the option, else
the server's metadata, else the whole chunk), one per tick; a row asks for a new chunk when its queue is empty.
``reset_rows`` (an episode begins) and ``drop_chunks`` (a handover, a hand-back) empty the rows' queues, so the
next action comes from a chunk computed on the current observation.

Consecutive chunks overlap where a chunk is longer than what is executed of it: the part not executed is what the
policy predicted for the steps the next chunk begins with. When the next chunk arrives, ``chunk_disagreement`` is
the mean over those overlapping steps of the largest per-dimension difference, each as a fraction of that
dimension's raw action range (NaN without a predecessor to compare: a row's first chunk, after a drop, or no
overlap). It holds while the chunk executes, and it is the ``uncertainty`` the policy reports when its server
reports none of its own, so a single chunking model can ask for help (the ``chunk`` gate, docs/gates.md).

Actions are taken as raw actions (what our LeRobot export writes as ``action``). A server that is unreachable,
dies, stalls past the timeout, answers with an error, or proposes an action of the wrong size or a non-finite
one raises ``PolicyError`` naming the server's address.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    def __post_init__(self):
        if self.action_steps is not None and self.action_steps < 1:
            raise ConfigError(f"--policy-action-steps must be >= 1, got {self.action_steps}")
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
        horizon = _positive_int(self.metadata, "chunk_size")
        self.overlaps = self.action_steps is not None and (horizon is None or horizon > self.action_steps)
        self.reports_uncertainty = self.server_uncertainty or self.overlaps
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
        self._unc = np.zeros(0, np.float32)
        self._conf = np.zeros(0, np.float32)
        self.chunk_id = np.zeros(0, np.int64)  # per row: which chunk it executes (counts from 1; 0: none yet)
        self.chunk_index = np.zeros(0, np.int64)  # per row: the index within it of the action last returned
        self._chunks = 0
        self.requests = 0
        self.server_ms = 0.0  # the server's own inference time, summed over requests (when it reports it)
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
        self._unc = np.full(n, np.nan, np.float32)
        self._conf = np.full(n, np.nan, np.float32)
        self.chunk_id = np.zeros(n, np.int64)
        self.chunk_index = np.zeros(n, np.int64)

    def reset_rows(self, rows: Sequence[int], num_envs: int) -> None:
        """Episodes begin in ``rows``: their queued actions are dropped."""
        if num_envs != self._n:
            self._resize(num_envs)
        self.drop_chunks(rows)

    def drop_chunks(self, rows: Sequence[int]) -> None:
        """The rest of the rows' chunks is dropped (a handover, a hand-back): their next action comes from a chunk
        computed on the observation of that tick, which no earlier chunk predicted for."""
        for r in rows:
            if 0 <= int(r) < self._n:
                self._queue[int(r)] = None
                self._tail[int(r)] = None
                self._recent[int(r)] = []
                self.chunk_disagreement[int(r)] = np.nan
                if not self.server_uncertainty:
                    self._unc[int(r)] = np.nan

    # ------------------------------------------------------------------ acting

    def act(self, obs: dict[str, np.ndarray]) -> PolicyOutput:
        t0 = time.perf_counter_ns()
        n = int(next(iter(obs.values())).shape[0])
        if n != self._n:
            self._resize(n)
        need = [r for r, q in enumerate(self._queue[:n]) if q is None or len(q) == 0]
        if need:
            self._fill(obs, need)
        action = np.empty((n, self._a), np.float32)
        for r in range(n):
            q = self._queue[r]
            assert q is not None  # filled above
            action[r] = q[0] if not self.options.temporal_ensemble else self._ensembled(r)
            self._queue[r] = q[1:]
        self.chunk_index += 1
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
        if self.batch:
            msg: dict[str, Any] = wire_obs(obs, self._feats, self.names, rows)
            msg[TASK] = self._task
            reply = self._request(msg)
            chunks = self._actions(reply, batch=len(rows))
            for i, r in enumerate(rows):
                self._take(r, chunks[i], reply, i)
            return
        for r in rows:
            msg = {k: v[0] for k, v in wire_obs(obs, self._feats, self.names, [r]).items()}  # one row
            msg[TASK] = self._task
            reply = self._request(msg)
            self._take(r, self._actions(reply, batch=None), reply, None)

    def _take(self, r: int, chunk: np.ndarray, reply: dict, i: int | None) -> None:
        steps = len(chunk) if self.action_steps is None else min(self.action_steps, len(chunk))
        self.chunk_disagreement[r] = self._disagreement(self._tail[r], chunk)
        self._queue[r] = chunk[:steps]
        self._tail[r] = chunk[steps:] if steps < len(chunk) else None
        if self.options.temporal_ensemble:
            self._recent[r].append([chunk, 0])
        self._chunks += 1
        self.chunk_id[r] = self._chunks
        self.chunk_index[r] = -1  # act() counts it to 0 for the chunk's first action
        if not self.server_uncertainty:
            self._unc[r] = self.chunk_disagreement[r]
        for key, dest in (("uncertainty", self._unc), ("confidence", self._conf)):
            v = reply.get(key)
            if v is not None:
                arr = np.asarray(v, np.float32).reshape(-1)
                dest[r] = arr[i if i is not None and arr.size > 1 else 0]

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
                ws.close()
            except Exception:  # the server is gone already
                pass
        hook, self._on_close = self._on_close, None
        if hook is not None:
            hook()

    def __enter__(self) -> RemotePolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_bad(a: np.ndarray) -> str:
    idx = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
    return f"{a[idx]} at index {list(idx)}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


__all__ = ["PolicyOptions", "RemotePolicy", "metadata_hash", "metadata_version"]
