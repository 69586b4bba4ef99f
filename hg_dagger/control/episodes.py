"""One episode writer, the store sink of every recording mode (the human-gated session and the automatic-expert
Collector).

    w = EpisodeWriter(recorder, mapping, num_envs)
    w.begin(row, mode=..., policy_version=..., seed=...)     # EpisodeStart + recorder.begin_episode
    w.write_tick(tick, expert=..., extra=...)               # an engine tick's active rows as steps
    w.write(rows, columns, shared)                          # the rows' steps to recorder.put_rows, as columns
    w.end(row, EpisodeEnd(...), windows)                    # recorder.end_episode; the row is free again

Both build the EpisodeStart record and a tick's step columns here, so what the modes store cannot drift
apart; a mode adds only its own columns (the session: the person's command, alignment, chunks). The writer
also keeps each row's open episode id and step count.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hg_dagger import __version__
from hg_dagger.contract.enums import ActionSource, CollectionMode
from hg_dagger.contract.schema import (
    CorrectionWindow,
    EpisodeEnd,
    EpisodeStart,
    Event,
    ExpertCertification,
    TaskInfo,
    Versions,
    step_fields,
)
from hg_dagger.envs.backends import BACKENDS
from hg_dagger.store.layout import fill_rows

if TYPE_CHECKING:
    from hg_dagger.control.engine import Tick

DEFAULT_SCENE = "default"
SRC_EXPERT = ActionSource.EXPERT.code  # the scene of a task when neither the run config nor the gate config names one


def _pkg(name: str) -> str:
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{name} (not installed)"


@functools.cache
def backend_versions(backend: str, robot: str = "") -> Versions:
    """Versions of what steps a task's backend here: simulator and env packages, and hg_dagger as the controller
    (the toy backend is hg_dagger's own numpy arm); ``robot`` is the env's own ``VecEnv.robot``. The packages are
    the backend record's (hg_dagger.envs.backends), so replay knows what made the episode."""
    spec = BACKENDS.get(backend) if backend in BACKENDS else None
    sim, env = (spec.simulator, spec.env) if spec is not None else ((), ())
    ours = f"hg_dagger {__version__}"
    return Versions(robot=robot, simulator=", ".join(_pkg(p) for p in sim),
                    env=", ".join(_pkg(p) for p in env) or ours, controller=ours)


class EpisodeWriter:
    def __init__(self, recorder, mapping, num_envs: int, world_clock: str = "stepped", robot: str = "",
                 chunks: bool = False):
        self.rec, self.mapping, self.n = recorder, mapping, num_envs
        self.world_clock = world_clock  # recorded in EpisodeStart.extra: whether latency could move the world
        self.robot = robot  # EpisodeStart.versions.robot: the env's VecEnv.robot
        # chunks: the episodes carry chunk_id / chunk_index (a chunking policy); one field set for every episode of
        # the writer, so rows written together always share it
        self.fields = step_fields(mapping.obs_spec(), mapping.action_dim, chunks=chunks)
        self._obs_keys = list(mapping.obs_spec())
        self._meta = mapping.as_metadata()
        self.eids: list[str | None] = [None] * num_envs  # change only through begin / end / vacate
        self.steps = np.zeros(num_envs, np.int64)  # steps recorded in each row's open episode
        self._active = np.zeros(num_envs, bool)
        self._all_eids: list[str | None] | None = None  # every row's episode, for the common tick's put_rows

    def active(self) -> np.ndarray:
        """bool [N]: rows with an open episode (a copy the caller may keep)."""
        return self._active.copy()

    def vacate(self, row: int) -> None:
        """Leave ``row`` without an episode (none begins there)."""
        self._set(row, None)

    def _set(self, row: int, eid: str | None) -> None:
        self.eids[row] = eid
        self._active[row] = eid is not None
        self._all_eids = None

    def begin(self, row: int, *, mode: CollectionMode, policy_version: str, seed: int | None = None,
              scene: str = "", **start: Any) -> str:
        """Open an episode in ``row``; ``start`` holds further EpisodeStart fields (operator, gate_config,
        iteration, beta, bc_only, extra)."""
        m = self.mapping
        record = EpisodeStart(
            task=TaskInfo(task_id=m.task_id, task_version=m.task_version, language_instruction=m.language_instruction,
                          scene_id=scene or DEFAULT_SCENE, success_condition=m.success_condition),
            versions=backend_versions(m.backend, self.robot),
            policy_version=policy_version, mode=mode, control_hz=m.control_hz, action_alignment=m.action_alignment,
            mapping=self._meta, mapping_hash=m.hash, initial_state={"seed": seed} if seed is not None else {},
            env_index=row, **{**start, "extra": {"world_clock": self.world_clock, **start.get("extra", {})}})
        eid = self.rec.begin_episode(record, self.fields)
        self._set(row, eid)
        self.steps[row] = 0
        return eid

    def write(self, rows, columns: dict[str, np.ndarray], shared: dict[str, Any],
              only: tuple[np.ndarray, dict[str, np.ndarray]] | None = None) -> None:
        """One step per row in ``rows`` (distinct rows): each column's row, plus ``shared`` values; ``only`` = (mask [N],
        columns) adds those columns just where mask is set (e.g. human_command where a person commanded)."""
        rows = np.asarray(rows, np.int64)
        if not rows.size:
            return
        k = rows.size
        every = k == self.n  # rows are distinct: all of them, in order (the common tick)
        if every:  # plain copies, cheaper than a gather
            step = {name: np.array(v, copy=True) for name, v in columns.items()}
        else:
            step = {name: v[rows] for name, v in columns.items()}  # copies: the recorder owns what it is handed
        for name, v in shared.items():
            step[name] = np.full(k, v)
        if only is not None:
            mask = np.asarray(only[0], bool)[rows]
            if mask.any():
                for name, v in only[1].items():
                    col = fill_rows(self.fields[name], k)
                    col[mask] = np.asarray(v)[rows][mask]
                    step[name] = col
        if every:
            if self._all_eids is None:
                self._all_eids = list(self.eids)
            eids = self._all_eids
        else:
            eids = [self.eids[r] for r in rows.tolist()]
        self.rec.put_rows(eids, step)
        self.steps[rows] += 1

    def write_tick(self, tick: Tick, *, expert: bool = False, extra: dict[str, np.ndarray] | None = None,
                   only: tuple[np.ndarray, dict[str, np.ndarray]] | None = None) -> np.ndarray:
        """An engine tick's active rows as one step each: what every mode records (the observation, the four
        clocks' stamps that exist by now, the policy's proposal, the applied action and who applied it, flags,
        the env's outcome, the env's transport time where it reports one), the expert's label where ``expert``,
        then the mode's ``extra`` columns and ``only`` (as ``write``). Returns the rows written."""
        env, out = tick.env, tick.policy
        assert env is not None and tick.source is not None  # a stepped, decided tick
        cols: dict[str, Any] = {f"obs/{k}": tick.obs[k] for k in self._obs_keys}
        cols.update({
            "t_obs": tick.t_obs, "t_action_apply": env.t_action_apply,
            "policy_action": np.asarray(out.action, np.float32),
            "policy_confidence": np.asarray(out.confidence, np.float32),
            "policy_uncertainty": np.asarray(out.uncertainty, np.float32),
            "applied_action": tick.applied, "action_source": tick.source, "control_state": tick.control_state,
            "step_flags": tick.flags, "reward": env.reward, "terminated": env.terminated, "truncated": env.truncated,
            "success": env.success,
        })
        transport = env.info.get("transport_ns")
        if transport is not None:
            cols["transport_ns"] = np.asarray(transport, np.int64)
        if expert:
            used = tick.expert_used if tick.expert_used is not None else tick.source == SRC_EXPERT
            cols.update(expert_action=tick.expert_action, expert_valid=tick.expert_valid, expert_used=used)
        if extra:
            cols.update(extra)
        rows = np.flatnonzero(tick.active)
        self.write(rows, cols, {"t_policy": tick.t_policy, "inference_ns": int(out.inference_ns), "valid": True}, only)
        return rows

    def event(self, row: int, event: Event) -> None:
        if self.eids[row] is not None:
            self.rec.event(self.eids[row], event)

    def end(self, row: int, end: EpisodeEnd, windows: Sequence[CorrectionWindow] = (),
            certifications: Sequence[ExpertCertification] = ()) -> str | None:
        """Commit the row's episode; returns its id."""
        eid = self.eids[row]
        self.rec.end_episode(eid, end, windows=list(windows), certifications=list(certifications))
        self._set(row, None)
        return eid
