"""A planar 2-link arm reaching a target: pure numpy, vectorized, thousands of steps per second.

For fast tests of everything above the env (gates, handover, store, learning). It does not stand in
for MuJoCo in integration tests. Raw action: joint velocity commands in [-1, 1] (scaled by
``max_speed``); ``toy_ik_action`` is an analytic-IK expert that solves it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.envs.base import Obs, StepResult, VecEnv, check_view_args
from hg_dagger.envs.common import row_seeds, rows_of
from hg_dagger.envs.mapping import TaskMapping

# operator view colours (RGB)
BACKGROUND = (245, 245, 240)
REACH_FILL = (222, 230, 240)
REACH_EDGE = (150, 165, 190)
GOAL = (220, 40, 40)
LINK_COLOURS = ((40, 90, 200), (70, 140, 235))
JOINT = (50, 50, 60)
HAND = (250, 150, 30)

LINKS = (0.5, 0.5)
MAX_SPEED = 2.0  # rad/s at action 1.0
SUCCESS_RADIUS = 0.02


def _wrap(a: np.ndarray) -> np.ndarray:
    return (a + np.pi) % (2 * np.pi) - np.pi


def forward(q: np.ndarray, links: Sequence[float] = LINKS) -> np.ndarray:
    """Joint angles [N, 2] -> end-effector position [N, 2]."""
    l1, l2 = links
    q1, q12 = q[:, 0], q[:, 0] + q[:, 1]
    return np.stack([l1 * np.cos(q1) + l2 * np.cos(q12), l1 * np.sin(q1) + l2 * np.sin(q12)], axis=1)


def inverse(target: np.ndarray, q_now: np.ndarray, links: Sequence[float] = LINKS) -> np.ndarray:
    """Analytic IK: the elbow branch closest to the current joints. Unreachable targets are pulled in."""
    l1, l2 = links
    x, y = target[:, 0], target[:, 1]
    c2 = np.clip((x * x + y * y - l1 * l1 - l2 * l2) / (2 * l1 * l2), -1.0, 1.0)
    best = None
    for sign in (1.0, -1.0):
        q2 = sign * np.arccos(c2)
        q1 = np.arctan2(y, x) - np.arctan2(l2 * np.sin(q2), l1 + l2 * np.cos(q2))
        q = np.stack([q1, q2], axis=1)
        cost = np.abs(_wrap(q - q_now)).sum(axis=1)
        if best is None:
            best, best_cost = q, cost
        else:
            pick = cost < best_cost
            best = np.where(pick[:, None], q, best)
    assert best is not None  # the loop tries both elbow solutions
    return best


def toy_ik_action(
    obs: Obs, *, links: Sequence[float] = LINKS, max_speed: float = MAX_SPEED, step_dt: float = 0.04
) -> np.ndarray:
    """The expert: raw action [N, 2] that moves the joints toward the IK solution at full speed."""
    q = np.asarray(obs["qpos"], dtype=np.float64)
    q_goal = inverse(np.asarray(obs["target"], dtype=np.float64), q, links)
    return np.clip(_wrap(q_goal - q) / (max_speed * step_dt), -1.0, 1.0).astype(np.float32)


def _segment_dist2(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared distance of every grid point (x [1, W], y [H, 1]) to the segment a-b."""
    d = b - a
    length2 = float(d @ d) or 1e-12
    t = np.clip(((x - a[0]) * d[0] + (y - a[1]) * d[1]) / length2, 0.0, 1.0)
    return (x - a[0] - t * d[0]) ** 2 + (y - a[1] - t * d[1]) ** 2


