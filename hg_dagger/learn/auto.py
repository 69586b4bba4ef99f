"""Automatic-expert DAgger (`hg-dagger auto`): collect with beta mixing, aggregate, train, evaluate.

Producer modes (CollectionMode):
  expert_demo   the expert drives every step (beta = 1); episodes are BC-only demonstrations.
  dagger_sync   student and expert are queried in the rollout process, one coin per env and step.
  dagger_async  a separate simulation process (env + expert + recorder) collects continuously with the
                latest policy snapshot - a checkpoint file it reloads when it changes - while this
                process trains; no live model object crosses the process boundary.
  human_gated   the student drives and the gates hand over to a synthetic or planner operator (a
                ``Session`` from the ``gated`` run config, as in `hg-dagger run`); iteration 0 is planner
                demonstrations unless the run starts from ``initial_student``.

At every step both the student and the expert see the same pre-action observation; the expert's
label is stored for it whether or not it was executed. Both answers pass the mapping (policy_to_raw
/ expert_to_raw, each ending in clip_raw) and the chosen one passes clip_raw again before env.step.
Each finished episode is committed with one EXPERT correction window over all its steps, so the
contract's label rules make exactly the steps with a valid expert label trainable.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm import tqdm

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    ControlState,
    CorrectionWindow,
    EndReason,
    EpisodeEnd,
    Event,
    EventKind,
    now_ns,
)
from hg_dagger.contract.labels import planner_certifications
from hg_dagger.control.episodes import EpisodeWriter
from hg_dagger.control.run_config import RunConfig, load_run_config
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.learn.aggregate import ReplayConfig, held_out
from hg_dagger.learn.evaluate import EvalConfig
from hg_dagger.learn.schedules import BetaSchedule
from hg_dagger.learn.train import StudentConfig, TrainConfig

log = logging.getLogger(__name__)

_EXPERT = ActionSource.EXPERT.code
_POLICY = ActionSource.POLICY.code
_CS_EXPERT = ControlState.EXPERT.code
_CS_AUTO = ControlState.AUTONOMOUS.code


# ---------------------------------------------------------------------- configuration


class ExpertSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["planner", "policy"] = "planner"
    checkpoint: str | None = None  # kind: policy
    timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _checkpoint(self):
        if self.kind == "policy" and not self.checkpoint:
            raise ValueError("expert kind 'policy' needs 'checkpoint' (a student checkpoint file)")
        return self


class AsyncSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    snapshot_check_steps: int = Field(default=50, gt=0, description="worker looks for a new snapshot this often")
    start_timeout_s: float = Field(default=120.0, gt=0)
    join_timeout_s: float = Field(default=30.0, gt=0)


class AutoConfig(BaseModel):
    """One `hg-dagger auto` run (configs/auto/*.yaml, kind: auto)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    mode: Literal["expert_demo", "dagger_sync", "dagger_async", "human_gated"] = "dagger_sync"
    certification: Literal["none", "planner_auto"] = Field(
        default="none", description="planner_auto: certify the expert's labels, so they reach training without a "
        "reviewer (recorded per window); none: they wait for review like any window")
    expert: ExpertSpec = Field(default_factory=ExpertSpec)
    num_envs: int = Field(default=8, gt=0)
    seed: int = 0
    iterations: int = Field(default=5, gt=0)
    episodes_per_iteration: int = Field(default=16, gt=0)
    max_episode_steps: int | None = Field(default=None, gt=0, description="cut collection episodes (default: horizon)")
    beta: BetaSchedule = Field(default_factory=BetaSchedule)
    student: StudentConfig = Field(default_factory=StudentConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    recorder_queue_steps: int = Field(default=16384, gt=0)
    recorder_flush_s: float = Field(default=2.0, gt=0, description="writer flush period; longer = fewer, larger writes")
    async_: AsyncSpec = Field(default_factory=AsyncSpec, alias="async")
    dataset_versions: bool = Field(default=True, description="build one dataset version per iteration "
                                   "(OUT/datasets/<task>/vN.json, hg-dagger dataset) and link the policy trained")
    gated: RunConfig | None = Field(default=None, description="mode human_gated: the session (kind: run fields: "
                                    "gates, handover, safety, operator, num_envs, calibrate_steps) over "
                                    "configs/run/<task>.yaml, each section merged key by key; episodes and seeds "
                                    "per iteration come from this config")
    initial_student: str | None = Field(default=None, description="mode human_gated: start from this student "
                                        "checkpoint's weights, gated from iteration 0 (default: a fresh student "
                                        "and planner demonstrations in iteration 0)")

    @model_validator(mode="before")
    @classmethod
    def _gated_over_run_config(cls, data: Any) -> Any:
        """A gated section written in a file changes the task's run config (what `hg-dagger run` uses) where it
        says so: top-level keys replace, a section's keys replace that section's."""
        if not (isinstance(data, dict) and isinstance(data.get("gated"), dict) and isinstance(data.get("task"), str)):
            return data
        over: dict[str, Any] = {}
        for key, value in data["gated"].items():
            if key in ("operator", "handover", "safety") and isinstance(value, dict):
                over.update({f"{key}.{k}": v for k, v in value.items()})
            elif key != "task":
                over[key] = value
        return {**data, "gated": load_run_config(None, data["task"], **over)}

    @model_validator(mode="after")
    def _gated_session(self) -> AutoConfig:
        if self.mode != "human_gated":
            return self
        if self.gated is None:
            self.gated = load_run_config(None, self.task)
        g = self.gated
        if g.task != self.task:
            raise ValueError(f"gated.task is {g.task!r}, the run is for {self.task!r}")
        if g.operator.type == "device" or g.robot is not None:
            raise ValueError("human-gated rounds run unattended: the synthetic or expert operator on a simulator "
                             "(a person or a robot trains between rounds in `hg-dagger app`)")
        return self

    def beta_at(self, iteration: int) -> float:
        if self.mode == "human_gated":  # the student drives; the gates decide when the operator does
            return 1.0 if self.demo_round(iteration) else 0.0
        return 1.0 if self.mode == "expert_demo" else self.beta(iteration)

    def demo_round(self, iteration: int) -> bool:
        """Mode human_gated: iteration 0 of a run from a fresh student is planner demonstrations."""
        return self.mode == "human_gated" and iteration == 0 and self.initial_student is None

    def gated_round(self, iteration: int) -> RunConfig:
        """The run config of one human_gated iteration: its episodes, seeds and round number."""
        return self.gated.model_copy(update={
            "episodes": self.episodes_per_iteration, "seed": _reset_seed(self, iteration), "iteration": iteration,
            "max_episode_steps": self.gated.max_episode_steps or self.max_episode_steps})


def load_config(path: str | Path, **overrides: Any) -> AutoConfig:
    from hg_dagger import config as cfgmod

    data = cfgmod.read_yaml(path)
    kind = data.pop("kind", "auto")
    if kind != "auto":
        raise ConfigError(f"{path}: kind is {kind!r}, expected 'auto'")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return cfgmod.validate(AutoConfig, data, source=str(path))


def build_expert(spec: ExpertSpec, mapping, *, relabel: bool):
    from hg_dagger.experts import make_expert
    from hg_dagger.experts.base import require_relabeler

    expert = make_expert(mapping.task_id, kind=spec.kind, mapping=mapping, checkpoint=spec.checkpoint)
    if relabel:
        require_relabeler(expert, where=f"auto on {mapping.task_id}")
    return expert


# ---------------------------------------------------------------------- collection


@dataclass
class CollectStats:
    steps: int = 0  # env-steps recorded (active rows)
    ticks: int = 0  # batched env.step calls
    seconds: float = 0.0
    queried: int = 0
    invalid: int = 0
    expert_used: int = 0
    disagreement_sum: float = 0.0
    disagreement_n: int = 0
    latency_ns: list[int] = field(default_factory=list)
    inference_ns: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)
    episode_ids: list[str] = field(default_factory=list)
    partial_ids: list[str] = field(default_factory=list)
    episode_index: dict[str, int] = field(default_factory=dict)  # episode id -> its index in ``seeds`` (if given)

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
            "disagreement": self.disagreement_sum / self.disagreement_n if self.disagreement_n else None,
            "collect_success_rate": float(np.mean(self.successes)) if self.successes else None,
            "collect_episode_length": float(np.mean(self.lengths)) if self.lengths else None,
        }


class Collector:
    """Rolls the mixed student/expert policy in one VecEnv and records every active row."""

    def __init__(self, env, expert, recorder, *, mode: str, seed: int, expert_timeout_s: float | None = None,
                 max_episode_steps: int | None = None, expert_name: str = "", certify: bool = False):
        self.env = env
        self.mapping = env.mapping
        self.expert = expert
        self.recorder = recorder
        self.mode = CollectionMode(mode)
        self.seed = int(seed)
        # one coin stream per episode, seeded by (collector seed, episode seed): an episode's expert/student
        # mix does not depend on which rows or workers ran beside it (executor results equal local ones)
        self._coins: list[np.random.Generator | None] = [None] * env.num_envs
        self.extra: dict[str, Any] = {}  # added to every EpisodeStart.extra (executor, worker, staleness)
        self.timeout_s = expert_timeout_s
        self.max_steps = max_episode_steps or self.mapping.horizon
        self.expert_name = expert_name or type(expert).__name__
        self.certify = certify  # record a planner_auto certification per expert window (the run config's switch)
        self.writer = EpisodeWriter(recorder, self.mapping, env.num_envs, env.world_clock, env.robot)
        self.obs_keys = list(self.mapping.obs_spec())
        self.student = None
        self.stats = CollectStats()
        self.iteration = 0
        self.beta = 1.0

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

    def _begin(self, row: int, seed: int, index: int | None = None) -> str:
        self._coins[row] = np.random.default_rng([self.seed, int(seed)])
        extra = {"expert": self.expert_name, **self.extra}
        if index is not None:
            extra["episode_index"] = int(index)
        return self.writer.begin(row, mode=self.mode, policy_version=self.student.version, seed=seed,
                                 iteration=self.iteration, beta=self.beta,
                                 bc_only=self.mode == CollectionMode.EXPERT_DEMO, extra=extra)

    def _end(self, row: int, *, success: bool, truncated: bool, complete: bool) -> None:
        n = int(self.writer.steps[row])
        eid = self.writer.eids[row]
        reason = (EndReason.SUCCESS if success else EndReason.TIMEOUT if truncated else EndReason.FAILURE) \
            if complete else EndReason.ENV_RESET
        windows = []
        if complete and n > 0:  # a partial episode keeps its raw data but never becomes trainable
            windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=0, handover_start=0, handover_end=n,
                                        source=ActionSource.EXPERT, gate_reason=f"{self.mode.value}: expert labels")]
        certs = planner_certifications(eid, windows, self.expert_name) if self.certify else []
        self.writer.end(row, EpisodeEnd(end_reason=reason, task_success=bool(success), num_steps=n), windows, certs)

    def run(self, *, episodes: int | None, reset_seed: int, stop: Callable[[], bool] | None = None,
            may_begin: Callable[[], bool] | None = None, on_tick: Callable[[int, bool], None] | None = None,
            on_episode: Callable[[str, dict], None] | None = None, progress: bool = False,
            seeds: Sequence[int] | None = None, indices: Sequence[int] | None = None) -> CollectStats:
        """Collect ``episodes`` complete episodes, or with episodes=None until ``stop()``.

        A free row begins a new episode while the quota (or ``may_begin()``) allows; otherwise it idles
        (stepped by the student, not recorded, not queried) and is reset before its next episode.
        ``seeds`` (an executor's share of a round) fixes each episode's reset seed: episode k starts from
        ``seeds[k]`` and records its index ``indices[k]`` (default k); episodes then equals len(seeds).
        """
        from hg_dagger.experts import query_expert  # lazily: student-only paths never import experts

        env, m = self.env, self.mapping
        n = env.num_envs
        if seeds is not None:
            seeds = [int(s) for s in seeds]
            episodes = len(seeds)
        index = [None] * n
        stats = self.stats = CollectStats()
        obs, info = env.reset(seed=reset_seed)
        t_obs = np.asarray(info.get("t_obs", np.full(n, now_ns())), dtype=np.int64)
        fresh = np.ones(n, dtype=bool)  # the row's obs is the first of an unrecorded episode
        begun = 0
        bar = tqdm(total=episodes, desc=f"collect it{self.iteration} beta={self.beta:.2f}", disable=not progress,
                   leave=False)
        t0 = time.perf_counter()
        try:
            while not (stop is not None and stop()):
                obs = {k: np.array(v) for k, v in obs.items()}  # the recorder owns what it is handed
                free = [i for i in range(n) if self.writer.eids[i] is None]
                starting, plan = [], {}
                for i in free:
                    if episodes is not None and begun >= episodes:
                        break
                    if may_begin is not None and not may_begin():
                        break
                    starting.append(i)
                    if seeds is not None:
                        plan[i], index[i] = seeds[begun], int(indices[begun]) if indices is not None else begun
                    else:  # the first tick's reset(seed=reset_seed) gave row i reset_seed + i; later ones fresh seeds
                        plan[i] = reset_seed + (i if stats.ticks == 0 else begun)
                    begun += 1
                if starting:
                    # every later episode starts from an explicit seeded reset (an env's own auto-reset after an
                    # ended episode draws an unrecorded seed), so each one records the seed that replays it
                    again = np.array([i for i in starting if stats.ticks > 0 or not fresh[i] or seeds is not None],
                                     dtype=np.int64)
                    if len(again):
                        new_obs, new_info = env.reset(seed=[plan[int(i)] for i in again], env_ids=again)
                        for k in obs:
                            obs[k][again] = new_obs[k][again]
                        t_obs[again] = np.asarray(new_info.get("t_obs", np.full(n, now_ns())))[again]
                    for i in starting:
                        self._begin(i, plan[i], index[i])
                    self.expert.reset(starting, {k: v[starting] for k, v in obs.items()}, info)
                active = self.writer.active()
                if not active.any():
                    if episodes is not None and begun >= episodes:
                        break
                    time.sleep(0.01)  # waiting for permission to begin (a newer policy snapshot)
                    if on_tick is not None:
                        on_tick(stats.ticks, True)
                    continue
                ids = np.flatnonzero(active)
                out = self.student.act(obs)
                t_policy = now_ns()
                q = query_expert(self.expert, {k: v[ids] for k, v in obs.items()}, ids, m, timeout_s=self.timeout_s)
                expert_action, expert_valid = q.scatter(ids, n)
                coin = np.zeros(n, dtype=bool)
                for i in ids:
                    coin[i] = self._coins[i].random() < self.beta
                used = coin & expert_valid
                chosen = np.where(used[:, None], expert_action, out.action)
                applied = m.clip_raw(chosen)
                res = env.step(applied)
                stats.ticks += 1
                stats.steps += len(ids)
                stats.queried += len(ids)
                stats.invalid += int((~q.valid).sum())
                stats.expert_used += int(used[ids].sum())
                stats.latency_ns.append(int(q.metadata.get("latency_ns", 0)))
                stats.inference_ns.append(int(out.inference_ns))
                both = ids[q.valid]
                if len(both):
                    d = np.linalg.norm(expert_action[both] - out.action[both], axis=1)
                    stats.disagreement_sum += float(d.sum())
                    stats.disagreement_n += len(both)
                source = np.where(used, _EXPERT, _POLICY).astype(np.uint8)
                control = np.where(used, _CS_EXPERT, _CS_AUTO).astype(np.uint8)
                reward = np.asarray(res.reward, dtype=np.float32)
                t_apply = np.asarray(res.info.get("t_action_apply", np.full(n, NO_TIME_FILL)), dtype=np.int64)
                success = np.asarray(res.info["success"], dtype=bool)
                cols = {f"obs/{k}": obs[k] for k in self.obs_keys}
                cols.update({
                    "t_obs": t_obs, "t_action_apply": t_apply, "policy_action": out.action,
                    "policy_confidence": out.confidence, "policy_uncertainty": out.uncertainty,
                    "expert_action": expert_action, "expert_valid": expert_valid, "expert_used": used,
                    "applied_action": applied, "action_source": source, "control_state": control,
                    "reward": reward, "terminated": np.asarray(res.terminated),
                    "truncated": np.asarray(res.truncated), "success": success,
                })
                self.writer.write(ids, cols, {"t_policy": t_policy, "inference_ns": out.inference_ns, "valid": True})
                ended = np.asarray(res.terminated | res.truncated, dtype=bool)
                lengths = self.writer.steps
                cut = active & ~ended & (lengths >= self.max_steps)
                fresh = ended.copy()
                for i in np.flatnonzero((ended | cut) & active):
                    eid, length = self.writer.eids[i], int(self.writer.steps[i])
                    self._end(int(i), success=bool(success[i]), truncated=bool(res.truncated[i] or cut[i]),
                              complete=True)
                    stats.episode_ids.append(eid)
                    if index[i] is not None:
                        stats.episode_index[eid] = index[i]
                    stats.lengths.append(length)
                    stats.successes.append(bool(success[i]))
                    bar.update(1)
                    if on_episode is not None:
                        on_episode(eid, {"length": length, "success": bool(success[i]), "iteration": self.iteration,
                                         "index": index[i]})
                obs = res.obs
                info = res.info
                t_obs = np.asarray(res.info.get("t_obs", np.full(n, now_ns())), dtype=np.int64)
                if on_tick is not None:
                    on_tick(stats.ticks, False)
        finally:
            for r, eid in enumerate(self.writer.eids):  # stopped mid-episode: commit the raw data, never trainable
                if eid is not None:
                    stats.partial_ids.append(eid)
                    self._end(r, success=False, truncated=False, complete=False)
            bar.close()
            stats.seconds = time.perf_counter() - t0
        return stats


NO_TIME_FILL = -1


# ---------------------------------------------------------------------- the loop


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


class AutoRun:
    """State of one `hg-dagger auto` run: out_dir holds checkpoint.pt, metrics.jsonl, loss.jsonl, eval/."""

    def __init__(self, cfg: AutoConfig, out_dir: str | Path, store_url: str | None = None, executor=None):
        self.cfg = cfg
        self.executor = executor  # learn.executor: local (default) or ray; the caller closes one it passes
        self.out = Path(out_dir)
        self.store_url = str(store_url or self.out / "store")
        self.checkpoint_path = self.out / "checkpoint.pt"
        self.metrics_path = self.out / "metrics.jsonl"

    # -------------------------------------------------------------- setup

    def _open_store(self):
        from hg_dagger.store import EpisodeStore

        if Path(self.store_url).exists() or "://" in self.store_url:
            try:
                return EpisodeStore.open(self.store_url, mode="a")
            except HgDaggerError:
                if "://" in self.store_url:
                    raise
        return EpisodeStore.create(self.store_url)

    def _trainer(self, mapping, store, resume: bool):
        from hg_dagger.learn.aggregate import Replay
        from hg_dagger.learn.train import Trainer, store_loader
        from hg_dagger.policy import Student

        if resume:
            if not self.checkpoint_path.is_file():
                raise ConfigError(f"{self.checkpoint_path}: nothing to resume (no checkpoint in {self.out})")
            trainer = Trainer.resume(self.checkpoint_path, mapping, store_loader(store, mapping), self.cfg.train)
            self._restore_metrics_line()
            log.info("resumed %s: iteration %d, policy %s, beta %s", self.checkpoint_path, trainer.iteration,
                     trainer.student.version, trainer.beta)
            return trainer
        sc = self.cfg.student
        if self.cfg.initial_student:
            student = Student.load(self.cfg.initial_student, mapping)
        else:
            student = Student.create(mapping, kind=sc.kind, ensemble=sc.ensemble, hidden=sc.hidden, seed=self.cfg.seed)
        return Trainer(student, self.cfg.train, Replay(self.cfg.replay, seed=self.cfg.seed))

    def _restore_metrics_line(self) -> None:
        """A kill after the checkpoint and before its metrics line: write the line the checkpoint carries."""
        from hg_dagger.learn.progress import read_metrics
        from hg_dagger.policy.checkpoint import read_checkpoint

        line = read_checkpoint(self.checkpoint_path)["extra"].get("metrics_line")
        if not line:
            return
        it = json.loads(line)["iteration"]
        if any(r["iteration"] == it for r in read_metrics(self.metrics_path)):
            return
        text = self.metrics_path.read_text() if self.metrics_path.is_file() else ""
        with open(self.metrics_path, "a") as f:  # after a line the kill cut short, on a line of its own
            f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")
        log.info("restored iteration %d's metrics line from %s", it, self.checkpoint_path)

    # -------------------------------------------------------------- one iteration's learning half

    def _learn(self, it, beta, trainer, store, mapping, new_ids, collect, env_eval, progress,
               after_fit: Callable[[], None] | None = None, infos: dict | None = None) -> dict[str, Any]:
        from hg_dagger.learn.evaluate import closed_loop
        from hg_dagger.store.trainable import load_labels

        keys = list(mapping.obs_spec())
        if infos is None:  # a gated round has waited for its commits already
            infos = _wait_complete(store, new_ids)
        dataset = self._dataset_version(it)
        frac = trainer.replay.config.holdout_fraction
        trainer.replay.add(load_labels(store, infos[eid], keys, trainer.replay.config.authorization) for eid in new_ids
                           if not held_out(eid, infos[eid].start.split, frac))
        trainer.iteration, trainer.beta = it + 1, beta
        fit = trainer.fit(log_path=self.out / "loss.jsonl", progress=progress, info={"beta": beta})
        if after_fit is not None:
            after_fit()
        if self.executor is not None and self.executor.kind != "local":
            ev = self.executor.evaluate(trainer.student, mapping.task_id, self.cfg.eval)
        else:
            ev = closed_loop(trainer.student, env_eval, self.cfg.eval)
        ev.pop("per_episode")
        row = {
            "iteration": it, "mode": self.cfg.mode, "beta": beta, "policy_version": trainer.student.version,
            "collected_with": collect.pop("policy_versions", None),
            **collect, "replay": trainer.replay.summary(), "train": fit,
            "eval_success_rate": ev["success_rate"], "eval_episode_length": ev["episode_length_mean"],
            "eval": ev, "rss_mb": _rss_mb(),
        }
        if dataset is not None:
            from hg_dagger.datasets.versions import record_training

            row["dataset"] = dataset.ref
            record_training(self.out / "datasets", dataset, trainer.student.version, str(self.checkpoint_path))
        line = json.dumps(row, default=str)
        # the checkpoint carries its own metrics line: a kill between the two writes loses no point of the curve
        trainer.save(self.checkpoint_path, metrics_line=line)
        with open(self.metrics_path, "a") as f:
            f.write(line + "\n")
        log.info("iteration %d: beta %.3f labels %d eval success %.0f%% (policy %s)", it, beta, len(trainer.replay),
                 100 * ev["success_rate"], trainer.student.version)
        if getattr(self, "on_round", None) is not None:  # unattended runs: a summary line, ETA, curve.png
            self.on_round(row)
        return row

    def _dataset_version(self, it: int):
        """dataset_v(N+1) of this run's store after iteration ``it``'s episodes are committed (None when off)."""
        if not self.cfg.dataset_versions:
            return None
        from hg_dagger.datasets.versions import DatasetConfig, SelectionConfig, build

        cfg = DatasetConfig(selection=SelectionConfig(task=self.cfg.task, rule=self.cfg.replay.authorization))
        manifest, _ = build(self.cfg.task, [self.store_url], root=self.out / "datasets", config=cfg,
                            author=f"auto iteration {it}")
        return manifest

    # -------------------------------------------------------------- run

    def run(self, *, resume: bool = False, progress: bool = True) -> list[dict[str, Any]]:
        import torch

        from hg_dagger.envs import load_mapping, make_env

        cfg = self.cfg
        if not resume and self.checkpoint_path.exists():
            raise ConfigError(f"{self.out}: already holds a run ({self.checkpoint_path.name}); pass --resume to "
                              f"continue it or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        mapping = load_mapping(cfg.task)
        store = self._open_store()
        trainer = self._trainer(mapping, store, resume)
        start = trainer.iteration
        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.train.threads)
        rows: list[dict[str, Any]] = []
        try:
            with make_env(mapping, num_envs=min(cfg.eval.num_envs, cfg.eval.episodes), seed=cfg.eval.seed) as env_eval:
                if cfg.mode == "dagger_async" and (self.executor is None or self.executor.kind == "local"):
                    rows = self._run_async(start, trainer, store, mapping, env_eval, progress)
                else:
                    rows = self._run_sync(start, trainer, store, mapping, env_eval, progress)
        finally:
            torch.set_num_threads(threads)
        return rows

    def _run_sync(self, start, trainer, store, mapping, env_eval, progress) -> list[dict[str, Any]]:
        """Rounds through the executor: round ``it`` collects episodes seeded _reset_seed(cfg, it) + k.

        dagger_async here (a Ray executor) is pipelined: round it + 1 is submitted with the policy of round it
        before round it trains, so the workers collect while the driver trains, with a staleness of one round."""
        from hg_dagger.learn.executor import LocalExecutor

        cfg = self.cfg
        ex = self.executor if self.executor is not None else LocalExecutor()
        pipelined = cfg.mode == "dagger_async"
        rows = []
        ahead = None
        try:
            for it in range(start, cfg.iterations):
                beta = cfg.beta_at(it)
                rss0 = _rss_mb()
                if cfg.mode == "human_gated" and not cfg.demo_round(it):
                    ids, collect, infos = self._gated_round(ex, it, trainer, store, mapping, progress)
                    collect.update(rss_growth_mb=_rss_mb() - rss0, executor=ex.describe(), staleness_rounds=0)
                    rows.append(self._learn(it, beta, trainer, store, mapping, ids, collect, env_eval, progress,
                                            infos=infos))
                    continue
                seeds = [_reset_seed(cfg, it) + k for k in range(cfg.episodes_per_iteration)]
                if ahead is None:
                    demo = cfg.model_copy(update={"mode": "expert_demo"}) if cfg.demo_round(it) else cfg
                    ahead = ex.collect(demo, self.store_url, trainer.student, iteration=it, beta=beta, seeds=seeds,
                                       progress=progress)
                round_ = ahead.result()
                ahead = None
                if pipelined and it + 1 < cfg.iterations:  # the next round starts now, with this round's policy
                    ahead = ex.collect(cfg, self.store_url, trainer.student, iteration=it + 1,
                                       beta=cfg.beta_at(it + 1), policy_iteration=it,
                                       seeds=[_reset_seed(cfg, it + 1) + k for k in range(cfg.episodes_per_iteration)])
                stats = round_.stats
                collect = stats.summary()
                if cfg.demo_round(it):  # a person demonstrating would have driven every step of every episode
                    collect.update(operator_s=stats.steps * mapping.dt, context_switches=len(stats.episode_ids),
                                   windows=len(stats.episode_ids), intervention_rate=1.0)
                staleness = 1 if pipelined and it > start else 0
                collect.update(recorder=round_.recorder, rss_growth_mb=_rss_mb() - rss0,
                               policy_versions=round_.policy_versions, executor=ex.describe(),
                               staleness_rounds=staleness, worker_failures=round_.failures)
                rows.append(self._learn(it, beta, trainer, store, mapping, round_.episode_ids, collect, env_eval,
                                        progress))
            if ahead is not None:
                ahead.result()
        finally:
            if self.executor is None:
                ex.close()
        return rows

    def _gated_round(self, ex, it, trainer, store, mapping, progress) -> tuple[list[str], dict[str, Any], dict]:
        """Iteration ``it`` of mode human_gated: `hg-dagger run` with the current student (a Session per
        executor worker, the confidence gate calibrated on it first when the run config asks)."""
        from hg_dagger.learn.effort import operator_seconds

        lost = len(ex.failures)
        path = self.out / "student_acting.pt"  # what the sessions load: one file, no live model shared
        trainer.student.save(path)
        t0 = time.perf_counter()
        summary = ex.run_gated(self.cfg.gated_round(it), self.store_url, student_path=str(path), progress=progress)
        infos = _wait_complete(store, summary.episode_ids)
        collect = {
            "episodes": summary.episodes, "env_steps": summary.steps, "seconds": time.perf_counter() - t0,
            "collect_success_rate": summary.successes / summary.episodes if summary.episodes else None,
            "intervention_rate": summary.human_steps / summary.steps if summary.steps else 0.0,
            "human_steps": summary.human_steps, "windows": summary.windows,
            "context_switches": summary.context_switches, "gate_triggers": summary.gate_triggers,
            "operator_s": operator_seconds(store, (infos[e] for e in summary.episode_ids), mapping.dt), "safety_clamps": summary.safety_clamps,
            "estops": summary.estops, "policy_versions": [trainer.student.version], "notes": summary.notes,
            "worker_failures": ex.failures[lost:],
        }
        return summary.episode_ids, collect, infos

    def _run_async(self, start, trainer, store, mapping, env_eval, progress) -> list[dict[str, Any]]:
        cfg = self.cfg
        snapshot = self.out / "snapshot.pt"
        trainer.student.save(snapshot, iteration=start, beta=cfg.beta_at(start))
        ctx = mp.get_context("spawn")
        messages = ctx.Queue()
        stop = ctx.Event()
        worker = ctx.Process(target=_async_worker, name="hg-dagger-sim",
                             args=(cfg.model_dump(by_alias=True), self.store_url, str(snapshot), messages, stop))
        worker.start()
        rows = []
        pending: list[str] = []
        per_ep: dict[str, dict] = {}
        worker_stats: dict[str, Any] = {}
        try:
            for it in range(start, cfg.iterations):
                beta = cfg.beta_at(it)
                rss0 = _rss_mb()
                t0 = time.perf_counter()
                deadline = time.monotonic() + cfg.async_.start_timeout_s + 60.0 * cfg.episodes_per_iteration
                while len(pending) < cfg.episodes_per_iteration:
                    if not worker.is_alive():
                        raise HgDaggerError(f"dagger_async: simulation process exited with code {worker.exitcode} "
                                            f"before iteration {it} had {cfg.episodes_per_iteration} episodes")
                    try:
                        kind, payload = messages.get(timeout=1.0)
                    except queue.Empty:
                        if time.monotonic() > deadline:
                            raise HgDaggerError(f"dagger_async: no episodes from the simulation process for iteration {it}") from None
                        continue
                    if kind == "episode":
                        pending.append(payload["episode_id"])
                        per_ep[payload["episode_id"]] = payload
                    elif kind == "stats":
                        worker_stats = payload
                    elif kind == "error":
                        raise HgDaggerError(f"dagger_async: simulation process failed: {payload}")
                take, pending = pending[: cfg.episodes_per_iteration], pending[cfg.episodes_per_iteration:]
                eps = [per_ep.pop(e) for e in take]
                collect = {
                    "episodes": len(take), "wait_s": time.perf_counter() - t0,
                    "collect_success_rate": float(np.mean([e["success"] for e in eps])),
                    "collect_episode_length": float(np.mean([e["length"] for e in eps])),
                    "policy_versions": sorted({e["policy_version"] for e in eps}),
                    "snapshot_lag_iterations": float(np.mean([it - e["iteration"] for e in eps])),
                    "worker": worker_stats, "rss_growth_mb": _rss_mb() - rss0,
                }
                def hand_off(it=it):  # the only way a policy reaches the simulation process
                    trainer.student.save(snapshot, iteration=it + 1, beta=cfg.beta_at(it + 1))

                rows.append(self._learn(it, beta, trainer, store, mapping, take, collect, env_eval, progress,
                                        after_fit=hand_off))
        finally:
            stop.set()
            _drain_and_join(worker, messages, cfg.async_.join_timeout_s)
        return rows


def _reset_seed(cfg: AutoConfig, it: int) -> int:
    return cfg.seed + 7919 * (it + 1) * max(cfg.num_envs, 1)


def _rec_stats(rec) -> dict[str, Any]:
    stats = getattr(rec, "stats", None)
    if stats is None:
        return {}
    if isinstance(stats, dict):
        return dict(stats)
    return {k: v for k, v in vars(stats).items() if isinstance(v, int | float | str)}


def _wait_complete(store, ids: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """EpisodeInfo of each id once its commit is visible (the async writer may still be finishing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if hasattr(store, "refresh"):
            store.refresh()
        infos = {i.episode_id: i for i in store.episodes()}
        missing = [e for e in ids if e not in infos or not infos[e].complete]
        if not missing:
            return infos
        if time.monotonic() > deadline:
            raise HgDaggerError(f"episodes {missing[:3]} (of {len(missing)}) never became complete in the store")
        time.sleep(0.05)


def _drain_and_join(proc, messages, timeout_s: float) -> None:
    """Join the simulation process; its queue must be emptied first or its feeder thread blocks exit."""
    deadline = time.monotonic() + timeout_s
    while proc.is_alive() and time.monotonic() < deadline:
        try:
            while True:
                messages.get_nowait()
        except queue.Empty:
            pass
        proc.join(0.1)
    if proc.is_alive():
        proc.terminate()
        proc.join(5.0)
        raise HgDaggerError(f"dagger_async: simulation process did not stop within {timeout_s:g} s; terminated it")
    messages.close()
    messages.join_thread()


# ---------------------------------------------------------------------- the simulation process


def _async_worker(cfg_dict: dict, store_url: str, snapshot: str, messages, stop) -> None:
    """dagger_async simulation process: env + expert + recorder; the policy comes only from snapshot files."""
    import torch

    torch.set_num_threads(1)
    try:
        from hg_dagger.envs import load_mapping, make_env
        from hg_dagger.policy import Student
        from hg_dagger.policy.checkpoint import read_checkpoint
        from hg_dagger.store import EpisodeStore

        cfg = AutoConfig.model_validate(cfg_dict)
        mapping = load_mapping(cfg.task)
        expert = build_expert(cfg.expert, mapping, relabel=True)
        store = EpisodeStore.open(store_url, mode="a")
        rec = store.recorder(flush_interval_s=cfg.recorder_flush_s, queue_steps=cfg.recorder_queue_steps)
        seen = {"stamp": None}

        def load_snapshot(collector) -> None:
            st = os.stat(snapshot)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == seen["stamp"]:
                return
            data = read_checkpoint(snapshot)
            collector.set_policy(Student.load(snapshot, mapping), iteration=int(data["extra"]["iteration"]),
                                 beta=float(data["extra"]["beta"]))
            seen["stamp"] = stamp

        with make_env(mapping, num_envs=cfg.num_envs, seed=cfg.seed) as env:
            collector = Collector(env, expert, rec, mode=cfg.mode, seed=cfg.seed * 1000 + 17,
                                  expert_timeout_s=cfg.expert.timeout_s, max_episode_steps=cfg.max_episode_steps,
                                  certify=cfg.certification == "planner_auto")
            load_snapshot(collector)

            begun_for: dict[int, int] = {}

            def may_begin() -> bool:
                """At most episodes_per_iteration episodes per snapshot: staleness stays bounded."""
                k = collector.iteration
                if begun_for.get(k, 0) >= cfg.episodes_per_iteration:
                    return False
                begun_for[k] = begun_for.get(k, 0) + 1
                return True

            def on_tick(ticks: int, waiting: bool) -> None:
                if waiting or ticks % cfg.async_.snapshot_check_steps == 0:
                    load_snapshot(collector)
                    messages.put(("stats", collector.stats.summary()))

            def on_episode(eid: str, info: dict) -> None:
                messages.put(("episode", {"episode_id": eid, "policy_version": collector.student.version, **info}))

            try:
                stats = collector.run(episodes=None, reset_seed=_reset_seed(cfg, 0), stop=stop.is_set,
                                      may_begin=may_begin, on_tick=on_tick, on_episode=on_episode)
            finally:
                rec.close()
            messages.put(("stats", {**stats.summary(), "partial_episodes": len(stats.partial_ids),
                                    "recorder": _rec_stats(rec)}))
    except BaseException as exc:  # noqa: BLE001 - reported to the learner process
        messages.put(("error", f"{type(exc).__name__}: {exc}"))
        raise


def leftover_workers() -> list[str]:
    """Live child processes and helper threads (for shutdown checks).

    Interpreter-wide helpers are not counted: Python's multiprocessing resource tracker (started with
    the first spawned child) and zarr's I/O event loop and its executor threads (started with the first
    store access) and tqdm's progress-bar monitor; they live as long as the interpreter, whatever we start
    or stop.
    """
    kids = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.Error:
            continue
        kids.append(f"process {p.pid} {p.name()}")
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
               and not (t.name in ("zarr_io", "tqdm_monitor") or t.name.startswith("asyncio_"))]
    return kids + [f"thread {t}" for t in threads]
