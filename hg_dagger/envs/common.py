"""Small helpers every backend shares: which rows a reset touches and which seed each row gets."""

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
    seeds = [int(s) for s in seed]
    if len(seeds) != len(rows):
        raise EnvError(f"{where}: {len(seeds)} seeds for {len(rows)} reset rows")
    return seeds
