"""The Ray executor against the local one on a real Ray runtime (toy_reach, 2 workers, few episodes): the same
seeds give the same episodes, actions, policies and evaluation counts, for `auto` (sync and pipelined async),
`run --operator synthetic`, `eval` and `replay`; the workers write their own store segments; nothing is left
running. One local Ray instance serves the whole module."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from hg_dagger.cli import main
from hg_dagger.learn.auto import AutoConfig, AutoRun
from hg_dagger.learn.executor import LocalExecutor, RayExecutor
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.timeout(600), pytest.mark.ray]

CFG = {
    "task": "toy_reach", "certification": "planner_auto", "mode": "dagger_sync", "num_envs": 2, "seed": 5,
    "iterations": 2, "episodes_per_iteration": 6, "max_episode_steps": 30, "beta": {"kind": "constant", "beta0": 0.5},
    "student": {"ensemble": 2, "hidden": [32, 32]}, "train": {"steps": 20, "batch_size": 64, "log_every": 10},
    "eval": {"episodes": 5, "num_envs": 2, "max_steps": 30}, "recorder_flush_s": 0.1,
}


def _ray_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(_cmd(p))]


def _cmd(p) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
def ray_runtime():
    """One local Ray for the module (its start takes seconds); shut down at the end, and no process left."""
    import ray

    before = {p.pid for p in _ray_processes()}
    # logical CPUs: the module's executor and one started by a CLI call hold 2 workers each
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=128 << 20, logging_level=logging.ERROR,
             log_to_driver=False)
    yield ray
    ray.shutdown()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and {p.pid for p in _ray_processes()} - before:
        time.sleep(0.2)
    assert {p.pid for p in _ray_processes()} - before == set(), "Ray left processes running"


@pytest.fixture(scope="module")
def ex(ray_runtime):
    e = RayExecutor(workers=2)
    yield e
    e.close()


@pytest.fixture(scope="module")
def runs(ex, tmp_path_factory):
    """The same auto run twice: local and on the Ray workers."""
    base = tmp_path_factory.mktemp("runs")
    cfg = AutoConfig.model_validate(CFG)
    rows = {"local": AutoRun(cfg, base / "local").run(progress=False),
            "ray": AutoRun(cfg, base / "ray", executor=ex).run(progress=False)}
    return base, rows


def _episodes(store):
    """Complete episodes by (iteration, episode_index)."""
    out = {}
    for info in store.episodes():
        if info.complete:
            key = (info.start.iteration, info.start.extra["episode_index"])
            assert key not in out, f"two complete episodes for {key}"
            out[key] = info
    return out


def test_auto_on_ray_equals_local(runs):
    base, rows = runs
    local, ray_ = (EpisodeStore.open(base / k / "store") for k in ("local", "ray"))
    assert validate_store(local) == [] and validate_store(ray_) == []
    a, b = _episodes(local), _episodes(ray_)
    assert sorted(a) == sorted(b) == [(it, k) for it in range(2) for k in range(6)]
    for key in a:
        sa, sb = a[key].start, b[key].start
        assert sa.initial_state["seed"] == sb.initial_state["seed"]
        assert sa.policy_version == sb.policy_version and sa.beta == sb.beta == 0.5
        da, db = local.read_steps(a[key].episode_id), ray_.read_steps(b[key].episode_id)
        for f in ("applied_action", "expert_used", "expert_action", "policy_action", "obs/qpos", "success"):
            np.testing.assert_array_equal(da[f], db[f], err_msg=f"{key} {f}")
        assert sb.extra["executor"] == "ray" and sb.extra["staleness_rounds"] == 0
        assert sb.extra["policy_iteration"] == key[0]
    # beta 0.5 mixed both sources, so the student's answers mattered
    assert any(local.read_steps(i.episode_id)["expert_used"].any() for i in a.values())
    assert any((~local.read_steps(i.episode_id)["expert_used"]).any() for i in a.values())
    # the same data trains the same policy, which evaluates the same
    for ra, rb in zip(rows["local"], rows["ray"], strict=True):
        assert ra["policy_version"] == rb["policy_version"]
        assert ra["collected_with"] == rb["collected_with"]
        assert ra["eval"]["episodes"] == rb["eval"]["episodes"] == 5
        assert ra["eval_success_rate"] == rb["eval_success_rate"]
        assert ra["eval_episode_length"] == rb["eval_episode_length"]
        assert rb["executor"]["kind"] == "ray" and rb["executor"]["workers"] == 2
        assert rb["worker_failures"] == []


def test_ray_workers_each_write_their_own_segments(runs, ex):
    base, _ = runs
    store = EpisodeStore.open(base / "ray" / "store")
    by_worker: dict[int, set[str]] = {}
    for info in store.episodes():
        assert info.start.extra["worker_pid"] in ex.pids
        by_worker.setdefault(info.start.extra["worker"], set()).add(info.segment_id)
    assert len(by_worker) == 2  # both workers collected
    seg0, seg1 = by_worker.values()
    assert not seg0 & seg1  # no segment shared between two processes


def test_async_on_ray_is_pipelined_one_round_stale(ex, tmp_path):
    cfg = AutoConfig.model_validate({**CFG, "mode": "dagger_async", "iterations": 3, "episodes_per_iteration": 4})
    rows = AutoRun(cfg, tmp_path / "run", executor=ex).run(progress=False)
    store = EpisodeStore.open(tmp_path / "run" / "store")
    assert validate_store(store) == []
    eps = _episodes(store)
    assert sorted(eps) == [(it, k) for it in range(3) for k in range(4)]
    for (it, _), info in eps.items():
        x = info.start.extra
        assert x["staleness_rounds"] == (0 if it == 0 else 1)
        assert x["policy_iteration"] == max(it - 1, 0)
    # round it > 0 acted with the policy round it - 1 collected with... trained one round earlier
    assert rows[1]["collected_with"] == rows[0]["collected_with"]
    assert rows[2]["collected_with"] == [rows[0]["policy_version"]]
    assert {info.start.policy_version for (it, _), info in eps.items() if it == 2} == {rows[0]["policy_version"]}
    assert [r["staleness_rounds"] for r in rows] == [0, 1, 1]


def test_eval_cli_on_ray_equals_local(runs, tmp_path, capsys):
    base, _ = runs
    ckpt = str(base / "ray" / "checkpoint.pt")
    common = ["eval", "--checkpoint", ckpt, "--task", "toy_reach", "--episodes", "7", "--num-envs", "3",
              "--max-steps", "40", "--seed", "321", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--executor", "ray", "--workers", "2"]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / k / "eval.json").read_text())["closed_loop"] for k in ("local", "ray"))
    assert a["episodes"] == b["episodes"] == 7
    assert [e["seed"] for e in a["per_episode"]] == [e["seed"] for e in b["per_episode"]] == list(range(321, 328))
    for key in ("success", "length", "first_failure_step", "initial_progress"):
        assert [e[key] for e in a["per_episode"]] == [e[key] for e in b["per_episode"]], key
    assert a["success_rate"] == b["success_rate"] and a["buckets"] == b["buckets"]


def test_auto_cli_on_ray_completes_and_validates(ray_runtime, tmp_path, capsys):
    import yaml

    cfg = {"kind": "auto", **CFG, "iterations": 1, "episodes_per_iteration": 4}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    assert main(["auto", "--config", str(path), "--out", str(out), "--quiet", "--executor", "ray",
                 "--workers", "2"]) == 0
    assert "iteration 0: beta 0.500" in capsys.readouterr().out
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["executor"]["kind"] == "ray" and row["episodes"] == 4
    store = EpisodeStore.open(out / "store")
    assert validate_store(store) == [] and len([i for i in store.episodes() if i.complete]) == 4
    assert {i.start.extra["executor"] for i in store.episodes()} == {"ray"}


def test_run_rounds_on_ray_gate_on_the_workers_and_train_on_the_driver(ray_runtime, tmp_path, capsys):
    """`run --rounds` on Ray: each gated round's seed blocks run as sessions on the workers, with the student the
    driver trained in the round before; round 0 and the seeds of every episode equal the local run's."""
    import yaml

    auto = tmp_path / "auto.yaml"
    auto.write_text(yaml.safe_dump({"kind": "auto", "task": "toy_reach", "student": CFG["student"],
                                    "train": CFG["train"], "eval": CFG["eval"]}))
    argv = ["run", "--task", "toy_reach", "--operator", "synthetic", "--certify", "--episodes", "4", "--num-envs",
            "2", "--seed", "7", "--rounds", "2", "--quiet", "--auto-config", str(auto)]
    assert main([*argv, "--out", str(tmp_path / "ray"), "--executor", "ray", "--workers", "2"]) == 0
    assert "round 2/2" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and rows[1]["executor"]["kind"] == "ray"
    store = EpisodeStore.open(tmp_path / "ray" / "store")
    assert validate_store(store) == []
    gated = [i for i in store.episodes() if i.start.iteration == 1]
    assert len(gated) == 4 and {i.start.mode.value for i in gated} == {"human_gated"}
    assert {i.start.extra["worker"] for i in gated} == {0, 1}
    assert {i.start.policy_version for i in gated} == {rows[0]["policy_version"]}
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    local = [json.loads(line) for line in (tmp_path / "local" / "metrics.jsonl").read_text().splitlines()]
    # round 0 (demonstrations) is the same on both; a gated round's episodes are split into seed blocks, each a
    # session of its own, so its windows may differ, but both record every episode of every seed once
    assert local[0]["policy_version"] == rows[0]["policy_version"]
    local_store = EpisodeStore.open(tmp_path / "local" / "store")
    seeds = sorted(i.start.initial_state["seed"] for i in local_store.episodes() if i.start.iteration == 1)
    assert sorted(i.start.initial_state["seed"] for i in gated) == seeds


