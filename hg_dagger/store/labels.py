"""Label layers: derived labels stored as numbered versions beside the raw steps, never overwritten.

Version 1 is written by the recorder when an episode is committed; later versions (reviews, QC, replay checks, edited windows)
by EpisodeStore.write_labels. Masks are stored run-length encoded as [[start, end, mask_code, target_code], ...].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hg_dagger.contract.enums import LabelMask, LabelTarget
from hg_dagger.contract.schema import (
    CorrectionWindow,
    ExpertCertification,
    QCResult,
    ReplayCheck,
    ReviewDecision,
)


@dataclass(frozen=True)
class LabelLayer:
    version: int  # 0 = no layer (the episode was never committed): every step excluded
    author: str
    mask: np.ndarray  # uint8 LabelMask codes, (T,)
    target: np.ndarray  # uint8 LabelTarget codes, (T,)
    windows: list[CorrectionWindow] = field(default_factory=list)
    certifications: list[ExpertCertification] = field(default_factory=list)
    reviews: list[ReviewDecision] = field(default_factory=list)
    qc: list[QCResult] = field(default_factory=list)
    replay: ReplayCheck | None = None  # None: never replayed (status unverified)
    created_wall: str = ""
    note: str = ""  # why the mask is stricter than the label rules (an operator's discard reason); "" = it is not

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "author": self.author,
            "created_wall": self.created_wall,
            "num_steps": int(len(self.mask)),
            "runs": encode_runs(self.mask, self.target),
            "windows": [w.model_dump(mode="json") for w in self.windows],
            "certifications": [c.model_dump(mode="json") for c in self.certifications],
            "reviews": [r.model_dump(mode="json") for r in self.reviews],
            "qc": [q.model_dump(mode="json") for q in self.qc],
            "replay": None if self.replay is None else self.replay.model_dump(mode="json"),
            **({"note": self.note} if self.note else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LabelLayer:
        mask, target = decode_runs(d["runs"], int(d["num_steps"]))
        return cls(
            version=int(d["version"]),
            author=str(d.get("author", "")),
            mask=mask,
            target=target,
            windows=[CorrectionWindow.model_validate(w) for w in d.get("windows", [])],
            certifications=[ExpertCertification.model_validate(c) for c in d.get("certifications", [])],
            reviews=[ReviewDecision.model_validate(r) for r in d.get("reviews", [])],
            qc=[QCResult.model_validate(q) for q in d.get("qc", [])],
            replay=None if d.get("replay") is None else ReplayCheck.model_validate(d["replay"]),
            created_wall=str(d.get("created_wall", "")),
            note=str(d.get("note", "")),
        )

    @classmethod
    def empty(cls, num_steps: int) -> LabelLayer:
        return cls(
            version=0,
            author="",
            mask=np.full(num_steps, LabelMask.EXCLUDED.code, np.uint8),
            target=np.full(num_steps, LabelTarget.NONE.code, np.uint8),
        )


def encode_runs(mask: np.ndarray, target: np.ndarray) -> list[list[int]]:
    mask, target = np.asarray(mask, np.uint8), np.asarray(target, np.uint8)
    n = len(mask)
    if n == 0:
        return []
    change = np.flatnonzero((mask[1:] != mask[:-1]) | (target[1:] != target[:-1])) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    return [[int(s), int(e), int(mask[s]), int(target[s])] for s, e in zip(starts, ends, strict=True)]


def decode_runs(runs: list[list[int]], num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    mask = np.full(num_steps, LabelMask.EXCLUDED.code, np.uint8)
    target = np.full(num_steps, LabelTarget.NONE.code, np.uint8)
    covered = 0
    for s, e, m, t in runs:
        if not (covered == s <= e <= num_steps):
            raise ValueError(f"label runs do not tile 0..{num_steps}: run [{s}, {e}) after step {covered}")
        mask[s:e], target[s:e] = m, t
        covered = e
    if covered != num_steps:
        raise ValueError(f"label runs cover {covered} of {num_steps} steps")
    return mask, target
