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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hg_dagger.contract.enums import EXCLUDING_FLAGS, ActionSource, CollectionMode, LabelMask, LabelTarget
from hg_dagger.contract.schema import CorrectionWindow, ExpertCertification

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


def certification_problem(c: ExpertCertification, *, operator: str = "", policy_version: str = "") -> str | None:
    """Why a certification grants nothing (not independent, unknown method, executability unchecked); None if it counts."""
    who = c.certifier.strip().lower()
    if operator and who == operator.strip().lower():
        return f"certifier {c.certifier!r} is the episode's own operator (a certification must be independent)"
    if who == ActionSource.POLICY.value or (policy_version and who == policy_version.strip().lower()):
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
    operator: str = "",
    policy_version: str = "",
) -> Labels:
    """Label mask and target for every step of one episode (``quality_flags``, ``operator``, ``policy_version``:
    the episode's EpisodeEnd and EpisodeStart; the last two decide which certifications are independent)."""
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

    for c in certifications:
        s, e = c.step_start, min(c.step_end, n)
        if certification_problem(c, operator=operator, policy_version=policy_version) is None:
            free = mask[s:e] != _TRAINABLE
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
    operator: str = "",
    policy_version: str = "",
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
