"""Automatic-expert DAgger (`hg-dagger auto`): rounds of collection over the rollout engine, aggregation,
training and evaluation. The config lives in learn.auto_config, the collector in learn.collect (the engine
with beta mixing and the store sink), the dagger_async simulation process in learn.auto_worker."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from hg_dagger.contract.enums import CollectionMode
from hg_dagger.datasets.build import build
from hg_dagger.datasets.manifest import DatasetConfig, SelectionConfig
from hg_dagger.datasets.repository import record_training
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.learn.aggregate import LabelBuffer, held_out
from hg_dagger.learn.auto_config import AsyncSpec, AutoConfig, ExpertSpec, load_config, reset_seed
from hg_dagger.learn.auto_worker import (
    CollectorStats,
    EpisodeCollected,
    WorkerFailed,
    WorkerMessage,
    async_worker,
)
from hg_dagger.learn.collect import Collector, CollectStats, build_expert
from hg_dagger.learn.effort import operator_seconds
from hg_dagger.learn.evaluate import EvalConfig, closed_loop, recoverability
from hg_dagger.learn.executor import LocalExecutor
from hg_dagger.learn.progress import read_metrics
from hg_dagger.learn.promotion import Promoter
from hg_dagger.learn.train import Trainer, store_loader
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import read_checkpoint
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import load_labels

log = logging.getLogger(__name__)

__all__ = ["AsyncSpec", "AutoConfig", "AutoRun", "CollectStats", "Collector", "ExpertSpec", "build_expert",
           "leftover_workers", "load_config"]


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


class AutoRun:
    """State of one `hg-dagger auto` run: out_dir holds checkpoint.pt, metrics.jsonl, loss.jsonl, eval/."""

    # set by unattended runs (the cli): called with each round's metrics row (a summary line, ETA, curve.png)
    on_round: Callable[[dict[str, Any]], object] | None = None

    def __init__(self, cfg: AutoConfig, out_dir: str | Path, store_url: str | None = None, executor=None):
        self.cfg = cfg
        self.executor = executor  # learn.executor: local (default) or ray; the caller closes one it passes
        self.out = Path(out_dir)
        self.store_url = str(store_url or self.out / "store")
        self.checkpoint_path = self.out / "checkpoint.pt"
        self.metrics_path = self.out / "metrics.jsonl"
        self._probe_expert = None  # the expert of the recoverability probes, built on first use

    # -------------------------------------------------------------- setup

    def _open_store(self):
        if Path(self.store_url).exists() or "://" in self.store_url:
            try:
                return EpisodeStore.open(self.store_url, mode="a")
            except HgDaggerError:
                if "://" in self.store_url:
                    raise
        return EpisodeStore.create(self.store_url)

    def _trainer(self, mapping, store, resume: bool):
        if resume:
            if not self.checkpoint_path.is_file():
                raise ConfigError(f"{self.checkpoint_path}: nothing to resume (no checkpoint in {self.out})")
            trainer = Trainer.resume(self.checkpoint_path, mapping, store_loader(store, mapping), self.cfg.train)
            self._restore_metrics_line()
            log.info("resumed %s: iteration %d, policy %s, beta %s", self.checkpoint_path, trainer.iteration,
                     trainer.student.version, trainer.beta)
            return trainer
        sc = self.cfg.student
        if self.cfg.initial_student:
            student = Student.load(self.cfg.initial_student, mapping)
        else:
            student = Student.create(mapping, kind=sc.kind, ensemble=sc.ensemble, hidden=sc.hidden, seed=self.cfg.seed)
        return Trainer(student, self.cfg.train, LabelBuffer(self.cfg.replay, seed=self.cfg.seed))

    def _restore_metrics_line(self) -> None:
        """A kill after the checkpoint and before its metrics line: write the line the checkpoint carries."""
        line = read_checkpoint(self.checkpoint_path)["extra"].get("metrics_line")
        if not line:
            return
        it = json.loads(line)["iteration"]
        if any(r["iteration"] == it for r in read_metrics(self.metrics_path)):
            return
        text = self.metrics_path.read_text() if self.metrics_path.is_file() else ""
        with open(self.metrics_path, "a") as f:  # after a line the kill cut short, on a line of its own
            f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")
        log.info("restored iteration %d's metrics line from %s", it, self.checkpoint_path)

    # -------------------------------------------------------------- one iteration's learning half

    def _learn(self, it, beta, trainer, store, mapping, new_ids, collect, env_eval, progress,
               after_fit: Callable[[], None] | None = None, infos: dict | None = None) -> dict[str, Any]:
        keys = list(mapping.obs_spec())
        if infos is None:  # a gated round has waited for its commits already
            infos = _wait_complete(store, new_ids)
        dataset = self._dataset_version(it)
        frac = trainer.replay.config.holdout_fraction
        trainer.replay.add(load_labels(store, infos[eid], keys, trainer.replay.config.authorization) for eid in new_ids
                           if not held_out(eid, infos[eid].start.split, frac))
        trainer.iteration, trainer.beta = it + 1, beta
        promoter = self._promoter(env_eval)
        if promoter is not None:
            promoter.before_fit(trainer.student)
        fit = trainer.fit(log_path=self.out / "loss.jsonl", progress=progress, info={"beta": beta})
        promotion = promoter.judge(trainer.student, {"iteration": it}) if promoter is not None else None
        if promotion is not None:
            log.info("iteration %d: %s: %s", it, "promoted" if promotion["promoted"] else "kept the acting student",
                     promotion["reason"])
        if after_fit is not None:
            after_fit()
        if self.executor is not None and self.executor.kind != "local":
            ev = self.executor.evaluate(trainer.student, self.cfg.task, self.cfg.eval)  # id or file, as given
        else:
            ev = closed_loop(trainer.student, env_eval, self.cfg.eval)
        recover = self._recoverability(trainer.student, mapping, env_eval, ev.pop("per_episode"))
        row = {
            "iteration": it, "mode": self.cfg.mode, "beta": beta, "policy_version": trainer.student.version,
            "collected_with": collect.pop("policy_versions", None),
            **collect, "replay": trainer.replay.summary(), "train": fit,
            "promotion": promotion,
            "eval_success_rate": ev["success_rate"], "eval_episode_length": ev["episode_length_mean"],
            "eval": ev, "recoverability": recover, "rss_mb": _rss_mb(),
        }
        if dataset is not None:
            row["dataset"] = dataset.ref
            record_training(self.out / "datasets", dataset, trainer.student.version, str(self.checkpoint_path))
        line = json.dumps(row, default=str)
        # the checkpoint carries its own metrics line: a kill between the two writes loses no point of the curve
        trainer.save(self.checkpoint_path, metrics_line=line)
        with open(self.metrics_path, "a") as f:
            f.write(line + "\n")
        log.info("iteration %d: beta %.3f labels %d eval success %.0f%% (policy %s)", it, beta, len(trainer.replay),
                 100 * ev["success_rate"], trainer.student.version)
        if recover and recover["probed"]:
            log.info("iteration %d: the expert recovers %d of %d failed evaluation episodes from the student's "
                     "first-failure step", it, recover["recovered"], recover["probed"])
        if self.on_round is not None:
            self.on_round(row)
        return row

    def _promoter(self, env_eval):
        """The promotion rule's state for this run (None when off): the held-out evaluation on its own seeds."""
        if not self.cfg.promoting:
            return None
        if getattr(self, "_promotion", None) is None:
            pc = self.cfg.promotion
            held = EvalConfig(episodes=pc.episodes, num_envs=pc.num_envs, seed=pc.seed, max_steps=self.cfg.eval.max_steps)

            def evaluate(student):
                if env_eval is None or (self.executor is not None and self.executor.kind != "local"):
                    return self.executor.evaluate(student, self.cfg.task, held)
                return closed_loop(student, env_eval, held)

            self._promotion = Promoter(evaluate, pc.confidence)
        return self._promotion

    def _recoverability(self, student, mapping, env_eval, episodes) -> dict[str, Any] | None:
        """The round's expert recoverability (learn.evaluate.recoverability) on the evaluation env, or None when off."""
        n = self.cfg.recoverability_episodes
        if not n or env_eval is None:
            return None
        if self._probe_expert is None:
            self._probe_expert = build_expert(self.cfg.expert, mapping, relabel=False)
        return recoverability(student, self._probe_expert, env_eval, episodes, max_episodes=n,
                              limit=self.cfg.eval.max_steps, safety=self.cfg.safety)

    def _dataset_version(self, it: int):
        """dataset_v(N+1) of this run's store after iteration ``it``'s episodes are committed (None when off)."""
        if not self.cfg.dataset_versions:
            return None
        task = load_mapping(self.cfg.task).task_id  # the task id, also where the task is a task file of the user's
        cfg = DatasetConfig(selection=SelectionConfig(task=task, rule=self.cfg.replay.authorization))
        manifest, _ = build(task, [self.store_url], root=self.out / "datasets", config=cfg,
                            author=f"auto iteration {it}")
        return manifest

    # -------------------------------------------------------------- run

    def run(self, *, resume: bool = False, progress: bool = True) -> list[dict[str, Any]]:
        # torch deferred: seconds to import; only the code that runs a model loads it
        import torch

        cfg = self.cfg
        if not resume and self.checkpoint_path.exists():
            raise ConfigError(f"{self.out}: already holds a run ({self.checkpoint_path.name}); pass --resume to "
                              f"continue it or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        mapping = load_mapping(cfg.task)
        store = self._open_store()
        trainer = self._trainer(mapping, store, resume)
        start = trainer.iteration
        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.train.threads)
        rows: list[dict[str, Any]] = []
        try:
            with make_env(mapping, num_envs=min(cfg.eval.num_envs, cfg.eval.episodes), seed=cfg.eval.seed) as env_eval:
                if cfg.mode == CollectionMode.DAGGER_ASYNC and (self.executor is None or self.executor.kind == "local"):
                    rows = self._run_async(start, trainer, store, mapping, env_eval, progress)
                else:
                    rows = self._run_sync(start, trainer, store, mapping, env_eval, progress)
        finally:
            torch.set_num_threads(threads)
        return rows

    def _run_sync(self, start, trainer, store, mapping, env_eval, progress) -> list[dict[str, Any]]:
        """Rounds through the executor: round ``it`` collects episodes seeded reset_seed(cfg, it) + k.

        dagger_async here (a Ray executor) is pipelined: round it + 1 is submitted with the policy of round it
        before round it trains, so the workers collect while the driver trains, with a staleness of one round."""
        cfg = self.cfg
        ex = self.executor if self.executor is not None else LocalExecutor()
        pipelined = cfg.mode == CollectionMode.DAGGER_ASYNC
        rows = []
        ahead = None
        try:
            for it in range(start, cfg.iterations):
                beta = cfg.beta_at(it)
                rss0 = _rss_mb()
                if cfg.mode == CollectionMode.HUMAN_GATED and not cfg.demo_round(it):
                    ids, collect, infos = self._gated_round(ex, it, trainer, store, mapping, progress)
                    collect.update(rss_growth_mb=_rss_mb() - rss0, executor=ex.describe(), staleness_rounds=0)
                    rows.append(self._learn(it, beta, trainer, store, mapping, ids, collect, env_eval, progress,
                                            infos=infos))
                    continue
                seeds = [reset_seed(cfg, it) + k for k in range(cfg.episodes_per_iteration)]
                if ahead is None:
                    demo = cfg.model_copy(update={"mode": "expert_demo"}) if cfg.demo_round(it) else cfg
                    ahead = ex.collect(demo, self.store_url, trainer.student, iteration=it, beta=beta, seeds=seeds,
                                       progress=progress)
                round_ = ahead.result()
                ahead = None
                if pipelined and it + 1 < cfg.iterations:  # the next round starts now, with this round's policy
                    ahead = ex.collect(cfg, self.store_url, trainer.student, iteration=it + 1,
                                       beta=cfg.beta_at(it + 1), policy_iteration=it,
                                       seeds=[reset_seed(cfg, it + 1) + k for k in range(cfg.episodes_per_iteration)])
                stats = round_.stats
                collect = stats.summary()
                if cfg.demo_round(it):  # a person demonstrating would have driven every step of every episode
                    collect.update(operator_s=stats.steps * mapping.dt, context_switches=len(stats.episode_ids),
                                   windows=len(stats.episode_ids), intervention_rate=1.0)
                staleness = 1 if pipelined and it > start else 0
                collect.update(recorder=round_.recorder, rss_growth_mb=_rss_mb() - rss0,
                               policy_versions=round_.policy_versions, executor=ex.describe(),
                               staleness_rounds=staleness, worker_failures=round_.failures)
                rows.append(self._learn(it, beta, trainer, store, mapping, round_.episode_ids, collect, env_eval,
                                        progress))
            if ahead is not None:
                ahead.result()
        finally:
            if self.executor is None:
                ex.close()
        return rows

    def _gated_round(self, ex, it, trainer, store, mapping, progress) -> tuple[list[str], dict[str, Any], dict]:
        """Iteration ``it`` of mode human_gated: `hg-dagger run` with the current student (a Session per
        executor worker, the confidence gate calibrated on it first when the run config asks)."""
        lost = len(ex.failures)
        path = self.out / "student_acting.pt"  # what the sessions load: one file, no live model shared
        trainer.student.save(path)
        t0 = time.perf_counter()
        summary = ex.run_gated(self.cfg.gated_round(it), self.store_url, student_path=str(path), progress=progress)
        infos = _wait_complete(store, summary.episode_ids)
        collect = {
            "episodes": summary.episodes, "env_steps": summary.steps, "seconds": time.perf_counter() - t0,
            "collect_success_rate": summary.successes / summary.episodes if summary.episodes else None,
            "intervention_rate": summary.human_steps / summary.steps if summary.steps else 0.0,
            "human_steps": summary.human_steps, "windows": summary.windows,
            "context_switches": summary.context_switches, "gate_triggers": summary.gate_triggers,
            "operator_s": operator_seconds(store, (infos[e] for e in summary.episode_ids), mapping.dt), "safety_clamps": summary.safety_clamps,
            "estops": summary.estops, "policy_versions": [trainer.student.version], "notes": summary.notes,
            "worker_failures": ex.failures[lost:],
        }
        return summary.episode_ids, collect, infos

    def _run_async(self, start, trainer, store, mapping, env_eval, progress) -> list[dict[str, Any]]:
        cfg = self.cfg
        snapshot = self.out / "snapshot.pt"
        trainer.student.save(snapshot, iteration=start, beta=cfg.beta_at(start))
        ctx = mp.get_context("spawn")
        messages = ctx.Queue()
        stop = ctx.Event()
        worker = ctx.Process(target=async_worker, name="hg-dagger-sim",
                             args=(cfg.model_dump(by_alias=True), self.store_url, str(snapshot), messages, stop))
        worker.start()
        rows = []
        pending: list[str] = []
        per_ep: dict[str, dict] = {}
        worker_stats: dict[str, Any] = {}
        try:
            for it in range(start, cfg.iterations):
                beta = cfg.beta_at(it)
                rss0 = _rss_mb()
                t0 = time.perf_counter()
                deadline = time.monotonic() + cfg.async_.start_timeout_s + 60.0 * cfg.episodes_per_iteration
                while len(pending) < cfg.episodes_per_iteration:
                    if not worker.is_alive():
                        raise HgDaggerError(f"dagger_async: simulation process exited with code {worker.exitcode} "
                                            f"before iteration {it} had {cfg.episodes_per_iteration} episodes")
                    try:
                        message: WorkerMessage = messages.get(timeout=1.0)
                    except queue.Empty:
                        if time.monotonic() > deadline:
                            raise HgDaggerError(f"dagger_async: no episodes from the simulation process for iteration {it}") from None
                        continue
                    match message:
                        case EpisodeCollected(info=info):
                            pending.append(info["episode_id"])
                            per_ep[info["episode_id"]] = info
                        case CollectorStats(summary=summary):
                            worker_stats = summary
                        case WorkerFailed(error=error):
                            raise HgDaggerError(f"dagger_async: simulation process failed: {error}")
                take, pending = pending[: cfg.episodes_per_iteration], pending[cfg.episodes_per_iteration:]
                eps = [per_ep.pop(e) for e in take]
                collect = {
                    "episodes": len(take), "wait_s": time.perf_counter() - t0,
                    "collect_success_rate": float(np.mean([e["success"] for e in eps])),
                    "collect_episode_length": float(np.mean([e["length"] for e in eps])),
                    "policy_versions": sorted({e["policy_version"] for e in eps}),
                    "snapshot_lag_iterations": float(np.mean([it - e["iteration"] for e in eps])),
                    "worker": worker_stats, "rss_growth_mb": _rss_mb() - rss0,
                }
                def hand_off(it=it):  # the only way a policy reaches the simulation process
                    trainer.student.save(snapshot, iteration=it + 1, beta=cfg.beta_at(it + 1))

                rows.append(self._learn(it, beta, trainer, store, mapping, take, collect, env_eval, progress,
                                        after_fit=hand_off))
        finally:
            stop.set()
            _drain_and_join(worker, messages, cfg.async_.join_timeout_s)
        return rows


