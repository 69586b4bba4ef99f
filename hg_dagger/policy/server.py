"""A policy server speaking openpi's protocol over a websocket (``hg-dagger policy serve``).

On each connection the server first sends the policy's metadata (a msgpack map), then answers each request (a
msgpack map of numpy arrays: one observation, or a batch where the metadata says ``"batch": true``) with
``{"actions": chunk, "server_timing": {"infer_ms": ...}, ...}``. A request it cannot serve is answered with one
text frame saying why, and that connection is closed (code 1011); other connections go on. ``GET /healthz``
answers 200 for load balancers and scripts. Requests of all connections are served one at a time.

What is served is a ``ServedPolicy`` (``metadata()``, ``infer(obs)``): the built-in student (``StudentServed``,
here) or a LeRobot policy (policy.lerobot_served, in LeRobot's environment). Metadata keys we write (others are
free to add their own; the client reads these where present):

    policy_version   str   recorded as each episode's policy_version
    policy_type      str   e.g. "hg_dagger.student/mlp", "act"
    input_features   map   observation name -> {"shape": [...], "dtype": ...} (policy.features names)
    output_features  map   {"action": {"shape": [A]}}; or action_dim: int
    chunk_size       int   actions per chunk (H)
    n_action_steps   int   actions of each chunk to execute before asking again
    batch            bool  requests may carry a leading batch dimension (replies [N, H, A])
    uncertainty      bool  replies carry per-observation ``uncertainty`` and ``confidence``
    samples          int   replies carry ``action_samples``: K samples of the chunk, [K, H, A] (batched [N, K, H, A]),
                           raw units: a stochastic policy's draws, the built-in student's ensemble members
                           (``policy serve --samples K``); the spread gate scores their spread
"""

from __future__ import annotations

import http
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from hg_dagger.errors import HgDaggerError
from hg_dagger.policy.features import STATE, from_wire, task_features
from hg_dagger.policy.student import to_policy_units
from hg_dagger.policy.wire import PolicyError, packb, unpackb

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000  # openpi's default


class ServedPolicy(Protocol):
    def metadata(self) -> dict[str, Any]: ...

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]: ...


