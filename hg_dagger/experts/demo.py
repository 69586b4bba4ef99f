"""Open-loop demonstrations as an initial behaviour-cloning source - and only that.

A demo is a recorded action sequence together with the observations it produced. Replayed from its own
start state it reproduces them; once anyone else has moved the env (a learner, a person), the recorded
action no longer answers the observation in front of it. So the adapter labels a row only while that
row's observation still matches the demo (within ``tolerance``) and marks every other row invalid:
it never relabels learner-visited states. It declares ``bc_only = True`` and
``collection_mode = EXPERT_DEMO``; ``require_relabeler`` refuses it for DAgger.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hg_dagger.contract.enums import CollectionMode
from hg_dagger.errors import ContractError
from hg_dagger.experts.base import ExpertQuery, Obs


@dataclass
class Demo:
    """actions [T, A] (raw space) and the observation before each action: obs[key] [T, ...]."""

    actions: np.ndarray
    obs: dict[str, np.ndarray]
    seed: int | None = None  # env reset seed that reproduces obs[0], when known
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.actions = np.asarray(self.actions, dtype=np.float32)
        self.obs = {k: np.asarray(v) for k, v in self.obs.items()}
        t = len(self.actions)
        if self.actions.ndim != 2 or t == 0:
            raise ContractError(f"demo {self.name or '?'}: actions must be [T, A] with T > 0, got {self.actions.shape}")
        for k, v in self.obs.items():
            if len(v) != t:
                raise ContractError(f"demo {self.name or '?'}: obs[{k!r}] has {len(v)} steps, actions have {t}")


class DemoAdapter:
    """Replays demos open-loop, one per env row; BC-only."""

    output_space = "raw"
    bc_only = True
    collection_mode = CollectionMode.EXPERT_DEMO

    def __init__(self, demos: Iterable[Demo], *, tolerance: float = 1e-4, keys: Sequence[str] | None = None):
        self.demos = list(demos)
        if not self.demos:
            raise ContractError("DemoAdapter: no demos given")
        self.tolerance = float(tolerance)
        self.keys = list(keys) if keys is not None else sorted(self.demos[0].obs)
        self._demo: dict[int, int] = {}  # env id -> demo index
        self._cursor: dict[int, int] = {}  # env id -> next demo step
        self._used: set[int] = set()

    @classmethod
    def from_store(cls, store, episode_ids: Sequence[str] | None = None, *, obs_keys: Sequence[str] | None = None,
                   **kw) -> DemoAdapter:
        """Demos from recorded episodes: applied_action and obs/<key> per step, the reset seed if recorded.

        Default: every complete episode of the store recorded in expert_demo mode.
        """
        if episode_ids is None:
            episode_ids = [e.episode_id for e in store.episodes(mode=CollectionMode.EXPERT_DEMO, complete=True)]
        infos = {e.episode_id: e for e in store.episodes()}
        demos = []
        for eid in episode_ids:
            info = infos.get(eid)
            arrays = store.read_steps(eid)
            keys = list(obs_keys) if obs_keys is not None else sorted(
                n.removeprefix("obs/") for n, a in arrays.items() if n.startswith("obs/") and a.dtype != np.uint8
            )
            seed = info.start.initial_state.get("seed") if info is not None else None
            demos.append(Demo(
                actions=arrays["applied_action"], obs={k: arrays[f"obs/{k}"] for k in keys},
                seed=None if seed is None else int(seed), name=eid,
            ))
        if not demos:
            raise ContractError(f"DemoAdapter: no expert_demo episodes in the store {getattr(store, 'url', '')}".rstrip())
        return cls(demos, keys=obs_keys if obs_keys is not None else sorted(demos[0].obs), **kw)

    @property
    def seeds(self) -> list[int | None]:
        """Reset seeds that put an env at each demo's start state (in demo order)."""
        return [d.seed for d in self.demos]

    def episode_start_fields(self) -> dict:
        """EpisodeStart fields every episode driven by this adapter must carry."""
        return {"mode": CollectionMode.EXPERT_DEMO, "bc_only": True}

    def _dist(self, obs: Obs, row: int, demo: Demo, t: int) -> float:
        return max(
            float(np.max(np.abs(np.asarray(obs[k][row], dtype=np.float64) - demo.obs[k][t]), initial=0.0))
            for k in self.keys
        )

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Give each new episode the first unused demo whose start state matches its first observation."""
        for row, e in enumerate(np.asarray(env_ids).tolist()):
            self._demo.pop(e, None)
            self._cursor[e] = 0
            for j, demo in enumerate(self.demos):
                if j not in self._used and self._dist(obs, row, demo, 0) <= self.tolerance:
                    self._demo[e] = j
                    self._used.add(j)
                    break

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        ids = np.asarray(env_ids).tolist()
        a_dim = self.demos[0].actions.shape[1]
        action = np.zeros((len(ids), a_dim), dtype=np.float32)
        valid = np.zeros(len(ids), dtype=bool)
        step = np.full(len(ids), -1, dtype=np.int64)
        reasons: dict[int, str] = {}
        for row, e in enumerate(ids):
            if e not in self._demo:
                reasons[e] = "no demo starts at this env's start state (BC-only demos label only their own rollout)"
                continue
            demo = self.demos[self._demo[e]]
            cur = self._cursor.get(e, 0)
            # the same observation may be asked twice (a retried query): answer it without advancing
            for t in (cur, cur - 1):
                if 0 <= t < len(demo.actions) and self._dist(obs, row, demo, t) <= self.tolerance:
                    action[row], valid[row], step[row] = demo.actions[t], True, t
                    self._cursor[e] = t + 1
                    break
            else:
                reasons[e] = (
                    "demo exhausted" if cur >= len(demo.actions)
                    else f"state left demo {demo.name or self._demo[e]} at step {cur}: BC-only demos never "
                    "relabel learner-visited states"
                )
        return ExpertQuery(action=action, valid=valid, metadata={"invalid_reason": reasons, "demo_step": step})

    def release(self) -> None:
        """Make every demo available again (a new pass over the demo set)."""
        self._used.clear()
