"""Any registered Gymnasium env with a Box action space, named by its id in a task file (``backend: gymnasium``).

    backend: gymnasium
    backend_options:
      gym_id: Pusher-v5              # any registered id; "my_package:MyEnv-v0" imports my_package first
      make_kwargs: {}                # passed to gymnasium.make
      success: {key: reward_dist, at_least: -0.08}    # or an info key that is truthy on success
      signals: {progress: reward_dist}                # per-step signals for the gates, from step info keys

One unwrapped env per row, stepped in a plain loop (no gymnasium wrappers, no TimeLimit): horizon, auto-reset and
final_obs follow the VecEnv contract here, the horizon is the task's. Rows are seeded through Gymnasium's own
``reset(seed=...)`` (row i with seed + i); a row that auto-resets continues its own stream, so a MuJoCo env is
deterministic from its seed and its episodes replay.

Observations: with a Box observation space the mapping's keys (all but the camera key) split the flattened
observation vector in order (their sizes must add up to it); with a Dict space each key names an entry ("a/b" for
nested ones). Values are cast to the mapping's dtype (MuJoCo envs observe float64). A MuJoCo env (one with
``model`` and ``data``) can also render a camera key ("rgb", ``backend_options.camera``) and the operator's view.

Success: ``backend_options.success`` (an info key, or {key, at_least | at_most}); by default the info's
"is_success" or "success" where the env reports one, else never. The env's own ``terminated`` ends an episode.

Hold (BackendSpec.hold "pause"): a torque- or position-target-driven env cannot hold position by an action, so
``hold()`` pauses every row: a step whose motion dims (every dim not named "grip...") are all 0 - the hold action
- leaves that row's simulation where it is (no physics, no time towards the horizon, reward 0, its last success,
``info["paused"]`` True); the first step that commands motion, or a reset, resumes it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import threading
from typing import Any

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.envs.base import Obs, StepResult, VecEnv, check_view_args
from hg_dagger.envs.common import fit_image, row_seeds, rows_of
from hg_dagger.envs.mapping import TaskMapping
from hg_dagger.envs.mujoco_rows import LeanCamera
from hg_dagger.errors import EnvError

CAMERA_KEY = "rgb"
SUCCESS_KEYS = ("is_success", "success")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _register_robotics() -> None:
    """Gymnasium-Robotics registers its ids (Fetch, Shadow hand, Adroit, Franka Kitchen, mazes) when imported; its
    import-time notice about Adroit's rewards goes to stderr and is dropped."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import gymnasium_robotics  # noqa: F401
    except ImportError:
        pass


def find_spec(gym_id: str, *, where: str):
    """The Gymnasium EnvSpec of ``gym_id`` ("module:Id" imports the module first), or one EnvError line."""
    # gymnasium deferred: the sim extra, optional
    import gymnasium as gym

    if not isinstance(gym_id, str) or not gym_id:
        raise EnvError(f"{where}: backend_options.gym_id is required: a registered Gymnasium id, e.g. Pusher-v5")
    module, _, name = gym_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(f"{where}: backend_options.gym_id {gym_id!r}: module {module!r} does not import "
                           f"({_one_line(exc)})") from None
    try:
        return gym.spec(name)
    except gym.error.Error:
        _register_robotics()
    try:
        return gym.spec(name)
    except gym.error.Error as exc:
        raise EnvError(f"{where}: backend_options.gym_id {gym_id!r} is not a registered Gymnasium id "
                       f"({_one_line(exc)})") from None


