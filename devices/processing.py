"""The command pipeline every device shares: raw device value -> motion in the robot frame.

HumanCommand.raw is what the device read; HumanCommand.motion is ``CommandPipeline.process(raw)``.
Nothing else touches the values in between, so a recorded human_command can be replayed through a
pipeline built from the same config and calibration to reproduce the motion exactly.

Stages, in order: calibration (center offsets, ranges, inversion) -> deadzone -> expo -> per-axis
scale -> frame transform (device -> robot base, optionally -> end effector) -> clip to [-1, 1] ->
hold-to-intervene (motion is zero while not engaged) -> rate limit (max change per tick).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BeforeValidator, Field, model_validator

from hg_dagger.contract.command import COMMAND_AXES, COMMAND_DIM
from hg_dagger.contract.model import StrictModel

N_AXES = COMMAND_DIM


def per_axis(value: object, *, allow_none: bool = False) -> tuple[float | None, ...]:
    """A per-axis setting: one number for all axes, a list of 7, or {axis_name: value, default: value}."""
    if value is None and allow_none:
        return (None,) * N_AXES
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value),) * N_AXES
    if isinstance(value, Mapping):
        unknown = set(value) - set(COMMAND_AXES) - {"default"}
        if unknown:
            raise ValueError(f"unknown axis name(s) {sorted(unknown)}; axes are {', '.join(COMMAND_AXES)} (or 'default')")
        default = value.get("default", None if allow_none else 0.0)
        return tuple(_num(value.get(a, default), allow_none) for a in COMMAND_AXES)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != N_AXES:
            raise ValueError(f"expected {N_AXES} values ({', '.join(COMMAND_AXES)}), got {len(value)}")
        return tuple(_num(v, allow_none) for v in value)
    raise ValueError("expected a number, a list of 7 numbers, or a mapping of axis name to number")


def _num(v: object, allow_none: bool) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


PerAxis = Annotated[tuple[float, ...], BeforeValidator(per_axis)]
PerAxisOptional = Annotated[tuple[float | None, ...], BeforeValidator(lambda v: per_axis(v, allow_none=True))]


class HoldConfig(StrictModel):
    """Hold-to-intervene: the person is engaged while holding (a button, or any motion), plus a release delay."""

    engage_on: Literal["button", "motion", "always"] = "button"
    release_delay_s: float = Field(0.0, ge=0.0)  # stays engaged this long after the hold ends
    motion_threshold: float = Field(0.05, ge=0.0, le=1.0)  # engage_on=motion: |axis| above this counts as input


class FrameConfig(StrictModel):
    """Device frame -> robot frame. ``rotation`` maps device-frame vectors into the robot base frame
    (base = R @ device); give it as a 3x3 matrix (rows) or as roll/pitch/yaw in degrees.
    With ``target: ee`` the base-frame command is re-expressed in the end-effector frame, using the
    end-effector orientation the control loop hands to ``CommandPipeline.set_ee_rotation`` each tick.
    """

    target: Literal["base", "ee"] = "base"
    rotation: list[list[float]] | None = None
    rpy_deg: tuple[float, float, float] | None = None

    @model_validator(mode="after")
    def _check(self) -> FrameConfig:
        if self.rotation is not None and self.rpy_deg is not None:
            raise ValueError("give either rotation or rpy_deg, not both")
        if self.rotation is not None:
            r = np.asarray(self.rotation, dtype=float)
            if r.shape != (3, 3):
                raise ValueError(f"rotation must be 3x3, got shape {r.shape}")
            if not np.allclose(r @ r.T, np.eye(3), atol=1e-6) or not np.isclose(np.linalg.det(r), 1.0, atol=1e-6):
                raise ValueError("rotation is not a proper rotation matrix (orthonormal, determinant +1)")
        return self

    def matrix(self) -> np.ndarray:
        if self.rotation is not None:
            return np.asarray(self.rotation, dtype=np.float64)
        if self.rpy_deg is not None:
            return rpy_matrix(*np.deg2rad(self.rpy_deg))
        return np.eye(3)


def rpy_matrix(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """R = Rz(yaw) @ Ry(pitch) @ Rx(roll)."""
    cr, sr, cp, sp, cy, sy = np.cos(roll), np.sin(roll), np.cos(pitch), np.sin(pitch), np.cos(yaw), np.sin(yaw)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


class ProcessingConfig(StrictModel):
    """Shaping applied to every device's raw command. Per-axis values: a number, 7 numbers, or a mapping."""

    deadzone: PerAxis = Field(default=(0.0,) * N_AXES)  # fraction of full scale treated as zero
    expo: PerAxis = Field(default=(0.0,) * N_AXES)  # 0 linear .. 1 cubic: finer control near center
    scale: PerAxis = Field(default=(1.0,) * N_AXES)
    max_rate: PerAxisOptional = Field(default=(None,) * N_AXES)  # max change of motion per tick; None = free
    hold: HoldConfig = Field(default_factory=HoldConfig)
    frame: FrameConfig = Field(default_factory=FrameConfig)

    @model_validator(mode="after")
    def _check(self) -> ProcessingConfig:
        for axis, dz, ex in zip(COMMAND_AXES, self.deadzone, self.expo, strict=True):
            if not 0.0 <= dz < 1.0:
                raise ValueError(f"deadzone.{axis} = {dz} is out of range [0, 1)")
            if not 0.0 <= ex <= 1.0:
                raise ValueError(f"expo.{axis} = {ex} is out of range [0, 1]")
        for axis, v in zip(COMMAND_AXES, self.max_rate, strict=True):
            if v is not None and v <= 0:
                raise ValueError(f"max_rate.{axis} = {v} must be positive (or null for no limit)")
        return self


