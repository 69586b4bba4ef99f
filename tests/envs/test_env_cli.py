"""`hg-dagger check-env` passes for every shipped task and fails clearly on a mismatch; `hg-dagger tasks`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from hg_dagger.cli import main
from hg_dagger.envs import known_tasks
from hg_dagger.envs.mapping import TASKS_DIR

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


@pytest.mark.parametrize("task", known_tasks())
def test_check_env_passes_for_every_shipped_task(task, capsys):
    assert main(["check-env", task, "--num-envs", "1", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert f"check-env {task}: passed" in out and "mapping hash" in out and "auto-reset" in out
    assert "operator view renders" in out  # every shipped task has a picture for the operator


def test_tasks_lists_every_task(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert all(t in out for t in known_tasks())


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True, env=env, timeout=120)


def test_mismatched_mapping_fails_clearly_without_traceback(tmp_path):
    data = yaml.safe_load((TASKS_DIR / "fetch_reach.yaml").read_text())
    data["observation"][0]["shape"] = [25]  # FetchReach's state is 10-d
    data["export"]["names"]["observation"] = [f"s{i}" for i in range(25)]  # the mapping itself stays consistent
    path = tmp_path / "fetch_reach_wrong.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = _cli("check-env", str(path))
    assert proc.returncode == 2
    assert str(path) in proc.stderr
    assert "observation 'observation' is [10] in the simulator" in proc.stderr and "[25]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_task_fails_listing_known_ones():
    proc = _cli("check-env", "fetch_pik_place")
    assert proc.returncode == 2 and "fetch_pick_place" in proc.stderr and "Traceback" not in proc.stderr
