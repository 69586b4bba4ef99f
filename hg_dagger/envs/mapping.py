"""The per-task observation/action mapping: one YAML file per task in configs/tasks/ (kind: task).

It is the single home of how observations are flattened for policies and of how every action source
(policy, expert/planner, person) reaches the ONE canonical raw action space of the task. All three
conversions end in ``clip_raw`` - the one preprocessing step before ``env.step``. The mapping is
validated when it is loaded (bad file -> ConfigError naming file and key), checked against the
simulator when an env is built, and stored with its hash in every episode's metadata.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from hg_dagger import config
from hg_dagger.contract.command import COMMAND_AXES, COMMAND_DIM
from hg_dagger.contract.enums import ActionAlignment
from hg_dagger.contract.model import FrozenModel
from hg_dagger.envs.backends import BACKENDS
from hg_dagger.errors import ConfigError, EnvError

TASKS_DIR = config.CONFIG_DIR / "tasks"
RECORDED = "recorded"  # validation context key: a mapping read back from an episode (its backend may be absent here)


class Normalize(FrozenModel):
    """Flattened value v becomes (v - mean) / std before a policy sees it."""

    mean: list[float]
    std: list[float]

    @field_validator("std")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(not s > 0 for s in v):
            raise ValueError("every std must be > 0")
        return v


class ObsKey(FrozenModel):
    """One observation key as the env delivers it (per row, without the batch dim)."""

    name: str = Field(min_length=1)
    shape: tuple[int, ...]
    dtype: str = "float32"
    flatten: bool | None = None  # default: True for state, False for images (uint8, rank 3)
    normalize: Normalize | None = None
    description: str = ""

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        try:
            return str(np.dtype(v))
        except TypeError:
            raise ValueError(f"not a numpy dtype: {v!r}") from None

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(s <= 0 for s in v):
            raise ValueError("every dimension must be > 0")
        return v

    @property
    def is_image(self) -> bool:
        return self.dtype == "uint8" and len(self.shape) == 3

    @property
    def flattened(self) -> bool:
        return (not self.is_image) if self.flatten is None else self.flatten

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @model_validator(mode="after")
    def _norm_size(self) -> ObsKey:
        if self.normalize is not None:
            for part in ("mean", "std"):
                n = len(getattr(self.normalize, part))
                if n not in (1, self.size):
                    raise ValueError(f"normalize.{part} has {n} values; expected 1 or {self.size} (the key's size)")
        return self


class Affine(FrozenModel):
    """raw = offset + scale * x, per raw dimension (a single value broadcasts)."""

    scale: list[float] = Field(default_factory=lambda: [1.0])
    offset: list[float] = Field(default_factory=lambda: [0.0])

    @field_validator("scale")
    @classmethod
    def _nonzero(cls, v: list[float]) -> list[float]:
        if any(s == 0 for s in v):
            raise ValueError("scale must be non-zero (the conversion has to be invertible)")
        return v


class RawAction(FrozenModel):
    """The canonical raw action space: what env.step takes and what is stored as applied_action."""

    names: list[str] = Field(min_length=1)  # one per dim; for joint actions in joint order
    low: list[float]
    high: list[float]
    description: str = ""

    @model_validator(mode="after")
    def _bounds(self) -> RawAction:
        n = len(self.names)
        for part in ("low", "high"):
            if len(getattr(self, part)) != n:
                raise ValueError(f"{part} has {len(getattr(self, part))} values; expected {n} (one per name)")
        if len(set(self.names)) != n:
            raise ValueError("names must be unique")
        bad = [self.names[i] for i in range(n) if not self.low[i] < self.high[i]]
        if bad:
            raise ValueError(f"low must be < high for every dim; not so for {bad}")
        return self


class PolicyAction(Affine):
    """The student's action space: bounds plus the affine map to raw."""

    low: list[float] = Field(default_factory=lambda: [-1.0])
    high: list[float] = Field(default_factory=lambda: [1.0])


class ExpertAction(Affine):
    """How a planner/expert's native output maps to raw (identity if it already speaks raw)."""