class AxisNormalizer:
    """The calibration stage: maps raw values of the 7 command slots to [-1, 1].

    y = sign * (raw - center) / span, with separate spans above and below the center (a stick whose
    resting value is off-center still reaches +-1 at both ends). Built by each device from its
    calibration file and axis map.
    """

    def __init__(self, center: npt.ArrayLike = 0.0, neg_span: npt.ArrayLike = 1.0, pos_span: npt.ArrayLike = 1.0,
                 sign: npt.ArrayLike = 1.0) -> None:
        self.center = np.broadcast_to(np.asarray(center, np.float64), (N_AXES,)).copy()
        self.neg_span = np.maximum(np.broadcast_to(np.asarray(neg_span, np.float64), (N_AXES,)), 1e-6)
        self.pos_span = np.maximum(np.broadcast_to(np.asarray(pos_span, np.float64), (N_AXES,)), 1e-6)
        self.sign = np.broadcast_to(np.asarray(sign, np.float64), (N_AXES,)).copy()
        # plain floats: for 7 values, Python arithmetic is several times cheaper than numpy calls
        self._rows = tuple(zip(*(a.tolist() for a in (self.center, self.neg_span, self.pos_span, self.sign)), strict=True))

    def values(self, raw: list[float]) -> list[float]:
        out = []
        for v, (c, neg, pos, sign) in zip(raw, self._rows, strict=True):
            d = v - c
            y = sign * d / (pos if d >= 0 else neg)
            out.append(1.0 if y > 1.0 else -1.0 if y < -1.0 else y)
        return out

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        return np.array(self.values(np.asarray(raw, np.float64).tolist()))


def _clip1(v: float) -> float:
    return 1.0 if v > 1.0 else -1.0 if v < -1.0 else v


