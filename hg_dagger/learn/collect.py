"""The automatic-expert collector: the rollout engine (control.engine) with beta mixing, recording into a store.

At every step both the student and the expert see the same pre-action observation; the expert's label is
stored for it whether or not it was executed. Both answers pass the mapping (policy_to_raw / expert_to_raw,
each ending in clip_raw); the chosen one passes the engine's action conversion and the safety monitor (the
task's run config ``safety`` section, as in a session) before env.step. Each finished episode is committed
with one EXPERT correction window over all its steps, so the contract's label rules make exactly the steps
with a valid expert label trainable.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EndReason,
    EpisodeEnd,
    Event,
    EventKind,
    now_ns,
)
from hg_dagger.contract.labels import planner_certifications
from hg_dagger.control.engine import (
    BetaMix,
    Engine,
    EpisodeRows,
    ExpertOnly,
    Tick,
    clamp_values,
    end_reason,
    task_safety,
)
from hg_dagger.control.episodes import EpisodeWriter
from hg_dagger.control.safety import SafetyConfig, SafetyMonitor


@dataclass
class CollectStats:
    steps: int = 0  # env-steps recorded (active rows)
    ticks: int = 0  # batched env.step calls
    seconds: float = 0.0
    queried: int = 0
    invalid: int = 0
    expert_used: int = 0
    safety_clamps: int = 0
    disagreement_sum: float = 0.0
    disagreement_n: int = 0
    latency_ns: list[int] = field(default_factory=list)
    inference_ns: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)
    episode_ids: list[str] = field(default_factory=list)
    partial_ids: list[str] = field(default_factory=list)
    episode_index: dict[str, int] = field(default_factory=dict)  # episode id -> its index in ``seeds`` (if given)
    label_phases: Counter = field(default_factory=Counter)  # the expert's phase at each valid label (planners name one)

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latency_ns, dtype=np.float64) / 1e6
        inf = np.asarray(self.inference_ns, dtype=np.float64) / 1e6
        return {
            "episodes": len(self.episode_ids),
            "env_steps": self.steps,
            "env_steps_per_s": self.steps / self.seconds if self.seconds else 0.0,
            "expert_latency_ms_mean": float(lat.mean()) if len(lat) else None,
            "expert_latency_ms_p95": float(np.percentile(lat, 95)) if len(lat) else None,
            "student_inference_ms_mean": float(inf.mean()) if len(inf) else None,
            "invalid_label_rate": self.invalid / self.queried if self.queried else 0.0,
            "expert_used_rate": self.expert_used / self.steps if self.steps else 0.0,
            "safety_clamps": self.safety_clamps,
            "disagreement": self.disagreement_sum / self.disagreement_n if self.disagreement_n else None,
            "collect_success_rate": float(np.mean(self.successes)) if self.successes else None,
            "collect_episode_length": float(np.mean(self.lengths)) if self.lengths else None,
            "label_phases": dict(self.label_phases.most_common()),
        }


def rec_stats(rec) -> dict[str, Any]:
    """A recorder's counters as plain values (for metrics lines and worker results)."""
    stats = getattr(rec, "stats", None)
    if stats is None:
        return {}
    if isinstance(stats, dict):
        return dict(stats)
    return {k: v for k, v in vars(stats).items() if isinstance(v, int | float | str)}


def build_expert(spec, mapping, *, relabel: bool):
    """The expert of an auto run (``spec``: learn.auto_config.ExpertSpec)."""
    # deferred: it loads the experts; importing this module stays free of them (tests/learn/test_eval.py: eval loads none)
    from hg_dagger.experts import make_expert
    from hg_dagger.experts.base import require_relabeler

    expert = make_expert(mapping.task_id, kind=spec.kind, mapping=mapping, checkpoint=spec.checkpoint)
    if relabel:
        require_relabeler(expert, where=f"auto on {mapping.task_id}")
    return expert


