"""A policy server for tests, run as a child process: ``python tests/policy/served_clock.py --delay S ...``.

Its policy reads the tick a test stamps into ``observation.state`` (every entry) and answers, after sleeping
``--delay`` seconds (a slow or remote model), a chunk of ``--chunk`` actions whose action i is [tick + i, tick]: the
step each action is for, and the tick of the observation it was computed on. A test that acts on it can tell which
step an action was proposed for and how old its observation was."""

from __future__ import annotations

import argparse
import time

import numpy as np

from hg_dagger.policy.server import serve


class Clock:
    def __init__(self, delay: float, chunk: int, steps: int, batch: bool):
        self.delay, self.chunk, self.steps, self.batch = delay, chunk, steps, batch

    def metadata(self):
        return {"policy_version": "clock-test", "chunk_size": self.chunk, "n_action_steps": self.steps,
                "batch": self.batch, "action_dim": 2}

    def infer(self, obs):
        time.sleep(self.delay)
        state = np.asarray(obs["observation.state"], np.float32)
        ticks = state[..., 0].reshape(-1)
        i = np.arange(self.chunk, dtype=np.float32)
        chunks = np.stack([np.stack([t + i, np.full_like(i, t)], axis=-1) for t in ticks])  # [N, H, 2]
        return {"actions": chunks if state.ndim == 2 else chunks[0]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--chunk", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", action="store_true")
    args = p.parse_args()
    serve(Clock(args.delay, args.chunk, args.steps, args.batch), port=0,
          on_ready=lambda address: print(f"listening on {address}", flush=True))


if __name__ == "__main__":
    main()