class CommandPipeline:
    """Stateful per-device shaping (the engagement timer and the rate limiter keep state between ticks).

    Runs on plain Python floats: one tick costs a few microseconds instead of tens with numpy calls.
    """

    def __init__(self, cfg: ProcessingConfig, normalizer: AxisNormalizer | None = None, extra_scale: npt.ArrayLike = 1.0):
        self.cfg = cfg
        self.normalizer = normalizer or AxisNormalizer()
        scale = np.asarray(cfg.scale) * np.broadcast_to(np.asarray(extra_scale, np.float64), (N_AXES,))
        self._axes = tuple(zip(cfg.deadzone, cfg.expo, scale.tolist(), strict=True))
        self._max_rate = tuple(float("inf") if v is None else v for v in cfg.max_rate)
        self._rate_limited = any(v is not None for v in cfg.max_rate)
        self._device_to_base = cfg.frame.matrix()
        self._set_frame(self._device_to_base)
        self._mode = cfg.hold.engage_on
        self._threshold = cfg.hold.motion_threshold
        self._release_ns = int(cfg.hold.release_delay_s * 1e9)
        self.reset()

    def _set_frame(self, rotation: np.ndarray) -> None:
        self._identity_frame = bool(np.allclose(rotation, np.eye(3)))
        self._frame = tuple(tuple(row) for row in np.asarray(rotation, np.float64).tolist())

    def reset(self) -> None:
        self._last_active_ns: int | None = None
        self._prev = [0.0] * N_AXES

    def set_ee_rotation(self, ee_rotation: np.ndarray) -> None:
        """End-effector orientation in the base frame (3x3); used when frame.target is 'ee'."""
        if self.cfg.frame.target != "ee":
            return
        self._set_frame(np.asarray(ee_rotation, np.float64).T @ self._device_to_base)

    def _shape(self, raw: np.ndarray | Sequence[float]) -> list[float]:
        x = self.normalizer.values(raw.tolist() if isinstance(raw, np.ndarray) else [float(v) for v in raw])
        for i, (dz, expo, scale) in enumerate(self._axes):
            v = x[i]
            m = abs(v)
            if m <= dz:
                x[i] = 0.0
                continue
            v = (m - dz) / (1.0 - dz) * (1.0 if v > 0 else -1.0)
            if expo:
                v = (1.0 - expo) * v + expo * v * v * v
            x[i] = v * scale
        if not self._identity_frame:
            (a, b, c), (d, e, f), (g, h, k) = self._frame
            for j in (0, 3):
                u, v, w = x[j], x[j + 1], x[j + 2]
                x[j], x[j + 1], x[j + 2] = a * u + b * v + c * w, d * u + e * v + f * w, g * u + h * v + k * w
        return [_clip1(v) for v in x]

    def shape(self, raw: np.ndarray) -> np.ndarray:
        """Calibration, deadzone, expo, scale, frame, clip: the stateless part."""
        return np.array(self._shape(raw))

    def _engaged(self, shaped: list[float], hold: bool, t_ns: int) -> bool:
        if self._mode == "always":
            return True
        if hold or (self._mode == "motion" and max(abs(v) for v in shaped[:6]) > self._threshold):
            self._last_active_ns = t_ns
            return True
        return self._last_active_ns is not None and t_ns - self._last_active_ns <= self._release_ns

    def process(self, raw: np.ndarray, *, hold: bool, t_ns: int) -> tuple[np.ndarray, bool]:
        """One tick: returns (motion float32 [7], engaged). Motion is zero while not engaged."""
        shaped = self._shape(raw)
        if not self._engaged(shaped, hold, t_ns):
            self._prev = [0.0] * N_AXES
            return np.zeros(N_AXES, np.float32), False
        if self._rate_limited:
            shaped = [
                s if -r <= s - p <= r else p + (r if s > p else -r)
                for p, r, s in zip(self._prev, self._max_rate, shaped, strict=True)
            ]
        self._prev = shaped
        return np.array(shaped, np.float32), True


