"""A very short `hg-dagger auto` on FetchPickAndPlace (real MuJoCo) with the planner expert."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract import LabelMask
from hg_dagger.learn.auto import AutoConfig, AutoRun, leftover_workers
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.simulation]


def test_auto_runs_on_fetch_pick_place_with_the_planner(tmp_path):
    cfg = AutoConfig.model_validate({
        "task": "fetch_pick_place", "certification": "planner_auto", "num_envs": 2, "iterations": 1, "episodes_per_iteration": 2,
        "max_episode_steps": 20, "beta": {"kind": "constant", "beta0": 0.7},
        "student": {"ensemble": 2, "hidden": [32]}, "train": {"steps": 10, "batch_size": 32},
        "eval": {"episodes": 2, "num_envs": 2, "max_steps": 20},
    })
    before = set(leftover_workers())
    rows = AutoRun(cfg, tmp_path / "run").run(progress=False)
    assert set(leftover_workers()) - before == set()
    row = rows[0]
    assert row["env_steps"] == 40 and row["recorder"]["written_steps"] == 40
    assert row["expert_latency_ms_mean"] > 0 and row["eval"]["episodes"] == 2
    store = EpisodeStore.open(tmp_path / "run" / "store")
    infos = store.episodes()
    assert len(infos) == 2 and all(i.complete and i.num_steps == 20 for i in infos)
    for info in infos:
        d = store.read_steps(info.episode_id, ["obs/observation", "obs/desired_goal", "expert_action", "expert_valid",
                                               "expert_used", "applied_action"])
        assert d["obs/observation"].shape == (20, 25) and d["expert_action"].shape == (20, 4)
        trainable = store.labels(info.episode_id).mask == LabelMask.TRAINABLE.code
        assert np.array_equal(trainable, d["expert_valid"]) and trainable.any()
        assert np.all(np.abs(d["applied_action"]) <= 1.0)
    assert row["replay"]["labels"] == sum(
        int((store.labels(i.episode_id).mask == LabelMask.TRAINABLE.code).sum()) for i in infos)
    assert validate_store(store) == []
    # the labels by the planner's phase at each labelled state: the planner asked again on the stored states agrees
    from hg_dagger.envs import load_mapping
    from hg_dagger.experts import make_expert

    mapping = load_mapping("fetch_pick_place")
    planner = make_expert("fetch_pick_place", "planner", mapping=mapping)
    phases: dict[str, int] = {}
    for info in infos:
        d = store.read_steps(info.episode_id)
        obs = {k: d[f"obs/{k}"] for k in mapping.obs_spec()}
        names = planner.act(obs, env_ids=list(range(len(d["valid"])))).metadata["phase"][d["expert_valid"]]
        for name in names.tolist():
            phases[name] = phases.get(name, 0) + 1
    assert row["label_phases"] == phases and sum(phases.values()) == row["replay"]["labels"]
    # the round's expert recoverability: every failed evaluation episode probed from its first-failure step
    rec = row["recoverability"]
    assert rec["probed"] == rec["failed"] == round(2 * (1 - row["eval_success_rate"]))
    assert rec["recovered"] == sum(p["recovered"] for p in rec["per_episode"])
    assert all(p["switch_step"] <= 10 for p in rec["per_episode"])
