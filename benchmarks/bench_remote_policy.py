"""A served policy that takes 30 ms to answer, run by a 25 Hz loop: asking ahead off vs on, side by side.

The policy is a real policy server (a `PolicyServer` thread speaking openpi's protocol over a loopback websocket)
whose chunks hold 20 actions, 10 of them executed (ACT-like); each tick is `RemotePolicy.act` plus 15 ms of other
work (the env step, rendering), on an absolute 40 ms schedule (a late tick runs the next one at once, as
`ControlLoop` does). Printed per mode: the achieved rate, the ticks whose action waited for a reply, the ticks
that were late (ran out of actions before the reply asked ahead came), ticks over the 40 ms period, and the p50 /
p99 / max time of act().

    python benchmarks/bench_remote_policy.py [--ticks 500] [--infer-ms 30] [--work-ms 15]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hg_dagger.envs import load_mapping
from hg_dagger.policy import PolicyOptions, RemotePolicy
from hg_dagger.policy.server import PolicyServer


class Slow:
    """A served policy that sleeps ``infer_s`` per request and answers a constant chunk."""

    def __init__(self, infer_s: float, chunk: int, steps: int):
        self.infer_s, self.chunk, self.steps = infer_s, chunk, steps

    def metadata(self):
        return {"policy_version": "bench-slow", "chunk_size": self.chunk, "n_action_steps": self.steps,
                "action_dim": 2}

    def infer(self, obs):
        time.sleep(self.infer_s)
        return {"actions": np.zeros((self.chunk, 2), np.float32)}


def run(url: str, mapping, ask_ahead: int | None, ticks: int, hz: float, work_s: float) -> dict:
    obs = {k: np.zeros((1, *shape), dtype) for k, (shape, dtype) in mapping.obs_spec().items()}
    period = 1.0 / hz
    act_ms, tick_s = [], []
    with RemotePolicy(url, mapping, PolicyOptions(ask_ahead=ask_ahead)) as remote:
        remote.reset_rows([0], 1)
        start = due = time.perf_counter()
        for _ in range(ticks):
            t0 = time.perf_counter()
            remote.act(obs)
            act_ms.append((time.perf_counter() - t0) * 1e3)
            time.sleep(work_s)
            tick_s.append(time.perf_counter() - t0)
            due += period
            time.sleep(max(0.0, due - time.perf_counter()))
        elapsed = time.perf_counter() - start
        a = np.asarray(act_ms)
        return {"ask_ahead": "off" if ask_ahead == 0 else ("auto" if ask_ahead is None else ask_ahead),
                "rate_hz": ticks / elapsed, "waits": remote.wait_count, "late": remote.late_count,
                "over_period": int((np.asarray(tick_s) > period).sum()), "act_p50_ms": float(np.percentile(a, 50)),
                "act_p99_ms": float(np.percentile(a, 99)), "act_max_ms": float(a.max()),
                "threshold": remote.ahead_threshold() if ask_ahead != 0 else 0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ticks", type=int, default=500)
    p.add_argument("--hz", type=float, default=25.0)
    p.add_argument("--infer-ms", type=float, default=30.0)
    p.add_argument("--work-ms", type=float, default=15.0)
    args = p.parse_args()
    mapping = load_mapping("toy_reach")
    with PolicyServer(Slow(args.infer_ms / 1e3, chunk=20, steps=10), port=0).start() as server:
        rows = [run(server.address, mapping, a, args.ticks, args.hz, args.work_ms / 1e3) for a in (0, None)]
    print(f"served policy: {args.infer_ms:g} ms per request, chunks of 20 (10 executed); {args.ticks} ticks at "
          f"{args.hz:g} Hz with {args.work_ms:g} ms of other work per tick")
    print(f"{'ask ahead':>10} {'rate Hz':>8} {'waits':>6} {'late':>5} {'>period':>8} {'act p50':>8} {'act p99':>8} "
          f"{'act max':>8}")
    for r in rows:
        label = r["ask_ahead"] if r["ask_ahead"] != "auto" else f"auto({r['threshold']})"
        print(f"{label:>10} {r['rate_hz']:8.2f} {r['waits']:6d} {r['late']:5d} {r['over_period']:8d} "
              f"{r['act_p50_ms']:8.2f} {r['act_p99_ms']:8.2f} {r['act_max_ms']:8.2f}")


if __name__ == "__main__":
    main()
