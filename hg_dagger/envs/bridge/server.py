"""The robot side of the bridge: a TCP server that serves one robot (envs.bridge.robot: any sim backend, or a
robot driver, and its running / hold / estop states).

One thread, one selector loop: it accepts connections, authenticates them, hands commands from the single active
session to the robot and runs the heartbeat watchdog between frames. Every refusal is logged with its reason and
answered with an ``error`` message; nothing that is refused reaches the env. The heartbeat watchdog guards motion:
a session silent past the timeout while the robot runs is dropped and the robot holds; while it holds there is
nothing to stop, so a silent session (an app still starting up) keeps its session.
"""

from __future__ import annotations

import logging
import selectors
import signal
import socket
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

from hg_dagger.contract.clock import now_ns
from hg_dagger.envs import make_env
from hg_dagger.envs.base import VecEnv
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
    check_digest,
    decode,
    encode,
    new_nonce,
)
from hg_dagger.envs.bridge.robot import Counters, Robot, is_int, string_field, text
from hg_dagger.envs.bridge.tls import handshake_problem, looks_like_tls, server_context
from hg_dagger.errors import EnvError

log = logging.getLogger("hg_dagger.bridge.server")

LOOPBACK = ("127.0.0.1", "::1", "localhost")

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
    tls_cert: str | None = None  # PEM certificate (chain) and key: serve over TLS (docs/bridge-protocol.md, TLS)
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise BridgeError("bridge server: TLS needs both a certificate and its key (--tls-cert and --tls-key)")
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
    tls_pending: bool = False  # a TLS connection whose handshake has not finished: nothing is sent on it yet
    rx_bytes: int = 0


