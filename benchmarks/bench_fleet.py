"""One person, several robots (issue 44, docs/fleet.md): the same student and the same human time budget with 1, 2,
4 and 8 robots per person and each allocation policy, answered by the human-paced operator model in control time.

    .venv/bin/python benchmarks/bench_fleet.py                 # toy_reach, 120 s of the person's time per arm
    .venv/bin/python benchmarks/bench_fleet.py --budget-s 60 --robots 1 4 --json out.json

Per arm: successes (episodes that ended within the budget), successes per minute of the budget (the person's
minutes, which are also the run's control-time minutes), human effort (the person busy with a robot: from taking
its request to handing back; and the steps they steered), ROHE (ours: successes per minute of human effort;
Fleet-DAgger's: total reward / (1 + human action steps), scaled by humans per robot), the share of robot time spent
waiting for the person, requests expired by the wait limit, long waits flagged, and the loop's compute time per tick.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from hg_dagger.control.build import open_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.store import EpisodeStore


def bootstrap(task: str, out: Path, demos: int, steps: int) -> str:
    """The one student every arm runs: trained on ``demos`` planner demonstrations, as the app bootstraps one."""
    from hg_dagger.learn.rounds import bootstrap_student

    res = bootstrap_student(task=task, store=str(out / "demos.zarr"), out_dir=str(out / "boot"), demos=demos,
                            steps=steps, report=lambda *_: None)
    return res["checkpoint"]


def run_arm(task: str, robots: int, policy: str, budget_s: float, *, wait_limit_s: float | None, seed: int,
            max_episode_steps: int | None, out: Path, student: str | None) -> dict:
    cfg = load_run_config(None, task, num_envs=robots, calibrate_steps=0, seed=seed,
                          max_episode_steps=max_episode_steps, **{
                              "operator.type": "human_model", "handover.wait": "pause", "fleet.allocation": policy,
                              "fleet.seed": seed, "handover.wait_timeout_s": wait_limit_s,
                              "handover.on_wait_timeout": "policy"})
    store = out / f"{task}_{robots}_{policy}.zarr"
    s = open_session(cfg, str(store), policy=student)
    dt = s.mapping.dt
    ticks = int(round(budget_s / dt))
    tick_ns = np.zeros(ticks, np.int64)
    try:
        s.start(10**6)
        for i in range(ticks):
            t0 = time.perf_counter_ns()
            s.tick()
            tick_ns[i] = time.perf_counter_ns() - t0
        successes, episodes = s.summary.successes, s.summary.episodes  # ended within the budget
        s.close_all("human time budget spent")
    finally:
        s.rec.close()
        s.env.close()
    st = EpisodeStore.open(str(store))
    reward = 0.0
    allocations = expired = 0
    for info in st.episodes():
        if not info.complete:
            continue
        if info.end.end_reason.value != "operator_abort":
            reward += float(np.sum(st.read_steps(info.episode_id, ["reward"])["reward"]))
        for e in info.end.events:  # from the store alone
            allocations += e.source == "fleet" and e.reason == "fleet:allocated"
            expired += e.kind.value == "request_end" and e.values.get("outcome") == "expired" \
                and e.reason == "wait_limit"
    fl = s.fleet.stats
    busy_min = fl.busy_ticks * dt / 60
    human_steps = s.summary.human_steps
    person = s.operator.facts
    return {
        "task": task, "robots": robots, "policy": policy, "budget_s": budget_s, "episodes": episodes,
        "successes": successes, "successes_per_min": successes / (budget_s / 60),
        "human_busy_min": round(busy_min, 3), "human_action_s": round(human_steps * dt, 2),
        "rohe_ours": successes / busy_min if busy_min else None,
        "rohe_fleet_dagger": (1.0 / robots) * reward / (1 + human_steps),
        "robot_wait_share": fl.waiting_row_ticks / (ticks * robots),
        "requests": len(person), "expired": expired, "flagged": fl.flagged, "allocations_in_store": allocations,
        "context_switches": fl.context_switches,
        "tick_ms_p50": float(np.percentile(tick_ns, 50) / 1e6), "tick_ms_p99": float(np.percentile(tick_ns, 99) / 1e6),
        "loop_hz": float(1e9 / np.mean(tick_ns)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="toy_reach")
    p.add_argument("--robots", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--policies", nargs="+", default=["cur", "fcfs", "random"])
    p.add_argument("--budget-s", type=float, default=120.0, help="the person's time per arm (control time)")
    p.add_argument("--wait-limit-s", type=float, default=8.0, help="requests expire after this wait (0: never)")
    p.add_argument("--max-episode-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--demos", type=int, default=12, help="planner demonstrations the student is trained on (0: a "
                   "fresh, untrained student)")
    p.add_argument("--train-steps", type=int, default=1000)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    logging.disable(logging.INFO)
    from hg_dagger.policy import one_inference_thread

    one_inference_thread()  # as `hg-dagger run`: this process is the control loop
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        student = bootstrap(args.task, Path(tmp), args.demos, args.train_steps) if args.demos else None
        print(f"student: {args.demos} planner demonstrations, {args.train_steps} training steps "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        for robots in args.robots:
            for policy in args.policies:
                t0 = time.perf_counter()
                row = run_arm(args.task, robots, policy, args.budget_s, wait_limit_s=args.wait_limit_s or None,
                              seed=args.seed, max_episode_steps=args.max_episode_steps, out=Path(tmp),
                              student=student)
                row["compute_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(f"{robots} robots {policy:6s}: {row['successes']:3d} successes ({row['successes_per_min']:.2f}"
                      f"/min), ROHE ours {row['rohe_ours'] or 0:.2f}/busy-min, Fleet-DAgger {row['rohe_fleet_dagger']:.4f},"
                      f" wait share {row['robot_wait_share']:.2f}, expired {row['expired']}, flagged {row['flagged']}, "
                      f"tick p50 {row['tick_ms_p50']:.2f} ms ({row['loop_hz']:.0f} Hz loop), {row['compute_s']} s",
                      flush=True)
    base = {r["policy"]: r["successes_per_min"] for r in rows if r["robots"] == 1}
    for r in rows:
        r["x_one_robot"] = r["successes_per_min"] / base[r["policy"]] if base.get(r["policy"]) else None
    by = {(r["robots"], r["policy"]): r for r in rows}
    print("\ngoals:")
    for pol in args.policies:
        if (4, pol) in by and by[(4, pol)]["x_one_robot"] is not None:
            print(f"  4 robots ({pol}): {by[(4, pol)]['x_one_robot']:.2f}x the successes per human-minute of one "
                  "robot (goal 3x)")
    if (8, "cur") in by and (8, "fcfs") in by and by[(8, "fcfs")]["rohe_ours"]:
        for key in ("rohe_ours", "rohe_fleet_dagger"):
            a, b = by[(8, "cur")][key], by[(8, "fcfs")][key]
            print(f"  8 robots: C.U.R. {key} {a:.4g} vs FCFS {b:.4g}: {a / b if b else float('nan'):.2f}x (goal 1.3x)")
    for r in rows:
        if r["robots"] == 4:
            print(f"  4 robots ({r['policy']}): loop {r['loop_hz']:.0f} ticks/s = {r['loop_hz']:.0f} Hz per robot "
                  f"(goal 25 Hz), tick p99 {r['tick_ms_p99']:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
