"""The app side of the bridge: ``BridgeEnv``, a VecEnv that drives a remote robot over TCP.

It maps robot timestamps onto our monotonic clock (ping/pong, ClockMapping), refuses bad actions
before they leave the process, keeps the session alive with a heartbeat thread that runs from the
moment a session opens (before the clock sync, the mapping check and whatever the caller loads next),
and reconnects with
bounded, backed-off retries when the connection drops. A step that was in flight when the link
dropped is re-sent with the same command id, and the robot answers it without stepping twice.

A robot that held while the link was down keeps holding after the reconnect: the re-sent step is
refused (``BridgeError`` with ``code == "state"``, ``robot_state == "hold"``) until a person calls
``resume(by=...)``. Only ``resume_on_reconnect=True``, an explicit choice for unattended runs,
resumes by itself, and says so (the robot logs who resumed, and the next reply's info carries
"robot_resumed").
"""

from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from hg_dagger.contract.clock import NO_TIME, ClockMapping, now_ns
from hg_dagger.envs.base import Obs, StepResult, VecEnv, check_view_args, fault_flags
from hg_dagger.envs.bridge.protocol import (
    DEFAULT_HOST,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_PORT,
    FATAL_CODES,
    PROTOCOL_VERSION,
    BridgeError,
    ErrorCode,
    Msg,
    ProtocolError,
    Receiver,
    RobotState,
    auth_digest,
    encode,
    recv_frame,
)
from hg_dagger.envs.bridge.tls import client_context
from hg_dagger.envs.common import fit_image, image_keys
from hg_dagger.envs.mapping import TaskMapping, load_mapping
from hg_dagger.errors import EnvError

log = logging.getLogger("hg_dagger.bridge.client")

# refusals that a reconnect cannot fix: report them at once
_NO_RETRY = frozenset({ErrorCode.AUTH, ErrorCode.VERSION, ErrorCode.TLS})


class _TLSReader:
    """Reads a TLS socket for recv_frame while the heartbeat thread may write to it: OpenSSL allows one thread at a
    time on a connection, so each read holds the send lock, taken only once data is there (never while waiting)."""

    def __init__(self, sock: ssl.SSLSocket, lock: threading.Lock):
        self.sock, self.lock = sock, lock

    def recv(self, n: int) -> bytes:
        if not self.sock.pending():
            ready, _, _ = select.select([self.sock], [], [], self.sock.gettimeout())
            if not ready:
                raise TimeoutError("timed out")
        with self.lock:
            return self.sock.recv(n)


class _Dropped(Exception):
    """The connection is gone (or never came up); the request may be retried after a reconnect."""


