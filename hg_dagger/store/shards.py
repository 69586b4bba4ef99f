"""Appending rows to a sharded zarr array by writing its shard objects directly.

Why: going through zarr's setitem, every flush re-reads the open shard, decodes and re-encodes its partial
chunk, and pays Python overhead per chunk in zarr's event loop; for camera streams that cost more than the
compression itself, and for the recorder's many small numeric arrays it was most of its background CPU. This writer
keeps the open shard's encoded chunks and its partial chunk in memory and writes each shard object whole: the same
bytes zarr itself writes for this array (same chunk codec, the zarr v3 sharding format with the index at the end),
so plain zarr reads the array as usual.

Each flush rewrites only the open shard (one atomic object write, like any zarr chunk write); chunks of rows
already committed are re-used byte for byte, never re-encoded. Chunks that hold only the fill value are left out of
the shard's index (the format's "missing chunk", read as the fill value), and a shard with no other chunk is not
written at all: a field that stays at its fill costs no file. It is used only for arrays whose codecs it recognises
(`RowShardWriter.supports`); anything else goes through zarr.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import google_crc32c
import numcodecs  # type: ignore[import-untyped]
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.codecs.sharding import ShardingCodecIndexLocation
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_grids import RegularChunkGrid
from zarr.core.metadata.v3 import ArrayV3Metadata

from hg_dagger.store.codecs import (
    FrameFilterCodec,
    RowMedianCodec,
    frame_filter_encode,
    row_median_encode,
    thread_buffer,
)

_EMPTY = np.iinfo(np.uint64).max  # index entry of a chunk that is not stored
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}  # as zarr's BloscCodec hands them to numcodecs
_Encoded = bytes | Future[bytes] | None  # a chunk of the open shard: encoded, being encoded, or all fill (not stored)


def _sharded(arr: zarr.Array[Any]) -> tuple[ArrayV3Metadata, ShardingCodec, tuple[int, ...]] | None:
    """A v3 array's metadata, its one sharding codec and its shard shape; None for any other layout."""
    meta = arr.metadata
    if not isinstance(meta, ArrayV3Metadata) or len(meta.codecs) != 1:
        return None
    sh = meta.codecs[0]
    if not isinstance(sh, ShardingCodec) or not isinstance(meta.chunk_grid, RegularChunkGrid):
        return None
    return meta, sh, tuple(meta.chunk_grid.chunk_shape)


def _chunk_compressor(arr: zarr.Array[Any], inner: list[Any]) -> tuple[Any, Callable[..., np.ndarray] | None] | None:
    """(numcodecs compressor, frame filter or None) that encodes a chunk exactly as the inner codecs do; None for
    inner codecs other than bytes (little-endian, or none for 1-byte types) then zstd or blosc, with the frame
    filters only on 1-byte types."""
    dtype = np.dtype(arr.dtype)
    prepare = None
    if inner and isinstance(inner[0], RowMedianCodec):
        prepare, inner = row_median_encode, inner[1:]
    elif len(inner) == 3 and isinstance(inner[1], FrameFilterCodec):
        prepare, inner = frame_filter_encode, [inner[0], inner[2]]
    if (len(inner) != 2 or not isinstance(inner[0], BytesCodec) or dtype.kind not in "biuf"
            or dtype.itemsize not in (1, 2, 4, 8) or (prepare is not None and dtype.itemsize != 1)):
        return None
    endian = inner[0].endian
    if not (dtype.itemsize == 1 or (endian is not None and endian.value == "little")):
        return None
    codec = inner[1]
    if isinstance(codec, ZstdCodec):
        return numcodecs.Zstd(level=codec.level, checksum=codec.checksum), prepare
    if isinstance(codec, BloscCodec) and prepare is None:
        return numcodecs.Blosc(cname=codec.cname.value, clevel=codec.clevel, shuffle=_BLOSC_SHUFFLE[codec.shuffle.value],
                               blocksize=codec.blocksize, typesize=codec.typesize), None
    return None


def only_fill(rows: np.ndarray, fill: Any) -> bool:
    """True if every value of rows has exactly the fill value's bits, so that leaving them unwritten reads them back
    unchanged (-0.0 against a 0.0 fill, or a NaN of another payload, counts as data). Looks at the first value before
    scanning the rest: real data rarely starts with the fill."""
    if rows.size == 0:
        return True
    if rows.dtype.kind not in "biuf" or rows.dtype.itemsize not in (1, 2, 4, 8):
        return bool((rows == fill).all())
    bits = np.dtype(f"{rows.dtype.str[0]}u{rows.dtype.itemsize}")  # same byte order as rows
    want = np.asarray(fill, dtype=rows.dtype).view(bits)
    u = rows.view(bits)
    return bool(u.flat[0] == want) and bool((u == want).all())


