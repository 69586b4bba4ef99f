"""The label rules of the contract - their only home.

Hard rule (seed 002): a policy action outside [handover_start, handover_end) is never trainable
unless an independent expert-certification record covers it, even when the rollout succeeded.

Inside a human window, steps whose applied action came from the person are trainable
(target: applied_action); inside an expert window, steps with a valid expert label are
trainable (target: expert_action). Steps flagged with sensor loss, excessive latency, device
loss or incomplete input, and invalid steps, are excluded. Everything else is context_only.

An expert certification counts only when it is independent and checked (``certification_problem``): its
certifier is neither the episode's operator nor the policy that acted (its policy_version, or "policy"), its
method is one of CERTIFICATION_METHODS, and the actions' executability was verified. Any other certification
grants nothing.

Evaluation rollouts (mode eval) and episodes an operator discarded (quality flag "discarded") are
never training data: nothing in them is trainable, whatever windows or certifications they carry.

Trainable is necessary, not sufficient: ``training_selection`` decides which trainable labels reach a
training batch. A window's labels need a reviewer's approval with training authorization, or - for
windows an automatic planner produced - a counting certification covering the whole window; a human
window also needs a passing QC result; a failed QC result or a replay mismatch stops every label it
touches. Every reader that trains (train, auto, the app's rounds, offline evaluation) uses it.

A reviewer is never the operator (``review_problem``): a decision whose reviewer is the window's operator
(pseudonyms compared without regard to case or whitespace, ``pseudonym_key``) authorizes nothing, and when
the store declares a reviewer roster, an authorization by anyone not on it authorizes nothing. The one
decision an operator may make on their own window is a rejection (flagging their correction as bad): it
stands, and keeps the window out of training whatever is decided later.
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hg_dagger.contract.enums import (
    EXCLUDING_FLAGS,
    ActionSource,
    CollectionMode,
    LabelMask,
    LabelTarget,
    ReplayStatus,
    ReviewStatus,
)
from hg_dagger.contract.model import FrozenModel
from hg_dagger.contract.schema import CorrectionWindow, ExpertCertification, QCResult, ReviewDecision

_HUMAN = ActionSource.HUMAN.code
_POLICY = ActionSource.POLICY.code
_TRAINABLE = LabelMask.TRAINABLE.code
_CONTEXT = LabelMask.CONTEXT_ONLY.code
_EXCLUDED = LabelMask.EXCLUDED.code

DISCARDED = "discarded"  # EpisodeEnd.quality_flags entry of an episode the operator threw away


# How a certifier checked that the covered actions are expert-quality labels (ExpertCertification.method).
CERTIFICATION_METHODS: dict[str, str] = {
    "independent_review": "a person other than the episode's operator watched the steps (video or replay) and "
                          "judged every covered action one an expert would take",
    "replay_verified": "the covered actions were re-run from the episode's recorded initial state and the "
                       "certifier (not the operator) checked that they reproduce the record and reach the goal",
    "planner_auto": "an automatic planner or expert, named as certifier, recomputed each covered action and "
                    "found the recorded one within its tolerance",
}


def pseudonym_key(name: str) -> str:
    """A pseudonym as compared by the independence rules: case, whitespace, invisible format characters (a
    zero-width space, a soft hyphen) and compatibility forms (fullwidth letters) do not tell two people apart,
    so the operator cannot pass for someone else by a spelling that looks the same."""
    text = unicodedata.normalize("NFKC", str(name))
    return unicodedata.normalize("NFKC", "".join(c for c in text if not c.isspace()
                                                 and unicodedata.category(c) != "Cf").casefold())


def certification_problem(c: ExpertCertification, *, operator: str = "", policy_version: str = "") -> str | None:
    """Why a certification grants nothing (not independent, unknown method, executability unchecked); None if it counts."""
    who = pseudonym_key(c.certifier)
    if operator and who == pseudonym_key(operator):
        return f"certifier {c.certifier!r} is the episode's own operator (a certification must be independent)"
    if who == ActionSource.POLICY.value or (policy_version and who == pseudonym_key(policy_version)):
        return f"certifier {c.certifier!r} is the policy that acted (a certification must be independent)"
    if c.method not in CERTIFICATION_METHODS:
        return f"method {c.method!r} is not one of {', '.join(CERTIFICATION_METHODS)}"
    if not c.executability_verified:
        return "executability was not verified"
    return None


@dataclass(frozen=True)
class Labels:
    mask: np.ndarray  # uint8 LabelMask codes, (T,)
    target: np.ndarray  # uint8 LabelTarget codes, (T,)


def derive_labels(
    *,
    action_source: np.ndarray,
    valid: np.ndarray,
    step_flags: np.ndarray,
    expert_valid: np.ndarray,
    windows: Iterable[CorrectionWindow],
    certifications: Iterable[ExpertCertification] = (),
    mode: CollectionMode = CollectionMode.HUMAN_GATED,
    quality_flags: Iterable[str] = (),
    operator: str,
    policy_version: str,
) -> Labels:
    """Label mask and target for every step of one episode (``quality_flags``, ``operator``, ``policy_version``:
    the episode's EpisodeEnd and EpisodeStart; the last two decide which certifications are independent, so
    they are required: "" only where the episode recorded none)."""
    n = len(action_source)
    mask = np.full(n, _CONTEXT, dtype=np.uint8)
    target = np.full(n, LabelTarget.NONE.code, dtype=np.uint8)
    if mode == CollectionMode.EVAL or DISCARDED in quality_flags:
        return Labels(mask, target)  # evaluation rollouts and discarded episodes are never training data

    source = np.asarray(action_source)
    for w in windows:
        s, e = w.handover_start, min(w.handover_end, n)
        if w.source == ActionSource.HUMAN:
            ok = source[s:e] == _HUMAN
            target[s:e][ok] = LabelTarget.APPLIED_ACTION.code
        else:
            ok = np.asarray(expert_valid[s:e], dtype=bool)
            target[s:e][ok] = LabelTarget.EXPERT_ACTION.code
        mask[s:e][ok] = _TRAINABLE

    inside = np.zeros(n, dtype=bool)
    for w in windows:
        inside[w.handover_start:min(w.handover_end, n)] = True
    for c in certifications:  # policy actions outside windows; a window keeps its own labels
        s, e = c.step_start, min(c.step_end, n)
        if certification_problem(c, operator=operator, policy_version=policy_version) is None:
            free = (mask[s:e] != _TRAINABLE) & ~inside[s:e]
            mask[s:e][free] = _TRAINABLE
            target[s:e][free] = LabelTarget.APPLIED_ACTION.code

    bad = ~np.asarray(valid, dtype=bool) | ((np.asarray(step_flags).astype(np.int64) & int(EXCLUDING_FLAGS)) != 0)
    mask[bad] = _EXCLUDED
    target[bad] = LabelTarget.NONE.code
    return Labels(mask, target)


def label_violations(
    *,
    episode_id: str,
    label_mask: np.ndarray,
    action_source: np.ndarray,
    valid: np.ndarray,
    step_flags: np.ndarray,
    expert_valid: np.ndarray,
    windows: Iterable[CorrectionWindow],
    certifications: Iterable[ExpertCertification] = (),
    mode: CollectionMode = CollectionMode.HUMAN_GATED,
    quality_flags: Iterable[str] = (),
    operator: str,
    policy_version: str,
) -> list[str]:
    """Every step marked trainable that the rules above do not allow, as readable messages.

    A stored mask may be stricter than the rules (a reviewer excluded steps) but never looser.
    """
    windows, certifications = list(windows), list(certifications)
    allowed = derive_labels(
        action_source=action_source,
        valid=valid,
        step_flags=step_flags,
        expert_valid=expert_valid,
        windows=windows,
        certifications=certifications,
        mode=mode,
        quality_flags=quality_flags,
        operator=operator,
        policy_version=policy_version,
    ).mask == _TRAINABLE
    refused = [(c, certification_problem(c, operator=operator, policy_version=policy_version)) for c in certifications]
    refused = [(c, why) for c, why in refused if why]
    stored = np.asarray(label_mask)
    out = []
    for step in np.flatnonzero((stored == _TRAINABLE) & ~allowed):
        src = ActionSource.from_code(int(action_source[step])).value
        inside = any(w.handover_start <= step < w.handover_end for w in windows)
        if DISCARDED in quality_flags:
            why = "step of an episode the operator discarded"
        elif src == ActionSource.POLICY.value and not inside:
            why = "policy action outside any correction window without an expert certification"
            near = [f"certification {c.cert_id} does not count: {r}" for c, r in refused if c.step_start <= step < c.step_end]
            if near:
                why += f" ({near[0]})"
        elif not inside:
            why = f"{src} action outside any correction window"
        else:
            why = f"{src} action is not a trainable label for this window (invalid, flagged or wrong source)"
        out.append(f"episode {episode_id} step {int(step)}: trainable {why}")
    return out


# ---------------------------------------------------------------------- the training boundary


class TrainingBlock(enum.IntFlag):
    """Why a trainable label is kept out of training (bits; several may hold at once)."""

    NOT_REVIEWED = 1  # its window has no decision yet (or a pending one)
    REJECTED = 2
    NEEDS_FIX = 4
    NOT_AUTHORIZED = 8  # approved, but the reviewer did not authorize it for training
    QC_NOT_RUN = 16  # a human window without a QC result for it and its episode
    QC_FAILED = 32  # a failed QC result for its window or its episode
    REPLAY_MISMATCH = 64  # its episode did not replay as recorded
    SELF_REVIEW = 128  # approved by the window's own operator: authorizes nothing
    REVIEWER_NOT_LISTED = 256  # authorized by a reviewer not on the store's reviewer roster

    @classmethod
    def names(cls, bits: int) -> list[str]:
        return [(b.name or "").lower() for b in cls if bits & b]


class TrainingRule(FrozenModel):
    """What a trainable label needs, besides the label rules, to reach training. The defaults are the
    contract's; switching one off is for experiments and is recorded with the run that did it."""

    require_review: bool = True  # windows: approved and training-authorized (or a counting certification)
    require_qc: bool = True  # human windows: QC ran and passed; any failed QC result stops its labels
    exclude_replay_mismatch: bool = True

    @property
    def strict(self) -> bool:
        return self.require_review and self.require_qc and self.exclude_replay_mismatch


