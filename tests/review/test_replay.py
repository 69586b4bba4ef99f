"""Replay verification on stores recorded for real: `hg-dagger run` on toy_reach, MuJoCo Fetch and
Meta-World, expert episodes of `hg-dagger auto`, and a session whose episodes carry the robot bridge's
metadata. Every verdict is written as a label layer that validates; raw data is never touched."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from support.store import fields, record, start

from hg_dagger.cli import main
from hg_dagger.contract.enums import ReplayStatus
from hg_dagger.control.build import build_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import ReplayTolerance
from hg_dagger.errors import ConfigError, StoreError
from hg_dagger.learn.auto import AutoConfig, AutoRun
from hg_dagger.learn.budget import task_budget
from hg_dagger.policy import Student
from hg_dagger.review.replay import replay_episode, replay_store
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.simulation]


def _files(path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()}


def _run(task: str, store, episodes: int, num_envs: int = 2) -> None:
    assert main(["run", "--task", task, "--operator", "synthetic", "--episodes", str(episodes), "--num-envs",
                 str(num_envs), "--calibrate-steps", "0", "--store", str(store), "--quiet"]) == 0


def _perturbation(action: np.ndarray) -> np.ndarray:
    """An offset that moves the first action dim by 0.5 and stays inside [-1, 1] (not undone by clipping)."""
    delta = np.zeros_like(action)
    delta[0] = -0.5 if action[0] > 0 else 0.5
    return delta


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "store"
    _run("toy_reach", path, episodes=4)
    return path


def test_toy_reach_run_replays_and_the_verdicts_become_label_layers(toy_store, tmp_path):
    raw_before = _files(toy_store / "segments")
    store = EpisodeStore.open(toy_store, mode="a")
    infos = store.episodes()
    assert len(infos) == 4 and len({i.start.env_index for i in infos}) == 2  # rows reset with their own seeds
    report = replay_store(store, progress=False)
    assert [r.check.status for r in report.results] == [ReplayStatus.REPLAYABLE] * 4, report.summary()
    for r, info in zip(report.results, infos, strict=True):
        assert r.check.steps_checked == info.num_steps
        assert r.check.checked_with["seed"] == info.start.initial_state["seed"]
        assert r.check.checked_with["mapping_hash"] == info.start.mapping_hash
        assert r.check.checked_with["tolerance"] == load_mapping("toy_reach").replay.model_dump(mode="json")
        assert r.version == 2 and store.labels(r.episode_id).author == "replay"
    again = EpisodeStore.open(toy_store)
    assert all(again.replay_status(i.episode_id) == ReplayStatus.REPLAYABLE for i in infos)
    assert validate_store(again) == []
    assert _files(toy_store / "segments") == raw_before
    assert report.summary().endswith("4 replayable, 0 video_only, 0 replay_mismatch, 0 unverified; 4 label layer(s) written")


def test_a_perturbed_action_is_a_mismatch_at_that_step(toy_store):
    store = EpisodeStore.open(toy_store)
    info = max(store.episodes(), key=lambda i: i.num_steps)
    k = info.num_steps // 2
    action = store.read_steps(info.episode_id, ["applied_action"], steps=[k])["applied_action"][0]
    check = replay_episode(store, info.episode_id, perturb={k: _perturbation(action)})
    assert check.status == ReplayStatus.REPLAY_MISMATCH
    # toy_reach's reward is minus the fingertip distance after the action: step k's own record disagrees
    assert (check.first_divergent_step, check.key, check.steps_checked) == (k, "reward", k)
    assert check.error > 1e-3 and f"step {k}: reward differs" in check.reason
    assert replay_episode(store, info.episode_id, perturb={k: np.zeros_like(action)}).status == ReplayStatus.REPLAYABLE
    loose = replay_episode(store, info.episode_id, perturb={k: _perturbation(action)},
                           tolerance=ReplayTolerance(obs_atol=check.error * 2, keys={"qpos": 0.0}))
    # the reward now passes; the joint angles of step k + 1, held to zero tolerance, do not
    assert (loose.status, loose.first_divergent_step, loose.key) == (ReplayStatus.REPLAY_MISMATCH, k + 1, "obs/qpos")
    assert loose.checked_with["tolerance"]["keys"] == {"qpos": 0.0}


def test_fetch_pick_place_run_replays_and_a_perturbed_copy_does_not(tmp_path, capsys):
    path = tmp_path / "fetch"
    _run("fetch_pick_place", path, episodes=2)
    capsys.readouterr()
    assert main(["replay", str(path), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"replayable": 2, "video_only": 0, "replay_mismatch": 0, "unverified": 0}
    budget = task_budget("fetch_pick_place")  # where the session cuts the episode
    assert all(r["steps_checked"] == budget and r["label_version"] == 2 for r in out["results"])
    assert "mujoco" in out["results"][0]["checked_with"]["packages"]

    # a copy of one episode with one action changed, recorded through a fresh store's recorder
    store = EpisodeStore.open(path)
    info = store.episodes()[0]
    steps = store.read_steps(info.episode_id)
    k = 40
    steps["applied_action"][k] += _perturbation(steps["applied_action"][k])
    copy = EpisodeStore.create(tmp_path / "copy")
    with copy.recorder() as rec:
        eid = rec.begin_episode(info.start.model_copy(update={"episode_id": info.episode_id}), store.fields(info.episode_id))
        for t in range(info.num_steps):
            rec.put(eid, {name: v[t] for name, v in steps.items()})
        rec.end_episode(eid, info.end)
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "copy"), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert f"{eid}  replay_mismatch: step {k + 1}: obs/observation differs by" in captured.out
    assert "1 episode(s) do not replay" in captured.err
    check = EpisodeStore.open(tmp_path / "copy").replay_check(eid)
    # Fetch's sparse reward did not change at step k: the moved gripper shows in the next observation
    assert (check.status, check.first_divergent_step, check.key) == (ReplayStatus.REPLAY_MISMATCH, k + 1, "obs/observation")
    assert validate_store(EpisodeStore.open(tmp_path / "copy")) == []


def test_meta_world_run_replays(tmp_path):
    path = tmp_path / "mw"
    _run("mw_reach", path, episodes=2, num_envs=1)  # the second episode follows the first in the same row
    report = replay_store(path, write=False, progress=False)
    assert [r.check.status for r in report.results] == [ReplayStatus.REPLAYABLE] * 2, report.summary()
    assert all(r.version is None for r in report.results)
    assert EpisodeStore.open(path).label_versions(report.results[0].episode_id) == [1]  # --dry-run writes nothing


def test_auto_expert_episodes_all_record_a_seed_and_replay(tmp_path):
    cfg = AutoConfig.model_validate({
        "task": "toy_reach", "certification": "planner_auto", "num_envs": 2, "seed": 3, "iterations": 1,
        "episodes_per_iteration": 4,
        "max_episode_steps": 25, "student": {"ensemble": 2, "hidden": [16]},
        "train": {"steps": 2, "batch_size": 16, "log_every": 10},
        "eval": {"episodes": 1, "num_envs": 1, "max_steps": 5},
    })
    AutoRun(cfg, tmp_path / "run").run(progress=False)
    report = replay_store(tmp_path / "run" / "store", progress=False)
    by_seed = {r.check.status: [] for r in report.results}
    store = EpisodeStore.open(tmp_path / "run" / "store")
    for r in report.results:
        by_seed[r.check.status].append(store.info(r.episode_id).start.initial_state)
    # episodes begun after the env's own automatic reset start from an explicit seeded reset too
    assert set(by_seed) == {ReplayStatus.REPLAYABLE} and len(by_seed[ReplayStatus.REPLAYABLE]) == 4
    assert len({s["seed"] for s in by_seed[ReplayStatus.REPLAYABLE]}) == 4
    assert validate_store(store) == []


def test_robot_bridge_episodes_are_video_only_and_a_changed_task_is_not_replayed(tmp_path):
    mapping = load_mapping("toy_reach")
    student = Student.create(mapping, seed=0, ensemble=2, hidden=(16,))
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0)
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(flush_interval_s=0.05) as rec:
        session = build_session(cfg, rec, student, env=make_env("toy_reach", num_envs=1, seed=0))
        session.episode_extra = {"robot_bridge": {"endpoint": "127.0.0.1:7000", "instance": "arm-1"}}
        session.run(1, progress=False)
        changed = mapping.model_copy(update={"horizon": 30})  # recorded under another task definition
        session = build_session(cfg, rec, student, env=make_env(changed, num_envs=1, seed=0))
        session.run(1, progress=False)
    report = replay_store(tmp_path / "s", progress=False)
    bridge, other = report.results
    assert bridge.check.status == ReplayStatus.VIDEO_ONLY and "127.0.0.1:7000" in bridge.check.reason
    assert other.check.status == ReplayStatus.UNVERIFIED
    assert f"now version 1 mapping {mapping.hash}): not replayed" in other.check.reason
    assert changed.hash in other.check.reason
    # the tolerances are not part of what was recorded: changing them keeps the hash
    assert mapping.model_copy(update={"replay": {"obs_atol": 1.0}}).hash == mapping.hash
    with pytest.raises(ConfigError, match=r"replay.keys names \['nope'\], not observation keys"):
        mapping.model_copy(update={"replay": {"keys": {"nope": 1.0}}})


def test_bad_input_is_one_readable_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        done = record(rec, 1, 10)
        rec.begin_episode(start(), fields())  # never committed
    incomplete = next(i.episode_id for i in EpisodeStore.open(path).episodes(complete=False))
    before = _files(path)
    assert main(["replay", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing'}: no episode store here"
    assert main(["replay", str(path), "--episode", "nope"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {path}: no episode matches 'nope'"
    assert main(["replay", str(path), "--episode", incomplete[:12]]) == 2
    err = capsys.readouterr().err
    assert f"episode {incomplete} is incomplete (never committed)" in err and "Traceback" not in err
    assert _files(path) == before
    with pytest.raises(StoreError, match="opened read-only"):
        replay_store(EpisodeStore.open(path), progress=False)
    # a whole-store run skips the incomplete episode and records the rest
    assert main(["replay", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"{incomplete}  skipped: incomplete" in out and f"{done}  unverified: no recorded initial state" in out
    assert "1 episode(s) checked" in out and "1 incomplete skipped; 1 label layer(s) written" in out
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    meta["attributes"]["hg_dagger"]["schema_version"] = "0.9"
    root.write_text(json.dumps(meta))
    assert main(["replay", str(path)]) == 2
    assert "schema_version '0.9' is not supported" in capsys.readouterr().err