class RowShardWriter:
    """Appends rows to one sharded array whose chunks span whole rows (axis 0 only): numeric fields and row indexes
    (bytes + blosc) and camera frames (bytes + zstd, with the per-chunk frame filter, the row-median filter or
    neither)."""

    POOL_CHUNK_BYTES = 256 << 10
    """Chunks at least this large (camera frames) are encoded in the encoder pool, in parallel with copying the next
    rows; smaller ones (numeric arrays) right away in the caller's thread: with a 64-env control loop on two cores,
    handing them to the pool gained nothing and its hand-offs added background CPU."""

    def __init__(self, arr: zarr.Array[Any]):
        layout = _sharded(arr)
        found = _chunk_compressor(arr, list(layout[1].codecs)) if layout is not None and self.supports(arr) else None
        if layout is None or found is None:
            raise ValueError(f"{arr.path}: codecs not supported by RowShardWriter")
        self._meta, sharding, shard_shape = layout
        self._codec, self._prepare = found
        self._arr = arr
        self.chunk_rows = sharding.chunk_shape[0]
        self.shard_rows = shard_shape[0]
        self.chunks_per_shard = self.shard_rows // self.chunk_rows
        self.row_shape = tuple(arr.shape[1:])
        self.dtype = np.dtype(arr.dtype).newbyteorder("<")  # the bytes codec's order ('|' stays for 1-byte types)
        self.fill = np.asarray(arr.fill_value, dtype=self.dtype)
        self.rows = 0  # rows appended so far
        self.closed = False
        self._pooled = self.chunk_rows * int(np.prod(self.row_shape)) * self.dtype.itemsize >= self.POOL_CHUNK_BYTES
        self._encoded: list[_Encoded] = []  # full chunks of the open shard
        self._fresh = False  # the open shard gained a stored chunk since it was last written
        self._free: list[np.ndarray] = []  # chunk buffers to reuse (fresh large arrays cost page faults)
        self._tail = self._new_chunk()  # rows of the open chunk (the first rows % chunk_rows are set)
        self._tail_data = False  # the open chunk holds a value other than the fill

    @staticmethod
    def supports(arr: zarr.Array[Any]) -> bool:
        """True for the layouts this writer reproduces exactly: one ShardingCodec over whole-row chunks with inner
        codecs [bytes, blosc], [bytes, zstd], [bytes, frame_filter, zstd] or [row_median, bytes, zstd] (see
        _chunk_compressor) and the default [bytes(little), crc32c] index at the end, default chunk keys."""
        layout = _sharded(arr)
        if layout is None:
            return False
        meta, sh, shard = layout
        if sh.index_location != ShardingCodecIndexLocation.end:
            return False
        chunk = tuple(sh.chunk_shape)
        rows_only = chunk[1:] == tuple(arr.shape[1:]) == shard[1:] and shard[0] % chunk[0] == 0
        index_ok = (len(sh.index_codecs) == 2 and isinstance(sh.index_codecs[0], BytesCodec)
                    and sh.index_codecs[0].endian is not None and sh.index_codecs[0].endian.value == "little"
                    and isinstance(sh.index_codecs[1], Crc32cCodec))
        keys_ok = meta.chunk_key_encoding.to_dict() == {"name": "default", "configuration": {"separator": "/"}}
        return rows_only and index_ok and keys_ok and _chunk_compressor(arr, list(sh.codecs)) is not None

    def _new_chunk(self) -> np.ndarray:
        return self._free.pop() if self._free else np.empty((self.chunk_rows, *self.row_shape), self.dtype)

    def _encode(self, chunk: np.ndarray, recycle: bool) -> bytes:
        """Runs in the encoder pool for large chunks (numpy, zstd and blosc release the GIL); a recycled chunk buffer
        is reused afterwards, and so is the filtered copy (the compressor has read it before this returns)."""
        if self._prepare is None:
            data = bytes(self._codec.encode(chunk.reshape(-1).view(np.uint8)))  # the bytes codec's output
        else:
            work = thread_buffer("shard chunk", chunk.nbytes + 1)  # room for the frame filter's predictor byte
            out = work if self._prepare is frame_filter_encode else work[:chunk.nbytes].view(chunk.dtype).reshape(chunk.shape)
            data = bytes(self._codec.encode(self._prepare(chunk, out=out)))
        if recycle and len(self._free) < self.chunks_per_shard:  # a bounded pool of buffers
            self._free.append(chunk)
        return data

    def _take_tail(self) -> _Encoded:
        """Encode the full open chunk (None if it is all fill) and start a new one."""
        if not self._tail_data:
            return None
        self._fresh, self._tail_data = True, False
        if not self._pooled:
            return self._encode(self._tail, recycle=False)  # the buffer stays the open chunk
        job = _encoder_pool().submit(self._encode, self._tail, True)
        self._tail = self._new_chunk()
        return job

    def append(self, rows: Sequence[np.ndarray] | np.ndarray) -> list[Coroutine[Any, Any, None]]:
        """Take rows [self.rows, self.rows + len(rows)) (an array, or a sequence of row arrays such as camera
        frames); return coroutines that write the shards they touch, none for shards that hold only fill so far.

        Await all of them (e.g. with asyncio.gather) before the next append and before committing the rows."""
        if self.closed:
            raise RuntimeError(f"{self._arr.path}: append after close")
        jobs = []
        pos, total = 0, len(rows)
        while pos < total:
            n = self.rows % self.chunk_rows
            take = min(self.chunk_rows - n, total - pos)
            block = self._tail[n:n + take]
            if isinstance(rows, np.ndarray):
                block[...] = rows[pos:pos + take]
            else:
                for i in range(take):
                    block[i] = rows[pos + i]
            self._tail_data = self._tail_data or not only_fill(block, self.fill)
            pos += take
            self.rows += take
            if n + take == self.chunk_rows:
                self._encoded.append(self._take_tail())
                if len(self._encoded) == self.chunks_per_shard:
                    if self._fresh:
                        jobs.append(self._write((self.rows - 1) // self.shard_rows, self._encoded, None))
                    self._encoded, self._fresh = [], False
        n = self.rows % self.chunk_rows
        if total and (self._fresh or (n and self._tail_data)):  # the open shard changed and holds data
            partial: _Encoded = None
            if n and self._tail_data:
                self._tail[n:] = self.fill  # zarr pads a partial chunk with the fill; the next append overwrites it
                partial = (_encoder_pool().submit(self._encode, self._tail, False) if self._pooled
                           else self._encode(self._tail, recycle=False))
            jobs.append(self._write(self.rows // self.shard_rows, self._encoded, partial))
            self._fresh = False
        return jobs

    def close(self) -> None:
        """Drop the open shard's buffers; the array's shard objects stay as the last append's writes left them."""
        self.closed = True
        self._encoded, self._free, self._tail = [], [], self._tail[:0]

    async def _write(self, shard: int, chunks: list[_Encoded], partial: _Encoded) -> None:
        done: list[bytes | None] = []
        for i, c in enumerate(chunks):  # the open shard's list keeps the bytes for its next rewrite
            chunks[i] = encoded = await _resolved(c)
            done.append(encoded)
        if partial is not None:
            done.append(await _resolved(partial))
        data = shard_object(done, self.chunks_per_shard)
        key = self._meta.encode_chunk_key((shard, *(0 for _ in self.row_shape)))
        await (self._arr.async_array.store_path / key).set(default_buffer_prototype().buffer.from_bytes(data))


async def _resolved(chunk: _Encoded) -> bytes | None:
    if isinstance(chunk, Future):
        encoded: bytes = await asyncio.wrap_future(chunk)
        return encoded
    return chunk


_POOL: ThreadPoolExecutor | None = None


def one_zarr_worker() -> None:
    """For a process that is a control loop, before it opens a store: zarr's I/O pool gets one thread. On two
    cores, zarr's workers beside the control thread doubled its slowest ticks (docs/benchmarks.md)."""
    zarr.config.set({"threading.max_workers": 1})


def _encoder_pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="hg-dagger-encode")
    return _POOL


def _forget_pool_in_child() -> None:
    global _POOL
    _POOL = None  # a forked child has none of the parent's threads: it starts its own pool on first use


os.register_at_fork(after_in_child=_forget_pool_in_child)


def shard_object(chunks: Sequence[bytes | None], chunks_per_shard: int) -> bytes:
    """A zarr v3 shard: the encoded chunks back to back, then the index of (offset, nbytes) little-endian
    uint64 pairs (all ones for a missing chunk: None, or past the end of chunks) followed by the index's crc32c."""
    index = np.full((chunks_per_shard, 2), _EMPTY, dtype="<u8")
    offset = 0
    for i, c in enumerate(chunks):
        if c is not None:
            index[i] = (offset, len(c))
            offset += len(c)
    index_bytes = index.tobytes()
    return b"".join([*(c for c in chunks if c is not None), index_bytes,
                     struct.pack("<I", google_crc32c.value(index_bytes))])