def current_review(reviews: Iterable[ReviewDecision], window_id: str) -> ReviewDecision | None:
    """The window's latest decision (decisions are kept in the order they were made); None if it has none."""
    found = None
    for r in reviews:
        if r.window_id == window_id:
            found = r
    return found


def window_operator(window: CorrectionWindow, operator: str) -> str:
    """Whose correction a window is: its own operator, else the episode's (``operator``)."""
    return window.operator or operator


def is_operator(reviewer: str, operator: str) -> bool:
    """Whether a reviewer pseudonym names the operator (never true for an episode without an operator)."""
    return bool(pseudonym_key(operator)) and pseudonym_key(reviewer) == pseudonym_key(operator)


def review_problem(decision: ReviewDecision, *, operator: str, reviewers: Iterable[str] | None = None) -> str | None:
    """Why a decision authorizes nothing although it may look as if it did; None when it counts.

    ``operator``: the window's operator (``window_operator``); ``reviewers``: the store's reviewer roster (None
    when it declares none). A decision by the operator is no review (their own rejection still stops the
    window: see ``operator_rejected``); an authorization by someone off a declared roster authorizes nothing."""
    if is_operator(decision.reviewer, operator):
        return (f"reviewer {decision.reviewer!r} is the window's operator ({operator!r}); a reviewer is never the "
                "operator")
    if reviewers is not None and decision.status == ReviewStatus.APPROVED and decision.replay_training_authorized:
        roster = list(reviewers)
        if pseudonym_key(decision.reviewer) not in {pseudonym_key(r) for r in roster}:
            listed = ", ".join(roster) if roster else "nobody"
            return f"reviewer {decision.reviewer!r} is not on the store's reviewer roster ({listed})"
    return None


