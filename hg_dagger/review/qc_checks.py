"""The six QC checks of one episode and its correction windows (see review.qc for what each one checks and how
the results are written): the figures behind each check and the QCResult records they come to."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import (
    ActionSource,
    EndReason,
    EventKind,
    RecoveryOutcome,
    ReviewStatus,
    StepFlag,
)
from hg_dagger.contract.labels import current_review, label_violations
from hg_dagger.contract.schema import CorrectionWindow, QCResult
from hg_dagger.review.qc_config import QCConfig
from hg_dagger.store import EpisodeInfo, EpisodeStore
from hg_dagger.store.labels import LabelLayer

CHECKS = ("completeness", "time_alignment", "executability", "label_consistency", "recovery", "review")
QUALITY_CHECKS = CHECKS[:4]  # what QCResult.passed means; recovery and review are figures beside it

REQUIRED_FIELDS = ("t_obs", "t_policy", "t_action_apply", "policy_action", "applied_action", "action_source",
                   "valid", "step_flags")
OPTIONAL_FIELDS = ("human_command", "alignment_error_ms", "expert_action", "expert_valid")

_HUMAN = ActionSource.HUMAN.code
_POLICY = ActionSource.POLICY.code
_SAFETY = ActionSource.SAFETY_CONTROLLER.code
_EXPERT = ActionSource.EXPERT.code


@dataclass
class EpisodeQC:
    """QC of one episode: the stored records plus the figures behind them (figures are reported, not stored)."""

    episode_id: str
    results: list[QCResult]  # the episode's (window_id None) first, then one per window in layer order
    figures: dict[str | None, dict[str, Any]]  # window_id (None: the episode) -> figures
    version: int | None = None  # layer written (None: nothing written)
    unchanged: bool = False  # the latest layer already held these results

    @property
    def episode(self) -> QCResult:
        return self.results[0]

    @property
    def windows(self) -> list[QCResult]:
        return self.results[1:]

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "layer": self.version,
            "unchanged": self.unchanged,
            "results": [{**r.model_dump(mode="json"), "figures": self.figures.get(r.window_id, {})}
                        for r in self.results],
        }



@dataclass
class _Ep:
    """One episode's arrays and metadata, read once."""

    info: EpisodeInfo
    layer: LabelLayer
    d: dict[str, np.ndarray]
    missing: list[str]
    n: int
    low: np.ndarray | None
    high: np.ndarray | None
    max_delta: np.ndarray | None
    budget_ns: int
    explicit_budget: bool  # the QC config set latency_budget_ms: it applies to stepped simulators too

    def flags(self, bit: StepFlag) -> np.ndarray:
        return (self.d["step_flags"].astype(np.int64) & int(bit)) != 0


def check_episode(store: EpisodeStore, info: EpisodeInfo, cfg: QCConfig) -> EpisodeQC:
    """The six checks for one committed episode and each of its windows (latest label layer)."""
    eid = info.episode_id
    fields = store.fields(eid)
    missing = [f for f in REQUIRED_FIELDS if f not in fields]
    names = [f for f in REQUIRED_FIELDS + OPTIONAL_FIELDS if f in fields]
    d = store.read_steps(eid, names)
    n = info.num_steps
    for name in REQUIRED_FIELDS + OPTIONAL_FIELDS:  # absent fields read as their "absent" fill
        if name not in d:
            d[name] = _absent(name, n, fields)
    low, high, max_delta = _limits(info)
    ep = _Ep(info, store.labels(eid), d, missing, n, low, high, max_delta, cfg.budget_ns(info.start.control_hz),
             cfg.latency_budget_ms is not None)
    wins = [_window_result(ep, w, cfg) for w in ep.layer.windows]
    result, figs = _episode_result(ep, cfg, [r for r, _ in wins])
    figs["replay_status"] = store.replay_status(eid).value  # reported beside the review state; `hg-dagger replay` sets it
    figures = {None: figs, **{r.window_id: f for r, f in wins}}
    return EpisodeQC(eid, [result, *(r for r, _ in wins)], figures)


