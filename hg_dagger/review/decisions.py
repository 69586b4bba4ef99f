"""Review decisions on correction windows: list them, show their audit trail, record a verdict.

A decision is never an edit: it becomes a new label layer on the window's episode (author
``review:<reviewer>``) whose ``reviews`` are the previous ones plus the new ReviewDecision, with
windows, certifications, QC results and the mask carried over. The history of a window is thus the
union of the decisions in all of its episode's layers.

A reviewer is never the operator: ``decide`` refuses a decision whose reviewer is the window's operator
(``contract.labels.review_problem``), and an authorization by a reviewer off the store's roster when it
declares one. The one verdict an operator may record on their own window is a rejection, through
``flag_by_operator`` (the console's "my correction was bad"): it is final.

Two reviewers may decide at once. ``EpisodeStore.write_labels`` never overwrites a layer, but each
writer builds its layer from the latest one it read, so the later layer can miss a decision made in
between. ``decide`` therefore re-reads after writing and, if a layer it did not see appeared, writes
one more layer holding the union of all decisions (see ``_reconcile``).
"""

from __future__ import annotations

import datetime as _dt
import os
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

from hg_dagger.contract.enums import LabelMask, ReviewStatus
from hg_dagger.contract.labels import (
    certified_windows,
    current_review,
    is_operator,
    operator_rejected,
    pseudonym_key,
    review_problem,
)
from hg_dagger.contract.schema import CorrectionWindow, ReviewDecision
from hg_dagger.errors import HgDaggerError
from hg_dagger.store import EpisodeStore
from hg_dagger.store.labels import LabelLayer

MIN_PREFIX = 8
"""Shortest window id prefix accepted (a full id is always accepted)."""

MAX_RECONCILE = 50


class ReviewError(HgDaggerError):
    """A review command cannot proceed (unknown or ambiguous window, missing reviewer or reason...)."""


@dataclass(frozen=True)
class WindowFilter:
    """Which windows list_windows returns; None means any."""

    status: ReviewStatus | str | None = None
    task: str | None = None
    operator: str | None = None


@dataclass(frozen=True)
class WindowRow:
    """One correction window with its episode context and its current review state."""

    window_id: str
    episode_id: str
    task: str
    operator: str
    gate_reason: str
    handover_start: int
    handover_end: int
    source: str
    outcome: str
    status: ReviewStatus
    authorized: bool
    reviewer: str
    label_version: int
    certified: bool = False  # covered by a counting certification (a planner's): trainable without authorization
    problem: str = ""  # why its current decision authorizes nothing although it says so (review_problem)
    trainable_steps: int = -1  # its steps the latest label mask keeps trainable (0: a decision trains nothing)
    excluded_why: str = ""  # with no trainable step: the label layer's note (an operator's discard reason)
    branch_of: str = ""  # a branch episode's parent and step ("<episode id>@<step>": a rewind), else ""

    @property
    def short_id(self) -> str:
        return self.window_id[:12]

    @property
    def auth(self) -> str:
        """May it train: "no labels" (none of its steps is a trainable label any more: its episode was discarded or
        its labels excluded, so no decision trains it), "yes" (a reviewer authorized it), "certified" (its planner
        did), "void" (an authorization that counts for nothing: by the operator, or off the roster) or "no"."""
        if self.trainable_steps == 0:
            return "no labels"
        return "yes" if self.authorized else "certified" if self.certified else "void" if self.problem else "no"

    def to_json(self) -> dict[str, Any]:
        return {"window_id": self.window_id, "short_id": self.short_id, "episode_id": self.episode_id,
                "task": self.task, "operator": self.operator, "gate_reason": self.gate_reason,
                "handover_start": self.handover_start, "handover_end": self.handover_end, "source": self.source,
                "outcome": self.outcome, "status": self.status.value, "authorized": self.authorized,
                "reviewer": self.reviewer, "label_version": self.label_version, "certified": self.certified,
                "problem": self.problem, "trainable_steps": self.trainable_steps, "excluded_why": self.excluded_why,
                "branch_of": self.branch_of}


@dataclass(frozen=True)
class AuditEntry:
    """One decision as first recorded: in label layer ``version`` written by ``author``."""

    version: int
    author: str
    created_wall: str
    decision: ReviewDecision

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {"version": self.version, "author": self.author, "created_wall": self.created_wall,
                "reviewer": d.reviewer, "status": d.status.value, "authorized": d.replay_training_authorized,
                "reason": d.notes, "t_wall": d.t_wall}


# ------------------------------------------------------------------------------------------ reading


