"""Rewind and correct: in simulation a person can take the robot back a few seconds, to before the gate asked, and
correct from there (RaC's recovery, then correction: the simulator does the recovery, the person the correction).

The attempt that was going wrong ends (operator abort, quality flag "rewound", with a NOTE naming the step it went
back to); its row is restored by re-running the episode's seed and applied actions (envs.rewind) and a branch
episode begins there, bound to its parent (``EpisodeStart.parent_episode_id`` / ``parent_step_id``), waiting for
the person from its first step as after a gate (a request, reason "rewind"; the simulator pauses meanwhile). Replay re-runs a branch from its parents'
actions, so it verifies like any other episode. Mixed into control.session.Session, whose state it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.enums import EndReason, EventKind
from hg_dagger.envs.rewind import restore_row, why_not_rewindable
from hg_dagger.errors import EnvError, HgDaggerError

if TYPE_CHECKING:
    from hg_dagger.control.handover import HandoverMachine
    from hg_dagger.control.operators import Operator
    from hg_dagger.control.safety import SafetyMonitor

REWOUND = "rewound"  # EpisodeEnd.quality_flags entry of an attempt a person rewound


class ActionHistory:
    """Per row: the seed of its open episode's reset and every action applied since (a branch's included: the
    actions of its parents up to where it branched), which is what a rewind re-runs. One list of the ticks'
    applied actions is shared by the rows (a tick costs one append); what no open episode needs is dropped."""

    def __init__(self, num_envs: int):
        self.seed: list[int | None] = [None] * num_envs
        self._ticks: list[tuple[np.ndarray, np.ndarray]] = []  # (applied [N, A], rows stepped [N]) per tick
        self._dropped = 0  # ticks dropped from the front
        self._first = [0] * num_envs  # the tick at which each row's open episode began
        self._before: list[np.ndarray | None] = [None] * num_envs  # a branch's parents' actions

    def start(self, row: int, seed: int | None, before: np.ndarray | None = None) -> None:
        """``row`` begins an episode from a reset with ``seed`` (after ``before``, a branch's parents' actions)."""
        self.seed[row] = seed
        self._before[row] = None if before is None or not len(before) else np.asarray(before, np.float32)
        self._first[row] = self._dropped + len(self._ticks)
        self._trim()

    def stop(self, row: int) -> None:
        """``row``'s episode ended: nothing of it is needed any more."""
        self.seed[row] = None
        self._before[row] = None
        self._trim()

    def append(self, rows: np.ndarray, applied: np.ndarray) -> None:
        if rows.any():
            self._ticks.append((np.array(applied, np.float32), rows.copy()))

    def until(self, row: int, step: int) -> np.ndarray:
        """The actions that lead to the open episode's ``step`` (its parents' included), [k, A]."""
        own = [a[row] for a, stepped in self._ticks[self._first[row] - self._dropped:] if stepped[row]][:step]
        before = self._before[row]
        parts = ([before] if before is not None else []) + ([np.stack(own)] if own else [])
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def _trim(self) -> None:
        open_rows = [f for f, s in zip(self._first, self.seed, strict=True) if s is not None]
        keep_from = min(open_rows) if open_rows else self._dropped + len(self._ticks)
        drop = keep_from - self._dropped
        if drop > 0:
            del self._ticks[:drop]
            self._dropped += drop


