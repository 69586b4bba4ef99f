"""Malformed configs and bad paths through the real CLI in a subprocess: exit 2 and one `error:` line that names the
file and the key (or the path), never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True, timeout=600)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr
    return errors[0]


CONFIGS = {
    "yaml syntax": (b"kind: gates\nname: g\ngates: [1, 2\n", ["line ", "column ", "not valid YAML"]),
    "wrong type": (b"kind: run\ntask: toy_reach\nepisodes: many\n", ["key episodes:", "valid integer", "'many'"]),
    "unknown key": (b"kind: qc\nbogus_key: 1\n", ["key bogus_key:", "Extra inputs are not permitted"]),
    "binary": (bytes(range(256)), ["not a text file"]),
    "not a mapping": (b"- 1\n- 2\n", ["expected a mapping"]),
    "unknown kind": (b"kind: nonsense\n", ["key kind:", "unknown config kind 'nonsense'", "known kinds:"]),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_config_check_on_a_malformed_file(tmp_path, case):
    content, expected = CONFIGS[case]
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    line = _error_line(_cli("config", "check", str(path)))
    assert line.startswith(f"error: {path}:")
    for text in expected:
        assert text in line


def test_run_with_a_malformed_run_config_names_file_and_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("kind: run\ntask: toy_reach\nhandover: {wait: sometimes}\n")
    line = _error_line(_cli("run", "--task", "toy_reach", "--config", str(path), "--store", str(tmp_path / "s")))
    assert str(path) in line and "key handover.wait:" in line and "'sometimes'" in line
    assert not (tmp_path / "s").exists()


def test_auto_with_a_wrong_type_names_file_and_key(tmp_path):
    path = tmp_path / "auto.yaml"
    path.write_text("kind: auto\ntask: toy_reach\niterations: [1]\n")
    line = _error_line(_cli("auto", "--config", str(path), "--out", str(tmp_path / "out")))
    assert line.startswith(f"error: {path}: key iterations:")


def test_run_with_an_unknown_gate_config_name_fails_before_any_store(tmp_path):
    line = _error_line(_cli("run", "--task", "toy_reach", "--gates", "no_such_gates", "--store", str(tmp_path / "s"),
                            "--episodes", "1", "--quiet"))
    assert "key gates: unknown gate config 'no_such_gates'" in line
    for name in ("default", "toy_reach", "fetch_pick_place"):
        assert name in line
    assert not (tmp_path / "s").exists()


def test_run_into_a_regular_file_and_a_token_into_a_missing_folder(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    line = _error_line(_cli("run", "--task", "toy_reach", "--store", str(f), "--episodes", "1", "--quiet"))
    assert f"--store {f}: is a file, not an episode store" in line and f.read_text() == "keep me"
    token = tmp_path / "missing" / "token"
    line = _error_line(_cli("bridge", "token", str(token)))
    assert line == f"error: {token}: folder {token.parent} does not exist (create it first)"
    assert not token.parent.exists()