def open_store(store: EpisodeStore | str | os.PathLike, mode: Literal["r", "a"] = "r") -> EpisodeStore:
    """An EpisodeStore from a path (StoreError names the path if it is missing or of another schema)."""
    if isinstance(store, EpisodeStore):
        if mode == "a" and store.mode != "a":
            return EpisodeStore.open(store.url, mode="a")
        return store
    return EpisodeStore.open(os.fspath(store), mode=mode)


_TRAINABLE = LabelMask.TRAINABLE.code


def _current(layer: LabelLayer, window_id: str) -> ReviewDecision | None:
    return current_review(layer.reviews, window_id)


def window_row(info, layer: LabelLayer, w: CorrectionWindow, certified: set[str] | None = None,
               reviewers: list[str] | None = None) -> WindowRow:
    """A window's review row (the one definition, shared by the review list and the console's review tab)."""
    operator = w.operator or info.start.operator
    d = _current(layer, w.window_id)
    if certified is None:
        certified = certified_windows(layer.windows, layer.certifications, operator=info.start.operator,
                                      policy_version=info.start.policy_version)
    flag = operator_rejected(layer.reviews, w.window_id, operator)
    if flag is not None and d is not None and d.status != ReviewStatus.REJECTED:
        d = flag  # the operator's own rejection is final, whatever came later
    problem = ""
    if d is not None and d.status == ReviewStatus.APPROVED and d.replay_training_authorized:
        problem = review_problem(d, operator=operator, reviewers=reviewers) or ""
    trainable = int(np.count_nonzero(layer.mask[w.handover_start:w.handover_end] == _TRAINABLE))
    return WindowRow(
        window_id=w.window_id, episode_id=info.episode_id, task=info.task_id,
        operator=operator, gate_reason=w.gate_reason,
        handover_start=w.handover_start, handover_end=w.handover_end, source=w.source.value,
        outcome=w.outcome.value, status=d.status if d else ReviewStatus.PENDING,
        authorized=bool(d and d.replay_training_authorized) and not problem, reviewer=d.reviewer if d else "",
        label_version=layer.version, certified=w.window_id in certified, problem=problem,
        trainable_steps=trainable, excluded_why=layer.note if trainable == 0 else "",
        branch_of=(f"{info.start.parent_episode_id}@{info.start.parent_step_id}"
                   if info.start.parent_episode_id is not None else ""))


@overload
def _status(value: ReviewStatus | str) -> ReviewStatus: ...
@overload
def _status(value: None) -> None: ...
def _status(value: ReviewStatus | str | None) -> ReviewStatus | None:
    if value is None or isinstance(value, ReviewStatus):
        return value
    try:
        return ReviewStatus(str(value).replace("-", "_"))
    except ValueError:
        raise ReviewError(f"unknown review status {value!r} (one of: {', '.join(s.value for s in ReviewStatus)})") from None


def list_windows(store: EpisodeStore | str | os.PathLike, filters: WindowFilter | None = None, *,
                 progress: Callable[[Iterable], Iterable] | None = None) -> list[WindowRow]:
    """Every correction window of the committed episodes, in recording order, with its current review state.

    Reads only the catalog and label layers (never step arrays). ``progress`` may wrap the episode
    iterable (a tqdm bar, say)."""
    st = open_store(store)
    f = filters or WindowFilter()
    want = _status(f.status)
    infos = st.episodes(task_id=f.task, complete=True)
    roster = st.reviewers
    rows = []
    for info in progress(infos) if progress else infos:
        layer = st.labels(info.episode_id)
        certified = certified_windows(layer.windows, layer.certifications, operator=info.start.operator,
                                      policy_version=info.start.policy_version)
        for w in layer.windows:
            row = window_row(info, layer, w, certified, roster)
            if want is not None and row.status != want:
                continue
            if f.operator is not None and pseudonym_key(row.operator) != pseudonym_key(f.operator):
                continue
            rows.append(row)
    return rows


def incomplete_episodes(store: EpisodeStore | str | os.PathLike) -> list[str]:
    """Episodes never committed: their windows cannot be reviewed until a commit exists."""
    return [i.episode_id for i in open_store(store).episodes(complete=False)]


def find_window(store: EpisodeStore | str | os.PathLike, window_id: str) -> WindowRow:
    """The window whose id is ``window_id`` or starts with it (>= MIN_PREFIX characters, unique)."""
    st = open_store(store)
    key = (window_id or "").strip().lower()
    if not key:
        raise ReviewError(f"{st.url}: a window id is needed")
    rows = list_windows(st)
    exact = [r for r in rows if r.window_id == key]
    if exact:
        return exact[0]
    if len(key) < MIN_PREFIX:
        raise ReviewError(f"{st.url}: window id {window_id!r} is too short (give at least {MIN_PREFIX} characters)")
    matches = [r for r in rows if r.window_id.startswith(key)]
    if not matches:
        hint = ""
        if incomplete_episodes(st):
            hint = " (windows of incomplete episodes cannot be reviewed until they are committed)"
        raise ReviewError(f"{st.url}: no correction window {window_id!r}{hint}")
    if len(matches) > 1:
        ids = ", ".join(f"{r.window_id} (episode {r.episode_id})" for r in matches[:5])
        raise ReviewError(f"{st.url}: window id {window_id!r} is ambiguous: {ids}")
    return matches[0]


