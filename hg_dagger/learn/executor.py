"""Where episodes run: in this process (``local``) or on N env-worker actors on Ray (``ray``).

Both executors take the same calls, each over an explicit list of episode seeds, so where a run ran
does not change what it recorded:

    collect(cfg, store_url, student, iteration=, beta=, seeds=)   one round of `auto` collection
    evaluate(student, task, eval_cfg)                             closed-loop student-only episodes
    replay(store_url, episode_ids)                                replay verdicts (the caller writes them)
    run_gated(cfg, store_url, student_path=)                      `run` with the synthetic/expert operator

Ray design (docs/scaling.md): every worker is an actor with its own simulator (``num_envs`` rows, the
same batch width as a local run, so a student's batched answers are bit-for-bit the same), its own
expert and its own recorder, hence its own store segments; the trainer stays in the driver. A policy
reaches the workers only as checkpoint bytes put once per version in Ray's object store (``PolicySnapshot``);
a worker reloads only when the version changes. Every episode records the acting policy version
(EpisodeStart.policy_version) and in EpisodeStart.extra the executor, worker, job, episode_index,
policy_iteration and staleness_rounds. A worker that dies loses only its unfinished episodes: they stay
incomplete in the store, the ones it committed are kept, and the rest of its share is run again with the
same seeds on a fresh worker.

Nothing here imports ray until a ``RayExecutor`` is made (``--executor ray``).
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from hg_dagger.errors import ConfigError
from hg_dagger.learn.evaluate import summarize
from hg_dagger.learn.executor_ray import RayExecutor
from hg_dagger.learn.executor_worker import (  # noqa: F401 - importable from here
    CollectResult,
    EnvWorker,
    PolicySnapshot,
    episode_seeds,
    job_id,
    merge_stats,
    shares,
)

log = logging.getLogger(__name__)

KINDS = ("local", "ray")


# ---------------------------------------------------------------------- CLI options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--executor, --workers and --address, the same for auto, run, eval and replay."""
    g = parser.add_argument_group("executor")
    g.add_argument("--executor", choices=KINDS, default="local",
                   help="where episodes run: this process (local) or N env-worker actors on Ray (ray)")
    g.add_argument("--workers", type=int, default=2, help="env workers for --executor ray (default 2)")
    g.add_argument("--address", help="an existing Ray cluster (e.g. ray://head:10001 or auto); default: start a "
                   "local one sized for this machine")


def from_args(args: argparse.Namespace):
    """The executor the CLI options name (a context manager: closing it stops the workers)."""
    return make_executor(getattr(args, "executor", "local"), workers=getattr(args, "workers", 2),
                         address=getattr(args, "address", None))


def make_executor(kind: str = "local", *, workers: int = 2, address: str | None = None):
    if kind == "local":
        if address:
            raise ConfigError("--address is for --executor ray")
        return LocalExecutor()
    if kind == "ray":
        return RayExecutor(workers=workers, address=address)
    raise ConfigError(f"unknown executor {kind!r}: choose one of {', '.join(KINDS)}")


# ---------------------------------------------------------------------- local


class LocalExecutor:
    """Everything in this process: one EnvWorker whose simulator has ``num_envs`` rows."""

    kind = "local"
    workers = 1

    def __init__(self):
        self._worker = EnvWorker(0, "local")
        self.failures: list[dict[str, Any]] = []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "workers": 1}

    def collect(self, cfg, store_url: str, student, *, iteration: int, beta: float, seeds: list[int],
                policy_iteration: int | None = None, job: str = "", progress: bool = False):
        return _Done(self.collect_now(cfg, store_url, student, iteration=iteration, beta=beta, seeds=seeds,
                                      policy_iteration=policy_iteration, job=job, progress=progress))

    def collect_now(self, cfg, store_url, student, *, iteration, beta, seeds, policy_iteration=None, job="",
                    progress=False) -> CollectResult:
        t0 = time.perf_counter()
        pi = iteration if policy_iteration is None else policy_iteration
        out = self._worker.collect(cfg, store_url, student, {
            "iteration": iteration, "beta": beta, "seeds": list(seeds), "indices": list(range(len(seeds))),
            "job": job or job_id(iteration), "policy_iteration": pi}, progress=progress)
        stats = out["stats"]
        stats.seconds = time.perf_counter() - t0
        return CollectResult(stats, sorted(out["episodes"], key=lambda e: e["index"]), out["recorder"],
                             policy_versions=[out["policy_version"]])

    def evaluate(self, student, task: str, eval_cfg) -> dict[str, Any]:
        n = min(eval_cfg.num_envs, eval_cfg.episodes)
        seeds = episode_seeds(eval_cfg.seed, eval_cfg.episodes)
        out = self._worker.evaluate(task, student, eval_cfg, seeds, n)
        return summarize(out["episodes"], steps=out["steps"])

    def replay(self, store_url: str, episode_ids: list[str], progress: bool = False) -> list:
        return self._worker.replay(store_url, list(episode_ids))

    def run_gated(self, cfg, store_url: str, *, student_path: str | None = None, progress: bool = True):
        # deferred: it loads the operators, the run config, the session and zarr; the CLI imports this module for every command (tests/learn/test_eval.py)
        from hg_dagger.control.build import run_gated

        return run_gated(cfg, store_url, student_path=student_path, progress=progress)

    def close(self) -> None:
        self._worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Done:
    """A collect that already happened (the local executor); ``result()`` as for a Ray collect."""

    def __init__(self, result: CollectResult):
        self._result = result

    def result(self) -> CollectResult:
        return self._result

