"""The novelty gate: a single model asks for help where the state is unlike the states it was trained on.

A policy is trustworthy near its training data and guesses away from it, whatever it reports about itself. This gate
measures how far the current state is from that data: the mean distance to the ``k`` nearest reference states of
the mapping's normalized state vector (``mapping.flatten_obs``, each dimension then scaled by the reference's own
standard deviation), divided by the same distance's ``quantile`` among the reference states themselves (each
against the others). A score of 1 is as far out as that quantile of the training states; the default trigger, 2,
twice as far. The reference is the episodes of a store (``reference: PATH``, the data the policy was trained on),
their successful ones only unless ``successes_only: false``, subsampled to ``max_states``; the task's mapping is
the one the reference episodes were recorded with. The per-tick cost is one [N, D] x [D, M] product and a partial
sort per row (numpy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from hg_dagger.control.gate_scores import GateScorer
from hg_dagger.control.gate_types import GATES, GateSpecBase, GateType
from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError

BLOCK = 32768  # distances computed at once (128 KiB of float32)


class NoveltyGate(GateSpecBase):
    """Distance of the state to the policy's training data, in units of that data's own spread (see the module)."""

    type: Literal["novelty"] = "novelty"
    trigger: float = Field(default=2.0, gt=0, description="distance in units of the reference's quantile distance")
    reference: str = Field(description="a store whose episodes the policy was trained on")
    successes_only: bool = True
    k: int = Field(default=5, ge=1, description="nearest reference states averaged")
    quantile: float = Field(default=0.95, gt=0.0, lt=1.0, description="of the reference's own distances: score 1")
    max_states: int = Field(default=2000, ge=10, description="reference states kept (a seeded subsample)")


class Reference:
    """The reference states of a store, normalized, and the distance that scores 1."""

    def __init__(self, spec: NoveltyGate):
        who = f"gate {spec.name or spec.type!r}: reference {spec.reference}"
        path = Path(spec.reference)
        if not path.exists():
            raise ConfigError(f"{who}: no such store (give the store the policy was trained on)")
        # deferred: the store loads zarr; the CLI imports the gate types to list its commands without it
        from hg_dagger.store import EpisodeStore

        try:
            store = EpisodeStore.open(path)
        except Exception as exc:  # not a store: one line, whatever the reader raised
            raise ConfigError(f"{who}: not an episode store ({exc})") from None
        infos = [i for i in store.episodes(complete=True) if not spec.successes_only or i.end.task_success]
        if not infos:
            raise ConfigError(f"{who}: no {'successful ' if spec.successes_only else ''}complete episodes")
        tasks = sorted({i.start.task.task_id for i in infos})
        if len(tasks) > 1:
            raise ConfigError(f"{who}: episodes of several tasks ({', '.join(tasks)}); give a store of one task")
        self.mapping = load_mapping(tasks[0])
        keys = self.mapping.state_keys()
        parts = []
        for info in infos:
            steps = store.read_steps(info.episode_id, [f"obs/{k}" for k in keys])
            parts.append(self.mapping.flatten_obs({k: steps[f"obs/{k}"] for k in keys}))
        states = np.concatenate(parts).astype(np.float32)
        rng = np.random.default_rng(0)
        if len(states) > spec.max_states:
            states = states[np.sort(rng.choice(len(states), spec.max_states, replace=False))]
        if len(states) <= spec.k:
            raise ConfigError(f"{who}: {len(states)} states, more than k = {spec.k} needed")
        self.mean = states.mean(0)
        std = states.std(0)
        self.scale = np.where(std > 1e-6, std, 1.0).astype(np.float32)
        self.states = (states - self.mean) / self.scale
        self.states_t = np.ascontiguousarray(self.states.T)  # [D, M]: the product's layout (2x faster than .T)
        self.sq = (self.states ** 2).sum(1)
        self.k, self.dim, self.who = spec.k, states.shape[1], who
        probe = self.states[rng.choice(len(self.states), min(1000, len(self.states)), replace=False)]
        own = self._knn(probe, self.k + 1)  # each probe finds itself at distance 0: leave it out
        own = own * (self.k + 1) / self.k
        self.unit = float(max(np.quantile(own, spec.quantile), 1e-6))
        self.size = len(self.states)

    def _knn(self, x: np.ndarray, k: int) -> np.ndarray:
        """Mean distance of each row of ``x`` (normalized) to its ``k`` nearest reference states, in blocks of rows
        whose distance matrix stays in cache (a [64, 4000] one at once is ten times slower)."""
        out = np.empty(len(x), np.float32)
        step = max(1, BLOCK // len(self.states))
        for i in range(0, len(x), step):
            xb = x[i:i + step]
            d2 = (xb ** 2).sum(1)[:, None] + self.sq[None, :] - 2.0 * (xb @ self.states_t)
            near = np.partition(np.maximum(d2, 0.0), k - 1, axis=1)[:, :k]
            out[i:i + step] = np.sqrt(near).mean(1)
        return out

    def distance(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The mean distance of each row's state to its k nearest reference states (normalized units)."""
        try:
            flat = self.mapping.flatten_obs(obs)
        except (KeyError, ValueError, IndexError) as exc:
            raise ConfigError(f"{self.who}: the observation does not fit the reference's state ({exc!r})") from None
        if flat.shape[1] != self.dim:
            raise ConfigError(f"{self.who}: the state has {flat.shape[1]} dimensions, the reference {self.dim}")
        return self._knn((flat - self.mean) / self.scale, self.k)


class NoveltyScorer(GateScorer):
    """Scores each row's distance to the reference in units of its quantile distance (calibrated on the reference
    itself: no calibration section)."""

    def __init__(self, spec: NoveltyGate, *a):
        super().__init__(spec, *a)
        self.reference = Reference(spec)
        self.last = np.zeros(self.n, np.float32)

    def score(self, inp, armed):
        """Scores the armed rows only (the others' states cannot ask): their share of the cost is saved."""
        self.last = np.zeros(self.n, np.float32)
        rows = np.flatnonzero(armed)
        if rows.size:
            obs = inp.obs if rows.size == self.n else {k: v[rows] for k, v in inp.obs.items()}
            self.last[rows] = self.reference.distance(obs) / self.reference.unit
        return self.last

    def values(self, row, inp):
        return {"novelty": float(self.last[row]), "reference_states": self.reference.size}


NOVELTY = GATES.register("novelty", GateType(NoveltyGate, NoveltyScorer, grace=True,
                                             words="this state is unlike the policy's training data"))

__all__ = ["NOVELTY", "NoveltyGate", "NoveltyScorer", "Reference"]