class BridgeServer:
    """Serves one VecEnv to one authenticated client at a time. Not thread-safe: run it in one thread."""

    def __init__(self, env: VecEnv, token: bytes, config: ServerConfig | None = None, *, seed: int | None = None):
        if not token:
            raise BridgeError("the bridge server needs a non-empty token")
        self.env = env
        self.config = config or ServerConfig()
        self._token = bytes(token)
        self.instance = uuid.uuid4().hex
        cert, key = self.config.tls_cert, self.config.tls_key  # both or neither (ServerConfig)
        self._tls = server_context(cert, key) if cert and key is not None else None
        self.robot = Robot(env, seed=seed, counters=Counters())
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

    @property
    def counters(self) -> Counters:
        return self.robot.counters

    @property
    def state(self) -> str:  # a RobotState value
        return self.robot.state

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
                            self._on_ready(key.data)
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
        if self._active is not None or self.robot.running:
            self.robot.hold("server shutting down", logging.INFO)
        self._sel.close()
        self._listener.close()
        self.robot.close()

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
        if self._tls is not None:
            try:  # the handshake runs non-blocking in the loop (_handshake); the handshake timeout bounds it
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError) as exc:
                log.warning("refused tls from %s:%s: %s (connection closed)", addr[0], addr[1], exc)
                sock.close()
                return
            sock.setblocking(False)
        else:
            sock.settimeout(self.config.send_timeout_s)  # sends block (bounded); reads happen only when readable
        t = now_ns()
        conn = _Conn(sock, f"{addr[0]}:{addr[1]}", new_nonce(), FrameReader(PREAUTH_MAX_FRAME_BYTES), t, t,
                     tls_pending=self._tls is not None)
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        log.debug("connection from %s", conn.peer)
        if conn.tls_pending:
            self._handshake(conn)
        else:
            self._challenge(conn)

    def _challenge(self, conn: _Conn) -> None:
        self._send(conn, {"type": Msg.CHALLENGE, "protocol": PROTOCOL_NAME, "version": PROTOCOL_VERSION,
                          "nonce": conn.nonce})

    def _handshake(self, conn: _Conn) -> None:
        """One non-blocking step of a TLS handshake: the loop comes back when the socket is ready again, so a
        peer that never finishes cannot stall it (the handshake timeout closes it)."""
        sock = cast(ssl.SSLSocket, conn.sock)  # a TLS connection's socket is wrapped
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except (ssl.SSLError, OSError) as exc:
            self._refuse_tls(conn, handshake_problem(exc))
            return
        conn.tls_pending = False
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        conn.sock.settimeout(self.config.send_timeout_s)  # from here on like a plain connection (reads: _receive)
        log.debug("TLS from %s: %s, %s", conn.peer, sock.version(), (sock.cipher() or ("?",))[0])
        self._challenge(conn)

    def _refuse_tls(self, conn: _Conn, why: str) -> None:
        """A failed TLS handshake: logged and counted like any refusal; no error message (there is no channel)."""
        self.counters.refused[ErrorCode.TLS] = self.counters.refused.get(ErrorCode.TLS, 0) + 1
        log.warning("refused %s from %s: TLS handshake failed: %s (connection closed)", ErrorCode.TLS, conn.peer, why)
        self._drop(conn, "TLS handshake failed")

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
        if conn.closed or conn.tls_pending:
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
            self.robot.hold(f"session from {conn.peer} lost: {why}")

    def _on_ready(self, conn: _Conn) -> None:
        if conn.tls_pending:
            self._handshake(conn)
        else:
            self._on_readable(conn)

    def _receive(self, conn: _Conn) -> tuple[bytes, bool]:
        """What the peer sent, and whether it closed. A TLS socket is read without blocking: a readable socket may
        hold only part of a record, and waiting for the rest would stall the loop."""
        if self._tls is None:
            data = conn.sock.recv(1 << 20)
            return data, not data
        chunks, eof = [], False
        conn.sock.setblocking(False)
        try:
            for _ in range(256):  # records of at most 16 KiB; what is left wakes the selector again
                try:
                    data = conn.sock.recv(1 << 20)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                except ssl.SSLZeroReturnError:
                    eof = True
                    break
                if not data:
                    eof = True
                    break
                chunks.append(data)
        finally:
            if not conn.closed:
                conn.sock.settimeout(self.config.send_timeout_s)
        return b"".join(chunks), eof

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data, eof = self._receive(conn)
        except OSError as exc:
            self._drop(conn, f"receive failed: {exc}")
            return
        if data:
            self._on_data(conn, data)
        if eof and not conn.closed:
            if conn is self._active:
                log.warning("session from %s closed its connection without bye", conn.peer)
            self._drop(conn, "connection closed")

    def _on_data(self, conn: _Conn, data: bytes) -> None:
        if conn.rx_bytes == 0 and self._tls is None and looks_like_tls(data):
            self._refuse(conn, ErrorCode.TLS, "a TLS handshake, but this bridge serves without TLS (serve with "
                         "--tls-cert, or connect without a TLS CA)")
            return
        conn.rx_bytes += len(data)
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
    # ------------------------------------------------------------------ heartbeat
    def _watchdog(self) -> None:
        if self._estop_request is not None:
            reason, self._estop_request = self._estop_request, None
            self.robot.estop(reason)
        t = now_ns()
        for conn in list(self._conns.values()):
            if not conn.authed and t - conn.t_open > self.config.handshake_timeout_s * 1e9:
                self._refuse(conn, ErrorCode.HANDSHAKE_TIMEOUT,
                             f"no TLS handshake within {self.config.handshake_timeout_s:g} s (a client without TLS?)"
                             if conn.tls_pending else f"no hello within {self.config.handshake_timeout_s:g} s")
        active = self._active
        silent = active is not None and t - active.last_rx > self.config.heartbeat_timeout_s * 1e9
        if silent and not self.robot.running:
            # a held (or e-stopped) robot has no motion to stop, so the session stays: an app still loading
            # (importing torch holds Python's GIL, heartbeat thread included, for over 0.5 s on a busy
            # machine) keeps it. Only its own reset or resume runs the robot again, and that ends the silence.
            assert active is not None  # silent implies an active session
            if not active.quiet_logged:
                active.quiet_logged = True
                log.info("session from %s silent for over %.0f ms while the robot is in %s; kept (nothing moves)",
                         active.peer, self.config.heartbeat_timeout_s * 1e3, self.state)
            return
        if active is not None and not silent:
            active.quiet_logged = False
        if silent:
            assert active is not None
            silent_ms = (t - active.last_rx) / 1e6
            self.counters.heartbeat_losses += 1
            log.warning("heartbeat lost from %s: silent for %.0f ms (timeout %.0f ms)", active.peer, silent_ms,
                        self.config.heartbeat_timeout_s * 1e3)
            self._close(active)
            self.robot.hold(f"heartbeat lost: session from {active.peer} silent for {silent_ms:.0f} ms "
                       f"(timeout {self.config.heartbeat_timeout_s * 1e3:.0f} ms)")

    # ------------------------------------------------------------------ messages
    def _dispatch(self, conn: _Conn, msg: dict) -> None:
        kind, re = msg["type"], msg.get("seq")
        if re is not None and not is_int(re):
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
            self.robot.hold(f"backend raised on {kind}: {exc}")
            self._refuse(conn, ErrorCode.INTERNAL, f"backend raised on {kind}: {type(exc).__name__}: {exc}", re)
            return
        if reply is not None:
            reply["re"] = re
            self._send(conn, reply)

    def _hello(self, conn: _Conn, msg: dict) -> None:
        re = msg.get("seq")
        version = msg.get("version")
        if not is_int(version) or version != PROTOCOL_VERSION:
            shown = version if is_int(version) else type(version).__name__
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
        if self.robot.running:
            self.robot.hold(f"new session from {conn.peer}")
        log.info("session %d from %s (client %s)", self.counters.sessions, conn.peer, text(msg.get("client"), "?"))
        m = self.env.mapping
        self._send(conn, {
            "type": Msg.WELCOME, "re": re, "version": PROTOCOL_VERSION, "instance": self.instance,
            "task_id": m.task_id, "mapping_hash": m.hash, "num_envs": self.env.num_envs,
            "action_dim": m.action_dim, "action_names": self.robot.names, "control_hz": m.control_hz,
            "obs_spec": {k: [list(s), d] for k, (s, d) in m.obs_spec().items()},
            "hold_action": self.robot.hold_action(),
            "heartbeat_timeout_s": self.config.heartbeat_timeout_s, "max_frame_bytes": self.config.max_frame_bytes,
            "state": self.state, "reason": self.robot.reason, "robot": self.env.robot,
        })

    def _status(self, _msg: dict | None = None) -> dict:
        return {**self.robot.status(), "instance": self.instance,
                "session": self._active.peer if self._active else None}

    def _reset(self, msg: dict) -> dict:
        return self.robot.reset(msg)

    def _step(self, msg: dict) -> dict:
        return self.robot.step(msg)

    def _observe(self, _msg: dict) -> dict:
        return self.robot.observe()

    def _ping(self, _msg: dict) -> dict:
        return {"type": Msg.PONG, "t_robot": now_ns()}

    def _estop(self, msg: dict) -> dict:
        self.robot.estop(text(string_field(msg, "reason"), "e-stop from the client"))
        return self._status()

    def _estop_release(self, _msg: dict) -> dict:
        self.robot.release_estop()
        return self._status()

    def _resume(self, msg: dict) -> dict:
        self.robot.resume(msg)
        return self._status()

    def _heartbeat(self, _msg: dict) -> None:
        return None

    def _bye(self, _msg: dict) -> None:
        conn = self._active
        if conn is not None:
            log.info("session from %s ended", conn.peer)
            self._close(conn)
            self.robot.hold("client ended the session", logging.INFO)
        return None

    _HANDLERS = {
        Msg.RESET: _reset, Msg.STEP: _step, Msg.OBSERVE: _observe, Msg.PING: _ping, Msg.STATUS: _status,
        Msg.ESTOP: _estop, Msg.ESTOP_RELEASE: _estop_release, Msg.RESUME: _resume, Msg.HEARTBEAT: _heartbeat,
        Msg.BYE: _bye,
    }


def serve(task: str, *, token: bytes, config: ServerConfig | None = None, num_envs: int = 1,
          seed: int | None = None, on_ready=None) -> None:
    """Build the task's env with make_env and serve it until SIGINT/SIGTERM."""
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
    log.info("serving %s (num_envs %d, mapping %s) on %s:%d%s, heartbeat timeout %g s", env.task_id, env.num_envs,
             env.mapping.hash, host, port, f" over TLS ({server.config.tls_cert})" if server.config.tls_cert else "",
             server.config.heartbeat_timeout_s)
    if on_ready is not None:
        on_ready(host, port)
    t0 = time.monotonic()
    server.serve_forever()
    log.info("stopped after %.1f s: %d steps, %d resets, %d sessions, %d heartbeat losses, refused %s",
             time.monotonic() - t0, server.counters.steps, server.counters.resets, server.counters.sessions,
             server.counters.heartbeat_losses, server.counters.refused or "none")
