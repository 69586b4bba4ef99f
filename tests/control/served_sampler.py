"""A stochastic policy server for tests, run as a child process: ``python tests/control/served_sampler.py ...``.

Its chunk pushes the first joint at ``--push`` (raw units), and it sends ``--samples`` K samples of it
(``action_samples``): alike (spread 0.01 of the range) while the observation's first state entry is at most
``--unsure-above``, far apart (spread 0.4 of the range) beyond it, as a diffusion policy's draws are where its
training data did not go. A test can tell from the state where the spread gate must ask."""

from __future__ import annotations

import argparse

import numpy as np

from hg_dagger.policy.server import serve

H = 4


class Sampler:
    def __init__(self, samples: int, push: float, unsure_above: float):
        self.samples, self.push, self.unsure_above = samples, push, unsure_above
        self.rng = np.random.default_rng(0)

    def metadata(self):
        return {"policy_version": "sampler-test", "chunk_size": H, "n_action_steps": H, "action_dim": 2,
                "samples": self.samples}

    def infer(self, obs):
        state = np.asarray(obs["observation.state"], np.float32)
        chunk = np.zeros((H, 2), np.float32)
        chunk[:, 0] = self.push
        d = 0.8 if state[0] > self.unsure_above else 0.02  # samples at +-d: std d, d / 2 of the range [-1, 1]
        signs = np.where(np.arange(self.samples) % 2 == 0, 1.0, -1.0).astype(np.float32)
        samples = chunk[None] + signs[:, None, None] * np.float32(d)
        return {"actions": chunk, "action_samples": samples.astype(np.float32)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--push", type=float, default=0.5)
    p.add_argument("--unsure-above", type=float, default=0.5)
    args = p.parse_args()
    serve(Sampler(args.samples, args.push, args.unsure_above), port=0,
          on_ready=lambda address: print(f"listening on {address}", flush=True))


if __name__ == "__main__":
    main()
