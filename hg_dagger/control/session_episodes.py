"""The session's episodes: begin (EpisodeStart, the pending operator/student/mode), end (windows, outcome), the
next episode's seeded reset or its queue, and the robot's hold and refusal. Mixed into
control.session.Session, whose state they read and change."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.enums import (
    CollectionMode,
    ControlState,
    EndReason,
    EventKind,
    SessionMode,
)
from hg_dagger.contract.schema import EpisodeEnd
from hg_dagger.control.handover import (
    HandoverMachine,
    resolve_wait,
)
from hg_dagger.control.operators import ExpertOperator, NoOperator
from hg_dagger.control.session_state import SessionState
from hg_dagger.envs.base import fault_flags
from hg_dagger.errors import EnvError, HgDaggerError

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class SessionEpisodes(SessionState):
    """Episode begin and end of a Session (control.session); the state they use is the session's."""

    def refresh_obs(self) -> bool:
        """Sample the observation again just before a tick (live loops): over the bridge, the robot's state
        now; for a simulator, frozen between ticks, the same state stamped now. The env's signals of the
        last step stay. False when the env cannot observe without stepping (the last step's obs stays), or
        when the robot cannot be reached: then it holds on its own heartbeat timeout, and so does the session."""
        try:
            got = self.env.observe()
        except EnvError as exc:
            if getattr(exc, "code", None) != "unreachable" or not self.running:
                raise
            if not self.robot_hold:
                self._robot_held(str(exc), now_ns())
            return False
        if got is None:
            return False
        obs, info = got
        self.obs = {k: np.array(v, copy=True) for k, v in obs.items()}
        self.t_obs = np.asarray(info["t_obs"], np.int64).copy()
        align = info.get("alignment_error_ms")
        if align is not None:
            self.t_obs_align_ms = np.asarray(align, np.float32).copy()
        self._env_info = {**self._env_info, **{k: info[k] for k in ("estop", "sensor_loss") if k in info}}
        return True

    def _take_obs(self, obs, info, rows: np.ndarray) -> None:
        self.obs = {k: np.array(v, copy=True) for k, v in obs.items()}
        t = info.get("t_obs")
        self.t_obs = np.asarray(t, np.int64).copy() if t is not None else np.full(self.n, now_ns(), np.int64)
        align = info.get("alignment_error_ms")
        self.t_obs_align_ms = None if align is None else np.asarray(align, np.float32).copy()
        sig = info.get("signals") or {}
        self.signals = {k: np.asarray(v, np.float64).copy() for k, v in sig.items()}
        for v in self.signals.values():  # signals of an episode that just ended say nothing about the new one
            v[rows] = np.nan
        self.succeeding = np.asarray(info.get("success", np.zeros(self.n, bool)), bool).copy()
        self.succeeding[rows] = False
        self._env_info = info

    def _begin_rows(self, rows: list[int], branch: dict[int, tuple[str, int, int | None]] | None = None) -> None:
        """Begin the next episode in each of ``rows``, in order, each with a seed of its own (``seed`` + its
        number in the run). What the episodes share (pending changes, the gate config, the resets of the
        student, handover and gate state) is done once for all of them. ``branch``: row -> (parent episode,
        its step, its seed) for an episode that continues another from that step (a rewind)."""
        quota = max(0, self._target - self._started)
        for r in rows[quota:]:  # past the run's target: the row stays without an episode
            self.writer.vacate(r)
        rows = rows[:quota]
        if not rows:
            return
        self._apply_pending()
        gate_config = {
            **self.gates.describe(),
            "policy_version": self.student.version,
            "person_available": bool(self.person_available),
            "thresholds_from": self.threshold_source,
            "operator": {"kind": self.operator.kind, "name": self.operator.name},
            "handover": self.machine.cfg.model_dump(mode="json"),
            "safety": self.safety.config.model_dump(mode="json"),
            **self.gate_config_extra,
        }
        if self.mode in (SessionMode.STUDENT_ONLY, SessionMode.TELEOP):
            gate_config["session_mode"] = self.mode.value
        mode = CollectionMode.EVAL if self.mode == SessionMode.STUDENT_ONLY else CollectionMode.HUMAN_GATED
        seed: int | None
        for r in rows:
            _, seed = self.rows.take(r)
            link = {}
            if branch is not None and r in branch:
                parent, step, seed = branch[r]
                link = {"parent_episode_id": parent, "parent_step_id": step}
                self.rows.steps[r] = step  # the branch continues its parent's attempt: the cut counts from there
            self.writer.begin(r, mode=mode, policy_version=self.student.version, seed=seed,
                              scene=self.scene, operator=self.operator.name, gate_config=gate_config,
                              iteration=self.iteration, extra=dict(self.episode_extra), **link)
            self.history.start(r, seed)
            eid = self.eids[r]
            assert eid is not None  # the episode just began
            self.summary.episode_ids.append(eid)
        self.student.reset_rows(rows, self.n)
        self.machine.reset(rows)
        self.gates.rearm(rows, grace="reset", step=0)
        assert self.obs is not None  # the rows' resets observed
        for r in rows:
            self.operator.begin(r, {k: v[r : r + 1] for k, v in self.obs.items()})
        if self.mode == SessionMode.TELEOP:  # a person drives from the first step: one window over the episode
            t = now_ns()
            self.machine.start_in_control(rows, step=0, t_ns=t, reason="teleop")
            for r in rows:
                self._event(r, EventKind.HANDOVER_START, t, "teleop", self.operator.kind)

    def _apply_pending(self) -> None:
        """Operator, student and mode changes take effect at an episode begin while no other row is in one."""
        if not self._pending or any(e is not None for e in self.eids):
            return
        p, self._pending = self._pending, {}
        if "student" in p:
            self.student = p["student"]
            self._adopt_student_thresholds()
        if "person" in p:
            if self._person is not None and self._person is not p["person"] and self._person is not self.operator:
                self._person.close()
            self._person = p["person"]
        mode = p.get("mode", self.mode)
        if mode == SessionMode.EXPERT:
            op = self.operator if self.operator.role == "expert" else ExpertOperator(self.expert, self.mapping, self.n)
        elif mode == SessionMode.STUDENT_ONLY:
            op = NoOperator(self.n, self.mapping, "student")
        else:
            op = self._person if self._person is not None else p.get("operator", self.operator)
            if op.role != "human":
                raise HgDaggerError(f"mode {mode!r} needs a person's device: choose one first")
        if op is not self.operator and self.operator is not self._person and self.operator.kind == "device":
            self.operator.close()
        self.operator, self.mode = op, mode
        self._gating = mode in (SessionMode.HUMAN_GATED, SessionMode.EXPERT)
        cfg = self._waiting(self._base_handover, op)
        if mode == SessionMode.TELEOP:  # the person keeps control until the episode ends
            cfg = cfg.model_copy(update={"return_on_release": False,
                                         "auto_return": cfg.auto_return.model_copy(update={"enabled": False})})
        m = self.machine
        if cfg != m.cfg or m.operator != op.role or m.operator_name != op.name:
            self.machine = HandoverMachine(cfg, num_envs=self.n, action_dim=m.a, step_dt=m.step_dt,
                                           operator=op.role, operator_name=op.name)

    def _waiting(self, cfg, operator):
        """The handover config with ``wait: auto`` made concrete for this env and operator (resolve_wait)."""
        return resolve_wait(cfg, world_clock=self._world_clock, num_envs=self.n, person=operator.kind == "device")

    def _restart(self, ended: list[int], obs, info, restarted: np.ndarray, *, wait: bool = True) -> None:
        """Reset ended rows that start a new episode with a seed of their own (recorded for replay). With a pause
        between episodes (``episode_gap_s``) or starts held, the rows are queued instead (``_start_due``)."""
        n = self.n
        begin = ended[: max(0, self._target - self._started - len(self._queued))]
        if begin and wait and (self.starts_held or self.episode_gap_s > 0):
            due = now_ns() + int(self.episode_gap_s * 1e9)
            self._queued.update(dict.fromkeys(begin, due))
            begin = []
        obs_next, info_next = obs, info
        restarted = restarted.copy()
        if begin:
            seeds = [self.rows.seed_of(self.rows.begun + k) for k in range(len(begin))]
            obs_next, reset_info = self.env.reset(seed=seeds, env_ids=begin)
            rows = np.zeros(n, bool)
            rows[begin] = True
            t_now = np.full(n, now_ns(), np.int64)
            info_next = {**info, "t_obs": np.where(rows, reset_info.get("t_obs", t_now), info.get("t_obs", t_now))}
            for key in ("estop", "sensor_loss"):  # the reset rows' fault flags are the reset's
                if key in reset_info or key in info:
                    info_next[key] = np.where(rows, fault_flags(reset_info, key, n), fault_flags(info, key, n))
            if "alignment_error_ms" in reset_info:
                info_next["alignment_error_ms"] = np.where(rows, reset_info["alignment_error_ms"],
                                                           info.get("alignment_error_ms", reset_info["alignment_error_ms"]))
            restarted |= rows
        self._take_obs(obs_next, info_next, restarted)
        self.safety.reset(np.flatnonzero(restarted))
        self._begin_rows(begin)

    def _steps_left(self) -> np.ndarray | None:
        """Steps each row's episode has before it is cut: the session's step limit, else the task's horizon, at
        which a stepped simulator ends the episode itself (None: neither)."""
        if self.step_limit is not None:
            return self.step_limit - self.rows.steps
        horizon = self.mapping.horizon
        return horizon - self.ep_step if horizon else None

    def _end_now(self, row: int, reason: EndReason, success: bool, flags: list[str] | None = None) -> None:
        """An operator-driven end between ticks: end the row's episode, then begin the next as the env would (a
        reset begins the next at once; other ends keep the pause between episodes)."""
        if self.eids[row] is None:
            raise HgDaggerError(f"no open episode in env row {row}")
        self._end(row, reason, success, flags)
        self._restart([row], self.obs, self._info_now(), np.zeros(self.n, bool), wait=reason != EndReason.ENV_RESET)

    def _info_now(self) -> dict[str, Any]:
        info = {**self._env_info, "t_obs": self.t_obs, "signals": self.signals}
        if self.t_obs_align_ms is not None:
            info["alignment_error_ms"] = self.t_obs_align_ms
        return info

    def _start_due(self) -> None:
        """Begin the queued episodes whose pause is over (unless starts are held, or the run stopped)."""
        if not self._queued or self.starts_held or self.summary.stopped_by or self.safety.estopped:
            return
        t = now_ns()
        rows = sorted(r for r, due in self._queued.items() if due <= t)
        for r in rows:
            del self._queued[r]
        if rows:
            self._restart(rows, self.obs, self._info_now(), np.zeros(self.n, bool), wait=False)

    def _stop_all(self, why: str = "estop") -> None:
        """E-stop (or a robot hold nobody can resume): end every open episode as a safety stop, open no new ones."""
        self.summary.stopped_by = why
        self.summary.estops += int(why == "estop")
        self._queued.clear()
        for r in range(self.n):
            if self.eids[r] is not None:
                self._end(r, EndReason.SAFETY_STOP, False)
        self._target = self._started

    def policy_lost(self, message: str) -> None:
        """The policy stopped answering (its server died or stalled): each open episode records why (a NOTE from
        "policy") and ends as a safety stop, committed with its windows; no episode begins after."""
        t = now_ns()
        for r in range(self.n):
            if self.eids[r] is not None:
                self._event(r, EventKind.NOTE, t, message, "policy",
                            {"policy_version": str(getattr(self.student, "version", "")), "policy_lost": True})
        self._stop_all("policy")

    def _robot_held(self, message: str, t_ns: int) -> None:
        """The robot holds (the link to it was lost): each open episode records it and stays open, and nothing
        is stepped until a person calls ``resume``; a headless ``run`` ends instead."""
        self.robot_hold = message
        for r in range(self.n):
            if self.eids[r] is not None:
                self._event(r, EventKind.HEARTBEAT_LOSS, t_ns, message, "bridge",
                            {"robot_state": "hold",
                             "control_state": ControlState.from_code(int(self.machine.state[r])).value})

    def _held_tick(self) -> None:
        """A tick while the robot holds: nothing is stepped or recorded; the device's and the app's e-stops
        still stop the run (and latch the robot's e-stop)."""
        self.poll_idle()
        if not self.safety.estopped:
            return
        t = now_ns()
        for r in range(self.n):
            if self.eids[r] is not None:
                self._event(r, EventKind.ESTOP, t, self.safety.estop_reason or "estop", self.safety.estop_source or "",
                            {"from_state": ControlState.from_code(int(self.machine.state[r])).value})
        self._stop_all()
        self.robot_hold = ""
        if hasattr(self.env, "estop"):
            try:
                self.env.estop(f"{self.safety.estop_source}: {self.safety.estop_reason or 'e-stop'}")
            except EnvError as exc:  # the link is still down: the robot holds on its heartbeat timeout meanwhile
                log.warning("could not latch the robot's e-stop: %s", exc)

    def _robot_refused(self, message: str, t_ns: int) -> None:
        """The robot refused to move (its own e-stop or safe stop): an e-stop from the bridge."""
        self.safety.request_estop("bridge", message)
        for r in range(self.n):
            if self.eids[r] is not None:
                self._event(r, EventKind.ESTOP, t_ns, message, "bridge",
                            {"from_state": ControlState.from_code(int(self.machine.state[r])).value})
        self._stop_all()

    def _end(self, r: int, reason: EndReason, success: bool, flags: list[str] | None = None) -> None:
        eid = self.eids[r]
        assert eid is not None  # only a row with an open episode ends one
        num = int(self.ep_step[r])
        windows, outcome = self.machine.finish(r, episode_id=eid, num_steps=num, success=success, end_reason=reason)
        self._window_events(None, num_steps=num)
        self._request_events(self.machine.take_requests(), now_ns())
        flags = list(flags or [])
        if self.safety.estopped:
            flags.append("estop")
        self.writer.end(r, EpisodeEnd(end_reason=reason, task_success=success, recovery_outcome=outcome,
                                      num_steps=num, quality_flags=flags), windows, self.operator.certify(eid, windows))
        self.summary.episodes += 1
        self.summary.successes += int(success)
        self.summary.windows += len(windows)
        self.ended_ids[r] = eid
        self.rows.free(r)
        self.history.stop(r)
        self.operator.release(r)
