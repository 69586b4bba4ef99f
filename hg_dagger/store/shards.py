"""Appending camera frames to a sharded zarr array by writing its shard objects directly.

Why: going through zarr's setitem, every flush re-reads the open shard, decodes and re-encodes its partial
chunk, and pays Python overhead per chunk in zarr's event loop; for camera streams that cost more than the
compression itself. This writer keeps the open shard's encoded chunks and its partial chunk in memory and
writes each shard object whole: the same bytes zarr itself writes for this array (same chunk codec, the zarr v3
sharding format with the index at the end), so plain zarr reads the array as usual.

Each flush rewrites only the open shard (one atomic object write, like any zarr chunk write); chunks of rows
already committed are re-used byte for byte, never re-encoded. It is used only for arrays whose codecs it
recognises (`FrameShardWriter.supports`); anything else goes through zarr.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import google_crc32c
import numcodecs  # type: ignore[import-untyped]
import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
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


def _sharded(arr: zarr.Array[Any]) -> tuple[ArrayV3Metadata, ShardingCodec, tuple[int, ...]] | None:
    """A v3 array's metadata, its one sharding codec and its shard shape; None for any other layout."""
    meta = arr.metadata
    if not isinstance(meta, ArrayV3Metadata) or len(meta.codecs) != 1:
        return None
    sh = meta.codecs[0]
    if not isinstance(sh, ShardingCodec) or not isinstance(meta.chunk_grid, RegularChunkGrid):
        return None
    return meta, sh, tuple(meta.chunk_grid.chunk_shape)


