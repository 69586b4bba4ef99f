"""The robot side of the bridge: a TCP server that owns one VecEnv (any sim backend, or a robot driver).

One thread, one selector loop: it accepts connections, authenticates them, applies commands from
the single active session and runs the heartbeat watchdog between frames. Every refusal is logged
with its reason and answered with an ``error`` message; nothing that is refused reaches the env.

The robot only moves on ``reset`` and ``step``. In ``hold`` (safe stop) and ``estop`` it refuses
``step``. Entering either from ``running`` commands the backend to hold (``VecEnv.hold``): a robot
driver stops and holds position (``hold_action``: motion dims 0, gripper dims keep their last
command), the MuJoCo backends stop the arm where it is; the robot stops because it was told to, not
because commands happen to stop. ``observe`` reads the backend now (``VecEnv.observe``), so a monitor
sees a held robot as it is. The heartbeat watchdog guards motion: a session silent past the timeout
while the robot runs is dropped and the robot holds; while it holds there is nothing to stop, so a
silent session (an app still starting up) keeps its session. Every obs reply carries per-row fault flags: "estop" (the robot is
e-stopped; a backend that reports "estop" in its step/reset info latches it) and "sensor_loss" (the
backend said so, or a step returned an observation whose timestamp did not advance).

Every field a message carries is type- and range-checked here before anything reaches the backend;
a bad one is refused as ``malformed`` and leaves the robot's state alone.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.envs.base import VecEnv, check_action, fault_flags
from hg_dagger.envs.bridge.protocol import (
    DEFAULT_HOST,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_PORT,
    FATAL_CODES,
    PREAUTH_MAX_FRAME_BYTES,
    PROTOCOL_NAME,
    PROTOCOL_VERSION,
    BridgeError,
    ErrorCode,
    FrameReader,
    Msg,
    ProtocolError,
    RobotState,
    check_digest,
    decode,
    encode,
    new_nonce,
)
from hg_dagger.errors import EnvError

log = logging.getLogger("hg_dagger.bridge.server")

LOOPBACK = ("127.0.0.1", "::1", "localhost")
MAX_SEED = 2**32 - 1  # seeds are uint32: every backend's seeding (numpy legacy included) takes them
MAX_TEXT = 200  # reason / by / client strings are cut to this many characters
MAX_CID = 128


def hold_action(action_names: list[str], last_action: np.ndarray | None, num_envs: int) -> np.ndarray:
    """The zero-motion command that holds position: 0 on every motion dim, and the last commanded
    value on gripper dims (names containing "grip"), so a grasped object is not dropped."""
    hold = np.zeros((num_envs, len(action_names)), dtype=np.float32)
    if last_action is not None:
        for i, name in enumerate(action_names):
            if "grip" in name.lower():
                hold[:, i] = last_action[:, i]
    return hold


@dataclass
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0 picks a free port (see BridgeServer.address)
    heartbeat_timeout_s: float = 0.5  # silence from the active session longer than this -> safe stop
    handshake_timeout_s: float = 2.0  # an unauthenticated connection is closed after this
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    send_timeout_s: float = 5.0
    max_pending: int = 16  # unauthenticated connections held at once (slots)
    # a new connection takes the slot of the longest-waiting unauthenticated one once that has waited this
    # long; a correct client answers the challenge in milliseconds, so idle peers cannot keep it out
    pending_grace_s: float = 0.25
    listen_backlog: int = 128

    def __post_init__(self) -> None:
        for name in ("heartbeat_timeout_s", "handshake_timeout_s", "send_timeout_s"):
            if not getattr(self, name) > 0:
                raise BridgeError(f"bridge server: {name} must be > 0, got {getattr(self, name)}")
        if self.max_frame_bytes < PREAUTH_MAX_FRAME_BYTES:
            raise BridgeError(f"bridge server: max_frame_bytes must be >= {PREAUTH_MAX_FRAME_BYTES}")
        if not 0 <= self.port <= 65535:
            raise BridgeError(f"bridge server: port {self.port} out of range 0..65535")
        if self.max_pending < 1 or self.listen_backlog < 1 or self.pending_grace_s < 0:
            raise BridgeError("bridge server: max_pending and listen_backlog must be >= 1, pending_grace_s >= 0")


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    nonce: bytes
    reader: FrameReader
    t_open: int
    last_rx: int
    authed: bool = False
    closed: bool = False
    quiet_logged: bool = False  # its silence while the robot holds was logged


@dataclass
class Counters:
    steps: int = 0
    resets: int = 0
    sessions: int = 0
    heartbeat_losses: int = 0
    holds: int = 0  # times the backend was commanded to hold (VecEnv.hold)
    refused: dict[str, int] = field(default_factory=dict)


class BridgeServer:
    """Serves one VecEnv to one authenticated client at a time. Not thread-safe: run it in one thread."""

    def __init__(self, env: VecEnv, token: bytes, config: ServerConfig | None = None, *, seed: int | None = None):
        if not token:
            raise BridgeError("the bridge server needs a non-empty token")
        self.env = env
        self.config = config or ServerConfig()
        self._token = bytes(token)
        self.instance = uuid.uuid4().hex
        self.counters = Counters()
        self.state = RobotState.HOLD
        self.reason = "no session yet: reset or resume to move"
        self._names = list(env.mapping.action.names)
        self._last_action: np.ndarray | None = None
        self._last_step: tuple[Any, dict] | None = None  # (command id, reply) for an exactly-once retry
        self._obs, info = env.reset(seed=seed)
        self._t_obs = self._times(info, "t_obs", now_ns())
        n = env.num_envs
        self._sensor_loss = fault_flags(info, "sensor_loss", n)  # as of the last reset/step
        if self.config.host not in LOOPBACK:
            log.warning("bridge listening on %s: not loopback; anyone who can reach this port may try the token",
                        self.config.host)
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((self.config.host, self.config.port))
        except OSError as exc:
            self._listener.close()
            raise BridgeError(f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror}") from exc
        self._listener.listen(self.config.listen_backlog)
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        self._active: _Conn | None = None
        self._stopping = False
        self._estop_request: str | None = None
        self._resumed_by = ""  # who lifted the last hold (resume's "by"), for status and the log

    # ------------------------------------------------------------------ lifecycle
    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return host, port

    def serve_forever(self) -> None:
        """Run until ``shutdown()`` (from a signal handler or another thread)."""
        tick = max(0.001, min(0.05, self.config.heartbeat_timeout_s / 4))
        try:
            while not self._stopping:
                for key, _ in self._sel.select(timeout=tick):
                    if key.data is None:
                        self._accept()
                    else:
                        try:
                            self._on_readable(key.data)
                        except Exception:  # noqa: BLE001 - one bad connection must not stop the robot side
                            log.exception("unexpected failure serving %s; dropping it", key.data.peer)
                            self._drop(key.data, "server error")
                self._watchdog()
        finally:
            self._close_all()

    def shutdown(self) -> None:
        self._stopping = True

    def request_estop(self, reason: str) -> None:
        """Robot-side e-stop (a signal handler or another thread); latched at the next loop tick."""
        self._estop_request = reason

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        if self._active is not None or self.state == RobotState.RUNNING:
            self._hold("server shutting down", logging.INFO)
        self._sel.close()
        self._listener.close()
        self.env.close()

    # ------------------------------------------------------------------ connections
    def _accept(self) -> None:
        """Accept every connection waiting in the backlog (bounded), so a burst does not wait a loop each."""
        for _ in range(64):
            try:
                sock, addr = self._listener.accept()
            except OSError:  # BlockingIOError: the backlog is empty
                return
            self._admit(sock, addr)

    def _admit(self, sock: socket.socket, addr) -> None:
        """Give the connection an unauthenticated slot. When all are taken, the longest-waiting peer that has
        had ``pending_grace_s`` to answer loses its slot; if none has, the newcomer is closed (it retries)."""
        pending = [c for c in self._conns.values() if not c.authed]
        if len(pending) >= self.config.max_pending:
            oldest = min(pending, key=lambda c: c.t_open)
            self.counters.refused["too_many_pending"] = self.counters.refused.get("too_many_pending", 0) + 1
            if now_ns() - oldest.t_open < self.config.pending_grace_s * 1e9:
                log.warning("refused connection from %s:%s: %d connections still owe a hello", addr[0], addr[1],
                            len(pending))
                sock.close()
                return
            log.warning("closed %s: it still owes a hello and %s:%s needs its slot (%d connections pending)",
                        oldest.peer, addr[0], addr[1], len(pending))
            self._close(oldest)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.config.send_timeout_s)  # sends block (bounded); reads happen only when readable
        t = now_ns()
        conn = _Conn(sock, f"{addr[0]}:{addr[1]}", new_nonce(), FrameReader(PREAUTH_MAX_FRAME_BYTES), t, t)
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        log.debug("connection from %s", conn.peer)
        self._send(conn, {"type": Msg.CHALLENGE, "protocol": PROTOCOL_NAME, "version": PROTOCOL_VERSION,
                          "nonce": conn.nonce})

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.sock.fileno(), None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn is self._active:
            self._active = None

    def _send(self, conn: _Conn, msg: dict) -> None:
        if conn.closed:
            return
        try:
            frame = encode(msg)
        except (TypeError, ValueError, OverflowError) as exc:  # the backend produced something unsendable
            log.error("cannot encode %s for %s: %s", msg.get("type"), conn.peer, exc)
            frame = encode({"type": Msg.ERROR, "code": ErrorCode.INTERNAL, "state": self.state, "re": msg.get("re"),
                            "message": f"robot cannot encode its {msg.get('type')} reply: {exc}"})
        try:
            conn.sock.sendall(frame)
        except OSError as exc:
            log.warning("send to %s failed (%s); closing the connection", conn.peer, exc)
            self._drop(conn, f"send failed: {exc}")

    def _drop(self, conn: _Conn, why: str) -> None:
        """A connection is gone; if it was the active session the robot holds."""
        was_active = conn is self._active
        self._close(conn)
        if was_active:
            self._hold(f"session from {conn.peer} lost: {why}")

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except OSError as exc:
            self._drop(conn, f"receive failed: {exc}")
            return
        if not data:
            if conn is self._active:
                log.warning("session from %s closed its connection without bye", conn.peer)
            self._drop(conn, "connection closed")
            return
        try:
            frames = conn.reader.feed(data)
        except ProtocolError as exc:
            self._refuse(conn, exc.code, str(exc))
            return
        for payload in frames:
            if conn.closed:
                return
            try:
                msg = decode(payload)
            except ProtocolError as exc:
                self._refuse(conn, exc.code, str(exc))
                continue
            self._dispatch(conn, msg)

    def _refuse(self, conn: _Conn, code: str, message: str, re: Any = None) -> None:
        """Answer with an error, log why, and close the connection if the peer is untrusted."""
        self.counters.refused[code] = self.counters.refused.get(code, 0) + 1
        fatal = code in FATAL_CODES or not conn.authed
        log.warning("refused %s from %s: %s%s", code, conn.peer, message, " (connection closed)" if fatal else "")
        reply = {"type": Msg.ERROR, "code": code, "message": message, "state": self.state}
        if re is not None:
            reply["re"] = re
        self._send(conn, reply)
        if fatal:
            self._drop(conn, f"refused: {code}")

    # ------------------------------------------------------------------ safety
    def _hold(self, reason: str, level: int = logging.WARNING) -> None:
        """Safe stop: the backend is commanded to hold position, then steps are refused until reset/resume."""
        if self.state == RobotState.ESTOP:
            return
        if self.state != RobotState.HOLD:
            log.log(level, "safe stop: holding position (%s)", reason)
        self._stop_motion()
        self.state, self.reason = RobotState.HOLD, reason

    def _stop_motion(self) -> None:
        """Tell the backend to hold (VecEnv.hold) when the robot was running. A failure is logged; the state
        still leaves running, so no step is applied after it."""
        if self.state != RobotState.RUNNING:
            return
        self.counters.holds += 1
        try:
            self.env.hold()
        except Exception as exc:  # noqa: BLE001 - the robot side must keep serving (and refusing steps)
            log.error("the backend failed to hold: %s: %s", type(exc).__name__, exc)
        else:
            log.info("backend commanded to hold position")

    def _watchdog(self) -> None:
        if self._estop_request is not None:
            reason, self._estop_request = self._estop_request, None
            self._estop({"reason": reason})
        t = now_ns()
        for conn in list(self._conns.values()):
            if not conn.authed and t - conn.t_open > self.config.handshake_timeout_s * 1e9:
                self._refuse(conn, ErrorCode.HANDSHAKE_TIMEOUT,
                             f"no hello within {self.config.handshake_timeout_s:g} s")
        active = self._active
        silent = active is not None and t - active.last_rx > self.config.heartbeat_timeout_s * 1e9
        if silent and self.state != RobotState.RUNNING:
            # a held (or e-stopped) robot has no motion to stop, so the session stays: an app still loading
            # (importing torch holds Python's GIL, heartbeat thread included, for over 0.5 s on a busy
            # machine) keeps it. Only its own reset or resume runs the robot again, and that ends the silence.
            if not active.quiet_logged:
                active.quiet_logged = True
                log.info("session from %s silent for over %.0f ms while the robot is in %s; kept (nothing moves)",
                         active.peer, self.config.heartbeat_timeout_s * 1e3, self.state)
            return
        if active is not None and not silent:
            active.quiet_logged = False
        if silent:
            silent_ms = (t - active.last_rx) / 1e6
            self.counters.heartbeat_losses += 1
            log.warning("heartbeat lost from %s: silent for %.0f ms (timeout %.0f ms)", active.peer, silent_ms,
                        self.config.heartbeat_timeout_s * 1e3)
            self._close(active)
            self._hold(f"heartbeat lost: session from {active.peer} silent for {silent_ms:.0f} ms "
                       f"(timeout {self.config.heartbeat_timeout_s * 1e3:.0f} ms)")

    # ------------------------------------------------------------------ messages
    def _dispatch(self, conn: _Conn, msg: dict) -> None:
        kind, re = msg["type"], msg.get("seq")
        if re is not None and not _is_int(re):
            self._refuse(conn, ErrorCode.MALFORMED, f"seq must be an int, got {type(re).__name__}")
            return
        if not conn.authed:
            if kind != Msg.HELLO:
                self._refuse(conn, ErrorCode.NO_HANDSHAKE, f"'{kind}' before a successful hello", re)
                return
            self._hello(conn, msg)
            return
        conn.last_rx = now_ns()
        handler = self._HANDLERS.get(kind)
        if handler is None:
            self._refuse(conn, ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}", re)
            return
        try:
            reply = handler(self, msg)
        except ProtocolError as exc:
            self._refuse(conn, exc.code or ErrorCode.MALFORMED, str(exc), re)
            return
        except EnvError as exc:
            self._refuse(conn, getattr(exc, "code", None) or ErrorCode.BAD_REQUEST, str(exc), re)
            return
        except Exception as exc:  # noqa: BLE001 - the backend failed: hold, report, keep serving
            log.exception("backend failed on %s", kind)
            self._hold(f"backend raised on {kind}: {exc}")
            self._refuse(conn, ErrorCode.INTERNAL, f"backend raised on {kind}: {type(exc).__name__}: {exc}", re)
            return
        if reply is not None:
            reply["re"] = re
            self._send(conn, reply)

    def _hello(self, conn: _Conn, msg: dict) -> None:
        re = msg.get("seq")
        version = msg.get("version")
        if not _is_int(version) or version != PROTOCOL_VERSION:
            shown = version if _is_int(version) else type(version).__name__
            self._refuse(conn, ErrorCode.VERSION,
                         f"client speaks protocol version {shown!r}, robot speaks {PROTOCOL_VERSION}", re)
            return
        if not check_digest(self._token, conn.nonce, msg.get("digest")):
            self._refuse(conn, ErrorCode.AUTH, "bad token digest", re)
            return
        previous = self._active
        if previous is not None:
            self._send(previous, {"type": Msg.ERROR, "code": ErrorCode.SUPERSEDED, "state": self.state,
                                  "message": f"a new session from {conn.peer} took over"})
            self._close(previous)
            log.warning("session from %s superseded by %s", previous.peer, conn.peer)
        conn.authed = True
        conn.reader.max_bytes = self.config.max_frame_bytes
        conn.last_rx = now_ns()
        self._active = conn
        self.counters.sessions += 1
        if self.state == RobotState.RUNNING:
            self._hold(f"new session from {conn.peer}")
        log.info("session %d from %s (client %s)", self.counters.sessions, conn.peer, _text(msg.get("client"), "?"))
        m = self.env.mapping
        self._send(conn, {
            "type": Msg.WELCOME, "re": re, "version": PROTOCOL_VERSION, "instance": self.instance,
            "task_id": m.task_id, "mapping_hash": m.hash, "num_envs": self.env.num_envs,
            "action_dim": m.action_dim, "action_names": self._names, "control_hz": m.control_hz,
            "obs_spec": {k: [list(s), d] for k, (s, d) in m.obs_spec().items()},
            "hold_action": hold_action(self._names, self._last_action, self.env.num_envs),
            "heartbeat_timeout_s": self.config.heartbeat_timeout_s, "max_frame_bytes": self.config.max_frame_bytes,
            "state": self.state, "reason": self.reason, "robot": self.env.robot,
        })

    def _status(self, _msg: dict | None = None) -> dict:
        c = self.counters
        return {"type": Msg.STATUS, "state": self.state, "reason": self.reason, "instance": self.instance,
                "steps": c.steps, "resets": c.resets, "sessions": c.sessions,
                "heartbeat_losses": c.heartbeat_losses, "holds": c.holds, "resumed_by": self._resumed_by,
                "refused": dict(c.refused),
                "session": self._active.peer if self._active else None,
                "hold_action": hold_action(self._names, self._last_action, self.env.num_envs)}

    def _obs_reply(self, t_recv: int, *, obs=None, t_obs=None, sensor_loss=None, **fields) -> dict:
        """An obs reply: the last reset/step's observation unless a fresh one (observe) is given."""
        return {"type": Msg.OBS, "state": self.state, "obs": self._obs if obs is None else obs,
                "t_obs": self._t_obs if t_obs is None else t_obs, "t_recv": t_recv, "estop": self._estop_rows(),
                "sensor_loss": self._sensor_loss if sensor_loss is None else sensor_loss, **fields,
                "t_send": now_ns()}

    def _estop_rows(self) -> np.ndarray:
        """bool [N]: an e-stopped robot refuses motion in every row."""
        return np.full(self.env.num_envs, self.state == RobotState.ESTOP)

    def _faults(self, info: dict, t_obs_before: np.ndarray | None) -> None:
        """Take the backend's fault flags from a reset/step info. A step whose observation timestamp
        did not advance counts as sensor loss for that row; a reported e-stop latches the robot's."""
        n = self.env.num_envs
        loss = fault_flags(info, "sensor_loss", n)
        if t_obs_before is not None:
            t_now = np.broadcast_to(np.asarray(self._t_obs, dtype=np.int64), (n,))
            loss |= t_now <= np.broadcast_to(t_obs_before, (n,))
        self._sensor_loss = loss
        if loss.any():
            log.warning("sensor loss in rows %s: observation stale or missing", np.flatnonzero(loss).tolist())
        estop = fault_flags(info, "estop", n)
        if estop.any():
            rows = np.flatnonzero(estop).tolist()
            log.warning("E-STOP: the robot reported an e-stop in rows %s", rows)
            self._stop_motion()
            self.state, self.reason = RobotState.ESTOP, f"e-stop: the robot reported an e-stop in rows {rows}"

    @staticmethod
    def _times(info: dict, key: str, fallback: int) -> np.ndarray:
        t = info.get(key)
        return np.asarray(t, dtype=np.int64) if t is not None else np.int64(fallback)

    def _reset(self, msg: dict) -> dict:
        t_recv = now_ns()
        if self.state == RobotState.ESTOP:
            raise BridgeError(f"robot is e-stopped ({self.reason}); send estop_release first", ErrorCode.STATE)
        seed, env_ids = msg.get("seed"), msg.get("env_ids")
        n = self.env.num_envs
        if not (env_ids is None or (isinstance(env_ids, list) and all(_is_int(i) for i in env_ids))):
            raise ProtocolError("reset.env_ids must be null or a list of ints", ErrorCode.MALFORMED)
        if env_ids is not None and (any(not 0 <= i < n for i in env_ids) or len(set(env_ids)) != len(env_ids)):
            raise BridgeError(f"reset.env_ids {env_ids[:16]} must be distinct rows in 0..{n - 1}", ErrorCode.BAD_REQUEST)
        top = MAX_SEED - (n - 1)  # an int seed seeds row r with seed + r
        if not (seed is None or (_is_int(seed) and 0 <= seed <= top)
                or (isinstance(seed, list) and all(_is_int(s) and 0 <= s <= MAX_SEED for s in seed))):
            raise ProtocolError(f"reset.seed must be null, an int in 0..{top} or a list of ints in 0..{MAX_SEED}",
                                ErrorCode.MALFORMED)
        if isinstance(seed, list) and len(seed) != (n if env_ids is None else len(env_ids)):
            raise BridgeError(f"reset.seed has {len(seed)} seeds for {n if env_ids is None else len(env_ids)} rows",
                              ErrorCode.BAD_REQUEST)
        obs, info = self.env.reset(seed=seed, env_ids=env_ids)
        self._obs, self._t_obs = obs, self._times(info, "t_obs", now_ns())
        self.counters.resets += 1
        self._last_step = None
        self.state, self.reason = RobotState.RUNNING, "running"
        self._faults(info, None)
        return self._obs_reply(t_recv, t_action_apply=np.int64(NO_TIME))

    def _step(self, msg: dict) -> dict:
        t_recv = now_ns()
        cid = msg.get("cid")
        if cid is not None and not (isinstance(cid, str) and 0 < len(cid) <= MAX_CID):
            raise ProtocolError(f"step.cid must be a string of 1..{MAX_CID} characters, got {type(cid).__name__}",
                                ErrorCode.MALFORMED)
        applied = cid is not None and self._last_step is not None and self._last_step[0] == cid
        if self.state != RobotState.RUNNING:  # a held robot answers no step, a re-sent one included
            again = f"; the step with cid {cid!r} was applied before it" if applied else ""
            raise BridgeError(f"robot is in {self.state} ({self.reason}){again}; step refused", ErrorCode.STATE)
        if applied:  # a retried command: answered from the stored reply, not stepped twice
            return dict(self._last_step[1], t_recv=t_recv, t_send=now_ns(), replayed=True)
        action = msg.get("action")
        if not isinstance(action, np.ndarray):
            raise BridgeError(f"step.action must be an ndarray, got {type(action).__name__}", ErrorCode.BAD_ACTION)
        try:
            action = check_action(action, self.env.num_envs, self.env.action_dim, where=f"bridge {self.env.task_id}")
        except EnvError as exc:
            raise BridgeError(str(exc), ErrorCode.BAD_ACTION) from exc
        t_apply = now_ns()
        res = self.env.step(action)
        self._last_action = action
        self.counters.steps += 1
        info = res.info
        t_obs_before = np.asarray(self._t_obs, dtype=np.int64)
        self._obs, self._t_obs = res.obs, self._times(info, "t_obs", now_ns())
        self._faults(info, t_obs_before)
        fields: dict[str, Any] = {
            "t_action_apply": self._times(info, "t_action_apply", t_apply),
            "reward": np.asarray(res.reward, dtype=np.float32),
            "terminated": np.asarray(res.terminated, dtype=bool),
            "truncated": np.asarray(res.truncated, dtype=bool),
        }
        for key in ("success", "episode_start"):
            if key in info:
                fields[key] = np.asarray(info[key], dtype=bool)
        if "final_obs" in info and np.any(fields["terminated"] | fields["truncated"]):
            fields["final_obs"] = info["final_obs"]
        if info.get("signals"):
            fields["signals"] = {k: np.asarray(v) for k, v in info["signals"].items()}
        reply = self._obs_reply(t_recv, **fields)
        if cid is not None:
            self._last_step = (cid, reply)
        return reply

    def _observe(self, _msg: dict) -> dict:
        """The backend's observation now (it does not move); a backend that cannot observe without stepping
        answers with the last reset/step's. Sensor loss: the backend's flag for this sample, or the last
        reset/step's."""
        t_recv = now_ns()
        got = self.env.observe()
        if got is None:
            return self._obs_reply(t_recv, t_action_apply=np.int64(NO_TIME))
        obs, info = got
        loss = self._sensor_loss | fault_flags(info, "sensor_loss", self.env.num_envs)
        return self._obs_reply(t_recv, obs=obs, t_obs=self._times(info, "t_obs", now_ns()), sensor_loss=loss,
                               t_action_apply=np.int64(NO_TIME))

    def _ping(self, _msg: dict) -> dict:
        return {"type": Msg.PONG, "t_robot": now_ns()}

    def _estop(self, msg: dict) -> dict:
        reason = _text(_field(msg, "reason"), "e-stop from the client")
        log.warning("E-STOP: %s", reason)
        self._stop_motion()
        self.state, self.reason = RobotState.ESTOP, f"e-stop: {reason}"
        return self._status()

    def _estop_release(self, _msg: dict) -> dict:
        if self.state == RobotState.ESTOP:
            log.warning("e-stop released; holding until reset or resume")
            self.state, self.reason = RobotState.HOLD, "e-stop released: reset or resume to move"
        return self._status()

    def _resume(self, msg: dict) -> dict:
        by = _text(_field(msg, "by"), "unnamed client")
        if self.state == RobotState.ESTOP:
            raise BridgeError(f"robot is e-stopped ({self.reason}); send estop_release first", ErrorCode.STATE)
        if self.state == RobotState.HOLD:
            log.warning("resumed by %s after hold (%s)", by, self.reason)
            self._resumed_by = by
        self.state, self.reason = RobotState.RUNNING, "running"
        return self._status()

    def _heartbeat(self, _msg: dict) -> None:
        return None

    def _bye(self, _msg: dict) -> None:
        conn = self._active
        if conn is not None:
            log.info("session from %s ended", conn.peer)
            self._close(conn)
            self._hold("client ended the session", logging.INFO)
        return None

    _HANDLERS = {
        Msg.RESET: _reset, Msg.STEP: _step, Msg.OBSERVE: _observe, Msg.PING: _ping, Msg.STATUS: _status,
        Msg.ESTOP: _estop, Msg.ESTOP_RELEASE: _estop_release, Msg.RESUME: _resume, Msg.HEARTBEAT: _heartbeat,
        Msg.BYE: _bye,
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(msg: dict, key: str) -> str | None:
    """An optional string field; anything else is malformed."""
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{msg['type']}.{key} must be a string, got {type(value).__name__}", ErrorCode.MALFORMED)
    return value


def _text(value: Any, default: str) -> str:
    """A peer's free text as one short, printable log line."""
    if not isinstance(value, str) or not value.strip():
        return default
    return "".join(ch if ch.isprintable() else "?" for ch in value[:MAX_TEXT])


def serve(task: str, *, token: bytes, config: ServerConfig | None = None, num_envs: int = 1,
          seed: int | None = None, on_ready=None) -> None:
    """Build the task's env with make_env and serve it until SIGINT/SIGTERM."""
    import signal

    from hg_dagger.envs import make_env

    env = make_env(task, num_envs=num_envs, seed=seed)
    try:
        server = BridgeServer(env, token, config, seed=seed)
    except BaseException:
        env.close()
        raise

    def _stop(signum, _frame):
        log.info("signal %d: shutting down", signum)
        server.shutdown()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGUSR1, lambda *_: server.request_estop("SIGUSR1 on the robot side"))
    host, port = server.address
    log.info("serving %s (num_envs %d, mapping %s) on %s:%d, heartbeat timeout %g s", env.task_id, env.num_envs,
             env.mapping.hash, host, port, server.config.heartbeat_timeout_s)
    if on_ready is not None:
        on_ready(host, port)
    t0 = time.monotonic()
    server.serve_forever()
    log.info("stopped after %.1f s: %d steps, %d resets, %d sessions, %d heartbeat losses, refused %s",
             time.monotonic() - t0, server.counters.steps, server.counters.resets, server.counters.sessions,
             server.counters.heartbeat_losses, server.counters.refused or "none")
