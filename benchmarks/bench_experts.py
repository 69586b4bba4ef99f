"""Planner/scripted expert success rates and query latency.

    python benchmarks/bench_experts.py                      # Fetch x3, 100 episodes per condition
    python benchmarks/bench_experts.py --tasks mw_push mw_reach --mw-episodes 40
    python benchmarks/bench_experts.py --write-docs         # replace the "Experts" section of docs/benchmarks.md

Per task: success from reset, and success after k uniform random actions at the start of each
episode (k uniform in --perturb); success = the task's success condition at the episode's last step.
Latency: query_expert (validation + conversion + isolation machinery) against the bare expert.act
call on the same observations in the same run, and query_expert with a timeout (thread hand-off).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from hg_dagger.control.expert_runs import run_expert  # noqa: E402
from hg_dagger.envs import make_env  # noqa: E402
from hg_dagger.experts import make_expert, query_expert  # noqa: E402

DEFAULT_TASKS = ["fetch_reach", "fetch_push", "fetch_pick_place"]
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
BEGIN, END = "<!-- experts:begin -->", "<!-- experts:end -->"


def latency(env, expert, reps: int) -> dict[str, float]:
    """p50/p99 microseconds of bare act, query_expert, and query_expert with a timeout, interleaved."""
    ids = np.arange(env.num_envs)
    obs, _ = env.reset(seed=123)
    rng = np.random.default_rng(0)
    samples: dict[str, list[int]] = {"act": [], "query": [], "query_timeout": []}
    for r in range(reps):
        if r % 10 == 0:  # visit varied states
            obs = env.step(rng.uniform(-1, 1, (env.num_envs, env.action_dim)).astype(np.float32)).obs
        t0 = time.perf_counter_ns()
        expert.act(obs, env_ids=ids)
        samples["act"].append(time.perf_counter_ns() - t0)
        samples["query"].append(query_expert(expert, obs, ids, env.mapping).metadata["latency_ns"])
        samples["query_timeout"].append(query_expert(expert, obs, ids, env.mapping, timeout_s=1.0).metadata["latency_ns"])
    return {f"{k}_{q}": float(np.percentile(v, q)) / 1e3 for k, v in samples.items() for q in (50, 99)}


def bench(task: str, episodes: int, num_envs: int, perturb: tuple[int, int], reps: int) -> dict:
    env = make_env(task, num_envs=num_envs, seed=0)
    try:
        expert = make_expert(task, mapping=env.mapping)
        t0 = time.perf_counter()
        clean = run_expert(env, expert, episodes, seed=1000, progress=True)
        pushed = run_expert(env, expert, episodes, seed=2000, perturb_steps=perturb, progress=True)
        seconds = time.perf_counter() - t0
        lat = latency(env, expert, reps)
    finally:
        env.close()
    row = {"task": task, "num_envs": num_envs, "clean": clean, "pushed": pushed, "seconds": seconds, **lat}
    print(
        f"{task}: reset {clean.summary()}\n{' ' * len(task)}  perturbed {pushed.summary()}\n"
        f"{' ' * len(task)}  latency p50/p99 us: act {lat['act_50']:.0f}/{lat['act_99']:.0f}, query_expert "
        f"{lat['query_50']:.0f}/{lat['query_99']:.0f}, with timeout {lat['query_timeout_50']:.0f}/"
        f"{lat['query_timeout_99']:.0f}",
        flush=True,
    )
    for f in (clean.failures + pushed.failures)[:5]:
        print(f"    failed: {f}")
    from figures import record

    record(f"expert {task}: success after random pushes", pushed.success_rate, unit="fraction",
           baseline=clean.success_rate, baseline_name="from reset")
    record(f"expert {task}: query_expert p99", lat["query_99"], unit="us", baseline=lat["act_99"],
           baseline_name="bare act()", higher_is_better=False)
    return row


def table(rows: list[dict], perturb: tuple[int, int]) -> str:
    lines = [
        f"| task | envs | success from reset | success after {perturb[0]}-{perturb[1]} random actions | invalid rows "
        "| bare act p50 / p99 µs | query_expert p50 / p99 µs | with timeout p50 / p99 µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c, p = r["clean"], r["pushed"]
        lines.append(
            f"| {r['task']} | {r['num_envs']} | {c.successes}/{c.episodes} ({100 * c.success_rate:.1f}%) "
            f"| {p.successes}/{p.episodes} ({100 * p.success_rate:.1f}%) | {c.invalid_rows + p.invalid_rows} "
            f"| {r['act_50']:.0f} / {r['act_99']:.0f} | {r['query_50']:.0f} / {r['query_99']:.0f} "
            f"| {r['query_timeout_50']:.0f} / {r['query_timeout_99']:.0f} |"
        )
    return "\n".join(lines)


def write_docs(section: str) -> None:
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text)
    print(f"wrote the Experts section of {DOC}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS)
    ap.add_argument("--episodes", type=int, default=100, help="episodes per condition and task")
    ap.add_argument("--mw-episodes", type=int, default=40, help="episodes per condition for Meta-World (400 steps each)")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--perturb", type=int, nargs=2, default=(10, 40), metavar=("MIN", "MAX"))
    ap.add_argument("--latency-reps", type=int, default=300)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    perturb = tuple(args.perturb)
    rows = [
        bench(t, args.mw_episodes if t.startswith("mw_") else args.episodes, args.num_envs, perturb, args.latency_reps)
        for t in args.tasks
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    head = (
        f"`python benchmarks/bench_experts.py {' '.join(sys.argv[1:])}`".replace(" --write-docs", "")
        + f" ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {date.today()}, "
        f"load average {load:.1f} at the end). Success = the task's success condition at the last step "
        "(Fetch: 150 steps; Meta-World: 400). Latency is per batched query of all envs."
    )
    out = head + "\n\n" + table(rows, perturb)
    print("\n" + out)
    if args.write_docs:
        write_docs(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
