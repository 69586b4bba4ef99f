"""Measuring an expert closed-loop on the rollout engine: success from reset and from states it did not choose,
invalid rows, query latency. tests/experts and benchmarks/bench_experts.py use it, so both measure the same thing.

    rep = run_expert(env, make_expert(task), episodes=8, seed=100, perturb_steps=(10, 40))

Episode k starts from a reset with seed ``seed + k`` (the engine's rule) and counts as a success when the task's
success condition holds at its last step. The first j steps of an episode (j uniform in ``perturb_steps``, drawn
from the episode's own stream) are not the expert's: ``perturb="random"`` applies uniform random raw actions,
``"noisy"`` the expert's action plus Gaussian noise. Every action passes the task's safety monitor, as in every
other mode; a row without a valid label holds still (a zero raw action).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from hg_dagger.control.engine import Engine, EpisodeRows, ExpertOnly, Tick, task_safety
from hg_dagger.control.safety import SafetyMonitor
from hg_dagger.policy.student import PolicyOutput


@dataclass
class ExpertReport:
    episodes: int = 0
    successes: int = 0
    queries: int = 0  # row-queries
    invalid_rows: int = 0
    clamped_rows: int = 0  # row-steps whose action the safety monitor changed
    invalid_reasons: Counter = field(default_factory=Counter)
    latency_ns: list[int] = field(default_factory=list)  # one per batched query
    failures: list[dict] = field(default_factory=list)  # per failed episode: row, seed, perturbation, last phase

    @property
    def success_rate(self) -> float:
        return self.successes / max(self.episodes, 1)

    def latency_us(self, q: float) -> float:
        return float(np.percentile(self.latency_ns, q)) / 1e3 if self.latency_ns else float("nan")

    def summary(self) -> str:
        return (
            f"success {self.successes}/{self.episodes} ({100 * self.success_rate:.1f}%), invalid rows "
            f"{self.invalid_rows}/{self.queries}, clamped {self.clamped_rows}, query latency p50 {self.latency_us(50):.0f} us "
            f"p99 {self.latency_us(99):.0f} us"
        )


class HoldStill:
    """The policy of a run without a student: a zero raw action, what a row without a valid label applies."""

    version = "none"

    def __init__(self, action_dim: int):
        self.action_dim = action_dim

    def reset_rows(self, rows, num_envs: int) -> None:
        """Nothing to forget."""

    def act(self, obs: dict[str, np.ndarray]) -> PolicyOutput:
        n = len(next(iter(obs.values())))
        zeros = np.zeros(n, np.float32)
        return PolicyOutput(action=np.zeros((n, self.action_dim), np.float32), uncertainty=zeros, confidence=zeros,
                            inference_ns=0)


class PerturbedExpert(ExpertOnly):
    """The expert on every row, except for each episode's first j steps (j drawn per episode): random or noisy
    actions then, so that the expert must recover from states it did not choose."""

    def __init__(self, expert, mapping, *, seed: int, perturb_steps: tuple[int, int], perturb: str,
                 noise_std: float, timeout_s: float | None):
        super().__init__(expert, mapping, seed=seed, timeout_s=timeout_s)
        if perturb not in ("random", "noisy"):
            raise ValueError(f"perturb must be 'random' or 'noisy', not {perturb!r}")
        self.perturb_steps, self.perturb, self.noise_std = perturb_steps, perturb, noise_std
        self.lo = np.asarray(mapping.action.low, np.float32)
        self.hi = np.asarray(mapping.action.high, np.float32)
        self.streams: dict[int, np.random.Generator] = {}
        self.first: dict[int, int] = {}  # row -> steps of its episode still perturbed
        self.steps: dict[int, int] = {}

    def seed_row(self, row: int, episode_seed: int) -> None:
        rng = np.random.default_rng([self.seed, int(episode_seed), 1])
        self.streams[row] = rng
        self.first[row] = int(rng.integers(self.perturb_steps[0], self.perturb_steps[1] + 1))
        self.steps[row] = 0

    def decide(self, tick: Tick) -> None:
        super().decide(tick)
        assert tick.command is not None and tick.expert_used is not None  # the expert's decision, just made
        for r in np.flatnonzero(tick.active).tolist():
            self.steps[r] += 1
            if self.steps[r] > self.first[r]:
                continue
            rng = self.streams[r]
            if self.perturb == "random":
                tick.command[r] = rng.uniform(self.lo, self.hi)
            else:
                tick.command[r] = tick.command[r] + rng.normal(0.0, self.noise_std, size=len(self.lo))
            tick.expert_used[r] = False


class _Measure:
    """The sink of an expert run: queries, invalid rows and latency per tick, success and failures per episode."""

    def __init__(self, arbiter: PerturbedExpert, report: ExpertReport, bar):
        self.arbiter, self.report, self.bar = arbiter, report, bar
        self.seed: dict[int, int] = {}

    def begin(self, row: int, seed: int, index: int) -> None:
        self.seed[row] = seed

    def step(self, tick: Tick) -> None:
        q, rep = self.arbiter.last, self.report
        assert q is not None  # the arbiter asked the expert this tick
        rep.queries += len(q.valid)
        rep.invalid_rows += int((~q.valid).sum())
        rep.invalid_reasons.update(q.invalid_reason.values())
        rep.latency_ns.append(int(q.metadata["latency_ns"]))
        rep.clamped_rows += int((tick.clamped & tick.active).sum())

    def end(self, row: int, tick: Tick, *, complete: bool) -> None:
        if not complete:
            return
        rep, q = self.report, self.arbiter.last
        assert q is not None and tick.env is not None  # a completed episode ended on a stepped tick
        rep.episodes += 1
        ok = bool(tick.env.success[row])
        rep.successes += ok
        if not ok:
            queried = np.flatnonzero(tick.active)
            phase = q.metadata.get("phase")
            at = int(np.searchsorted(queried, row))
            rep.failures.append({"env": row, "seed": self.seed[row], "perturb_steps": self.arbiter.first[row],
                                 "last_phase": str(phase[at]) if phase is not None else "",
                                 "invalid_reason": q.invalid_reason.get(row, "")})
        self.bar.update(1)


def run_expert(env, expert, episodes: int, *, seed: int = 0, perturb_steps: tuple[int, int] = (0, 0),
               perturb: str = "random", noise_std: float = 0.5, timeout_s: float | None = None,
               progress: bool = False) -> ExpertReport:
    """Run ``episodes`` episodes of ``expert`` on ``env`` (module docstring) and report them."""
    mapping = env.mapping
    arbiter = PerturbedExpert(expert, mapping, seed=seed, perturb_steps=perturb_steps, perturb=perturb,
                              noise_std=noise_std, timeout_s=timeout_s)
    safety = SafetyMonitor(task_safety(mapping.task_id), num_envs=env.num_envs, action_dim=mapping.action_dim)
    report = ExpertReport()
    bar = tqdm(total=episodes, desc=f"{mapping.task_id} expert", disable=not progress, leave=False)
    engine = Engine(env, HoldStill(mapping.action_dim), arbiter, safety,
                    rows=EpisodeRows(env.num_envs, base_seed=seed), sinks=[_Measure(arbiter, report, bar)])
    try:
        engine.run(episodes=episodes)
    finally:
        bar.close()
    return report


__all__ = ["ExpertReport", "HoldStill", "PerturbedExpert", "run_expert"]