def operator_rejected(reviews: Iterable[ReviewDecision], window_id: str, operator: str) -> ReviewDecision | None:
    """The window operator's own rejection of the window (flagging their correction as bad), if any: it is final."""
    for r in reviews:
        if r.window_id == window_id and r.status == ReviewStatus.REJECTED and is_operator(r.reviewer, operator):
            return r
    return None


@dataclass(frozen=True)
class TrainingSelection:
    """Which steps of one episode reach training, and what stopped the others."""

    allowed: np.ndarray  # bool (T,)
    labels: np.ndarray  # bool (T,): trainable under the label rules
    blocks: np.ndarray  # uint16 TrainingBlock bits per step (0 where allowed or not a label)

    def counts(self) -> dict[str, int]:
        """Labels, allowed labels, and labels stopped by each reason (a label may count under several)."""
        out = {"labels": int(self.labels.sum()), "allowed": int(self.allowed.sum())}
        for b in TrainingBlock:
            out[(b.name or "").lower()] = int(((self.blocks & int(b)) != 0).sum())
        return out


def training_selection(
    *,
    mask: np.ndarray,
    windows: Iterable[CorrectionWindow],
    certifications: Iterable[ExpertCertification],
    reviews: Iterable[ReviewDecision],
    qc: Iterable[QCResult],
    replay_status: ReplayStatus,
    operator: str,
    policy_version: str,
    rule: TrainingRule | None = None,
    reviewers: Iterable[str] | None = None,
) -> TrainingSelection:
    """The training boundary for one episode's stored label layer (``mask``) and its review state.

    A label inside a window is allowed when the window is covered whole by a counting certification
    (an automatic planner certified it) or its latest review approves it with training authorization
    and that approval counts (``review_problem``: not the window's operator, on the roster ``reviewers``
    when the store declares one); a human window not so certified also needs a passing QC result for
    itself and for its episode. The window operator's own rejection stops it for good. A failed QC
    result (window or episode) and a replay mismatch stop every label they touch. Labels outside
    windows exist only through a counting certification and obey the last two rules."""
    rule = rule or TrainingRule()
    labels = np.asarray(mask) == _TRAINABLE
    n = len(labels)
    blocks = np.zeros(n, dtype=np.uint16)
    qc = list(qc)
    reviews = list(reviews)
    episode_qc = [q for q in qc if q.window_id is None]
    window_qc = {q.window_id: q for q in qc if q.window_id is not None}
    everywhere = 0
    if rule.exclude_replay_mismatch and replay_status == ReplayStatus.REPLAY_MISMATCH:
        everywhere |= TrainingBlock.REPLAY_MISMATCH
    if rule.require_qc and any(not q.passed for q in episode_qc):
        everywhere |= TrainingBlock.QC_FAILED
    windows = list(windows)
    roster = None if reviewers is None else list(reviewers)
    covered = certified_windows(windows, certifications, operator=operator, policy_version=policy_version)
    for w in windows:
        s, e = w.handover_start, min(w.handover_end, n)
        bits = 0
        wq = window_qc.get(w.window_id)
        who = window_operator(w, operator)
        if rule.require_qc and wq is not None and not wq.passed:
            bits |= TrainingBlock.QC_FAILED
        if rule.require_review and operator_rejected(reviews, w.window_id, who) is not None:
            bits |= TrainingBlock.REJECTED  # the operator flagged their own correction as bad: final
        if w.window_id not in covered:
            if rule.require_review:
                bits |= _review_block(current_review(reviews, w.window_id), who, roster)
            if rule.require_qc and w.source == ActionSource.HUMAN and (wq is None or not episode_qc):
                bits |= TrainingBlock.QC_NOT_RUN
        blocks[s:e] |= np.uint16(bits)
    blocks |= np.uint16(everywhere)
    blocks[~labels] = 0
    return TrainingSelection(allowed=labels & (blocks == 0), labels=labels, blocks=blocks)


