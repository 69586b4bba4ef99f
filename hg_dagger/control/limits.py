"""Action limits shared by the constraint gate (which measures them) and the safety monitor (which enforces them).

One description of the feasible set, two uses: the gate asks "how close is the proposed action to a limit"
(normalized usage, 1.0 = on the limit), the monitor clamps the command into the set. All actions are in
the task's canonical raw action space.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, model_validator

from hg_dagger.contract.model import StrictModel


class StateBox(StrictModel):
    """Bounds on a state predicted one step ahead: ``obs[obs_key][:, index] + gain * action[:, action_index]``.

    With a delta-position action this is a workspace box on the end effector; with joint-delta actions
    and joint positions in the observation it is a joint-limit check.
    """

    name: str = "workspace"
    obs_key: str
    index: list[int] = Field(min_length=1)
    action_index: list[int] = Field(min_length=1)
    gain: float = Field(gt=0, description="state units per action unit per step")
    low: list[float]
    high: list[float]

    @model_validator(mode="after")
    def _shapes(self) -> StateBox:
        n = len(self.index)
        if not (len(self.action_index) == len(self.low) == len(self.high) == n):
            raise ValueError(f"box {self.name!r}: index, action_index, low and high need the same length ({n})")
        if any(lo >= hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError(f"box {self.name!r}: every low must be below its high")
        return self


class ActionLimits(StrictModel):
    """The feasible set of raw actions: per-dim bounds (velocity for delta actions), per-tick change
    (acceleration) and state boxes (workspace, joints)."""

    low: list[float] | None = None
    high: list[float] | None = None
    max_delta: list[float] | None = Field(default=None, description="largest change per tick, per dim")
    boxes: list[StateBox] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shapes(self) -> ActionLimits:
        if (self.low is None) != (self.high is None):
            raise ValueError("give both low and high, or neither")
        if self.low is not None and self.high is not None and (len(self.low) != len(self.high) or any(lo >= hi for lo, hi in zip(self.low, self.high, strict=True))):
            raise ValueError("low and high need the same length and every low below its high")
        if self.max_delta is not None and any(d <= 0 for d in self.max_delta):
            raise ValueError("max_delta values must be > 0")
        return self

    def check_dim(self, action_dim: int, *, where: str) -> None:
        """Raise ValueError naming ``where`` when a limit does not fit the task's action size."""
        for key in ("low", "high", "max_delta"):
            v = getattr(self, key)
            if v is not None and len(v) != action_dim:
                raise ValueError(f"{where}: {key} has {len(v)} values, the task's action has {action_dim} dims")
        for b in self.boxes:
            if max(b.action_index) >= action_dim:
                raise ValueError(f"{where}: box {b.name!r} uses action dim {max(b.action_index)} of {action_dim}")