class HumanAction(FrozenModel):
    """HumanCommand.motion (x, y, z, roll, pitch, yaw, gripper in [-1, 1]) -> raw action.

    raw[i] = offset[i] + scale[i] * motion[axes[i]]; an axis of null leaves raw[i] at offset[i].
    """

    axes: list[str | None]
    scale: list[float] = Field(default_factory=lambda: [1.0])
    offset: list[float] = Field(default_factory=lambda: [0.0])

    @field_validator("axes")
    @classmethod
    def _known_axes(cls, v: list[str | None]) -> list[str | None]:
        bad = [a for a in v if a is not None and a not in COMMAND_AXES]
        if bad:
            raise ValueError(f"unknown command axes {bad}; known: {', '.join(COMMAND_AXES)}")
        used = [a for a in v if a is not None]
        if len(set(used)) != len(used):
            raise ValueError("each command axis may drive at most one raw dim")
        return v


class ReplayTolerance(FrozenModel):
    """How closely a replayed episode must reproduce its stored observations (``hg-dagger replay``).

    Not part of the mapping's hash or episode metadata: a tolerance judges recorded data, it does not change it."""

    obs_atol: float = Field(default=1e-5, ge=0)  # absolute, per element of float observation keys
    obs_rtol: float = Field(default=0.0, ge=0)  # relative to the stored value
    image_atol: int = Field(default=0, ge=0, le=255)  # per pixel channel of uint8 camera keys
    keys: dict[str, float] = Field(default_factory=dict)  # per observation key absolute tolerance overrides


class Joints(FrozenModel):
    """Joint ordering of a joint-space observation key."""

    names: list[str] = Field(min_length=1)
    obs_key: str | None = None  # observation key whose last dim is ordered like names


class ExportNames(FrozenModel):
    """How exports name the observation for other trainers: the state the policy sees (every flattened key, in
    flatten order) goes out as one vector with a name per dimension, and the goal keys as the environment state
    (LeRobot's ``observation.state`` / ``observation.environment_state``)."""

    environment_state: list[str] = Field(default_factory=list)  # keys concatenated as the environment (goal) state
    names: dict[str, list[str]] = Field(default_factory=dict)  # per-dimension names of a key (default: key_0 ...)


