"""The bridge over TLS: a real `hg-dagger bridge serve --tls-cert --tls-key` subprocess with a self-signed certificate
made by the openssl command line. A run records over it; a certificate the app does not trust, a name the
certificate does not carry, a client without TLS and a TLS client at a bridge without TLS are each refused with one
line on both sides while the robot keeps holding; a client that stalls in the handshake does not stall the robot."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import numpy as np
import pytest
from support.bridge import TOKEN, Robot
from support.cli import run_cli

from hg_dagger.cli import main
from hg_dagger.envs.bridge import BridgeError, ErrorCode, RobotState
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

OPENSSL = shutil.which("openssl")


def _cert(folder, name: str, san: str = "DNS:localhost,IP:127.0.0.1"):
    """A self-signed P-256 certificate and its unencrypted key (openssl req -x509)."""
    if OPENSSL is None:
        pytest.skip("the openssl command line is not installed")
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName={san}"], check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture
def tls_robot(tmp_path):
    """A TLS bridge serving toy_reach; yields (robot, its certificate)."""
    cert, key = _cert(tmp_path, "robot")
    r = Robot(tmp_path, "toy_reach", "--tls-cert", str(cert), "--tls-key", str(key), "--handshake-timeout", "0.5")
    r.port  # noqa: B018 - wait until it listens
    yield r, cert
    r.stop()


def _held_and_unmoved(r: Robot, cert) -> None:
    """The robot is still in hold and never stepped (checked over a good TLS session)."""
    with_ca = r.client(tls_ca=cert)
    try:
        status = with_ca.status()
        assert status["state"] == RobotState.HOLD and status["steps"] == 0
    finally:
        with_ca.close()


def test_run_over_tls_records_and_the_log_says_tls(tmp_path, tls_robot, capsys):
    r, cert = tls_robot
    store = tmp_path / "store"
    assert main(["run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "2", "--robot",
                 f"127.0.0.1:{r.port}", "--token-file", str(r.token_file), "--tls-ca", str(cert), "--store", str(store),
                 "--calibrate-steps", "0", "--max-episode-steps", "15", "--quiet"]) == 0
    assert "2 episodes" in capsys.readouterr().out
    s = EpisodeStore.open(str(store))
    assert validate_store(s) == [] and len(s.episodes()) == 2
    assert all(i.end.num_steps > 0 for i in s.episodes())
    assert r.wait_log("session 1 from", timeout=5)
    assert "over TLS" in r.log() and "refused" not in r.log()
    # the bridge's own log file (beside its token file) has the same lines
    assert "over TLS" in (tmp_path / "hg-dagger-bridge.log").read_text()


def test_a_tls_session_steps_with_heartbeats(tls_robot):
    """Requests and the heartbeat thread share the TLS connection (reads and writes never overlap in OpenSSL)."""
    r, cert = tls_robot
    env = r.client(tls_ca=cert, tls_server_name="localhost")
    try:
        env.reset(seed=0)
        for _ in range(30):
            env.step(np.zeros((1, 2), np.float32))
            time.sleep(0.01)  # long enough for heartbeats to go out between steps
        assert env.status()["steps"] == 30 and env.robot_state == RobotState.RUNNING
    finally:
        env.close()


@pytest.mark.parametrize("case", ["untrusted", "wrong_name"])
def test_a_certificate_the_app_does_not_trust_is_refused_on_both_sides(tmp_path, tls_robot, case):
    r, cert = tls_robot
    if case == "untrusted":
        other, _ = _cert(tmp_path, "impostor")
        kw, says = {"tls_ca": other}, "self-signed certificate"
    else:
        kw, says = {"tls_ca": cert, "tls_server_name": "robot.example"}, "Hostname mismatch"
    t0 = time.monotonic()
    with pytest.raises(BridgeError) as err:
        r.client(**kw)
    assert err.value.code == ErrorCode.TLS and time.monotonic() - t0 < 5  # refused at once, not retried
    line = str(err.value)
    assert "\n" not in line and "TLS certificate is not trusted" in line and says in line
    assert r.wait_log("refused tls from", timeout=5)
    if case == "untrusted":
        assert "the client does not trust this robot's certificate" in r.log()
    assert "Traceback" not in r.log()
    _held_and_unmoved(r, cert)


def test_a_client_without_tls_is_refused_with_a_hint(tls_robot):
    r, cert = tls_robot
    with pytest.raises(BridgeError) as err:
        r.client(max_retries=0)
    assert err.value.code == ErrorCode.UNREACHABLE
    assert "no challenge from the robot" in str(err.value) and "--tls-ca" in str(err.value)
    assert r.wait_log("no TLS handshake within 0.5 s (a client without TLS?)", timeout=5)
    _held_and_unmoved(r, cert)


def test_a_tls_client_at_a_bridge_without_tls_is_refused(tmp_path):
    cert, _ = _cert(tmp_path, "robot")
    r = Robot(tmp_path, "toy_reach")
    try:
        with pytest.raises(BridgeError) as err:
            r.client(tls_ca=cert)
        assert err.value.code == ErrorCode.TLS and "is the bridge served with --tls-cert?" in str(err.value)
        assert r.wait_log("a TLS handshake, but this bridge serves without TLS", timeout=5)
    finally:
        r.stop()


def test_a_stalled_handshake_does_not_stall_the_robot(tls_robot):
    """A peer that sends half a ClientHello and waits: the loop serves others and closes it on the handshake timeout."""
    r, cert = tls_robot
    stalled = socket.create_connection(("127.0.0.1", r.port))
    try:
        stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a record header and a fraction of it
        env = r.client(tls_ca=cert)
        try:
            env.reset(seed=0)
            t0 = time.monotonic()
            for _ in range(10):
                env.step(np.zeros((1, 2), np.float32))
            assert time.monotonic() - t0 < 2.0
        finally:
            env.close()
        assert r.wait_log("refused handshake_timeout", timeout=5)
        stalled.settimeout(5)
        assert stalled.recv(100) == b""  # closed by the robot, nothing sent on it
    finally:
        stalled.close()


def test_bad_certificate_or_key_files_are_one_line(tmp_path):
    cert, key = _cert(tmp_path, "robot")
    other_cert, other_key = _cert(tmp_path, "other")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    cases = [
        ((tmp_path / "missing.pem", key), "TLS certificate", "missing.pem"),
        ((key, key), "no PEM certificate", "robot.key"),
        ((cert, tmp_path / "missing.key"), "TLS key", "missing.key"),
        ((cert, other_key), "does not match certificate", "other.key"),
    ]
    for (c, k), says, name in cases:
        out = run_cli("bridge", "serve", "toy_reach", "--port", "0", "--token-file", token, "--tls-cert", c,
                      "--tls-key", k, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert lines[0].startswith("error: ") and says in lines[0] and name in lines[0], lines
    bad_ca = run_cli("run", "--task", "toy_reach", "--store", tmp_path / "s", "--robot", "127.0.0.1:1", "--token-file",
                     token, "--tls-ca", tmp_path / "nope.pem", timeout=120)
    assert bad_ca.returncode == 2 and "Traceback" not in bad_ca.stderr
    assert bad_ca.stderr.strip().splitlines()[-1] == f"error: TLS CA file {tmp_path / 'nope.pem'}: No such file or directory"
