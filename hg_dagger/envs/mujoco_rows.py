"""Shared machinery of the MuJoCo backends (Fetch, Meta-World): one unwrapped simulator per row.

Rows are stepped in a plain loop over unwrapped envs (no gymnasium wrappers, no vector-env
auto-reset): horizon, auto-reset and final_obs follow the VecEnv contract here, in one place. Each
step returns freshly allocated arrays, so the previous call's obs stays valid as the pre-action
observation. A camera key ("rgb" by default) is rendered offscreen with lean settings by one
renderer shared by all rows (the rows' models are identical).

``hold()`` pins each row's arm where it is (``pin_arm``): the mocap target welded to the hand goes to
the pose that keeps the hand still, the arm's joint velocities go to zero, and zero-motion steps keep
the target there until a step commands motion again or the row resets.
"""

from __future__ import annotations

import atexit
import copy
import functools
import hashlib
import logging
import os
import threading
import weakref
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.envs.base import Obs, StepResult, VecEnv, check_view_args
from hg_dagger.envs.common import row_seeds, rows_of
from hg_dagger.envs.mapping import TaskMapping
from hg_dagger.errors import EnvError

os.environ.setdefault("MUJOCO_GL", "egl")
logging.getLogger("OpenGL").setLevel(logging.WARNING)  # its import-time INFO lines are noise here


def geom_mask(model, geom_ids) -> np.ndarray:
    """Boolean mask over the model's geoms (lookups by fancy indexing are cheap per step)."""
    mask = np.zeros(model.ngeom, bool)
    mask[np.asarray(geom_ids, dtype=np.int64)] = True
    return mask


def contact_force(model, data, geoms: np.ndarray, exclude: np.ndarray | None = None) -> float:
    """Sum of normal contact forces (N) on the geoms in mask ``geoms`` from geoms not in mask
    ``exclude``. Read straight from the constraint forces (what mj_contactForce decodes, without a
    Python call per contact): the normal force is the sum of a pyramidal cone's edge forces, or
    the first component of an elliptic cone."""
    ncon = data.ncon
    if ncon == 0:
        return 0.0
    contact = data.contact
    pairs = contact.geom[:ncon]
    g1, g2 = pairs[:, 0], pairs[:, 1]
    in1, in2 = geoms[g1], geoms[g2]
    hit = in1 | in2
    if exclude is not None:
        hit &= ~((in1 & exclude[g2]) | (in2 & exclude[g1]))
    adr = contact.efc_address[:ncon][hit]
    active = adr >= 0
    if not active.any():
        return 0.0
    adr = adr[active]
    force = data.efc_force
    if model.opt.cone == 0:  # mjCONE_PYRAMIDAL: 2 * (condim - 1) edges, 1 for frictionless
        dim = contact.dim[:ncon][hit][active]
        width = np.maximum(2 * (dim - 1), 1)
        csum = np.concatenate(([0.0], np.cumsum(force)))
        return float(np.abs(csum[adr + width] - csum[adr]).sum())
    return float(np.abs(force[adr]).sum())


# joints damped this hard (Fetch's base slides and torso lift) are locked in place by the model: their
# velocity is not motion anyone commanded, and zeroing it only jolts them against their limits
LOCKED_DAMPING = 1e5
FLAG_SIGNALS = ("object_dropped", "collision_imminent")  # bool signals; every other signal is a float32 reading
MAX_SAG_CORRECTION = 0.005  # m (free-space corrections are 0-4 mm); a hand blocked by contact is not pressed harder