def _absent(name: str, n: int, fields) -> np.ndarray:
    a = int(next((s.shape[0] for k, s in fields.items() if k == "applied_action" and s.shape), 1))
    fills = {"t_obs": NO_TIME, "t_policy": NO_TIME, "t_action_apply": NO_TIME, "action_source": ActionSource.UNKNOWN.code,
             "valid": True, "step_flags": 0, "alignment_error_ms": 0.0, "expert_valid": False}
    if name in ("policy_action", "applied_action", "expert_action"):
        return np.full((n, a), np.nan, np.float32)
    if name == "human_command":
        return np.full((n, 7), np.nan, np.float32)
    return np.full(n, fills[name])


def _limits(info: EpisodeInfo) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Raw action bounds (the task mapping's, tightened by the recorded safety limits) and the per-tick change."""
    low = high = max_delta = None
    action = (info.start.mapping or {}).get("action") or {}
    if action.get("low") is not None and action.get("high") is not None:
        low, high = np.asarray(action["low"], np.float64), np.asarray(action["high"], np.float64)
    safety = (info.start.gate_config or {}).get("safety") or {}
    limits = (safety.get("limits") or {}) if safety.get("enabled", True) else {}
    if limits.get("low") is not None and limits.get("high") is not None:
        slo, shi = np.asarray(limits["low"], np.float64), np.asarray(limits["high"], np.float64)
        low = slo if low is None else np.maximum(low, slo)
        high = shi if high is None else np.minimum(high, shi)
    if limits.get("max_delta") is not None:
        max_delta = np.asarray(limits["max_delta"], np.float64)
    return low, high, max_delta


def _time_figures(ep: _Ep, sel: np.ndarray, cfg: QCConfig) -> tuple[dict[str, Any], list[str]]:
    """Latency, ordering, alignment, interpolation and drops over the steps in ``sel`` (bool mask)."""
    d = ep.d
    valid = d["valid"].astype(bool) & sel
    t_obs, t_pol, t_app = d["t_obs"], d["t_policy"], d["t_action_apply"]
    have = valid & (t_obs != NO_TIME) & (t_app != NO_TIME)
    latency = (t_app - t_obs)[have]
    # a stepped simulator waits for each action, so its latency fails only a budget set explicitly (or steps the
    # session flagged); a live world's late action lands in another state than observed
    live = ep.info.start.extra.get("world_clock", "live") == "live" or ep.explicit_budget
    late = have & ((((t_app - t_obs) > ep.budget_ns) & live) | ep.flags(StepFlag.LATENCY_EXCEEDED))
    pol = have & (t_pol != NO_TIME)
    misordered = pol & ((t_pol < t_obs) | (t_app < t_pol)) | have & (t_app < t_obs)
    align = np.asarray(d["alignment_error_ms"], np.float64)[valid]
    misaligned = int((align > cfg.max_alignment_error_ms).sum())
    interp = int((ep.flags(StepFlag.INTERPOLATED) & sel).sum())
    dropped = int((~d["valid"].astype(bool) & sel).sum())
    frame_drops = int(((ep.flags(StepFlag.DROPPED_FRAME_BEFORE) | ep.flags(StepFlag.SENSOR_LOSS)) & sel).sum())
    total = int(sel.sum())
    figs = {
        "steps": total,
        "latency_budget_ms": ep.budget_ns / 1e6,
        "latency_max_ms": float(latency.max() / 1e6) if latency.size else None,
        "latency_p95_ms": float(np.percentile(latency, 95) / 1e6) if latency.size else None,
        "latency_exceeded": int(late.sum()),
        "misordered_times": int(misordered.sum()),
        "alignment_error_max_ms": float(align.max()) if align.size else 0.0,
        "alignment_exceeded": misaligned,
        "interpolated": interp,
        "interpolated_fraction": interp / total if total else 0.0,
        "dropped_steps": dropped,
        "dropped_frames": frame_drops,
    }
    flags = []
    if late.any():
        flags.append("latency_exceeded")
    if misordered.any():
        flags.append("time_order")
    if misaligned:
        flags.append("alignment_error")
    if interp:
        flags.append("interpolated")
    if dropped:
        flags.append("dropped_steps")
    if frame_drops:
        flags.append("dropped_frames")
    return figs, flags


def _exec_figures(ep: _Ep, sel: np.ndarray, cfg: QCConfig, step_range: range | None) -> tuple[dict[str, Any], list[str]]:
    d, tol = ep.d, cfg.action_tolerance
    valid = d["valid"].astype(bool) & sel
    applied = np.asarray(d["applied_action"], np.float64)
    non_finite = valid & ~np.isfinite(applied).all(axis=1)
    out_of_bounds = np.zeros(ep.n, bool)
    if ep.low is not None and ep.low.shape == applied.shape[1:]:
        assert ep.high is not None  # bounds come in pairs
        with np.errstate(invalid="ignore"):
            out_of_bounds = valid & ((applied < ep.low - tol) | (applied > ep.high + tol)).any(axis=1)
    too_fast = np.zeros(ep.n, bool)
    if ep.max_delta is not None and ep.n > 1 and ep.max_delta.shape == applied.shape[1:]:
        both = valid[1:] & d["valid"][:-1].astype(bool)
        with np.errstate(invalid="ignore"):
            jump = (np.abs(np.diff(applied, axis=0)) > ep.max_delta + tol).any(axis=1)
        too_fast[1:] = both & jump
    clamped = int((ep.flags(StepFlag.CLAMPED) & sel).sum())
    events = ep.info.end.events
    inside = (lambda s: s in step_range) if step_range is not None else (lambda s: True)
    estops = [e for e in events if e.kind == EventKind.ESTOP and inside(e.step)]
    clamp_events = [e for e in events if e.kind == EventKind.SAFETY_CLAMP and inside(e.step)]
    total = int(sel.sum())
    figs = {
        "non_finite_actions": int(non_finite.sum()),
        "out_of_bounds": int(out_of_bounds.sum()),
        "over_max_delta": int(too_fast.sum()),
        "clamped": clamped,
        "clamped_fraction": clamped / total if total else 0.0,
        "clamp_events": len(clamp_events),
        "estops": len(estops),
    }
    flags = []
    for key, flag in (("non_finite_actions", "non_finite_action"), ("out_of_bounds", "out_of_bounds"),
                      ("over_max_delta", "over_max_delta")):
        if figs[key]:
            flags.append(flag)
    if clamped or clamp_events:
        flags.append("clamped")
    if estops:
        flags.append("estop")
    return figs, flags


def _episode_result(ep: _Ep, cfg: QCConfig, wins: list[QCResult]) -> tuple[QCResult, dict[str, Any]]:
    d, n, info = ep.d, ep.n, ep.info
    everything = np.ones(n, bool)
    checks: dict[str, bool] = {}
    flags: list[str] = []

    # 1 completeness
    valid = d["valid"].astype(bool)
    invalid = int((~valid).sum())
    stamps = valid & ((d["t_obs"] == NO_TIME) | (d["t_action_apply"] == NO_TIME))
    t = d["t_obs"][valid & (d["t_obs"] != NO_TIME)]
    non_monotonic = int((np.diff(t) <= 0).sum()) if t.size > 1 else 0
    dropped_ok = invalid == info.end.dropped_steps and (invalid == 0 or "dropped_steps" in info.end.quality_flags)
    flags += [f"missing_field:{f}" for f in ep.missing]
    if stamps.any():
        flags.append("missing_time")
    if non_monotonic:
        flags.append("t_obs_not_increasing")
    if not dropped_ok:
        flags.append("unaccounted_invalid_steps")
    checks["completeness"] = not ep.missing and not stamps.any() and not non_monotonic and dropped_ok
    figs: dict[str, Any] = {"num_steps": n, "invalid_steps": invalid, "dropped_steps": info.end.dropped_steps,
                            "missing_fields": list(ep.missing), "missing_times": int(stamps.sum()),
                            "t_obs_not_increasing": non_monotonic}

    # 2 time alignment: any late, misordered or misaligned step (dropped steps are completeness's)
    tf, tflags = _time_figures(ep, everything, cfg)
    flags += [f for f in tflags if f not in flags]
    checks["time_alignment"] = not (tf["latency_exceeded"] or tf["misordered_times"] or tf["alignment_exceeded"])
    figs.update(tf)

    # 3 executability
    xf, xflags = _exec_figures(ep, everything, cfg, None)
    flags += [f for f in xflags if f not in flags]
    checks["executability"] = not (xf["non_finite_actions"] or xf["out_of_bounds"] or xf["over_max_delta"]
                                   or xf["estops"])
    figs.update(xf)

    # 4 label consistency: steps of a person or an expert outside every window, and the stored mask vs the rules
    src = d["action_source"]
    inside = np.zeros(n, bool)
    for w in ep.layer.windows:
        inside[w.handover_start:min(w.handover_end, n)] = True
    stray_human = int((valid & (src == _HUMAN) & ~inside).sum())
    stray_expert = int((valid & (src == _EXPERT) & ~inside).sum())
    overlaps = _overlaps(ep.layer.windows)
    rules = label_violations(
        episode_id=info.episode_id, label_mask=ep.layer.mask, action_source=src, valid=valid,
        step_flags=d["step_flags"], expert_valid=d["expert_valid"], windows=ep.layer.windows,
        certifications=ep.layer.certifications, mode=info.start.mode, quality_flags=info.end.quality_flags,
        operator=info.start.operator, policy_version=info.start.policy_version)
    if stray_human:
        flags.append("human_step_outside_window")
    if stray_expert:
        flags.append("expert_step_outside_window")
    if overlaps:
        flags.append("overlapping_windows")
    if rules:
        flags.append("label_rule_violation")
    bad_windows = sum(not r.checks["label_consistency"] for r in wins)
    checks["label_consistency"] = not (stray_human or stray_expert or overlaps or rules or bad_windows)
    figs.update({"human_steps_outside_windows": stray_human, "expert_steps_outside_windows": stray_expert,
                 "overlapping_windows": overlaps, "label_rule_violations": len(rules),
                 "windows_with_inconsistent_labels": bad_windows})

    # 5 recovery outcome: the episode's end as figures; passes unless a correction failed
    outcome = info.end.recovery_outcome
    checks["recovery"] = outcome in (RecoveryOutcome.NONE, RecoveryOutcome.RECOVERY_SUCCESS)
    figs.update({"end_reason": info.end.end_reason.value, "task_success": info.end.task_success,
                 "recovery_outcome": outcome.value, "windows": len(ep.layer.windows)})
    if outcome not in (RecoveryOutcome.NONE, RecoveryOutcome.RECOVERY_SUCCESS):
        flags.append(f"recovery_{outcome.value}")
    if info.end.end_reason == EndReason.SAFETY_STOP:
        flags.append("safety_stop")

    # 6 review / authorization
    statuses = Counter(_review(ep.layer, w.window_id)[0].value for w in ep.layer.windows)
    authorized = sum(_review(ep.layer, w.window_id)[1] for w in ep.layer.windows)
    checks["review"] = statuses.get("approved", 0) == len(ep.layer.windows)
    figs.update({"reviews": {s.value: statuses.get(s.value, 0) for s in ReviewStatus},
                 "replay_training_authorized": authorized})
    flags += [f"review_{s.value}" for s in ReviewStatus if s != ReviewStatus.APPROVED and statuses.get(s.value)]

    passed = all(checks[c] for c in QUALITY_CHECKS)
    return QCResult(episode_id=info.episode_id, window_id=None, passed=passed, checks=checks, flags=flags), figs


def _window_result(ep: _Ep, w: CorrectionWindow, cfg: QCConfig) -> tuple[QCResult, dict[str, Any]]:
    d, n = ep.d, ep.n
    s, e = w.handover_start, min(w.handover_end, n)
    sel = np.zeros(n, bool)
    sel[s:e] = True
    valid = d["valid"].astype(bool)
    checks: dict[str, bool] = {}
    flags: list[str] = []
    human = w.source == ActionSource.HUMAN

    # 1 completeness: a non-empty window with every step valid, actions present, an outcome recorded
    empty = e <= s
    no_policy = int((sel & valid & ~np.isfinite(d["policy_action"]).all(axis=1)).sum())
    no_applied = int((sel & valid & ~np.isfinite(d["applied_action"]).all(axis=1)).sum())
    relabel = not human and w.outcome == RecoveryOutcome.NONE  # an automatic expert run relabels, recovers nothing
    no_outcome = human and w.outcome == RecoveryOutcome.NONE
    for cond, flag in ((empty, "empty_window"), (no_policy, "missing_policy_action"),
                       (no_applied, "missing_applied_action"), (no_outcome, "missing_outcome"),
                       (ep.missing, "missing_fields")):
        if cond:
            flags.append(flag)
    invalid = int((sel & ~valid).sum())
    checks["completeness"] = not (empty or no_policy or no_applied or no_outcome or invalid or ep.missing)
    figs: dict[str, Any] = {"handover_start": s, "handover_end": w.handover_end, "source": w.source.value,
                            "missing_policy_action": no_policy, "missing_applied_action": no_applied}

    # 2 time alignment: any late, misordered, misaligned or dropped step fails the window
    tf, tflags = _time_figures(ep, sel, cfg)
    flags += tflags
    checks["time_alignment"] = not (tf["latency_exceeded"] or tf["misordered_times"] or tf["alignment_exceeded"]
                                    or tf["dropped_steps"] or tf["dropped_frames"]
                                    or tf["interpolated_fraction"] > cfg.max_interpolated_fraction)
    figs.update(tf)

    # 3 executability
    xf, xflags = _exec_figures(ep, sel, cfg, range(s, e + 1))  # an e-stop that ended the window counts
    flags += xflags
    checks["executability"] = not (xf["non_finite_actions"] or xf["out_of_bounds"] or xf["over_max_delta"]
                                   or xf["estops"] or xf["clamped_fraction"] > cfg.max_clamped_fraction)
    figs.update(xf)

    # 4 label consistency
    src = d["action_source"][s:e]
    ok_sources = (_HUMAN, _SAFETY) if human else (_EXPERT, _POLICY, _SAFETY)
    foreign = int((valid[s:e] & ~np.isin(src, ok_sources)).sum())
    if human:
        unsigned = int((valid[s:e] & (src == _HUMAN) & ~np.isfinite(d["human_command"][s:e]).all(axis=1)).sum())
    else:
        unsigned = int((valid[s:e] & (src == _EXPERT) & ~d["expert_valid"][s:e].astype(bool)).sum())
    want_src = _HUMAN if human else _EXPERT
    first_src_ok = empty or not valid[s] or d["action_source"][s] == want_src or not human
    t_first = int(d["t_action_apply"][s]) if not empty else NO_TIME
    if w.t_handover == NO_TIME:
        handover_ok = not human  # expert windows of automatic runs have no handover moment
    else:
        handover_ok = w.t_handover == t_first
    gate_order = w.t_gate == NO_TIME or w.t_handover == NO_TIME or w.t_gate <= w.t_handover
    overlap = any(o is not w and o.handover_start < e and s < o.handover_end for o in ep.layer.windows)
    for cond, flag in ((foreign, "policy_step_in_window" if human else "human_step_in_window"),
                       (unsigned, "unsigned_human_step" if human else "unlabelled_expert_step"),
                       (not first_src_ok, "first_step_not_corrected"),
                       (not handover_ok, "t_handover_mismatch"), (not gate_order, "t_gate_after_handover"),
                       (overlap, "overlapping_windows")):
        if cond:
            flags.append(flag)
    checks["label_consistency"] = not (foreign or unsigned or not first_src_ok or not handover_ok or not gate_order
                                       or overlap)
    figs.update({"foreign_steps": foreign, "unsigned_steps": unsigned, "t_handover": w.t_handover,
                 "t_first_applied": t_first,
                 "handover_offset_ms": None if w.t_handover == NO_TIME or t_first == NO_TIME
                 else (w.t_handover - t_first) / 1e6})

    # 5 recovery outcome
    checks["recovery"] = w.outcome == RecoveryOutcome.RECOVERY_SUCCESS or relabel
    figs["outcome"] = w.outcome.value
    if not checks["recovery"]:
        flags.append(f"recovery_{w.outcome.value}")

    # 6 review / authorization
    status, authorized = _review(ep.layer, w.window_id)
    checks["review"] = status == ReviewStatus.APPROVED
    figs.update({"review": status.value, "replay_training_authorized": authorized})
    if status != ReviewStatus.APPROVED:
        flags.append(f"review_{status.value}")

    passed = all(checks[c] for c in QUALITY_CHECKS)
    return QCResult(episode_id=w.parent_episode_id, window_id=w.window_id, passed=passed, checks=checks,
                    flags=flags), figs


def _review(layer: LabelLayer, window_id: str) -> tuple[ReviewStatus, bool]:
    """The window's current decision (pending if none)."""
    d = current_review(layer.reviews, window_id)
    return (d.status, d.replay_training_authorized) if d else (ReviewStatus.PENDING, False)


def _overlaps(windows: list[CorrectionWindow]) -> int:
    spans = sorted((w.handover_start, w.handover_end) for w in windows)
    return sum(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
