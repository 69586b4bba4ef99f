"""Executor throughput: one `auto` collection round in this process against the same round on 1 and 2 Ray workers.

    python benchmarks/bench_executor.py                     # toy_reach and fetch_pick_place, 3 repeats
    python benchmarks/bench_executor.py --quick             # toy_reach only, 1 repeat

Every executor collects the same round (same seeds, same episodes, student + planner expert with beta 0.5,
recorded into a zarr store); each Ray worker's simulator has --num-envs rows, like the local one; torch runs one
thread everywhere, as in `auto`. The baseline is
the local executor measured in the same run, alternating with the Ray runs. Start-up (Ray, actors, imports,
env construction) is outside the timed rounds: one untimed round warms every executor first. Env-steps/s is
recorded steps over the round's wall time in this process, so it includes the round trip, the snapshot
broadcast and the store commits. Env-steps per CPU-second counts this process and the workers' CPU time: on a
loaded machine, where wall time mostly measures the other jobs, it says what the executor itself costs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import record  # noqa: E402


def round_rate(ex, cfg, store_url: str, student, seeds: list[int], iteration: int) -> tuple[float, int, float, float]:
    """(env-steps per wall second, env-steps, wall seconds, env-steps per CPU second of this process + the workers)."""
    t0, c0 = time.perf_counter(), time.process_time()
    res = ex.collect(cfg, store_url, student, iteration=iteration, beta=0.5, seeds=seeds).result()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0 + res.worker_cpu_s
    return res.stats.steps / dt, res.stats.steps, dt, res.stats.steps / cpu


def bench_task(task: str, args) -> dict:
    from hg_dagger.envs import load_mapping
    from hg_dagger.learn.auto import AutoConfig
    from hg_dagger.learn.executor import LocalExecutor, RayExecutor
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    cfg = AutoConfig.model_validate({"task": task, "mode": "dagger_sync", "num_envs": args.num_envs, "seed": 0,
                                     "episodes_per_iteration": args.episodes, "max_episode_steps": args.max_steps,
                                     "student": {"ensemble": 3, "hidden": [64, 64]}, "recorder_flush_s": 0.5})
    mapping = load_mapping(task)
    student = Student.create(mapping, ensemble=3, hidden=(64, 64), seed=0)
    import ray

    executors = {"local": LocalExecutor()}
    t0 = time.perf_counter()
    # one local Ray for both executors (3 logical CPU slots: 1 + 2 workers; the machine's cores are shared)
    ray.init(num_cpus=3, include_dashboard=False, object_store_memory=128 << 20, logging_level=logging.ERROR,
             log_to_driver=False)
    ray_start = time.perf_counter() - t0
    executors["ray_1"] = RayExecutor(workers=1)
    executors["ray_2"] = RayExecutor(workers=2)
    rates: dict[str, list[float]] = {k: [] for k in executors}
    cpu_rates: dict[str, list[float]] = {k: [] for k in executors}
    steps = {}
    with tempfile.TemporaryDirectory(prefix="bench_executor_") as tmp:
        urls = {}
        for name in executors:
            urls[name] = str(Path(tmp) / name)
            EpisodeStore.create(urls[name])
        try:
            for name, ex in executors.items():  # warm-up: actors, imports, envs, the first snapshot
                round_rate(ex, cfg, urls[name], student, list(range(args.num_envs)), 0)
            for rep in range(args.reps):
                order = list(executors) if rep % 2 == 0 else list(reversed(executors))
                for name in order:
                    seeds = [1000 * (rep + 1) + k for k in range(args.episodes)]
                    r, n, dt, rc = round_rate(executors[name], cfg, urls[name], student, seeds, rep + 1)
                    rates[name].append(r)
                    cpu_rates[name].append(rc)
                    steps[name] = n
                    print(f"  {task} rep {rep} {name:6s} {n} env-steps in {dt:.2f} s: {r:,.0f} env-steps/s, "
                          f"{rc:,.0f} per CPU-second", flush=True)
        finally:
            for ex in reversed(list(executors.values())):
                ex.close()
            ray.shutdown()
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    cpu_med = {k: sorted(v)[len(v) // 2] for k, v in cpu_rates.items()}
    return {"task": task, "env_steps_per_round": steps, "rates": rates, "median": med, "cpu_rates": cpu_rates,
            "cpu_median": cpu_med,
            "ray_start_s": round(ray_start, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["toy_reach", "fetch_pick_place"])
    p.add_argument("--num-envs", type=int, default=4, help="simulator rows (per worker for Ray)")
    p.add_argument("--episodes", type=int, default=32, help="episodes per timed round")
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="toy_reach only, 1 repeat")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    if args.quick:
        args.tasks, args.reps = ["toy_reach"], 1
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(1)  # as `auto` collects (train.threads) and as each Ray worker runs
    load0 = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load0:.1f}; {args.episodes} episodes x <= {args.max_steps} steps per "
          f"round, {args.num_envs} rows per simulator")
    results = []
    for task in args.tasks:
        r = bench_task(task, args)
        results.append(r)
        m = r["median"]
        print(f"{task}: local {m['local']:,.0f} env-steps/s | ray 1 worker {m['ray_1']:,.0f} "
              f"({m['ray_1'] / m['local']:.2f}x) | ray 2 workers {m['ray_2']:,.0f} ({m['ray_2'] / m['local']:.2f}x, "
              f"{m['ray_2'] / m['ray_1']:.2f}x of 1 worker); ray.init {r['ray_start_s']} s")
        c = r["cpu_median"]
        print(f"{task} per CPU-second (this process + workers): local {c['local']:,.0f} | ray 1 worker "
              f"{c['ray_1']:,.0f} ({c['ray_1'] / c['local']:.2f}x) | ray 2 workers {c['ray_2']:,.0f} "
              f"({c['ray_2'] / c['local']:.2f}x)")
        record(f"executor {task}: ray 1 worker", m["ray_1"], unit="env-steps/s", baseline=m["local"],
               baseline_name="local executor")
        record(f"executor {task}: ray 2 workers", m["ray_2"], unit="env-steps/s", baseline=m["local"],
               baseline_name="local executor")
        record(f"executor {task}: ray 2 workers vs 1", m["ray_2"], unit="env-steps/s", baseline=m["ray_1"],
               baseline_name="ray 1 worker")
        record(f"executor {task}: ray 2 workers, per CPU-second", c["ray_2"], unit="env-steps/CPU-s",
               baseline=c["local"], baseline_name="local executor")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"load_start": load0, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
