"""`hg-dagger run --operator synthetic --rounds N`: human-gated DAgger unattended. Killed with SIGKILL while a
round trains, then resumed: every round runs once, trains only on the episodes of finished rounds, records
the round in every episode, and reports each round (line, ETA, curve.png). Real subprocesses, a real store."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml
from support.cli import cli_process, loss_iterations

from hg_dagger.cli import main
from hg_dagger.learn.progress import read_metrics
from hg_dagger.policy.checkpoint import read_checkpoint
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

AUTO = {  # the student and training of the rounds; long enough training that the kill lands inside round 1's
    "kind": "auto", "task": "toy_reach", "student": {"ensemble": 3, "hidden": [32, 32]},
    "train": {"steps": 1500, "batch_size": 32, "log_every": 10},
    "eval": {"episodes": 4, "num_envs": 4},  # at the task time budget, where the gated sessions cut
    "promotion": {"episodes": 8, "num_envs": 4},
}
ROUNDS = ["run", "--task", "toy_reach", "--operator", "synthetic", "--certify", "--episodes", "4", "--seed", "3",
          "--rounds", "3", "--quiet"]


@pytest.mark.timeout(1800)  # three CLI processes with torch start-up each; generous for a loaded 2-core machine
def test_rounds_killed_mid_training_then_resumed_run_every_round_once(tmp_path):
    auto = tmp_path / "auto.yaml"
    auto.write_text(yaml.safe_dump(AUTO))
    out = tmp_path / "rounds"
    args = [*ROUNDS, "--auto-config", str(auto), "--out", str(out)]
    proc = cli_process(args)
    try:
        deadline = time.monotonic() + 600
        # round 1 (the first gated one) is training: its episodes are committed, its checkpoint is not written
        while 2 not in loss_iterations(out / "loss.jsonl"):  # round 1's training logs iteration 2
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the run never reached round 1's training"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done = [r["iteration"] for r in read_metrics(out / "metrics.jsonl")]
    assert done and done == list(range(len(done))) and len(done) < 3  # round 0 (demonstrations) at least
    killed = len(done)  # 1, unless a loaded machine let round 1 finish before the signal landed

    resumed = cli_process([*args, "--resume"])
    stdout, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3  # no round reported twice
    reported = [ln for ln in stdout.splitlines() if ln.startswith("round ")]
    assert [ln.split(" | ")[0] for ln in reported] == [f"round {i + 1}/3" for i in range(killed, 3)]
    assert all("ETA" in ln for ln in reported[:-1]) and reported[-1].endswith("done")
    assert all("intervention" in ln for ln in reported)
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stdout.strip().splitlines()[-1].startswith(f"{out}: rounds {killed}..2 done")

    # round 0 collected demonstrations; rounds 1-2 are gated, with what a person would have spent on them
    assert rows[0]["beta"] == 1.0 and rows[0]["expert_used_rate"] == 1.0
    for r in rows[1:]:
        assert r["mode"] == "human_gated" and r["beta"] == 0.0
        assert r["windows"] >= 1 and r["context_switches"] >= 1 and r["operator_s"] > 0
        assert 0 < r["intervention_rate"] < 1
        assert r["replay"]["labels"] > 0
    assert rows[2]["replay"]["labels"] > rows[1]["replay"]["labels"] > rows[0]["replay"]["labels"]

    ckpt = read_checkpoint(out / "checkpoint.pt")["extra"]["train"]
    assert int(ckpt["iteration"]) == 3
    store = EpisodeStore.open(out / "store")
    infos = {i.episode_id: i for i in store.episodes()}
    replay_ids = {eid for eid, _ in ckpt["replay"]["episodes"]}
    per_round: dict[int, set[str]] = {}
    for eid in replay_ids:
        assert infos[eid].complete
        per_round.setdefault(infos[eid].start.iteration, set()).add(eid)
    assert sorted(per_round) == [0, 1, 2] and all(len(v) == 4 for v in per_round.values())
    assert {infos[e].start.mode.value for e in per_round[0]} == {"expert_demo"}
    assert {infos[e].start.mode.value for e in per_round[1] | per_round[2]} == {"human_gated"}
    orphans = [e for e, i in infos.items() if i.start.iteration == killed and e not in replay_ids]
    assert len(orphans) == 4, "the killed attempt's episodes stay in the store, out of training"
    # each gated round acted with the student the previous round trained
    assert {infos[e].start.policy_version for e in per_round[2]} == {rows[1]["policy_version"]}
    assert validate_store(store) == []


def test_rounds_start_from_a_student_and_are_gated_from_round_0(tmp_path, capsys):
    """With --student the first round is already gated, and the rounds train on from that student's weights."""
    from hg_dagger.envs import load_mapping
    from hg_dagger.policy import Student

    student = tmp_path / "s.pt"
    Student.create(load_mapping("toy_reach"), ensemble=2, hidden=(16, 16), seed=1).save(student)
    auto = tmp_path / "auto.yaml"
    auto.write_text(yaml.safe_dump({**AUTO, "train": {"steps": 30, "batch_size": 32}}))
    out = tmp_path / "rounds"
    assert main(["run", "--task", "toy_reach", "--operator", "synthetic", "--certify", "--episodes", "2",
                 "--rounds", "1", "--quiet", "--student", str(student), "--auto-config", str(auto),
                 "--out", str(out), "--store", str(tmp_path / "store")]) == 0
    assert "round 1/1" in capsys.readouterr().out
    infos = EpisodeStore.open(tmp_path / "store").episodes()
    assert {i.start.mode.value for i in infos} == {"human_gated"}
    assert {i.start.policy_version for i in infos} == {Student.load(student, load_mapping("toy_reach")).version}
    assert not (out / "store").exists()


