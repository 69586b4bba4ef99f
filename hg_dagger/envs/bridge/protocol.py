"""The robot bridge wire protocol (version 1): length-prefixed msgpack frames over TCP.

One home for framing, the message vocabulary, numpy encoding and the handshake digest; the
server, the client and docs/bridge-protocol.md all follow it. Any change to a message's meaning
bumps PROTOCOL_VERSION.

Frame: 4-byte big-endian unsigned payload length, then one msgpack map with a "type" string.
Within a version, replies may gain optional fields (e.g. "estop" and "sensor_loss" on obs replies);
readers ignore fields they do not know and treat a missing optional field as its documented default.
numpy arrays travel as msgpack ext type 1: dtype string, shape, raw little-endian bytes.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import os
import secrets
import struct
from typing import Any, Protocol

import msgpack
import numpy as np

from hg_dagger.errors import EnvError

PROTOCOL_NAME = "hg-dagger-bridge"
PROTOCOL_VERSION = 1

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7650
TOKEN_ENV = "HG_DAGGER_BRIDGE_TOKEN"

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024  # one batch of 64 RGB 128x128 observations fits
PREAUTH_MAX_FRAME_BYTES = 4096  # an unauthenticated peer cannot make the robot allocate more
NDARRAY_EXT = 1
NONCE_BYTES = 32


class Msg:
    """Message types. Client -> robot requests, robot -> client replies."""

    CHALLENGE = "challenge"  # robot -> client, first frame on every connection
    HELLO = "hello"  # client -> robot: version + HMAC of the challenge nonce
    WELCOME = "welcome"  # robot -> client: task description and robot state
    RESET = "reset"
    STEP = "step"
    OBSERVE = "observe"  # current observation, robot does not move
    OBS = "obs"  # reply to reset / step / observe
    HEARTBEAT = "heartbeat"  # one-way, no reply
    PING = "ping"
    PONG = "pong"
    ESTOP = "estop"
    ESTOP_RELEASE = "estop_release"
    RESUME = "resume"
    STATUS = "status"  # request and reply
    BYE = "bye"  # one-way: the client ends its session on purpose
    ERROR = "error"


REQUESTS = frozenset(
    {Msg.RESET, Msg.STEP, Msg.OBSERVE, Msg.PING, Msg.ESTOP, Msg.ESTOP_RELEASE, Msg.RESUME, Msg.STATUS}
)
ONE_WAY = frozenset({Msg.HEARTBEAT, Msg.BYE})


class RobotState:
    """What the robot side does with step commands."""

    RUNNING = "running"  # steps are applied
    HOLD = "hold"  # safe stop: holding position; `reset` or `resume` from the session lifts it
    ESTOP = "estop"  # latched emergency stop; only `estop_release` (-> hold) lifts it


class ErrorCode:
    """Why a message was refused. Refusals never move the robot."""

    AUTH = "auth"  # wrong token digest
    NO_HANDSHAKE = "no_handshake"  # a command before a successful hello
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    VERSION = "version"  # protocol version mismatch
    OVERSIZED = "oversized"  # frame longer than the allowed maximum
    MALFORMED = "malformed"  # not msgpack, not a map, bad field types, bad ndarray
    UNKNOWN_TYPE = "unknown_type"
    BAD_ACTION = "bad_action"  # wrong shape/dtype, NaN/inf
    BAD_REQUEST = "bad_request"  # bad env_ids / seed
    STATE = "state"  # refused because the robot holds or is e-stopped
    SUPERSEDED = "superseded"  # a newer authenticated session took over
    INTERNAL = "internal"  # the backend raised
    UNREACHABLE = "unreachable"  # client side only, never on the wire: the robot could not be reached
    TLS = "tls"  # a TLS handshake failed, or a TLS client met a bridge without TLS (the robot counts it as refused)


# Refusals after which the robot closes the connection: the peer is not (yet) trusted or the byte
# stream cannot be resynchronised.
FATAL_CODES = frozenset(
    {ErrorCode.AUTH, ErrorCode.NO_HANDSHAKE, ErrorCode.HANDSHAKE_TIMEOUT, ErrorCode.VERSION, ErrorCode.OVERSIZED,
     ErrorCode.SUPERSEDED}
)


class BridgeError(EnvError):
    """A robot bridge fault meant for a person (connection lost, refusal, robot holding).

    ``robot_state`` is the RobotState the robot reported with a refusal (None when unknown), so a
    caller can tell an e-stopped robot from one that merely holds."""

    def __init__(self, message: str, code: str | None = None, robot_state: str | None = None):
        super().__init__(message)
        self.code = code
        self.robot_state = robot_state


class ProtocolError(BridgeError):
    """A frame or message that breaks the protocol; ``code`` is an ErrorCode."""

    code: str  # every raise names one


# --------------------------------------------------------------------------------------------
# numpy arrays: ext type 1 = <u1 len(dtype)> dtype-str <u1 ndim> <u4 * ndim shape> raw bytes
# --------------------------------------------------------------------------------------------

ALLOWED_DTYPES = frozenset(
    np.dtype(t).str for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                              "float16", "float32", "float64")
)
MAX_NDIM = 8


_DTYPES = {code: np.dtype(code) for code in ALLOWED_DTYPES}
_SHAPES = [struct.Struct(f"<{n}I") for n in range(MAX_NDIM + 1)]


@functools.lru_cache(maxsize=256)
def _ndarray_head(code: str, shape: tuple[int, ...]) -> bytes:
    raw = code.encode("ascii")
    return bytes((len(raw),)) + raw + bytes((len(shape),)) + _SHAPES[len(shape)].pack(*shape)


def _pack_ndarray(arr: np.ndarray) -> msgpack.ExtType:
    dtype = arr.dtype
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
        arr = arr.astype(dtype)
    code = dtype.str
    if code not in _DTYPES:
        raise TypeError(f"bridge cannot send arrays of dtype {arr.dtype}")
    if arr.ndim > MAX_NDIM:
        raise TypeError(f"bridge cannot send arrays with {arr.ndim} dims (max {MAX_NDIM})")
    # tobytes() is C order for any memory layout
    return msgpack.ExtType(NDARRAY_EXT, _ndarray_head(code, arr.shape) + arr.tobytes())


def _unpack_ndarray(data: bytes) -> np.ndarray:
    try:
        n = data[0]
        dtype = _DTYPES.get(data[1 : 1 + n].decode("ascii"))
        ndim = data[1 + n]
        shape = _SHAPES[ndim].unpack_from(data, 2 + n)
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise ValueError("malformed ndarray header") from exc
    if dtype is None:
        raise ValueError(f"ndarray dtype {data[1 : 1 + n]!r} is not allowed")
    off = 2 + n + 4 * ndim
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != len(data) - off:
        raise ValueError(f"ndarray of dtype {dtype} shape {tuple(shape)} needs {nbytes} bytes, got {len(data) - off}")
    # a private writable copy: callers may edit observations in place
    return np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=off).reshape(shape).copy()


def _ext_hook(code: int, data: bytes) -> Any:
    if code == NDARRAY_EXT:
        return _unpack_ndarray(data)
    raise ValueError(f"unknown msgpack ext type {code}")


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_ndarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise TypeError(f"bridge cannot send a {type(obj).__name__}")


def encode(msg: dict[str, Any]) -> bytes:
    """One message as a complete frame (header + msgpack payload)."""
    payload = msgpack.packb(msg, default=_default, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> dict[str, Any]:
    """A frame payload back into a message; raises ProtocolError(MALFORMED) on anything odd."""
    try:
        msg = msgpack.unpackb(payload, raw=False, ext_hook=_ext_hook, strict_map_key=True, use_list=True)
    except Exception as exc:  # noqa: BLE001 - every decoder failure is the same refusal
        raise ProtocolError(f"payload is not valid msgpack: {exc}", ErrorCode.MALFORMED) from exc
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("payload is not a map with a string 'type'", ErrorCode.MALFORMED)
    return msg


class FrameReader:
    """Splits a byte stream into frame payloads; refuses a frame longer than ``max_bytes`` up front."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > self.max_bytes:
                raise ProtocolError(f"frame of {n} bytes exceeds the limit of {self.max_bytes} bytes",
                                    ErrorCode.OVERSIZED)
            if len(self._buf) < HEADER.size + n:
                break
            frames.append(bytes(self._buf[HEADER.size : HEADER.size + n]))
            del self._buf[: HEADER.size + n]
        return frames