class BridgeEnv(VecEnv):
    """A VecEnv whose rows live in a robot-side ``hg-dagger bridge serve`` process.

    info per step, besides the contract's keys: "t_obs"/"t_action_apply" on OUR clock,
    "alignment_error_ms" (clock-mapping uncertainty), "transport_ns" (round trip minus robot-side
    handling), "robot_state", and the robot's fault flags "estop" and "sensor_loss" (bool [N]).
    A step the robot refuses raises BridgeError with ``code`` and ``robot_state`` set.
    """

    world_clock = "live"  # a robot keeps moving while the app thinks

    def __init__(
        self,
        task_id: str | None = None,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: bytes | str,
        connect_timeout_s: float = 2.0,
        request_timeout_s: float = 10.0,
        max_retries: int = 5,
        backoff_s: float = 0.05,
        backoff_max_s: float = 1.0,
        clock_pings: int = 8,
        clock_resync_s: float = 5.0,
        resume_on_reconnect: bool = False,
        heartbeat: bool = True,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        client_name: str = "hg-dagger",
        mapping: TaskMapping | None = None,
        tls_ca: str | os.PathLike | None = None,
        tls_server_name: str | None = None,
    ):
        """``mapping``: the task mapping to check the robot against (default: configs/tasks/<task>.yaml).
        ``resume_on_reconnect``: lift a hold found after a reconnect without a person (unattended runs only).
        ``tls_ca``: connect over TLS, trusting robot certificates that chain to this PEM file (a CA, or the
        robot's self-signed certificate); the certificate must name ``tls_server_name`` (default ``host``)."""
        self.host, self.port = host, int(port)
        self.tls_ca = None if tls_ca is None else os.fspath(tls_ca)
        self.tls_server_name = tls_server_name or host
        self._tls = None if tls_ca is None else client_context(tls_ca)
        self._token = token.encode() if isinstance(token, str) else bytes(token)
        self.connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s
        self.max_retries, self.backoff_s, self.backoff_max_s = max_retries, backoff_s, backoff_max_s
        self.clock_pings, self.clock_resync_s = clock_pings, clock_resync_s
        self.resume_on_reconnect = resume_on_reconnect
        self.max_frame_bytes = max_frame_bytes
        self.client_name = client_name
        self.reconnects = 0
        self._where = f"robot bridge {host}:{port}"
        self._sock: socket.socket | None = None
        self._seq = 0
        self._cid_prefix = uuid.uuid4().hex[:12]
        self._send_lock = threading.Lock()  # the heartbeat thread and requests share the socket
        self._request_lock = threading.RLock()  # one request/reply in flight at a time
        self._last_send = 0
        self._exchanges: deque[tuple[int, int, int]] = deque(maxlen=64)
        self._clock = ClockMapping()
        self._last_sync = 0
        self._welcome: dict[str, Any] = {}
        self._instance: str | None = None
        self._restarted_from: str | None = None  # set when we reconnect to a new robot process, until reset()
        self._closed = False
        self._resumed_note = ""  # an automatic resume, reported once in the next reply's info
        self._heartbeat = bool(heartbeat)
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None  # started when the first session opens

        try:
            with self._request_lock:
                self._connect_with_retries()
        except BaseException:
            self._heartbeat_stop.set()  # a session may have opened (and its heartbeat started) before the failure
            self._disconnect()
            raise
        w = self._welcome
        if task_id is not None and w["task_id"] != task_id:
            self.close()
            raise BridgeError(f"{self._where} serves task {w['task_id']!r}, not {task_id!r}")
        self.task_id: str = w["task_id"]
        self.num_envs: int = int(w["num_envs"])
        try:
            self._mapping = mapping if mapping is not None else load_mapping(self.task_id)
        except BaseException:
            self.close()
            raise
        if self._mapping.hash != w["mapping_hash"]:
            self.close()
            ours = "the given mapping" if mapping is not None else f"configs/tasks/{self.task_id}.yaml"
            raise EnvError(
                f"{self._where}: robot's mapping for {self.task_id} has hash {w['mapping_hash']}, ours "
                f"({ours}) has {self._mapping.hash}; use the same task config on both sides"
            )
        self._view_key = next(iter(image_keys(self._mapping)), None)  # the robot camera the task already sends
        self._last_obs: Obs | None = None

    # ------------------------------------------------------------------ VecEnv
    @property
    def mapping(self) -> TaskMapping:
        return self._mapping

    @property
    def robot(self) -> str:
        """What the robot side reports it steps (its backend's ``robot``), with the server instance."""
        reported = str(self._welcome.get("robot") or "unreported robot")
        assert self._instance is not None  # the welcome named it
        return f"{self._where} instance {self._instance[:8]}: {reported}"

    @property
    def clock(self) -> ClockMapping:
        """Robot clock -> our clock (offset and error bound), from the best recent ping/pong."""
        return self._clock

    @property
    def robot_state(self) -> str:
        return self._welcome.get("state", RobotState.HOLD)

    @property
    def hold_action(self) -> np.ndarray:
        """The robot's zero-motion hold command (as of the last welcome/status)."""
        return np.asarray(self._welcome["hold_action"], dtype=np.float32)

    def reset(self, seed: int | Sequence[int] | None = None, env_ids: Sequence[int] | None = None) -> tuple[Obs, dict]:
        msg: dict[str, Any] = {"type": Msg.RESET}
        if seed is not None:
            msg["seed"] = int(seed) if isinstance(seed, int | np.integer) else [int(s) for s in seed]
        if env_ids is not None:
            msg["env_ids"] = [int(i) for i in env_ids]
        reply, t_send, t_recv = self._request(msg, fresh_instance_ok=True)
        self._restarted_from = None
        return self._obs_info(reply, t_send, t_recv)

    def step(self, action: np.ndarray) -> StepResult:
        action = self.check_action(action)
        self._seq += 1
        msg = {"type": Msg.STEP, "action": action, "cid": f"{self._cid_prefix}:{self._seq}"}
        reply, t_send, t_recv = self._request(msg)
        obs, info = self._obs_info(reply, t_send, t_recv)
        n = self.num_envs
        terminated = np.asarray(reply["terminated"], dtype=bool)
        truncated = np.asarray(reply["truncated"], dtype=bool)
        if "signals" in reply:
            info["signals"] = reply["signals"]
        return StepResult(obs, np.asarray(reply["reward"], dtype=np.float32), terminated, truncated,
                          success=np.asarray(reply.get("success", np.zeros(n, bool)), dtype=bool),
                          final_obs=reply.get("final_obs", obs),
                          episode_start=np.asarray(reply.get("episode_start", terminated | truncated), dtype=bool),
                          t_obs=info.pop("t_obs"), t_action_apply=info.pop("t_action_apply"), info=info)

    def render_view(self, row: int = 0, size: int = 256) -> np.ndarray | None:
        """The robot camera's last frame of ``row`` (from the last reply) fitted to [size, size, 3];
        None when the task has no image observation."""
        check_view_args(row, size, self.num_envs, where=self.task_id)
        if self._view_key is None or self._last_obs is None:
            return None
        return fit_image(self._last_obs[self._view_key][int(row)], int(size))

    def observe(self) -> tuple[Obs, dict]:
        """The robot's current observation; the robot does not move."""
        reply, t_send, t_recv = self._request({"type": Msg.OBSERVE}, fresh_instance_ok=True)
        return self._obs_info(reply, t_send, t_recv)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        stop = getattr(self, "_heartbeat_stop", None)
        if stop is not None:
            stop.set()
        if self._sock is not None:
            try:
                self._send_frame(encode({"type": Msg.BYE}))
            except OSError:
                pass
            self._disconnect()
        thread = getattr(self, "_heartbeat_thread", None)
        if thread is not None:
            thread.join(timeout=1.0)

    # ------------------------------------------------------------------ robot commands
    def status(self) -> dict:
        reply, _, _ = self._request({"type": Msg.STATUS}, fresh_instance_ok=True)
        self._welcome["state"] = reply["state"]
        return reply

    def estop(self, reason: str = "operator e-stop") -> dict:
        """Latch the robot's emergency stop: it refuses every motion until ``release_estop``.

        Requests are serialised: called from another thread, it goes out right after the request in
        flight (a step takes milliseconds; the wait is bounded by request_timeout_s)."""
        reply, _, _ = self._request({"type": Msg.ESTOP, "reason": reason}, fresh_instance_ok=True)
        return reply

    def release_estop(self) -> dict:
        """Lift the e-stop; the robot then holds until ``reset`` or ``resume``."""
        reply, _, _ = self._request({"type": Msg.ESTOP_RELEASE}, fresh_instance_ok=True)
        return reply

    def resume(self, by: str = "operator") -> dict:
        """Leave a safe stop (hold) without resetting the episode: the operator's explicit action after a
        hold. ``by`` (who resumed) is logged by the robot and reported in its status as "resumed_by"."""
        reply, _, _ = self._request({"type": Msg.RESUME, "by": str(by)})
        return reply

    def sync_clock(self, pings: int | None = None) -> ClockMapping:
        """Ping/pong ``pings`` times and re-estimate the robot -> local clock mapping."""
        with self._request_lock:
            if self._sock is None:
                self._connect_with_retries()
            try:
                self._sync_clock(pings or self.clock_pings)
            except _Dropped as exc:
                self._disconnect()
                raise BridgeError(f"{self._where}: connection dropped during clock sync: {exc}") from exc
        return self._clock

    def _sync_clock(self, pings: int) -> None:
        for _ in range(pings):
            reply, t_send, t_recv = self._roundtrip({"type": Msg.PING})
            self._exchanges.append((t_send, int(reply["t_robot"]), t_recv))
        self._clock = ClockMapping.from_exchanges(list(self._exchanges))
        self._last_sync = now_ns()

    # ------------------------------------------------------------------ replies -> contract
    def _obs_info(self, reply: dict, t_send: int, t_recv: int) -> tuple[Obs, dict]:
        n, clock = self.num_envs, self._clock
        t_obs = np.asarray(reply["t_obs"], dtype=np.int64)
        t_apply = np.asarray(reply.get("t_action_apply", NO_TIME), dtype=np.int64)
        if t_obs.shape != (n,):
            t_obs = np.broadcast_to(t_obs, (n,))
        if t_apply.shape != (n,):
            t_apply = np.broadcast_to(t_apply, (n,))
        robot_ns = int(reply.get("t_send", 0)) - int(reply.get("t_recv", 0))
        # a robot-side time mapped onto our clock never leaves the round trip that carried it: the robot applied the
        # action and took the observation after our request left and before its reply arrived, whatever the offset's
        # error (a loaded machine can skew the ping/pong estimate by more than the time from a reply to the next act)
        info = {
            "t_obs": np.clip(t_obs + clock.offset_ns, t_send, t_recv),
            "t_action_apply": np.where(t_apply == NO_TIME, NO_TIME, np.clip(t_apply + clock.offset_ns, t_send, t_recv)),
            "alignment_error_ms": np.full(n, clock.error_ms, dtype=np.float32),
            "transport_ns": np.full(n, max(0, (t_recv - t_send) - robot_ns), dtype=np.int64),
            "robot_state": reply.get("state"),
        }
        # a robot that predates the fault flags still reports its state
        info["estop"] = (fault_flags(reply, "estop", n) if "estop" in reply
                         else np.full(n, reply.get("state") == RobotState.ESTOP))
        info["sensor_loss"] = fault_flags(reply, "sensor_loss", n)
        self._welcome["state"] = info["robot_state"] or self.robot_state
        if self._resumed_note:
            info["robot_resumed"], self._resumed_note = self._resumed_note, ""
        self._last_obs = reply["obs"]
        return reply["obs"], info

    # ------------------------------------------------------------------ transport
    def _request(self, msg: dict, *, fresh_instance_ok: bool = False) -> tuple[dict, int, int]:
        """Send one request and wait for its reply, reconnecting (bounded, backed off) if the link drops."""
        if self._closed:
            raise BridgeError(f"{self._where}: the bridge env is closed")
        with self._request_lock:
            if self._sock is not None and now_ns() - self._last_sync > self.clock_resync_s * 1e9:
                try:
                    self._sync_clock(max(2, self.clock_pings // 2))
                except _Dropped:
                    self._disconnect()
            for attempt in range(self.max_retries + 1):
                if self._sock is None:
                    self._connect_with_retries()
                if self._restarted_from is not None and not fresh_instance_ok:
                    assert self._instance is not None  # set with _restarted_from on reconnect
                    raise BridgeError(
                        f"{self._where}: the robot server restarted (instance {self._restarted_from[:8]} -> "
                        f"{self._instance[:8]}); its episode state is gone, call reset()", ErrorCode.STATE)
                try:
                    return self._roundtrip(msg)
                except _Dropped as exc:
                    log.warning("%s: connection dropped during %s (%s); reconnecting (%d/%d)", self._where,
                                msg["type"], exc, attempt + 1, self.max_retries)
                    self._disconnect()
            raise BridgeError(f"{self._where}: {msg['type']} failed after {self.max_retries} reconnects",
                              ErrorCode.UNREACHABLE)

    def _roundtrip(self, msg: dict) -> tuple[dict, int, int]:
        self._seq += 1
        seq = msg["seq"] = self._seq
        frame = encode(msg)
        t_send = now_ns()
        try:
            self._send_frame(frame)
            sock = self._sock
            assert sock is not None  # connected before a round trip
            source: Receiver = _TLSReader(cast(ssl.SSLSocket, sock), self._send_lock) if self._tls is not None else sock
            while True:
                reply = recv_frame(source, self.max_frame_bytes)
                if reply.get("re") == seq or (reply["type"] == Msg.ERROR and reply.get("re") is None):
                    break
        except ProtocolError as exc:
            self._disconnect()  # the byte stream can no longer be trusted
            raise BridgeError(f"{self._where}: robot sent a bad frame: {exc}", exc.code) from exc
        except (OSError, ConnectionError) as exc:
            raise _Dropped(str(exc) or type(exc).__name__) from exc
        t_recv = now_ns()
        if reply["type"] == Msg.ERROR:
            code, text = reply.get("code"), reply.get("message", "")
            if code in FATAL_CODES and code not in _NO_RETRY:
                raise _Dropped(f"robot closed the session: {code}: {text}")
            if reply.get("state"):
                self._welcome["state"] = reply["state"]
            raise BridgeError(f"{self._where} refused {msg['type']}: {code}: {text}", code, reply.get("state"))
        return reply, t_send, t_recv

    def _send_frame(self, frame: bytes) -> None:
        with self._send_lock:
            if self._sock is None:
                raise ConnectionError("not connected")
            self._sock.sendall(frame)
            self._last_send = now_ns()

    def _disconnect(self) -> None:
        with self._send_lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _connect_with_retries(self) -> None:
        delay, last = self.backoff_s, None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(delay)
                delay = min(delay * 2, self.backoff_max_s)
            try:
                self._connect_once()
                return
            except _Dropped as exc:
                last = exc
                log.info("%s: connect attempt %d/%d failed: %s", self._where, attempt + 1, self.max_retries + 1, exc)
        raise BridgeError(f"{self._where} unreachable after {self.max_retries + 1} attempts: {last}",
                          ErrorCode.UNREACHABLE)

    def _connect_once(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except OSError as exc:
            raise _Dropped(str(exc)) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls_handshake(sock)
        try:
            try:
                challenge = recv_frame(sock, 4096)
            except (OSError, ConnectionError) as exc:
                hint = "" if self._tls is not None else ("; a bridge served with --tls-cert needs a TLS CA on this "
                                                         "side (tls_ca, --tls-ca)")
                raise _Dropped(f"no challenge from the robot ({exc or type(exc).__name__}){hint}") from exc
            if challenge.get("type") != Msg.CHALLENGE or not isinstance(challenge.get("nonce"), bytes):
                raise BridgeError(f"{self._where}: not a robot bridge (first message {challenge.get('type')!r})")
            if challenge.get("version") != PROTOCOL_VERSION:
                raise BridgeError(f"{self._where} speaks bridge protocol version {challenge.get('version')!r}, "
                                  f"we speak {PROTOCOL_VERSION}", ErrorCode.VERSION)
            sock.sendall(encode({"type": Msg.HELLO, "seq": 0, "version": PROTOCOL_VERSION, "client": self.client_name,
                                 "digest": auth_digest(self._token, challenge["nonce"])}))
            welcome = recv_frame(sock, self.max_frame_bytes)
        except (OSError, ConnectionError) as exc:
            sock.close()
            raise _Dropped(str(exc) or type(exc).__name__) from exc
        except BaseException:
            sock.close()
            raise
        if welcome["type"] == Msg.ERROR:
            sock.close()
            raise BridgeError(f"{self._where} refused the handshake: {welcome.get('code')}: {welcome.get('message')}",
                              welcome.get("code"))
        sock.settimeout(self.request_timeout_s)
        reconnect = self._instance is not None
        was_running = self._welcome.get("state") == RobotState.RUNNING
        same_robot = reconnect and welcome["instance"] == self._instance
        with self._send_lock:
            self._sock = sock
        previous = self._instance
        self._welcome, self._instance = welcome, welcome["instance"]
        self._start_heartbeat()  # the robot's watchdog counts from the welcome
        if reconnect:
            self.reconnects += 1
            if not same_robot and self._restarted_from is None:
                self._restarted_from = previous
        if not same_robot:
            self._exchanges.clear()
        try:
            self._sync_clock(self.clock_pings)
            log.debug("%s: session up (robot %s, state %s, clock offset %d ns +/- %.3f ms)", self._where,
                      welcome["instance"][:8], welcome["state"], self._clock.offset_ns, self._clock.error_ms)
            if same_robot and was_running and welcome["state"] == RobotState.HOLD:
                if not self.resume_on_reconnect:
                    log.warning("%s: reconnected; the robot holds (%s) until resume() is called", self._where,
                                welcome.get("reason"))
                else:
                    by = f"{self.client_name} (resume_on_reconnect)"
                    log.warning("%s: reconnected; robot was holding (%s); resuming as %s", self._where,
                                welcome.get("reason"), by)
                    reply, _, _ = self._roundtrip({"type": Msg.RESUME, "by": by})
                    self._welcome["state"] = reply["state"]
                    self._resumed_note = f"{by} after: {welcome.get('reason')}"
        except _Dropped:
            self._disconnect()
            raise

    def _tls_handshake(self, sock: socket.socket) -> ssl.SSLSocket:
        """TLS over a fresh connection. A certificate we do not trust, or a bridge without TLS, is refused at once
        (no retry can fix it); a connection lost during the handshake is retried like any other."""
        try:
            assert self._tls is not None  # only TLS connections shake hands
            return self._tls.wrap_socket(sock, server_hostname=self.tls_server_name)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise BridgeError(f"{self._where}: the robot's TLS certificate is not trusted: {exc.verify_message} "
                              f"(checked against {self.tls_ca} for {self.tls_server_name!r})", ErrorCode.TLS) from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError, TimeoutError) as exc:
            sock.close()
            raise _Dropped(f"connection lost during the TLS handshake ({exc})") from exc
        except ssl.SSLError as exc:
            sock.close()
            raise BridgeError(f"{self._where}: TLS handshake failed ({exc.reason or exc}); is the bridge served with "
                              "--tls-cert?", ErrorCode.TLS) from None
        except OSError as exc:
            sock.close()
            raise _Dropped(f"TLS handshake: {exc}") from exc

    def _start_heartbeat(self) -> None:
        """Start the heartbeat thread once, at the first session's welcome; it serves every reconnect after."""
        if self._heartbeat and self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="bridge-heartbeat", daemon=True)
            self._heartbeat_thread.start()

    def _heartbeat_loop(self) -> None:
        frame = encode({"type": Msg.HEARTBEAT})
        while True:
            interval = float(self._welcome.get("heartbeat_timeout_s", 1.0)) / 4  # the robot's timeout / 4
            if self._heartbeat_stop.wait(interval / 4):
                return
            if now_ns() - self._last_send < interval * 1e9:
                continue
            try:
                self._send_frame(frame)
            except (OSError, ConnectionError):
                pass  # the next request notices the drop and reconnects
