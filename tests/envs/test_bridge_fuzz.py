"""Bridge message fuzzing (hypothesis) against a real `hg-dagger bridge serve` subprocess.

Hostile peers send malformed, truncated and oversized frames, unauthenticated commands, replayed
handshakes, NaN and wrong-shape actions, bad seeds, seqs and command ids, and floods of connections.
Whatever they send, the server must not crash (no traceback in its log), must not move the robot (steps,
resets and the observation stay exactly as they were) and must still serve a correct client afterwards.

Budgets are small so this runs in seconds in CI, with a fixed example sequence (derandomized). A longer,
randomized run: HG_DAGGER_FUZZ_EXAMPLES=5000 pytest tests/envs/test_bridge_fuzz.py (docs/bridge-protocol.md).
"""

from __future__ import annotations

import os
import socket
import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.bridge import TOKEN, Robot

from hg_dagger.envs.bridge import Msg, RobotState
from hg_dagger.envs.bridge.protocol import HEADER, PROTOCOL_VERSION, auth_digest, encode, recv_frame

pytestmark = [pytest.mark.subprocess]

N, A = 2, 2  # the fuzzed robot: toy_reach with two rows
LONG = int(os.environ.get("HG_DAGGER_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=LONG or 40, deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class World:
    """The robot server, its starting observation, and a way to look at it without moving it."""

    def __init__(self, tmp_path):
        self.robot = Robot(tmp_path, "toy_reach", "--handshake-timeout", "5", num_envs=N, heartbeat=5.0)
        self.port = self.robot.port
        raw = self.session()
        assert raw.request({"type": Msg.RESET, "seed": 7})["state"] == RobotState.RUNNING
        raw.close()
        self.status, self.obs = self.look()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def session(self) -> Peer:
        peer = Peer(self.connect())
        welcome = peer.request({"type": Msg.HELLO, "version": PROTOCOL_VERSION,
                                "digest": auth_digest(TOKEN.encode(), peer.challenge["nonce"])})
        assert welcome["type"] == Msg.WELCOME, welcome
        return peer

    def look(self) -> tuple[dict, dict]:
        peer = self.session()
        status = peer.request({"type": Msg.STATUS})
        obs = peer.request({"type": Msg.OBSERVE})["obs"]
        peer.close()
        return status, obs

    def running_session(self) -> Peer:
        """A session with the robot running, so a bad step would be applied if it got through."""
        peer = self.session()
        if peer.request({"type": Msg.STATUS})["state"] == RobotState.ESTOP:
            peer.request({"type": Msg.ESTOP_RELEASE})
        assert peer.request({"type": Msg.RESUME, "by": "fuzz"})["state"] == RobotState.RUNNING
        return peer

    def assert_unmoved(self) -> None:
        assert self.robot.proc.poll() is None, self.robot.log()[-3000:]
        status, obs = self.look()
        assert (status["steps"], status["resets"]) == (self.status["steps"], self.status["resets"])
        for k, v in self.obs.items():
            np.testing.assert_array_equal(obs[k], v, err_msg=k)
        log = self.robot.log()
        assert "Traceback" not in log and "unexpected failure" not in log and "backend raised" not in log


class Peer:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.challenge = recv_frame(sock, 4096)
        self.seq = 1000

    def request(self, msg: dict) -> dict:
        self.seq += 1
        msg["seq"] = self.seq
        self.sock.sendall(encode(msg))
        while True:
            reply = recv_frame(self.sock, 1 << 26)
            if reply.get("re") == self.seq:
                return reply

    def drain(self) -> list[dict]:
        """Every reply until the server answers a status request (or closes the connection)."""
        replies = []
        try:
            self.seq += 1
            self.sock.sendall(encode({"type": Msg.STATUS, "seq": self.seq}))
            while True:
                reply = recv_frame(self.sock, 1 << 26)
                if reply.get("re") == self.seq and reply["type"] == Msg.STATUS:
                    return replies
                replies.append(reply)
        except (OSError, ConnectionError):
            return replies

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("fuzz"))
    yield w
    w.robot.stop()


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def pack(obj) -> bytes:
    """A payload as the wire carries it (ndarrays as ext type 1), whatever it holds."""
    return encode(obj)[HEADER.size:]


# ------------------------------------------------------------------ strategies
ints = st.integers(-2**63, 2**64 - 1)  # what msgpack can carry
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True),
                    st.text(max_size=12), st.binary(max_size=12))
