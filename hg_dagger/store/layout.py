"""On-disk layout of an episode store: names, chunking and codecs. docs/data-format.md describes it for readers.

A store is one zarr v3 group. Raw steps live in *segments*: one per recorder session and field set, with every
field of every episode concatenated along time (episodes interleave in flush-sized runs) and an index of which
row belongs to which episode step. Chunks are grouped into shards so 10k episodes stay a few thousand files.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from hg_dagger.contract.schema import FieldSpec
from hg_dagger.errors import StoreError
from hg_dagger.store.codecs import FrameFilterCodec

FORMAT = "hg_dagger.episode_store"
FORMAT_VERSION = 1
STORE_ATTR = "hg_dagger"  # root group attribute: {"format", "format_version", "schema_version"}
SEGMENT_ATTR = "hg_dagger_segment"  # segment group attribute (see SegmentState)
SEGMENTS = "segments"
LABELS = "labels"  # labels/<episode_id>/v<N>.json: label layers written after recording (N >= 2)

CAPACITY_STEP = 8192  # arrays grow in multiples of this many rows; trimmed to the committed rows on close
LOG_CAPACITY_STEP = 1024  # the log grows in multiples of this many records (no metadata write per flush)
ROWS_PER_CHUNK = 1024  # state, action, time and flag fields
ROWS_PER_SHARD = 8192
IMAGE_CHUNK_BYTES = 1 << 20  # aim for ~1 MiB of raw pixels per image chunk
IMAGES_PER_SHARD_CHUNKS = 16
LOG_RECORDS_PER_CHUNK = 1024

# Chosen by measurement (benchmarks/bench_recorder.py --codecs, docs/data-format.md): zstd level 1 on chunks of
# consecutive frames, each chunk first through the predictor its first frame calls for (hg_dagger.store.codecs): the
# row-median filter for noisy frames (zstd alone cost 1.8x PNG on them), none for rendered ones (their exact repeats
# pack best as they are): below PNG's bytes on both, lossless, at a few hundred MB/s. Segments written with zstd
# alone or with the every-chunk row-median filter read as before: zarr.json names the codecs.
# The frame checksum catches corrupt chunks.
IMAGE_FILTER = FrameFilterCodec()
IMAGE_CODEC = ZstdCodec(level=1, checksum=True)
NUMERIC_CODEC = BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")
LOG_CODEC = ZstdCodec(level=3, checksum=True)
# Runtime setting, not part of the on-disk format: zarr's default (False) compares every written chunk with the
# fill value before encoding it, which cost the recorder ~40% of its writer CPU. The recorder skips all-fill chunks
# itself (shards.py) and all-fill columns of arrays zarr writes for it.
WRITE_CONFIG = {"write_empty_chunks": True}


def data_path(field: str) -> str:
    return f"data/{field}"


def frames_per_chunk(spec: FieldSpec) -> int:
    frame = int(np.prod(spec.shape)) * spec.np_dtype.itemsize
    n = 1
    while n < 16 and (n * 2) * frame <= IMAGE_CHUNK_BYTES:
        n *= 2
    return n


def array_fill(spec: FieldSpec) -> Any:
    if spec.fill is None:
        return np.zeros((), spec.np_dtype).item()
    return np.asarray(spec.fill).astype(spec.np_dtype).item()


def fill_rows(spec: FieldSpec, n: int) -> np.ndarray:
    """n rows of a field that hold no value: its fill, as the store reads rows never written."""
    return np.full((n, *spec.shape), array_fill(spec), spec.np_dtype)


def field_array_kwargs(spec: FieldSpec) -> dict[str, Any]:
    shape = tuple(spec.shape)
    if spec.image:
        n = frames_per_chunk(spec)
        chunks, shards = (n, *shape), (n * IMAGES_PER_SHARD_CHUNKS, *shape)
        filtered = len(shape) >= 2 and spec.np_dtype.kind == "u"
        compressors: list[Any] = [IMAGE_FILTER, IMAGE_CODEC] if filtered else [IMAGE_CODEC]
    else:
        chunks, shards, compressors = (ROWS_PER_CHUNK, *shape), (ROWS_PER_SHARD, *shape), [NUMERIC_CODEC]
    return dict(
        name=data_path(spec.name),
        shape=(0, *shape),
        dtype=spec.np_dtype,
        chunks=chunks,
        shards=shards,
        compressors=compressors,
        fill_value=array_fill(spec),
        attributes={"field": spec.model_dump(mode="json")},
        config=WRITE_CONFIG,
    )


def index_array_kwargs(name: str) -> dict[str, Any]:
    return dict(name=name, shape=(0,), dtype="uint32", chunks=(ROWS_PER_CHUNK,), shards=(ROWS_PER_SHARD,),
                compressors=[NUMERIC_CODEC], fill_value=np.iinfo(np.uint32).max, config=WRITE_CONFIG)


def log_array_kwargs() -> dict[str, Any]:
    return dict(name="log", shape=(0,), dtype=str, chunks=(LOG_RECORDS_PER_CHUNK,), compressors=[LOG_CODEC],
                config=WRITE_CONFIG)


def create_arrays(group: zarr.Group, kwargs: list[dict[str, Any]]) -> list[zarr.Array[Any]]:
    """Create many arrays in one round of concurrent writes (one by one costs ~20 ms each)."""
    agroup = group._async_group

    async def _all() -> list[Any]:
        return await asyncio.gather(*(agroup.create_array(**kw) for kw in kwargs))

    return [zarr.Array(a) for a in sync(_all())]


def gather(coros: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run coroutines (zarr async array operations) concurrently and wait for all."""
    async def _all() -> list[Any]:
        return await asyncio.gather(*coros)

    result: list[Any] = sync(_all())
    return result


