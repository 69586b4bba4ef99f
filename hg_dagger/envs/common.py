"""Small helpers every backend shares: which rows a reset touches, which seed each row gets, and
fitting a camera frame into the operator's square view."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hg_dagger.errors import EnvError


def rows_of(env_ids: Sequence[int] | None, num_envs: int, *, where: str) -> np.ndarray:
    """env_ids -> int64 row indices (all rows for None); refuses out-of-range or repeated ids."""
    if env_ids is None:
        return np.arange(num_envs, dtype=np.int64)
    rows = np.asarray(env_ids, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= num_envs):
        raise EnvError(f"{where}: env_ids {rows.tolist()} out of range 0..{num_envs - 1}")
    if len(np.unique(rows)) != len(rows):
        raise EnvError(f"{where}: env_ids {rows.tolist()} repeat a row")
    return rows


def row_seeds(seed: int | Sequence[int] | None, rows: np.ndarray, *, where: str) -> list[int | None]:
    """One seed per reset row: an int seeds row r with seed + r (so a row's episode does not depend on
    which other rows reset with it); a sequence gives one seed per row in env_ids order; None keeps
    each row's random stream going."""
    if seed is None:
        return [None] * len(rows)
    if isinstance(seed, int | np.integer):
        return [int(seed) + int(r) for r in rows]
    seeds: list[int | None] = [int(s) for s in seed]
    if len(seeds) != len(rows):
        raise EnvError(f"{where}: {len(seeds)} seeds for {len(rows)} reset rows")
    return seeds


def image_keys(mapping) -> list[str]:
    """Observation keys of the mapping that hold an RGB image (uint8 [H, W, 3])."""
    return [k.name for k in mapping.observation if k.dtype == "uint8" and len(k.shape) == 3 and k.shape[2] == 3]


def fit_image(img: np.ndarray, size: int) -> np.ndarray:
    """An RGB frame [H, W, 3] -> uint8 [size, size, 3]: centre-cropped to a square, then
    nearest-neighbour resampled (numpy only; a live view needs no filtering)."""
    img = np.asarray(img)
    h, w = img.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    idx = (np.arange(size) * side) // size
    return np.ascontiguousarray(img[top + idx[:, None], left + idx[None, :], :3], dtype=np.uint8)
