"""The CLI in a real subprocess (for kills and resumes), and what a run's loss.jsonl says so far."""

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
