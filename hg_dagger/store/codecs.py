"""Lossless predictive filters for camera frames, as zarr v3 codecs placed before zstd.

Why: zstd alone finds repeats but no gradients, so frames with sensor noise cost ~1.8x PNG. Replacing every pixel by
its difference to a prediction from the row above leaves small residuals that zstd's entropy coder packs below PNG.
Rendered frames are the other way round: their flat areas repeat the row above exactly, zstd alone packs them
smaller than the residuals do, and skipping the filter halves their encoding time. So each chunk says which it is.

The row-median prediction (docs/data-format.md, "Camera frame filter"): for a chunk of shape (n, H, W, ...) of
unsigned integers, row 0 of each frame is stored as is; for y >= 1, ``p[y, x] = median(u[x-1], u[x], u[x+1])`` with
``u`` the frame's row y-1 (``u[-1] = u[0]``, ``u[W] = u[W-1]``, per channel), and the stored value is
``(v[y, x] - p[y, x]) mod 2**bits``. Decoding adds the prediction back row by row; the round trip is exact.

Two codecs carry it:
- ``hg_dagger.frame_filter`` (written now): bytes-to-bytes, after ``bytes``: one byte naming the chunk's predictor
  (0: none, 1: row median), then the chunk's values, filtered or not. The predictor is chosen per chunk from its first
  frame (`choose_predictor`).
- ``hg_dagger.row_median`` (read only, segments written before the per-chunk choice): array-to-array, every chunk
  filtered.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from zarr.abc.codec import ArrayArrayCodec, BytesBytesCodec
from zarr.core.common import JSON, parse_named_configuration
from zarr.registry import register_codec

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

ROW_MEDIAN = "hg_dagger.row_median"  # the every-chunk filter's name in zarr.json (read only)
FRAME_FILTER = "hg_dagger.frame_filter"  # the per-chunk filter's name in zarr.json
NO_PREDICTOR, ROW_MEDIAN_PREDICTOR = 0, 1  # the first byte of a frame_filter chunk


def _rows(frames: np.ndarray) -> tuple[np.ndarray, int]:
    """The chunk as (n, H, W * C) rows, and C: a pixel's left and right neighbours are C values away."""
    c = int(np.prod(frames.shape[3:], dtype=np.int64))
    return frames.reshape(*frames.shape[:2], -1), c


def _median3(left: np.ndarray, mid: np.ndarray, right: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    lo = np.minimum(left, mid, out=out)
    hi = np.maximum(left, mid, out=scratch)
    np.minimum(hi, right, out=hi)
    np.maximum(lo, hi, out=lo)


def row_median_encode(frames: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Residuals of a chunk (n, H, W, ...) of unsigned integers; same shape and dtype (written into ``out``, a
    contiguous array of that shape and dtype, when given: fresh large arrays cost more in page faults than the filter).

    The whole chunk is one flat run: a value's neighbours in the row above are L - C, L and L + C values back (L =
    W * C). That wrongly predicts the edge columns and each frame's row 0 from the neighbouring row or frame; those few
    values are then overwritten with their definition."""
    frames = np.ascontiguousarray(frames)
    f, c = _rows(frames)
    n, h, width = f.shape
    flat = f.reshape(-1)
    res = np.empty_like(flat) if out is None else out.reshape(-1)
    if h > 1 and width > 2 * c:
        m = flat.size - width - c
        pred = res[width + c:]
        _median3(flat[:m], flat[c:c + m], flat[2 * c:2 * c + m], pred, thread_buffer("median", m, flat.dtype))
        np.subtract(flat[width + c:], pred, out=pred)  # wraps modulo 2**bits
    r = res.reshape(f.shape)
    r[:, 0] = f[:, 0]
    # the edge columns: median(u[0], u[0], u[1]) = u[0] and median(u[W-2], u[W-1], u[W-1]) = u[W-1], the value above
    np.subtract(f[:, 1:, :c], f[:, :-1, :c], out=r[:, 1:, :c])
    np.subtract(f[:, 1:, -c:], f[:, :-1, -c:], out=r[:, 1:, -c:])
    return res.reshape(frames.shape)


_local = threading.local()


def thread_buffer(key: str, size: int, dtype: Any = np.uint8) -> np.ndarray:
    """This thread's work array ``key``, reused while calls ask for the same size and dtype (fresh large arrays cost
    more in page faults than the filter). Its contents are the caller's only until the thread asks for ``key`` again."""
    buf = getattr(_local, key, None)
    if buf is None or buf.size != size or buf.dtype != dtype:
        buf = np.empty(size, dtype)
        setattr(_local, key, buf)
    return buf


def row_median_decode(residuals: np.ndarray) -> np.ndarray:
    """The frames that ``row_median_encode`` turned into ``residuals``."""
    r, c = _rows(np.ascontiguousarray(residuals))
    out = np.empty_like(r)
    out[:, 0] = r[:, 0]
    pred, scratch = np.empty_like(r[:, 0, c:-c]), np.empty_like(r[:, 0, c:-c])
    for y in range(1, r.shape[1]):
        up, row = out[:, y - 1], out[:, y]
        np.add(r[:, y, :c], up[:, :c], out=row[:, :c])
        np.add(r[:, y, -c:], up[:, -c:], out=row[:, -c:])
        _median3(up[:, :-2 * c], up[:, c:-c], up[:, 2 * c:], pred, scratch)
        np.add(r[:, y, c:-c], pred, out=row[:, c:-c])
    return out.reshape(residuals.shape)


