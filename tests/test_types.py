"""The type checker passes: mypy with pyproject.toml's [tool.mypy] (strict on hg_dagger.contract and
hg_dagger.store; see docs/architecture.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess]

REPO = Path(__file__).resolve().parent.parent


def _mypy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYPY")}
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


def test_contract_and_store_type_check_strictly(tmp_path):
    checked = _mypy(tmp_path)
    assert checked.returncode == 0, checked.stdout[-6000:] + checked.stderr[-2000:]
    assert "Success: no issues found" in checked.stdout


def test_the_check_is_strict(tmp_path):
    # the same configuration refuses an unannotated function
    probe = tmp_path / "probe.py"
    probe.write_text("def untyped(x):\n    return x\n")
    broken = _mypy(tmp_path, "--config-file", str(REPO / "pyproject.toml"), str(probe))
    assert broken.returncode != 0
    assert "probe.py:1: error: Function is missing a type annotation" in broken.stdout
