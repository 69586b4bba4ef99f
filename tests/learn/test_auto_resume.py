"""`hg-dagger auto` killed with SIGKILL in the middle of a round, then resumed: it finishes every iteration
once, trains only on episodes of finished iterations, and reports each round (line, ETA, curve.png).
Real subprocesses, real SIGKILL, a real store."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml
from support.cli import cli_process, loss_iterations

from hg_dagger.learn.progress import RoundReporter, read_metrics, write_curve_png
from hg_dagger.policy.checkpoint import read_checkpoint
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

CONFIG = {
    "kind": "auto", "task": "toy_reach", "mode": "dagger_sync", "certification": "planner_auto", "num_envs": 4,
    "seed": 5, "iterations": 3, "episodes_per_iteration": 4, "max_episode_steps": 25,
    "student": {"ensemble": 3, "hidden": [32, 32]},
    # long enough rounds that the kill lands inside training of the second round (steps are logged every 10)
    "train": {"steps": 1500, "batch_size": 32, "log_every": 10},
    "eval": {"episodes": 4, "num_envs": 4, "max_steps": 25},
}


@pytest.mark.timeout(1800)  # three CLI processes with torch start-up each; generous for a loaded 2-core machine
def test_kill_9_mid_round_then_resume_finishes_every_iteration_once(tmp_path):
    cfg = tmp_path / "auto.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "run"
    proc = cli_process(["auto", "--config", str(cfg), "--out", str(out), "--quiet"])
    try:
        deadline = time.monotonic() + 600
        # iteration 1's training is under way (the trainer logs iteration = it + 1): its episodes are in the
        # store, its checkpoint is not written yet
        while 2 not in loss_iterations(out / "loss.jsonl"):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the run never reached iteration 1's training"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    before = read_metrics(out / "metrics.jsonl")
    done = [r["iteration"] for r in before]
    assert done and done == list(range(len(done))) and len(done) < 3
    killed_round = len(done)
    first = read_checkpoint(out / "checkpoint.pt")["extra"]["train"]
    assert int(first["iteration"]) == killed_round

    # a fresh run must not overwrite the interrupted one
    again = cli_process(["auto", "--config", str(cfg), "--out", str(out), "--quiet"])
    _, err = again.communicate(timeout=600)
    assert again.returncode != 0 and "--resume" in err and "Traceback" not in err

    resumed = cli_process(["auto", "--config", str(cfg), "--out", str(out), "--resume", "--quiet"])
    stdout, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr[-2000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # no iteration reported twice
    # the resumed process reports exactly the rounds it ran, with progress and an ETA until the last one
    rounds = [ln for ln in stdout.splitlines() if ln.startswith("round ")]
    assert [ln.split(" | ")[0] for ln in rounds] == [f"round {i + 1}/3" for i in range(killed_round, 3)]
    assert all("ETA" in ln for ln in rounds[:-1]) and rounds[-1].endswith("done")
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ckpt = read_checkpoint(out / "checkpoint.pt")["extra"]["train"]
    assert int(ckpt["iteration"]) == 3
    store = EpisodeStore.open(out / "store")
    infos = {i.episode_id: i for i in store.episodes()}
    replay_ids = {eid for eid, _ in ckpt["replay"]["episodes"]}
    per_iteration = {}
    for eid in replay_ids:
        assert infos[eid].complete
        per_iteration.setdefault(infos[eid].start.iteration, set()).add(eid)
    # every iteration contributes its own episodes_per_iteration episodes, the killed attempt's none
    assert sorted(per_iteration) == [0, 1, 2]
    assert all(len(v) == 4 for v in per_iteration.values())
    orphans = [e for e, i in infos.items() if i.start.iteration == killed_round and e not in replay_ids]
    assert orphans, "the killed round's episodes stay in the store"
    assert validate_store(store) == []


def test_round_reporter_line_eta_and_curve(tmp_path):
    rows = [{"iteration": i, "mode": "dagger_sync", "beta": 0.5**i, "replay": {"labels": 100 * (i + 1)},
             "eval_success_rate": 0.2 * i, "collect_success_rate": 0.5, "expert_used_rate": 0.5**i,
             "train": {"loss_last": 0.01}} for i in range(3)]
    path = tmp_path / "metrics.jsonl"
    seen = []
    rep = RoundReporter(tmp_path, 5, write=seen.append)
    for row in rows:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        rep(row)
    assert [s.split(" | ")[0] for s in seen] == ["round 1/5", "round 2/5", "round 3/5"]
    assert "labels 300" in seen[-1] and "eval success 40.0%" in seen[-1] and "ETA" in seen[-1]
    assert (tmp_path / "curve.png").stat().st_size > 1000
    # a line cut by a kill is skipped; a repeated iteration keeps its last row
    with open(path, "a") as f:
        f.write(json.dumps({**rows[2], "eval_success_rate": 0.9}) + "\n" + '{"iteration": 3, "ev')
    got = read_metrics(path)
    assert [r["iteration"] for r in got] == [0, 1, 2] and got[-1]["eval_success_rate"] == 0.9
    assert rep.line(rows[2] | {"iteration": 4}, 10.0).endswith("done")
    assert write_curve_png(tmp_path / "none.jsonl", tmp_path / "x.png") is None
    # why a round helped or did not: the expert's recoveries of the student's failures, the labels by planner phase
    line = rep.line(rows[2] | {"recoverability": {"probed": 4, "recovered": 3},
                               "label_phases": {"approach": 30, "descend": 10}}, 10.0)
    assert "expert recovers 3/4 failures" in line and "labels by phase approach 75%, descend 25%" in line
    assert "recovers" not in rep.line(rows[2] | {"recoverability": {"probed": 0, "recovered": 0}}, 10.0)


def test_merged_worker_stats_add_up_label_phases():
    from hg_dagger.learn.collect import CollectStats
    from hg_dagger.learn.executor_worker import merge_stats

    a, b = CollectStats(steps=3), CollectStats(steps=2)
    a.label_phases.update(["approach", "approach", "grasp"])
    b.label_phases.update(["approach", "lift"])
    merged = merge_stats([a, b])
    assert merged.steps == 5 and merged.summary()["label_phases"] == {"approach": 3, "grasp": 1, "lift": 1}


@pytest.mark.parametrize("seconds,text", [(5, "5s"), (65, "1m05s"), (3725, "1h02m")])
def test_durations(seconds, text):
    from hg_dagger.learn.progress import _duration

    assert _duration(seconds) == text