def choose_predictor(frames: np.ndarray) -> int:
    """The predictor for a chunk of consecutive frames, from its first frame: none when at least half of its values
    equal the value directly above them (rendered images: zstd packs those runs better than any residual), the row
    median otherwise (sensor noise)."""
    first = frames[0].reshape(frames.shape[1], -1)
    if len(first) < 2:
        return NO_PREDICTOR
    same = np.count_nonzero(first[1:] == first[:-1])
    return NO_PREDICTOR if 2 * same >= first[1:].size else ROW_MEDIAN_PREDICTOR


def frame_filter_encode(frames: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A chunk (n, H, W, ...) of unsigned integers as ``frame_filter`` bytes: the predictor byte, then the values
    (little-endian), as a uint8 array (``out``, of 1 + frames.nbytes values, when given)."""
    frames = np.ascontiguousarray(frames)
    predictor = choose_predictor(frames)
    out = np.empty(1 + frames.nbytes, np.uint8) if out is None else out
    out[0] = predictor
    body = out[1:].view(frames.dtype.newbyteorder("<")).reshape(frames.shape)
    if predictor == ROW_MEDIAN_PREDICTOR:
        row_median_encode(frames, out=body)
    else:
        body[...] = frames
    return out


def frame_filter_decode(data: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The chunk that ``frame_filter_encode`` turned into ``data`` (uint8), given the chunk's shape and dtype."""
    data = np.asarray(data, np.uint8).reshape(-1)
    dtype = np.dtype(dtype).newbyteorder("<")
    want = 1 + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != want or data[0] not in (NO_PREDICTOR, ROW_MEDIAN_PREDICTOR):
        raise ValueError(f"{FRAME_FILTER}: a chunk of {len(data)} bytes with predictor {int(data[0]) if len(data) else None}"
                         f" does not fit shape {tuple(shape)} of {dtype}")
    body = data[1:].view(dtype).reshape(shape)
    return row_median_decode(body) if data[0] == ROW_MEDIAN_PREDICTOR else body


class _FrameCodec:
    """What both frame codecs share: a name in zarr.json and no configuration, over unsigned integer frames."""

    codec_name: ClassVar[str]
    is_fixed_size = True

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        parse_named_configuration(data, cls.codec_name, require_configuration=False)
        return cls()

    def to_dict(self) -> dict[str, JSON]:
        return {"name": self.codec_name}

    def validate(self, shape: tuple[int, ...], dtype: Any, chunk_grid: Any) -> None:
        np_dtype = dtype.to_native_dtype()
        if np_dtype.kind != "u" or len(shape) < 3:
            raise ValueError(f"{self.codec_name} needs unsigned integer arrays of rank >= 3 (n, H, W, ...); "
                             f"got {np_dtype} of rank {len(shape)}")


@dataclass(frozen=True)
class FrameFilterCodec(_FrameCodec, BytesBytesCodec):
    """zarr v3 codec ``hg_dagger.frame_filter`` (no configuration), after ``bytes``: the row-median filter or none,
    chosen per chunk and named by the chunk's first byte."""

    codec_name: ClassVar[str] = FRAME_FILTER

    async def _encode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        dtype = chunk_spec.dtype.to_native_dtype().newbyteorder("<")
        frames = chunk_bytes.as_numpy_array().view(dtype).reshape(chunk_spec.shape)
        return chunk_bytes.from_array_like(frame_filter_encode(frames))

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        dtype = chunk_spec.dtype.to_native_dtype()
        data = chunk_bytes.as_numpy_array()
        frames = await asyncio.to_thread(frame_filter_decode, data, tuple(chunk_spec.shape), dtype)
        return chunk_bytes.from_array_like(np.ascontiguousarray(frames).reshape(-1).view(np.uint8))

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        return input_byte_length + 1


@dataclass(frozen=True)
class RowMedianCodec(_FrameCodec, ArrayArrayCodec):
    """zarr v3 codec ``hg_dagger.row_median`` (no configuration): the filter above over chunk axes 1 (rows) and 2."""

    codec_name: ClassVar[str] = ROW_MEDIAN

    def resolve_metadata(self, chunk_spec: ArraySpec) -> ArraySpec:
        return chunk_spec

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> NDBuffer | None:
        data = np.ascontiguousarray(chunk_array.as_numpy_array())
        return chunk_array.from_numpy_array(row_median_encode(data))

    async def _decode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> NDBuffer:
        data = np.ascontiguousarray(chunk_array.as_numpy_array())
        return chunk_array.from_numpy_array(await asyncio.to_thread(row_median_decode, data))

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        return input_byte_length


register_codec(ROW_MEDIAN, RowMedianCodec)
register_codec(FRAME_FILTER, FrameFilterCodec)