any_array = hnp.arrays(st.sampled_from(["<f4", "<f8", "<f2", "<i8", "<i4", "|u1", "|b1"]),
                       hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
values = st.recursive(scalars | any_array, lambda kids: st.lists(kids, max_size=3)
                      | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=8)


def _applicable(a) -> bool:
    return isinstance(a, np.ndarray) and a.shape == (N, A) and a.dtype.kind == "f" and bool(np.isfinite(a).all())


nan_actions = st.builds(lambda a, i, v: _poison(a, i, v), hnp.arrays("<f4", (N, A), elements=st.floats(-1, 1, width=32)),
                        st.integers(0, N * A - 1), st.sampled_from([np.nan, np.inf, -np.inf]))


def _poison(a, i, v):
    a = a.copy()
    a.flat[i] = v
    return a


bad_actions = st.one_of(nan_actions, values.filter(lambda a: not _applicable(a)))
bad_seeds = st.one_of(st.integers(-2**63, -1), st.integers(2**32, 2**64 - 1), st.booleans(), st.floats(),
                      st.text(max_size=4), st.lists(st.integers(-2**63, -1), min_size=1, max_size=3))
bad_seqs = st.one_of(st.text(max_size=4), st.floats(), st.booleans(), st.lists(ints, max_size=2))
bad_cids = st.one_of(ints, st.just(""), st.text(min_size=129, max_size=140), st.lists(st.text(), max_size=2))


@st.composite
def hostile_requests(draw) -> dict:
    """A message from an authenticated peer that must never move the robot."""
    kind = draw(st.sampled_from(["step", "reset", "bad_seq", "bad_cid", "other", "unknown"]))
    if kind == "step":
        msg = {"type": Msg.STEP, "action": draw(bad_actions)}
        if draw(st.booleans()):
            msg["cid"] = draw(st.text(min_size=1, max_size=16))
    elif kind == "reset":
        msg = {"type": Msg.RESET, "seed": draw(bad_seeds)}
    elif kind == "bad_seq":  # a step that would move the robot, but its seq is not an int
        msg = {"type": Msg.STEP, "action": np.zeros((N, A), np.float32), "seq": draw(bad_seqs)}
    elif kind == "bad_cid":
        msg = {"type": Msg.STEP, "action": np.zeros((N, A), np.float32), "cid": draw(bad_cids)}
    elif kind == "other":
        msg = {"type": draw(st.sampled_from([Msg.OBSERVE, Msg.PING, Msg.STATUS, Msg.HEARTBEAT, Msg.ESTOP, Msg.HELLO]))}
    else:
        msg = {"type": draw(st.text(max_size=20).filter(lambda t: t not in Msg.__dict__.values()))}
    msg.update(draw(st.dictionaries(st.sampled_from(["reason", "by", "client", "extra", "obs"]), values, max_size=2)))
    return msg


# ------------------------------------------------------------------ properties
@FUZZ
@given(chunks=st.lists(st.binary(max_size=64), max_size=4), close_early=st.booleans())
def test_raw_bytes_before_the_handshake(world, chunks, close_early):
    sock = world.connect()
    recv_frame(sock, 4096)  # the challenge
    try:
        for chunk in chunks:
            sock.sendall(chunk)
        if not close_early:  # a partial frame gets no answer: wait only briefly for one
            sock.settimeout(0.1)
            try:
                reply = recv_frame(sock, 1 << 20)
                assert reply["type"] == Msg.ERROR  # never a welcome
            except (OSError, ConnectionError):
                pass
    except OSError:
        pass  # the server closed the connection first
    finally:
        sock.close()
    world.assert_unmoved()


@FUZZ
@given(msg=st.dictionaries(st.sampled_from(["type", "seq", "version", "digest", "client", "action", "seed"]), values,
                           max_size=5), as_hello=st.booleans(), size=st.sampled_from(["ok", "oversized", "truncated"]))
def test_unauthenticated_messages_never_get_in(world, msg, as_hello, size):
    if as_hello:
        msg = {**msg, "type": Msg.HELLO}
    sock = world.connect()
    recv_frame(sock, 4096)
    payload = pack(msg)
    data = {"ok": frame(payload), "oversized": HEADER.pack(4097) + payload[:64],
            "truncated": frame(payload)[: max(1, len(payload) // 2)]}[size]
    try:
        sock.sendall(data)
        sock.settimeout(5 if size != "truncated" else 0.1)
        reply = recv_frame(sock, 1 << 20)
        assert reply["type"] == Msg.ERROR, reply
    except (OSError, ConnectionError):
        pass
    finally:
        sock.close()
    world.assert_unmoved()


@FUZZ
@given(flip=st.integers(0, 31), wrong_token=st.booleans())
def test_replayed_or_forged_handshakes_are_refused(world, flip, wrong_token):
    first = Peer(world.connect())
    recorded = auth_digest(TOKEN.encode(), first.challenge["nonce"])  # a digest seen on the wire once
    first.close()
    peer = Peer(world.connect())
    if wrong_token:
        digest = auth_digest(TOKEN.encode() + b"x", peer.challenge["nonce"])
    else:
        digest = bytearray(recorded)
        digest[flip] ^= 0x01 if flip % 2 else 0x00  # replayed as is, or with one bit changed
        digest = bytes(digest)
    reply = peer.request({"type": Msg.HELLO, "version": PROTOCOL_VERSION, "digest": digest})
    assert reply["type"] == Msg.ERROR and reply["code"] == "auth"
    peer.close()
    world.assert_unmoved()


@FUZZ
@given(msgs=st.lists(hostile_requests(), min_size=1, max_size=4), garbage=st.booleans())
def test_authenticated_hostile_messages_never_move_the_robot(world, msgs, garbage):
    peer = world.running_session()
    for msg in msgs:
        peer.seq += 1
        msg.setdefault("seq", peer.seq)  # a bad seq drawn for the message stays
        try:
            peer.sock.sendall(frame(pack(msg)))
        except OSError:
            break
    if garbage:
        try:
            peer.sock.sendall(frame(b"\xc1\x00garbage"))
        except OSError:
            pass
    for reply in peer.drain():
        assert reply["type"] != Msg.OBS or "reward" not in reply, reply  # no step was ever applied
    peer.close()
    world.assert_unmoved()


def test_a_flood_of_connections_leaves_the_robot_unmoved_and_a_client_gets_in(world):
    stop = threading.Event()

    def flood(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            try:
                sock = world.connect()
            except OSError:
                continue
            try:
                what = rng.integers(4)
                if what == 1:
                    sock.sendall(rng.bytes(int(rng.integers(1, 200))))
                elif what == 2:
                    sock.sendall(struct.pack(">I", 1 << 30))  # an absurd frame length
                elif what == 3:
                    sock.sendall(encode({"type": Msg.STEP, "seq": 1, "action": np.zeros((N, A), np.float32)}))
            except OSError:
                pass
            sock.close()

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):  # correct clients get in while the flood goes on, and the robot stays put
            with world.robot.client(max_retries=20, backoff_max_s=0.5, clock_pings=1) as env:
                status = env.status()
                assert (status["steps"], status["resets"]) == (world.status["steps"], world.status["resets"])
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    world.assert_unmoved()


def test_a_correct_client_still_works_after_the_fuzzing(world):
    # runs last in this module: whatever came before, the robot serves a real session normally
    world.assert_unmoved()
    with world.robot.client(task_id="toy_reach") as env:
        obs, _ = env.reset(seed=3)
        res = env.step(np.full((N, A), 0.5, np.float32))
        assert any(not np.array_equal(res.obs[k], obs[k]) for k in obs)  # it moved, as told
        status = env.status()
        assert status["steps"] == world.status["steps"] + 1 and status["state"] == RobotState.RUNNING
    assert "Traceback" not in world.robot.log()
