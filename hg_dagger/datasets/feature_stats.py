"""meta/stats.json of a LeRobot export (and the statistics of an RLinf one): running per-feature statistics and
quantiles over every exported row, in bounded memory."""

from __future__ import annotations

import warnings

import numpy as np

STATS_ROWS = 32768
IMAGE_STATS_FRAMES = 256  # frames per read group that image statistics sample
QUANTILE_ROWS = 100_000  # rows per feature the quantiles are computed from
QUANTILES = (1, 10, 50, 90, 99)  # stats.json q01 ... q99


class FeatureStats:
    """Running min / max / mean / std / count per feature (finite values only), LeRobot's stats.json layout, and
    the quantiles LeRobot's QUANTILES / QUANTILE10 normalization reads (q01, q10, q50, q90, q99), from a seeded
    uniform sample of at most QUANTILE_ROWS rows per feature (exact below that)."""

    def __init__(self):
        self.acc: dict[str, list] = {}
        self.sample: dict[str, tuple[int, np.ndarray]] = {}  # name -> (rows seen, sample array)
        self.rng = np.random.default_rng(0)

    def add(self, name: str, values: np.ndarray) -> None:
        for lo in range(0, len(values), STATS_ROWS):  # bounded temporaries: float64 copies of a slice at a time
            self._add(name, values[lo:lo + STATS_ROWS])

    def _add(self, name: str, values: np.ndarray) -> None:
        v = values.reshape(len(values), -1).astype(np.float64)
        ok = np.isfinite(v)
        z = np.where(ok, v, 0.0)
        lo = np.where(ok, v, np.inf).min(0)
        hi = np.where(ok, v, -np.inf).max(0)
        a = self.acc.get(name)
        part = [ok.sum(0), z.sum(0), (z * z).sum(0), lo, hi]
        if a is None:
            self.acc[name] = part
        else:
            a[0] += part[0]
            a[1] += part[1]
            a[2] += part[2]
            np.minimum(a[3], part[3], out=a[3])
            np.maximum(a[4], part[4], out=a[4])
        self._sample(name, np.where(ok, v, np.nan).astype(np.float32))

    def _sample(self, name: str, v: np.ndarray) -> None:
        """Reservoir sampling (algorithm R, vectorized per batch)."""
        seen, kept = self.sample.get(name, (0, v[:0]))
        room = max(QUANTILE_ROWS - len(kept), 0)
        kept = np.concatenate([kept, v[:room]])
        rest = v[room:]
        if len(rest):
            slot = self.rng.integers(0, seen + room + 1 + np.arange(len(rest)))
            take = slot < QUANTILE_ROWS
            kept[slot[take]] = rest[take]
        self.sample[name] = (seen + len(v), kept)

    def add_images(self, name: str, frames: np.ndarray) -> None:
        """Per-channel statistics of frames scaled to [0, 1], as LeRobot stores them ((C, 1, 1)), from a sample:
        at most IMAGE_STATS_FRAMES frames of each batch and every 4th pixel row and column (LeRobot samples too)."""
        sample = frames[:: max(1, len(frames) // IMAGE_STATS_FRAMES), ::4, ::4]
        self.add(name, sample.reshape(-1, frames.shape[-1]).astype(np.float32) / np.float32(255.0))

    def to_json(self, image_keys: set[str]) -> dict:
        out = {}
        for name, (n, s, ss, lo, hi) in self.acc.items():
            cnt = np.maximum(n, 1)
            mean = s / cnt
            std = np.sqrt(np.maximum(ss / cnt - mean * mean, 0.0))
            stats = {"min": lo, "max": hi, "mean": mean, "std": std}
            kept = self.sample[name][1].astype(np.float64)
            for q in QUANTILES:
                if len(kept):
                    with warnings.catch_warnings():  # an all-NaN column gives NaN, written as 0 below
                        warnings.simplefilter("ignore", RuntimeWarning)
                        stats[f"q{q:02d}"] = np.nanquantile(kept, q / 100, axis=0)
                else:
                    stats[f"q{q:02d}"] = np.zeros_like(mean)
            if name in image_keys:
                stats = {k: v.reshape(-1, 1, 1) for k, v in stats.items()}
            out[name] = {k: np.where(np.isfinite(v), v, 0.0).tolist() for k, v in stats.items()}
            out[name]["count"] = [int(n.max(initial=0))]
        return out
