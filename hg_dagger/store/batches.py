"""Step batches for training as TensorDicts: row blocks read from the segments, cut into batches of one size."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tensordict import TensorDict


def rebatch(chunks: Iterable[dict[str, np.ndarray]], batch_size: int, *, drop_last: bool) -> Iterator[TensorDict]:
    """Batches of ``batch_size`` rows from chunks of any length, in order (the last one shorter unless
    ``drop_last``)."""
    carry: list[dict[str, np.ndarray]] = []
    carried = 0
    for data in chunks:
        carry.append(data)
        carried += len(next(iter(data.values())))
        while carried >= batch_size:
            merged = {k: np.concatenate([c[k] for c in carry]) for k in data} if len(carry) > 1 else carry[0]
            yield to_tensordict({k: v[:batch_size] for k, v in merged.items()})
            rest = {k: v[batch_size:] for k, v in merged.items()}
            carried -= batch_size
            carry = [rest] if carried else []
    if carried and not drop_last:
        merged = {k: np.concatenate([c[k] for c in carry]) for k in carry[0]}
        yield to_tensordict(merged)


def to_tensordict(arrays: dict[str, np.ndarray]) -> TensorDict:
    """Arrays as a TensorDict [N]: "obs/rgb" becomes the nested key ("obs", "rgb"); uint16/uint32 become
    int32/int64 (torch has no arithmetic on them)."""
    import torch  # imported here: recording processes never pay for torch
    from tensordict import TensorDict
    n = len(next(iter(arrays.values()))) if arrays else 0
    td = TensorDict({}, batch_size=[n])
    for name, a in arrays.items():
        if a.dtype == np.uint16:
            a = a.astype(np.int32)
        elif a.dtype == np.uint32:
            a = a.astype(np.int64)
        td.set(tuple(name.split("/")), torch.from_numpy(np.ascontiguousarray(a)))
    return td
