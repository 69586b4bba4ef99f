"""Fetch Reach / Push / PickAndPlace (gymnasium-robotics, MuJoCo) with a person-sized horizon.

Stock Fetch steps at 25 Hz (20 substeps of 2 ms) and ends after 50 steps (2 s); the horizon here
comes from the task mapping (150 steps = 6 s). reset(seed) is bit-for-bit deterministic.
Signals: progress (-distance achieved->desired goal), task_progress (with an object: -(gripper->object +
object->target distance), which also rises while the gripper reaches for the object, so a stall gate on it sees
a student stuck before the grasp within a second instead of the whole reach phase), contact_force (N, normal forces of the
gripper's contacts with anything but the robot), object_dropped (the object was lifted in a grasp and fell back to
the table or below, once per drop), collision_imminent (fingertips at the table surface).
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Any, cast

import numpy as np

from hg_dagger.envs.mujoco_rows import MujocoRowsEnv, contact_force
from hg_dagger.errors import EnvError

GRIPPER_BODIES = ("robot0:gripper_link", "robot0:l_gripper_finger_link", "robot0:r_gripper_finger_link")
FINGERS = ("robot0:l_gripper_finger_link", "robot0:r_gripper_finger_link")
OBJECT = "object0"
OBJECT_HALF = 0.025  # the cube's half size: its centre rests this far above the table surface
LIFTED = 0.02  # m above rest height that counts as lifted
NEAR_TABLE = 0.018  # the grip site stops ~15 mm above the table when the fingers touch it


class FetchVecEnv(MujocoRowsEnv):
    # the table from the front-left, far enough back to show the whole workspace and goals in the air
    view_camera = {"lookat": [1.3, 0.75, 0.62], "distance": 1.6, "azimuth": 150.0, "elevation": -22.0}
    # Fetch puts its mocap on the gripper plus the step's displacement at every step, so a target left
    # where the arm was moving is gone at the next step; a held row's pin is put back after it
    mocap_writer = "_set_action"

    def _make_row(self) -> Any:
        # gymnasium deferred: the sim extra, optional; gymnasium_robotics deferred: the sim extra, optional
        import gymnasium as gym

        with contextlib.redirect_stderr(io.StringIO()):  # an import-time notice about Adroit envs
            import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
        gym_id = self.options.get("gym_id")
        try:
            env = gym.make(cast(str, gym_id), disable_env_checker=True).unwrapped  # None: refused below
        except Exception as exc:  # noqa: BLE001 - a config fault, named
            raise EnvError(f"{self._mapping.source}: backend_options.gym_id {gym_id!r}: {exc}") from None
        return env

    def _init_rows(self, seed: int | None) -> None:
        env = self.envs[0]
        m = env.model
        # mujoco deferred: the sim extra, optional
        import mujoco

        self._has_object = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, OBJECT) >= 0
        self._target_site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, "target0")
        self._fingers = np.array([mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in FINGERS], np.int32)
        self._object = np.array([mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, OBJECT)], np.int32)
        robot = [b for b in range(m.nbody) if m.body(b).name.startswith("robot0:")]
        hand = [m.body(name).id for name in GRIPPER_BODIES]
        self._robot_geoms = np.isin(m.geom_bodyid, robot)
        self._hand_geoms = np.isin(m.geom_bodyid, hand)
        self._rest_z = float(env.height_offset) if self._has_object else 0.0
        table = m.body("table0")
        geom = m.geom(int(m.body_geomadr[table.id]))
        self._table_z = float(env.data.xpos[table.id][2] + geom.pos[2] + geom.size[2])
        self._lifted = np.zeros(self.num_envs, bool)

    def _reset_row(self, i: int, seed: int | None) -> Any:
        env = self.envs[i]
        obs, _ = env.reset(seed=seed)
        if self.camera is not None:
            env._render_callback()  # moves the target marker to this episode's goal (Fetch does it only in render())
        return obs

    def _before_view(self, row: int) -> None:
        # Fetch moves its target marker only in render(), with an mj_forward that would change the next
        # step; the view writes the marker's derived position instead (mj_step recomputes it anyway)
        env = self.envs[row]
        env.data.site_xpos[self._target_site] = env.goal

    def _step_row(self, i: int, action: np.ndarray):
        obs, reward, _, _, info = self.envs[i].step(action)
        return obs, float(reward), bool(info["is_success"]), info

    def _raw_shapes(self, raw: Any) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in raw.items()}

    def _current_raw(self, i: int) -> Any:
        return self.envs[i]._get_obs()  # reads the simulator's state; changes nothing

    def _write_obs(self, raw: Any, out, i: int) -> None:
        out["observation"][i] = raw["observation"]
        out["achieved_goal"][i] = raw["achieved_goal"]
        out["desired_goal"][i] = raw["desired_goal"]

    def _signal_names(self) -> tuple[str, ...]:
        return ("progress", "task_progress", "contact_force", "object_dropped", "collision_imminent")

    def _reset_signals(self, rows: np.ndarray) -> None:
        self._lifted[rows] = False

    def _grasped(self, data) -> bool:
        ncon = data.ncon
        if ncon == 0:
            return False
        pairs = data.contact.geom[:ncon]
        g1, g2 = pairs[:, 0], pairs[:, 1]
        obj = self._object[0]
        touching = set(g2[g1 == obj].tolist()) | set(g1[g2 == obj].tolist())
        return all(int(f) in touching for f in self._fingers)

    def _signals(self, i: int, raw: Any, info: dict, out: dict[str, np.ndarray]) -> None:
        env = self.envs[i]
        out["progress"][i] = -math.dist(raw["achieved_goal"], raw["desired_goal"])
        reach = math.dist(raw["observation"][0:3], raw["observation"][3:6]) if self._has_object else 0.0
        out["task_progress"][i] = out["progress"][i] - reach
        out["contact_force"][i] = contact_force(env.model, env.data, self._hand_geoms, exclude=self._robot_geoms)
        grip_z = float(raw["observation"][2])
        out["collision_imminent"][i] = grip_z < self._table_z + NEAR_TABLE
        if self._has_object:
            obj_z = float(raw["observation"][5])
            if obj_z > self._rest_z + LIFTED and self._grasped(env.data):
                self._lifted[i] = True
            elif self._lifted[i] and obj_z < self._rest_z + 0.005:
                out["object_dropped"][i] = not self._grasped(env.data)  # set down in the grasp is no drop
                self._lifted[i] = False