def mocap_welds(model) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """(mocap id, welded body, rel_pos, rel_quat) per weld between a mocap body and a body: the weld is
    satisfied when the mocap pose = body pose * (rel_pos, rel_quat)."""
    # mujoco deferred: the sim extra, optional
    import mujoco

    out = []
    for i in range(model.neq):
        if model.eq_type[i] != mujoco.mjtEq.mjEQ_WELD:
            continue
        b1, b2 = int(model.eq_obj1id[i]), int(model.eq_obj2id[i])
        rel_pos, rel_quat = model.eq_data[i, 3:6].copy(), model.eq_data[i, 6:10].copy()
        if model.body_mocapid[b1] >= 0:  # body2 = mocap * rel, so mocap = body2 * rel^-1
            mocap, body = int(model.body_mocapid[b1]), b2
            mujoco.mju_negPose(rel_pos, rel_quat, model.eq_data[i, 3:6].copy(), model.eq_data[i, 6:10].copy())
        elif model.body_mocapid[b2] >= 0:  # mocap = body1 * rel
            mocap, body = int(model.body_mocapid[b2]), b1
        else:
            continue
        out.append((mocap, body, rel_pos, rel_quat))
    return out


@dataclass
class Pin:
    """A held arm: the mocap pose to keep applying, and the joint damping to restore when it is released."""

    mocap_pos: np.ndarray
    mocap_quat: np.ndarray
    damping: np.ndarray | None = None  # the model's dof_damping before the brake, when braked

    def release(self, model) -> None:
        if self.damping is not None:
            model.dof_damping[:] = self.damping
            self.damping = None


def pin_arm(model, data, settle_steps: int, brake: float | None = None) -> Pin | None:
    """Hold every mocap-driven arm where it is, without advancing time. Returns the Pin to keep
    applying (and release), or None when the model has no mocap weld.

    1. Each mocap target goes to the pose at which its weld is satisfied now (the hand's measured pose).
    2. The robot's joint velocities go to zero (joints locked by LOCKED_DAMPING excepted), so no
       commanded but unfinished motion carries on. With ``brake``, those joints' damping is raised to
       it until the pin is released: an arm with more joints than its weld fixes (a 7-joint arm) can
       otherwise swing its elbow under gravity with the hand held, and drag the hand along.
    3. A weld is a soft spring: under the arm's weight the hand settles a few mm off its target. A
       scratch copy of the simulation settles for ``settle_steps`` substeps and the target moves by
       the opposite of where the hand went (twice: the correction moves the arm too), so the hand
       stays where it was measured, as a position controller with integral action keeps it. The
       real simulation does not advance; objects keep their state."""
    # mujoco deferred: the sim extra, optional
    import mujoco

    welds = mocap_welds(model)
    if not welds:
        return None
    mujoco.mj_forward(model, data)  # poses of the state now (a step can leave them a substep behind)
    for mocap, body, rel_pos, rel_quat in welds:
        pos, quat = np.zeros(3), np.zeros(4)
        mujoco.mju_mulPose(pos, quat, data.xpos[body], data.xquat[body], rel_pos, rel_quat)
        data.mocap_pos[mocap], data.mocap_quat[mocap] = pos, quat
    robots = list({int(model.body_rootid[body]) for _, body, _, _ in welds})
    dofs = np.isin(model.body_rootid[model.dof_bodyid], robots) & (model.dof_damping < LOCKED_DAMPING)
    data.qvel[dofs] = 0.0
    saved = None
    if brake is not None:
        saved = model.dof_damping.copy()
        model.dof_damping[dofs] = np.maximum(saved[dofs], brake)
    mujoco.mj_forward(model, data)
    held = {body: data.xpos[body].copy() for _, body, _, _ in welds}
    measured = data.mocap_pos.copy()
    for _ in range(2 if settle_steps > 0 else 0):
        scratch = copy.copy(data)
        mujoco.mj_step(model, scratch, nstep=settle_steps)
        for mocap, body, _, _ in welds:
            shift = data.mocap_pos[mocap] - (scratch.xpos[body] - held[body]) - measured[mocap]
            norm = float(np.linalg.norm(shift))
            if norm > MAX_SAG_CORRECTION:
                shift *= MAX_SAG_CORRECTION / norm
            data.mocap_pos[mocap] = measured[mocap] + shift
    mujoco.mj_forward(model, data)
    return Pin(data.mocap_pos.copy(), data.mocap_quat.copy(), saved)


