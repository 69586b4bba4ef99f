"""TLS for the bridge (stdlib ssl): the robot's certificate and key from files, the app's trust from a CA file.

Optional: the token still authenticates the app; TLS adds encryption and proves to the app that it talks to the
robot whose certificate it trusts. Every bad file or failed handshake becomes one line that names the file or
says what the other side did (docs/bridge-protocol.md, TLS).
"""

from __future__ import annotations

import os
import ssl

from hg_dagger.envs.bridge.protocol import BridgeError, ErrorCode

# A TLS record of type handshake (22) with a 3.x version: the first bytes every TLS client sends.
_TLS_HANDSHAKE_START = (0x16, 0x03)


class _EncryptedKey(Exception):
    """The key file asks for a passphrase: a robot that serves unattended cannot type one."""


def _no_passphrase() -> bytes:
    raise _EncryptedKey()


def _readable(path: str | os.PathLike, what: str) -> str:
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError as exc:
        raise BridgeError(f"{what} {path}: {exc.strerror or exc}", ErrorCode.TLS) from None
    if b"-----BEGIN " not in head:
        raise BridgeError(f"{what} {path}: not a PEM file (no -----BEGIN line)", ErrorCode.TLS)
    return path


def server_context(cert: str | os.PathLike, key: str | os.PathLike) -> ssl.SSLContext:
    """The robot side's context: TLS 1.2 or newer, its certificate chain and key; no client certificates (the
    token authenticates the app)."""
    cert = _readable(cert, "TLS certificate")
    key = _readable(key, "TLS key")
    check = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        check.load_verify_locations(cafile=cert)  # parses the certificates alone, so a bad one is named as such
    except ssl.SSLError as exc:
        raise BridgeError(f"TLS certificate {cert}: no PEM certificate in it ({exc.reason or exc})", ErrorCode.TLS) \
            from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key, password=_no_passphrase)
    except _EncryptedKey:
        raise BridgeError(f"TLS key {key}: encrypted with a passphrase; give an unencrypted key (mode 600)",
                          ErrorCode.TLS) from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise BridgeError(f"TLS key {key} does not match certificate {cert}", ErrorCode.TLS) from None
        raise BridgeError(f"TLS key {key}: no usable PEM private key in it ({exc.reason or exc})", ErrorCode.TLS) \
            from None
    return ctx


def client_context(ca: str | os.PathLike) -> ssl.SSLContext:
    """The app side's context: the robot's certificate must chain to ``ca`` (a CA file, or the robot's
    self-signed certificate itself) and name the host the app connects to (a DNS name in its subjectAltName, or
    an IP address as an IP entry there)."""
    ca = _readable(ca, "TLS CA file")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except ssl.SSLError as exc:
        raise BridgeError(f"TLS CA file {ca}: no PEM certificate in it ({exc.reason or exc})", ErrorCode.TLS) \
            from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def looks_like_tls(data: bytes) -> bool:
    """True when ``data`` opens with a TLS handshake record: a TLS client talking to a bridge without TLS."""
    return len(data) >= 2 and (data[0], data[1]) == _TLS_HANDSHAKE_START


def handshake_problem(exc: BaseException) -> str:
    """Why a handshake failed, in words, from the robot's side (the client's alert says what it disliked)."""
    reason = getattr(exc, "reason", None) or ""
    if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason or "CERTIFICATE_UNKNOWN" in reason:
        return f"the client does not trust this robot's certificate ({reason})"
    if "HTTP_REQUEST" in reason or "WRONG_VERSION_NUMBER" in reason or "RECORD" in reason:
        return f"not a TLS client ({reason}); a client without TLS needs a bridge served without --tls-cert"
    return f"{reason or type(exc).__name__}: {exc}"