# ------------------------------------------------------------------------------------------------
# Store URLs and raw keys (label-layer JSON files live beside the zarr nodes)
# ------------------------------------------------------------------------------------------------


def local_path(url: str | os.PathLike[str]) -> Path | None:
    """The local file system path of a store URL (a plain path or file://), None for other fsspec URLs."""
    s = os.fspath(url)
    if s.startswith("file://"):
        s = s[len("file://"):]
    return None if "://" in s else Path(s)


def open_zarr_store(url: str | os.PathLike[str], *, read_only: bool) -> Store:
    """A local path (or file:// URL) becomes a LocalStore, whose writes are atomic renames; anything else goes
    through fsspec (memory://, s3://, ...), whose object puts are atomic by nature."""
    local = local_path(url)
    if local is not None:
        return zarr.storage.LocalStore(local, read_only=read_only)
    s = os.fspath(url)
    try:
        return zarr.storage.FsspecStore.from_url(s, read_only=read_only)
    except Exception as exc:  # unknown protocol, missing fsspec backend
        raise StoreError(f"{url}: cannot open this URL as an episode store ({exc})") from exc


def put_bytes(store: Store, key: str, data: bytes, *, exclusive: bool = False) -> bool:
    """Write one raw object; with exclusive=True returns False instead of overwriting an existing one."""
    buf = default_buffer_prototype().buffer.from_bytes(data)
    if not exclusive:
        sync(store.set(key, buf))
        return True
    if sync(store.exists(key)):
        return False
    try:
        sync(store.set_if_not_exists(key, buf))
    except FileExistsError:
        return False
    # Stores without an atomic create-if-absent: treat a concurrent winner as a lost race.
    got = sync(store.get(key, default_buffer_prototype()))
    return got is not None and got.to_bytes() == data


def get_bytes(store: Store, key: str) -> bytes | None:
    buf = sync(store.get(key, default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def list_dir(store: Store, prefix: str) -> list[str]:
    async def _collect() -> list[str]:
        return [k async for k in store.list_dir(prefix)]

    return sorted(sync(_collect()))


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)
