"""What the control loop (control.loop) reads off its session for a snapshot, and how it words a fault."""

from __future__ import annotations

import numpy as np

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.control import live
from hg_dagger.errors import HgDaggerError


def loading_snapshot(store: str) -> live.Snapshot:
    """What a view reads until the session is built: loading, so Start waits."""
    return live.Snapshot(phase="loading", loading=True, store=store, message="loading the task and the student")


def store_url(rec) -> str:
    """The store a session's recorder writes to."""
    store = getattr(rec, "_store", None)
    return str(getattr(store, "url", "")) if store is not None else ""


def row_obs(s, r: int) -> dict[str, np.ndarray] | None:
    """The watched row's observation without camera images: what a person or an operator model reads."""
    if s.obs is None:
        return None
    images = {o.name for o in s.mapping.observation if o.is_image}
    return {k: np.array(v[r], copy=True) for k, v in s.obs.items() if k not in images}


def opt_time(v) -> int | None:
    v = int(v)
    return None if v == NO_TIME else v


def describe(exc: BaseException) -> str:
    if isinstance(exc, HgDaggerError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