class FrameShardWriter:
    """Appends rows to one sharded array whose chunks span whole rows (axis 0 only), codecs bytes + zstd, with the
    per-chunk frame filter between them, the row-median filter before them, or neither."""

    def __init__(self, arr: zarr.Array[Any]):
        layout = _sharded(arr)
        if layout is None or not self.supports(arr):
            raise ValueError(f"{arr.path}: codecs not supported by FrameShardWriter")
        self._meta, sharding, shard_shape = layout
        inner = list(sharding.codecs)
        self._prepare = (row_median_encode if isinstance(inner[0], RowMedianCodec)
                         else frame_filter_encode if any(isinstance(c, FrameFilterCodec) for c in inner) else None)
        zstd = sharding.codecs[-1]
        assert isinstance(zstd, ZstdCodec)  # supports() checked the codecs
        self._arr = arr
        self._codec = numcodecs.Zstd(level=zstd.level, checksum=zstd.checksum)
        self.chunk_rows = sharding.chunk_shape[0]
        self.shard_rows = shard_shape[0]
        self.chunks_per_shard = self.shard_rows // self.chunk_rows
        self.row_shape = tuple(arr.shape[1:])
        self.dtype = arr.dtype
        self.fill = arr.fill_value
        self.rows = 0  # rows appended so far
        self._encoded: list[bytes | Future[bytes]] = []  # full chunks of the open shard: encoded, or being encoded
        self._free: list[np.ndarray] = []  # chunk buffers to reuse (fresh large arrays cost page faults)
        self._tail = self._new_chunk()  # rows of the open chunk (the first rows % chunk_rows are set)

    @staticmethod
    def supports(arr: zarr.Array[Any]) -> bool:
        """True for the layout this writer reproduces exactly: one ShardingCodec over whole-row chunks with
        [bytes, zstd], [bytes, frame_filter, zstd] or [row_median, bytes, zstd] inside and the default
        [bytes(little), crc32c] index at the end, default chunk keys."""
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
        inner = list(sh.codecs)
        if inner and isinstance(inner[0], RowMedianCodec):
            inner = inner[1:]
        elif len(inner) == 3 and isinstance(inner[1], FrameFilterCodec):
            inner = [inner[0], inner[2]]
        inner_ok = (len(inner) == 2 and isinstance(inner[0], BytesCodec)
                    and isinstance(inner[1], ZstdCodec) and arr.dtype.itemsize == 1)
        keys_ok = meta.chunk_key_encoding.to_dict() == {"name": "default", "configuration": {"separator": "/"}}
        return rows_only and index_ok and inner_ok and keys_ok

    def _new_chunk(self) -> np.ndarray:
        return self._free.pop() if self._free else np.empty((self.chunk_rows, *self.row_shape), self.dtype)

    def _encode(self, chunk: np.ndarray) -> bytes:
        """Runs in the encoder pool (numpy and zstd release the GIL); the chunk buffer is reused afterwards, and so is
        the filtered copy (zstd has read it before this returns)."""
        if self._prepare is None:
            data = bytes(self._codec.encode(chunk))
        else:
            work = thread_buffer("shard chunk", chunk.nbytes + 1)  # room for the frame filter's predictor byte
            out = work if self._prepare is frame_filter_encode else work[:chunk.nbytes].view(chunk.dtype).reshape(chunk.shape)
            data = bytes(self._codec.encode(self._prepare(chunk, out=out)))
        if len(self._free) < self.chunks_per_shard:  # a bounded pool of buffers
            self._free.append(chunk)
        return data

    def append(self, frames: Sequence[np.ndarray] | np.ndarray) -> list[Coroutine[Any, Any, None]]:
        """Take rows [self.rows, self.rows + len(frames)); return coroutines that write the shards they touch.

        Await all of them (e.g. with asyncio.gather) before the next append and before committing the rows.
        A chunk starts encoding as soon as it is full, in parallel with copying the next frames."""
        jobs = []
        pool = _encoder_pool()
        for frame in frames:
            n = self.rows % self.chunk_rows
            self._tail[n] = frame
            self.rows += 1
            if n + 1 == self.chunk_rows:
                self._encoded.append(pool.submit(self._encode, self._tail))
                self._tail = self._new_chunk()
                if len(self._encoded) == self.chunks_per_shard:
                    jobs.append(self._write((self.rows - 1) // self.shard_rows, self._encoded, None))
                    self._encoded = []
        n = self.rows % self.chunk_rows
        fresh = any(isinstance(c, Future) for c in self._encoded)
        if fresh or n:
            partial = None
            if n:
                chunk = self._new_chunk()
                chunk[:n] = self._tail[:n]
                chunk[n:] = self.fill
                partial = pool.submit(self._encode, chunk)
            jobs.append(self._write(self.rows // self.shard_rows, self._encoded, partial))
        return jobs

    async def _write(self, shard: int, chunks: list[bytes | Future[bytes]], partial: Future[bytes] | None) -> None:
        done: list[bytes] = []
        for i, c in enumerate(chunks):  # the open shard's list keeps the bytes for its next rewrite
            encoded = await asyncio.wrap_future(c) if isinstance(c, Future) else c
            chunks[i] = encoded
            done.append(encoded)
        tail = [await asyncio.wrap_future(partial)] if partial is not None else []
        data = shard_object([*done, *tail], self.chunks_per_shard)
        key = self._meta.encode_chunk_key((shard, *(0 for _ in self.row_shape)))
        await (self._arr.async_array.store_path / key).set(default_buffer_prototype().buffer.from_bytes(data))


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


def shard_object(chunks: list[bytes], chunks_per_shard: int) -> bytes:
    """A zarr v3 shard: the encoded chunks back to back, then the index of (offset, nbytes) little-endian
    uint64 pairs (all ones for a missing chunk) followed by the index's crc32c."""
    index = np.full((chunks_per_shard, 2), _EMPTY, dtype="<u8")
    offset = 0
    for i, c in enumerate(chunks):
        index[i] = (offset, len(c))
        offset += len(c)
    index_bytes = index.tobytes()
    return b"".join([*chunks, index_bytes, struct.pack("<I", google_crc32c.value(index_bytes))])
