"""The configuration of `hg-dagger auto` (configs/auto/*.yaml, kind: auto).

Producer modes (CollectionMode):
  expert_demo   the expert drives every step (beta = 1); episodes are BC-only demonstrations.
  dagger_sync   student and expert are queried in the rollout process, one coin per env and step.
  dagger_async  a separate simulation process (env + expert + recorder) collects continuously with the
                latest policy snapshot - a checkpoint file it reloads when it changes - while this
                process trains; no live model object crosses the process boundary.
  human_gated   the student drives and the gates hand over to a synthetic or planner operator (a
                ``Session`` from the ``gated`` run config, as in `hg-dagger run`); iteration 0 is planner
                demonstrations unless the run starts from ``initial_student``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, model_validator

from hg_dagger import config as cfgmod
from hg_dagger.contract.enums import CollectionMode
from hg_dagger.contract.model import StrictModel
from hg_dagger.control.run_config import RunConfig, load_run_config
from hg_dagger.control.safety import SafetyConfig
from hg_dagger.errors import ConfigError
from hg_dagger.learn.aggregate import LabelBufferConfig
from hg_dagger.learn.budget import check_one_budget, task_budget
from hg_dagger.learn.evaluate import EvalConfig
from hg_dagger.learn.promotion import PromotionConfig
from hg_dagger.learn.schedules import BetaSchedule
from hg_dagger.learn.train import StudentConfig, TrainConfig


class ExpertSpec(StrictModel):
    kind: Literal["planner", "policy"] = "planner"
    checkpoint: str | None = None  # kind: policy
    timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _checkpoint(self):
        if self.kind == "policy" and not self.checkpoint:
            raise ValueError("expert kind 'policy' needs 'checkpoint' (a student checkpoint file)")
        return self


class AsyncSpec(StrictModel):
    snapshot_check_steps: int = Field(default=50, gt=0, description="worker looks for a new snapshot this often")
    start_timeout_s: float = Field(default=120.0, gt=0)
    join_timeout_s: float = Field(default=30.0, gt=0)


class AutoConfig(StrictModel):
    """One `hg-dagger auto` run (configs/auto/*.yaml, kind: auto)."""

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
    replay: LabelBufferConfig = Field(default_factory=LabelBufferConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig, description="the held-out evaluation "
                                       "after which a trained student takes over, or the acting one goes on "
                                       "(learn.promotion; default on for mode human_gated)")
    recoverability_episodes: int = Field(
        default=10, ge=0, description="per iteration: failed evaluation episodes the expert takes over at the "
        "student's first-failure step; the share it completes is the round's expert recoverability (0: off)")
    safety: SafetyConfig | None = Field(default=None, description="the safety monitor every collected action "
                                        "passes (default: the task's run config safety section, as a session)")
    recorder_queue_steps: int = Field(default=16384, gt=0)
    recorder_flush_s: float = Field(default=2.0, gt=0, description="writer flush period; longer = fewer, larger writes")
    async_: AsyncSpec = Field(default_factory=AsyncSpec, alias="async")
    dataset_versions: bool = Field(default=True, description="build one dataset version per iteration "
                                   "(OUT/datasets/<task>/vN.json, hg-dagger dataset) and link the policy trained")
    gated: RunConfig | None = Field(default=None, description="mode human_gated: the session (kind: run fields: "
                                    "gates, handover, safety, operator, num_envs, calibrate_steps) over "
                                    "configs/run/<task>.yaml, each section merged key by key; episodes and seeds "
                                    "per iteration come from this config")
    gated_windows: list[NonNegativeInt] = Field(default_factory=list, description="mode human_gated: a correction-window cap "
                                     "per iteration from iteration 1 on (the last value holds; 0: none): a round "
                                     "watches up to episodes_per_iteration student episodes and stops beginning "
                                     "more once it holds that many windows")
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
        if self.mode != CollectionMode.HUMAN_GATED:
            return self
        if self.gated is None:
            self.gated = load_run_config(None, self.task)
        g = self.gated
        if g.task != self.task:
            raise ValueError(f"gated.task is {g.task!r}, the run is for {self.task!r}")
        if g.operator.type == "device" or g.robot is not None:
            raise ValueError("human-gated rounds run unattended: the synthetic or expert operator on a simulator "
                             "(a person or a robot trains between rounds in `hg-dagger app`)")
        # one time budget: the gated sessions cut their episodes where evaluation stops them
        budget = g.max_episode_steps or self.max_episode_steps or self.eval.max_steps or task_budget(self.task)
        if self.eval.max_steps is None:
            self.eval = self.eval.model_copy(update={"max_steps": budget})
        try:
            check_one_budget(budget, self.eval.max_steps, where=f"auto on {self.task}")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if g.max_episode_steps is None:
            self.gated = g.model_copy(update={"max_episode_steps": budget})
        return self

    def beta_at(self, iteration: int) -> float:
        if self.mode == CollectionMode.HUMAN_GATED:  # the student drives; the gates decide when the operator does
            return 1.0 if self.demo_round(iteration) else 0.0
        return 1.0 if self.mode == CollectionMode.EXPERT_DEMO else self.beta(iteration)

    @property
    def promoting(self) -> bool:
        """Whether a trained student must pass the held-out evaluation before it acts."""
        on = self.promotion.enabled
        return self.mode == CollectionMode.HUMAN_GATED if on is None else bool(on)

    def demo_round(self, iteration: int) -> bool:
        """Mode human_gated: iteration 0 of a run from a fresh student is planner demonstrations."""
        return self.mode == CollectionMode.HUMAN_GATED and iteration == 0 and self.initial_student is None

    def gated_round(self, iteration: int) -> RunConfig:
        """The run config of one human_gated iteration: its episodes, seeds, round number and window cap."""
        assert self.gated is not None  # set by the validator (_gated_session) in mode human_gated
        return self.gated.model_copy(update={
            "episodes": self.episodes_per_iteration, "seed": reset_seed(self, iteration), "iteration": iteration,
            "max_episode_steps": self.gated.max_episode_steps or self.max_episode_steps,
            "windows": self.round_windows(iteration)})

    def round_windows(self, iteration: int) -> int | None:
        """Iteration ``iteration``'s correction-window cap: ``gated_windows`` from iteration 1 on, its last value
        for later ones (0: none); else the gated run config's own."""
        if not self.gated_windows or iteration < 1:
            return self.gated.windows if self.gated is not None else None
        return self.gated_windows[min(iteration, len(self.gated_windows)) - 1] or None


def load_config(path: str | Path, **overrides: Any) -> AutoConfig:
    data = cfgmod.read_yaml(path)
    kind = data.pop("kind", "auto")
    if kind != "auto":
        raise ConfigError(f"{path}: kind is {kind!r}, expected 'auto'")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return cfgmod.validate(AutoConfig, data, source=str(path))


def reset_seed(cfg: AutoConfig, it: int) -> int:
    """The base reset seed of iteration ``it``'s episodes (episode k: base + k)."""
    return cfg.seed + 7919 * (it + 1) * max(cfg.num_envs, 1)