@pytest.mark.parametrize("extra,message", [
    ([], "must be certified: pass --certify"),
    (["--certify", "--operator", "device", "--num-envs", "1"], "unattended"),
    (["--certify", "--rounds", "0"], "--rounds 0"),
])
def test_rounds_refusals_are_one_line_and_write_nothing(tmp_path, capsys, extra, message):
    out = tmp_path / "rounds"
    argv = ["run", "--task", "toy_reach", "--operator", "synthetic", "--rounds", "2", "--out", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("argv,message", [
    (["--out", "x"], "--out is for --rounds"),
    (["--resume"], "--resume is for --rounds"),
    (["--rounds", "2", "--certify"], "--rounds needs --out"),
    ([], "run needs --store"),
])
def test_round_options_need_each_other(argv, message, capsys):
    assert main(["run", "--task", "toy_reach", "--operator", "synthetic", *argv]) == 2
    assert message in capsys.readouterr().err


def test_auto_gated_section_changes_the_tasks_run_config_key_by_key(tmp_path):
    from hg_dagger.control.run_config import load_run_config
    from hg_dagger.errors import ConfigError
    from hg_dagger.learn.auto import load_config

    path = tmp_path / "gated.yaml"
    path.write_text(yaml.safe_dump({"kind": "auto", "task": "toy_reach", "mode": "human_gated",
                                    "gated": {"num_envs": 2, "operator": {"noise_std": 0.0,
                                                                          "certification": "planner_auto"}}}))
    cfg = load_config(path)
    run = load_run_config(None, "toy_reach")  # configs/run/toy_reach.yaml
    assert cfg.gated.num_envs == 2 and cfg.gated.operator.noise_std == 0.0
    assert cfg.gated.operator.certification == "planner_auto"
    assert cfg.gated.operator.return_after_steps == run.operator.return_after_steps  # kept from the run config
    assert cfg.gated.handover == run.handover and cfg.gated.safety == run.safety
    assert cfg.beta_at(0) == 1.0 and cfg.beta_at(1) == 0.0  # demonstrations, then the student drives
    assert cfg.gated_round(2).iteration == 2 and cfg.gated_round(2).episodes == cfg.episodes_per_iteration
    path.write_text(yaml.safe_dump({"kind": "auto", "task": "toy_reach", "mode": "human_gated",
                                    "gated": {"operator": {"type": "device"}, "num_envs": 1}}))
    with pytest.raises(ConfigError, match="unattended"):
        load_config(path)


def test_a_kill_between_checkpoint_and_metrics_line_loses_no_point_of_the_curve(tmp_path, capsys):
    auto = tmp_path / "auto.yaml"
    auto.write_text(yaml.safe_dump({**AUTO, "train": {"steps": 30, "batch_size": 32}}))
    out = tmp_path / "rounds"
    args = ["run", "--task", "toy_reach", "--operator", "synthetic", "--certify", "--episodes", "2", "--quiet",
            "--auto-config", str(auto), "--out", str(out)]
    assert main([*args, "--rounds", "1"]) == 0
    metrics = out / "metrics.jsonl"
    line = metrics.read_text()
    metrics.write_text(line[: len(line) // 2])  # the kill landed while the line was being written
    assert main([*args, "--rounds", "2", "--resume"]) == 0
    capsys.readouterr()
    rows = read_metrics(metrics)
    assert [r["iteration"] for r in rows] == [0, 1]
    assert json.dumps(rows[0], default=str) == line.strip()  # the very line the checkpoint carried
