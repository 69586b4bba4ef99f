"""The Ray executor (``--executor ray``, docs/scaling.md): N env-worker actors, each with its own simulator,
expert and recorder; the trainer stays in the driver. Nothing here imports ray until a RayExecutor is made."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from hg_dagger.contract.enums import INTERVENTION_SOURCES
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.learn.evaluate import summarize
from hg_dagger.learn.executor_worker import (
    CollectResult,
    EnvWorker,
    PolicySnapshot,
    episode_seeds,
    job_id,
    merge_stats,
    shares,
)

log = logging.getLogger(__name__)


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse an unreachable HOST:PORT at once: Ray itself retries a missing head for minutes."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise HgDaggerError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc})") from None


# ---------------------------------------------------------------------- Ray


class RayExecutor:
    """N env-worker actors on Ray (a local ``ray.init`` by default, or the cluster at ``address``)."""

    kind = "ray"

    def __init__(self, workers: int = 2, address: str | None = None, *, start_timeout_s: float = 300.0):
        if int(workers) < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        # Ray's usage statistics stay off unless the user turned them on (read by ray.init from the environment)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install 'hg-dagger[ray]'") from None
        self._ray = ray
        self.workers = int(workers)
        self.address = address
        self.start_timeout_s = float(start_timeout_s)
        self.failures: list[dict[str, Any]] = []
        self._owns = False
        if not ray.is_initialized():
            quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
            if address:
                _reachable(address)
            try:
                if address:
                    ray.init(address=address, **quiet)
                else:  # sized for this machine: one CPU slot per worker at least, no dashboard, a small object store
                    ray.init(num_cpus=max(self.workers, os.cpu_count() or 1), include_dashboard=False,
                             object_store_memory=256 << 20, **quiet)
            except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; one line for the person
                raise HgDaggerError(f"Ray could not start{f' at {address}' if address else ''}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
            self._owns = True
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(EnvWorker)
        self._next = 0
        self._actors: list = []
        self.pids: list[int] = []
        try:
            self._actors = [self._spawn() for _ in range(self.workers)]
            self.pids = self._get([a.pid.remote() for a in self._actors], timeout=self.start_timeout_s,
                                  what=f"{self.workers} Ray env workers to start")
        except BaseException:
            self.close()
            raise
        self._snap: PolicySnapshot | None = None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "workers": self.workers, "address": self.address or "local",
                "failures": len(self.failures)}

    # -------------------------------------------------------------- plumbing

    def _spawn(self):
        actor = self._actor_cls.remote(self._next, "ray")
        self._next += 1
        return actor

    def _get(self, refs, *, timeout: float | None = None, what: str = "Ray"):
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise HgDaggerError(f"timed out after {timeout:g} s waiting for {what}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, HgDaggerError):
                raise cause from None
            raise HgDaggerError(f"a Ray env worker failed: {str(cause or exc).splitlines()[0]}") from None

    def _replace(self, slot: int, what: str, exc: BaseException) -> None:
        """A worker died: record it and put a fresh actor in its slot."""
        old = self._actors[slot]
        pid = self.pids[slot] if slot < len(self.pids) else None
        self.failures.append({"worker_slot": slot, "pid": pid, "during": what,
                              "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
        log.warning("ray env worker %s (pid %s) died during %s; starting a replacement", slot, pid, what)
        try:
            self._ray.kill(old)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._actors[slot] = self._spawn()
        self.pids[slot] = self._get(self._actors[slot].pid.remote(), timeout=self.start_timeout_s,
                                    what="a replacement Ray env worker")

    def _is_lost(self, exc: BaseException) -> bool:
        ex = self._ray.exceptions
        return isinstance(exc, ex.RayActorError | ex.ActorDiedError | ex.ActorUnavailableError)

    def _snapshot(self, student) -> PolicySnapshot:
        """Checkpoint bytes in the object store, once per policy version: what every worker loads."""
        if self._snap is None or self._snap.version != student.version:
            # deferred: policy.checkpoint imports torch; the CLI lists its commands without it
            from hg_dagger.policy.checkpoint import snapshot_bytes

            self._snap = PolicySnapshot(student.version, [self._ray.put(snapshot_bytes(student))])
        return self._snap

    def _fan_out(self, calls: list[tuple[str, tuple]], *, what: str, on_lost=None) -> list:
        """Run ``calls`` (method, args) round-robin over the workers, all submitted at once (each actor runs its
        share in order); a call whose worker died goes again on the replacement, after ``on_lost(i, args)``
        may rewrite it (None: nothing left to run; a list: several calls, whose results are appended)."""
        ray = self._ray
        results: list = [None] * len(calls)
        running: dict = {}

        def submit(i: int, name: str, args: tuple) -> None:
            slot = i % len(self._actors)
            actor = self._actors[slot]
            running[getattr(actor, name).remote(*args)] = (i, slot, actor, name, args)

        for i, (name, args) in enumerate(calls):
            submit(i, name, args)
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            i, slot, actor, name, args = running.pop(ref)
            try:
                results[i] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - sorted below
                if not self._is_lost(exc):
                    for r in running:
                        try:
                            ray.cancel(r)
                        except Exception:  # noqa: BLE001 - already finished
                            pass
                    self._get(ref, what=what)  # raises the worker's own error as one line
                    raise
                if self._actors[slot] is actor:  # several calls queued on one dead worker: replace it once
                    self._replace(slot, what, exc)
                retry = on_lost(i, args) if on_lost is not None else args
                if isinstance(retry, list):
                    for again in retry:
                        results.append(None)
                        submit(len(results) - 1, name, again)
                elif retry is not None:
                    submit(i, name, retry)
        return results

    # -------------------------------------------------------------- the four calls

    def collect(self, cfg, store_url: str, student, *, iteration: int, beta: float, seeds: list[int],
                policy_iteration: int | None = None, job: str = "", progress: bool = False) -> _RayCollect:
        """Submit one round now (workers start at once); ``.result()`` waits for it."""
        pi = iteration if policy_iteration is None else policy_iteration
        job = job or job_id(iteration)
        snap = self._snapshot(student)
        calls = [("collect", (cfg, str(store_url), snap, {
            "iteration": iteration, "beta": beta, "seeds": [seeds[k] for k in idx], "indices": idx, "job": job,
            "policy_iteration": pi})) for idx in shares(len(seeds), cfg.num_envs, self.workers)]
        return _RayCollect(self, calls, store_url, job, time.perf_counter())

    def evaluate(self, student, task: str, eval_cfg) -> dict[str, Any]:
        snap = self._snapshot(student)
        n = min(eval_cfg.num_envs, eval_cfg.episodes)  # the local batch width: same answers as local
        seeds = episode_seeds(eval_cfg.seed, eval_cfg.episodes)
        split = shares(len(seeds), n, self.workers)
        calls = [("evaluate", (task, snap, eval_cfg, [seeds[k] for k in idx], n)) for idx in split]
        parts = self._fan_out(calls, what="evaluation")
        episodes, steps = [], 0
        for idx, part in zip(split, parts, strict=True):
            for e in part["episodes"]:  # closed_loop numbers the episodes of its share 0, 1, ...
                e["index"] = idx[e["index"]]
            episodes.extend(part["episodes"])
            steps += part["steps"]
        return summarize(sorted(episodes, key=lambda e: e["index"]), steps=steps)

    def replay(self, store_url: str, episode_ids: list[str], progress: bool = False) -> list:
        ids = list(episode_ids)
        per = max(1, -(-len(ids) // (4 * self.workers)))
        calls = [("replay", (str(store_url), ids[s:s + per])) for s in range(0, len(ids), per)]
        return [c for part in self._fan_out(calls, what="replay") for c in part]

    def run_gated(self, cfg, store_url: str, *, student_path: str | None = None, progress: bool = True):
        """The run's episodes in contiguous seed blocks, one per worker (episode k keeps seed cfg.seed + k)."""
        # deferred: it loads the operators, the run config, the session and zarr; the CLI imports this module for every command (tests/learn/test_eval.py)
        from hg_dagger.control.session import RunSummary
        from hg_dagger.store import EpisodeStore

        if cfg.robot is not None:
            raise ConfigError("--executor ray runs simulated envs only: a robot run (--robot) is one robot; "
                              "use --executor local")
        url = str(store_url)
        try:  # one creator before the workers open it
            EpisodeStore.open(url, mode="a")
        except HgDaggerError:
            if Path(url).exists() and any(Path(url).iterdir()):
                raise
            EpisodeStore.create(url)
        student = Path(student_path).read_bytes() if student_path else None
        job = job_id(0)
        k = min(self.workers, cfg.episodes)
        sizes = [cfg.episodes // k + (i < cfg.episodes % k) for i in range(k)]
        calls, offset = [], 0
        for size in sizes:
            # a window cap is the run's: each worker's share of it is its share of the episodes
            windows = None if cfg.windows is None else max(1, -(-cfg.windows * size // cfg.episodes))
            part = cfg.model_copy(update={"episodes": size, "seed": cfg.seed + offset, "windows": windows})
            calls.append(("run_gated", (part, url, student, {"job": job, "episode_offset": offset})))
            offset += size

        def lost(i, args):
            """Keep what the dead worker committed (the store says which seeds), run the other seeds again: each
            contiguous range of them is a session of its own (its confidence gate calibrated afresh)."""
            part, _, _, extra = args
            block = range(part.seed, part.seed + part.episodes)
            store = EpisodeStore.open(url, mode="r")
            kept = [e for e in store.episodes() if e.complete and e.start.extra.get("job") == job
                    and e.start.initial_state.get("seed") in block]
            adopted.append(_run_summary_of(store, kept))
            done = {e.start.initial_state["seed"] for e in kept}
            ranges: list[list[int]] = []
            for seed in (s for s in block if s not in done):
                if ranges and ranges[-1][-1] == seed - 1:
                    ranges[-1].append(seed)
                else:
                    ranges.append([seed])
            notes.append(f"the worker running seeds {block.start}..{block.stop - 1} died; {len(kept)} committed "
                         f"episodes kept, seeds {', '.join(f'{r[0]}..{r[-1]}' for r in ranges) or 'none'} run again")
            return [(part.model_copy(update={"seed": r[0], "episodes": len(r)}), url, student,
                     {**extra, "episode_offset": extra["episode_offset"] + r[0] - part.seed}) for r in ranges]

        notes: list[str] = []
        adopted: list[dict] = []
        parts = self._fan_out(calls, what="run", on_lost=lost) + adopted
        total = RunSummary()
        for p in parts:
            if p is None:
                continue
            for f in fields(RunSummary):
                v = p.get(f.name)
                if v is None:
                    continue
                cur = getattr(total, f.name)
                if isinstance(cur, list):
                    cur.extend(v)
                elif isinstance(cur, str):
                    setattr(total, f.name, cur or v)
                else:
                    setattr(total, f.name, cur + v)
        total.notes.extend(notes)
        return total

    def close(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            for a in self._actors:
                try:
                    ray.get(a.close.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a dead worker has nothing to close
                    pass
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001
                    pass
        self._actors = []
        if self._owns and ray.is_initialized():
            ray.shutdown()
            self._owns = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run_summary_of(store, infos) -> dict[str, Any]:
    """RunSummary fields of committed episodes, read back from the store (a dead worker's own summary is lost)."""
    human = 0
    windows = 0
    for info in infos:
        src = store.read_steps(info.episode_id, ["action_source"])["action_source"]
        human += int(np.isin(src, INTERVENTION_SOURCES).sum())  # the operator's steps, as Session counts them
        windows += len(store.labels(info.episode_id).windows)
    return {"episodes": len(infos), "steps": sum(i.num_steps for i in infos),
            "successes": sum(bool(i.end.task_success) for i in infos), "windows": windows, "human_steps": human,
            "context_switches": windows, "episode_ids": [i.episode_id for i in infos]}


class _RayCollect:
    """A round in flight on the workers; ``result()`` waits, re-running a dead worker's unfinished episodes."""

    def __init__(self, ex: RayExecutor, calls: list, store_url: str, job: str, t0: float):
        self.ex, self.calls, self.store_url, self.job, self.t0 = ex, calls, str(store_url), job, t0
        self._results: list | None = None
        self._adopted: list[dict[str, Any]] = []
        self._fail0 = len(ex.failures)

    def _lost(self, i: int, args: tuple):
        """Keep what the dead worker committed (the store says which), run its other episodes again."""
        # deferred: store imports zarr; the CLI lists its commands without it
        from hg_dagger.store import EpisodeStore

        cfg, url, snap, job = args
        store = EpisodeStore.open(url, mode="r")
        mine = {}
        for info in store.episodes():
            x = info.start.extra
            if info.complete and x.get("job") == self.job and x.get("episode_index") in job["indices"]:
                pos = job["indices"].index(x["episode_index"])
                mine[pos] = {"episode_id": info.episode_id, "index": job["indices"][pos], "seed": job["seeds"][pos],
                             "length": info.num_steps, "success": bool(info.end.task_success),
                             "worker": x.get("worker")}
        self._adopted.extend(mine.values())
        rest = [p for p in range(len(job["indices"])) if p not in mine]
        if not rest:
            return None
        return (cfg, url, snap, {**job, "indices": [job["indices"][p] for p in rest],
                                 "seeds": [job["seeds"][p] for p in rest]})

    def result(self) -> CollectResult:
        if self._results is None:
            self._results = self.ex._fan_out(self.calls, what="collection", on_lost=self._lost)
        parts = [r for r in self._results if r is not None]
        stats = merge_stats([p["stats"] for p in parts])
        stats.seconds = time.perf_counter() - self.t0
        episodes = sorted([e for p in parts for e in p["episodes"]] + self._adopted, key=lambda e: e["index"])
        stats.episode_ids = [e["episode_id"] for e in episodes]
        stats.lengths = [e["length"] for e in episodes]
        stats.successes = [e["success"] for e in episodes]
        rec: dict[str, Any] = {}
        for p in parts:
            for k, v in p["recorder"].items():
                if isinstance(v, int | float):
                    rec[k] = rec.get(k, 0) + v
        return CollectResult(stats, episodes, rec, self.ex.failures[self._fail0:],
                             sorted({p["policy_version"] for p in parts} | {self.calls[0][1][2].version}),
                             worker_cpu_s=sum(p["cpu_s"] for p in parts))
