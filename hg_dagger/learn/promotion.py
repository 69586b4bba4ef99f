"""Promotion, not replacement: a newly trained student takes over only when a held-out evaluation says it is not
worse than the student acting now (docs/decisions.md, "Promotion rule").

Fresh-weight retraining moves a round's success by several points either way; without this rule a worse
student would act in the next round and be the one reported. The evaluation runs on fixed seeds of its own
(``PromotionConfig.seed``), apart from the collection's and from the reported evaluation's, so choosing on it
does not bias the reported figure. The rule: the candidate is refused when its success on those seeds is below
the acting student's by more than the one-sided ``confidence`` quantile of the noise of both figures (a pooled
two-proportion z test at ``episodes`` each).
A refused candidate is recorded in the acting student's lineage; the round's labels stay in the replay.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from pydantic import Field

from hg_dagger.contract.model import StrictModel


class PromotionConfig(StrictModel):
    """The held-out evaluation that decides whether a trained student takes over."""

    enabled: bool | None = Field(default=None, description="None: on for human-gated rounds, off otherwise")
    episodes: int = Field(default=50, gt=0)
    num_envs: int = Field(default=10, gt=0)
    seed: int = Field(default=200_000, description="held-out seeds: not the collection's, not the reported "
                      "evaluation's (100000 on)")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="one-sided level of the test")


def worse_by(candidate: tuple[int, int], incumbent: tuple[int, int]) -> float:
    """How many standard errors the candidate's success lies below the incumbent's: the pooled two-proportion z
    statistic (0 when neither evaluation varies, negative when the candidate is ahead)."""
    (k, n), (ki, ni) = candidate, incumbent
    if n <= 0 or ni <= 0:
        raise ValueError(f"a held-out evaluation needs at least one episode, got {n} and {ni}")
    if not (0 <= k <= n and 0 <= ki <= ni):
        raise ValueError(f"successes outside the episodes: {k}/{n}, {ki}/{ni}")
    pooled = (k + ki) / (n + ni)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / ni))
    diff = ki / ni - k / n
    return 0.0 if se == 0 else diff / se


def decide(candidate: tuple[int, int], incumbent: tuple[int, int] | None, confidence: float = 0.95) -> dict[str, Any]:
    """The promotion decision from (successes, episodes) of the candidate and of the acting student (None: there
    is none yet, the candidate takes over). Refused when the candidate is worse by more than the one-sided
    ``confidence`` quantile of the noise of both evaluations (a pooled two-proportion z test)."""
    k, n = candidate
    z_max = NormalDist().inv_cdf(confidence)
    out: dict[str, Any] = {"candidate_success": k / n, "episodes": n, "confidence": confidence, "z_limit": z_max}
    if incumbent is None:
        return {**out, "promoted": True, "incumbent_success": None, "z": None, "reason": "no student acted before"}
    ki, ni = incumbent
    z = worse_by(candidate, incumbent)
    promoted = z <= z_max
    gap = f"{z:.2f} standard errors worse" if z > 0 else f"{-z:.2f} standard errors better"
    why = (f"candidate {k}/{n} against the acting student's {ki}/{ni}: {gap}, "
           f"{'within' if promoted else 'beyond'} the limit of {z_max:.2f} worse")
    return {**out, "promoted": promoted, "incumbent_success": ki / ni, "z": z, "reason": why}


def promotion_line(d: dict) -> str:
    """The decision in one line for the operator: both figures, and which student acts next."""
    if d.get("incumbent_version") is None:
        return f"new student {d['candidate_version']} takes over (no student acted before)"
    n = d["episodes"]
    cand, inc = round(d["candidate_success"] * n), round(d["incumbent_success"] * n)
    head = (f"new student {d['candidate_version']} takes over" if d["promoted"]
            else f"kept student {d['incumbent_version']}: the new one ({d['candidate_version']}) did worse")
    return f"{head}; held-out {cand}/{n} new against {inc}/{n} acting ({d['reason'].split(': ', 1)[-1]})"


@dataclass
class Snapshot:
    """Everything that makes a student the one it is (weights, round, lineage, calibrated thresholds)."""

    state_dict: dict
    round: int
    lineage: list
    gate_thresholds: dict
    version: str

    @classmethod
    def of(cls, student) -> Snapshot:
        return cls({k: v.detach().clone() for k, v in student.net.state_dict().items()}, int(student.round),
                   copy.deepcopy(student.lineage), copy.deepcopy(student.gate_thresholds), student.version)

    def restore(self, student) -> None:
        student.net.load_state_dict(self.state_dict)
        student.round = self.round
        student.weights_changed()
        student.lineage = copy.deepcopy(self.lineage)
        student.gate_thresholds = copy.deepcopy(self.gate_thresholds)


def successes(result: dict[str, Any]) -> tuple[int, int]:
    """(successes, episodes) of a closed_loop result."""
    n = int(result["episodes"])
    return int(round(float(result["success_rate"]) * n)), n


class Promoter:
    """Holds the acting student's held-out figure and decides, after each fit, whether the candidate takes over.

    ``evaluate(student) -> closed_loop result`` runs the held-out evaluation. Call ``before_fit`` with the acting
    student before training (it keeps a snapshot and, once per version, its figure) and ``judge`` after: a refused
    candidate's weights are replaced by the acting student's again, in place."""

    def __init__(self, evaluate: Callable[[Any], dict[str, Any]], confidence: float = 0.95):
        self.evaluate = evaluate
        self.confidence = confidence
        self.figures: dict[str, tuple[int, int]] = {}  # policy version -> (successes, episodes) on the held-out seeds
        self.acting: Snapshot | None = None

    def before_fit(self, student) -> None:
        """Remember the acting student; a fresh, never trained student (round 0) is nobody to defend."""
        if student.round == 0:
            self.acting = None
            return
        self.acting = Snapshot.of(student)
        if student.version not in self.figures:
            self.figures[student.version] = successes(self.evaluate(student))

    def judge(self, student, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate the freshly trained ``student`` and keep it, or put the acting student back (in place).
        Returns the decision with both figures and both versions; lineage records it either way."""
        cand = successes(self.evaluate(student))
        self.figures[student.version] = cand
        acting = self.acting
        d = decide(cand, self.figures[acting.version] if acting else None, self.confidence)
        d.update(candidate_version=student.version, incumbent_version=acting.version if acting else None,
                 **(info or {}))
        entry = student.lineage[-1] if student.lineage else None
        if entry is not None:
            entry.setdefault("info", {})["promotion"] = dict(d)
        if not d["promoted"]:
            assert acting is not None  # decide() refuses a candidate only against an acting student
            acting.restore(student)
            if entry is not None:  # the refused candidate stays on record in the acting student's lineage
                student.lineage.append(copy.deepcopy(entry))
        d["acting_version"] = student.version
        self.acting = Snapshot.of(student)
        return d