def _key(d: ReviewDecision) -> tuple:
    return (d.window_id, d.reviewer, d.status.value, d.replay_training_authorized, d.notes, d.t_wall)


def _layers(st: EpisodeStore, episode_id: str, after: int = 0) -> list[LabelLayer]:
    return [st.labels(episode_id, v) for v in st.label_versions(episode_id) if v > after]


def audit_trail(store: EpisodeStore | str | os.PathLike, window_id: str) -> list[AuditEntry]:
    """Every decision ever recorded on the window, oldest first, read from all of its episode's layers."""
    st = open_store(store)
    return _trail(st, find_window(st, window_id))


def _trail(st: EpisodeStore, row: WindowRow) -> list[AuditEntry]:
    seen: set[tuple] = set()
    out = []
    for layer in _layers(st, row.episode_id):
        for d in layer.reviews:
            if d.window_id == row.window_id and _key(d) not in seen:
                seen.add(_key(d))
                out.append(AuditEntry(layer.version, layer.author, layer.created_wall, d))
    return out


def window_context(store: EpisodeStore | str | os.PathLike, window_id: str) -> dict[str, Any]:
    """The window, its episode's metadata and QC results, its current state and audit trail (for `show`)."""
    st = open_store(store)
    row = find_window(st, window_id)
    info = st.info(row.episode_id)
    layer = st.labels(row.episode_id)
    window = next(w for w in layer.windows if w.window_id == row.window_id)
    return {
        "row": row,
        "window": window,
        "episode": {
            "episode_id": info.episode_id, "task": info.task_id, "mode": info.start.mode.value,
            "operator": info.start.operator, "policy_version": info.start.policy_version,
            "num_steps": info.num_steps, "end_reason": info.end.end_reason.value,
            "task_success": info.end.task_success, "recovery_outcome": info.end.recovery_outcome.value,
            "replay_status": info.end.replay_status.value, "label_versions": st.label_versions(info.episode_id),
            "windows_in_episode": len(layer.windows),
        },
        "qc": [q for q in layer.qc if q.window_id in (None, row.window_id)],
        "trail": _trail(st, row),
    }


# ------------------------------------------------------------------------------------------ deciding


def decide(store: EpisodeStore | str | os.PathLike, window_id: str, status: ReviewStatus | str, reviewer: str,
           reason: str = "", authorize: bool = False) -> tuple[WindowRow, int]:
    """Record a verdict on a window as a new label layer; returns the window's new row and the layer version.

    Approve may carry training authorization (``replay_training_authorized``); reject and needs_fix never
    do and need a reason. The reviewer is a pseudonym and may not be empty."""
    st = open_store(store, mode="a")
    status = _status(status)
    reviewer = (reviewer or "").strip()
    reason = (reason or "").strip()
    if not reviewer:
        raise ReviewError(f"{st.url}: a reviewer (pseudonym) is required")
    _check_pseudonym(st, "reviewer", reviewer)
    if status == ReviewStatus.PENDING:
        raise ReviewError(f"{st.url}: 'pending' is not a decision (approve, reject or needs_fix)")
    if status != ReviewStatus.APPROVED and authorize:
        raise ReviewError(f"{st.url}: only an approval can authorize training (not {status.value})")
    st.refresh()
    row = find_window(st, window_id)
    if status != ReviewStatus.APPROVED and not reason:
        verb = {ReviewStatus.REJECTED: "reject", ReviewStatus.NEEDS_FIX: "send back"}[status]
        raise ReviewError(f"{st.url}: a reason is required to {verb} window {row.window_id} "
                          f"(episode {row.episode_id})")
    decision = ReviewDecision(window_id=row.window_id, reviewer=reviewer, status=status,
                              replay_training_authorized=bool(authorize), notes=reason,
                              t_wall=_now())
    why = review_problem(decision, operator=row.operator, reviewers=st.reviewers)
    if why is not None:
        raise ReviewError(f"{st.url}: window {row.window_id} (episode {row.episode_id}) not {status.value}: {why}")
    return _record(st, row, decision, author=f"review:{reviewer}")


