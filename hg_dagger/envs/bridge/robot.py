"""The robot's state machine behind the bridge: running, hold (safe stop) and estop, over one VecEnv.

The robot only moves on ``reset`` and ``step``. In ``hold`` and ``estop`` it refuses ``step``. Entering either
from ``running`` commands the backend to hold (``VecEnv.hold``): a robot driver stops and holds position
(``hold_action``: motion dims 0, gripper dims keep their last command), the MuJoCo backends stop the arm where
it is; the robot stops because it was told to, not because commands happen to stop. ``observe`` reads the
backend now (``VecEnv.observe``), so a monitor sees a held robot as it is. Every obs reply carries per-row fault
flags: "estop" (the robot is e-stopped; a backend that reports "estop" in its step/reset info latches it) and
"sensor_loss" (the backend said so, or a step returned an observation whose timestamp did not advance).

Every field a command carries is type- and range-checked here before anything reaches the backend; a bad one
raises ProtocolError or BridgeError and leaves the robot's state alone. Sockets, sessions and the heartbeat are
the server's (envs.bridge.server); this module knows nothing of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.envs.base import VecEnv, check_action, fault_flags
from hg_dagger.envs.bridge.protocol import BridgeError, ErrorCode, Msg, ProtocolError, RobotState
from hg_dagger.errors import EnvError

log = logging.getLogger("hg_dagger.bridge.server")

MAX_SEED = 2**32 - 1  # seeds are uint32: every backend's seeding (numpy legacy included) takes them
MAX_TEXT = 200  # reason / by / client strings are cut to this many characters
MAX_CID = 128


def hold_action(action_names: list[str], last_action: np.ndarray | None, num_envs: int) -> np.ndarray:
    """The zero-motion command that holds position: 0 on every motion dim, and the last commanded
    value on gripper dims (names containing "grip"), so a grasped object is not dropped."""
    hold = np.zeros((num_envs, len(action_names)), dtype=np.float32)
    if last_action is not None:
        for i, name in enumerate(action_names):
            if "grip" in name.lower():
                hold[:, i] = last_action[:, i]
    return hold


@dataclass
class Counters:
    steps: int = 0
    resets: int = 0
    sessions: int = 0
    heartbeat_losses: int = 0
    holds: int = 0  # times the backend was commanded to hold (VecEnv.hold)
    refused: dict[str, int] = field(default_factory=dict)


class Robot:
    """One VecEnv and its state (running / hold / estop). Not thread-safe: the server's loop drives it."""

    def __init__(self, env: VecEnv, *, seed: int | None = None, counters: Counters | None = None):
        self.env = env
        self.counters = counters or Counters()
        self.state = RobotState.HOLD
        self.reason = "no session yet: reset or resume to move"
        self.names = list(env.mapping.action.names)
        self.resumed_by = ""  # who lifted the last hold (resume's "by"), for status and the log
        self._last_action: np.ndarray | None = None
        self._last_step: tuple[Any, dict] | None = None  # (command id, reply) for an exactly-once retry
        self._obs, info = env.reset(seed=seed)
        self._t_obs = _times(info, "t_obs", now_ns())
        self._sensor_loss = fault_flags(info, "sensor_loss", env.num_envs)  # as of the last reset/step

    @property
    def running(self) -> bool:
        return self.state == RobotState.RUNNING

    def hold_action(self) -> np.ndarray:
        return hold_action(self.names, self._last_action, self.env.num_envs)

    def status(self) -> dict:
        """The robot's part of a status reply (the server adds its instance and session)."""
        c = self.counters
        return {"type": Msg.STATUS, "state": self.state, "reason": self.reason,
                "steps": c.steps, "resets": c.resets, "sessions": c.sessions,
                "heartbeat_losses": c.heartbeat_losses, "holds": c.holds, "resumed_by": self.resumed_by,
                "refused": dict(c.refused), "hold_action": self.hold_action()}

    def close(self) -> None:
        self.env.close()

    # ------------------------------------------------------------------ safety
    def hold(self, reason: str, level: int = logging.WARNING) -> None:
        """Safe stop: the backend is commanded to hold position, then steps are refused until reset/resume."""
        if self.state == RobotState.ESTOP:
            return
        if self.state != RobotState.HOLD:
            log.log(level, "safe stop: holding position (%s)", reason)
        self.stop_motion()
        self.state, self.reason = RobotState.HOLD, reason

    def stop_motion(self) -> None:
        """Tell the backend to hold (VecEnv.hold) when the robot was running. A failure is logged; the state
        still leaves running, so no step is applied after it."""
        if self.state != RobotState.RUNNING:
            return
        self.counters.holds += 1
        try:
            self.env.hold()
        except Exception as exc:  # noqa: BLE001 - the robot side must keep serving (and refusing steps)
            log.error("the backend failed to hold: %s: %s", type(exc).__name__, exc)
        else:
            log.info("backend commanded to hold position")

    def estop(self, reason: str) -> None:
        """Latch the e-stop (from the client or the robot side); only estop_release leaves it."""
        log.warning("E-STOP: %s", reason)
        self.stop_motion()
        self.state, self.reason = RobotState.ESTOP, f"e-stop: {reason}"

    def release_estop(self) -> None:
        if self.state == RobotState.ESTOP:
            log.warning("e-stop released; holding until reset or resume")
            self.state, self.reason = RobotState.HOLD, "e-stop released: reset or resume to move"

    def resume(self, msg: dict) -> None:
        by = text(string_field(msg, "by"), "unnamed client")
        if self.state == RobotState.ESTOP:
            raise BridgeError(f"robot is e-stopped ({self.reason}); send estop_release first", ErrorCode.STATE)
        if self.state == RobotState.HOLD:
            log.warning("resumed by %s after hold (%s)", by, self.reason)
            self.resumed_by = by
        self.state, self.reason = RobotState.RUNNING, "running"

    # ------------------------------------------------------------------ motion and observation
    def _obs_reply(self, t_recv: int, *, obs=None, t_obs=None, sensor_loss=None, **fields) -> dict:
        """An obs reply: the last reset/step's observation unless a fresh one (observe) is given."""
        return {"type": Msg.OBS, "state": self.state, "obs": self._obs if obs is None else obs,
                "t_obs": self._t_obs if t_obs is None else t_obs, "t_recv": t_recv, "estop": self._estop_rows(),
                "sensor_loss": self._sensor_loss if sensor_loss is None else sensor_loss, **fields,
                "t_send": now_ns()}

    def _estop_rows(self) -> np.ndarray:
        """bool [N]: an e-stopped robot refuses motion in every row."""
        return np.full(self.env.num_envs, self.state == RobotState.ESTOP)

    def _faults(self, info: dict, t_obs_before: np.ndarray | None) -> None:
        """Take the backend's fault flags from a reset/step info. A step whose observation timestamp
        did not advance counts as sensor loss for that row; a reported e-stop latches the robot's."""
        n = self.env.num_envs
        loss = fault_flags(info, "sensor_loss", n)
        if t_obs_before is not None:
            t_now = np.broadcast_to(np.asarray(self._t_obs, dtype=np.int64), (n,))
            loss |= t_now <= np.broadcast_to(t_obs_before, (n,))
        self._sensor_loss = loss
        if loss.any():
            log.warning("sensor loss in rows %s: observation stale or missing", np.flatnonzero(loss).tolist())
        estop = fault_flags(info, "estop", n)
        if estop.any():
            rows = np.flatnonzero(estop).tolist()
            log.warning("E-STOP: the robot reported an e-stop in rows %s", rows)
            self.stop_motion()
            self.state, self.reason = RobotState.ESTOP, f"e-stop: the robot reported an e-stop in rows {rows}"

    def reset(self, msg: dict) -> dict:
        t_recv = now_ns()
        if self.state == RobotState.ESTOP:
            raise BridgeError(f"robot is e-stopped ({self.reason}); send estop_release first", ErrorCode.STATE)
        seed, env_ids = msg.get("seed"), msg.get("env_ids")
        n = self.env.num_envs
        if not (env_ids is None or (isinstance(env_ids, list) and all(is_int(i) for i in env_ids))):
            raise ProtocolError("reset.env_ids must be null or a list of ints", ErrorCode.MALFORMED)
        if env_ids is not None and (any(not 0 <= i < n for i in env_ids) or len(set(env_ids)) != len(env_ids)):
            raise BridgeError(f"reset.env_ids {env_ids[:16]} must be distinct rows in 0..{n - 1}", ErrorCode.BAD_REQUEST)
        top = MAX_SEED - (n - 1)  # an int seed seeds row r with seed + r
        if not (seed is None or (is_int(seed) and 0 <= seed <= top)
                or (isinstance(seed, list) and all(is_int(s) and 0 <= s <= MAX_SEED for s in seed))):
            raise ProtocolError(f"reset.seed must be null, an int in 0..{top} or a list of ints in 0..{MAX_SEED}",
                                ErrorCode.MALFORMED)
        if isinstance(seed, list) and len(seed) != (n if env_ids is None else len(env_ids)):
            raise BridgeError(f"reset.seed has {len(seed)} seeds for {n if env_ids is None else len(env_ids)} rows",
                              ErrorCode.BAD_REQUEST)
        obs, info = self.env.reset(seed=seed, env_ids=env_ids)
        self._obs, self._t_obs = obs, _times(info, "t_obs", now_ns())
        self.counters.resets += 1
        self._last_step = None
        self.state, self.reason = RobotState.RUNNING, "running"
        self._faults(info, None)
        return self._obs_reply(t_recv, t_action_apply=np.int64(NO_TIME))

    def step(self, msg: dict) -> dict:
        t_recv = now_ns()
        cid = msg.get("cid")
        if cid is not None and not (isinstance(cid, str) and 0 < len(cid) <= MAX_CID):
            raise ProtocolError(f"step.cid must be a string of 1..{MAX_CID} characters, got {type(cid).__name__}",
                                ErrorCode.MALFORMED)
        applied = cid is not None and self._last_step is not None and self._last_step[0] == cid
        if self.state != RobotState.RUNNING:  # a held robot answers no step, a re-sent one included
            again = f"; the step with cid {cid!r} was applied before it" if applied else ""
            raise BridgeError(f"robot is in {self.state} ({self.reason}){again}; step refused", ErrorCode.STATE)
        if applied:  # a retried command: answered from the stored reply, not stepped twice
            assert self._last_step is not None
            return dict(self._last_step[1], t_recv=t_recv, t_send=now_ns(), replayed=True)
        action = msg.get("action")
        if not isinstance(action, np.ndarray):
            raise BridgeError(f"step.action must be an ndarray, got {type(action).__name__}", ErrorCode.BAD_ACTION)
        try:
            action = check_action(action, self.env.num_envs, self.env.action_dim, where=f"bridge {self.env.task_id}")
        except EnvError as exc:
            raise BridgeError(str(exc), ErrorCode.BAD_ACTION) from exc
        res = self.env.step(action)
        self._last_action = action
        self.counters.steps += 1
        info = res.info
        t_obs_before = np.asarray(self._t_obs, dtype=np.int64)
        self._obs, self._t_obs = res.obs, np.asarray(res.t_obs, dtype=np.int64)
        self._faults(info, t_obs_before)
        fields: dict[str, Any] = {
            "t_action_apply": np.asarray(res.t_action_apply, dtype=np.int64),
            "reward": np.asarray(res.reward, dtype=np.float32),
            "terminated": np.asarray(res.terminated, dtype=bool),
            "truncated": np.asarray(res.truncated, dtype=bool),
            "success": np.asarray(res.success, dtype=bool),
            "episode_start": np.asarray(res.episode_start, dtype=bool),
        }
        if np.any(fields["terminated"] | fields["truncated"]):
            fields["final_obs"] = res.final_obs
        if info.get("signals"):
            fields["signals"] = {k: np.asarray(v) for k, v in info["signals"].items()}
        reply = self._obs_reply(t_recv, **fields)
        if cid is not None:
            self._last_step = (cid, reply)
        return reply

    def observe(self) -> dict:
        """The backend's observation now (it does not move); a backend that cannot observe without stepping
        answers with the last reset/step's. Sensor loss: the backend's flag for this sample, or the last
        reset/step's."""
        t_recv = now_ns()
        got = self.env.observe()
        if got is None:
            return self._obs_reply(t_recv, t_action_apply=np.int64(NO_TIME))
        obs, info = got
        loss = self._sensor_loss | fault_flags(info, "sensor_loss", self.env.num_envs)
        return self._obs_reply(t_recv, obs=obs, t_obs=_times(info, "t_obs", now_ns()), sensor_loss=loss,
                               t_action_apply=np.int64(NO_TIME))


def _times(info: dict, key: str, fallback: int) -> np.ndarray | np.int64:
    t = info.get(key)
    return np.asarray(t, dtype=np.int64) if t is not None else np.int64(fallback)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def string_field(msg: dict, key: str) -> str | None:
    """An optional string field; anything else is malformed."""
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{msg['type']}.{key} must be a string, got {type(value).__name__}", ErrorCode.MALFORMED)
    return value


def text(value: Any, default: str) -> str:
    """A peer's free text as one short, printable log line."""
    if not isinstance(value, str) or not value.strip():
        return default
    return "".join(ch if ch.isprintable() else "?" for ch in value[:MAX_TEXT])
