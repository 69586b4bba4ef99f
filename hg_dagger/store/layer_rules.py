"""What a new label layer must satisfy before it is written: windows, certifications, reviews, QC results and a
replay check bound to their episode, certifications accepted, and a given mask no looser than the label rules. The
store's write_labels builds layers here; validate re-checks stored layers with the same bindings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.enums import LabelMask, LabelTarget
from hg_dagger.contract.labels import certification_problem, derive_labels, label_violations
from hg_dagger.contract.schema import (
    CorrectionWindow,
    EpisodeStart,
    ExpertCertification,
    FieldSpec,
    QCResult,
    ReplayCheck,
    ReviewDecision,
)
from hg_dagger.errors import ContractError
from hg_dagger.store import layout
from hg_dagger.store.labels import LabelLayer

LABEL_INPUTS = ("action_source", "valid", "step_flags", "expert_valid")


def new_layer(episode_id: str, start: EpisodeStart, quality_flags: list[str], n: int, inputs: dict[str, Any],
              version: int, author: str, mask: np.ndarray | None, *, windows: list[CorrectionWindow],
              certifications: list[ExpertCertification], reviews: list[ReviewDecision], qc: list[QCResult],
              replay: ReplayCheck | None, note: str = "") -> LabelLayer:
    """A label layer checked against the bindings and the label rules (ContractError naming the episode)."""
    check_bindings(episode_id, n, windows, certifications, reviews, qc, ContractError)
    check_replay(episode_id, n, replay, ContractError)
    who: dict[str, Any] = {"operator": start.operator, "policy_version": start.policy_version}
    for c in certifications:
        if (why := certification_problem(c, **who)) is not None:
            raise ContractError(f"episode {episode_id}: certification {c.cert_id} by {c.certifier!r} refused: {why}")
    derived = derive_labels(**inputs, windows=windows, certifications=certifications, mode=start.mode,
                            quality_flags=quality_flags, **who)
    if mask is None:
        new_mask, new_target = derived.mask, derived.target
    else:
        new_mask = np.asarray(mask)
        if new_mask.shape != (n,):
            raise ContractError(f"episode {episode_id}: mask has shape {new_mask.shape}, expected ({n},)")
        if new_mask.dtype.kind not in "ui" or new_mask.min(initial=0) < 0 or new_mask.max(initial=0) >= len(LabelMask):
            raise ContractError(f"episode {episode_id}: mask holds values that are not LabelMask codes")
        new_mask = new_mask.astype(np.uint8)
        bad = label_violations(episode_id=episode_id, label_mask=new_mask, **inputs, windows=windows,
                               certifications=certifications, mode=start.mode,
                               quality_flags=quality_flags, **who)
        if bad:
            raise ContractError(f"mask breaks the label rules: {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""))
        trainable = new_mask == LabelMask.TRAINABLE.code
        new_target = np.where(trainable, derived.target, LabelTarget.NONE.code).astype(np.uint8)
    return LabelLayer(version=version, author=author, mask=new_mask, target=new_target, windows=windows,
                      certifications=certifications, reviews=reviews, qc=qc, replay=replay, note=note,
                      created_wall=wall_stamp())


def check_bindings(episode_id: str, n: int, windows: Iterable[CorrectionWindow],
                   certifications: Iterable[ExpertCertification], reviews: Iterable[ReviewDecision],
                   qc: Iterable[QCResult], error: Callable[[str], BaseException]) -> None:
    """Windows, certifications, reviews and QC results must point at this episode, its steps and its windows."""
    ids = set()
    for w in windows:
        if w.parent_episode_id != episode_id:
            raise error(f"episode {episode_id}: window {w.window_id} belongs to episode {w.parent_episode_id}")
        if w.handover_end > n or w.parent_step_id >= max(n, 1):
            raise error(f"episode {episode_id}: window {w.window_id} [{w.handover_start}, {w.handover_end}) "
                        f"outside the episode's {n} steps")
        ids.add(w.window_id)
    for c in certifications:
        if c.episode_id != episode_id or c.step_end > n:
            raise error(f"episode {episode_id}: certification {c.cert_id} does not fit this episode's {n} steps")
    for r in reviews:
        if r.window_id not in ids:
            raise error(f"episode {episode_id}: review by {r.reviewer} names unknown window {r.window_id}")
    for q in qc:
        if q.episode_id != episode_id or (q.window_id is not None and q.window_id not in ids):
            raise error(f"episode {episode_id}: QC result does not belong to this episode or its windows")


def check_replay(episode_id: str, n: int, replay: ReplayCheck | None, error: Callable[[str], BaseException]) -> None:
    """A replay check's divergent step must be one of the episode's steps."""
    if replay is not None and replay.first_divergent_step is not None and replay.first_divergent_step >= max(n, 1):
        raise error(f"episode {episode_id}: replay check diverges at step {replay.first_divergent_step}, "
                    f"outside the episode's {n} steps")


def fill_column(spec: FieldSpec | None, name: str, n: int) -> np.ndarray:
    """A column an older segment lacks, filled with its field's fill value ("valid" fills True)."""
    if spec is None:
        return np.full(n, {"valid": True}.get(name, 0))
    return layout.fill_rows(spec, n)
