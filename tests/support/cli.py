"""The CLI in a real subprocess (one command run to its end, or a run to kill and resume), and what a run's
loss.jsonl says so far."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CLI = "import sys; from hg_dagger.cli import main; sys.exit(main(sys.argv[1:]))"


def cli_process(args: list[str]) -> subprocess.Popen:
    """`hg-dagger ARGS` started in a subprocess with text pipes."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.Popen([sys.executable, "-c", CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def loss_iterations(path) -> set[int]:
    """Iterations with a logged loss line (the trainer logs training of iteration it as it + 1); a line cut by a
    kill is skipped."""
    if not path.is_file():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        try:
            out.add(int(json.loads(line)["iteration"]))
        except (ValueError, KeyError):
            continue
    return out


def run_cli(*args, timeout=600) -> subprocess.CompletedProcess:
    """`python -m hg_dagger ARGS` to its end, output captured."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def cli_ok(*args) -> subprocess.CompletedProcess:
    """run_cli that must exit 0 (its output is the assertion message)."""
    r = run_cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r
