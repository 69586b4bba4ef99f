"""A Ray env worker killed (SIGKILL) mid-episode during `auto` (and during `run`, below): the episode it was recording stays incomplete in
the store (never trainable), the episodes it committed are kept, the run continues on a replacement worker that
re-runs the unfinished episodes from the same seeds, and every episode of the round ends up complete exactly once.

Mid-episode is made certain, not hoped for: the worker is killed only when a look at the store (by a watcher process
of its own) shows one of its episodes begun, with steps, and far from its end. The `auto` round runs toy_reach with a
long horizon and no early success, so each episode stays open for seconds while its rows are committed every
20 ms; the `run` variant paces its episodes in real time. (The worker is not frozen and let run in slices: how far its recorder thread gets within
a slice depends on thread scheduling, and a look could see its episodes only once they had ended.)"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import pytest

from hg_dagger.contract import EndReason
from hg_dagger.learn.auto import AutoConfig, AutoRun
from hg_dagger.learn.executor import RayExecutor
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.timeout(600), pytest.mark.ray, pytest.mark.own_process]

EPISODES = 2  # one per worker
LONG_HORIZON = 4000  # steps (a second or more of work); toy_reach's own is 100


@pytest.fixture(scope="module")
def long_toy_reach(tmp_path_factory) -> str:
    """toy_reach as shipped, but episodes run to a long horizon: no success ends one early."""
    import yaml

    from hg_dagger.envs.mapping import TASKS_DIR

    task = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    task["horizon"] = LONG_HORIZON
    task["backend_options"]["terminate_on_success"] = False
    path = tmp_path_factory.mktemp("task") / "toy_reach_long.yaml"
    path.write_text(yaml.safe_dump(task))
    return str(path)


CFG = {
    # an untrained student acts (beta 0): episodes run to the long horizon, many slices long
    "certification": "planner_auto", "mode": "dagger_sync", "num_envs": 1, "seed": 2,
    "iterations": 1, "episodes_per_iteration": EPISODES, "dataset_versions": False,
    "beta": {"kind": "constant", "beta0": 0.0}, "student": {"ensemble": 2, "hidden": [16]},
    "train": {"steps": 5, "batch_size": 32, "log_every": 5}, "eval": {"episodes": 2, "num_envs": 2, "max_steps": 5},
    "recorder_flush_s": 0.02,
}


def _children() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    before = _children()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 << 20, logging_level=logging.ERROR,
             log_to_driver=False)
    yield
    ray.shutdown()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _children() - before:
        time.sleep(0.2)
    assert _children() - before == set(), "Ray left processes running"


SEEN: dict = {}  # what the watcher's looks saw, for the failure message

# The watcher: a process of its own that looks at the store every 10 ms and SIGKILLs the victim as soon as one of
# its episodes shows between 1 and BEFORE steps committed and no end. In the test process the looks would share the
# GIL with the run's driver thread (in a full suite, a round once got 7 looks).
_WATCHER = r"""
import json, os, signal, sys, time
from hg_dagger.store import EpisodeStore
url, victim, before = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = {"looks": 0, "victim": victim}
def report(*_):
    print(json.dumps(seen), flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, report)
print("ready", flush=True)
while True:
    seen["looks"] += 1
    try:
        infos = EpisodeStore.open(url, mode="r").episodes()
    except Exception as exc:
        seen["not open"] = repr(exc)[:200]
        infos = []
    mine = [i for i in infos if i.start.extra.get("worker_pid") == victim]
    seen["pids"] = sorted({str(i.start.extra.get("worker_pid")) for i in infos})
    seen["mine"] = [(i.complete, i.num_steps) for i in mine][-3:]
    still = [i.episode_id for i in mine if not i.complete and 0 < i.num_steps < before]
    if still:
        os.kill(victim, signal.SIGKILL)
        seen["killed"] = still
        report()
    time.sleep(0.01)
"""


def _start_watcher(url, victim: int, *, before_step: int) -> subprocess.Popen:
    """The watcher for ``victim``, ready (imports done) before the run starts."""
    proc = subprocess.Popen([sys.executable, "-c", _WATCHER, url, str(victim), str(before_step)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _run_and_kill(url, ex: RayExecutor, work: Callable[[], Any], *, before_step: int) -> tuple[dict, list[str]]:
    """Run ``work`` (a run on ``ex``) in a thread while a watcher kills worker ``ex.pids[0]`` mid-episode; closes
    ``ex``. Returns ({"value": what work returned} or {"error": what it raised}, the episodes the worker was killed
    in)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            result["error"] = exc

    runner = threading.Thread(target=run, name="killed-run")
    watcher = _start_watcher(url, ex.pids[0], before_step=before_step)
    runner.start()
    try:
        killed = _kill_mid_episode(watcher, runner)
    finally:
        runner.join(60)
        ex.close()
    return result, killed


def _kill_mid_episode(watcher: subprocess.Popen, runner: threading.Thread) -> list[str]:
    """Wait for the run in ``runner``; returns the episodes the watcher killed the victim in (none: it never
    caught one open)."""
    while runner.is_alive() and watcher.poll() is None:
        time.sleep(0.05)
    if watcher.poll() is None:
        watcher.terminate()
    out, _ = watcher.communicate(timeout=60)
    runner.join(300)
    SEEN.clear()
    SEEN.update(json.loads(out.strip().splitlines()[-1]) if out.strip() else {"watcher": "no report"})
    return list(SEEN.get("killed", []))