def certified_windows(windows: Iterable[CorrectionWindow], certifications: Iterable[ExpertCertification], *,
                      operator: str, policy_version: str) -> set[str]:
    """Ids of the windows covered whole by a counting certification: they need no reviewer's authorization."""
    counting = [c for c in certifications
                if certification_problem(c, operator=operator, policy_version=policy_version) is None]
    return {w.window_id for w in windows
            if any(c.step_start <= w.handover_start and w.handover_end <= c.step_end for c in counting)}


def _review_block(decision: ReviewDecision | None, operator: str, roster: list[str] | None) -> int:
    if decision is None or decision.status == ReviewStatus.PENDING:
        return TrainingBlock.NOT_REVIEWED
    if decision.status == ReviewStatus.REJECTED:
        return TrainingBlock.REJECTED
    if decision.status == ReviewStatus.NEEDS_FIX:
        return TrainingBlock.NEEDS_FIX
    if is_operator(decision.reviewer, operator):
        return TrainingBlock.SELF_REVIEW
    if not decision.replay_training_authorized:
        return TrainingBlock.NOT_AUTHORIZED
    return 0 if review_problem(decision, operator=operator, reviewers=roster) is None else TrainingBlock.REVIEWER_NOT_LISTED


def planner_certifications(episode_id: str, windows: Iterable[CorrectionWindow], planner: str) -> list[ExpertCertification]:
    """``planner_auto`` certifications for the windows an automatic planner produced (auto's expert windows,
    a synthetic operator driven by that planner). Recorded only when a run config asks for them."""
    return [ExpertCertification(episode_id=episode_id, step_start=w.handover_start, step_end=w.handover_end,
                                certifier=f"planner:{planner}", method="planner_auto", executability_verified=True)
            for w in windows if w.handover_end > w.handover_start]
