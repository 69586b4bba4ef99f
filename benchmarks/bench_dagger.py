"""DAgger benchmarks: (1) overhead of `auto` against bare expert-driven stepping, (2) DAgger vs BC learning curves.

    python benchmarks/bench_dagger.py --quick          # short overhead run + 6 small DAgger iterations, 12 BC
    python benchmarks/bench_dagger.py                  # the full comparison (tens of minutes on 2 cores)

(1) Same task, same num_envs, same process, two envs stepped in alternating blocks of about 0.15 s: env-steps/s
    of the auto collector (student forward pass + expert query + beta mixing + recording into a zarr store)
    against a loop that only queries the expert and steps the env. Target: ratio >= 0.9. The collector is the rollout engine (control.engine)
    with beta mixing and the safety monitor of the task's run config, as every mode steps. The same collector
    with a policy that costs nothing (a zero action) is printed beside it; a still arm makes fewer contacts, so
    its env.step is cheaper too (docs/benchmarks.md).
(2) FetchPickAndPlace (state): `auto` in dagger_sync mode against expert_demo (behaviour cloning on expert-only
    demonstrations) with identical seeds, episodes per iteration and training steps, so both see the same number
    of expert labels per iteration. Student-only success after every iteration is printed for both.
Results are printed and written as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402


class BareLoop:
    """Stepping driven by the expert alone (the baseline), resumable so it can run in blocks between the
    collector's ticks."""

    def __init__(self, env, expert, mapping):
        from hg_dagger.experts import query_expert

        self.env, self.expert, self.mapping, self._query = env, expert, mapping, query_expert
        self.ids = np.arange(env.num_envs)
        self.zero = np.zeros((env.num_envs, mapping.action_dim), np.float32)
        self.obs, info = env.reset(seed=1)
        expert.reset(list(self.ids), self.obs, info)

    def run(self, ticks: int) -> None:
        env, expert, mapping = self.env, self.expert, self.mapping
        for _ in range(ticks):
            q = self._query(expert, self.obs, self.ids, mapping)
            res = env.step(mapping.clip_raw(q.with_fallback(self.zero)))
            done = np.flatnonzero(res.terminated | res.truncated)
            if len(done):
                expert.reset(done.tolist(), {k: v[done] for k, v in res.obs.items()}, res.info)
            self.obs = res.obs


def _thread_cpu(name: str) -> float:
    """CPU seconds so far of the live threads called ``name`` (the recorder's writer)."""
    total = 0.0
    for t in threading.enumerate():
        if t.name == name and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:  # the thread ended between the listing and the read
                pass
    return total


BLOCK_S = 0.15  # the length of one block of ticks: short beside the machine's drift (seconds), long beside a cache


def interleaved(task: str, num_envs: int, policy, ticks: int, folder: Path) -> dict:
    """The collector of ``hg-dagger auto`` (``policy`` acting, beta 0.5) and the bare loop, each on an env of its
    own, in alternating blocks of about BLOCK_S: the collector's on_tick runs the next bare block, so both loops
    meet the machine's slow and fast moments alike. Wall and CPU seconds are summed per loop; the recorder's
    writer thread is charged to the collector."""
    from hg_dagger.envs import load_mapping, make_env
    from hg_dagger.experts import make_expert
    from hg_dagger.learn.auto import Collector
    from hg_dagger.store import EpisodeStore

    mapping = load_mapping(task)
    with make_env(mapping, num_envs=num_envs, seed=0) as env_bare, make_env(mapping, num_envs=num_envs, seed=0) as env:
        bare = BareLoop(env_bare, make_expert(task, "planner", mapping=mapping), mapping)
        w0 = time.perf_counter()
        bare.run(5)  # warm-up, and the length of a tick
        block = max(5, round(BLOCK_S / ((time.perf_counter() - w0) / 5)))
        rec = EpisodeStore.create(folder).recorder(flush_interval_s=2.0, queue_steps=1 << 16)  # AutoConfig default
        col = Collector(env, make_expert(task, "planner", mapping=mapping), rec, mode="dagger_sync", seed=0)
        col.set_policy(policy, iteration=0, beta=0.5)
        # per loop: seconds and CPU seconds; "auto_at_block": the collector's seconds when the last block began
        t = {"auto": 0.0, "bare": 0.0, "auto_cpu": 0.0, "bare_cpu": 0.0, "bare_ticks": 0, "auto_at_block": 0.0,
             "mark": None}
        blocks: list[tuple[float, float]] = []  # (auto s, bare s) per block pair

        def on_tick(engine_ticks, waiting):
            now, cpu = time.perf_counter(), time.thread_time()
            if t["mark"] is not None:  # the first tick (the run's opening reset) is not counted
                t["auto"] += now - t["mark"][0]
                t["auto_cpu"] += cpu - t["mark"][1]
                if (engine_ticks - 1) % block == 0:
                    bare.run(block)
                    b1, c1 = time.perf_counter(), time.thread_time()
                    t["bare"] += b1 - now
                    t["bare_cpu"] += c1 - cpu
                    t["bare_ticks"] += block
                    blocks.append((t["auto"] - t["auto_at_block"], b1 - now))
                    t["auto_at_block"] = t["auto"]
                    now, cpu = b1, c1
            t["mark"] = (now, cpu)

        stats = col.run(episodes=None, reset_seed=1, stop=lambda: t["bare_ticks"] >= ticks, on_tick=on_tick)
        writer_cpu = _thread_cpu("hg-dagger-recorder")
        t_close = time.perf_counter()
        rec.close()
        drain_s = time.perf_counter() - t_close
        summary = stats.summary()
    steps = num_envs * ticks  # every row runs an episode on every tick in both loops
    pairs = [b / a for a, b in blocks]
    return {
        "bare_steps_per_s": steps / t["bare"], "auto_steps_per_s": steps / t["auto"], "ratio": t["bare"] / t["auto"],
        "block_ratio_p10_p90": [float(np.percentile(pairs, 10)), float(np.percentile(pairs, 90))],
        "ratio_cpu": t["bare_cpu"] / (t["auto_cpu"] + writer_cpu), "writer_cpu_s": writer_cpu,
        "block_ticks": block, "auto_s": t["auto"], "bare_s": t["bare"], "drain_s": drain_s, "dropped": rec.stats.dropped_steps,
        "expert_latency_ms_mean": summary["expert_latency_ms_mean"],
        "student_inference_ms_mean": summary["student_inference_ms_mean"],
    }


