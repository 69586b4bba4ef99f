"""Corrupt and truncated student checkpoints: one line naming the file, from the library and through the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.policy import Student, load_student

pytestmark = [pytest.mark.subprocess]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "student.pt"
    Student.create(load_mapping("toy_reach"), ensemble=2, hidden=(16,)).save(path)
    return path


def _damaged(good, tmp_path, how: str):
    data = good.read_bytes()
    path = tmp_path / f"{how.replace(' ', '_')}.pt"
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random bytes":
        path.write_bytes(bytes(range(256)) * 8)
    else:
        payload = torch.load(good, weights_only=True)
        if how == "no spec":
            del payload["spec"]
        elif how == "spec unusable":
            payload["spec"]["hidden"] = "wide"
        elif how == "weights missing":
            payload["state_dict"] = {}
        elif how == "mapping lacks hash":
            payload["mapping"] = {"task_id": "toy_reach"}
        torch.save(payload, path)
    return path


CASES = ["truncated", "empty", "random bytes", "no spec", "spec unusable", "weights missing", "mapping lacks hash"]


@pytest.mark.parametrize("how", CASES)
def test_a_damaged_checkpoint_is_one_line_naming_the_file(good, tmp_path, how):
    path = _damaged(good, tmp_path, how)
    with pytest.raises(HgDaggerError) as err:
        load_student(path, load_mapping("toy_reach"))
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 600
    assert load_student(good, load_mapping("toy_reach")).version  # the intact file still loads


def test_the_cli_reports_a_truncated_checkpoint_without_a_traceback(good, tmp_path):
    path = _damaged(good, tmp_path, "truncated")
    for args in (["eval", "--checkpoint", str(path), "--task", "toy_reach", "--out", str(tmp_path / "ev"),
                  "--episodes", "1", "--num-envs", "1", "--quiet"],
                 ["run", "--task", "toy_reach", "--store", str(tmp_path / "store"), "--student", str(path),
                  "--episodes", "1", "--quiet"]):
        proc = subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert errors == [f"error: {path}: not a readable student checkpoint, truncated or corrupt "
                          f"({errors[0].rsplit('(', 1)[-1]}"], proc.stderr
    assert not (tmp_path / "store").exists()  # refused before a store was made


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path / 'none.pt'}: no such checkpoint file"):
        load_student(tmp_path / "none.pt", load_mapping("toy_reach"))