class CommandPipelines:
    """``CommandPipeline`` for N rows at once, on numpy arrays: the synthetic operators of a session with many
    envs shape every row's command in a few calls instead of a Python loop per row.

    The same stages in the same float64 arithmetic, so each row's motion equals what its own
    ``CommandPipeline`` gives (tests/devices compare them). The end-effector frame needs a rotation per row
    and is left to ``CommandPipeline``.
    """

    def __init__(self, cfg: ProcessingConfig, num_rows: int, normalizer: AxisNormalizer | None = None):
        if cfg.frame.target == "ee":
            raise ValueError("CommandPipelines shapes commands in the base frame; frame.target 'ee' needs CommandPipeline")
        self.cfg = cfg
        norm = normalizer or AxisNormalizer()
        self._center, self._neg, self._pos, self._sign = norm.center, norm.neg_span, norm.pos_span, norm.sign
        self._deadzone = np.array(cfg.deadzone, np.float64)
        self._expo = np.array(cfg.expo, np.float64)
        self._scale = np.array(cfg.scale, np.float64)
        self._max_rate = np.array([np.inf if v is None else v for v in cfg.max_rate], np.float64)
        self._rate_limited = any(v is not None for v in cfg.max_rate)
        rotation = cfg.frame.matrix()
        self._rotation = None if np.allclose(rotation, np.eye(3)) else rotation.tolist()
        self._mode = cfg.hold.engage_on
        self._threshold = cfg.hold.motion_threshold
        self._release_ns = int(cfg.hold.release_delay_s * 1e9)
        self._prev = np.zeros((num_rows, N_AXES))
        self._last_active_ns = np.zeros(num_rows, np.int64)
        self._was_active = np.zeros(num_rows, bool)

    def reset(self, rows: int | slice | Sequence[int] | np.ndarray) -> None:
        self._prev[rows] = 0.0
        self._was_active[rows] = False

    def _shape(self, raw: np.ndarray) -> np.ndarray:
        d = np.asarray(raw, np.float64) - self._center
        y = self._sign * d / np.where(d >= 0, self._pos, self._neg)
        x = np.where(y > 1.0, 1.0, np.where(y < -1.0, -1.0, y))
        m = np.abs(x)
        v = (m - self._deadzone) / (1.0 - self._deadzone) * np.where(x > 0, 1.0, -1.0)
        v = np.where(self._expo != 0, (1.0 - self._expo) * v + self._expo * v * v * v, v)
        x = np.where(m <= self._deadzone, 0.0, v * self._scale)
        if self._rotation is not None:
            (a, b, c), (e, f, g), (h, k, q) = self._rotation
            for j in (0, 3):
                u, v_, w = x[:, j].copy(), x[:, j + 1].copy(), x[:, j + 2].copy()
                x[:, j], x[:, j + 1], x[:, j + 2] = a * u + b * v_ + c * w, e * u + f * v_ + g * w, h * u + k * v_ + q * w
        return np.where(x > 1.0, 1.0, np.where(x < -1.0, -1.0, x))

    def process(self, rows: np.ndarray, raw: np.ndarray, *, hold: np.ndarray, t_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """One tick for ``rows`` (raw [k, 7], hold bool [k]): (motion float32 [k, 7], engaged bool [k])."""
        shaped = self._shape(raw)
        hold = np.asarray(hold, bool)
        if self._mode == "always":
            engaged = np.ones(len(rows), bool)
        else:
            active = hold | ((np.abs(shaped[:, :6]).max(axis=1) > self._threshold) if self._mode == "motion" else False)
            self._last_active_ns[rows[active]] = t_ns
            self._was_active[rows[active]] = True
            engaged = active | (self._was_active[rows] & (t_ns - self._last_active_ns[rows] <= self._release_ns))
        if self._rate_limited:
            p, r = self._prev[rows], self._max_rate
            step = shaped - p
            shaped = np.where((-r <= step) & (step <= r), shaped, p + np.where(shaped > p, r, -r))
        shaped[~engaged] = 0.0
        self._prev[rows] = shaped
        return shaped.astype(np.float32), engaged