def test_a_worker_killed_mid_episode_leaves_it_incomplete_and_the_run_goes_on(ray_runtime, long_toy_reach, tmp_path):
    cfg = AutoConfig.model_validate({**CFG, "task": long_toy_reach})
    # a round in which no look caught an open episode is run again in a fresh folder (up to three rounds); what is
    # asserted is the round it was killed in
    for attempt in range(3):
        out = tmp_path / f"run-{attempt}"
        url = str(out / "store")
        ex = RayExecutor(workers=2)
        victim = ex.pids[0]
        result, killed = _run_and_kill(url, ex, lambda out=out, ex=ex: AutoRun(cfg, out, executor=ex).run(progress=False),
                                       before_step=LONG_HORIZON // 2)
        assert "error" not in result, f"round {attempt}: {result['error']!r}"
        if killed:
            break
    assert killed, f"the worker finished before it could be caught mid-episode, in three rounds; the last: {SEEN}"

    # the run went on: its round completed, trained and recorded the lost worker
    (row,) = result["value"]
    assert row["episodes"] == EPISODES
    assert len(row["worker_failures"]) == 1 and row["worker_failures"][0]["pid"] == victim
    assert victim not in ex.pids  # a replacement took the dead worker's place

    store = EpisodeStore.open(url)
    assert validate_store(store) == []  # a killed writer is a crash the store is built for
    infos = store.episodes()
    complete: dict[int, object] = {}
    for i in infos:
        if i.complete:
            k = i.start.extra["episode_index"]
            assert k not in complete, f"episode index {k} committed twice"
            complete[k] = i
    assert sorted(complete) == list(range(EPISODES))  # nothing lost, nothing doubled
    for eid in killed:
        info = store.info(eid)
        assert not info.complete and info.end.end_reason == EndReason.INCOMPLETE
        # the replacement re-ran it from the same seed; the steps the killed worker flushed are the same steps
        redo = complete[info.start.extra["episode_index"]]
        assert redo.start.initial_state["seed"] == info.start.initial_state["seed"]
        assert redo.start.extra["worker_pid"] != victim
        cut, full = store.read_steps(eid), store.read_steps(redo.episode_id)
        n = info.num_steps
        assert 0 < n < redo.num_steps or n == redo.num_steps
        np.testing.assert_array_equal(cut["applied_action"][:n], full["applied_action"][:n])
        np.testing.assert_array_equal(cut["obs/qpos"][:n], full["obs/qpos"][:n])
    # training took the complete episodes only, each once
    from hg_dagger.policy import read_checkpoint

    trained = [e for e, _ in read_checkpoint(out / "checkpoint.pt")["extra"]["train"]["replay"]["episodes"]]
    assert sorted(trained) == sorted(i.episode_id for i in complete.values())
    assert not set(killed) & set(trained)


RUN_HORIZON = 100  # toy_reach's own horizon, paced in real time (25 Hz): 4 s an episode
RUN_EPISODES = 24  # 12 per worker: several recorder flushes (0.5 s) land while one is open, even on a fast machine


def test_a_run_worker_killed_mid_episode_has_its_missing_seeds_run_again(ray_runtime, tmp_path):
    """`run --operator synthetic` on Ray: a block's worker is killed mid-episode; the block's committed episodes
    are kept, its other seeds run again on the replacement, and the run records every seed exactly once."""
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    # an untrained student (gates and the synthetic operator take turns): episodes long enough to be caught open
    cfg = load_run_config(None, "toy_reach", **{"operator.type": "synthetic", "num_envs": 1,
                                                "episodes": RUN_EPISODES, "seed": 40, "calibrate_steps": 0,
                                                "realtime": True})  # paced: each episode open for seconds
    url = str(tmp_path / "store")
    ex = RayExecutor(workers=2)
    victim = ex.pids[0]
    result, killed = _run_and_kill(url, ex, lambda: run_gated(cfg, url, progress=False, executor=ex),
                                   before_step=RUN_HORIZON // 2)
    assert "error" not in result, repr(result["error"])
    assert killed, f"the worker finished before it could be caught mid-episode: {SEEN}"
    summary = result["value"]

    store = EpisodeStore.open(url)
    assert validate_store(store) == []
    complete = [i for i in store.episodes() if i.complete]
    seeds = sorted(i.start.initial_state["seed"] for i in complete)
    assert seeds == list(range(40, 40 + RUN_EPISODES))  # every seed once: nothing lost, nothing doubled
    assert summary.episodes == RUN_EPISODES and sorted(summary.episode_ids) == sorted(i.episode_id for i in complete)
    assert summary.steps == sum(i.num_steps for i in complete)
    assert summary.windows == sum(len(store.labels(i.episode_id).windows) for i in complete)
    assert any("died" in n and "run again" in n for n in summary.notes), summary.notes
    for eid in killed:
        info = store.info(eid)
        assert not info.complete and info.end.end_reason == EndReason.INCOMPLETE
        redo = [i for i in complete if i.start.initial_state["seed"] == info.start.initial_state["seed"]]
        assert len(redo) == 1 and redo[0].start.extra["worker_pid"] != victim