def _path_get(obs: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obs = obs[part]
    return obs


class GymnasiumVecEnv(VecEnv):
    """``num_envs`` unwrapped Gymnasium envs of one id behind the VecEnv contract."""

    _last_obs: Obs  # every row's observation after the last reset or step (set by the first reset)

    def __init__(self, mapping: TaskMapping, num_envs: int = 1, seed: int | None = None):
        # gymnasium deferred: the sim extra, optional
        import gymnasium as gym

        self._gym = gym
        self.task_id = mapping.task_id
        self.num_envs = int(num_envs)
        self._mapping = mapping
        self._where = mapping.source
        opts = dict(mapping.backend_options)
        self.options = opts
        self.gym_id = str(opts.get("gym_id") or "")
        self.terminate_on_success = bool(opts.get("terminate_on_success", False))
        self._horizon = mapping.horizon
        self._keys = [(k.name, (self.num_envs, *k.shape), np.dtype(k.dtype)) for k in mapping.observation]
        self._success = self._success_rule(opts.get("success"))
        self._signals = self._signal_rule(opts.get("signals"))
        kwargs = opts.get("make_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise EnvError(f"{self._where}: backend_options.make_kwargs must be a mapping, got {kwargs!r}")
        spec = find_spec(self.gym_id, where=self._where)
        self.envs: list[Any] = []
        self._cameras: dict[tuple[int, int, int, str], LeanCamera] = {}  # (thread, w, h, purpose) -> renderer
        self._cameras_lock = threading.Lock()
        try:
            for _ in range(self.num_envs):
                try:
                    env = gym.make(spec, disable_env_checker=True, **kwargs)
                except Exception as exc:  # noqa: BLE001 - a config fault or a missing simulator, named in one line
                    raise EnvError(f"{self._where}: gymnasium.make({self.gym_id!r}) failed: "
                                   f"{type(exc).__name__}: {_one_line(exc)}") from None
                self.envs.append(env.unwrapped)
            self._check_action_space(self.envs[0])
            self._layout = self._obs_layout(self.envs[0])
            self._check_timing(self.envs[0])
        except BaseException:
            self.close()
            raise
        names = mapping.action.names
        self._motion = np.array(["grip" not in n.lower() for n in names], bool)
        dtype = self.envs[0].action_space.dtype
        self._action_dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.float32)
        self._action_shape = tuple(self.envs[0].action_space.shape)
        n = self.num_envs
        self._t = np.zeros(n, np.int64)
        self._paused = np.zeros(n, bool)
        self._last_success = np.zeros(n, bool)
        self._last_signals = {name: np.zeros(n, np.float32) for name in self._signals}

    # ------------------------------------------------------------------ checks
    def _check_action_space(self, env) -> None:
        space = env.action_space
        box = self._gym.spaces.Box
        if not isinstance(space, box):
            raise EnvError(f"{self._where}: {self.gym_id} has action space {space}; the gymnasium backend takes a "
                           f"Box action space (continuous actions)")
        m = self._mapping
        dim = int(np.prod(space.shape))
        if dim != m.action_dim:
            raise EnvError(f"{self._where}: action has {m.action_dim} names but {self.gym_id} takes {dim} values "
                           f"(action space {space})")
        low, high = np.ravel(space.low).astype(np.float64), np.ravel(space.high).astype(np.float64)
        for i, name in enumerate(m.action.names):
            if m.action.low[i] < low[i] - 1e-6 or m.action.high[i] > high[i] + 1e-6:
                raise EnvError(f"{self._where}: action {name!r} spans [{m.action.low[i]:g}, {m.action.high[i]:g}], "
                               f"outside {self.gym_id}'s bounds [{low[i]:g}, {high[i]:g}]")

    def _state_keys(self) -> list[Any]:
        return [k for k in self._mapping.observation if k.name != CAMERA_KEY]

    def _obs_layout(self, env) -> list[tuple[str, Any, tuple[int, ...]]]:
        """(key, where in the raw observation, shape) per state key: a slice of the flat vector, or a Dict path."""
        space = env.observation_space
        spaces = self._gym.spaces
        keys = self._state_keys()
        if any(k.name == CAMERA_KEY for k in self._mapping.observation):
            if not hasattr(env, "model") or not hasattr(env, "data"):
                raise EnvError(f"{self._where}: observation key {CAMERA_KEY!r} is rendered from a MuJoCo model; "
                               f"{self.gym_id} has none")
            if self.options.get("camera") is None:
                raise EnvError(f"{self._where}: backend_options.camera is required for the {CAMERA_KEY!r} key")
        layout: list[tuple[str, Any, tuple[int, ...]]] = []
        if isinstance(space, spaces.Dict):
            for k in keys:
                path = tuple(k.name.split("/"))
                try:
                    sub = _path_get(space.spaces, path)
                except (KeyError, TypeError):
                    raise EnvError(f"{self._where}: observation key {k.name!r} is not in {self.gym_id}'s observation "
                                   f"(keys: {', '.join(sorted(space.spaces))})") from None
                size = int(np.prod(getattr(sub, "shape", None) or (0,)))
                if size != k.size:
                    raise EnvError(f"{self._where}: observation {k.name!r} has {size} values in {self.gym_id}, the "
                                   f"mapping declares {list(k.shape)}")
                layout.append((k.name, path, tuple(k.shape)))
            return layout
        if not isinstance(space, spaces.Box):
            raise EnvError(f"{self._where}: {self.gym_id} has observation space {type(space).__name__}; the gymnasium "
                           f"backend reads Box or Dict observations")
        total = int(np.prod(space.shape))
        declared = sum(k.size for k in keys)
        if declared != total:
            sizes = ", ".join(f"{k.name} {k.size}" for k in keys)
            raise EnvError(f"{self._where}: the observation keys ({sizes}) cover {declared} values in order; "
                           f"{self.gym_id} observes {total}")
        start = 0
        for k in keys:
            layout.append((k.name, slice(start, start + k.size), tuple(k.shape)))
            start += k.size
        return layout

    def _check_timing(self, env) -> None:
        dt = getattr(env, "dt", None)
        if dt is not None and abs(float(dt) - self._mapping.dt) > 1e-9:
            raise EnvError(f"{self._where}: step_dt {self._mapping.dt:g} s (control_hz {self._mapping.control_hz:g}) "
                           f"but {self.gym_id} steps {float(dt):g} s")

    def _success_rule(self, rule: Any):
        """info -> bool, from backend_options.success."""
        if rule is None:
            return lambda info: bool(next((info[k] for k in SUCCESS_KEYS if k in info), False))
        if isinstance(rule, str):
            return lambda info: bool(self._info(info, rule, "success"))
        if isinstance(rule, dict) and isinstance(rule.get("key"), str) and (set(rule) - {"key"}) in (
                {"at_least"}, {"at_most"}):
            key = rule["key"]
            if "at_least" in rule:
                bound = float(rule["at_least"])
                return lambda info: float(self._info(info, key, "success")) >= bound
            bound = float(rule["at_most"])
            return lambda info: float(self._info(info, key, "success")) <= bound
        raise EnvError(f"{self._where}: backend_options.success must be an info key or {{key: K, at_least: V}} / "
                       f"{{key: K, at_most: V}}, got {rule!r}")

    def _signal_rule(self, rule: Any) -> dict[str, str]:
        if rule is None:
            return {}
        if not isinstance(rule, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rule.items()):
            raise EnvError(f"{self._where}: backend_options.signals maps signal names to step info keys, got {rule!r}")
        return dict(rule)

    def _info(self, info: dict, key: str, what: str) -> Any:
        if key not in info:
            raise EnvError(f"{self._where}: {what} reads step info key {key!r}, which {self.gym_id} does not report "
                           f"(info keys: {', '.join(sorted(map(str, info))) or 'none'})")
        return info[key]

    # ------------------------------------------------------------------ contract
    @property
    def mapping(self) -> TaskMapping:
        return self._mapping

    @functools.cached_property
    def robot(self) -> str:
        """The Gymnasium id and env class, plus the hash of the compiled MuJoCo model where there is one."""
        env = self.envs[0]
        name = f"{self.gym_id} ({type(env).__name__})"
        model = getattr(env, "model", None)
        if model is None:
            return name
        # mujoco deferred: the sim extra, optional
        import mujoco

        mjb = np.empty(mujoco.mj_sizeModel(model), np.uint8)
        mujoco.mj_saveModel(model, None, mjb)
        return f"{name} model sha256:{hashlib.sha256(mjb.tobytes()).hexdigest()[:16]}"

    def _alloc(self) -> Obs:
        return {name: np.empty(shape, dtype) for name, shape, dtype in self._keys}

    def _fill(self, i: int, raw: Any, obs: Obs) -> None:
        for name, where, shape in self._layout:
            if isinstance(where, slice):
                value = np.ravel(np.asarray(raw))[where]
            else:
                value = np.asarray(_path_get(raw, where))
            obs[name][i] = value.reshape(shape)
        if CAMERA_KEY in obs:
            h, w = obs[CAMERA_KEY].shape[1:3]
            cam = self._camera("policy", w, h, self.options["camera"], self.options.get("camera_flip", "none"))
            cam.render(self.envs[i].data, obs[CAMERA_KEY][i])

    def _camera(self, purpose: str, width: int, height: int, camera: Any, flip: str) -> LeanCamera:
        """A renderer for this thread (a GL context is current in one thread only)."""
        key = (threading.get_ident(), int(width), int(height), purpose)
        cam = self._cameras.get(key)
        if cam is None:
            cam = LeanCamera(self.envs[0].model, width=int(width), height=int(height), camera=camera, flip=flip)
            with self._cameras_lock:
                self._cameras[key] = cam
        return cam

    def reset(self, seed=None, env_ids=None) -> tuple[Obs, dict]:
        rows = rows_of(env_ids, self.num_envs, where=self.task_id)
        seeds = row_seeds(seed, rows, where=self.task_id)
        obs = self._alloc()
        if hasattr(self, "_last_obs"):
            for k, v in self._last_obs.items():
                obs[k][...] = v
        for i, s in zip(rows, seeds, strict=True):
            raw, _ = self.envs[int(i)].reset(seed=s)
            self._fill(int(i), raw, obs)
        self._t[rows] = 0
        self._paused[rows] = False
        self._last_success[rows] = False
        for v in self._last_signals.values():
            v[rows] = 0.0
        self._last_obs = obs
        return obs, {"t_obs": np.full(self.num_envs, now_ns(), dtype=np.int64)}

    def observe(self) -> tuple[Obs, dict] | None:
        """The last observation of every row: the simulation moves only in step and reset."""
        if not hasattr(self, "_last_obs"):
            return None
        return {k: v.copy() for k, v in self._last_obs.items()}, {"t_obs": np.full(self.num_envs, now_ns(), np.int64)}

    pauses_rows = True

    def step(self, action: np.ndarray, paused: np.ndarray | None = None) -> StepResult:
        a = self._mapping.clip_raw(self.check_action(action))
        n = self.num_envs
        waiting = np.zeros(n, bool) if paused is None else np.asarray(paused, bool)
        obs = self._alloc()
        reward = np.zeros(n, np.float32)
        success = np.zeros(n, bool)
        env_done = np.zeros(n, bool)
        paused = np.zeros(n, bool)
        signals = {name: np.zeros(n, np.float32) for name in self._signals}
        t_apply = np.empty(n, np.int64)
        t_obs = np.empty(n, np.int64)
        for i in range(n):
            if waiting[i] or (self._paused[i] and not np.any(a[i, self._motion] != 0)):
                paused[i] = True  # held, or waiting for a person: the simulation stays where it is
                t_apply[i] = -1 if waiting[i] else now_ns()
                for k, v in self._last_obs.items():
                    obs[k][i] = v[i]
                t_obs[i] = now_ns()
                success[i] = self._last_success[i]
                for name in signals:
                    signals[name][i] = self._last_signals[name][i]
                continue
            self._paused[i] = False  # commanded motion ends the hold
            t_apply[i] = now_ns()
            raw, r, term, trunc, info = self.envs[i].step(a[i].astype(self._action_dtype).reshape(self._action_shape))
            self._fill(i, raw, obs)
            t_obs[i] = now_ns()
            reward[i] = float(r)
            success[i] = self._success(info)
            env_done[i] = bool(term) or bool(trunc)
            for name, key in self._signals.items():
                signals[name][i] = float(self._info(info, key, f"signal {name!r}"))
        self._t[~paused] += 1
        self._last_success = success.copy()
        for name in signals:
            self._last_signals[name] = signals[name].copy()
        terminated = ~paused & (env_done | (success & self.terminate_on_success))
        truncated = ~paused & (self._t >= self._horizon) & ~terminated
        done = terminated | truncated
        final_obs = obs
        if done.any():
            obs = {k: v.copy() for k, v in obs.items()}
            rows = np.flatnonzero(done)
            for r in rows.tolist():
                raw, _ = self.envs[r].reset()
                self._fill(r, raw, obs)
                t_obs[r] = now_ns()
            self._t[rows] = 0
            self._last_success[rows] = False
            for v in self._last_signals.values():
                v[rows] = 0.0
        self._last_obs = obs
        info_out: dict[str, Any] = {"signals": signals, "paused": paused}
        return StepResult(obs, reward, terminated, truncated, success=success, final_obs=final_obs, episode_start=done,
                          t_obs=t_obs, t_action_apply=t_apply, info=info_out)

    def hold(self) -> None:
        """Pause every row (BackendSpec.hold "pause"): hold-action steps leave its simulation where it is until a
        step commands motion or the row resets. Nothing advances or resets here."""
        self._paused[:] = True

    def render_view(self, row: int = 0, size: int = 256) -> np.ndarray | None:
        """The operator's view of ``row``: a MuJoCo env rendered by a free camera over its whole model (or
        ``backend_options.view_camera``); another env's own ``render()`` where it was made with
        ``render_mode: rgb_array``; else None."""
        check_view_args(row, size, self.num_envs, where=self.task_id)
        if not self.envs:
            return None
        env = self.envs[int(row)]
        if hasattr(env, "model") and hasattr(env, "data"):
            camera = self.options.get("view_camera") or self._default_view(env.model)
            cam = self._camera("view", int(size), int(size), camera, self.options.get("view_camera_flip", "none"))
            out = np.empty((int(size), int(size), 3), np.uint8)
            cam.render(env.data, out)
            return out
        if getattr(env, "render_mode", None) == "rgb_array":
            frame = env.render()
            return None if frame is None else fit_image(np.asarray(frame), int(size))
        return None

    @staticmethod
    def _default_view(model) -> dict[str, Any]:
        """A free camera that frames the whole model from the front-left, above."""
        return {"lookat": [float(x) for x in model.stat.center], "distance": 1.6 * float(model.stat.extent),
                "azimuth": 135.0, "elevation": -35.0}

    def close(self) -> None:
        with self._cameras_lock:
            cams, self._cameras = list(self._cameras.values()), {}
        for cam in cams:
            cam.close()
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()
        self.envs = []
