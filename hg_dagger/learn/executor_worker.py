"""What crosses process boundaries between a driver and its env workers (policy snapshots, collection results,
seed shares) and the env worker itself (a simulator, an expert and a recorder per store, in-process or a
Ray actor). Used by learn.executor (local) and learn.executor_ray."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hg_dagger.contract.enums import CollectionMode
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.base import VecEnv
from hg_dagger.learn.evaluate import closed_loop
from hg_dagger.review.replay import replay_episode

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- what crosses process boundaries


@dataclass(frozen=True)
class PolicySnapshot:
    """A policy as it travels to workers: its version and checkpoint bytes (or a Ray reference to them)."""

    version: str
    data: Any  # bytes, or [ObjectRef] (wrapped in a list so Ray does not resolve it at every call)


@dataclass
class CollectResult:
    """One round collected: stats merged over workers and the episodes ordered by their index."""

    stats: Any  # CollectStats
    episodes: list[dict[str, Any]]  # {"episode_id", "index", "seed", "length", "success", "worker"}
    recorder: dict[str, Any] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)  # workers lost during the round
    policy_versions: list[str] = field(default_factory=list)  # the versions that acted
    worker_cpu_s: float = 0.0  # CPU seconds the worker processes spent on the round (Ray; 0 in-process)

    @property
    def episode_ids(self) -> list[str]:
        return [e["episode_id"] for e in self.episodes]


def episode_seeds(base: int, count: int) -> list[int]:
    """The seeds of one round's episodes: episode k starts from base + k, wherever it runs."""
    return [int(base) + k for k in range(int(count))]


def shares(count: int, width: int, workers: int) -> list[list[int]]:
    """Episode indices per worker: batches of ``width`` dealt round-robin, one call per worker and round (each call
    opens a recorder and a store segment, so fewer, larger calls)."""
    out: list[list[int]] = [[] for _ in range(max(1, workers))]
    for b, start in enumerate(range(0, count, max(1, width))):
        out[b % len(out)].extend(range(start, min(start + width, count)))
    return [s for s in out if s]


def merge_stats(parts: list) -> Any:
    """One CollectStats from several workers' (counts summed, lists concatenated)."""
    # deferred: learn.collect imports zarr; the CLI lists its commands without it
    from hg_dagger.learn.collect import CollectStats

    out = CollectStats()
    for p in parts:
        for f in fields(CollectStats):
            a, b = getattr(out, f.name), getattr(p, f.name)
            if isinstance(a, list):
                a.extend(b)
            elif isinstance(a, Counter):
                a.update(b)  # counts add up
            elif isinstance(a, dict):
                a.update(b)
            elif f.name != "seconds":
                setattr(out, f.name, a + b)
    return out


# ---------------------------------------------------------------------- one env worker (in-process or an actor)


