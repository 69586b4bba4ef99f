"""hg-dagger bridge serve TASK | hg-dagger bridge token FILE"""

from __future__ import annotations

import os
import sys

from hg_dagger import safety_log
from hg_dagger.envs.bridge.protocol import (
    DEFAULT_HOST,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_PORT,
    TOKEN_ENV,
    load_token,
    new_token,
)
from hg_dagger.envs.bridge.server import ServerConfig, serve
from hg_dagger.envs.bridge.tls import server_context
from hg_dagger.errors import ConfigError

LOG_NAME = "hg-dagger-bridge.log"
LOGGERS = ("hg_dagger.bridge", "hg_dagger.safety")  # the robot side's whole log: every line is about its safety


def register(sub) -> None:
    p = sub.add_parser("bridge", help="robot bridge: serve a task to a remote app over TCP (docs/bridge-protocol.md)")
    bsub = p.add_subparsers(dest="bridge_command", metavar="ACTION", required=True)
    s = bsub.add_parser("serve", help="robot side: serve TASK's env (any sim backend) on a TCP port")
    s.add_argument("task", metavar="TASK", help="task id (configs/tasks/<TASK>.yaml) or a task YAML path")
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: loopback only)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port, 0 = any free port (default {DEFAULT_PORT})")
    s.add_argument("--token-file", help=f"file holding the shared token (default: environment variable {TOKEN_ENV})")
    s.add_argument("--heartbeat-timeout", type=float, default=0.5, metavar="SECONDS",
                   help="hold position when the client is silent this long (default 0.5)")
    s.add_argument("--handshake-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="close connections that do not authenticate within this time (default 2)")
    s.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES,
                   help=f"refuse longer frames (default {DEFAULT_MAX_FRAME_BYTES})")
    s.add_argument("--num-envs", type=int, default=1)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--tls-cert", metavar="FILE", help="serve over TLS with this PEM certificate (chain); needs --tls-key")
    s.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert (unencrypted, mode 600)")
    s.add_argument("--log-file", metavar="FILE", help=f"also write the log (refusals, sessions, holds, e-stops) to this "
                   f"rotated file (default: {LOG_NAME} beside --token-file, else in the working directory; "
                   "'-': none)")
    s.set_defaults(func=_serve)
    t = bsub.add_parser("token", help="write a fresh random token to FILE (mode 600)")
    t.add_argument("file", metavar="FILE")
    t.set_defaults(func=_token)


def _serve(args) -> int:
    token = load_token(args.token_file)
    config = ServerConfig(host=args.host, port=args.port, heartbeat_timeout_s=args.heartbeat_timeout,
                          handshake_timeout_s=args.handshake_timeout, max_frame_bytes=args.max_frame_bytes,
                          tls_cert=args.tls_cert, tls_key=args.tls_key)
    if args.tls_cert:
        server_context(args.tls_cert, args.tls_key)  # a bad certificate or key: one line before the task loads
    log_file = _log_file(args)
    handler = None if log_file is None else safety_log.attach(log_file, LOGGERS)

    def ready(host: str, port: int) -> None:
        print(f"listening on {host}:{port}", flush=True)  # the one stdout line; scripts parse the port from it

    try:
        serve(args.task, token=token, config=config, num_envs=args.num_envs, seed=args.seed, on_ready=ready)
    finally:
        safety_log.detach(handler, LOGGERS)
    return 0


def _log_file(args) -> str | None:
    """Where the bridge's log also goes: --log-file, else beside the token file (the robot's bridge folder)."""
    if args.log_file == "-":
        return None
    if args.log_file:
        return args.log_file
    folder = os.path.dirname(os.path.abspath(args.token_file)) if args.token_file else os.getcwd()
    return os.path.join(folder, LOG_NAME)


def _token(args) -> int:
    folder = os.path.dirname(os.path.abspath(args.file))
    if not os.path.isdir(folder):
        raise ConfigError(f"{args.file}: folder {folder} does not exist (create it first)")
    try:
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(new_token() + "\n")
    except OSError as exc:
        raise ConfigError(f"{args.file}: cannot write the token ({exc.strerror or exc})") from None
    print(f"wrote a new bridge token to {args.file}", file=sys.stderr)
    return 0