def overhead(task: str, num_envs: int, ticks: int, folder: Path) -> dict:
    """The collector with the student, then with a zero action (a policy that costs nothing; a still arm also makes
    the physics cheaper, so that figure is no measure of the collector's own cost), each interleaved with a bare
    loop of its own."""
    import torch

    from hg_dagger.control.expert_runs import HoldStill
    from hg_dagger.envs import load_mapping
    from hg_dagger.policy import Student

    torch.set_num_threads(1)  # as `hg-dagger auto` collects (train.threads, default 1); the same for both loops
    mapping = load_mapping(task)
    student = Student.create(mapping, kind="mlp", ensemble=5, hidden=(256, 256))
    with_student = interleaved(task, num_envs, student, ticks, folder / "student")
    machinery = interleaved(task, num_envs, HoldStill(mapping.action_dim), ticks, folder / "no_student")
    return {"task": task, "num_envs": num_envs, "ticks": ticks, "student": with_student, "no_student": machinery}


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
        from figures import record

        for task in (args.task, "toy_reach"):
            fetch = task.startswith("fetch")
            ticks = (150 if args.quick else 900) if fetch else (2000 if args.quick else 10000)
            o = overhead(task, args.num_envs, ticks, out / "overhead" / task)
            result.setdefault("overhead", []).append(o)
            st, ns = o["student"], o["no_student"]
            record(f"auto collection {task} x{args.num_envs}: env-steps/s", st["auto_steps_per_s"], unit="steps/s",
                   baseline=st["bare_steps_per_s"], baseline_name="bare env + expert loop",
                   target=">= 0.9x baseline" if fetch else "", met=st["ratio"] >= 0.9 if fetch else None)
            record(f"auto collection {task} x{args.num_envs}, zero action instead of the student: env-steps/s",
                   ns["auto_steps_per_s"], unit="steps/s", baseline=ns["bare_steps_per_s"],
                   baseline_name="bare env + expert loop")
            print(f"overhead {task} x{args.num_envs}, {ticks} ticks a loop in blocks of {st['block_ticks']}: bare "
                  f"{st['bare_steps_per_s']:.0f} env-steps/s, auto {st['auto_steps_per_s']:.0f}, ratio "
                  f"{st['ratio']:.2f}{' (target >= 0.9)' if fetch else ''}, blocks p10-p90 "
                  f"{st['block_ratio_p10_p90'][0]:.2f}-{st['block_ratio_p10_p90'][1]:.2f}; per CPU-second (the "
                  f"recorder's thread charged to auto) {st['ratio_cpu']:.2f}; expert {st['expert_latency_ms_mean']:.2f} "
                  f"ms/query, student {st['student_inference_ms_mean']:.2f} ms/tick, dropped {st['dropped']}; "
                  f"without the student (a zero action that costs nothing) ratio {ns['ratio']:.2f}, per CPU-second "
                  f"{ns['ratio_cpu']:.2f}", flush=True)
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