class EnvWorker:
    """A simulator, an expert and a recorder per store, reused across calls; the policy arrives per call.

    The local executor runs one in this process; the Ray executor runs N as actors."""

    def __init__(self, index: int = 0, kind: str = "local"):
        self.index, self.kind = int(index), kind
        if kind != "local":
            # torch deferred: seconds to import; only the code that runs a model loads it
            import torch

            torch.set_num_threads(1)  # one core per worker; the trainer keeps the driver's
        self._env: VecEnv | None = None
        self._env_key: tuple | None = None
        self._expert = None
        self._expert_key: tuple | None = None
        self._student = None

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = self._env_key = None

    def _env_for(self, mapping, num_envs: int, seed: int):
        key = (mapping.task_id, mapping.hash, int(num_envs), int(seed))
        if key != self._env_key:
            self.close()
            self._env, self._env_key = make_env(mapping, num_envs=num_envs, seed=seed), key
        return self._env

    def _student_for(self, snap, mapping):
        """The acting student: a live one (local executor) or loaded once per version from snapshot bytes."""
        if not isinstance(snap, PolicySnapshot):
            return snap
        if self._student is not None and self._student.version == snap.version:
            return self._student
        # deferred: policy.checkpoint imports torch, ray is an optional extra; the CLI lists its commands without them
        from hg_dagger.policy.checkpoint import load_student

        data = snap.data
        if isinstance(data, list):
            import ray

            data = ray.get(data[0])
        self._student = load_student(data, mapping)
        return self._student

    def collect(self, cfg, store_url: str, snap, job: dict[str, Any], progress: bool = False) -> dict[str, Any]:
        """Collect the episodes ``job["seeds"]`` into the store; committed when this returns."""
        # deferred: learn.collect and store import zarr; the CLI lists its commands without it
        from hg_dagger.learn.collect import Collector, build_expert, rec_stats
        from hg_dagger.store import EpisodeStore

        cpu0 = time.process_time()
        mapping = load_mapping(cfg.task)
        key = (cfg.task, cfg.expert.model_dump_json(), cfg.mode)
        if key != self._expert_key:
            self._expert = build_expert(cfg.expert, mapping, relabel=cfg.mode != CollectionMode.EXPERT_DEMO)
            self._expert_key = key
        env = self._env_for(mapping, cfg.num_envs, cfg.seed)
        student = self._student_for(snap, mapping)
        store = EpisodeStore.open(store_url, mode="a")
        rec = store.recorder(flush_interval_s=cfg.recorder_flush_s, queue_steps=cfg.recorder_queue_steps)
        it = int(job["iteration"])
        collector = Collector(env, self._expert, rec, mode=cfg.mode, seed=cfg.seed * 1000 + it,
                              expert_timeout_s=cfg.expert.timeout_s, max_episode_steps=cfg.max_episode_steps,
                              certify=cfg.certification == "planner_auto", safety=cfg.safety)
        collector.set_policy(student, iteration=it, beta=float(job["beta"]))
        collector.extra = {"executor": self.kind, "worker": self.index, "worker_pid": os.getpid(),
                           "job": job["job"], "policy_iteration": int(job["policy_iteration"]),
                           "staleness_rounds": it - int(job["policy_iteration"])}
        indices, seeds = list(job["indices"]), list(job["seeds"])
        seed_of = dict(zip(indices, seeds, strict=True))
        episodes: list[dict[str, Any]] = []

        def on_episode(eid: str, info: dict) -> None:
            k = info["index"]
            episodes.append({"episode_id": eid, "index": k, "seed": seed_of[k], "length": info["length"],
                             "success": info["success"], "worker": self.index})

        try:
            stats = collector.run(episodes=None, reset_seed=seeds[0] if seeds else 0, seeds=seeds, indices=indices,
                                  on_episode=on_episode, progress=progress)
        finally:
            rec.close()
        return {"stats": stats, "episodes": episodes, "recorder": rec_stats(rec), "policy_version": student.version,
                "cpu_s": time.process_time() - cpu0}

    def evaluate(self, task: str, snap, eval_cfg, seeds: list[int], num_envs: int) -> dict[str, Any]:
        """Closed-loop episodes from ``seeds`` in an env of ``num_envs`` rows: (per-episode dicts, env steps)."""
        mapping = load_mapping(task)
        student = self._student_for(snap, mapping)
        env = self._env_for(mapping, num_envs, eval_cfg.seed)
        res = closed_loop(student, env, eval_cfg.model_copy(update={"episodes": len(seeds)}), seeds=seeds)
        return {"episodes": res["per_episode"], "steps": res["env_steps"]}

    def replay(self, store_url: str, episode_ids: list[str]) -> list:
        # deferred: store imports zarr; the CLI lists its commands without it
        from hg_dagger.store import EpisodeStore

        store = EpisodeStore.open(store_url, mode="r")
        return [replay_episode(store, e) for e in episode_ids]

    def run_gated(self, cfg, store_url: str, student: bytes | None, extra: dict[str, Any]) -> dict[str, Any]:
        # deferred: it loads the operators, the run config, the session and zarr; the CLI imports this module for every command (tests/learn/test_eval.py)
        from hg_dagger.control.build import run_gated

        extra = {**extra, "executor": self.kind, "worker": self.index, "worker_pid": os.getpid()}
        if student is None:
            return run_gated(cfg, store_url, progress=False, extra=extra).as_dict()
        with tempfile.TemporaryDirectory(prefix="hg-dagger-worker-") as tmp:
            path = Path(tmp) / "student.pt"
            path.write_bytes(student)
            return run_gated(cfg, store_url, student_path=str(path), progress=False, extra=extra).as_dict()


def job_id(iteration: int) -> str:
    return f"{uuid.uuid4().hex[:12]}-it{int(iteration)}"
