"""Training between rounds of a live session, in a process of its own.

The app must keep its control loop (and a robot) responsive while a student trains, so training
runs in a spawned process that hands back only a checkpoint path; progress and the outcome come
back as plain messages. No model object crosses the process boundary.

    job = BackgroundJob(train_round, store=..., task=..., out_dir=..., resume=current_ckpt)
    job.poll()   # -> list of Progress; job.done / job.result / job.error

``bootstrap_student`` makes the first, deliberately weak student of a task from a few planner
demonstrations, so a first session has a policy whose mistakes the gates can catch.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hg_dagger.contract.enums import CollectionMode
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.errors import HgDaggerError
from hg_dagger.learn.promotion import PromotionConfig
from hg_dagger.review.qc import run_qc
from hg_dagger.store import EpisodeStore

log = logging.getLogger(__name__)

Report = Callable[[str, float], None]  # (stage text, fraction 0..1 of that stage)


@dataclass(frozen=True)
class Progress:
    """A message from the job's process: how far its current stage is."""

    stage: str
    fraction: float


@dataclass(frozen=True)
class Finished:
    """The job's last message when it succeeded: what ``fn`` returned."""

    result: Any


@dataclass(frozen=True)
class Failed:
    """The job's last message when it raised: one line for our errors, else the traceback."""

    message: str


class BackgroundJob:
    """Runs ``fn(report=..., **kwargs)`` in a spawned process; ``fn`` returns a JSON-able result."""

    def __init__(self, fn: Callable[..., Any], **kwargs: Any):
        ctx = mp.get_context("spawn")
        self._q = ctx.Queue()
        self._proc = ctx.Process(target=_child, args=(fn, kwargs, self._q), daemon=True, name=f"hg-dagger-{fn.__name__}")
        self._proc.start()
        self.done = False
        self.result: Any = None
        self.error = ""
        self.last = Progress("starting", 0.0)

    def poll(self) -> list[Progress]:
        """Messages that arrived since the last call (never blocks)."""
        out = []
        while True:
            try:
                msg = self._q.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, Progress):
                self.last = msg
                out.append(msg)
            elif isinstance(msg, Finished):
                self.result, self.done = msg.result, True
            elif isinstance(msg, Failed):
                self.error, self.done = msg.message, True
        if not self.done and not self._proc.is_alive() and self._q.empty():
            self._proc.join(1)
            self.done = True
            self.error = self.error or f"training process ended with exit code {self._proc.exitcode}"
        return out

    def wait(self, timeout: float) -> bool:
        """Block until done (scripts, tests); True when finished."""
        deadline = time.monotonic() + timeout
        while not self.done and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.05)
        return self.done

    def cancel(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self.done = True
        self.error = self.error or "cancelled"


def _child(fn, kwargs, q) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in the terminal reaches the app, which cancels the job

    def report(stage: str, fraction: float) -> None:
        q.put(Progress(stage, float(fraction)))

    try:
        q.put(Finished(fn(report=report, **kwargs)))
    except Exception as exc:  # noqa: BLE001 - sent to the parent as text
        msg = str(exc) if isinstance(exc, HgDaggerError) else f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        q.put(Failed(msg))


def _stepper(report: Report, stage: str) -> Callable[[int, int], None]:
    """An on_step callback that reports about every 2% of the steps."""

    def on_step(done: int, total: int) -> None:
        if done == total or done % max(1, total // 50) == 0:
            report(stage, done / total)

    return on_step


def train_round(*, store: str, task: str, out_dir: str, resume: str | None = None, steps: int = 1500,
                seed: int = 0, promotion: dict[str, Any] | None = None, report: Report) -> dict[str, Any]:
    """The next student from every label of ``task`` in ``store`` that may be trained on (reviewed and
    authorized, QC-passed, replayable: contract.training_selection), starting from the weights of the
    student at ``resume`` (a checkpoint from anywhere: its replay is not needed). QC runs first, so the
    operator's reviewed windows need nothing else. With ``promotion`` (a PromotionConfig's fields), the new
    student must then pass the held-out evaluation against the one at ``resume`` (learn.round_promotion): the
    result's ``promotion`` says whether it takes over."""
    # deferred: learn.round_promotion and learn.train import torch; importing this module stays free of it
    import torch

    from hg_dagger.learn.train import TrainConfig, train_from_store

    torch.set_num_threads(1)
    report("quality checks", 0.0)
    run_qc(store, progress=False)
    report("loading labels", 0.0)
    cfg = TrainConfig(steps=steps, seed=seed)
    result = train_from_store(store, task, out_dir, train_cfg=cfg, warm_start=resume, progress=False,
                              on_step=_stepper(report, "training"))
    report("calibrating the confidence gate", 1.0)  # train_from_store stored the thresholds with the student
    decision = None
    if promotion is not None:
        # deferred: it loads torch and a simulator, and the app imports this module in its own process to start jobs
        from hg_dagger.learn.round_promotion import judge_checkpoint

        decision = judge_checkpoint(result["checkpoint"], resume, task, PromotionConfig(**promotion), report)
    return {"checkpoint": result["checkpoint"], "version": result["version"], "labels": result["labels"],
            "selection": result["selection"], "loss_last": result["loss_last"], "seconds": result["seconds"],
            "gate_calibration": result["gate_calibration"], "calibration": [], "promotion": decision}


def bootstrap_student(*, task: str, store: str, out_dir: str, demos: int = 6, steps: int = 600, seed: int = 0,
                      report: Report) -> dict[str, Any]:
    """A first student: ``demos`` planner demonstrations recorded into ``store`` (expert_demo, BC-only),
    then behaviour cloning for ``steps`` gradient steps. Few of both on purpose: the student should
    reach the object but make mistakes the gates catch."""
    # deferred: it loads the run config and torch; importing this module stays free of them (tests/learn/test_eval.py: eval loads none)
    import torch

    from hg_dagger.learn.auto import Collector, ExpertSpec, build_expert
    from hg_dagger.policy import Student

    torch.set_num_threads(1)
    mapping = load_mapping(task)
    st = EpisodeStore.create(store, exist_ok=True)
    expert = build_expert(ExpertSpec(), mapping, relabel=False)
    done = 0

    def on_episode(_eid: str, _info: dict) -> None:
        nonlocal done
        done += 1
        report("planner demonstrations", done / demos)

    report("planner demonstrations", 0.0)
    with make_env(mapping, num_envs=min(4, demos), seed=seed) as env:
        rec = st.recorder()
        try:
            collector = Collector(env, expert, rec, mode=CollectionMode.EXPERT_DEMO.value, seed=seed, certify=True)
            collector.set_policy(Student.create(mapping, seed=seed), iteration=0, beta=1.0)
            collector.run(episodes=demos, reset_seed=seed, on_episode=on_episode)
        finally:
            rec.close()
    result = train_round(store=store, task=task, out_dir=out_dir, steps=steps, seed=seed, report=report)
    return {**result, "demos": demos}

