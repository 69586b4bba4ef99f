"""`hg-dagger run` end to end in real subprocesses: record with the synthetic operator, then
`hg-dagger validate` the store (the store developer's command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hg_dagger.learn.budget import task_budget
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _windows(path):
    store = EpisodeStore.open(str(path))
    return store, sum(len(store.labels(e.episode_id).windows) for e in store.episodes())


def test_run_toy_reach_with_a_gate_file_then_validate(tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("kind: gates\nname: eager\ntask: toy_reach\ngates:\n"
                     "  - {type: confidence, trigger: 1.0e-9, debounce_ticks: 1}\n")
    store = tmp_path / "store"
    r = _cli("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "3", "--num-envs", "2",
             "--store", str(store), "--gates", str(gates), "--calibrate-steps", "0", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["episodes"] == 3 and summary["windows"] >= 3
    v = _cli("validate", str(store))
    assert v.returncode == 0, v.stdout + v.stderr
    st, n_windows = _windows(store)
    assert n_windows == summary["windows"]
    infos = st.episodes()
    assert {i.start.gate_config["name"] for i in infos} == {"eager"}
    assert sorted(i.start.initial_state["seed"] for i in infos) == [0, 1, 2]


@pytest.mark.slow
def test_run_fetch_pick_place_synthetic_operator_then_validate(tmp_path):
    store = tmp_path / "store"
    r = _cli("run", "--task", "fetch_pick_place", "--operator", "synthetic", "--episodes", "1",
             "--store", str(store), "--calibrate-steps", "0", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["episodes"] == 1 and summary["windows"] >= 1  # the fresh student stalls; the planner corrects
    v = _cli("validate", str(store))
    assert v.returncode == 0, v.stdout + v.stderr
    st, _ = _windows(store)
    (info,) = st.episodes()
    assert info.start.gate_config["task"] == "fetch_pick_place"
    assert info.end.num_steps == task_budget("fetch_pick_place")  # the task's time budget cuts the episode


def test_bad_run_options_print_one_error_without_traceback(tmp_path):
    r = _cli("run", "--task", "toy_reach", "--store", str(tmp_path / "s"), "--operator", "device", "--num-envs", "2")
    assert r.returncode == 2
    assert "num_envs 1" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", "--task", "toy_reach", "--store", str(tmp_path / "s"), "--gates", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "nope.yaml" in r.stderr and "Traceback" not in r.stderr