class CompiledLimits:
    """ActionLimits as numpy arrays, for the hot path."""

    def __init__(self, limits: ActionLimits, action_dim: int):
        self.spec = limits
        f32 = np.float32
        self.low = None if limits.low is None else np.asarray(limits.low, f32)
        self.high = None if limits.high is None else np.asarray(limits.high, f32)
        self.max_delta = None if limits.max_delta is None else np.asarray(limits.max_delta, f32)
        self.boxes = [
            (b, np.asarray(b.index), np.asarray(b.action_index), f32(b.gain), np.asarray(b.low, f32), np.asarray(b.high, f32))
            for b in limits.boxes
        ]
        self.action_dim = action_dim
        if self.low is not None and self.high is not None:  # both or neither (ActionLimits)
            self._mid = (self.high + self.low) / 2
            self._inv_half = 2 / (self.high - self.low)
        if self.max_delta is not None:
            self._inv_delta = 1 / self.max_delta

    # ---- measuring (gate) ------------------------------------------------------------------

    def usage(self, action: np.ndarray, prev: np.ndarray | None, prev_ok: np.ndarray | None, obs: dict) -> np.ndarray:
        """Largest normalized limit usage per row: 0 = centre, 1.0 = on a limit, > 1 = outside. [N] float32."""
        best = np.zeros(action.shape[0], np.float32)
        if self.low is not None:
            np.maximum(best, (np.abs(action - self._mid) * self._inv_half).max(axis=1), out=best)
        if self.max_delta is not None and prev is not None:
            u = (np.abs(action - prev) * self._inv_delta).max(axis=1)
            np.maximum(best, u if prev_ok is None else np.where(prev_ok, u, 0.0), out=best)
        for b, idx, aidx, gain, lo, hi in self.boxes:
            pred = np.asarray(obs[b.obs_key])[:, idx] + gain * action[:, aidx]
            np.maximum(best, (np.abs(pred - (hi + lo) / 2) / ((hi - lo) / 2)).max(axis=1), out=best)
        return best

    def _usage_terms(self, action, prev, prev_ok, obs):
        n = action.shape[0]
        best = np.zeros(n, np.float32)
        terms: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # name, u, value, lo, hi
        if self.low is not None:
            c, h = (self.high + self.low) / 2, (self.high - self.low) / 2
            u = np.abs(action - c) / h
            terms.append(("action_bounds", u, action, np.broadcast_to(self.low, u.shape), np.broadcast_to(self.high, u.shape)))
        if self.max_delta is not None and prev is not None:
            d = action - prev
            u = np.abs(d) / self.max_delta
            if prev_ok is not None:
                u = np.where(prev_ok[:, None], u, 0.0)
            terms.append(("max_delta", u, d, np.broadcast_to(-self.max_delta, u.shape), np.broadcast_to(self.max_delta, u.shape)))
        for b, idx, aidx, gain, lo, hi in self.boxes:
            pred = np.asarray(obs[b.obs_key])[:, idx] + gain * action[:, aidx]
            u = np.abs(pred - (hi + lo) / 2) / ((hi - lo) / 2)
            terms.append((b.name, u, pred, np.broadcast_to(lo, u.shape), np.broadcast_to(hi, u.shape)))
        for t in terms:
            np.maximum(best, t[1].max(axis=1), out=best)
        return best, terms

    def explain(self, row: int, action, prev, prev_ok, obs) -> dict[str, Any]:
        """The limit closest to (or furthest past) its bound for one row, for an event's values."""
        _, terms = self._usage_terms(action[row : row + 1], None if prev is None else prev[row : row + 1],
                                     None if prev_ok is None else prev_ok[row : row + 1],
                                     {k: np.asarray(v)[row : row + 1] for k, v in obs.items()})
        if not terms:
            return {}
        name, u, value, lo, hi = max(terms, key=lambda t: float(t[1].max()))
        j = int(np.argmax(u[0]))
        return {"check": name, "dim": j, "value": float(value[0, j]), "low": float(lo[0, j]), "high": float(hi[0, j]),
                "usage": float(u[0, j])}

    # ---- enforcing (safety) ----------------------------------------------------------------

    def clamp(self, action: np.ndarray, prev: np.ndarray | None, prev_ok: np.ndarray | None, obs: dict
              ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, np.ndarray]]]:
        """Clamp into the feasible set. Returns (clamped copy, changed [N] bool, [(limit name, changed [N])]).

        Order: per-tick change first, then state boxes, then per-dim bounds, so the bounds are the
        guarantee that always holds when limits conflict.
        """
        # np.minimum(np.maximum(...)) is np.clip without its per-call dispatch (this runs every tick)
        out = np.array(action, dtype=np.float32, copy=True)
        hits: list[tuple[str, np.ndarray]] = []
        if self.max_delta is not None and prev is not None:
            lim = np.minimum(np.maximum(out, prev - self.max_delta), prev + self.max_delta)
            if prev_ok is not None and not prev_ok.all():
                lim = np.where(prev_ok[:, None], lim, out)
            hits.append(("max_delta", (lim != out).any(axis=1)))
            out = lim
        for b, idx, aidx, gain, lo, hi in self.boxes:
            s = np.asarray(obs[b.obs_key])[:, idx].astype(np.float32)
            sub = out[:, aidx]
            lim = np.minimum(np.maximum(sub, (lo - s) / gain), (hi - s) / gain)
            hits.append((b.name, (lim != sub).any(axis=1)))
            out[:, aidx] = lim
        if self.low is not None and self.high is not None:  # both or neither (ActionLimits)
            lim = np.minimum(np.maximum(out, self.low), self.high)
            hits.append(("action_bounds", (lim != out).any(axis=1)))
            out = lim
        changed = (out != action).any(axis=1)
        return out, changed, hits
