"""`hg-dagger` on a Gymnasium env named in a task file of the user's (Pusher-v5, given as a path), in subprocesses:
`run` headless with the synthetic operator driven by a policy expert (Pusher has no planner), `replay` of what it
recorded (MuJoCo is deterministic from the seed), `eval`, and `auto` labelled by the policy expert; and an unknown
Gymnasium id or a discrete action space is one line naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hg_dagger.envs import load_mapping
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation, pytest.mark.slow]


def _cli(*args, cwd: Path):
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=dict(os.environ))


def _ok(r) -> str:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


@pytest.fixture(scope="module")
def pusher(tmp_path_factory):
    """A user's folder: pusher.yaml (Gymnasium's Pusher-v5, horizon 60) and a student checkpoint for it, the
    policy expert."""
    base = tmp_path_factory.mktemp("pusher")
    data = yaml.safe_load((TASKS_DIR / "gym_pusher.yaml").read_text())
    data.update(task_id="pusher", horizon=60)
    task = base / "pusher.yaml"
    task.write_text(yaml.safe_dump(data, sort_keys=False))
    Student.create(load_mapping(task), seed=0, ensemble=2).save(base / "expert.pt")
    return base, task


def test_run_replay_eval_and_auto_on_a_users_pusher_task_file(pusher):
    base, task = pusher
    (base / "run.yaml").write_text(yaml.safe_dump({
        "kind": "run", "task": str(task), "num_envs": 2, "episodes": 2, "seed": 3,
        "expert_checkpoint": str(base / "expert.pt"), "operator": {"type": "synthetic", "return_after_steps": 10},
        "gates": {"name": "pusher_stall", "grace_after_reset_s": 0.2,
                  "gates": [{"type": "progress_stall", "warn": 0.5, "trigger": 1.0, "min_delta": 0.01}]}}))
    out = _ok(_cli("run", "--task", task, "--config", base / "run.yaml", "--store", base / "store", "--quiet",
                   "--json", cwd=base))
    summary = json.loads(out[out.index("{"):])
    assert summary["episodes"] == 2 and summary["windows"] >= 1 and summary["human_steps"] > 0
    infos = EpisodeStore.open(base / "store").episodes()
    assert {i.start.task.task_id for i in infos} == {"pusher"}
    assert {i.start.versions.robot.split(" model")[0] for i in infos} == {"Pusher-v5 (PusherEnv)"}

    # the task file is not shipped: replay re-runs the mapping each episode recorded, from its seed
    replayed = json.loads(_ok(_cli("replay", base / "store", "--quiet", "--json", cwd=base)))
    assert [r["status"] for r in replayed["results"]] == ["replayable", "replayable"], replayed["results"]

    _ok(_cli("eval", "--checkpoint", base / "expert.pt", "--task", task, "--out", base / "eval", "--episodes", 2,
             "--num-envs", 2, "--max-steps", 20, "--quiet", cwd=base))
    closed = json.loads((base / "eval" / "eval.json").read_text())["closed_loop"]
    assert closed["episodes"] == 2 and closed["episode_length_mean"] == 20

    (base / "auto.yaml").write_text(yaml.safe_dump({
        "kind": "auto", "task": str(task), "mode": "dagger_sync", "certification": "planner_auto",
        "expert": {"kind": "policy", "checkpoint": str(base / "expert.pt")}, "num_envs": 2, "iterations": 1,
        "episodes_per_iteration": 2, "max_episode_steps": 20, "student": {"kind": "mlp", "ensemble": 2,
                                                                         "hidden": [32, 32]},
        "train": {"steps": 20, "batch_size": 32}, "eval": {"episodes": 2, "num_envs": 2, "max_steps": 20}}))
    _ok(_cli("auto", "--config", base / "auto.yaml", "--out", base / "auto", "--quiet", cwd=base))
    rounds = [json.loads(line) for line in (base / "auto" / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 1 and rounds[0]["expert_used_rate"] == 1.0  # beta 1: every step the expert's
    assert rounds[0]["replay"]["labels"] == 40 and rounds[0]["train"]["labels"] == 40  # 2 episodes x 20 steps
    assert rounds[0]["dataset"]  # a dataset version named by the task id, not the task file's path
    assert (base / "auto" / "checkpoint.pt").is_file()


@pytest.mark.parametrize(("gym_id", "words"), [
    ("Pusherr-v5", ["'Pusherr-v5' is not a registered Gymnasium id"]),
    ("MountainCar-v0", ["MountainCar-v0 has action space Discrete(3)", "Box action space"]),
])
def test_an_unknown_id_or_a_discrete_action_space_is_one_line(pusher, gym_id, words):
    base, task = pusher
    bad = base / f"bad_{gym_id}.yaml"
    bad.write_text(task.read_text().replace("gym_id: Pusher-v5", f"gym_id: {gym_id}"))
    r = _cli("run", "--task", bad, "--store", base / "never", "--episodes", 1, cwd=base)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"error: {bad}: ") and all(w in lines[0] for w in words), lines[0]
    assert not (base / "never").exists()
