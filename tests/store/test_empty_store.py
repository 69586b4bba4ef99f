"""Every command that reads a store, on a store that holds no episode yet: a clean answer (exit 0 and a summary)
or one `error:` line saying why (exit 2), never a traceback. Real subprocesses of the installed CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
WINDOW = "0123456789abcdef"

# (command, exit status, what its output must say)
COMMANDS = [
    (["validate", "{s}"], 0, "0 episodes (0 incomplete), 0 violation(s)"),
    (["store", "ls", "{s}"], 0, "0 episode(s)"),
    (["store", "info", "{s}", "abc"], 2, "0 episodes match 'abc'"),
    (["store", "validate", "{s}", "--quick"], 0, "0 violation(s)"),
    (["store", "reviewers", "{s}"], 0, "no reviewer roster"),
    (["review", "list", "{s}", "--quiet"], 0, "0 window(s)"),
    (["review", "show", "{s}", WINDOW], 2, f"no correction window '{WINDOW}'"),
    (["review", "approve", "{s}", WINDOW, "--reviewer", "rev-1", "--authorize"], 2, "no correction window"),
    (["review", "reject", "{s}", WINDOW, "--reviewer", "rev-1", "--reason", "x"], 2, "no correction window"),
    (["review", "needs-fix", "{s}", WINDOW, "--reviewer", "rev-1", "--reason", "x"], 2, "no correction window"),
    (["qc", "{s}", "--quiet"], 0, "0 episode"),
    (["replay", "{s}", "--quiet"], 0, "0 episode"),
    (["report", "{s}", "--out", "{o}/report", "--quiet"], 0, "0 episodes, 0 windows"),
    (["train", "--store", "{s}", "--task", "toy_reach", "--out", "{o}/train", "--steps", "5", "--quiet"], 2,
     "no episode of task toy_reach"),
    (["dataset", "build", "ds", "--store", "{s}", "--quiet"], 0, "0 episodes"),
    (["export", "{s}", "--format", "lerobot", "--out", "{o}/lerobot", "--quiet"], 2, "no complete episode to export"),
    (["export", "{s}", "--format", "ods", "--out", "{o}/ods", "--quiet"], 2, "no complete episode to export"),
    (["export", "{s}", "--format", "rlinf", "--out", "{o}/rlinf", "--quiet"], 2, "no complete episode to export"),
]


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    path = tmp_path_factory.mktemp("empty") / "store"
    EpisodeStore.create(path)
    return path


@pytest.mark.parametrize(("argv", "status", "says"), COMMANDS, ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None)
def test_every_command_answers_cleanly_on_an_empty_store(empty, tmp_path, argv, status, says):
    args = [a.format(s=empty, o=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True, timeout=600,
                       env=ENV)
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert r.returncode == status, out
    if status:
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and says in errors[0], out
    else:
        assert says in out, out
