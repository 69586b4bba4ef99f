"""Meta-World (metaworld 3.1.1, MuJoCo) tasks with goal-observable state.

Meta-World ignores reset(seed); each row is seeded through its own random stream instead
(``seed()`` plus ``seeded_rand_vec``), so reset(seed) is deterministic per row. Its step limit
(max_path_length) is lifted: the horizon comes from the task mapping. Its named cameras render
upside down; ``backend_options.camera_flip: rot180`` turns them right side up.
Observation: "observation" (36: hand xyz, gripper opening, object poses, the previous frame's 18) and
"desired_goal" (3); flattened in that order they are Meta-World's own 39-d vector.
Signals: progress (-object/hand distance to the target), task_progress (progress less the hand's distance to
the object, so the reach counts as progress too; a reach task has no object: its progress), contact_force (N,
the gripper pads' and claws' contacts with the world), object_dropped (grasped and lifted, then fell back
without the grasp).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from hg_dagger.envs.mujoco_rows import MujocoRowsEnv, contact_force, geom_mask
from hg_dagger.errors import EnvError

HAND_GEOMS = ("rightpad_geom", "leftpad_geom", "rightclaw_it", "leftclaw_it")
LIFTED = 0.02


class MetaWorldVecEnv(MujocoRowsEnv):
    # a free camera in front of the table, facing the robot: hand, object and goal in one upright frame
    view_camera = {"lookat": [0.0, 0.65, 0.18], "distance": 1.15, "azimuth": -60.0, "elevation": -25.0}
    # Meta-World adds the step's displacement to its mocap and resets the mocap's orientation at every
    # step; a held row's pin (orientation included) is put back after it
    mocap_writer = "set_xyz_action"
    # the Sawyer arm has 7 joints for its 6-D weld: with the hand pinned its elbow still swings under
    # gravity and drags the hand ~2 mm over 10 steps; braked joints (damping 10 -> 1e4) keep it still
    hold_brake_damping = 1e4

    def _make_row(self) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # metaworld deferred: the sim extra, optional
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE as envs

            name = f"{self.options.get('env_name')}-goal-observable"
            if name not in envs:
                known = ", ".join(sorted(k.removesuffix("-goal-observable") for k in envs)[:8])
                raise EnvError(
                    f"{self._mapping.source}: backend_options.env_name {self.options.get('env_name')!r} "
                    f"is not a Meta-World v3 task (e.g. {known}, ...)"
                )
            env = envs[name](seed=0)  # type: ignore[call-arg]  # the task classes take seed; their base does not
        env._freeze_rand_vec = False  # draw a new task configuration at every reset...
        env.seeded_rand_vec = True  # ...from the env's own seeded stream
        env.max_path_length = np.iinfo(np.int64).max  # the mapping's horizon truncates
        return env

    def _init_rows(self, seed: int | None) -> None:
        m = self.envs[0].model
        hand = [m.geom(g).id for g in HAND_GEOMS]
        arm = [b for b in range(m.nbody) if m.body(b).name.startswith(("right", "left", "hand", "base"))]
        self._hand_geoms = geom_mask(m, hand)
        self._robot_geoms = self._hand_geoms | np.isin(m.geom_bodyid, arm)
        self._rest_z = np.zeros(self.num_envs)
        # reach tasks measure the hand itself to the target: no object to approach first
        self._hand_is_the_object = str(self.options.get("env_name", "")).startswith("reach")
        self._lifted = np.zeros(self.num_envs, bool)

    def _reset_row(self, i: int, seed: int | None) -> Any:
        env = self.envs[i]
        if seed is not None:
            env.seed(seed)
        obs, _ = env.reset()
        self._rest_z[i] = obs[6]
        return obs

    def _step_row(self, i: int, action: np.ndarray):
        obs, reward, _, _, info = self.envs[i].step(action)
        return obs, float(reward), bool(info["success"]), info

    def _raw_shapes(self, raw: Any) -> dict[str, tuple[int, ...]]:
        return {"observation": (raw.shape[0] - 3,), "desired_goal": (3,)}

    def _write_obs(self, raw: Any, out, i: int) -> None:
        out["observation"][i] = raw[:36]
        out["desired_goal"][i] = raw[36:39]

    def _current_raw(self, i: int) -> Any:
        """Meta-World's 39-d vector of the state now. Its own _get_obs would shift the frame stack; here
        the stacked previous frame stays the one the last observation carried."""
        env = self.envs[i]
        prev = self._last_obs["observation"][i, 18:36]
        raw = np.hstack((env._get_curr_obs_combined_no_goal(), prev, env._get_pos_goal()))
        space = env.sawyer_observation_space
        return np.clip(raw, space.low, space.high)  # as Meta-World's step clips it

    def _signal_names(self) -> tuple[str, ...]:
        return ("progress", "task_progress", "contact_force", "object_dropped")

    def _reset_signals(self, rows: np.ndarray) -> None:
        self._lifted[rows] = False

    def _signals(self, i: int, raw: Any, info: dict, out: dict[str, np.ndarray]) -> None:
        env = self.envs[i]
        out["progress"][i] = -float(info["obj_to_target"])
        reach = 0.0 if self._hand_is_the_object else float(np.linalg.norm(raw[0:3] - raw[4:7]))  # hand -> object
        out["task_progress"][i] = out["progress"][i] - reach
        out["contact_force"][i] = contact_force(env.model, env.data, self._hand_geoms, exclude=self._robot_geoms)
        obj_z = float(raw[6])
        if obj_z > self._rest_z[i] + LIFTED and info["grasp_success"]:
            self._lifted[i] = True
        elif self._lifted[i] and obj_z < self._rest_z[i] + 0.005:
            out["object_dropped"][i] = not info["grasp_success"]
            self._lifted[i] = False