class SessionRewind:
    """Rewind of a Session (control.session); the state it uses is the session's."""

    # the session's state these methods use (set by Session.__init__): declared for the type checker only
    env: Any
    mapping: Any
    n: int
    machine: HandoverMachine
    operator: Operator
    safety: SafetyMonitor
    history: ActionHistory
    robot_hold: str
    succeeding: np.ndarray
    _target: int

    if TYPE_CHECKING:
        @property
        def eids(self) -> list[str | None]: ...

        @property
        def ep_step(self) -> np.ndarray: ...

        @property
        def obs(self) -> dict[str, np.ndarray] | None: ...

        @obs.setter
        def obs(self, obs: dict[str, np.ndarray] | None) -> None: ...

        @property
        def t_obs(self) -> np.ndarray: ...

        @t_obs.setter
        def t_obs(self, t: np.ndarray) -> None: ...

        def _event(self, r: int, kind: EventKind, t_ns: int, reason: str = "", source: str = "",
                   values: dict[str, Any] | None = None) -> None: ...

        def _end(self, r: int, reason: EndReason, success: bool, flags: list[str] | None = None) -> None: ...

        def _restart(self, ended: list[int], obs: Any, info: Any, restarted: np.ndarray, *,
                     wait: bool = True) -> None: ...

        def _take_obs(self, obs: Any, info: Any, rows: np.ndarray) -> None: ...

        def _begin_rows(self, rows: list[int],
                        branch: dict[int, tuple[str, int, int | None]] | None = None) -> None: ...

        def _info_now(self) -> dict[str, Any]: ...

    def rewindable(self) -> str:
        """Why this session cannot rewind ("" when it can)."""
        return why_not_rewindable(self.env)

    def rewind(self, row: int, seconds: float) -> int:
        """Take ``row`` back ``seconds`` before the step at which its open request (or correction) began, or before
        now without one, and give the person control there in a branch episode. Returns the parent's step the
        branch starts from."""
        eid = self.eids[row]
        if eid is None:
            raise HgDaggerError(f"no open episode in env row {row} to rewind")
        why = self.rewindable()
        if why:
            raise HgDaggerError(f"cannot rewind: {why}")
        if self.safety.estopped or self.robot_hold:
            raise HgDaggerError("cannot rewind while the run is stopped (e-stop or hold): clear it first")
        if self.operator.role != "human":
            raise HgDaggerError("rewinding gives control to a person: choose a device first")
        now = int(self.ep_step[row])
        w = self.machine.open[row]
        at = now if w is None else min(int(w.parent_step), now)
        back = max(0, at - int(round(float(seconds) / self.mapping.dt)))
        seed = self.history.seed[row]
        actions = self.history.until(row, back)
        t = now_ns()
        self._event(row, EventKind.NOTE, t, f"rewound to step {back} for a correction", "operator",
                    {"rewind_to_step": back, "from_step": at, "rewind_s": float(seconds)})
        self._target += 1  # the branch is one more episode of the run, not one of its fresh starts
        self._end(row, EndReason.OPERATOR_ABORT, False, flags=[REWOUND])
        assert seed is not None  # an open episode's row has the seed of its reset
        try:
            obs, info = restore_row(self.env, row, seed, actions)
        except EnvError as exc:  # the branch never began: the run goes on with a fresh episode in the row
            self._restart([row], self.obs, self._info_now(), np.zeros(self.n, bool))
            raise HgDaggerError(f"could not rewind episode {eid}: {exc}") from None
        mask = np.zeros(self.n, bool)
        mask[row] = True
        assert self.obs is not None  # an episode is open in the row: there is an observation
        merged = {k: np.where(mask.reshape(-1, *([1] * (v.ndim - 1))), obs[k], v) for k, v in self.obs.items()}
        t_obs = np.where(mask, np.asarray(info["t_obs"], np.int64), self.t_obs)
        self._take_obs(merged, {**info, "t_obs": t_obs, "success": self.succeeding & ~mask}, mask)
        self.safety.reset([row])
        self._begin_rows([row], branch={row: (eid, back, seed)})
        self.history.start(row, seed, actions)
        self.machine.request([row], step=0, t_ns=t, reason="rewind")  # the person takes over as after a gate
        self._event(row, EventKind.NOTE, t, f"branch of episode {eid} from its step {back}: waiting for the person",
                    "operator", {"parent_episode_id": eid, "parent_step_id": back})
        return back