def _wait_complete(store, ids: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """EpisodeInfo of each id once its commit is visible (the async writer may still be finishing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if hasattr(store, "refresh"):
            store.refresh()
        infos = {i.episode_id: i for i in store.episodes()}
        missing = [e for e in ids if e not in infos or not infos[e].complete]
        if not missing:
            return infos
        if time.monotonic() > deadline:
            raise HgDaggerError(f"episodes {missing[:3]} (of {len(missing)}) never became complete in the store")
        time.sleep(0.05)


def _drain_and_join(proc, messages, timeout_s: float) -> None:
    """Join the simulation process; its queue must be emptied first or its feeder thread blocks exit."""
    deadline = time.monotonic() + timeout_s
    while proc.is_alive() and time.monotonic() < deadline:
        try:
            while True:
                messages.get_nowait()
        except queue.Empty:
            pass
        proc.join(0.1)
    if proc.is_alive():
        proc.terminate()
        proc.join(5.0)
        raise HgDaggerError(f"dagger_async: simulation process did not stop within {timeout_s:g} s; terminated it")
    messages.close()
    messages.join_thread()


def leftover_workers() -> list[str]:
    """Live child processes and helper threads (for shutdown checks).

    Interpreter-wide helpers are not counted: Python's multiprocessing resource tracker (started with
    the first spawned child) and zarr's I/O event loop and its executor threads (started with the first
    store access) and tqdm's progress-bar monitor; they live as long as the interpreter, whatever we start
    or stop.
    """
    kids = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.Error:
            continue
        kids.append(f"process {p.pid} {p.name()}")
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
               and not (t.name in ("zarr_io", "tqdm_monitor") or t.name.startswith("asyncio_"))]
    return kids + [f"thread {t}" for t in threads]