_OPEN_CAMERAS: weakref.WeakSet = weakref.WeakSet()


def _close_cameras() -> None:
    """Free GL contexts before interpreter teardown (a renderer freed after the GL backend's own
    exit hook raises EGL errors). Registered after the first renderer exists, so it runs first."""
    for cam in list(_OPEN_CAMERAS):
        cam.close()


class LeanCamera:
    """128x128-class offscreen RGB with shadows, reflections, skybox and multisampling off."""

    def __init__(self, model, width: int, height: int, camera: str | dict[str, Any], flip: str = "none"):
        # mujoco deferred: the sim extra, optional
        import mujoco

        self._mujoco = mujoco
        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        self.renderer = mujoco.Renderer(model, height=height, width=width)
        flags = self.renderer.scene.flags
        for name in ("mjRND_SHADOW", "mjRND_REFLECTION", "mjRND_SKYBOX"):
            flags[getattr(mujoco.mjtRndFlag, name)] = 0
        self.option = mujoco.MjvOption()
        self.option.flags[mujoco.mjtVisFlag.mjVIS_RANGEFINDER] = 0  # sensor rays are not part of the scene
        if isinstance(camera, str):
            self.camera: Any = camera
        else:
            cam = mujoco.MjvCamera()
            cam.type = mujoco.mjtCamera.mjCAMERA_FREE
            cam.lookat[:] = camera.get("lookat", [0.0, 0.0, 0.0])
            cam.distance = float(camera.get("distance", 1.0))
            cam.azimuth = float(camera.get("azimuth", 90.0))
            cam.elevation = float(camera.get("elevation", -30.0))
            self.camera = cam
        if flip not in ("none", "vertical", "rot180"):
            raise EnvError(f"camera flip must be none, vertical or rot180, got {flip!r}")
        self.flip = flip
        if not _OPEN_CAMERAS:
            atexit.unregister(_close_cameras)
            atexit.register(_close_cameras)
        _OPEN_CAMERAS.add(self)

    def render(self, data, out: np.ndarray) -> None:
        self.renderer.update_scene(data, camera=self.camera, scene_option=self.option)
        img = self.renderer.render()
        if self.flip == "rot180":
            img = img[::-1, ::-1]
        elif self.flip == "vertical":
            img = img[::-1]
        out[...] = img

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None