def test_eval_seeds_do_not_depend_on_the_batch(runs):
    """An episode's result is its seed's, whichever row ran it: 7 episodes over 3 rows or one at a time."""
    from hg_dagger.envs import load_mapping, make_env
    from hg_dagger.learn.evaluate import EvalConfig, closed_loop
    from hg_dagger.policy import Student

    base, _ = runs
    mapping = load_mapping("toy_reach")
    student = Student.load(base / "local" / "checkpoint.pt", mapping)
    cfg = EvalConfig(episodes=7, num_envs=3, seed=40, max_steps=40)
    with make_env(mapping, num_envs=3, seed=0) as env:
        whole = closed_loop(student, env, cfg)["per_episode"]
        parts = [closed_loop(student, env, cfg, seeds=[s])["per_episode"][0] for s in (43, 46)]
    assert [e["seed"] for e in whole] == list(range(40, 47))
    for part, k in zip(parts, (3, 6), strict=True):
        assert (part["success"], part["length"]) == (whole[k]["success"], whole[k]["length"])


def test_run_synthetic_on_ray_splits_the_seeds_into_blocks(ex, tmp_path, capsys):
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    cfg = load_run_config(None, "toy_reach", **{"operator.type": "synthetic", "num_envs": 2, "episodes": 6, "seed": 10})
    summary = run_gated(cfg, str(tmp_path / "ray"), progress=False, executor=ex).as_dict()
    assert summary["episodes"] == 6 and len(summary["episode_ids"]) == 6
    store = EpisodeStore.open(tmp_path / "ray")
    assert validate_store(store) == []
    infos = [i for i in store.episodes() if i.complete]
    assert sorted(i.start.initial_state["seed"] for i in infos) == list(range(10, 16))  # the local run's seeds
    blocks = {}
    for i in infos:
        blocks.setdefault(i.start.extra["episode_offset"], []).append(i)
    assert sorted(blocks) == [0, 3] and len({i.start.extra["worker"] for i in infos}) == 2
    assert sum(i.num_steps for i in infos) == summary["steps"]
    # each block is exactly the local run of that block: `run --seed 10+offset --episodes 3`
    common = ["run", "--task", "toy_reach", "--operator", "synthetic", "--num-envs", "2", "--quiet", "--episodes", "3"]
    for offset, eps in blocks.items():
        local = tmp_path / f"local{offset}"
        assert main([*common, "--store", str(local), "--seed", str(10 + offset)]) == 0
        capsys.readouterr()
        ls = EpisodeStore.open(local)
        want = {i.start.initial_state["seed"]: ls.read_steps(i.episode_id) for i in ls.episodes()}
        for i in eps:
            got = store.read_steps(i.episode_id)
            exp = want[i.start.initial_state["seed"]]
            for f in ("applied_action", "action_source", "obs/qpos"):
                np.testing.assert_array_equal(got[f], exp[f], err_msg=f"seed {i.start.initial_state['seed']} {f}")


