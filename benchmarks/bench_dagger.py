"""DAgger benchmarks: (1) overhead of `auto` against bare expert-driven stepping, (2) DAgger vs BC learning curves.

    python benchmarks/bench_dagger.py --quick          # short overhead run + 6 small DAgger iterations, 12 BC
    python benchmarks/bench_dagger.py                  # the full comparison (tens of minutes on 2 cores)

(1) Same env, same num_envs, same process, alternating repeats: env-steps/s of the auto collector (student
    forward pass + expert query + beta mixing + recording into a zarr store) against a loop that only queries
    the expert and steps the env. Target: ratio >= 0.9. The collector is the rollout engine (control.engine)
    with beta mixing and the safety monitor of the task's run config, as every mode steps. The same collector
    with a policy that costs nothing (a zero action) separates its own cost from the student's.
(2) FetchPickAndPlace (state): `auto` in dagger_sync mode against expert_demo (behaviour cloning on expert-only
    demonstrations) with identical seeds, episodes per iteration and training steps, so both see the same number
    of expert labels per iteration. Student-only success after every iteration is printed for both.
Results are printed and written as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402


def bare_loop(env, expert, mapping, ticks: int) -> tuple[float, float]:
    """Env-steps per wall second and per process CPU second of stepping driven by the expert alone."""
    from hg_dagger.experts import query_expert

    n = env.num_envs
    ids = np.arange(n)
    obs, info = env.reset(seed=1)
    expert.reset(list(ids), obs, info)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(ticks):
        q = query_expert(expert, obs, ids, mapping)
        res = env.step(mapping.clip_raw(q.with_fallback(np.zeros((n, mapping.action_dim), np.float32))))
        done = np.flatnonzero(res.terminated | res.truncated)
        if len(done):
            expert.reset(done.tolist(), {k: v[done] for k, v in res.obs.items()}, res.info)
        obs = res.obs
    return ticks * n / (time.perf_counter() - t0), ticks * n / (time.process_time() - c0)


def auto_loop(env, expert, student, store, ticks: int) -> tuple[float, float, dict]:
    """Env-steps per wall second and per process CPU second (incl. the writer thread and the final drain)
    of the auto collector (student + expert + beta mixing + recorder) on the same env."""
    from hg_dagger.learn.auto import Collector

    rec = store.recorder(flush_interval_s=2.0, queue_steps=1 << 16)  # AutoConfig.recorder_flush_s default
    col = Collector(env, expert, rec, mode="dagger_sync", seed=0)
    col.set_policy(student, iteration=0, beta=0.5)
    count = {"t": 0}

    def on_tick(t, waiting):
        count["t"] = t

    c0 = time.process_time()
    stats = col.run(episodes=None, reset_seed=1, stop=lambda: count["t"] >= ticks, on_tick=on_tick)
    t_close = time.perf_counter()
    rec.close()
    drain_s = time.perf_counter() - t_close
    cpu_s = time.process_time() - c0
    summary = stats.summary()
    summary.update(drain_s=drain_s, dropped=rec.stats.dropped_steps)
    return stats.steps / stats.seconds, stats.steps / cpu_s, summary


def overhead(task: str, num_envs: int, ticks: int, repeats: int) -> dict:
    import torch

    from hg_dagger.envs import load_mapping, make_env
    from hg_dagger.experts import make_expert
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    torch.set_num_threads(1)  # as `hg-dagger auto` collects (train.threads, default 1); the same for both loops
    mapping = load_mapping(task)
    expert = make_expert(task, "planner", mapping=mapping)
    student = Student.create(mapping, kind="mlp", ensemble=5, hidden=(256, 256))
    from hg_dagger.control.expert_runs import HoldStill

    no_student = HoldStill(mapping.action_dim)  # the collector's own cost: a policy that costs nothing
    bare, auto, bare_cpu, auto_cpu, details, machinery = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, make_env(mapping, num_envs=num_envs, seed=0) as env:
        bare_loop(env, expert, mapping, 5)  # warm-up
        for r in range(repeats):
            wall, cpu = bare_loop(env, expert, mapping, ticks)
            bare.append(wall)
            bare_cpu.append(cpu)
            store = EpisodeStore.create(Path(tmp) / f"s{r}")
            wall, cpu, info = auto_loop(env, expert, student, store, ticks)
            auto.append(wall)
            auto_cpu.append(cpu)
            details.append(info)
            store = EpisodeStore.create(Path(tmp) / f"n{r}")
            machinery.append(auto_loop(env, expert, no_student, store, ticks)[0])
    ratio = statistics.median(a / b for a, b in zip(auto, bare, strict=True))
    ratio_cpu = statistics.median(a / b for a, b in zip(auto_cpu, bare_cpu, strict=True))
    return {
        "task": task, "num_envs": num_envs, "ticks": ticks, "repeats": repeats,
        "bare_steps_per_s": bare, "auto_steps_per_s": auto, "ratio_median": ratio,
        "no_student_steps_per_s": machinery,
        "no_student_ratio_median": statistics.median(a / b for a, b in zip(machinery, bare, strict=True)),
        "bare_steps_per_cpu_s": bare_cpu, "auto_steps_per_cpu_s": auto_cpu, "ratio_cpu_median": ratio_cpu,
        "expert_latency_ms_mean": statistics.mean(d["expert_latency_ms_mean"] for d in details),
        "student_inference_ms_mean": statistics.mean(d["student_inference_ms_mean"] for d in details),
        "recorder_drain_s": max(d["drain_s"] for d in details),
        "dropped_steps": sum(d["dropped"] for d in details),
    }


GOAL_SUCCESS = 0.9  # the goal: >= 90% student success ...
GOAL_LABEL_RATIO = 0.5  # ... with at most half the expert labels BC needs for the same success


def _arm(base: dict, mode: str, iterations: int, out: Path) -> dict:
    """One learning curve (run in its own process when the arms run in parallel)."""
    import torch

    from hg_dagger.learn.auto import AutoConfig, AutoRun

    torch.set_num_threads(1)
    cfg = AutoConfig.model_validate({**base, "mode": mode, "iterations": iterations})
    t0 = time.perf_counter()
    rows = AutoRun(cfg, out / mode).run(progress=False)
    return {
        "labels": [r["replay"]["labels"] for r in rows],
        "success": [r["eval_success_rate"] for r in rows],
        "beta": [r["beta"] for r in rows],
        "collect_success": [r["collect_success_rate"] for r in rows],
        "seconds": time.perf_counter() - t0,
    }


def first_reaching(curve: dict, success: float) -> int | None:
    """Labels at the first point of a curve with at least ``success`` (None: never)."""
    return next((lab for lab, s in zip(curve["labels"], curve["success"], strict=True) if s >= success), None)


def learning(task: str, quick: bool, out: Path, iterations: int | None = None, bc_iterations: int | None = None,
             eval_episodes: int = 30, parallel: bool = True, lr_schedule: str = "cosine",
             train_steps: int | None = None, seed: int = 0) -> dict:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    iterations = iterations or (6 if quick else 8)
    bc_iterations = bc_iterations or 2 * iterations  # BC must run to twice DAgger's labels to test the goal
    base = {
        "task": task, "certification": "planner_auto", "num_envs": 6 if quick else 8, "seed": seed, "episodes_per_iteration": 6 if quick else 16,
        "max_episode_steps": 80,
        "beta": {"kind": "exponential", "beta0": 1.0, "decay": 0.5},
        "student": {"kind": "mlp", "ensemble": 5, "hidden": [256, 256]},
        "train": {"steps": train_steps or (1600 if quick else 2000), "batch_size": 256, "lr": 1e-3, "lr_schedule": lr_schedule},
        "eval": {"episodes": eval_episodes, "num_envs": 10, "max_steps": 80, "seed": 100000},
    }
    arms = {"dagger_sync": iterations, "expert_demo": bc_iterations}
    if parallel:
        with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
            futures = {mode: pool.submit(_arm, base, mode, n, out) for mode, n in arms.items()}
            curves = {mode: f.result() for mode, f in futures.items()}
    else:
        curves = {mode: _arm(base, mode, n, out) for mode, n in arms.items()}
    for mode, c in curves.items():
        print(f"  {mode}: " + ", ".join(f"{lab} labels -> {s:.0%}" for lab, s in
                                        zip(c["labels"], c["success"], strict=True)), flush=True)
    dag, bc = curves["dagger_sync"], curves["expert_demo"]
    best = max(dag["success"])
    dag_goal, bc_goal = first_reaching(dag, GOAL_SUCCESS), first_reaching(bc, GOAL_SUCCESS)
    # met: DAgger reaches the goal success and BC, given twice those labels, does not reach it earlier
    met = dag_goal is not None and (
        (bc_goal is not None and dag_goal <= GOAL_LABEL_RATIO * bc_goal)
        or (bc_goal is None and bc["labels"][-1] >= dag_goal / GOAL_LABEL_RATIO))
    return {"config": base, "iterations": arms, "curves": curves, "dagger_best_success": best,
            "dagger_labels_for_best": first_reaching(dag, best), "bc_labels_for_same_success": first_reaching(bc, best),
            "dagger_labels_for_goal": dag_goal, "bc_labels_for_goal": bc_goal, "goal_met": met,
            "dagger_after_goal": [s for lab, s in zip(dag["labels"], dag["success"], strict=True)
                                  if dag_goal is not None and lab >= dag_goal]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run (minutes)")
    p.add_argument("--task", default="fetch_pick_place")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--out", default=None, help="folder for runs and results.json (default: a temp folder)")
    p.add_argument("--iterations", type=int, help="DAgger iterations of the learning comparison (quick: 6, else 8)")
    p.add_argument("--bc-iterations", type=int, help="BC iterations (default: twice --iterations)")
    p.add_argument("--eval-episodes", type=int, default=30, help="student-only evaluation episodes per point")
    p.add_argument("--lr-schedule", default="cosine", choices=["cosine", "constant"], help="per-round lr schedule")
    p.add_argument("--train-steps", type=int, help="gradient steps per round (quick: 1600, else 2000)")
    p.add_argument("--seed", type=int, default=0, help="run seed (collection coins, resets, init); eval seeds stay")
    p.add_argument("--serial", action="store_true", help="run the DAgger and BC arms one after the other")
    p.add_argument("--skip-learning", action="store_true")
    p.add_argument("--skip-overhead", action="store_true")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_dagger_"))
    out.mkdir(parents=True, exist_ok=True)
    result = {"argv": sys.argv[1:], "quick": args.quick}
    if not args.skip_overhead:
        for task in (args.task, "toy_reach"):
            ticks = (60 if args.quick else 300) if task.startswith("fetch") else (300 if args.quick else 2000)
            o = overhead(task, args.num_envs, ticks, 3 if args.quick else 5)
            result.setdefault("overhead", []).append(o)
            from figures import record

            record(f"auto collection {task} x{args.num_envs}: env-steps/s", statistics.median(o["auto_steps_per_s"]),
                   unit="steps/s", baseline=statistics.median(o["bare_steps_per_s"]),
                   baseline_name="bare env + expert loop", target=">= 0.9x baseline" if task.startswith("fetch") else "",
                   met=o["ratio_median"] >= 0.9 if task.startswith("fetch") else None)
            record(f"auto collection {task} x{args.num_envs}, no student (the collector's own cost): env-steps/s",
                   statistics.median(o["no_student_steps_per_s"]), unit="steps/s",
                   baseline=statistics.median(o["bare_steps_per_s"]), baseline_name="bare env + expert loop")
            print(f"overhead {task} x{args.num_envs}: bare {statistics.median(o['bare_steps_per_s']):.0f} env-steps/s, "
                  f"auto {statistics.median(o['auto_steps_per_s']):.0f} env-steps/s, ratio {o['ratio_median']:.2f} "
                  f"(target >= 0.9); per CPU-second: bare {statistics.median(o['bare_steps_per_cpu_s']):.0f}, auto "
                  f"{statistics.median(o['auto_steps_per_cpu_s']):.0f}, ratio {o['ratio_cpu_median']:.2f}; expert {o['expert_latency_ms_mean']:.2f} ms/query, student "
                  f"{o['student_inference_ms_mean']:.2f} ms/tick, dropped {o['dropped_steps']}; without the student "
                  f"(a zero action that costs nothing) ratio {o['no_student_ratio_median']:.2f}", flush=True)
    if not args.skip_learning:
        print(f"learning on {args.task} (student-only success after each iteration):", flush=True)
        result["learning"] = learning(args.task, args.quick, out, args.iterations, args.bc_iterations,
                                      args.eval_episodes, not args.serial, args.lr_schedule, args.train_steps, args.seed)
        lr = result["learning"]
        from figures import record

        record(f"DAgger {args.task}: labels to {GOAL_SUCCESS:.0%} success", lr["dagger_labels_for_goal"], unit="labels",
               baseline=lr["bc_labels_for_goal"], baseline_name="BC", target=f"<= {GOAL_LABEL_RATIO:g}x BC",
               met=lr["goal_met"], higher_is_better=False)
        print(f"DAgger best {lr['dagger_best_success']:.0%} at {lr['dagger_labels_for_best']} labels; BC reached it at "
              f"{lr['bc_labels_for_same_success'] or 'no point of its curve'} labels")
        print(f"goal {GOAL_SUCCESS:.0%}: DAgger at {lr['dagger_labels_for_goal'] or 'no point'} labels (then "
              f"{', '.join(f'{s:.0%}' for s in lr['dagger_after_goal'])}), BC at {lr['bc_labels_for_goal'] or 'no point'} "
              f"labels of {lr['curves']['expert_demo']['labels'][-1]}; goal (<= {GOAL_LABEL_RATIO:g}x BC's labels) "
              f"{'MET' if lr['goal_met'] else 'NOT met'}")
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
