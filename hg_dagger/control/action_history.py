"""What each row's open episode applied, from the seed of its reset on: what a rewind re-runs to take a simulated
row back (control.session_rewind, envs.rewind)."""

from __future__ import annotations

import numpy as np


class ActionHistory:
    """Per row: the seed of its open episode's reset and every action applied since (a branch's included: the
    actions of its parents up to where it branched), which is what a rewind re-runs. One list of the ticks'
    applied actions is shared by the rows (a tick costs one append); what no open episode needs is dropped."""

    def __init__(self, num_envs: int):
        self.seed: list[int | None] = [None] * num_envs
        self._ticks: list[tuple[np.ndarray, np.ndarray]] = []  # (applied [N, A], rows stepped [N]) per tick
        self._dropped = 0  # ticks dropped from the front
        self._first = [0] * num_envs  # the tick at which each row's open episode began
        self._before: list[np.ndarray | None] = [None] * num_envs  # a branch's parents' actions

    def start(self, row: int, seed: int | None, before: np.ndarray | None = None) -> None:
        """``row`` begins an episode from a reset with ``seed`` (after ``before``, a branch's parents' actions)."""
        self.seed[row] = seed
        self._before[row] = None if before is None or not len(before) else np.asarray(before, np.float32)
        self._first[row] = self._dropped + len(self._ticks)
        self._trim()

    def stop(self, row: int) -> None:
        """``row``'s episode ended: nothing of it is needed any more."""
        self.seed[row] = None
        self._before[row] = None
        self._trim()

    def append(self, rows: np.ndarray, applied: np.ndarray) -> None:
        if rows.any():
            self._ticks.append((np.array(applied, np.float32), rows.copy()))

    def until(self, row: int, step: int) -> np.ndarray:
        """The actions that lead to the open episode's ``step`` (its parents' included), [k, A]."""
        own = [a[row] for a, stepped in self._ticks[self._first[row] - self._dropped:] if stepped[row]][:step]
        before = self._before[row]
        parts = ([before] if before is not None else []) + ([np.stack(own)] if own else [])
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def _trim(self) -> None:
        open_rows = [f for f, s in zip(self._first, self.seed, strict=True) if s is not None]
        keep_from = min(open_rows) if open_rows else self._dropped + len(self._ticks)
        drop = keep_from - self._dropped
        if drop > 0:
            del self._ticks[:drop]
            self._dropped += drop


__all__ = ["ActionHistory"]