class PolicyServer:
    """Serves ``policy`` on ``host:port`` (0: any free port; ``address`` says which) until ``shutdown``."""

    def __init__(self, policy: ServedPolicy, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        # imported here: this module's own serve() takes the name at the top
        from websockets.sync.server import serve

        if not 0 <= int(port) <= 65535:
            raise PolicyError(f"policy server: port {port} out of range 0..65535")
        self.policy = policy
        self.meta = policy.metadata()
        self._meta_bytes = packb(self.meta)
        self._lock = threading.Lock()
        self._open: set = set()  # connections being served (closed by shutdown)
        self.requests = 0
        try:
            self._server = serve(self._handle, host, int(port), compression=None, max_size=None,
                                 process_request=_health)
        except OSError as exc:
            raise PolicyError(f"policy server: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host, self.port = self._server.socket.getsockname()[:2]
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("policy server listening on %s: not loopback; anyone who can reach port %d can drive it",
                        host, self.port)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> PolicyServer:
        """Serve from a daemon thread (tests, tools); ``shutdown`` stops it."""
        threading.Thread(target=self.serve_forever, name="policy-server", daemon=True).start()
        return self

    def shutdown(self) -> None:
        """Stop listening and close every connection (clients see the server go away)."""
        self._server.shutdown()
        for conn in list(self._open):
            try:
                conn.close(code=1001, reason="policy server shutting down")
            except Exception:  # already gone
                pass

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _handle(self, conn) -> None:
        peer = conn.remote_address
        log.info("policy client %s connected", peer)
        self._open.add(conn)
        try:
            conn.send(self._meta_bytes)
            while True:
                raw = conn.recv()
                t0 = time.perf_counter()
                try:
                    if not isinstance(raw, bytes):
                        raise PolicyError("a request must be a binary msgpack frame")
                    obs = unpackb(raw)
                    if not isinstance(obs, dict):
                        raise PolicyError(f"a request must be a map of observations, got {type(obs).__name__}")
                    obs = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in obs.items()}
                    with self._lock:
                        t1 = time.perf_counter()
                        reply = dict(self.policy.infer(obs))
                        infer_ms = (time.perf_counter() - t1) * 1e3
                        self.requests += 1
                except HgDaggerError as exc:
                    _refuse(conn, str(exc))
                    return
                except Exception as exc:  # the policy's own failure: logged here in full, one line to the client
                    log.exception("policy failed on a request from %s", peer)
                    _refuse(conn, f"{type(exc).__name__}: {exc}")
                    return
                reply["server_timing"] = {"infer_ms": infer_ms, "total_ms": (time.perf_counter() - t0) * 1e3}
                conn.send(packb(reply))
        except ConnectionClosed:
            pass
        finally:
            self._open.discard(conn)
            log.info("policy client %s disconnected", peer)


def _refuse(conn, message: str) -> None:
    log.warning("request refused: %s", message)
    try:
        conn.send(message)
        conn.close(code=CloseCode.INTERNAL_ERROR, reason=message[:120])
    except Exception:
        pass


def _health(conn, request):
    if request.path == "/healthz":
        return conn.respond(http.HTTPStatus.OK, "OK\n")
    return None


# ---------------------------------------------------------------------- the built-in student


class StudentServed:
    """The built-in student behind a policy server: it reads ``observation.state`` (and its cameras), answers a
    batch in one pass, and returns its chunk (one action for a non-chunk head) in raw action units with its
    ensemble's uncertainty and confidence, so a served student gates like a local one."""

    def __init__(self, student, samples: int = 0):
        self.student = student
        self.mapping = student.mapping
        self.feats = task_features(self.mapping)
        self.horizon = int(student.net.horizon)
        members = int(student.spec.ensemble)
        if not 0 <= samples <= members:
            raise PolicyError(f"--samples {samples}: the student has {members} ensemble members, its samples; give "
                              f"0..{members}")
        self.samples = int(samples)

    def metadata(self) -> dict[str, Any]:
        m, s = self.mapping, self.student
        reads = [STATE] + [n for n, f in self.feats.items() if f.image and f.keys[0] in s.spec.image_keys]
        return {
            "policy_version": s.version,
            "policy_type": f"hg_dagger.student/{s.spec.kind}",
            "input_features": {n: {"shape": list(self.feats[n].shape), "dtype": self.feats[n].dtype} for n in reads},
            "output_features": {"action": {"shape": [m.action_dim], "dtype": "float32", "names": list(m.action.names)}},
            "action_dim": m.action_dim,
            "chunk_size": self.horizon,
            "n_action_steps": self.horizon,
            "batch": True,
            "uncertainty": True,
            "gate_thresholds": dict(s.gate_thresholds),
            "samples": self.samples,
            "task": m.task_id,
            "mapping_hash": m.hash,
            "server": "hg-dagger",
        }

    def infer(self, msg: dict[str, Any]) -> dict[str, Any]:
        obs, batched = from_wire(msg, self.mapping)
        chunk, unc, conf = student_chunk(self.student, obs)
        reply: dict[str, Any] = {"actions": chunk, "uncertainty": unc, "confidence": conf}
        if self.samples:
            reply["action_samples"] = student_samples(self.student, obs)[:, : self.samples]
        return reply if batched else {k: v[0] for k, v in reply.items()}


def student_chunk(student, obs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The student's actions for the next steps from ``obs`` alone, raw units [N, H, A] (H = 1 but for a chunk
    head: then its members' mean chunk, without the temporal ensemble a local rollout adds), with its uncertainty
    and confidence [N]. For H = 1 this is ``student.act`` itself."""
    # torch deferred: seconds to import; only the code that runs a model loads it
    import torch

    net = student.net
    if net.horizon <= 1:
        out = student.act(obs)
        return out.action[:, None, :], out.uncertainty, out.confidence
    with torch.inference_mode():
        state, images = student.encode(obs)
        chunks = net.chunks(state, images).numpy()  # normalized [K, N, H, A]
    z = chunks[:, :, 0]
    unc = z.std(0).mean(-1, dtype=np.float32) if z.shape[0] > 1 else np.zeros(z.shape[1], np.float32)
    conf = np.exp(-unc / net.uncertainty_ref.numpy()).astype(np.float32)
    policy = to_policy_units(chunks.mean(0), net.act_mean.numpy(), net.act_std.numpy())
    raw = np.asarray(student.mapping.policy_to_raw(policy), np.float32)
    return raw, unc.astype(np.float32), conf


def student_samples(student, obs: dict[str, np.ndarray]) -> np.ndarray:
    """Each ensemble member's chunk from ``obs``, raw units [N, K, H, A]: the student's samples of its action."""
    # torch deferred: seconds to import; only the code that runs a model loads it
    import torch

    net = student.net
    with torch.inference_mode():
        state, images = student.encode(obs)
        chunks = net.chunks(state, images).numpy()  # normalized [K, N, H, A]
    policy = to_policy_units(chunks, net.act_mean.numpy(), net.act_std.numpy())
    raw = np.asarray(student.mapping.policy_to_raw(policy.reshape(-1, policy.shape[-1])), np.float32)
    return raw.reshape(policy.shape).transpose(1, 0, 2, 3)


def serve(policy: ServedPolicy, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted; ``on_ready(address)`` once listening."""
    server = PolicyServer(policy, host, port)
    log.info("serving policy %s (%s)", server.meta.get("policy_version"), server.meta.get("policy_type"))
    if on_ready is not None:
        on_ready(server.address)
    try:
        server.serve_forever()
    finally:
        server.shutdown()


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "PolicyServer", "ServedPolicy", "StudentServed", "serve", "student_chunk",
           "student_samples"]
