"""The bytes of openpi's policy-server protocol: msgpack, with numpy arrays and scalars as small maps.

openpi's client package (openpi_client.msgpack_numpy) sends an array as the map
``{"__ndarray__": True, "data": <raw bytes, C order>, "dtype": <dtype.str, e.g. "<f4">, "shape": [...]}`` and a numpy
scalar as ``{"__npgeneric__": True, "data": <the Python value>, "dtype": <dtype.str>}``, with bytes keys; object,
void and complex dtypes are refused (nothing on the wire is ever unpickled). This module speaks the same maps with
``msgpack`` alone, so either end may be openpi's own code: its client against ``hg-dagger policy serve``, or our
client against a pi0 server.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from hg_dagger.errors import PolicyError  # noqa: F401 - importable here, its home is hg_dagger.errors

_ARRAY = b"__ndarray__"
_SCALAR = b"__npgeneric__"
_REFUSED_KINDS = "VOc"  # void (structured), object, complex: not part of the protocol


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise TypeError(f"arrays of dtype {obj.dtype} cannot be sent to a policy server")
        return {_ARRAY: True, b"data": obj.tobytes(order="C"), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise TypeError(f"scalars of dtype {obj.dtype} cannot be sent to a policy server")
        return {_SCALAR: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot send a {type(obj).__name__} to a policy server")


def _field(obj: dict, name: bytes) -> Any:
    return obj[name] if name in obj else obj[name.decode()]


def _decode(obj: dict) -> Any:
    if _ARRAY in obj or "__ndarray__" in obj:
        dtype = np.dtype(_field(obj, b"dtype"))
        if dtype.kind in _REFUSED_KINDS:
            raise ValueError(f"arrays of dtype {dtype} are not part of the protocol")
        shape = tuple(int(s) for s in _field(obj, b"shape"))
        return np.frombuffer(_field(obj, b"data"), dtype=dtype).reshape(shape)
    if _SCALAR in obj or "__npgeneric__" in obj:
        dtype = np.dtype(_field(obj, b"dtype"))
        if dtype.kind in _REFUSED_KINDS:
            raise ValueError(f"scalars of dtype {dtype} are not part of the protocol")
        return dtype.type(_field(obj, b"data"))
    return obj


def packb(obj: Any) -> bytes:
    """One message: a map of numpy arrays, numbers, strings, lists and maps."""
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """The value of one message; arrays come back as read-only numpy arrays over the message's bytes."""
    return msgpack.unpackb(data, object_hook=_decode, raw=False)


def plain(obj: Any) -> Any:
    """Metadata as JSON-able values (arrays -> lists, bytes keys -> str): for hashing, logs and reports."""
    if isinstance(obj, dict):
        return {(k.decode() if isinstance(k, bytes) else str(k)): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes):
        return obj.hex()
    return obj


__all__ = ["PolicyError", "packb", "plain", "unpackb"]
