"""The main job of `make run`: the most complete end-to-end path, headless, on the embedded MuJoCo task.

1. planner-expert demonstrations (BC-only episodes) recorded into a fresh store,
2. a behaviour-cloned ensemble student trained on them and evaluated student-only,
3. a human-gated run: the student acts, gates hand over to the planner-driven synthetic operator,
   corrections are recorded as windows bound to their parent episodes,
4. `validate` over the whole store, and a summary of where the data went.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hg_dagger.contract import CollectionMode, LabelMask
from hg_dagger.errors import HgDaggerError

log = logging.getLogger(__name__)


@dataclass
class DemoReport:
    out_dir: Path
    store: Path
    checkpoint: Path
    bc_success_rate: float
    gated: dict[str, Any]
    episodes_by_mode: dict[str, int] = field(default_factory=dict)
    trainable_steps: int = 0
    violations: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        g = self.gated
        return [
            f"store:       {self.store}",
            f"checkpoint:  {self.checkpoint}",
            "episodes:    " + ", ".join(f"{n} {mode}" for mode, n in sorted(self.episodes_by_mode.items())),
            f"BC student:  {100 * self.bc_success_rate:.0f}% success, student only",
            f"human-gated: {g['episodes']} episodes, {g['successes']} successful, {g['windows']} correction windows, "
            f"{g['human_steps']} operator steps, {g['safety_clamps']} safety clamps",
            f"labels:      {self.trainable_steps} trainable steps",
            f"validate:    {'ok' if not self.violations else f'{len(self.violations)} violation(s)'}",
        ]


def run_demo(
    out_dir: str | Path,
    *,
    task: str = "fetch_pick_place",
    demo_episodes: int = 16,
    train_steps: int = 1500,
    gated_episodes: int = 3,
    eval_episodes: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> DemoReport:
    # deferred: it loads the operators, the run config, the session, torch and zarr; the CLI imports this module for every command (tests/learn/test_eval.py)
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config
    from hg_dagger.learn.auto import AutoConfig, AutoRun
    from hg_dagger.store import EpisodeStore, validate_store

    out = Path(out_dir)
    store_path = out / "store.zarr"
    if store_path.exists():
        raise HgDaggerError(f"{store_path} already exists: choose another --out (the demo never appends to old data)")
    out.mkdir(parents=True, exist_ok=True)

    log.info("1/3 expert demonstrations and behaviour cloning on %s", task)
    bc = AutoConfig(
        task=task, mode=CollectionMode.EXPERT_DEMO.value, certification="planner_auto", seed=seed, iterations=1, num_envs=min(8, demo_episodes),
        episodes_per_iteration=demo_episodes,
        train={"steps": train_steps, "seed": seed},
        eval={"episodes": eval_episodes, "num_envs": min(eval_episodes, 10)},
    )
    run = AutoRun(bc, out / "bc", store_url=str(store_path))
    rows = run.run(progress=progress)

    log.info("2/3 human-gated run with the synthetic operator")
    cfg = load_run_config(None, task, episodes=gated_episodes, seed=seed)
    summary = run_gated(cfg, str(store_path), student_path=str(run.checkpoint_path), progress=progress)

    log.info("3/3 validating the store")
    store = EpisodeStore.open(str(store_path), mode="r")
    violations = [str(v) for v in validate_store(store)]
    infos = store.episodes()
    by_mode: dict[str, int] = {}
    for info in infos:
        by_mode[info.start.mode.value] = by_mode.get(info.start.mode.value, 0) + 1
    trainable = sum(
        int(np.count_nonzero(store.labels(i.episode_id).mask == LabelMask.TRAINABLE.code))
        for i in infos
        if i.start.mode == CollectionMode.HUMAN_GATED
    )
    gated = summary.as_dict()
    gated.pop("episode_ids", None)
    return DemoReport(
        out_dir=out, store=store_path, checkpoint=run.checkpoint_path,
        bc_success_rate=float(rows[-1]["eval_success_rate"]), gated=gated,
        episodes_by_mode=by_mode, trainable_steps=trainable, violations=violations,
    )
