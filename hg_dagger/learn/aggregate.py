"""Aggregation of trainable labels across DAgger iterations: the replay the trainer samples.

Only rows whose stored label mask is TRAINABLE and that pass the contract's training boundary
(contract.training_selection: reviewed, authorized, QC-passed, replayable) enter; the target is the array the label layer
names (expert_action or applied_action). Everything else - context rows, excluded rows, invalid
expert outputs - is dropped here, so nothing downstream can train on it.

Episodes are the unit of retention: capacity evicts whole episodes (never a partial one), and each
row keeps its episode, step and segment (a maximal run of consecutive trainable steps), so episode
and segment boundaries survive aggregation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from pydantic import Field

from hg_dagger.contract import Split, TrainingRule
from hg_dagger.contract.enums import HELD_OUT_SPLITS
from hg_dagger.contract.model import StrictModel
from hg_dagger.errors import ContractError
from hg_dagger.store.trainable import EpisodeLabels


class LabelBufferConfig(StrictModel):
    """How labels aggregate across iterations and how batches are drawn."""

    capacity: int | None = Field(default=None, gt=0, description="max trainable rows held; whole episodes are evicted")
    retention: Literal["fifo", "random"] = "fifo"  # which episodes leave first when over capacity
    keep_iterations: int | None = Field(default=None, gt=0, description="drop episodes older than the last K iterations")
    filter: Literal["all", "success_only", "failure_focused"] = "all"
    failure_weight: float = Field(default=3.0, gt=0, description="sampling weight of failed episodes (failure_focused)")
    sampling: Literal["all", "recent"] = "all"
    recent_iterations: int = Field(default=1, gt=0)
    recent_fraction: float = Field(default=0.5, ge=0.0, le=1.0, description="share of each batch from recent iterations")
    intervention_weight: float | Literal["balanced"] | None = None  # IWR-style upweighting of corrections
    holdout_fraction: float = Field(default=0.0, ge=0.0, lt=1.0, description="episodes kept out for offline eval")
    authorization: TrainingRule = Field(default_factory=TrainingRule,
                                        description="what a trainable label needs to enter (contract.TrainingRule)")


def held_out(episode_id: str, split: Split | None, fraction: float) -> bool:
    """Whether an episode is held out of training: by its split, else by a stable hash of its id."""
    if split is not None and split in HELD_OUT_SPLITS:
        return True
    if fraction <= 0:
        return False
    h = int(hashlib.sha256(episode_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return h < fraction


class LabelBuffer:
    """Aggregated trainable labels of many episodes, with capacity, retention, filters and sampling."""

    def __init__(self, config: LabelBufferConfig | None = None, *, seed: int = 0):
        self.config = config or LabelBufferConfig()
        self.episodes: list[EpisodeLabels] = []
        self.evicted: list[str] = []
        self._rng = np.random.default_rng(seed)
        self._arrays: dict[str, Any] | None = None

    # ------------------------------------------------------------------ content

    def add(self, episodes: Iterable[EpisodeLabels]) -> None:
        have = {e.episode_id for e in self.episodes}
        for ep in episodes:
            if ep.episode_id in have:
                continue
            if self.config.filter == "success_only" and not ep.success:
                continue
            self.episodes.append(ep)
            have.add(ep.episode_id)
        self._retain()
        self._arrays = None

    def _retain(self) -> None:
        cfg = self.config
        if cfg.keep_iterations is not None and self.episodes:
            newest = max(e.iteration for e in self.episodes)
            old = [e for e in self.episodes if e.iteration <= newest - cfg.keep_iterations]
            self.evicted += [e.episode_id for e in old]
            self.episodes = [e for e in self.episodes if e.iteration > newest - cfg.keep_iterations]
        if cfg.capacity is None:
            return
        while len(self) > cfg.capacity and len(self.episodes) > 1:
            if cfg.retention == "fifo":
                victim = 0
            else:
                victim = int(self._rng.integers(len(self.episodes) - 1))  # never the newest
            self.evicted.append(self.episodes.pop(victim).episode_id)

    def __len__(self) -> int:
        return sum(len(e) for e in self.episodes)

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def episode_ids(self) -> list[str]:
        return [e.episode_id for e in self.episodes]

    # ------------------------------------------------------------------ arrays

    def arrays(self) -> dict[str, Any]:
        """Concatenated rows: obs (dict), target, weight, episode, step, segment, iteration, intervention."""
        if self._arrays is None:
            eps = self.episodes
            if not sum(len(e) for e in eps):
                raise ContractError("replay holds no label that may be trained on: none is trainable, or none passed "
                                    "review, authorization and QC (`hg-dagger report STORE` says why); an auto run's "
                                    "planner labels need `certification: planner_auto` in its config")
            cat = np.concatenate
            self._arrays = {
                "obs": {k: cat([e.obs[k] for e in eps]) for k in eps[0].obs},
                "target": cat([e.target for e in eps]),
                "episode": cat([np.full(len(e), i, dtype=np.int64) for i, e in enumerate(eps)]),
                "step": cat([e.step for e in eps]),
                "segment": cat([e.segment for e in eps]),
                "iteration": cat([np.full(len(e), e.iteration, dtype=np.int64) for e in eps]),
                "success": cat([np.full(len(e), e.success) for e in eps]),
                "intervention": cat([e.intervention for e in eps]),
            }
            self._arrays["weight"] = self._loss_weights(self._arrays)
            self._arrays["cdf"] = self._sampling_cdf(self._arrays)
        return self._arrays

    def _loss_weights(self, a: dict[str, Any]) -> np.ndarray:
        w = np.ones(len(a["target"]), dtype=np.float32)
        iw = self.config.intervention_weight
        if iw is not None:
            n_int = int(a["intervention"].sum())
            if iw == "balanced":
                iw = (len(w) - n_int) / n_int if n_int and n_int < len(w) else 1.0
            w[a["intervention"]] = float(iw)
        return w

    def _sampling_cdf(self, a: dict[str, Any]) -> np.ndarray:
        cfg = self.config
        p = np.ones(len(a["target"]), dtype=np.float64)
        if cfg.filter == "failure_focused":
            p[~a["success"]] = cfg.failure_weight
        p /= p.sum()
        if cfg.sampling == "recent":
            newest = int(a["iteration"].max())
            recent = a["iteration"] > newest - cfg.recent_iterations
            if recent.any() and not recent.all():
                pr = np.where(recent, p, 0.0)
                p = cfg.recent_fraction * pr / pr.sum() + (1 - cfg.recent_fraction) * p
        cdf = np.cumsum(p)
        cdf /= cdf[-1]
        return cdf

    def sample(self, batch_size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """Row indices of one batch under the configured filter and recent/all sampling."""
        cdf = self.arrays()["cdf"]
        u = (rng or self._rng).random(batch_size)
        return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)

    def chunk_rows(self, horizon: int) -> tuple[np.ndarray, np.ndarray]:
        """For every row, the rows of the ``horizon`` steps from it on within its segment (a chunk head's targets):
        indices [n, H] and which of them exist [n, H]. A chunk never crosses a handover boundary or mixes label
        sources (a segment holds consecutive steps labelled from one source); past the segment's end it is
        padding, masked out of the loss."""
        a = self.arrays()
        n = len(a["target"])
        idx = np.minimum(np.arange(n)[:, None] + np.arange(horizon)[None, :], n - 1)
        valid = ((a["episode"][idx] == a["episode"][:, None]) & (a["segment"][idx] == a["segment"][:, None])
                 & (a["step"][idx] == a["step"][:, None] + np.arange(horizon)[None, :]))
        return idx, valid

    def segments(self) -> list[tuple[str, int, int]]:
        """(episode_id, first_step, end_step) of every trainable segment, in replay order."""
        out = []
        for e in self.episodes:
            for s in np.unique(e.segment):
                steps = e.step[e.segment == s]
                out.append((e.episode_id, int(steps[0]), int(steps[-1]) + 1))
        return out

    # ------------------------------------------------------------------ resume

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the episode ids and iterations (data stays in the store) and the RNG."""
        return {
            "episodes": [[e.episode_id, e.iteration] for e in self.episodes],
            "evicted": list(self.evicted),
            "rng": _rng_state_str(self._rng),
            "config": self.config.model_dump(),
        }

    def restore(self, state: dict[str, Any], loader) -> None:
        """Reload the listed episodes with ``loader(episode_id) -> EpisodeLabels``."""
        self.episodes = []
        for eid, iteration in state["episodes"]:
            ep = loader(eid)
            ep.iteration = int(iteration)
            self.episodes.append(ep)
        self.evicted = list(state.get("evicted", []))
        self._rng = _rng_from_str(state["rng"])
        self._arrays = None

    def summary(self) -> dict[str, Any]:
        iters = sorted({e.iteration for e in self.episodes})
        return {"labels": len(self), "episodes": self.num_episodes, "iterations": iters, "evicted": len(self.evicted)}


def _rng_state_str(rng: np.random.Generator) -> str:
    return json.dumps(rng.bit_generator.state)


def _rng_from_str(text: str) -> np.random.Generator:
    state = json.loads(text)
    bg = getattr(np.random, state["bit_generator"])()
    bg.state = state
    return np.random.Generator(bg)
