"""`hg-dagger eval`: the student alone in closed loop (never an expert or a person), fixed seeds, reports;
offline action prediction on held-out episodes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from support.auto import collect_toy

from hg_dagger.contract import LabelMask
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.experts import make_expert
from hg_dagger.learn.evaluate import EvalConfig, closed_loop, evaluate
from hg_dagger.learn.train import StudentConfig, TrainConfig, train_from_store
from hg_dagger.policy import Student

pytestmark = [pytest.mark.subprocess]


def expert_store(path, episodes=8):
    return collect_toy(path, episodes=episodes, certify=True)[0]


def checkpoint(tmp_path):
    """A student checkpoint; evaluation never needs a good one to show what it does."""
    path = tmp_path / "student.pt"
    Student.create(load_mapping("toy_reach"), ensemble=3, hidden=(32, 32), seed=4).save(path)
    return path


def test_closed_loop_actions_all_come_from_the_student(tmp_path):
    ckpt = checkpoint(tmp_path)
    mapping = load_mapping("toy_reach")
    student = Student.load(ckpt, mapping)
    trace = []
    with make_env(mapping, num_envs=3, seed=5) as env:
        res = closed_loop(student, env, EvalConfig(episodes=5, num_envs=3, seed=5, max_steps=30), trace=trace)
    assert res["episodes"] == 5 and len(trace) >= 30
    fresh = Student.load(ckpt, mapping)  # an independent copy answers every observed state identically
    for obs, action in trace:
        np.testing.assert_array_equal(action, mapping.clip_raw(fresh.act(obs).action))
    for ep in res["per_episode"]:
        assert 1 <= ep["length"] <= 30
        if ep["success"]:
            assert ep["first_failure_step"] is None
        else:
            assert 1 <= ep["first_failure_step"] <= ep["length"]


def test_eval_cli_imports_no_expert_device_or_gate_and_writes_reports(tmp_path):
    ckpt = checkpoint(tmp_path)
    out = tmp_path / "eval"
    code = (
        "import sys; from hg_dagger.cli import main; "
        f"rc = main(['eval', '--checkpoint', {str(ckpt)!r}, '--task', 'toy_reach', '--out', {str(out)!r}, "
        "'--episodes', '6', '--num-envs', '3', '--max-steps', '30', '--seed', '11', '--quiet']); "
        "bad = [m for m in ('hg_dagger.experts', 'hg_dagger.devices', 'hg_dagger.control.operators', "
            "'hg_dagger.control.session', 'hg_dagger.control.run_config') if m in sys.modules]; "
        "print('loaded:', bad); sys.exit(rc or (3 if bad else 0))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "loaded: []" in res.stdout and "success" in res.stdout
    report = json.loads((out / "eval.json").read_text())
    cl = report["closed_loop"]
    assert cl["episodes"] == 6 and 0.0 <= cl["success_rate"] <= 1.0
    assert set(cl) >= {"episode_length_mean", "first_failure_step_mean", "buckets", "per_episode"}
    assert sum(b["episodes"] for b in cl["buckets"].values()) == 6
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fixed_seeds_give_identical_evaluations(tmp_path):
    ckpt = checkpoint(tmp_path)
    cfg = EvalConfig(episodes=6, num_envs=3, seed=21, max_steps=30)
    a = evaluate(ckpt, "toy_reach", tmp_path / "a", config=cfg, progress=False)["closed_loop"]
    b = evaluate(ckpt, "toy_reach", tmp_path / "b", config=cfg, progress=False)["closed_loop"]
    assert a["per_episode"] == b["per_episode"]
    c = evaluate(ckpt, "toy_reach", tmp_path / "c", config=cfg.model_copy(update={"seed": 22}),
                 progress=False)["closed_loop"]
    assert [e["initial_progress"] for e in c["per_episode"]] != [e["initial_progress"] for e in a["per_episode"]]


def test_offline_error_uses_only_held_out_episodes(tmp_path):
    from hg_dagger.learn.aggregate import LabelBufferConfig, held_out
    from hg_dagger.policy import read_checkpoint

    store = expert_store(tmp_path / "s", episodes=12)
    r = train_from_store(str(tmp_path / "s"), "toy_reach", tmp_path / "t",
                         student_cfg=StudentConfig(ensemble=2, hidden=(32,)),
                         train_cfg=TrainConfig(steps=100, batch_size=64),
                         replay_cfg=LabelBufferConfig(holdout_fraction=0.4), progress=False)
    infos = store.episodes()
    held = {i.episode_id for i in infos if held_out(i.episode_id, i.start.split, 0.4)}
    assert 0 < len(held) < len(infos)
    trained_ids = {e for e, _ in read_checkpoint(r["checkpoint"])["extra"]["train"]["replay"]["episodes"]}
    assert trained_ids.isdisjoint(held) and trained_ids | held == {i.episode_id for i in infos}
    res = evaluate(r["checkpoint"], "toy_reach", tmp_path / "e", store_url=str(tmp_path / "s"),
                   holdout_fraction=0.4, config=EvalConfig(episodes=2, num_envs=2, max_steps=10), progress=False)
    off = res["offline"]
    expected = sum(int((store.labels(e).mask == LabelMask.TRAINABLE.code).sum()) for e in held)
    assert off["episodes"] == len(held) and off["labels"] == expected and off["skipped_trained"] == 0
    assert off["segments"] >= len(held)
    # the figure is the student's policy-space error on exactly those labels, recomputed here from the store
    from hg_dagger.store.trainable import load_labels

    mapping = load_mapping("toy_reach")
    student = Student.load(r["checkpoint"], mapping)
    errs = []
    for info in (i for i in infos if i.episode_id in held):
        ep = load_labels(store, info, list(mapping.obs_spec()))
        errs.append(np.abs(mapping.raw_to_policy(student.act(ep.obs).action) - mapping.raw_to_policy(ep.target)))
    assert off["mae"] == pytest.approx(float(np.concatenate(errs).mean()), rel=1e-5)


def test_offline_never_scores_episodes_the_checkpoint_trained_on(tmp_path):
    expert_store(tmp_path / "s", episodes=6)
    r = train_from_store(str(tmp_path / "s"), "toy_reach", tmp_path / "t",
                         student_cfg=StudentConfig(ensemble=2, hidden=(16,)),
                         train_cfg=TrainConfig(steps=10, batch_size=32), progress=False)
    # asking for a (near-total) hold-out after training on everything: nothing is left to score honestly
    res = evaluate(r["checkpoint"], "toy_reach", tmp_path / "e", store_url=str(tmp_path / "s"),
                   holdout_fraction=0.99, config=EvalConfig(episodes=2, num_envs=2, max_steps=10), progress=False)
    assert res["offline"]["episodes"] == 0 and res["offline"]["skipped_trained"] > 0


def test_recoverability_probes_failed_episodes_from_the_students_first_failure_step():
    """The expert takes over each failed evaluation episode at the student's first-failure step (at the latest half
    way through the horizon); an untrained student's failures on toy_reach are ones the planner still completes."""
    from hg_dagger.learn.evaluate import recoverability

    mapping = load_mapping("toy_reach")
    student = Student.create(mapping, ensemble=3, hidden=(32, 32), seed=4)
    with make_env(mapping, num_envs=4, seed=0) as env:
        ev = closed_loop(student, env, EvalConfig(episodes=6, num_envs=4, seed=500, max_steps=60))
        failed = [e for e in ev["per_episode"] if not e["success"]]
        assert len(failed) >= 3, "an untrained student fails most episodes"
        rec = recoverability(student, make_expert("toy_reach", "planner", mapping=mapping), env, ev["per_episode"],
                             max_episodes=3, limit=60)
        none = recoverability(student, make_expert("toy_reach", "planner", mapping=mapping), env,
                              [e for e in ev["per_episode"] if e["success"]], limit=60)
    assert (rec["failed"], rec["probed"]) == (len(failed), 3)
    probed = sorted(failed, key=lambda e: e["index"])[:3]
    assert [p["seed"] for p in rec["per_episode"]] == [e["seed"] for e in probed]
    assert [p["switch_step"] for p in rec["per_episode"]] == [min(e["first_failure_step"], 30) for e in probed]
    assert rec["recovered"] == sum(p["recovered"] for p in rec["per_episode"]) and rec["recovered"] > 0
    assert rec["rate"] == rec["recovered"] / 3
    assert none == {"failed": 0, "probed": 0, "recovered": 0, "rate": None, "per_episode": []}