class ToyReachEnv(VecEnv):
    """num_envs independent 2-link arms; each row has its own random stream (seeded per row)."""

    def __init__(self, mapping: TaskMapping, num_envs: int = 1, seed: int | None = None):
        opts = mapping.backend_options
        self.task_id = mapping.task_id
        self.num_envs = int(num_envs)
        self._mapping = mapping
        self.links = tuple(float(x) for x in opts.get("link_lengths", LINKS))
        self.max_speed = float(opts.get("max_speed", MAX_SPEED))
        self.success_radius = float(opts.get("success_radius", SUCCESS_RADIUS))
        self.terminate_on_success = bool(opts.get("terminate_on_success", True))
        self._max_step = self.max_speed * mapping.dt
        n = self.num_envs
        self._rngs = [np.random.default_rng(None if seed is None else seed + i) for i in range(n)]
        self._q = np.zeros((n, 2))
        self._target = np.zeros((n, 2))
        self._t = np.zeros(n, dtype=np.int64)
        self._horizon = mapping.horizon
        self._grids: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}

    @property
    def mapping(self) -> TaskMapping:
        return self._mapping

    @property
    def robot(self) -> str:
        """hg_dagger's numpy arm with the parameters that decide its motion."""
        return (f"toy 2-link arm links={self.links[0]:g},{self.links[1]:g} max_speed={self.max_speed:g} "
                f"success_radius={self.success_radius:g}")

    def render_view(self, row: int = 0, size: int = 256) -> np.ndarray:
        """A top-down picture of row ``row`` drawn with numpy: reach region, goal, both links, hand.

        World +y is up in the image, +x to the right; the frame spans 1.15 x the arm's reach."""
        check_view_args(row, size, self.num_envs, where=self.task_id)
        size = int(size)
        if size not in self._grids:
            extent = 1.15 * sum(self.links)
            centres = ((np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1) * extent
            self._grids[size] = (centres[None, :], -centres[:, None], 2 * extent / size)
        x, y, px = self._grids[size]
        img = np.empty((size, size, 3), np.uint8)
        img[...] = BACKGROUND
        reach = sum(self.links)
        r2 = x * x + y * y
        img[r2 <= reach * reach] = REACH_FILL
        img[np.abs(np.sqrt(r2) - reach) <= 1.0 * px] = REACH_EDGE
        q = self._q[int(row)]
        elbow = np.array([self.links[0] * np.cos(q[0]), self.links[0] * np.sin(q[0])])
        hand = forward(q[None], self.links)[0]
        width = max(0.025 * reach, 1.5 * px)
        for (a, b), colour in zip(((np.zeros(2), elbow), (elbow, hand)), LINK_COLOURS, strict=True):
            img[_segment_dist2(x, y, a, b) <= width * width] = colour
        goal = self._target[int(row)]
        radius = max(self.success_radius, 4 * px)
        img[(x - goal[0]) ** 2 + (y - goal[1]) ** 2 <= radius * radius] = GOAL
        for centre, colour, rad in ((np.zeros(2), JOINT, 1.6 * width), (elbow, JOINT, 1.2 * width), (hand, HAND, 1.2 * width)):
            img[(x - centre[0]) ** 2 + (y - centre[1]) ** 2 <= rad * rad] = colour
        return img

    def _sample(self, rows: np.ndarray, seeds: list[int | None]) -> None:
        reach = sum(self.links)
        for r, s in zip(rows, seeds, strict=True):
            if s is not None:
                self._rngs[r] = np.random.default_rng(s)
            rng = self._rngs[r]
            self._q[r] = rng.uniform(-1.0, 1.0, size=2)
            radius = rng.uniform(0.25, 0.9) * reach
            angle = rng.uniform(-np.pi, np.pi)
            self._target[r] = radius * np.cos(angle), radius * np.sin(angle)
        self._t[rows] = 0

    def _obs(self) -> Obs:
        return {
            "qpos": _wrap(self._q).astype(np.float32),
            "ee_pos": forward(self._q, self.links).astype(np.float32),
            "target": self._target.astype(np.float32),
        }

    def observe(self) -> tuple[Obs, dict]:
        return self._obs(), {"t_obs": np.full(self.num_envs, now_ns(), dtype=np.int64)}

    def reset(self, seed=None, env_ids=None) -> tuple[Obs, dict]:
        rows = rows_of(env_ids, self.num_envs, where=self.task_id)
        self._sample(rows, row_seeds(seed, rows, where=self.task_id))
        obs = self._obs()
        return obs, {"t_obs": np.full(self.num_envs, now_ns(), dtype=np.int64)}

    pauses_rows = True

    def step(self, action: np.ndarray, paused: np.ndarray | None = None) -> StepResult:
        a = self._mapping.clip_raw(self.check_action(action))
        t_apply = now_ns()
        moving = np.ones(self.num_envs, bool) if paused is None else ~np.asarray(paused, bool)
        self._q = self._q + a * self._max_step * moving[:, None]
        self._t += moving
        obs = self._obs()
        dist = np.linalg.norm(obs["ee_pos"] - obs["target"], axis=1)
        success = dist < self.success_radius
        terminated = success & self.terminate_on_success & moving
        truncated = (self._t >= self._horizon) & ~terminated & moving
        done = terminated | truncated
        final_obs = obs
        if done.any():
            rows = np.flatnonzero(done)
            self._sample(rows, [None] * len(rows))
            obs = self._obs()
        n = self.num_envs
        return StepResult(obs, (-dist).astype(np.float32), terminated, truncated, success=success,
                          final_obs=final_obs, episode_start=done, t_obs=np.full(n, now_ns(), dtype=np.int64),
                          t_action_apply=np.where(moving, t_apply, -1).astype(np.int64),
                          info={"signals": {"progress": -dist}})
