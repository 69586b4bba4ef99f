"""Automated QC: six checks per episode and per correction window, written as QCResult records in a new label layer.

The checks (seed 002, "质量控制与准入"):

1. completeness      the episode is committed, its fields and timestamps are present, dropped steps are accounted for;
2. time_alignment    obs-to-apply latency within budget, t_obs <= t_policy <= t_action_apply, clock alignment error,
                     interpolated and dropped steps (anomalies fail the window, nothing is repaired);
3. executability     applied actions inside the task's raw action bounds and the recorded safety limits (per-tick
                     change included), e-stops and safety clamps counted;
4. label_consistency window bounds agree with the per-step evidence (action_source, human_command, t_handover);
5. recovery          the window's outcome and the episode's end, as figures;
6. review            pending / approved / rejected decisions of the latest layer.

Task outcome and data quality are never merged into one boolean: ``QCResult.passed`` is the conjunction of the four
data-quality checks (1-4); recovery and review are recorded in ``checks`` and ``flags`` beside it. QC never edits
raw data nor the label mask: it appends a layer that carries the latest layer's windows, certifications, reviews and
mask, and only when its results differ from the QC results already in the latest layer.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.contract.schema import QCResult
from hg_dagger.errors import ContractError, HgDaggerError, StoreError
from hg_dagger.review.qc_checks import CHECKS, QUALITY_CHECKS, EpisodeQC, check_episode
from hg_dagger.review.qc_config import QCConfig
from hg_dagger.store import EpisodeStore

QC_VERSION = "1"
AUTHOR = f"qc:{QC_VERSION}"


@dataclass
class QCSummary:
    store: str
    episodes: list[EpisodeQC] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # never committed: not checked, no layer possible
    errors: list[str] = field(default_factory=list)  # episodes that could not be checked (damaged data)
    dry_run: bool = False

    def _results(self, windows: bool) -> list[QCResult]:
        return [r for e in self.episodes for r in (e.windows if windows else [e.episode])]

    def counts(self, windows: bool) -> dict[str, dict[str, int]]:
        """check -> {"passed": n, "failed": n} over episodes (windows=False) or windows."""
        out = {c: {"passed": 0, "failed": 0} for c in CHECKS}
        for r in self._results(windows):
            for c in CHECKS:
                out[c]["passed" if r.checks.get(c) else "failed"] += 1
        return out

    @property
    def layers_written(self) -> int:
        return sum(e.version is not None for e in self.episodes)

    @property
    def unchanged(self) -> int:
        return sum(e.unchanged for e in self.episodes)

    def figures(self) -> dict[str, Any]:
        outcomes = Counter(e.figures[r.window_id]["outcome"] for e in self.episodes for r in e.windows)
        reviews = Counter(e.figures[r.window_id]["review"] for e in self.episodes for r in e.windows)
        flags = Counter(f for e in self.episodes for r in e.results for f in r.flags)
        return {"window_outcomes": dict(outcomes), "window_reviews": dict(reviews), "flags": dict(flags)}

    def line(self) -> str:
        eps, wins = self._results(False), self._results(True)
        failed = [c for c in QUALITY_CHECKS if self.counts(False)[c]["failed"] or self.counts(True)[c]["failed"]]
        rev = self.figures()["window_reviews"]
        parts = [
            f"{self.store}: {len(eps)} episodes ({sum(r.passed for r in eps)} passed)",
            f"{len(wins)} windows ({sum(r.passed for r in wins)} passed)",
            "failing checks: " + (", ".join(f"{c} {self.counts(False)[c]['failed']}+{self.counts(True)[c]['failed']}"
                                            for c in failed) or "none"),
            "reviews " + "/".join(f"{rev.get(s.value, 0)} {s.value}" for s in ReviewStatus),
        ]
        if self.incomplete:
            parts.append(f"{len(self.incomplete)} incomplete skipped")
        if self.errors:
            parts.append(f"{len(self.errors)} unreadable")
        parts.append("dry run, nothing written" if self.dry_run else
                     f"{self.layers_written} layer(s) written, {self.unchanged} unchanged")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "episodes": len(self.episodes),
            "windows": sum(len(e.windows) for e in self.episodes),
            "passed": {"episodes": sum(e.episode.passed for e in self.episodes),
                       "windows": sum(r.passed for e in self.episodes for r in e.windows)},
            "checks": {"episodes": self.counts(False), "windows": self.counts(True)},
            **self.figures(),
            "layers_written": self.layers_written,
            "unchanged": self.unchanged,
            "dry_run": self.dry_run,
            "incomplete": self.incomplete,
            "errors": self.errors,
            "results": [e.to_json() for e in self.episodes],
        }


# ------------------------------------------------------------------------------------------ running


def run_qc(
    store: EpisodeStore | str,
    *,
    config: QCConfig | None = None,
    episodes: Iterable[str] | None = None,
    write: bool = True,
    progress: bool = False,
) -> QCSummary:
    """QC every committed episode of ``store`` (or the named ones) and, with ``write``, append a label layer per
    episode whose QC results changed. Incomplete episodes are skipped and listed; naming one is an error."""
    cfg = config or QCConfig()
    if not isinstance(store, EpisodeStore):
        store = EpisodeStore.open(store, mode="a" if write else "r")
    elif write and store.mode != "a":
        raise StoreError(f"{store.url}: opened read-only; QC writes label layers (open it with mode='a')")
    summary = QCSummary(store=store.url, dry_run=not write)
    if episodes is None:
        infos = store.episodes()
    else:
        infos = []
        for eid in episodes:
            if not store.has_episode(eid):
                raise StoreError(f"{store.url}: no episode {eid!r}")
            info = store.info(eid)
            if not info.complete:
                raise ContractError(f"{store.url}: episode {eid} is incomplete (never committed); it cannot be QC'd")
            infos.append(info)
    for info in tqdm(infos, desc="qc", unit="ep", disable=not progress):
        if not info.complete:
            summary.incomplete.append(info.episode_id)
            continue
        try:
            eqc = check_episode(store, info, cfg)
            if write:
                _write(store, eqc)
        except HgDaggerError as exc:
            summary.errors.append(f"{store.url}: episode {info.episode_id}: {exc}")
            continue
        summary.episodes.append(eqc)
    return summary


def _write(store: EpisodeStore, eqc: EpisodeQC) -> None:
    latest = store.labels(eqc.episode_id)
    if _same(latest.qc, eqc.results):
        eqc.unchanged = True
        return
    eqc.version = store.write_labels(eqc.episode_id, author=AUTHOR, qc=eqc.results, mask=latest.mask)


def _same(a: list[QCResult], b: list[QCResult]) -> bool:
    return [r.model_dump(mode="json") for r in a] == [r.model_dump(mode="json") for r in b]


def format_json(summary: QCSummary) -> str:
    return json.dumps(summary.to_json(), indent=2, default=_jsonable)


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    raise TypeError(f"not JSON serializable: {type(v).__name__}")