def test_replay_on_ray_matches_local_and_writes_once(runs, ex):
    from hg_dagger.review.replay import replay_store

    base, _ = runs
    url = str(base / "ray" / "store")
    local = replay_store(url, write=False, progress=False)
    remote = replay_store(url, progress=False, executor=ex)
    assert local.counts() == remote.counts() and remote.counts()["replayable"] == 12
    by_id = {r.episode_id: r for r in local.results}
    for r in remote.results:
        assert r.check.status == by_id[r.episode_id].check.status
        assert r.check.steps_checked == by_id[r.episode_id].check.steps_checked
        assert r.version is not None  # written by this process, the one writer
    store = EpisodeStore.open(url)
    assert all(store.replay_status(i.episode_id).value == "replayable" for i in store.episodes())
    assert validate_store(store) == []


def test_local_executor_is_the_default_path(tmp_path):
    """LocalExecutor gives the same episodes as AutoRun without one (which makes its own)."""
    cfg = AutoConfig.model_validate({**CFG, "iterations": 1, "episodes_per_iteration": 3})
    with LocalExecutor() as ex:
        rows = AutoRun(cfg, tmp_path / "a", executor=ex).run(progress=False)
    assert rows[0]["executor"] == {"kind": "local", "workers": 1}
    rows_b = AutoRun(cfg, tmp_path / "b").run(progress=False)
    assert rows[0]["policy_version"] == rows_b[0]["policy_version"]


@pytest.mark.subprocess
def test_ray_usage_statistics_stay_off_unless_the_user_turned_them_on():
    """The executor's own ray.init runs with Ray's usage statistics off when the user has not set them."""
    code = ("import os; from hg_dagger.learn.executor_ray import RayExecutor; e = RayExecutor(workers=1); "
            "from ray._common.usage.usage_lib import usage_stats_enabled; "
            "print('usage', usage_stats_enabled(), os.environ['RAY_USAGE_STATS_ENABLED']); e.close()")
    env = {k: v for k, v in os.environ.items() if k != "RAY_USAGE_STATS_ENABLED"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert "usage False 0" in out.stdout, out.stdout + out.stderr