class TaskMapping(FrozenModel):
    """One task: backend, timing, observation layout and the action conversions (see docs/envs.md)."""

    task_id: str = Field(pattern=r"^[a-z0-9_]+$")
    task_version: str = "1"
    backend: str = Field(min_length=1)  # a name in the backend registry (hg_dagger.envs.backends)
    backend_options: dict[str, Any] = Field(default_factory=dict)
    description: str = ""
    language_instruction: str = ""
    success_condition: str = ""

    control_hz: float = Field(gt=0)
    step_dt: float | None = Field(default=None, gt=0)  # defaults to 1 / control_hz; must agree with it
    action_chunk: int = Field(default=1, ge=1)
    action_alignment: ActionAlignment = ActionAlignment.CURRENT_OBS
    horizon: int = Field(gt=0)

    observation: list[ObsKey] = Field(min_length=1)
    action: RawAction
    policy: PolicyAction = Field(default_factory=PolicyAction)
    expert: ExpertAction = Field(default_factory=ExpertAction)
    human: HumanAction
    joints: Joints | None = None
    replay: ReplayTolerance = Field(default_factory=ReplayTolerance)
    export: ExportNames = Field(default_factory=ExportNames)

    _source: str | None = PrivateAttr(default=None)

    # ---------------------------------------------------------------- validation
    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str, info: ValidationInfo) -> str:
        """A task file names a registered backend (plugins included); a mapping read back from an episode keeps
        its name even where that backend is not installed (it is still read, exported and trained on)."""
        if (info.context or {}).get(RECORDED) or v in BACKENDS:
            return v
        raise ValueError(f"not a registered backend (known: {', '.join(BACKENDS.names())}; plugins register "
                         f"through the entry point group {BACKENDS.group!r})")

    @model_validator(mode="after")
    def _consistent(self) -> TaskMapping:
        n = len(self.action.names)
        if self.step_dt is not None and abs(self.step_dt * self.control_hz - 1.0) > 1e-6:
            raise ValueError(f"step_dt {self.step_dt} disagrees with control_hz {self.control_hz} (expected {1 / self.control_hz:g})")
        names = [k.name for k in self.observation]
        if len(set(names)) != len(names):
            raise ValueError(f"observation: duplicate key names in {names}")
        if set(self.replay.keys) - set(names):
            raise ValueError(f"replay.keys names {sorted(set(self.replay.keys) - set(names))}, not observation keys ({names})")
        if not any(k.flattened for k in self.observation):
            raise ValueError("observation: at least one key must be flattened for policies")
        for part, model in (("policy", self.policy), ("expert", self.expert), ("human", self.human)):
            for fld in ("scale", "offset") + (("low", "high") if part == "policy" else ()):
                k = len(getattr(model, fld))
                if k not in (1, n):
                    raise ValueError(f"{part}.{fld} has {k} values; expected 1 or {n} (action.names)")
        if len(self.human.axes) != n:
            raise ValueError(f"human.axes has {len(self.human.axes)} entries; expected {n} (action.names)")
        plo, phi = np.broadcast_to(self.policy.low, n), np.broadcast_to(self.policy.high, n)
        if np.any(plo >= phi):
            raise ValueError("policy.low must be < policy.high for every dim")
        by_name = {k.name: k for k in self.observation}
        for name in self.export.environment_state:
            if name not in by_name or not by_name[name].flattened:
                raise ValueError(f"export.environment_state names {name!r}, not a flattened observation key ({names})")
        for name, dims in self.export.names.items():
            if name not in by_name:
                raise ValueError(f"export.names names {name!r}, not an observation key ({names})")
            if len(dims) != by_name[name].size:
                raise ValueError(f"export.names.{name} has {len(dims)} names; the key has {by_name[name].size} values")
        state_names = [x for k in self.observation if k.flattened
                       for x in self.export.names.get(k.name) or [f"{k.name}_{i}" for i in range(k.size)]]
        if len(set(state_names)) != len(state_names):
            dup = next(x for x in state_names if state_names.count(x) > 1)
            raise ValueError(f"export.names: {dup!r} names two dimensions of the state (names must be unique)")
        if self.joints is not None and self.joints.obs_key is not None:
            key = next((k for k in self.observation if k.name == self.joints.obs_key), None)
            if key is None:
                raise ValueError(f"joints.obs_key {self.joints.obs_key!r} is not an observation key ({names})")
            if key.shape[-1] != len(self.joints.names):
                raise ValueError(
                    f"joints.names has {len(self.joints.names)} joints but observation {key.name!r} has last dim {key.shape[-1]}"
                )
        return self

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | Path) -> TaskMapping:
        m = config.load(path, cls)
        m._source = str(path)
        return m

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> TaskMapping:
        """A validated copy with fresh derived values (hash, arrays); ``update`` takes plain values."""
        data = self.model_dump()
        data.update(update or {})
        source = f"{self.source} (copy)"
        try:  # the backend was checked when this mapping was made; a copy keeps it even where it is not installed
            m = type(self).model_validate(data, context={RECORDED: data.get("backend") == self.backend})
        except ValidationError as err:
            raise ConfigError(config.format_validation_error(source, err)) from None
        m._source = self._source
        return m

    @property
    def source(self) -> str:
        """The file this mapping came from (for error messages)."""
        return self._source or f"configs/tasks/{self.task_id}.yaml"

    # ---------------------------------------------------------------- derived, cached
    @property
    def action_dim(self) -> int:
        return len(self.action.names)

    @property
    def dt(self) -> float:
        return self.step_dt if self.step_dt is not None else 1.0 / self.control_hz

    @cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        n = self.action_dim

        def v(x):
            return np.broadcast_to(np.asarray(x, dtype=np.float32), (n,)).copy()

        h = self.human
        axis_idx = np.array([COMMAND_AXES.index(a) if a is not None else -1 for a in h.axes], dtype=np.int64)
        return {
            "raw_low": v(self.action.low), "raw_high": v(self.action.high),
            "pol_low": v(self.policy.low), "pol_high": v(self.policy.high),
            "pol_scale": v(self.policy.scale), "pol_offset": v(self.policy.offset),
            "exp_scale": v(self.expert.scale), "exp_offset": v(self.expert.offset),
            "hum_scale": v(h.scale), "hum_offset": v(h.offset), "hum_axis": axis_idx,
        }

    @cached_property
    def _flat_plan(self) -> list[tuple[str, int, np.ndarray | None, np.ndarray | None]]:
        plan = []
        for k in self.observation:
            if not k.flattened:
                continue
            mean = std = None
            if k.normalize is not None:
                mean = np.broadcast_to(np.asarray(k.normalize.mean, np.float32), (k.size,)).copy()
                std = np.broadcast_to(np.asarray(k.normalize.std, np.float32), (k.size,)).copy()
            plan.append((k.name, k.size, mean, std))
        return plan

    @property
    def flat_dim(self) -> int:
        return sum(size for _, size, _, _ in self._flat_plan)

    @cached_property
    def hash(self) -> str:
        """Content hash of the mapping (sha256 of its canonical JSON, 16 hex chars; replay tolerances and export
        naming left out: they change no recorded value)."""
        text = json.dumps(self.model_dump(mode="json", exclude={"replay", "export"}), sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- observations
    def obs_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """key -> (shape, dtype) for contract.step_fields."""
        return {k.name: (tuple(k.shape), k.dtype) for k in self.observation}

    def check_obs(self, obs: dict[str, np.ndarray], *, num_envs: int, where: str) -> None:
        """Raise EnvError naming the key if a batch of observations does not match the mapping."""
        for k in self.observation:
            if k.name not in obs:
                raise EnvError(f"{where}: observation key {k.name!r} (mapping {self.task_id}) missing; env gave {sorted(obs)}")
            arr = obs[k.name]
            if arr.shape != (num_envs, *k.shape) or str(arr.dtype) != k.dtype:
                raise EnvError(
                    f"{where}: observation {k.name!r} is {arr.dtype}{list(arr.shape)}, mapping {self.task_id} "
                    f"declares {k.dtype}{[num_envs, *k.shape]}"
                )

    def flatten_obs(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Ordered, normalized concatenation of the flattened keys: float32 [N, flat_dim]."""
        first = obs[self._flat_plan[0][0]]
        n = first.shape[0]
        out = np.empty((n, self.flat_dim), dtype=np.float32)
        col = 0
        for name, size, mean, std in self._flat_plan:
            part = out[:, col : col + size]
            part[...] = obs[name].reshape(n, size)
            if mean is not None:
                assert std is not None  # a normalized key has both
                part -= mean
                part /= std
            col += size
        return out

    def state_keys(self) -> list[str]:
        """The keys of the state the policy sees, in flatten order (what exports write as one state vector)."""
        return [name for name, _, _, _ in self._flat_plan]

    def dim_names(self, key: str) -> list[str]:
        """Per-dimension names of an observation key: ``export.names`` or ``<key>_<i>``."""
        size = next(k.size for k in self.observation if k.name == key)
        return list(self.export.names.get(key) or [f"{key}_{i}" for i in range(size)])

    # ---------------------------------------------------------------- actions
    def clip_raw(self, a: np.ndarray) -> np.ndarray:
        """The one preprocessing step every action source passes before env.step: clip to raw bounds."""
        arr = self._arrays
        return np.minimum(np.maximum(np.asarray(a, dtype=np.float32), arr["raw_low"]), arr["raw_high"])

    def policy_to_raw(self, a: np.ndarray) -> np.ndarray:
        arr = self._arrays
        p = np.clip(np.asarray(a, dtype=np.float32), arr["pol_low"], arr["pol_high"])
        return self.clip_raw(arr["pol_offset"] + arr["pol_scale"] * p)

    def raw_to_policy(self, a: np.ndarray) -> np.ndarray:
        arr = self._arrays
        p = (np.asarray(a, dtype=np.float32) - arr["pol_offset"]) / arr["pol_scale"]
        return np.clip(p, arr["pol_low"], arr["pol_high"]).astype(np.float32, copy=False)

    def expert_to_raw(self, a: np.ndarray) -> np.ndarray:
        arr = self._arrays
        return self.clip_raw(arr["exp_offset"] + arr["exp_scale"] * np.asarray(a, dtype=np.float32))

    def human_to_raw(self, motion: np.ndarray) -> np.ndarray:
        """HumanCommand.motion [N, 7] (or [7]) -> raw action [N, A] (or [A])."""
        arr = self._arrays
        m = np.asarray(motion, dtype=np.float32)
        if m.shape[-1] != COMMAND_DIM:
            raise EnvError(f"{self.task_id}: human command has last dim {m.shape[-1]}, expected {COMMAND_DIM}")
        idx = arr["hum_axis"]
        picked = np.where(idx >= 0, m[..., np.maximum(idx, 0)], 0.0)
        return self.clip_raw(arr["hum_offset"] + arr["hum_scale"] * picked)

    def raw_to_human(self, raw: np.ndarray) -> np.ndarray:
        """Inverse of human_to_raw (unused axes 0), clipped to [-1, 1]: drives the synthetic operator."""
        arr = self._arrays
        r = np.asarray(raw, dtype=np.float32)
        out = np.zeros((*r.shape[:-1], COMMAND_DIM), dtype=np.float32)
        for i, ax in enumerate(arr["hum_axis"]):
            if ax >= 0:
                out[..., ax] = (r[..., i] - arr["hum_offset"][i]) / arr["hum_scale"][i]
        return np.clip(out, -1.0, 1.0)

    # ---------------------------------------------------------------- metadata
    def as_metadata(self) -> dict[str, Any]:
        """Everything needed to rebuild the mapping, plus its hash (goes into EpisodeStart.mapping)."""
        return {**self.model_dump(mode="json", exclude={"replay"}), "hash": self.hash}

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> TaskMapping:
        """Rebuild from as_metadata(); refuses a record whose content does not match its hash."""
        data = {k: v for k, v in meta.items() if k != "hash"}
        try:
            m = cls.model_validate(data, context={RECORDED: True})
        except ValidationError as err:
            raise ConfigError(config.format_validation_error("episode metadata 'mapping'", err)) from None
        if "hash" in meta and meta["hash"] != m.hash:
            raise ConfigError(f"episode metadata 'mapping': hash {meta['hash']} does not match its content ({m.hash})")
        return m

    def describe(self) -> str:
        """Human-readable summary (printed by `hg-dagger check-env`)."""
        lines = [
            f"task {self.task_id} v{self.task_version} (backend {self.backend}) mapping hash {self.hash}",
            f"  timing: control_hz {self.control_hz:g}, step_dt {self.dt:g} s, horizon {self.horizon} steps "
            f"({self.horizon * self.dt:g} s), action_chunk {self.action_chunk}, alignment {self.action_alignment.value}",
            "  observation (flatten order):",
        ]
        for k in self.observation:
            norm = " normalized" if k.normalize else ""
            use = "flattened" if k.flattened else "not flattened"
            lines.append(f"    {k.name}: {k.dtype}{list(k.shape)} {use}{norm}")
        lines.append(f"  flat obs dim {self.flat_dim}")
        arr = self._arrays
        lines.append(f"  raw action ({self.action_dim}):")
        for i, name in enumerate(self.action.names):
            ax = self.human.axes[i] or "-"
            lines.append(
                f"    {i} {name}: [{arr['raw_low'][i]:g}, {arr['raw_high'][i]:g}]  policy x{arr['pol_scale'][i]:g}"
                f"+{arr['pol_offset'][i]:g}  expert x{arr['exp_scale'][i]:g}+{arr['exp_offset'][i]:g}  human {ax}"
                f" x{arr['hum_scale'][i]:g}+{arr['hum_offset'][i]:g}"
            )
        if self.joints is not None:
            lines.append(f"  joints: {', '.join(self.joints.names)}" + (f" (obs {self.joints.obs_key})" if self.joints.obs_key else ""))
        return "\n".join(lines)


# -------------------------------------------------------------------- the task registry
def known_tasks() -> list[str]:
    """Task ids shipped in configs/tasks/."""
    return config.known_names("tasks")


def load_mapping(task: str | Path) -> TaskMapping:
    """A task id (configs/tasks/<id>.yaml) or a path to a task YAML file."""
    path = Path(task)
    if path.suffix not in (".yaml", ".yml"):
        path = config.config_path("tasks", str(task))
        if not path.is_file():
            raise EnvError(f"unknown task {str(task)!r}; known tasks: {', '.join(known_tasks())}")
    m = TaskMapping.load(path)
    if Path(task).suffix not in (".yaml", ".yml") and m.task_id != path.stem:
        raise ConfigError(f"{path}: task_id {m.task_id!r} must equal the file name {path.stem!r}")
    return m
