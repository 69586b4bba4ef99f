"""The safety monitor: independent of the gates and of the person.

Every action that reaches the robot passes ``SafetyMonitor.apply``: velocity (per-dim bounds), acceleration
(per-tick change) and workspace / joint clamps. When it changes a command the step's action_source becomes
safety_controller and the command and the applied action are both kept. The e-stop latch (keyboard, the
app's button, a device button, the bridge) forces SAFE_STOP; ``hold`` is the action that keeps the robot
where it is. Configured in the run config's ``safety`` section, never in the gate config.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from hg_dagger.contract.model import StrictModel
from hg_dagger.control.limits import ActionLimits, CompiledLimits
from hg_dagger.errors import ConfigError


class SafetyConfig(StrictModel):
    enabled: bool = True
    limits: ActionLimits = Field(default_factory=ActionLimits)
    hold_action: list[float | None] | None = Field(
        default=None,
        description="action that holds position; null entries keep the last applied value (e.g. a gripper). "
        "Default: all zeros (no motion for delta actions).",
    )


@dataclass
class SafetyResult:
    applied: np.ndarray  # float32 [N, A] what goes to the robot
    changed: np.ndarray  # bool [N] the monitor changed the command
    reasons: list[tuple[str, np.ndarray]]  # (limit name, changed [N]); "non_finite" when a command was unusable


class SafetyMonitor:
    def __init__(self, config: SafetyConfig, *, num_envs: int, action_dim: int):
        try:
            config.limits.check_dim(action_dim, where="safety.limits")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if config.hold_action is not None and len(config.hold_action) != action_dim:
            raise ConfigError(f"safety.hold_action has {len(config.hold_action)} values, the task's action has {action_dim} dims")
        self.config = config
        self.n, self.a = num_envs, action_dim
        self.limits = CompiledLimits(config.limits, action_dim)
        hold = config.hold_action or [0.0] * action_dim
        self._hold = np.array([0.0 if h is None else h for h in hold], np.float32)
        self._keep = np.array([h is None for h in hold], bool)
        self.prev = np.zeros((num_envs, action_dim), np.float32)  # last applied action per env
        self.prev_ok = np.zeros(num_envs, bool)  # prev belongs to the current episode
        self._estop = threading.Event()
        self.estop_source = ""
        self.estop_reason = ""

    # ---- e-stop (may be called from any thread) --------------------------------------------

    def request_estop(self, source: str, reason: str = "") -> None:
        if not self._estop.is_set():
            self.estop_source, self.estop_reason = source, reason
        self._estop.set()

    @property
    def estopped(self) -> bool:
        return self._estop.is_set()

    def clear_estop(self) -> None:
        self._estop.clear()
        self.estop_source = self.estop_reason = ""

    # ---- per-env state ---------------------------------------------------------------------

    def reset(self, rows) -> None:
        self.prev_ok[np.asarray(rows, np.int64)] = False

    def hold(self) -> np.ndarray:
        """[N, A] actions that hold every env where it is (kept dims repeat the last applied value)."""
        out = np.broadcast_to(self._hold, (self.n, self.a)).copy()
        if self._keep.any():
            keep = self.prev_ok[:, None] & self._keep[None, :]
            out[keep] = self.prev[keep]
        return out

    # ---- the tick --------------------------------------------------------------------------

    def apply(self, command: np.ndarray, obs: dict[str, np.ndarray]) -> SafetyResult:
        """Clamp ``command`` into the feasible set; non-finite rows become the hold action."""
        command = np.asarray(command, np.float32)
        finite = np.isfinite(command)
        bad = None if finite.all() else ~finite.all(axis=1)  # the common tick: every command finite
        if bad is not None:
            command = np.where(bad[:, None], self.hold(), command)
        reasons: list[tuple[str, np.ndarray]]
        if not self.config.enabled:
            applied, changed, reasons = command.copy(), np.zeros(len(command), bool) if bad is None else bad.copy(), []
        else:
            applied, changed, reasons = self.limits.clamp(command, self.prev, self.prev_ok, obs)
        if bad is not None:
            changed |= bad
            reasons = [("non_finite", bad), *reasons]
        return SafetyResult(applied, changed, reasons)

    def commit(self, applied: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Remember what was applied (the reference for the per-tick change limit and for hold); ``rows`` (bool
        [N]): only those were stepped (the others wait, paused, and keep their reference)."""
        if rows is None:
            self.prev[:] = applied
            self.prev_ok[:] = True
        else:
            self.prev[rows] = applied[rows]
            self.prev_ok[rows] = True
