"""Promotion for a round trained from a live session (the app's Rounds tab): the newly trained checkpoint takes over
only when the held-out evaluation does not say it is worse than the student acting now (learn.promotion, the rule
`run --rounds` and the benchmarks apply in memory). Both students are evaluated on the same held-out seeds, in the
training job's process, and the decision is written into the candidate's lineage either way."""

from __future__ import annotations

from typing import Any

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.learn.evaluate import EvalConfig, closed_loop
from hg_dagger.learn.promotion import PromotionConfig, decide, successes
from hg_dagger.policy.checkpoint import load_student, record_promotion

Report = Any  # (stage text, fraction 0..1) -> None, as learn.rounds


def judge_checkpoint(candidate: str, acting: str | None, task: str, cfg: PromotionConfig, report: Report) -> dict:
    """The promotion decision for ``candidate`` against the student at ``acting`` (None: none acted before, the
    candidate takes over), with both held-out figures and versions; ``acting_version`` is the student that acts
    next. Recorded in the candidate checkpoint's lineage."""
    mapping = load_mapping(task)
    new = load_student(candidate, mapping)
    held = EvalConfig(episodes=cfg.episodes, num_envs=cfg.num_envs, seed=cfg.seed)
    if acting is None:
        d = decide((0, 1), None, cfg.confidence)
        d.update(candidate_success=None, episodes=0, candidate_version=new.version, incumbent_version=None,
                 acting_version=new.version)
        record_promotion(candidate, d)
        return d
    old = load_student(acting, mapping)
    with make_env(task, num_envs=min(cfg.num_envs, cfg.episodes), seed=cfg.seed) as env:
        report("held-out evaluation: the acting student", 0.0)
        inc = successes(closed_loop(old, env, held))
        report("held-out evaluation: the new student", 0.5)
        cand = successes(closed_loop(new, env, held))
        report("held-out evaluation: the new student", 1.0)
    d = decide(cand, inc, cfg.confidence)
    d.update(candidate_version=new.version, incumbent_version=old.version,
             acting_version=new.version if d["promoted"] else old.version)
    record_promotion(candidate, d)
    return d
