"""State-conditioned planner experts for the Fetch Reach / Push / PickAndPlace tasks.

Every action is computed from the current observation row alone: the phase (approach, descend, grasp,
carry, push, ...) is re-derived each step from where the gripper, fingers, object and goal are now. So
the planner labels any state a learner drives the arm into - object knocked aside, grasp lost, block
dropped mid-air - exactly as it labels states it produced itself. There is no stored plan to go stale.

Rows where the task cannot be completed from the current state (object fell off the table, goal out of
the arm's reach) are invalid with a reason; their action is a harmless zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hg_dagger.errors import ConfigError
from hg_dagger.experts.base import ExpertQuery, Obs

# Scene geometry of the gymnasium-robotics Fetch tasks (metres, world frame).
TABLE_X = (1.05, 1.55)
TABLE_Y = (0.40, 1.10)
TABLE_TOP_Z = 0.40
BLOCK_HALF = 0.025
# A generous box the arm reaches comfortably; goals outside it are refused rather than chased.
REACH_LO = np.array([0.95, 0.25, 0.38])
REACH_HI = np.array([1.75, 1.25, 1.10])

# Layout of Fetch's 25-d "observation" vector.
GRIP = slice(0, 3)
OBJECT = slice(3, 6)
FINGERS = slice(9, 11)


@dataclass(frozen=True)
class FetchPlannerParams:
    gain: float = 10.0  # action per metre of position error (the controller moves 0.05 m per unit action)
    hover: float = 0.08  # approach height above the block centre
    align_tol: float = 0.012  # xy error under which the gripper may descend onto the block
    grasp_tol: float = 0.02  # block-in-fingers tolerance (xy and z)
    open_width: float = 0.08  # finger sum above which the gripper counts as open
    holding_width: float = 0.07  # finger sum below which fingers are closed on something
    push_contact: float = 0.04  # distance from block centre to the pushing finger centre
    push_standoff: float = 0.07  # where the gripper comes down behind the block (clear of its edge)
    push_behind_tol: float = 0.012  # xy tolerance of the pre-push point
    push_done: float = 0.015  # stop pushing when the block is this close to the goal
    push_speed: float = 0.5  # pushing speed (action units) far from the goal


class FetchPlanner:
    """Scripted, state-conditioned expert for ``fetch_reach``, ``fetch_push`` and ``fetch_pick_place``.

    Output space: raw Fetch actions (dx, dy, dz, gripper) in [-1, 1]. Stateless: ``reset`` is a no-op.
    """

    output_space = "raw"
    bc_only = False
    TASKS = ("reach", "push", "pick_place")

    def __init__(self, task: str, params: FetchPlannerParams | None = None):
        task = task.removeprefix("fetch_")
        if task.endswith("_rgb"):
            task = task.removesuffix("_rgb")
        if task not in self.TASKS:
            raise ConfigError(f"FetchPlanner: unknown task {task!r}; known: {', '.join(self.TASKS)}")
        self.task = task
        self.p = params or FetchPlannerParams()

    def reset(self, env_ids: Sequence[int], obs: Obs, info: dict) -> None:
        """Nothing to reset: every action is derived from the current observation."""

    def act(self, obs: Obs, *, env_ids: Sequence[int]) -> ExpertQuery:
        o = np.asarray(obs["observation"], dtype=np.float64)
        goal = np.asarray(obs["desired_goal"], dtype=np.float64)
        grip = o[:, GRIP]
        n = len(o)
        if self.task == "reach":
            action = np.zeros((n, 4))
            action[:, :3] = self._move(grip, goal)
            phase = np.full(n, "reach", dtype="<U10")
        elif self.task == "push":
            action, phase = self._push(grip, o[:, OBJECT], goal)
        else:
            action, phase = self._pick_place(grip, o[:, OBJECT], o[:, FINGERS].sum(axis=1), goal)
        reasons = self._failures(o, goal, np.asarray(env_ids))
        valid = np.ones(n, dtype=bool)
        for i, e in enumerate(np.asarray(env_ids).tolist()):
            if e in reasons:
                valid[i] = False
                action[i] = 0.0
                phase[i] = "invalid"
        return ExpertQuery(
            action=np.clip(action, -1.0, 1.0).astype(np.float32),
            valid=valid,
            confidence=None,
            metadata={"invalid_reason": reasons, "phase": phase},
        )

    # -- per-task policies (vectorized over rows) -------------------------------------------------

    def _move(self, frm: np.ndarray, to: np.ndarray) -> np.ndarray:
        return np.clip(self.p.gain * (to - frm), -1.0, 1.0)

    def _pick_place(self, grip, obj, width, goal):
        p = self.p
        n = len(grip)
        rel = obj - grip
        xy_err = np.linalg.norm(rel[:, :2], axis=1)
        at_block = (xy_err < p.grasp_tol) & (np.abs(rel[:, 2]) < p.grasp_tol)
        is_open = width > p.open_width
        holding = at_block & (width < p.holding_width)
        hover_z = obj[:, 2] + p.hover
        low = grip[:, 2] < hover_z - 0.03

        target = grip.copy()
        grip_cmd = np.ones(n)
        phase = np.empty(n, dtype="<U10")

        # carry: move so that the block (not the gripper) lands on the goal; keep squeezing
        carry = holding
        target[carry] = grip[carry] + (goal[carry] - obj[carry])
        grip_cmd[carry] = -1.0
        phase[carry] = "carry"
        # grasp: fingers around the block but not closed yet - close in place
        grasp = at_block & ~holding
        target[grasp] = obj[grasp]
        grip_cmd[grasp] = -1.0
        phase[grasp] = "grasp"
        rest = ~at_block
        aligned = rest & (xy_err < p.align_tol) & (grip[:, 2] > obj[:, 2])
        # above the block with closed fingers (e.g. a failed grasp): open before going down
        reopen = aligned & ~is_open
        phase[reopen] = "open"
        # descend onto the block with open fingers, correcting xy on the way
        descend = aligned & is_open
        target[descend] = obj[descend]
        phase[descend] = "descend"
        # far from the block: rise first when low (never sweep through the block), then hover above it
        far = rest & ~aligned
        lift = far & low & (xy_err > p.align_tol * 2)
        target[lift, 2] = hover_z[lift]
        phase[lift] = "lift"
        approach = far & ~lift
        target[approach, :2] = obj[approach, :2]
        target[approach, 2] = hover_z[approach]
        phase[approach] = "approach"

        action = np.zeros((n, 4))
        action[:, :3] = self._move(grip, target)
        action[:, 3] = grip_cmd
        return action, phase

    def _push(self, grip, obj, goal):
        p = self.p
        n = len(grip)
        delta = goal[:, :2] - obj[:, :2]
        dist = np.linalg.norm(delta, axis=1)
        u = delta / np.maximum(dist, 1e-9)[:, None]
        behind = obj[:, :2] - u * p.push_contact
        standoff = obj[:, :2] - u * p.push_standoff
        rel = grip[:, :2] - obj[:, :2]
        along = np.einsum("ij,ij->i", rel, u)
        lateral = np.linalg.norm(rel - along[:, None] * u, axis=1)
        push_z = obj[:, 2]
        hover_z = obj[:, 2] + 0.06
        low = grip[:, 2] < push_z + 0.02
        to_standoff = np.linalg.norm(grip[:, :2] - standoff, axis=1)

        target = grip.copy()
        phase = np.empty(n, dtype="<U10")
        push_vel = np.zeros((n, 2))

        done = dist < p.push_done
        phase[done] = "done"  # hold still: target = grip
        pushing = ~done & low & (along < -0.025) & (lateral < 0.02)
        target[pushing, :2] = behind[pushing]
        target[pushing, 2] = push_z[pushing]
        speed = np.clip(dist * 5.0, 0.1, p.push_speed)
        push_vel[pushing] = u[pushing] * speed[pushing, None]
        phase[pushing] = "push"
        rest = ~done & ~pushing
        over = rest & (to_standoff < p.push_behind_tol)
        target[over, :2] = standoff[over]
        target[over, 2] = push_z[over]
        phase[over] = "descend"
        away = rest & ~over
        lift = away & (grip[:, 2] < hover_z - 0.02)
        target[lift, 2] = hover_z[lift]
        phase[lift] = "lift"
        approach = away & ~lift
        target[approach, :2] = standoff[approach]
        target[approach, 2] = hover_z[approach]
        phase[approach] = "approach"

        action = np.zeros((n, 4))
        action[:, :3] = self._move(grip, target)
        action[:, :2] += push_vel
        action[:, 3] = -1.0
        return action, phase

    # -- when the task cannot be completed from here ----------------------------------------------

    def _failures(self, o: np.ndarray, goal: np.ndarray, env_ids: np.ndarray) -> dict[int, str]:
        reasons: dict[int, str] = {}
        goal_out = ((goal < REACH_LO) | (goal > REACH_HI)).any(axis=1)
        for i in np.flatnonzero(goal_out):
            reasons[int(env_ids[i])] = f"goal {np.round(goal[i], 3).tolist()} is out of the arm's reach"
        if self.task == "reach":
            return reasons
        obj = o[:, OBJECT]
        off_xy = (
            (obj[:, 0] < TABLE_X[0]) | (obj[:, 0] > TABLE_X[1]) | (obj[:, 1] < TABLE_Y[0]) | (obj[:, 1] > TABLE_Y[1])
        )
        fallen = obj[:, 2] < TABLE_TOP_Z + BLOCK_HALF - 0.015
        held = np.linalg.norm(obj - o[:, GRIP], axis=1) < 0.03
        for i in np.flatnonzero((off_xy & ~held) | fallen):
            reasons[int(env_ids[i])] = f"object at {np.round(obj[i], 3).tolist()} is off the table; cannot be recovered"
        return reasons
