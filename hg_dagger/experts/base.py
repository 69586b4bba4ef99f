"""The expert contract: who may label an observation, in which action space, and what a failure looks like.

An expert answers a batch of observations (rows of the env batch named by ``env_ids``) with one action
per row plus a per-row ``valid`` flag. ``query_expert`` is the one place that checks what an expert
returned (batch shape, dtype, device, finiteness), converts it to the task's raw action space through
the env mapping, measures latency, and turns a raising, hanging or NaN-producing expert into invalid
rows with a reason - rows that did nothing wrong keep their labels.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.errors import ContractError

OutputSpace = Literal["raw", "policy"]
OUTPUT_SPACES = ("raw", "policy")

Obs = dict[str, np.ndarray]


@dataclass
class ExpertQuery:
    """One batched expert answer.

    action: float32 [N, A]. After ``query_expert`` it is in the task's raw action space and rows that are
    not valid hold NaN, so an invalid label can never reach an env by accident (check_action refuses NaN).
    valid: bool [N]. confidence: float32 [N] in [0, 1] or None when the expert has no such notion.
    metadata: "invalid_reason" {env_id: reason}, "latency_ns" (whole query), "expert_ns" (inside the
    expert), "output_space", plus whatever the expert adds (e.g. the planner's "phase" per row).
    """

    action: np.ndarray
    valid: np.ndarray
    confidence: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def invalid_reason(self) -> dict[int, str]:
        return self.metadata.get("invalid_reason", {})

    def scatter(self, env_ids: Sequence[int] | np.ndarray, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
        """This answer for rows ``env_ids`` spread over the whole batch: (action [num_envs, A] with NaN
        where not asked, valid [num_envs] False where not asked)."""
        action = np.full((num_envs, self.action.shape[1]), np.nan, dtype=np.float32)
        valid = np.zeros(num_envs, dtype=bool)
        action[env_ids], valid[env_ids] = self.action, self.valid
        return action, valid

    def with_fallback(self, fallback: np.ndarray) -> np.ndarray:
        """The action batch with every invalid row replaced by the caller's safe action for that row."""
        fallback = np.asarray(fallback, dtype=np.float32)
        return np.where(self.valid[:, None], self.action, fallback).astype(np.float32)


@runtime_checkable
class ExpertActionProvider(Protocol):
    """A batched, state-conditioned labeller.

    ``act`` sees only the observation rows it is given (the learner's pre-action observation in DAgger)
    and must not rely on having driven the env itself. Experts that do (open-loop demos) set
    ``bc_only = True``; see ``require_relabeler``.
    """

    output_space: OutputSpace

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Rows ``env_ids`` start a new episode; ``obs`` holds their first observation (rows = env_ids)."""

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        """Label ``obs`` (row i belongs to env ``env_ids[i]``)."""


def is_bc_only(expert: Any) -> bool:
    return bool(getattr(expert, "bc_only", False))


def require_relabeler(expert: Any, *, where: str = "DAgger") -> None:
    """Refuse an expert that cannot label states it did not produce (open-loop demos are BC-only)."""
    if is_bc_only(expert):
        raise ContractError(
            f"{where}: {type(expert).__name__} is BC-only (open-loop demos); it never relabels "
            "learner-visited states - use a planner or policy expert"
        )


def invalid_rows(env_ids: Sequence[int] | np.ndarray, valid: np.ndarray, reasons: dict[int, str] | None = None) -> dict[int, str]:
    """{env_id: reason} for every invalid row, filling a generic reason where the expert gave none."""
    reasons = dict(reasons or {})
    return {
        int(e): reasons.get(int(e), "expert marked the row invalid")
        for e, ok in zip(np.asarray(env_ids).tolist(), valid.tolist(), strict=True)
        if not ok
    }


# ---------------------------------------------------------------------------------------------
# query_expert: validation, conversion, failure isolation, latency
# ---------------------------------------------------------------------------------------------


class _Timeout(Exception):
    pass


def _call(fn, timeout_s: float | None):
    """Run fn() and return its result; raise _Timeout if it takes longer than timeout_s.

    Python cannot stop a running thread: a call that times out keeps running in its daemon thread and
    its late result is discarded. Experts are stateless per call (or per env row), so this is safe.
    """
    if timeout_s is None:
        return fn()
    box: list = []
    done = threading.Event()

    def run():
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box.append((False, exc))
        done.set()

    threading.Thread(target=run, daemon=True, name="expert-query").start()
    if not done.wait(timeout_s):
        raise _Timeout(f"timed out after {timeout_s:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _slice(obs: Obs, i: int) -> Obs:
    return {k: v[i : i + 1] for k, v in obs.items()}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _Timeout):
        return f"expert {exc}"
    return f"expert raised {type(exc).__name__}: {exc}"


def _as_numpy(x: Any, what: str) -> np.ndarray:
    """numpy view of an array or a CPU torch tensor; anything else is a contract violation."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "device"):
        if str(x.device) != "cpu":
            raise ValueError(f"{what} is on device {x.device}, expected cpu")
        return x.detach().numpy()
    raise ValueError(f"{what} has type {type(x).__name__}, expected a numpy array or a CPU tensor")


def _check_answer(q: Any, n: int, action_dim: int):
    """(action float32 [n,A], valid bool [n], confidence float32 [n] | None) or ValueError."""
    if not isinstance(q, ExpertQuery):
        raise ValueError(f"returned {type(q).__name__}, expected ExpertQuery")
    action = _as_numpy(q.action, "action")
    if action.shape != (n, action_dim):
        raise ValueError(f"action has shape {action.shape}, expected ({n}, {action_dim})")
    if action.dtype.kind != "f":
        raise ValueError(f"action has dtype {action.dtype}, expected a float dtype")
    valid = _as_numpy(q.valid, "valid")
    if valid.shape != (n,) or valid.dtype != np.bool_:
        raise ValueError(f"valid has shape {valid.shape} and dtype {valid.dtype}, expected bool ({n},)")
    conf = None
    if q.confidence is not None:
        conf = _as_numpy(q.confidence, "confidence")
        if conf.shape != (n,) or conf.dtype.kind != "f":
            raise ValueError(f"confidence has shape {conf.shape} and dtype {conf.dtype}, expected float ({n},)")
        conf = conf.astype(np.float32)
    return action.astype(np.float32), valid.copy(), conf


def _one_pass(expert, obs: Obs, env_ids: np.ndarray, action_dim: int, timeout_s, strict: bool):
    """Query once; returns (action, valid, confidence, reasons, metadata) or raises the expert's failure."""
    q = _call(lambda: expert.act(obs, env_ids=env_ids), timeout_s)
    try:
        action, valid, conf = _check_answer(q, len(env_ids), action_dim)
    except ValueError as exc:
        msg = f"{type(expert).__name__}.act broke the expert contract: {exc}"
        if strict:
            raise ContractError(msg) from None
        raise _Malformed(msg) from None
    meta = dict(q.metadata)
    reasons = {int(k): str(v) for k, v in dict(meta.pop("invalid_reason", {}) or {}).items()}
    return action, valid, conf, reasons, meta


class _Malformed(Exception):
    pass


def query_expert(
    expert: ExpertActionProvider,
    obs: Obs,
    env_ids: Sequence[int] | np.ndarray,
    mapping,
    timeout_s: float | None = None,
    *,
    strict: bool = False,
) -> ExpertQuery:
    """Ask ``expert`` for labels of ``obs`` (row i = env ``env_ids[i]``) and return them in RAW space.

    Failures never raise here (unless ``strict``): a raising, timing-out or malformed batch is retried
    row by row so that only the rows that fail are invalid; non-finite rows are invalid; every invalid
    row gets a reason in metadata["invalid_reason"] and NaN in ``action``. Caller mistakes (obs rows
    that do not match env_ids, an unknown output_space) raise ContractError.
    """
    t0 = now_ns()
    env_ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
    n = len(env_ids)
    name = type(expert).__name__
    for key, value in obs.items():
        if np.shape(value)[:1] != (n,):
            raise ContractError(f"query_expert({name}): obs['{key}'] has {np.shape(value)[:1]} rows, expected {n} (one per env_id)")
    space = getattr(expert, "output_space", None)
    if space not in OUTPUT_SPACES:
        raise ContractError(f"query_expert: {name}.output_space is {space!r}, expected one of {OUTPUT_SPACES}")
    a_dim = int(mapping.action_dim)
    if n == 0:  # nothing to ask (e.g. no row needs a label this tick)
        return ExpertQuery(
            action=np.zeros((0, a_dim), np.float32), valid=np.zeros(0, bool),
            metadata={"invalid_reason": {}, "output_space": space, "isolated": False, "expert_ns": 0,
                      "latency_ns": int(now_ns() - t0)},
        )

    action = np.full((n, a_dim), np.nan, dtype=np.float32)
    valid = np.zeros(n, dtype=bool)
    conf: np.ndarray | None = None
    reasons: dict[int, str] = {}
    meta: dict[str, Any] = {}
    isolated = False
    t_expert = now_ns()
    try:
        action, valid, conf, reasons, meta = _one_pass(expert, obs, env_ids, a_dim, timeout_s, strict)
    except ContractError:
        raise
    except BaseException as exc:  # noqa: BLE001 - becomes per-row invalid labels
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        if n == 1 or isinstance(exc, _Malformed):
            reasons = {int(e): str(exc) if isinstance(exc, _Malformed) else _reason(exc) for e in env_ids}
        else:
            isolated = True
            action, valid, conf, reasons, meta = _isolate(expert, obs, env_ids, a_dim, timeout_s, strict)
    expert_ns = now_ns() - t_expert

    finite = np.isfinite(action).all(axis=1)
    if not finite.all():
        for i in np.flatnonzero(valid & ~finite):
            reasons[int(env_ids[i])] = "expert returned non-finite values (NaN/inf)"
        valid &= finite
    if conf is not None:
        conf = np.where(valid & np.isfinite(conf), np.clip(conf, 0.0, 1.0), np.nan).astype(np.float32)

    to_raw = mapping.expert_to_raw if space == "raw" else mapping.policy_to_raw
    all_valid = bool(valid.all())
    raw = np.asarray(to_raw(action if all_valid else np.where(valid[:, None], action, 0.0)), dtype=np.float32)
    raw_ok = np.isfinite(raw).all(axis=1)
    if not raw_ok.all():
        for i in np.flatnonzero(valid & ~raw_ok):
            reasons[int(env_ids[i])] = f"mapping {space}->raw produced non-finite values"
        valid &= raw_ok
        all_valid = False
    if not all_valid:
        raw = np.where(valid[:, None], raw, np.float32(np.nan)).astype(np.float32)

    meta.update(
        invalid_reason=invalid_rows(env_ids, valid, reasons) if not all_valid else {},
        output_space=space,
        isolated=isolated,
        expert_ns=int(expert_ns),
        latency_ns=int(now_ns() - t0),
    )
    return ExpertQuery(action=raw, valid=valid, confidence=conf, metadata=meta)


def _isolate(expert, obs: Obs, env_ids: np.ndarray, a_dim: int, timeout_s, strict: bool):
    """Re-ask row by row after a whole-batch failure, so one bad env cannot spoil the others' labels.

    With a timeout the rows run concurrently and share one deadline (worst case ~2x timeout_s per query);
    without one they run in order.
    """
    n = len(env_ids)
    action = np.full((n, a_dim), np.nan, dtype=np.float32)
    valid = np.zeros(n, dtype=bool)
    conf = None
    reasons: dict[int, str] = {}
    meta: dict[str, Any] = {}
    results: list = [None] * n

    def row(i: int):
        try:
            results[i] = (True, _one_pass(expert, _slice(obs, i), env_ids[i : i + 1], a_dim, None, strict))
        except BaseException as exc:  # noqa: BLE001
            results[i] = (False, exc)

    if timeout_s is None:
        for i in range(n):
            row(i)
    else:
        threads = [threading.Thread(target=row, args=(i,), daemon=True, name="expert-row") for i in range(n)]
        deadline = now_ns() + int(timeout_s * 1e9)
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, (deadline - now_ns()) / 1e9))
    for i in range(n):
        e = int(env_ids[i])
        res = results[i]
        if res is None:
            reasons[e] = _reason(_Timeout(f"timed out after {timeout_s:g} s"))
            continue
        ok, value = res
        if not ok:
            if isinstance(value, ContractError):
                raise value
            reasons[e] = str(value) if isinstance(value, _Malformed) else _reason(value)
            continue
        a, v, c, r, m = value
        action[i], valid[i] = a[0], v[0]
        reasons.update(r)
        if c is not None:
            if conf is None:
                conf = np.full(n, np.nan, dtype=np.float32)
            conf[i] = c[0]
        for k, val in m.items():  # per-row arrays are re-assembled; scalars keep the last value
            if isinstance(val, np.ndarray) and val.shape[:1] == (1,):
                meta.setdefault(k, np.zeros((n, *val.shape[1:]), dtype=val.dtype))[i] = val[0]
            else:
                meta[k] = val
    return action, valid, conf, reasons, meta
