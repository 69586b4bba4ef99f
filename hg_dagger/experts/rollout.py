"""Measure an expert closed-loop: success from reset and from perturbed states, query latency.

Used by tests/test_experts_*.py and benchmarks/bench_experts.py, so both measure the same thing.
An episode counts as a success when the task's success condition holds at its last step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from hg_dagger.experts.base import query_expert


@dataclass
class ExpertReport:
    episodes: int = 0
    successes: int = 0
    queries: int = 0  # row-queries
    invalid_rows: int = 0
    invalid_reasons: Counter = field(default_factory=Counter)
    latency_ns: list[int] = field(default_factory=list)  # one per batched query
    failures: list[dict] = field(default_factory=list)  # per failed episode: row, seed stream, last phase/reason

    @property
    def success_rate(self) -> float:
        return self.successes / max(self.episodes, 1)

    def latency_us(self, q: float) -> float:
        return float(np.percentile(self.latency_ns, q)) / 1e3 if self.latency_ns else float("nan")

    def summary(self) -> str:
        return (
            f"success {self.successes}/{self.episodes} ({100 * self.success_rate:.1f}%), invalid rows "
            f"{self.invalid_rows}/{self.queries}, query latency p50 {self.latency_us(50):.0f} us "
            f"p99 {self.latency_us(99):.0f} us"
        )


def run_expert(
    env,
    expert,
    episodes: int,
    *,
    seed: int = 0,
    perturb_steps: tuple[int, int] = (0, 0),
    perturb: str = "random",
    noise_std: float = 0.5,
    timeout_s: float | None = None,
    progress: bool = False,
) -> ExpertReport:
    """Drive every row with ``expert`` until ``episodes`` episodes (split evenly over rows) are done.

    The first k steps of each episode (k uniform in ``perturb_steps``) are not the expert's:
    ``perturb="random"`` applies uniform random raw actions, ``"noisy"`` the expert's action plus
    Gaussian noise - so the expert must recover from states it did not choose.
    """
    mapping = env.mapping
    n = env.num_envs
    rng = np.random.default_rng(seed)
    lo = np.asarray(mapping.action.low, dtype=np.float32)
    hi = np.asarray(mapping.action.high, dtype=np.float32)
    quota = -(-episodes // n)
    done_eps = np.zeros(n, dtype=np.int64)
    t = np.zeros(n, dtype=np.int64)
    k = rng.integers(perturb_steps[0], perturb_steps[1] + 1, size=n)
    rep = ExpertReport()
    ids = np.arange(n)
    obs, info = env.reset(seed=seed)
    expert.reset(ids, obs, info)
    bar = tqdm(total=quota * n, desc=f"{mapping.task_id} expert", disable=not progress, leave=False)
    while (done_eps < quota).any():
        q = query_expert(expert, obs, ids, mapping, timeout_s=timeout_s)
        rep.queries += n
        rep.invalid_rows += int((~q.valid).sum())
        rep.invalid_reasons.update(q.invalid_reason.values())
        rep.latency_ns.append(q.metadata["latency_ns"])
        action = q.with_fallback(np.zeros_like(q.action))
        early = t < k
        if early.any():
            if perturb == "random":
                action[early] = rng.uniform(lo, hi, size=(int(early.sum()), len(lo)))
            else:
                action[early] += rng.normal(0.0, noise_std, size=(int(early.sum()), len(lo)))
        res = env.step(mapping.clip_raw(action))
        t += 1
        finished = res.terminated | res.truncated
        for i in np.flatnonzero(finished):
            if done_eps[i] < quota:
                rep.episodes += 1
                ok = bool(res.info["success"][i])
                rep.successes += ok
                if not ok:
                    phase = q.metadata.get("phase")
                    rep.failures.append(
                        {
                            "env": int(i),
                            "episode_of_row": int(done_eps[i]),
                            "perturb_steps": int(k[i]),
                            "last_phase": str(phase[i]) if phase is not None else "",
                            "invalid_reason": q.invalid_reason.get(int(i), ""),
                        }
                    )
                bar.update(1)
            done_eps[i] += 1
            t[i] = 0
            k[i] = rng.integers(perturb_steps[0], perturb_steps[1] + 1)
        obs = res.obs
        if finished.any():
            rows = np.flatnonzero(finished)
            expert.reset(rows, {key: v[rows] for key, v in obs.items()}, res.info)
    bar.close()
    return rep
