"""`hg-dagger run --robot`: a human-gated run against a real `hg-dagger bridge serve` subprocess on loopback.

The run records robot stamps mapped onto our clock, the clock-mapping error and the transport time per step;
the robot really stepped every recorded step; a wrong token, another task or a token in the config is refused
with one readable error."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from support.bridge import TOKEN, Robot

from hg_dagger.cli import main
from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.envs.bridge import BridgeEnv
from hg_dagger.envs.mapping import load_mapping
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


@pytest.fixture
def robot(tmp_path):
    """A robot-side bridge server for toy_reach; yields (port, token file, robot log)."""
    # heartbeat timeout well above any scheduling hiccup on a busy machine: this test is not about safe stops
    r = Robot(tmp_path, heartbeat=5.0)
    yield r.port, r.token_file, r.log_path
    r.stop()


def _run_args(port, token, store, *extra):
    return ["run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "2", "--robot", f"127.0.0.1:{port}",
            "--token-file", str(token), "--store", str(store), "--calibrate-steps", "0", "--quiet", *extra]


def _small_student(tmp_path) -> str:
    """A small student checkpoint for toy_reach: the run's cost is then the bridge, not the forward pass."""
    path = tmp_path / "student.pt"
    Student.create(load_mapping("toy_reach"), seed=0, ensemble=3, hidden=(32, 32)).save(path)
    return str(path)


def test_run_on_robot_records_robot_timing(tmp_path, robot, capsys):
    port, token, _ = robot
    store_path = tmp_path / "store"
    student = _small_student(tmp_path)
    t_start = now_ns()
    assert main(_run_args(port, token, store_path, "--student", student)) == 0
    t_end = now_ns()
    assert "2 episodes" in capsys.readouterr().out

    store = EpisodeStore.open(str(store_path))
    assert validate_store(store) == []
    infos = store.episodes()
    assert len(infos) == 2
    recorded = 0
    for info in infos:
        assert info.start.extra["robot_bridge"]["endpoint"] == f"127.0.0.1:{port}"
        steps = store.read_steps(info.episode_id, ["t_obs", "t_action_apply", "transport_ns", "alignment_error_ms"])
        n = info.end.num_steps
        assert n > 0 and all(len(v) == n for v in steps.values())
        recorded += n
        err_ns = (steps["alignment_error_ms"].astype(np.float64) * 1e6).astype(np.int64)
        assert np.isfinite(steps["alignment_error_ms"]).all() and (steps["alignment_error_ms"] >= 0).all()
        assert (steps["transport_ns"] > 0).all()
        # the robot's stamps, mapped onto our clock, fall inside the run as we saw it
        for key in ("t_obs", "t_action_apply"):
            t = steps[key]
            assert (t != NO_TIME).all(), key
            assert (t >= t_start - err_ns).all() and (t <= t_end + err_ns).all(), key
        # each action is applied after the observation it answers was sampled
        assert (steps["t_action_apply"] >= steps["t_obs"] - 2 * err_ns).all()

    # every recorded step was stepped on the robot, and nothing else was
    env = BridgeEnv("toy_reach", port=port, token=TOKEN, heartbeat=False)
    try:
        assert env.status()["steps"] == recorded
    finally:
        env.close()


def test_wrong_token_is_refused_without_traceback(tmp_path, robot):
    port, _, robot_log = robot
    bad = tmp_path / "wrong.token"
    bad.write_text("not-the-token\n")
    store_path = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-m", "hg_dagger", *_run_args(port, bad, store_path)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 2, proc.stderr
    assert f"robot bridge 127.0.0.1:{port} refused the handshake: auth" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not store_path.exists()  # nothing was recorded, not even an empty store
    deadline = time.monotonic() + 5
    while "refused auth" not in robot_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "refused auth" in robot_log.read_text()


def test_robot_serving_another_task_is_refused(tmp_path, robot, capsys):
    port, token, _ = robot
    args = _run_args(port, token, tmp_path / "store")
    args[args.index("toy_reach")] = "fetch_reach"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "serves task 'toy_reach', not 'fetch_reach'" in err
    assert not (tmp_path / "store").exists()


def test_token_env_variable_and_config_robot_section(tmp_path, robot, monkeypatch, capsys):
    port, _, _ = robot
    config = tmp_path / "robot_run.yaml"
    config.write_text(yaml.safe_dump({"kind": "run", "task": "toy_reach", "episodes": 1, "calibrate_steps": 0,
                                      "robot": {"host": "127.0.0.1", "port": port}}))
    monkeypatch.setenv("HG_DAGGER_BRIDGE_TOKEN", TOKEN)
    store_path = tmp_path / "store"
    assert main(["run", "--task", "toy_reach", "--config", str(config), "--store", str(store_path), "--quiet",
                 "--student", _small_student(tmp_path)]) == 0
    (info,) = EpisodeStore.open(str(store_path)).episodes()
    assert info.start.extra["robot_bridge"]["endpoint"] == f"127.0.0.1:{port}"


def test_robot_options_refused_clearly(tmp_path, capsys):
    config = tmp_path / "secret.yaml"
    config.write_text(yaml.safe_dump({"kind": "run", "task": "toy_reach", "robot": {"port": 7650, "token": "abc"}}))
    cases = [
        (["--config", str(config)], "keep the bridge token out of the config"),
        (["--token-file", str(config)], "--token-file is for a robot run"),
        (["--robot", "localhost"], "expected HOST:PORT"),
        (["--robot", "127.0.0.1:7650", "--num-envs", "2"], "--num-envs does not apply with --robot"),
    ]
    for extra, message in cases:
        assert main(["run", "--task", "toy_reach", "--store", str(tmp_path / "store"), "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
    assert not (tmp_path / "store").exists()
