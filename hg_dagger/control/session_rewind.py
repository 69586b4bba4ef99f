"""Rewind and correct: in simulation a person can take the robot back a few seconds, to before the gate asked, and
correct from there (RaC's recovery, then correction: the simulator does the recovery, the person the correction).

The attempt that was going wrong ends (operator abort, quality flag "rewound", with a NOTE naming the step it went
back to); its row is restored by re-running the episode's seed and applied actions (envs.rewind) and a branch
episode begins there, bound to its parent (``EpisodeStart.parent_episode_id`` / ``parent_step_id``), waiting for
the person from its first step as after a gate (a request, reason "rewind"; the simulator pauses meanwhile). Replay re-runs a branch from its parents'
actions, so it verifies like any other episode. Mixed into control.session.Session, whose state it uses.
"""

from __future__ import annotations

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.enums import EndReason, EventKind
from hg_dagger.control.session_state import SessionState
from hg_dagger.envs.rewind import restore_row, why_not_rewindable
from hg_dagger.errors import EnvError, HgDaggerError

REWOUND = "rewound"  # EpisodeEnd.quality_flags entry of an attempt a person rewound


class SessionRewind(SessionState):
    """Rewind of a Session (control.session); the state it uses is the session's."""

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
