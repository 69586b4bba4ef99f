"""The bridge wire format in one process: framing, ndarray encoding, the handshake digest, tokens, hold action."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from hg_dagger.envs.bridge import hold_action, load_token
from hg_dagger.envs.bridge.protocol import (
    HEADER,
    BridgeError,
    ErrorCode,
    FrameReader,
    ProtocolError,
    auth_digest,
    check_digest,
    decode,
    encode,
    new_nonce,
)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(6, dtype=">f8").reshape(2, 3),  # big-endian goes out little-endian
        np.zeros((0, 3), np.float32),
        np.array(7, np.int64),
        np.array([[True, False]]),
        np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],  # not contiguous
        np.random.default_rng(0).integers(0, 255, (2, 16, 16, 3), dtype=np.uint8),
        np.array([np.nan, -np.inf, 1e-30], np.float32),
    ],
)
def test_ndarrays_round_trip_exactly(arr):
    msg = decode(encode({"type": "x", "a": arr, "nested": {"b": [arr]}})[HEADER.size :])
    for out in (msg["a"], msg["nested"]["b"][0]):
        assert out.shape == arr.shape and out.dtype == arr.dtype.newbyteorder("<")
        np.testing.assert_array_equal(out, arr)
        assert out.flags.writeable


def test_numpy_scalars_travel_as_plain_values_and_objects_are_refused():
    msg = decode(encode({"type": "x", "f": np.float32(0.5), "i": np.int64(3), "t": (1, 2)})[HEADER.size :])
    assert msg == {"type": "x", "f": 0.5, "i": 3, "t": [1, 2]}
    with pytest.raises(TypeError, match="dtype object"):
        encode({"type": "x", "a": np.array([object()])})
    with pytest.raises(TypeError, match="cannot send a set|cannot send"):
        encode({"type": "x", "a": object()})


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"\xc1", "invalid byte"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({"kind": "step"}), "no type"),
        (msgpack.packb({"type": 3}), "type not a string"),
        (msgpack.packb({1: "x", "type": "a"}), "non-string key"),
        (msgpack.packb({"type": "a"}) + b"\x01", "trailing bytes"),
        (msgpack.packb({"type": "a", "x": msgpack.ExtType(9, b"")}), "unknown ext"),
        (msgpack.packb({"type": "a", "x": msgpack.ExtType(1, b"\x03<f4\x01\x02\x00\x00\x00" + b"\0" * 4)}), "size"),
        (msgpack.packb({"type": "a", "x": msgpack.ExtType(1, b"\x03|O8\x01\x01\x00\x00\x00" + b"\0" * 8)}), "dtype"),
        (msgpack.packb({"type": "a", "x": msgpack.ExtType(1, b"\x03<f4\x09")}), "ndim"),
    ],
)
def test_malformed_payloads_raise_protocol_errors(payload, why):
    with pytest.raises(ProtocolError) as err:
        decode(payload)
    assert err.value.code == ErrorCode.MALFORMED, why


def test_frame_reader_reassembles_split_frames_and_refuses_oversized_headers_early():
    frames = encode({"type": "a", "v": np.arange(100)}) + encode({"type": "b"})
    reader = FrameReader(max_bytes=4096)
    got = []
    for i in range(0, len(frames), 7):  # dribble the stream in 7-byte pieces
        got += reader.feed(frames[i : i + 7])
    assert [decode(p)["type"] for p in got] == ["a", "b"]
    reader = FrameReader(max_bytes=4096)
    with pytest.raises(ProtocolError, match="4097 bytes exceeds the limit of 4096") as err:
        reader.feed(HEADER.pack(4097))  # refused on the header alone, before any body arrives
    assert err.value.code == ErrorCode.OVERSIZED


def test_handshake_digest_binds_token_and_nonce():
    nonce, token = new_nonce(), b"secret"
    digest = auth_digest(token, nonce)
    assert check_digest(token, nonce, digest)
    assert not check_digest(b"secreT", nonce, digest)
    assert not check_digest(token, new_nonce(), digest)  # a recorded digest does not replay on a new connection
    assert not check_digest(token, nonce, digest.hex())
    assert not check_digest(token, nonce, None)
    assert token not in digest


def test_token_from_file_or_environment(tmp_path, monkeypatch):
    path = tmp_path / "tok"
    path.write_text("  abc123 \n")
    assert load_token(path) == b"abc123"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(BridgeError, match="empty"):
        load_token(tmp_path / "empty")
    with pytest.raises(BridgeError, match="cannot read bridge token file"):
        load_token(tmp_path / "missing")
    monkeypatch.setenv("HG_DAGGER_BRIDGE_TOKEN", "from-env")
    assert load_token() == b"from-env"
    monkeypatch.delenv("HG_DAGGER_BRIDGE_TOKEN")
    with pytest.raises(BridgeError, match="HG_DAGGER_BRIDGE_TOKEN"):
        load_token()


def test_hold_action_stops_motion_and_keeps_the_gripper_command():
    fetch = ["dx", "dy", "dz", "gripper"]
    assert np.array_equal(hold_action(fetch, None, 2), np.zeros((2, 4), np.float32))
    last = np.array([[0.3, -0.2, 1.0, -1.0], [1.0, 1.0, 1.0, 0.5]], np.float32)
    np.testing.assert_array_equal(hold_action(fetch, last, 2), [[0, 0, 0, -1.0], [0, 0, 0, 0.5]])
    toy = ["shoulder_vel", "elbow_vel"]
    np.testing.assert_array_equal(hold_action(toy, np.ones((1, 2), np.float32), 1), np.zeros((1, 2)))


def test_hmac_key_is_the_token_files_hex_characters_not_the_bytes_they_encode(tmp_path):
    import hashlib
    import hmac

    from hg_dagger.envs.bridge import new_token

    path = tmp_path / "robot.token"
    path.write_text(new_token() + "\n")  # what `hg-dagger bridge token` writes
    key = load_token(path)
    assert len(key) == 64 and key == path.read_text().strip().encode("ascii")  # the characters, as bytes
    nonce = new_nonce()
    by_hand = hmac.new(path.read_bytes().strip(), b"hg-dagger-bridge\0" + nonce, hashlib.sha256).digest()
    assert auth_digest(key, nonce) == by_hand  # the recipe in docs/bridge-protocol.md
    assert not check_digest(bytes.fromhex(key.decode()), nonce, by_hand)  # the 32 decoded bytes are another key