class Receiver(Protocol):
    """What the frame readers read from: a socket, or the client's lock-taking TLS reader."""

    def recv(self, n: int, /) -> bytes: ...


def recv_exact(sock: Receiver, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: Receiver, max_bytes: int) -> dict[str, Any]:
    """Blocking read of one message (client side)."""
    (n,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if n > max_bytes:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {max_bytes} bytes", ErrorCode.OVERSIZED)
    return decode(recv_exact(sock, n))


# --------------------------------------------------------------------------------------------
# handshake
# --------------------------------------------------------------------------------------------


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def auth_digest(token: bytes, nonce: bytes) -> bytes:
    """HMAC-SHA256 of the robot's per-connection nonce: the token itself never crosses the wire."""
    return hmac.new(token, PROTOCOL_NAME.encode() + b"\0" + nonce, hashlib.sha256).digest()


def check_digest(token: bytes, nonce: bytes, digest: Any) -> bool:
    """Constant-time comparison of a peer's digest with the expected one."""
    if not isinstance(digest, bytes):
        return False
    return hmac.compare_digest(auth_digest(token, nonce), digest)


def load_token(token_file: str | os.PathLike | None = None, *, env: str = TOKEN_ENV) -> bytes:
    """The shared token from a file (first line, stripped) or the environment variable ``env``."""
    if token_file is not None:
        try:
            with open(token_file, "rb") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise BridgeError(f"cannot read bridge token file {token_file}: {exc.strerror}") from exc
        if not token:
            raise BridgeError(f"bridge token file {token_file} is empty")
        return token
    value = os.environ.get(env, "").strip()
    if not value:
        raise BridgeError(f"no bridge token: pass --token-file FILE or set the environment variable {env}")
    return value.encode()


def new_token() -> str:
    """A fresh random token (hex) for a token file."""
    return secrets.token_hex(32)