def flag_by_operator(store: EpisodeStore | str | os.PathLike, window_id: str, operator: str,
                     reason: str) -> tuple[WindowRow, int]:
    """The window's operator flags their own correction as bad: a rejection recorded under their pseudonym.

    The only decision an operator may make on their own window, and a final one: the window never trains,
    whatever reviewers decide later (contract.labels.operator_rejected). Refused for anyone but the window's
    operator and without a reason."""
    st = open_store(store, mode="a")
    operator = (operator or "").strip()
    reason = (reason or "").strip()
    if not operator:
        raise ReviewError(f"{st.url}: the operator's pseudonym is required to flag a correction")
    _check_pseudonym(st, "operator", operator)
    st.refresh()
    row = find_window(st, window_id)
    if not is_operator(operator, row.operator):
        raise ReviewError(f"{st.url}: window {row.window_id} (episode {row.episode_id}) is operator "
                          f"{row.operator or '(none)'}'s correction, not {operator!r}'s: only its operator can flag it")
    if not reason:
        raise ReviewError(f"{st.url}: a reason is required to flag window {row.window_id} (episode {row.episode_id})")
    decision = ReviewDecision(window_id=row.window_id, reviewer=operator, status=ReviewStatus.REJECTED,
                              notes=reason, t_wall=_now())
    return _record(st, row, decision, author=f"{OPERATOR_AUTHOR}{operator}")


OPERATOR_AUTHOR = "operator:"  # author prefix of the layers flag_by_operator writes


_INVISIBLE = ("Cc", "Cf", "Co", "Cn", "Zl", "Zp")  # control, format, private, unassigned; line and paragraph breaks


def _check_pseudonym(st: EpisodeStore, role: str, name: str) -> None:
    """A pseudonym is one line of visible text: a control character (a newline, an escape) would break every
    one-line listing it appears in, and an invisible one (a zero-width space) would make two pseudonyms look
    the same."""
    bad = next((c for c in name if unicodedata.category(c) in _INVISIBLE), None)
    if bad is not None:
        raise ReviewError(f"{st.url}: {role} {name!r} holds the invisible or control character {bad!r} "
                          f"(U+{ord(bad):04X}); a pseudonym is one line of visible text")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")


def _record(st: EpisodeStore, row: WindowRow, decision: ReviewDecision, *, author: str) -> tuple[WindowRow, int]:
    """Add ``decision`` to the window's episode in a new label layer (reconciled with concurrent writers)."""
    base = st.labels(row.episode_id)
    _append(st, row.episode_id, base, [*base.reviews, decision], author=author)
    version = _reconcile(st, row.episode_id, base.version, author=author)
    return find_window(st, row.window_id), version


def _append(st: EpisodeStore, episode_id: str, base: LabelLayer, reviews: list[ReviewDecision], *, author: str) -> int:
    """A new layer like ``base`` (windows, certifications, QC results, mask) with the given reviews; fields
    this module does not know are carried over from the latest layer by write_labels."""
    return st.write_labels(episode_id, author=author, windows=base.windows, certifications=base.certifications,
                           qc=base.qc, reviews=reviews, mask=base.mask)


def _is_review(layer: LabelLayer) -> bool:
    return layer.author.startswith(("review:", OPERATOR_AUTHOR))


def _same_labels(a: LabelLayer, b: LabelLayer) -> bool:
    return (a.windows == b.windows and a.certifications == b.certifications and a.qc == b.qc
            and np.array_equal(a.mask, b.mask))


def _reconcile(st: EpisodeStore, episode_id: str, base_version: int, *, author: str) -> int:
    """Make the latest layer hold every decision written since ``base_version``; returns its version.

    Each writer calls this after its own write, so the last writer sees every layer before its own and
    leaves a latest layer with all decisions (union in order of first appearance). Windows, QC results,
    certifications and the mask follow the newest layer written by another tool since ``base_version``,
    so a decision built on a stale layer does not undo, say, a QC run that landed meanwhile."""
    for _ in range(MAX_RECONCILE):
        st.refresh()
        layers = _layers(st, episode_id, after=base_version - 1)
        union: dict[tuple, ReviewDecision] = {}
        for layer in layers:
            for d in layer.reviews:
                union.setdefault(_key(d), d)
        latest = layers[-1]
        others = [layer for layer in layers[1:] if not _is_review(layer)]
        fields_from = others[-1] if others else latest
        if set(union) <= {_key(d) for d in latest.reviews} and _same_labels(latest, fields_from):
            return latest.version
        _append(st, episode_id, fields_from, list(union.values()), author=author)
    raise ReviewError(f"{st.url}: episode {episode_id}: label layers kept changing while a decision was recorded; "
                      "run the command again")
