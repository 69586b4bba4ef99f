"""Sequence windows for chunked policies: cut a sample's steps so that no sequence straddles a handover
boundary or mixes action sources (seed 002: adjacent windows of one episode must not cross a handover
boundary or confuse action_source).

    runs = pure_runs(action_source, allowed, boundaries=[handover_start, handover_end])
    seqs = cut_sequences(runs, length=16, stride=8)     # [(start, end), ...], each inside one run
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def pure_runs(action_source: np.ndarray, keep: np.ndarray, boundaries: Iterable[int] = (),
              lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
    """Maximal runs ``[s, e)`` of steps in ``[lo, hi)`` where ``keep`` holds, that share one action source and
    contain no boundary strictly inside (a boundary ``b`` separates step ``b - 1`` from step ``b``)."""
    src = np.asarray(action_source)
    ok = np.asarray(keep, dtype=bool)
    n = len(src)
    hi = n if hi is None else min(int(hi), n)
    lo = max(int(lo), 0)
    if hi <= lo:
        return []
    cut = np.zeros(n + 1, dtype=bool)  # cut[t]: a sequence may not contain both t-1 and t
    cut[lo] = cut[hi] = True
    cut[1:n] |= src[1:] != src[:-1]
    cut[1:n] |= ok[1:] != ok[:-1]
    for b in boundaries:
        if 0 < int(b) < n:
            cut[int(b)] = True
    edges = np.flatnonzero(cut[lo:hi + 1]) + lo
    out = []
    for s, e in zip(edges[:-1], edges[1:], strict=True):
        if ok[s]:
            out.append((int(s), int(e)))
    return out


def cut_sequences(runs: Sequence[tuple[int, int]], length: int, stride: int | None = None,
                  keep_short: bool = False) -> list[tuple[int, int]]:
    """Fixed-length sequences ``[s, s + length)`` inside each run, every ``stride`` steps (default: ``length``,
    no overlap). A run shorter than ``length`` gives nothing, or itself with ``keep_short``."""
    if length <= 0:
        raise ValueError(f"sequence length must be positive, got {length}")
    stride = length if stride is None else int(stride)
    if stride <= 0:
        raise ValueError(f"sequence stride must be positive, got {stride}")
    out = []
    for s, e in runs:
        if e - s < length:
            if keep_short and e > s:
                out.append((int(s), int(e)))
            continue
        for a in range(int(s), int(e) - length + 1, stride):
            out.append((a, a + length))
    return out


def label_runs(action_source: np.ndarray, allowed: np.ndarray, windows: Iterable) -> list[tuple[int, int]]:
    """The runs of allowed labels of one episode, cut where a dataset sample's runs are cut: at every correction
    window's handover start and end (a run never joins two windows, nor a window and a certified span) and where
    the action source changes."""
    bounds = sorted({b for w in windows for b in (w.handover_start, w.handover_end)})
    return pure_runs(action_source, allowed, bounds)