class Collector:
    """Rolls the mixed student/expert policy in one VecEnv through the engine and records every active row
    (the engine's store sink)."""

    def __init__(self, env, expert, recorder, *, mode: str, seed: int, expert_timeout_s: float | None = None,
                 max_episode_steps: int | None = None, expert_name: str = "", certify: bool = False,
                 safety: SafetyConfig | None = None):
        self.env = env
        self.mapping = env.mapping
        self.expert = expert
        self.recorder = recorder
        self.mode = CollectionMode(mode)
        # one coin stream per episode, seeded by (collector seed, episode seed): an episode's expert/student
        # mix does not depend on which rows or workers ran beside it (executor results equal local ones)
        self.seed = int(seed)
        self.extra: dict[str, Any] = {}  # added to every EpisodeStart.extra (executor, worker, staleness)
        self.timeout_s = expert_timeout_s
        self.max_steps = max_episode_steps or self.mapping.horizon
        self.expert_name = expert_name or type(expert).__name__
        self.certify = certify  # record a planner_auto certification per expert window (the run config's switch)
        self.writer = EpisodeWriter(recorder, self.mapping, env.num_envs, env.world_clock, env.robot)
        self.safety = SafetyMonitor(safety if safety is not None else task_safety(self.mapping.task_id),
                                    num_envs=env.num_envs, action_dim=self.mapping.action_dim)
        self.student: Any = None  # the acting policy (Policy with a .version), set by set_policy before a run
        self.stats = CollectStats()
        self.iteration = 0
        self.beta = 1.0
        self._arbiter: BetaMix | None = None
        self._index: list[int | None] = [None] * env.num_envs
        self._indices: Sequence[int] | None = None
        self._on_episode: Callable[[str, dict], None] | None = None
        self._bar: tqdm | None = None

    def set_policy(self, student, *, iteration: int, beta: float) -> None:
        """Act with ``student`` from now on; episodes already running note the switch as an event."""
        if self.student is not None and student.version != self.student.version:
            for r, eid in enumerate(self.writer.eids):
                if eid is not None:
                    self.writer.event(r, Event(
                        kind=EventKind.NOTE, step=int(self.writer.steps[r]), t_ns=now_ns(), source="policy_snapshot",
                        reason="policy changed mid-episode", values={"policy_version": student.version,
                                                                     "iteration": int(iteration), "beta": float(beta)}))
        self.student, self.iteration, self.beta = student, int(iteration), float(beta)
        if self._arbiter is not None:
            self._arbiter.beta = self.beta
        if self._engine is not None:
            self._engine.policy = student

    _engine: Engine | None = None

    # -------------------------------------------------------------- the engine's sink

    def begin(self, row: int, seed: int, index: int) -> None:
        if self._indices is not None:
            index = int(self._indices[index])
        self._index[row] = index
        extra = {"expert": self.expert_name, **self.extra}
        if self._indices is not None:
            extra["episode_index"] = int(index)
        self.writer.begin(row, mode=self.mode, policy_version=self.student.version, seed=seed,
                          iteration=self.iteration, beta=self.beta, bc_only=self.mode == CollectionMode.EXPERT_DEMO,
                          extra=extra)

    def step(self, tick: Tick) -> None:
        stats = self.stats
        ids = np.flatnonzero(tick.active)
        assert self._arbiter is not None  # run() set the arbiter
        out = tick.policy
        q: Any = self._arbiter.last  # this tick's ExpertQuery
        assert tick.expert_action is not None and tick.expert_used is not None and tick.clamped is not None
        stats.ticks += 1
        stats.steps += len(ids)
        stats.queried += len(ids)
        stats.invalid += int((~q.valid).sum())
        stats.expert_used += int(tick.expert_used[ids].sum())
        stats.latency_ns.append(int(q.metadata.get("latency_ns", 0)))
        stats.inference_ns.append(int(out.inference_ns))
        phase = q.metadata.get("phase")
        if phase is not None and len(phase) == len(ids):
            stats.label_phases.update(np.asarray(phase)[q.valid].tolist())
        both = ids[q.valid]
        if len(both):
            d = np.linalg.norm(tick.expert_action[both] - out.action[both], axis=1)
            stats.disagreement_sum += float(d.sum())
            stats.disagreement_n += len(both)
        self.writer.write_tick(tick, expert=True)

    def on_clamp(self, row: int, names: str, tick: Tick, command_source: np.ndarray) -> None:
        self.stats.safety_clamps += 1
        self.writer.event(row, Event(kind=EventKind.SAFETY_CLAMP, step=int(self.writer.steps[row]), t_ns=now_ns(),
                                     reason=names, source="safety", values=clamp_values(tick, row, command_source)))

    def end(self, row: int, tick: Tick | None, *, complete: bool) -> None:
        n = int(self.writer.steps[row])
        eid = self.writer.eids[row]
        assert eid is not None  # the row has an open episode
        if complete:
            assert tick is not None and tick.env is not None  # a complete episode ends on a stepped tick
            success = bool(tick.env.success[row])
            reason = end_reason(bool(tick.env.terminated[row]), success)
        else:
            success, reason = False, EndReason.ENV_RESET
        windows = []
        if complete and n > 0:  # a partial episode keeps its raw data but never becomes trainable
            windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=0, handover_start=0, handover_end=n,
                                        source=ActionSource.EXPERT, gate_reason=f"{self.mode.value}: expert labels")]
        certs = planner_certifications(eid, windows, self.expert_name) if self.certify else []
        self.writer.end(row, EpisodeEnd(end_reason=reason, task_success=success, num_steps=n), windows, certs)
        index, self._index[row] = self._index[row], None
        if not complete:
            self.stats.partial_ids.append(eid)
            return
        stats = self.stats
        stats.episode_ids.append(eid)
        if self._indices is not None:
            assert index is not None  # begin() noted the row's index
            stats.episode_index[eid] = index
        stats.lengths.append(n)
        stats.successes.append(success)
        if self._bar is not None:
            self._bar.update(1)
        if self._on_episode is not None:
            self._on_episode(eid, {"length": n, "success": success, "iteration": self.iteration,
                                   "index": index if self._indices is not None else None})

    # -------------------------------------------------------------- the run

    def run(self, *, episodes: int | None, reset_seed: int, stop: Callable[[], bool] | None = None,
            may_begin: Callable[[], bool] | None = None, on_tick: Callable[[int, bool], None] | None = None,
            on_episode: Callable[[str, dict], None] | None = None, progress: bool = False,
            seeds: Sequence[int] | None = None, indices: Sequence[int] | None = None) -> CollectStats:
        """Collect ``episodes`` complete episodes, or with episodes=None until ``stop()``.

        Episode k starts from a reset with seed ``reset_seed + k`` (the engine's seeding rule), or ``seeds[k]``
        (an executor's share of a round), recording its index ``indices[k]`` (default k); episodes then equals
        len(seeds). A free row begins a new episode while the quota (or ``may_begin()``) allows; otherwise it
        idles (stepped by the student, not recorded, not queried).
        """
        if seeds is not None:
            seeds = [int(s) for s in seeds]
            episodes = len(seeds)
            if indices is None:
                indices = list(range(len(seeds)))
        self._indices, self._on_episode = indices, on_episode
        self.stats = CollectStats()
        arbiter: BetaMix
        if self.mode == CollectionMode.EXPERT_DEMO and self.beta >= 1.0:
            arbiter = ExpertOnly(self.expert, self.mapping, seed=self.seed, timeout_s=self.timeout_s)
        else:
            arbiter = BetaMix(self.expert, self.mapping, seed=self.seed, beta=self.beta, timeout_s=self.timeout_s)
        self._arbiter = arbiter
        rows = EpisodeRows(self.env.num_envs, base_seed=reset_seed, seeds=seeds, limit=self.max_steps)
        self._engine = Engine(self.env, self.student, arbiter, self.safety, rows=rows, sinks=[self],
                              on_clamp=self.on_clamp)
        self._bar = tqdm(total=episodes, desc=f"collect it{self.iteration} beta={self.beta:.2f}",
                         disable=not progress, leave=False)
        t0 = time.perf_counter()
        try:
            self._engine.run(episodes=episodes, stop=stop, may_begin=may_begin, on_tick=on_tick)
        finally:
            self._bar.close()
            self._bar = self._engine = None
            self.stats.seconds = time.perf_counter() - t0
        return self.stats
