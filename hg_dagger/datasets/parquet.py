"""What the parquet exports (LeRobot, RLinf) share: pyarrow, imported when an export runs, and camera frames as
PNG bytes."""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from hg_dagger.datasets.source import ExportError


def pyarrow_modules():
    """(pyarrow, pyarrow.parquet), or an ExportError saying which extra installs them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency of the export extra
        raise ExportError("parquet exports (lerobot, rlinf) need pyarrow: pip install 'hg-dagger[export]'") from exc
    return pa, pq


def encode_pngs(frames: np.ndarray) -> list[bytes]:
    """PNG bytes of each frame, encoded on all cores (Pillow's encoder releases the GIL)."""
    if len(frames) < 64:
        return [_png(f) for f in frames]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(_png, frames, chunksize=16))


def _png(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    img = Image.fromarray(frame if frame.shape[-1] != 1 else frame[..., 0])
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
