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
reaches the workers only as checkpoint bytes put once per version in Ray's object store (``Snapshot``);
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
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hg_dagger.errors import ConfigError, HgDaggerError

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


# ---------------------------------------------------------------------- what crosses process boundaries


@dataclass(frozen=True)
class Snapshot:
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
    from hg_dagger.learn.auto import CollectStats

    out = CollectStats()
    for p in parts:
        for f in fields(CollectStats):
            a, b = getattr(out, f.name), getattr(p, f.name)
            if isinstance(a, list):
                a.extend(b)
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
            import torch

            torch.set_num_threads(1)  # one core per worker; the trainer keeps the driver's
        self._env = None
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
        from hg_dagger.envs import make_env

        key = (mapping.task_id, mapping.hash, int(num_envs), int(seed))
        if key != self._env_key:
            self.close()
            self._env, self._env_key = make_env(mapping, num_envs=num_envs, seed=seed), key
        return self._env

    def _student_for(self, snap, mapping):
        """The acting student: a live one (local executor) or loaded once per version from snapshot bytes."""
        if not isinstance(snap, Snapshot):
            return snap
        if self._student is not None and self._student.version == snap.version:
            return self._student
        from hg_dagger.policy.checkpoint import load_student

        data = snap.data
        if isinstance(data, list):
            import ray

            data = ray.get(data[0])
        self._student = load_student(data, mapping)
        return self._student

    def collect(self, cfg, store_url: str, snap, job: dict[str, Any], progress: bool = False) -> dict[str, Any]:
        """Collect the episodes ``job["seeds"]`` into the store; committed when this returns."""
        from hg_dagger.envs import load_mapping
        from hg_dagger.learn.auto import Collector, _rec_stats, build_expert
        from hg_dagger.store import EpisodeStore

        cpu0 = time.process_time()
        mapping = load_mapping(cfg.task)
        key = (cfg.task, cfg.expert.model_dump_json(), cfg.mode)
        if key != self._expert_key:
            self._expert = build_expert(cfg.expert, mapping, relabel=cfg.mode != "expert_demo")
            self._expert_key = key
        env = self._env_for(mapping, cfg.num_envs, cfg.seed)
        student = self._student_for(snap, mapping)
        store = EpisodeStore.open(store_url, mode="a")
        rec = store.recorder(flush_interval_s=cfg.recorder_flush_s, queue_steps=cfg.recorder_queue_steps)
        it = int(job["iteration"])
        collector = Collector(env, self._expert, rec, mode=cfg.mode, seed=cfg.seed * 1000 + it,
                              expert_timeout_s=cfg.expert.timeout_s, max_episode_steps=cfg.max_episode_steps,
                              certify=cfg.certification == "planner_auto")
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
        return {"stats": stats, "episodes": episodes, "recorder": _rec_stats(rec), "policy_version": student.version,
                "cpu_s": time.process_time() - cpu0}

    def evaluate(self, task: str, snap, eval_cfg, seeds: list[int], num_envs: int) -> dict[str, Any]:
        """Closed-loop episodes from ``seeds`` in an env of ``num_envs`` rows: (per-episode dicts, env steps)."""
        from hg_dagger.envs import load_mapping
        from hg_dagger.learn.evaluate import closed_loop

        mapping = load_mapping(task)
        student = self._student_for(snap, mapping)
        env = self._env_for(mapping, num_envs, eval_cfg.seed)
        res = closed_loop(student, env, eval_cfg.model_copy(update={"episodes": len(seeds)}), seeds=seeds)
        return {"episodes": res["per_episode"], "steps": res["env_steps"]}

    def replay(self, store_url: str, episode_ids: list[str]) -> list:
        from hg_dagger.review.replay import replay_episode
        from hg_dagger.store import EpisodeStore

        store = EpisodeStore.open(store_url, mode="r")
        return [replay_episode(store, e) for e in episode_ids]

    def run_gated(self, cfg, store_url: str, student: bytes | None, extra: dict[str, Any]) -> dict[str, Any]:
        from hg_dagger.control.build import run_gated

        extra = {**extra, "executor": self.kind, "worker": self.index, "worker_pid": os.getpid()}
        if student is None:
            return run_gated(cfg, store_url, progress=False, extra=extra).as_dict()
        with tempfile.TemporaryDirectory(prefix="hg-dagger-worker-") as tmp:
            path = Path(tmp) / "student.pt"
            path.write_bytes(student)
            return run_gated(cfg, store_url, student_path=str(path), progress=False, extra=extra).as_dict()


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
            "job": job or _job_id(iteration), "policy_iteration": pi}, progress=progress)
        stats = out["stats"]
        stats.seconds = time.perf_counter() - t0
        return CollectResult(stats, sorted(out["episodes"], key=lambda e: e["index"]), out["recorder"],
                             policy_versions=[out["policy_version"]])

    def evaluate(self, student, task: str, eval_cfg) -> dict[str, Any]:
        from hg_dagger.learn.evaluate import summarize

        n = min(eval_cfg.num_envs, eval_cfg.episodes)
        seeds = episode_seeds(eval_cfg.seed, eval_cfg.episodes)
        out = self._worker.evaluate(task, student, eval_cfg, seeds, n)
        return summarize(out["episodes"], steps=out["steps"])

    def replay(self, store_url: str, episode_ids: list[str], progress: bool = False) -> list:
        return self._worker.replay(store_url, list(episode_ids))

    def run_gated(self, cfg, store_url: str, *, student_path: str | None = None, progress: bool = True):
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


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse an unreachable HOST:PORT at once: Ray itself retries a missing head for minutes."""
    import socket

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise HgDaggerError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc})") from None


def _job_id(iteration: int) -> str:
    return f"{uuid.uuid4().hex[:12]}-it{int(iteration)}"


# ---------------------------------------------------------------------- Ray


class RayExecutor:
    """N env-worker actors on Ray (a local ``ray.init`` by default, or the cluster at ``address``)."""

    kind = "ray"

    def __init__(self, workers: int = 2, address: str | None = None, *, start_timeout_s: float = 300.0):
        if int(workers) < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
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
            quiet = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
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
        self._snap: Snapshot | None = None

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

    def _snapshot(self, student) -> Snapshot:
        """Checkpoint bytes in the object store, once per policy version: what every worker loads."""
        if self._snap is None or self._snap.version != student.version:
            from hg_dagger.policy.checkpoint import snapshot_bytes

            self._snap = Snapshot(student.version, [self._ray.put(snapshot_bytes(student))])
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
        job = job or _job_id(iteration)
        snap = self._snapshot(student)
        calls = [("collect", (cfg, str(store_url), snap, {
            "iteration": iteration, "beta": beta, "seeds": [seeds[k] for k in idx], "indices": idx, "job": job,
            "policy_iteration": pi})) for idx in shares(len(seeds), cfg.num_envs, self.workers)]
        return _RayCollect(self, calls, store_url, job, time.perf_counter())

    def evaluate(self, student, task: str, eval_cfg) -> dict[str, Any]:
        from hg_dagger.learn.evaluate import summarize

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
        job = _job_id(0)
        k = min(self.workers, cfg.episodes)
        sizes = [cfg.episodes // k + (i < cfg.episodes % k) for i in range(k)]
        calls, offset = [], 0
        for size in sizes:
            part = cfg.model_copy(update={"episodes": size, "seed": cfg.seed + offset})
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
    import numpy as np

    from hg_dagger.contract.enums import INTERVENTION_SOURCES

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
