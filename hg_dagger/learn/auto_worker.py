"""The simulation process of mode dagger_async: env + expert + recorder, collecting continuously with the latest
policy snapshot (a checkpoint file it reloads when it changes); no live model crosses the process boundary."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.learn.auto_config import AutoConfig, reset_seed
from hg_dagger.learn.collect import Collector, build_expert, rec_stats
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import read_checkpoint
from hg_dagger.store import EpisodeStore

# ---------------------------------------------------------------------- what the process sends the learner


@dataclass(frozen=True)
class EpisodeCollected:
    """One episode ended and was handed to the recorder: its id, policy version, iteration, success, length."""

    info: dict[str, Any]


@dataclass(frozen=True)
class CollectorStats:
    """The collector's running counters (the last one sent also carries the recorder's)."""

    summary: dict[str, Any]


@dataclass(frozen=True)
class WorkerFailed:
    """The process is about to exit on this error."""

    error: str


WorkerMessage = EpisodeCollected | CollectorStats | WorkerFailed


def async_worker(cfg_dict: dict, store_url: str, snapshot: str, messages, stop) -> None:
    """dagger_async simulation process: env + expert + recorder; the policy comes only from snapshot files."""
    # torch deferred: seconds to import; only the code that runs a model loads it
    import torch

    torch.set_num_threads(1)
    try:
        cfg = AutoConfig.model_validate(cfg_dict)
        mapping = load_mapping(cfg.task)
        expert = build_expert(cfg.expert, mapping, relabel=True)
        store = EpisodeStore.open(store_url, mode="a")
        rec = store.recorder(flush_interval_s=cfg.recorder_flush_s, queue_steps=cfg.recorder_queue_steps)
        seen: dict[str, tuple[int, int] | None] = {"stamp": None}

        def load_snapshot(collector) -> None:
            st = os.stat(snapshot)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == seen["stamp"]:
                return
            data = read_checkpoint(snapshot)
            collector.set_policy(Student.load(snapshot, mapping), iteration=int(data["extra"]["iteration"]),
                                 beta=float(data["extra"]["beta"]))
            seen["stamp"] = stamp

        with make_env(mapping, num_envs=cfg.num_envs, seed=cfg.seed) as env:
            collector = Collector(env, expert, rec, mode=cfg.mode, seed=cfg.seed * 1000 + 17,
                                  expert_timeout_s=cfg.expert.timeout_s, max_episode_steps=cfg.max_episode_steps,
                                  certify=cfg.certification == "planner_auto", safety=cfg.safety)
            load_snapshot(collector)

            begun_for: dict[int, int] = {}

            def may_begin() -> bool:
                """At most episodes_per_iteration episodes per snapshot: staleness stays bounded."""
                k = collector.iteration
                if begun_for.get(k, 0) >= cfg.episodes_per_iteration:
                    return False
                begun_for[k] = begun_for.get(k, 0) + 1
                return True

            def on_tick(ticks: int, waiting: bool) -> None:
                if waiting or ticks % cfg.async_.snapshot_check_steps == 0:
                    load_snapshot(collector)
                    messages.put(CollectorStats(collector.stats.summary()))

            def on_episode(eid: str, info: dict) -> None:
                messages.put(EpisodeCollected({"episode_id": eid, "policy_version": collector.student.version, **info}))

            try:
                stats = collector.run(episodes=None, reset_seed=reset_seed(cfg, 0), stop=stop.is_set,
                                      may_begin=may_begin, on_tick=on_tick, on_episode=on_episode)
            finally:
                rec.close()
            messages.put(CollectorStats({**stats.summary(), "partial_episodes": len(stats.partial_ids),
                                         "recorder": rec_stats(rec)}))
    except BaseException as exc:  # noqa: BLE001 - reported to the learner process
        messages.put(WorkerFailed(f"{type(exc).__name__}: {exc}"))
        raise
