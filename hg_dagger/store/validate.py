"""validate_store: every invariant of the correction-data contract, checked over a whole store.

Each problem becomes a Violation naming the episode, the step and the field. Incomplete episodes (never
committed) are not violations; their steps are still checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract.clock import NO_TIME
from hg_dagger.contract.enums import (
    ActionSource,
    ControlState,
    LabelMask,
    LabelTarget,
    ReviewStatus,
    StepFlag,
)
from hg_dagger.contract.labels import certification_problem, is_operator, label_violations, window_operator
from hg_dagger.contract.schema import EpisodeStart, chunk_fields, step_fields
from hg_dagger.errors import HgDaggerError
from hg_dagger.store import layout
from hg_dagger.store.labels import LabelLayer
from hg_dagger.store.layer_rules import LABEL_INPUTS, check_bindings, check_replay, fill_column
from hg_dagger.store.segment import SegmentView
from hg_dagger.store.store import EpisodeInfo, EpisodeStore

Step = int | np.integer[Any] | None  # a step number as numpy's lookups give it
Bad = Callable[[Step, str | None, str], None]

TIME_FIELDS = ("t_obs", "t_policy", "t_action_apply", "t_device")
ORDERED_TIMES = ("t_obs", "t_policy", "t_action_apply")
_KNOWN_FLAGS = sum(int(f.value) for f in StepFlag)
_STEP_RE = re.compile(r"step (\d+)")


@dataclass(frozen=True)
class Violation:
    episode_id: str | None
    step: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = [f"episode {self.episode_id}" if self.episode_id else "store"]
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.field:
            where.append(f"field '{self.field}'")
        return f"{' '.join(where)}: {self.message}"


def validate_store(store: EpisodeStore | str, *, images: bool = True, progress: bool = False) -> list[Violation]:
    """All contract violations in a store. images=False skips decoding camera chunks (metadata still checked).
    A segment that holds nothing because its creation was cut off is no violation: it is in store.warnings."""
    if not isinstance(store, EpisodeStore):
        store = EpisodeStore.open(store, mode="r")
    store.refresh()
    infos = store.episodes()  # decodes every end record: problems found there join store.damaged
    out: list[Violation] = [Violation(eid, None, None, _strip(msg, eid)) for eid, msg in store.damaged]
    by_id = {i.episode_id: i for i in infos}
    window_owner: dict[str, str] = {}
    by_seg: dict[str, list[EpisodeInfo]] = {}
    for info in infos:
        by_seg.setdefault(info.segment_id, []).append(info)
    bar = tqdm(total=len(infos), desc="validate", unit="ep", disable=not progress)
    for sid, seg_infos in by_seg.items():
        seg = store._segs[sid]
        try:
            columns = _segment_columns(seg, out, images)
        except HgDaggerError as exc:
            out.extend(Violation(i.episode_id, None, None, str(exc)) for i in seg_infos)
            bar.update(len(seg_infos))
            continue
        for info in seg_infos:
            _check_episode(store, seg, info, columns, by_id, window_owner, out)
            bar.update(1)
    bar.close()
    return out


def _segment_columns(seg: SegmentView, out: list[Violation], images: bool) -> dict[str, np.ndarray | None]:
    """Non-image fields of the whole segment in memory; image fields decoded block-wise (only checked)."""
    cols: dict[str, np.ndarray | None] = {}
    n = seg.committed_rows
    action_dim = seg.fields["applied_action"].shape[0] if "applied_action" in seg.fields and seg.fields["applied_action"].shape else 0
    required = step_fields(obs={}, action_dim=max(action_dim, 1))
    for name, spec in {**required, **chunk_fields()}.items():
        have = seg.fields.get(name)
        if have is None:
            if name in required:  # the chunk fields are optional: only a chunking policy's episodes carry them
                out.append(Violation(None, None, name, f"segment {seg.segment_id}: required field missing"))
        elif have.dtype != spec.dtype or (name not in ("policy_action", "expert_action", "applied_action", "human_command") and tuple(have.shape) != tuple(spec.shape)):
            out.append(Violation(None, None, name, f"segment {seg.segment_id}: declared {have.dtype}{list(have.shape)}, "
                                                   f"contract says {spec.dtype}{list(spec.shape)}"))
    for name, spec in seg.fields.items():
        try:
            arr = seg.array(layout.data_path(name))
        except Exception as exc:
            out.append(Violation(None, None, name, f"segment {seg.segment_id}: array missing or unreadable ({_one(exc)})"))
            cols[name] = None
            continue
        if np.dtype(arr.dtype) != spec.np_dtype or tuple(arr.shape[1:]) != tuple(spec.shape):
            out.append(Violation(None, None, name, f"segment {seg.segment_id}: stored as {arr.dtype}{list(arr.shape[1:])}, "
                                                   f"field spec says {spec.dtype}{list(spec.shape)}"))
            cols[name] = None
            continue
        if arr.shape[0] < n:
            out.append(Violation(None, None, name, f"segment {seg.segment_id}: {arr.shape[0]} rows, {n} committed"))
            cols[name] = None
            continue
        try:
            if spec.image:
                if images:
                    step = max(arr.chunks[0], 256)
                    for lo in range(0, n, step):
                        arr[lo:min(n, lo + step)]
                cols[name] = None
            else:
                cols[name] = np.asarray(arr[:n]) if n else np.zeros((0, *spec.shape), spec.np_dtype)
        except Exception as exc:
            out.append(Violation(None, None, name, f"segment {seg.segment_id}: data unreadable ({_one(exc)}); "
                                                   "episodes of this segment cannot be loaded"))
            cols[name] = None
    return cols


def _check_episode(store: EpisodeStore, seg: SegmentView, info: EpisodeInfo, columns: dict[str, np.ndarray | None],
                   by_id: dict[str, EpisodeInfo], window_owner: dict[str, str], out: list[Violation]) -> None:
    eid = info.episode_id

    def bad(step: Step, field: str | None, message: str) -> None:
        out.append(Violation(eid, None if step is None else int(step), field, message))

    rec = store._eps[eid]
    rows = seg.rows_of(rec.ordinal)
    n = len(rows)
    if info.complete and n != info.end.num_steps:
        bad(None, None, f"{n} stored steps, end record says {info.end.num_steps}")
        return
    steps = seg.steps_of(rec.ordinal)
    if not np.array_equal(steps, np.arange(n)):
        first = int(np.flatnonzero(steps != np.arange(n))[0])
        bad(first, None, f"step numbers are not 0..{n - 1} (found {int(steps[first])} at position {first})")
    col = {k: (None if v is None else v[rows]) for k, v in columns.items()}
    if n == 0:
        col = {}

    for name in TIME_FIELDS:
        t = col.get(name)
        if t is None:
            continue
        present = np.flatnonzero(t != NO_TIME)
        if len(present) > 1:
            dec = np.flatnonzero(np.diff(t[present]) < 0)
            for i in dec[:5]:
                s = int(present[i + 1])
                bad(s, name, f"timestamp goes back in time ({int(t[present[i]])} -> {int(t[s])} ns)")
    for a, b in zip(ORDERED_TIMES, ORDERED_TIMES[1:], strict=False):
        ta, tb = col.get(a), col.get(b)
        if ta is None or tb is None:
            continue
        wrong = np.flatnonzero((ta != NO_TIME) & (tb != NO_TIME) & (ta > tb))
        for s in wrong[:5]:
            bad(s, b, f"{a}={int(ta[s])} is after {b}={int(tb[s])}")

    for name, enum in (("action_source", ActionSource), ("control_state", ControlState)):
        v = col.get(name)
        if v is not None:
            for s in np.flatnonzero(v >= len(enum))[:5]:
                bad(s, name, f"{int(v[s])} is not a {enum.__name__} code (0..{len(enum) - 1})")
    flags = col.get("step_flags")
    if flags is not None:
        for s in np.flatnonzero(flags.astype(np.int64) & ~_KNOWN_FLAGS)[:5]:
            bad(s, "step_flags", f"unknown StepFlag bits in {int(flags[s]):#x}")

    valid = col.get("valid")
    valid = np.ones(n, bool) if valid is None else valid.astype(bool)
    applied = col.get("applied_action")
    if applied is not None and applied.ndim >= 1:
        nonfinite = ~np.isfinite(applied.reshape(n, -1)).all(axis=1) & valid
        for s in np.flatnonzero(nonfinite)[:5]:
            bad(s, "applied_action", f"NaN or inf in a valid step's applied action {applied[s].tolist()}")
    for name in ("policy_action", "expert_action", "human_command"):
        v = col.get(name)
        if v is not None and v.dtype.kind == "f":
            for s in np.flatnonzero(np.isinf(v.reshape(n, -1)).any(axis=1))[:5]:
                bad(s, name, "inf value (absent values are NaN, never inf)")

    source = col.get("action_source")
    if source is not None:
        _check_commands_kept(n, source, col, bad)

    start = info.start
    if start.parent_episode_id is not None:
        parent = by_id.get(start.parent_episode_id)
        if parent is None:
            bad(None, "parent_episode_id", f"parent episode {start.parent_episode_id} is not in this store")
        elif start.parent_step_id is not None and not 0 <= start.parent_step_id < parent.num_steps:
            bad(None, "parent_step_id", f"parent step {start.parent_step_id} outside parent's {parent.num_steps} steps")
    for ev in info.end.events:
        if ev.step > n:
            bad(ev.step, "events", f"{ev.kind.value} event at step {ev.step} after the episode's {n} steps")

    if not info.complete:
        return
    inputs = {k: (col[k] if col.get(k) is not None else fill_column(seg.fields.get(k), k, n)) for k in LABEL_INPUTS}
    try:
        versions = store.label_versions(eid)
    except HgDaggerError as exc:
        bad(None, "labels", str(exc))
        return
    if 1 not in versions:
        bad(None, "labels", "committed episode without label layer v1")
    for v in versions:
        try:
            layer = store.labels(eid, v)
        except HgDaggerError as exc:
            bad(None, "labels", _strip(str(exc), eid))
            continue
        _check_layer(eid, v, layer, n, inputs, col, start, window_owner, bad, info.end.quality_flags)
    if versions and versions[-1] != 0:
        _check_independence(store, eid, start, bad)


def _check_commands_kept(n: int, source: np.ndarray, col: dict[str, Any], bad: Bad) -> None:
    """Whoever commanded a step keeps their command in the record, whatever the safety monitor made of it: a human
    step keeps the raw device value and the policy's action; a step under a person's control keeps the device value
    unless its flags say why there was none (device lost, incomplete input); an expert's step, and an expert's
    command the monitor clamped, keep the expert's action. Without them one cannot tell the operator's or the
    expert's recovery from the controller's."""
    state = col.get("control_state")
    flags = col.get("step_flags")
    flags = np.zeros(n, np.int64) if flags is None else flags.astype(np.int64)
    explained = (flags & int(StepFlag.DEVICE_LOST | StepFlag.INCOMPLETE_INPUT)) != 0
    clamped = (flags & int(StepFlag.CLAMPED)) != 0
    valid = col.get("valid")
    if valid is not None:  # a dropped step holds fill values only
        source = np.where(valid.astype(bool), source, ActionSource.UNKNOWN.code)
        state = None if state is None else np.where(valid.astype(bool), state, ControlState.AUTONOMOUS.code)
    human = source == ActionSource.HUMAN.code
    under_person = human if state is None else human | ((state == ControlState.HUMAN.code) & ~explained)
    under_expert = source == ActionSource.EXPERT.code
    if state is not None:
        under_expert = under_expert | ((state == ControlState.EXPERT.code) & clamped)
    for name, rows, what in (
        ("human_command", under_person, "step under a person's control without human_command (the raw device "
                                        "command is kept at every such step, clamped or not, unless device_lost "
                                        "or incomplete_input says why)"),
        ("policy_action", human, "human step without policy_action (the student's action is recorded at every "
                                 "human step)"),
        ("expert_action", under_expert, "an expert's step without expert_action (the expert's command is kept "
                                        "even where the safety monitor clamped it)"),
    ):
        v = col.get(name)
        if v is None or not rows.any():
            continue
        missing = rows & ~np.isfinite(v.reshape(n, -1)).any(axis=1)
        for s in np.flatnonzero(missing)[:5]:
            bad(s, name, what)


def _check_independence(store: EpisodeStore, eid: str, start: EpisodeStart, bad: Bad) -> None:
    """A decision by the window's own operator (other than their rejection of it) breaks the rule that a reviewer
    is never the operator; the latest layer holds every decision, so only it is read."""
    try:
        layer = store.labels(eid)
    except HgDaggerError:
        return  # reported with the layer's other problems
    windows = {w.window_id: w for w in layer.windows}
    for d in layer.reviews:
        w = windows.get(d.window_id)
        if w is None or d.status == ReviewStatus.REJECTED:
            continue
        who = window_operator(w, start.operator)
        if is_operator(d.reviewer, who):
            bad(w.handover_start, "reviews", f"window {w.window_id}: {d.status.value} by {d.reviewer!r}, the window's "
                                             f"operator ({who!r}): a reviewer is never the operator, so it authorizes "
                                             "nothing")


def _check_layer(eid: str, v: int, layer: LabelLayer, n: int, inputs: dict[str, Any], col: dict[str, Any],
                 start: EpisodeStart, window_owner: dict[str, str], bad: Bad, quality_flags: Iterable[str] = ()) -> None:
    where = f"label layer v{v}"

    def collect(msg: str) -> _Collected:
        return _Collected(msg)

    try:
        check_bindings(eid, n, layer.windows, layer.certifications, layer.reviews, layer.qc, collect)
    except _Collected as exc:
        bad(None, "labels", f"{where}: {_strip(str(exc), eid)}")
    try:
        check_replay(eid, n, layer.replay, collect)
    except _Collected as exc:
        bad(layer.replay.first_divergent_step if layer.replay else None, "replay", f"{where}: {_strip(str(exc), eid)}")
    for w in layer.windows:
        owner = window_owner.setdefault(w.window_id, f"{eid} v{v}")
        if not owner.startswith(eid + " "):
            bad(w.handover_start, "windows", f"{where}: window id {w.window_id} also used by episode {owner.split()[0]}")
    applied_t = col.get("t_action_apply")
    for w in layer.windows:
        if applied_t is None or w.t_handover == NO_TIME or w.handover_end <= w.handover_start or w.handover_start >= n:
            continue
        first = int(applied_t[w.handover_start])
        if w.t_handover != first:
            bad(w.handover_start, "t_handover", f"{where}: window {w.window_id} t_handover={w.t_handover} is not "
                                                f"t_action_apply={first} of its first applied step {w.handover_start}")
    mask, target = layer.mask, layer.target
    for s in np.flatnonzero(mask >= len(LabelMask))[:5]:
        bad(s, "label_mask", f"{where}: {int(mask[s])} is not a LabelMask code")
    for s in np.flatnonzero(target >= len(LabelTarget))[:5]:
        bad(s, "label_target", f"{where}: {int(target[s])} is not a LabelTarget code")
    trainable = mask == LabelMask.TRAINABLE.code
    for s in np.flatnonzero(trainable & (target == LabelTarget.NONE.code))[:5]:
        bad(s, "label_target", f"{where}: trainable step without a target")
    for s in np.flatnonzero(~trainable & (target != LabelTarget.NONE.code))[:5]:
        bad(s, "label_target", f"{where}: target set on a step that is not trainable")
    for code, name in ((LabelTarget.APPLIED_ACTION.code, "applied_action"), (LabelTarget.EXPERT_ACTION.code, "expert_action")):
        a = col.get(name)
        if a is not None:
            missing = (target == code) & ~np.isfinite(a.reshape(n, -1)).all(axis=1)
            for s in np.flatnonzero(missing)[:5]:
                bad(s, name, f"{where}: training target is NaN/inf")
    who = {"operator": start.operator, "policy_version": start.policy_version}
    for c in layer.certifications:
        if (why := certification_problem(c, **who)) is not None:
            bad(c.step_start, "certifications", f"{where}: certification {c.cert_id} by {c.certifier!r} "
                                                f"(method {c.method!r}) does not count: {why}")
    msgs = label_violations(episode_id=eid, label_mask=mask, **inputs, windows=layer.windows,
                            certifications=layer.certifications, mode=start.mode, quality_flags=quality_flags,
                            operator=start.operator, policy_version=start.policy_version)
    for m in msgs:
        hit = _STEP_RE.search(m)
        bad(int(hit.group(1)) if hit else None, "label_mask", f"{where}: {m.split(': ', 1)[-1]}")


class _Collected(Exception):
    pass


def _strip(msg: str, eid: str | None) -> str:
    prefix = f"episode {eid}: "
    return msg[len(prefix):] if eid and msg.startswith(prefix) else msg


def _one(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
