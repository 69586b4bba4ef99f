"""Policies behind policy servers: a toy student saved to a checkpoint, a server in this process (a thread) and a
real `hg-dagger policy serve` child process."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from hg_dagger.envs import load_mapping
from hg_dagger.policy import Student


@pytest.fixture
def mapping():
    return load_mapping("toy_reach")


@pytest.fixture
def student_pt(tmp_path, mapping):
    """A fresh (untrained) toy_reach student saved as a checkpoint: it stalls, so gates ask for help."""
    path = tmp_path / "student.pt"
    Student.create(mapping, seed=0).save(path)
    return path


class ServerProcess:
    """`hg-dagger policy serve SPEC ...` in a child process on a free loopback port; its log goes to a file."""

    def __init__(self, tmp_path: Path, spec, *args: str):
        n = len(list(tmp_path.glob("policy-server*.log")))
        self.log_path = tmp_path / f"policy-server{n}.log"
        self._log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "hg_dagger", "policy", "serve", str(spec), "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"policy server did not start: {line!r}\n{self.log()}")
        self.url = line.strip().removeprefix("listening on ")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def serve_process(tmp_path):
    started: list[ServerProcess] = []

    def start(spec, *args: str) -> ServerProcess:
        started.append(ServerProcess(tmp_path, spec, *args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def script_server(tmp_path):
    """A test's own policy server script (tests/policy/served_*.py) in a child process: ``start(name, *args)`` ->
    its ws:// address."""
    procs: list[tuple[subprocess.Popen, object]] = []

    def start(name: str, *args: str) -> str:
        cmd = [sys.executable, str(Path(__file__).with_name(name)), *args]
        log = open(tmp_path / f"{Path(name).stem}{len(procs)}.log", "w")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append((proc, log))
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            raise RuntimeError(f"{name} did not start: {line!r}")
        return line.strip().removeprefix("listening on ")

    yield start
    for proc, log in procs:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        log.close()


@pytest.fixture
def clock_server(script_server):
    """`tests/policy/served_clock.py`: a slow served policy whose actions say which step they are for
    (``start(delay, chunk=..., steps=..., batch=...)`` -> its ws:// address)."""

    def start(delay: float, chunk: int = 10, steps: int = 10, batch: bool = False) -> str:
        args = ["--delay", str(delay), "--chunk", str(chunk), "--steps", str(steps)]
        return script_server("served_clock.py", *args, *(["--batch"] if batch else []))

    return start
