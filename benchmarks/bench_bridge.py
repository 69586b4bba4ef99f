"""Robot bridge over loopback vs the in-process backend of the same task, in the same run.

    python benchmarks/bench_bridge.py [TASK ...] [--steps N] [--num-envs N]

Figures: round trip p50/p99 of bare requests (ping) and of env steps, requests/s and steps/s over the
bridge, and steps/s of the same env stepped in-process with the same actions (the baseline).
Targets (issue 3): >= 1,000 requests/s and p99 <= 2 ms on loopback. ``run(task)`` returns the figures.
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time

import numpy as np

from hg_dagger.envs import make_env
from hg_dagger.envs.bridge import BridgeEnv, Msg
from hg_dagger.envs.bridge.protocol import TOKEN_ENV, new_token

TARGET_REQUESTS_PER_S = 1000.0
TARGET_P99_MS = 2.0


def _pct(ns: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(ns, dtype=np.float64), q) / 1e6)


def _start_robot(task: str, num_envs: int, token: str) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "hg_dagger", "bridge", "serve", task, "--port", "0", "--num-envs", str(num_envs),
           "--seed", "0", "--heartbeat-timeout", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, **{TOKEN_ENV: token}))
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"robot server for {task} did not start ({line!r})")
    return proc, int(line.strip().rsplit(":", 1)[1])


def _actions(env, steps: int) -> np.ndarray:
    lo, hi = np.asarray(env.mapping.action.low, np.float32), np.asarray(env.mapping.action.high, np.float32)
    rng = np.random.default_rng(0)
    return rng.uniform(lo, hi, size=(steps, env.num_envs, env.action_dim)).astype(np.float32)


def _timed(fn, n: int, lat: list[int]) -> float:
    """Call fn n times, append each latency (ns) to lat, return the elapsed seconds."""
    t_start = time.perf_counter_ns()
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        lat.append(time.perf_counter_ns() - t)
    return (time.perf_counter_ns() - t_start) / 1e9


def run(task: str = "toy_reach", steps: int = 1000, num_envs: int = 1, pings: int = 2000, warmup: int = 20,
        blocks: int = 10) -> dict:
    """Bridge round trip and throughput for ``task`` next to its in-process backend (same actions).

    The in-process env, the bridge steps and the bare requests (ping) run in interleaved blocks, so
    all three see the same machine load.
    """
    load_before = os.getloadavg()[0]
    token = new_token()
    proc, port = _start_robot(task, num_envs, token)
    local = make_env(task, num_envs=num_envs, seed=0)
    try:
        with BridgeEnv(task, port=port, token=token) as env:
            actions = _actions(local, steps + warmup)
            envs = {"inproc": local, "bridge": env}
            lat: dict[str, list[int]] = {"inproc": [], "bridge": [], "ping": []}
            secs = dict.fromkeys(lat, 0.0)
            for e in envs.values():
                e.reset(seed=0)
                for a in actions[:warmup]:
                    e.step(a)
            ping = {"type": Msg.PING}
            for b in range(blocks):
                block = actions[warmup + b * steps // blocks : warmup + (b + 1) * steps // blocks]
                for name, e in envs.items():
                    rows = iter(block)
                    secs[name] += _timed(lambda e=e, rows=rows: e.step(next(rows)), len(block), lat[name])
                secs["ping"] += _timed(lambda: env._request(ping), pings // blocks, lat["ping"])
            clock = env.sync_clock(16)
    finally:
        local.close()
        proc.terminate()
        proc.wait(10)
    local_lat, bridge_lat, ping_lat = lat["inproc"], lat["bridge"], lat["ping"]
    local_s, bridge_s, ping_s = secs["inproc"], secs["bridge"], secs["ping"]
    steps, pings = len(local_lat), len(ping_lat)

    out = {
        "task": task,
        "num_envs": num_envs,
        "steps": steps,
        "inproc_steps_per_s": steps / local_s,
        "inproc_step_p50_ms": _pct(local_lat, 50),
        "inproc_step_p99_ms": _pct(local_lat, 99),
        "bridge_requests_per_s": pings / ping_s,
        "bridge_request_p50_ms": _pct(ping_lat, 50),
        "bridge_request_p99_ms": _pct(ping_lat, 99),
        "bridge_steps_per_s": steps / bridge_s,
        "bridge_step_p50_ms": _pct(bridge_lat, 50),
        "bridge_step_p99_ms": _pct(bridge_lat, 99),
        "bridge_overhead_p50_ms": _pct(bridge_lat, 50) - _pct(local_lat, 50),
        "clock_error_ms": clock.error_ms,
        "loadavg_1m": (load_before + os.getloadavg()[0]) / 2,  # other work on the machine skews every figure
    }
    out["bridge_vs_inproc"] = out["bridge_steps_per_s"] / out["inproc_steps_per_s"]
    out["meets_targets"] = bool(out["bridge_requests_per_s"] >= TARGET_REQUESTS_PER_S
                                and out["bridge_request_p99_ms"] <= TARGET_P99_MS)
    return out


def format_row(r: dict) -> str:
    return (f"| {r['task']} | {r['num_envs']} | {r['inproc_steps_per_s']:,.0f} | {r['bridge_steps_per_s']:,.0f} "
            f"({r['bridge_vs_inproc']:.2f}x) | {r['bridge_step_p50_ms']:.3f} / {r['bridge_step_p99_ms']:.3f} | "
            f"{r['bridge_requests_per_s']:,.0f} | {r['bridge_request_p50_ms']:.3f} / {r['bridge_request_p99_ms']:.3f} | "
            f"{'yes' if r['meets_targets'] else 'NO'} | {r['loadavg_1m']:.1f} |")


HEADER_ROWS = (
    "| task | num_envs | in-process steps/s | bridge steps/s (vs in-process) | bridge step p50 / p99 ms | "
    "bridge requests/s (ping) | request p50 / p99 ms | targets met | load avg |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", default=["toy_reach", "fetch_reach"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--num-envs", type=int, default=1)
    args = parser.parse_args(argv)
    from figures import record

    print(HEADER_ROWS)
    for task in args.tasks:
        r = run(task, steps=args.steps, num_envs=args.num_envs)
        print(format_row(r), flush=True)
        record(f"bridge {task}: steps/s", r["bridge_steps_per_s"], unit="steps/s", baseline=r["inproc_steps_per_s"],
               baseline_name="in-process env")
        record(f"bridge {task}: requests/s (ping)", r["bridge_requests_per_s"], unit="req/s",
               target=f">= {TARGET_REQUESTS_PER_S:,.0f}", met=r["bridge_requests_per_s"] >= TARGET_REQUESTS_PER_S)
        record(f"bridge {task}: request p99", r["bridge_request_p99_ms"], unit="ms", target=f"<= {TARGET_P99_MS}",
               met=r["bridge_request_p99_ms"] <= TARGET_P99_MS, higher_is_better=False)
    print(f"targets: >= {TARGET_REQUESTS_PER_S:,.0f} requests/s and request p99 <= {TARGET_P99_MS} ms on loopback")
    return 0


if __name__ == "__main__":
    sys.exit(main())