class MujocoRowsEnv(VecEnv):
    """Base of the MuJoCo backends. Subclasses build one unwrapped env per row and translate it."""

    image_key = "rgb"
    _last_obs: Obs  # the newest observation (set by the first reset or step)
    # the operator's view camera (backend_options.view_camera overrides it): a free camera dict or a
    # named camera, and its flip; subclasses set one that shows the gripper, object and goal
    view_camera: str | dict[str, Any] = {"lookat": [0.0, 0.0, 0.0], "distance": 2.0, "azimuth": 135.0, "elevation": -30.0}
    view_flip = "none"
    # the raw action's motion dims come first (the gripper dims follow): a step with all of them 0 keeps a
    # held arm pinned
    motion_dims = 3
    # the simulator's method that writes the mocap target on every step; a held row's pin goes back after it
    mocap_writer: str | None = None
    hold_settle_s = 0.25  # simulated time a scratch copy settles to find how far the hand sags (pin_arm)
    hold_brake_damping: float | None = None  # joint damping while held (pin_arm's brake); None: no brake

    def __init__(self, mapping: TaskMapping, num_envs: int = 1, seed: int | None = None):
        self.task_id = mapping.task_id
        self.num_envs = int(num_envs)
        self._mapping = mapping
        self.options = dict(mapping.backend_options)
        self.terminate_on_success = bool(self.options.get("terminate_on_success", False))
        self._horizon = mapping.horizon
        self._keys = [(k.name, (self.num_envs, *k.shape), np.dtype(k.dtype)) for k in mapping.observation]
        self.envs: list[Any] = []
        self.camera: LeanCamera | None = None
        self._views: dict[tuple[int, int], LeanCamera] = {}  # (thread id, size) -> renderer
        self._thread_cameras: dict[int, LeanCamera] = {}  # the policy camera of threads other than the builder's
        self._camera_thread = threading.get_ident()
        self._views_lock = threading.Lock()
        try:
            self.envs = [self._make_row() for _ in range(self.num_envs)]
            self._check_sim(self.envs[0])
            if any(k.name == self.image_key for k in mapping.observation):
                self.camera = self._make_camera(self.envs[0])
        except BaseException:
            self.close()
            raise
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._pins: list[Pin | None] = [None] * self.num_envs  # held rows
        self._held_since_step = np.zeros(self.num_envs, bool)  # hold() changed the state after the last step
        if self.mocap_writer is not None:
            for i, env in enumerate(self.envs):
                self._repin_after(i, env, self.mocap_writer)
        self._init_rows(seed)

    # ------------------------------------------------------------------ backend hooks
    @abstractmethod
    def _make_row(self) -> Any:
        """A fresh unwrapped simulator for one row."""

    @abstractmethod
    def _reset_row(self, i: int, seed: int | None) -> Any:
        """Reset row i (reseeding it when seed is given); return its raw observation."""

    @abstractmethod
    def _step_row(self, i: int, action: np.ndarray) -> tuple[Any, float, bool, dict]:
        """Step row i; return raw observation, reward, success, raw info."""

    @abstractmethod
    def _write_obs(self, raw: Any, out: Obs, i: int) -> None:
        """Copy row i's raw observation into the batch arrays (state keys; the camera is separate)."""

    @abstractmethod
    def _raw_shapes(self, raw: Any) -> dict[str, tuple[int, ...]]:
        """Shape per observation key of what _write_obs would copy from this raw observation."""

    def _current_raw(self, i: int) -> Any | None:
        """Row i's raw observation of the simulator's state now, changing nothing (for ``observe``);
        None: the last step's observation stands for it."""
        return None

    def _init_rows(self, seed: int | None) -> None:  # noqa: B027 - optional hook
        """Seed row random streams at construction."""

    def _repin_after(self, i: int, env, method: str) -> None:
        """Wrap ``env.<method>`` (the simulator's own per-step mocap write) so that a held row's mocap
        target goes back on its pin right after it, before the physics substeps run."""
        stock = getattr(env, method)

        def write_then_repin(*args, **kwargs):
            out = stock(*args, **kwargs)
            pin = self._pins[i]
            if pin is not None:
                env.data.mocap_pos[:], env.data.mocap_quat[:] = pin.mocap_pos, pin.mocap_quat
            return out

        setattr(env, method, write_then_repin)

    def _release(self, i: int) -> None:
        """Row i is no longer held (a step commands motion, or the row resets)."""
        pin, self._pins[i] = self._pins[i], None
        if pin is not None:
            pin.release(self.envs[i].model)

    def _signals(self, i: int, raw: Any, info: dict, out: dict[str, np.ndarray]) -> None:  # noqa: B027
        """Fill row i of the per-step simulator signals (info["signals"])."""

    def _reset_signals(self, rows: np.ndarray) -> None:  # noqa: B027
        """Forget per-episode signal state of the rows that reset."""

    def _signal_names(self) -> tuple[str, ...]:
        return ("progress",)

    def _make_camera(self, env) -> LeanCamera:
        cam = self.options.get("camera")
        if cam is None:
            raise EnvError(f"{self._mapping.source}: backend_options.camera is required for the '{self.image_key}' key")
        shape = next(k.shape for k in self._mapping.observation if k.name == self.image_key)
        return LeanCamera(env.model, width=shape[1], height=shape[0], camera=cam, flip=self.options.get("camera_flip", "none"))

    def render_view(self, row: int = 0, size: int = 256) -> np.ndarray | None:
        """The operator's view of ``row`` (uint8 [size, size, 3], upright), rendered in this thread."""
        check_view_args(row, size, self.num_envs, where=self.task_id)
        if not self.envs:
            return None  # closed
        key = (threading.get_ident(), int(size))
        cam = self._views.get(key)
        if cam is None:
            camera = self.options.get("view_camera", self.view_camera)
            flip = self.options.get("view_camera_flip", self.view_flip if "view_camera" not in self.options else "none")
            cam = LeanCamera(self.envs[0].model, width=int(size), height=int(size), camera=camera, flip=flip)
            with self._views_lock:
                self._views[key] = cam
        out = np.empty((int(size), int(size), 3), np.uint8)
        self._before_view(int(row))
        cam.render(self.envs[int(row)].data, out)
        return out

    def _before_view(self, row: int) -> None:  # noqa: B027 - optional hook
        """Bring scene-only markers (e.g. a goal site) up to date before a view is rendered."""

    # ------------------------------------------------------------------ checks
    def _check_sim(self, env) -> None:
        where = self._mapping.source
        dim = int(np.prod(env.action_space.shape))
        if dim != self._mapping.action_dim:
            raise EnvError(f"{where}: action has {self._mapping.action_dim} names but the simulator takes {dim} values")
        dt = float(env.dt)
        if abs(dt - self._mapping.dt) > 1e-9:
            raise EnvError(f"{where}: step_dt {self._mapping.dt:g} s (control_hz {self._mapping.control_hz:g}) but the simulator steps {dt:g} s")

    # ------------------------------------------------------------------ contract
    @property
    def mapping(self) -> TaskMapping:
        return self._mapping

    @functools.cached_property
    def robot(self) -> str:
        """The simulator class and a hash of the compiled model (MJB bytes: bodies, geoms, meshes, parameters)."""
        # mujoco deferred: the sim extra, optional
        import mujoco

        model = self.envs[0].model
        mjb = np.empty(mujoco.mj_sizeModel(model), np.uint8)
        mujoco.mj_saveModel(model, None, mjb)
        return f"{type(self.envs[0]).__name__} model sha256:{hashlib.sha256(mjb.tobytes()).hexdigest()[:16]}"

    def _alloc(self) -> Obs:
        return {name: np.empty(shape, dtype) for name, shape, dtype in self._keys}

    def observe(self) -> tuple[Obs, dict] | None:
        """Every row's observation of the simulator's state now. The state changes only in step, reset and
        hold: a row that ``hold()`` changed since its last step is read from the simulator again (the
        held arm at rest, its camera re-rendered); any other row's last observation is its state now."""
        if not hasattr(self, "_last_obs"):
            return None
        obs = self._alloc()
        t_obs = np.empty(self.num_envs, np.int64)
        for i in range(self.num_envs):
            raw = self._current_raw(i) if self._held_since_step[i] else None
            if raw is None:
                for k, v in self._last_obs.items():
                    obs[k][i] = v[i]
            else:
                self._fill(i, raw, obs)
            t_obs[i] = now_ns()
        return obs, {"t_obs": t_obs}

    def reset(self, seed=None, env_ids=None) -> tuple[Obs, dict]:
        rows = rows_of(env_ids, self.num_envs, where=self.task_id)
        seeds = row_seeds(seed, rows, where=self.task_id)
        obs = self._alloc()
        if hasattr(self, "_last_obs"):
            for k, v in self._last_obs.items():
                obs[k][...] = v
        for i, s in zip(rows, seeds, strict=True):
            self._release(int(i))
            raw = self._reset_row(int(i), s)
            self._check_raw(raw)
            self._fill(int(i), raw, obs)
        self._t[rows] = 0
        self._held_since_step[rows] = False
        self._reset_signals(rows)
        self._last_obs = obs
        return obs, {"t_obs": np.full(self.num_envs, now_ns(), dtype=np.int64)}

    def _check_raw(self, raw: Any) -> None:
        declared = {k.name: tuple(k.shape) for k in self._mapping.observation}
        for key, shape in self._raw_shapes(raw).items():
            if declared.get(key) != tuple(shape):
                raise EnvError(
                    f"{self._mapping.source}: observation {key!r} is {list(shape)} in the simulator, "
                    f"the mapping declares {list(declared[key]) if key in declared else 'no such key'}"
                )

    def _fill(self, i: int, raw: Any, obs: Obs) -> None:
        self._write_obs(raw, obs, i)
        if self.camera is not None:
            self._policy_camera().render(self.envs[i].data, obs[self.image_key][i])

    def _policy_camera(self) -> LeanCamera:
        """The policy camera for this thread: the one built with the env, or a twin made here on first
        use when another thread steps the env (a GL context cannot be current in two threads)."""
        tid = threading.get_ident()
        if tid == self._camera_thread:
            assert self.camera is not None  # built with the env
            return self.camera
        cam = self._thread_cameras.get(tid)
        if cam is None:
            cam = self._make_camera(self.envs[0])
            with self._views_lock:
                self._thread_cameras[tid] = cam
        return cam

    pauses_rows = True

    def step(self, action: np.ndarray, paused: np.ndarray | None = None) -> StepResult:
        a = self._mapping.clip_raw(self.check_action(action))
        n = self.num_envs
        still = np.zeros(n, bool) if paused is None else np.asarray(paused, bool)
        obs = self._alloc()
        reward = np.empty(n, np.float32)
        success = np.zeros(n, bool)
        signals = {name: np.zeros(n, bool if name in FLAG_SIGNALS else np.float32) for name in self._signal_names()}
        t_apply = np.empty(n, np.int64)
        t_obs = np.empty(n, np.int64)
        for i in range(n):
            if still[i]:  # waits for a person: its simulation stays where it is
                for k, v in self._last_obs.items():
                    obs[k][i] = v[i]
                t_apply[i], t_obs[i], reward[i] = -1, now_ns(), 0.0
                continue
            if self._pins[i] is not None and np.any(a[i, : self.motion_dims] != 0):
                self._release(i)  # commanded motion ends the hold
            t_apply[i] = now_ns()
            raw, r, ok, info = self._step_row(i, a[i])
            self._fill(i, raw, obs)
            t_obs[i] = now_ns()
            reward[i] = r
            success[i] = ok
            self._signals(i, raw, info, signals)
        self._t += ~still
        self._held_since_step[~still] = False
        terminated = success & self.terminate_on_success & ~still
        truncated = (self._t >= self._horizon) & ~terminated & ~still
        done = terminated | truncated
        final_obs = obs
        if done.any():
            obs = {k: v.copy() for k, v in obs.items()}
            rows = np.flatnonzero(done)
            for row in rows:
                self._release(int(row))
                self._fill(int(row), self._reset_row(int(row), None), obs)
                t_obs[row] = now_ns()
            self._t[rows] = 0
            self._reset_signals(rows)
        self._last_obs = obs
        return StepResult(obs, reward, terminated, truncated, success=success, final_obs=final_obs, episode_start=done,
                          t_obs=t_obs, t_action_apply=t_apply, info={"signals": signals})

    def hold(self) -> None:
        """Hold position in every row (``pin_arm``): the hand's mocap target goes where the hand is (corrected
        for the weld's sag), the arm's joint velocities go to zero, and steps whose motion dims are all 0
        keep the target pinned there (gripper dims still apply) until a step commands motion or the row
        resets. Objects keep their state; nothing advances in time."""
        for i, env in enumerate(self.envs):
            self._release(i)  # a second hold pins the arm where it is now, with the model's own damping
            steps = int(round(self.hold_settle_s / env.model.opt.timestep))
            self._pins[i] = pin_arm(env.model, env.data, steps, self.hold_brake_damping)
            self._held_since_step[i] = self._pins[i] is not None

    def close(self) -> None:
        with self._views_lock:
            views = [*self._views.values(), *self._thread_cameras.values()]
            self._views, self._thread_cameras = {}, {}
        for view in views:
            view.close()
        if self.camera is not None:
            self.camera.close()
            self.camera = None
        for env in self.envs:
            env.close()
        self.envs = []
