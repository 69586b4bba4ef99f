"""Policy sources: a ``--policy SPEC`` string -> a policy acting on a task (the ``policies`` registry).

    PATH.pt              the built-in student (``Student.load``)
    ws://HOST:PORT       a policy server speaking openpi's protocol (policy.remote; also wss://)
    lerobot:DIR          a LeRobot pretrained_model folder, served by ``hg-dagger policy serve lerobot:DIR`` in
                         LeRobot's own Python (``--policy-python`` or HG_DAGGER_POLICY_PYTHON), started here and
                         stopped with the policy

A spec ``NAME:REST`` (or ``NAME://REST``) picks the source registered as NAME; anything else is a path (the
student). Other packages add sources through the entry point group ``hg_dagger.policies`` (a ``PolicySource``
under its scheme name).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hg_dagger.errors import ConfigError
from hg_dagger.policy.lerobot_served import read_config
from hg_dagger.policy.remote import PolicyOptions, RemotePolicy
from hg_dagger.policy.student import Student
from hg_dagger.policy.wire import PolicyError
from hg_dagger.registry import Registry

PYTHON_ENV = "HG_DAGGER_POLICY_PYTHON"
READY = "listening on "  # the one stdout line of `hg-dagger policy serve`: "listening on ws://HOST:PORT"


@dataclass(frozen=True)
class PolicySource:
    """One kind of policy: ``open(spec, mapping, options)`` -> a policy (act, reset_rows, version; close when it
    holds a connection or a process). ``remote``: it acts in another process, so it is not shipped to Ray workers
    and the built-in trainer cannot train it."""

    open: Callable[[str, Any, PolicyOptions], Any]
    description: str
    example: str
    remote: bool = True


POLICIES: Registry[PolicySource] = Registry("policies", "policy source")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9_.+-]+):(//)?")


def source_name(spec: str) -> str:
    """The registry name a spec picks: its scheme (``ws``/``wss`` -> ``ws``), else ``student`` (a path)."""
    spec = str(spec)
    m = _SCHEME.match(spec)
    if m is None or (m.group(2) is None and Path(spec).exists()):
        return "student"
    scheme = m.group(1).lower()
    return "ws" if scheme in ("ws", "wss") else scheme


def policy_source(spec: str) -> PolicySource:
    """The source of ``spec``; an unknown scheme is one line listing the known ones."""
    if not str(spec).strip():
        raise ConfigError("an empty policy spec: give PATH.pt, ws://HOST:PORT or lerobot:DIR")
    return POLICIES.get(source_name(spec))


def is_remote(spec: str | None) -> bool:
    return spec is not None and policy_source(spec).remote


def open_policy(spec: str, mapping, options: PolicyOptions | None = None):
    """The policy ``spec`` names, bound to ``mapping`` (refused in one line when it does not fit the task). It
    keeps ``spec`` and ``options`` (``opened_from``), so a policy whose server went away can be opened again."""
    options = options or PolicyOptions()
    policy = policy_source(spec).open(str(spec), mapping, options)
    policy.opened_from = (str(spec), options)
    return policy


def close_policy(policy) -> None:
    """Close what a policy holds (a connection, a server process); nothing for the built-in student."""
    close = getattr(policy, "close", None)
    if callable(close):
        close()


# ---------------------------------------------------------------------- the built-in student


def _open_student(spec: str, mapping, options: PolicyOptions):
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        raise ConfigError(f"{spec} is a folder with a config.json, not a student checkpoint: for a LeRobot "
                          f"pretrained_model folder give --policy lerobot:{spec}")
    return Student.load(path, mapping)


# ---------------------------------------------------------------------- a policy server


def _open_ws(spec: str, mapping, options: PolicyOptions) -> RemotePolicy:
    return RemotePolicy(spec, mapping, options)


# ---------------------------------------------------------------------- LeRobot, in its own Python


class ServerProcess:
    """A ``hg-dagger policy serve`` child process on a free loopback port. It exits when we close its stdin (so it
    also ends when this process dies); its log goes to a temporary file, whose last line is the reason when it
    fails to start."""

    def __init__(self, python: str, spec: str, *, extra: list[str] | None = None):
        self.spec = spec
        self.log = tempfile.TemporaryFile(mode="w+", prefix="hg-dagger-policy-server-")
        cmd = [python, "-m", "hg_dagger", "policy", "serve", spec, "--host", "127.0.0.1", "--port", "0",
               "--exit-with-stdin", *(extra or [])]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                         text=True)
        except OSError as exc:
            self.log.close()
            raise ConfigError(f"--policy {spec}: cannot start the policy python {python!r} "
                              f"({exc.strerror or exc})") from None
        self.python = python

    def wait_ready(self, timeout_s: float) -> str:
        """The server's address once it listens; its error line when it exits or does not start in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                why = self.last_line() or "no output"
                self.stop()
                raise PolicyError(f"--policy {self.spec}: the policy server did not start within {timeout_s:g} s "
                                  f"({why})")
            stdout = self.proc.stdout
            assert stdout is not None  # started with stdout=PIPE
            ready, _, _ = select.select([stdout], [], [], min(left, 0.5))
            line = stdout.readline() if ready else ""
            if line.startswith(READY):
                return line[len(READY):].strip()
            if ready and not line or self.proc.poll() is not None:
                code = self.proc.wait()
                why = self.last_line() or "no message"
                self.stop()
                raise PolicyError(f"--policy {self.spec}: the policy server in {self.python} exited ({code}): {why}")

    def last_line(self) -> str:
        try:
            self.log.seek(0)
            lines = [ln.strip() for ln in self.log.read().splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        errors = [ln for ln in lines if ln.startswith("error: ")]
        line = (errors or lines or [""])[-1]
        return line[len("error: "):] if line.startswith("error: ") else line

    def stop(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            assert proc.stdin is not None  # started with stdin=PIPE
            try:
                proc.stdin.close()  # the server's own way out
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            self.log.close()
        except OSError:
            pass


def policy_python(options: PolicyOptions) -> str | None:
    return options.python or os.environ.get(PYTHON_ENV) or None


def _open_lerobot(spec: str, mapping, options: PolicyOptions) -> RemotePolicy:
    folder = Path(spec.split(":", 1)[1]).expanduser().resolve()
    read_config(folder)  # a wrong folder fails here, before any process starts
    python = policy_python(options)
    if python is None:
        raise ConfigError(f"--policy {spec}: a LeRobot policy runs in LeRobot's own Python; give --policy-python "
                          f"PATH (or set {PYTHON_ENV}), or start `hg-dagger policy serve lerobot:DIR --port N` there "
                          f"yourself and pass --policy ws://HOST:N")
    server = ServerProcess(python, f"lerobot:{folder}")
    try:
        url = server.wait_ready(options.start_timeout_s)
        return RemotePolicy(url, mapping, options, on_close=server.stop, label=f"{url} (lerobot:{folder})")
    except BaseException:
        server.stop()
        raise


POLICIES.register("student", PolicySource(_open_student, "the built-in student's checkpoint", "runs/x/student.pt",
                                          remote=False))
POLICIES.register("ws", PolicySource(_open_ws, "a policy server speaking openpi's protocol", "ws://gpu-box:8000"))
POLICIES.register("lerobot", PolicySource(_open_lerobot, "a LeRobot pretrained_model folder, served from LeRobot's "
                                          "own Python", "lerobot:outputs/train/act/checkpoints/last/pretrained_model"))


__all__ = ["POLICIES", "PYTHON_ENV", "PolicySource", "ServerProcess", "close_policy", "is_remote", "open_policy",
           "policy_python", "policy_source", "source_name"]
