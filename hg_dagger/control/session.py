"""The session: the gated-handover arbiter of the rollout engine (control.engine), one control tick batched
over the env's rows, and the run loop around it; the controls a live front end calls between ticks are in
control.session_controls, episode begin and end in control.session_episodes.

    act -> poll operators -> gates -> handover -> choose command -> safety_stage -> env.step -> cut -> record

Everything here stays in memory: the recorder's ``put`` is an O(1) hand-off to its writer thread.
The session records action_source, control_state, step_flags, correction windows and events; the store
derives the labels from them (contract.labels), never this module. Who answers a handover request is
an ``Operator`` (control.operators); the run config lives in control.run_config, the wiring in
control.build.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hg_dagger import safety_log
from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.enums import (
    ControlState,
    EndReason,
    EventKind,
    SessionMode,
    StepFlag,
)
from hg_dagger.contract.schema import Event
from hg_dagger.control.engine import (
    Engine,
    EpisodeRows,
    Samples,
    StudentOnly,
    Tick,
    clamp_values,
    cut,
    end_reason,
    safety_stage,
)
from hg_dagger.control.episodes import EpisodeWriter
from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gates import GateEngine
from hg_dagger.control.handover import (
    AUTO,
    EXPERT,
    HUMAN,
    REQUESTED,
    SAFE_STOP,
    SRC_EXPERT,
    SRC_HOLD,
    SRC_HUMAN,
    SRC_POLICY,
    WARNING,
    HandoverMachine,
    RequestEnd,
    TickInputs,
)
from hg_dagger.control.live import TickView
from hg_dagger.control.operators import Operator, OperatorTick
from hg_dagger.control.run_config import (  # noqa: F401 - the config names stay importable from here
    OperatorConfig,
    RobotConfig,
    RunConfig,
    load_gate_config,
    load_run_config,
)
from hg_dagger.control.safety import SafetyMonitor
from hg_dagger.control.session_controls import BUTTONS, SessionControls  # noqa: F401 - importable here
from hg_dagger.control.session_episodes import SessionEpisodes
from hg_dagger.envs.base import StepResult
from hg_dagger.errors import ConfigError, EnvError, HgDaggerError

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    episodes: int = 0
    steps: int = 0
    successes: int = 0
    windows: int = 0
    human_steps: int = 0  # steps whose applied action came from the operator
    gate_triggers: int = 0
    context_switches: int = 0  # policy -> operator handovers
    safety_clamps: int = 0
    estops: int = 0
    paused_ticks: int = 0
    requests_answered: int = 0  # handover requests the person took over
    requests_declined: int = 0  # ... let the student go on (DeclineRequest)
    requests_expired: int = 0  # ... that ran out: the wait limit, or their episode ended while they waited
    stopped_by: str = ""  # "estop" when the run ended on an emergency stop
    episode_ids: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what happened outside any episode (e.g. an e-stop cleared)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if not d["notes"]:
            d.pop("notes")
        return d


class Session(SessionControls, SessionEpisodes):
    """Runs a student on a VecEnv with gates, handover, an operator and the safety monitor, and records
    every step, event and correction window to a store recorder."""

    def __init__(self, env, student, recorder, *, gates: GateEngine, handover: HandoverMachine,
                 safety: SafetyMonitor, operator: Operator, expert=None, latency_budget_ms: float | None = None,
                 scene: str = "", seed: int = 0, iteration: int = 0, realtime: bool = False,
                 max_episode_steps: int | None = None, episode_gap_s: float | None = None,
                 gate_config_extra: dict[str, Any] | None = None, episode_extra: dict[str, Any] | None = None):
        self.env, self.student, self.rec = env, student, recorder
        self.mapping = env.mapping
        self.n = env.num_envs
        self._world_clock = getattr(env, "world_clock", "stepped")
        self._base_handover = handover.cfg  # as configured (wait may be auto: resolved per operator, _waiting)
        if handover.cfg.wait == "auto":
            handover = HandoverMachine(self._waiting(handover.cfg, operator), num_envs=self.n, action_dim=handover.a,
                                       step_dt=handover.step_dt, operator=handover.operator,
                                       operator_name=handover.operator_name)
        self.gates, self.machine, self.safety = gates, handover, safety
        if operator.n != self.n:
            raise ConfigError(f"the operator answers {operator.n} envs, the env has {self.n}: give one per env")
        self.operator = operator
        self.expert = expert
        self.latency_budget_ns = None if latency_budget_ms is None else int(latency_budget_ms * 1e6)
        self.scene = scene
        self.seed = seed
        self.iteration = int(iteration)  # the DAgger round, recorded in each EpisodeStart
        self.max_episode_steps = max_episode_steps  # cut episodes here (end reason timeout); None: the env's horizon
        # on a robot (a live clock) the robot holds while a request waits, and the step limit counts only steps in
        # which something acted, the task's horizon included; a simulator pauses instead (wait auto/pause), or,
        # told to hold, counts every step like its own horizon does
        live_clock = getattr(env, "world_clock", "stepped") == "live"
        self.count_acting = live_clock
        self.step_limit = max_episode_steps if max_episode_steps is not None else (
            self.mapping.horizon if live_clock else None)
        self.acted = np.zeros(self.n, np.int64)  # steps of each row's open episode that count against the limit
        self.live_episode_gap_s = episode_gap_s  # the run config's pause between episodes for live front ends
        self.episode_gap_s = 0.0  # in force: a live front end sets it (ControlLoop); a headless run never waits
        self.starts_held = False  # a per-episode dialog is open: queued episodes wait (hold_starts)
        self._queued: dict[int, int] = {}  # row -> monotonic ns at which its next episode may begin
        self._decline = False
        self.last_window_id: str | None = None  # the person's latest closed correction window (flag as bad)
        self.ended_ids: list[str | None] = [None] * self.n  # the episode that ended last in each row
        self.window_episode: dict[str, str] = {}  # the person's closed windows this sitting -> their episode
        self.notice = ""  # one line for the operator about how the session was set up (the gate's thresholds)
        self.threshold_source = "config"  # config | student | calibration: where the confidence thresholds came from
        self._adopt_student_thresholds()
        self.realtime = realtime
        self.gate_config_extra = gate_config_extra or {}
        self.episode_extra = episode_extra or {}
        self.writer = EpisodeWriter(recorder, self.mapping, self.n, env.world_clock, env.robot)
        self.fields = self.writer.fields
        self.mode = SessionMode.EXPERT if operator.role == "expert" else SessionMode.HUMAN_GATED
        self._person = None if operator.role == "expert" else operator  # the operator a person drives
        self._gating = True  # gates may ask for the operator (off for student_only and teleop)
        self._pending: dict[str, Any] = {}  # operator / student / mode changes for the next episode begin
        self._pressed: set[str] = set()
        self._prev_device_ok = np.ones(self.n, bool)
        self.obs: dict[str, np.ndarray] | None = None
        self.signals: dict[str, np.ndarray] = {}
        self.succeeding = np.zeros(self.n, bool)  # the task's success condition after the last step, per row
        self.t_obs = np.full(self.n, NO_TIME, np.int64)
        self.t_obs_align_ms: np.ndarray | None = None  # clock-mapping error of t_obs (robot bridge)
        self.ep_seed: list[int | None] = [None] * self.n
        self.summary = RunSummary()
        self.last: TickView | None = None
        self._started = 0
        self._target = 0
        self._env_info: dict[str, Any] = {}
        self.robot_hold = ""  # why the robot holds (link lost): nothing moves until a person calls resume()

    # ---- state read by callers -------------------------------------------------------------

    @property
    def eids(self) -> list[str | None]:
        return self.writer.eids

    @property
    def ep_step(self) -> np.ndarray:
        return self.writer.steps

    @property
    def operator_kind(self) -> str:
        return self.operator.kind

    @property
    def operator_name(self) -> str:
        return self.operator.name

    @property
    def person_available(self) -> bool:
        return self.operator.person_available

    @property
    def running(self) -> bool:
        """An episode is open, or one waits to begin (the pause between episodes, or starts held)."""
        return (any(e is not None for e in self.eids) or bool(self._queued)) and not self.summary.stopped_by

    def request_wait_s(self, row: int = 0) -> float | None:
        """Control time the row's open handover request has waited; None without one."""
        return self.machine.waiting_s(row) if self.eids[row] is not None else None

    def next_start_in_s(self) -> float | None:
        """Seconds until the next queued episode begins (None when none is queued or starts are held)."""
        if not self._queued or self.starts_held:
            return None
        return max(0.0, (min(self._queued.values()) - now_ns()) / 1e9)


    # ---- calibration -----------------------------------------------------------------------

    def _adopt_student_thresholds(self) -> bool:
        """The acting student's own gate thresholds (calibrated when it was trained, stored with its checkpoint)."""
        done = self.gates.adopt(getattr(self.student, "gate_thresholds", None))
        if not done:
            return False
        self.threshold_source = "student"
        if (conf := self.gates.confidence) is not None and conf.name in done:
            self.notice = (f"confidence gate: student {self.student.version}'s own thresholds "
                           f"(warn {_fmt(conf.warn)}, trigger {_fmt(conf.trigger)})")
        return True

    @property
    def student_has_thresholds(self) -> bool:
        return bool((getattr(self.student, "gate_thresholds", None) or {}).get("confidence"))

    def calibrate(self, steps: int) -> dict[str, float] | None:
        """Run the student alone for ``steps`` env steps through the rollout engine (not recorded; the safety
        monitor applies) and set the confidence gate's thresholds by the quantile rule."""
        samples = Samples()
        ticks = max(1, steps // self.n)
        engine = Engine(self.env, self.student, StudentOnly(), self.safety,
                        rows=EpisodeRows(self.n, base_seed=self.seed + 10_000), sinks=[samples])
        engine.run(episodes=None, stop=lambda: engine.ticks >= ticks)
        self.obs = None  # the run starts from a fresh reset
        cal = self.gates.calibrate(np.concatenate(samples.values))
        if cal is not None and cal.get("refused"):
            self.notice = cal["refused"]
            log.warning("%s", cal["refused"])
        elif cal is not None:
            self.threshold_source = "calibration"
        return cal

    # ---- the run loop ----------------------------------------------------------------------

    def run(self, episodes: int, *, progress: bool = True) -> RunSummary:
        """Record ``episodes`` complete episodes (or fewer if an e-stop ends the run)."""
        from tqdm import tqdm

        done_before = self.summary.episodes
        self.start(episodes)
        bar = tqdm(total=episodes, desc=f"run {self.mapping.task_id}", unit="ep", disable=not progress, leave=False)
        period = self.mapping.step_dt if self.realtime else 0.0
        try:
            while self.running:
                t0 = time.perf_counter()
                before = self.summary.episodes
                self.tick()
                if self.robot_hold:  # no person here to resume: the run stops, its episodes kept as safety stops
                    self._stop_all("robot_hold")
                bar.update(self.summary.episodes - before)
                if period:
                    time.sleep(max(0.0, period - (time.perf_counter() - t0)))
        finally:
            bar.close()
        log.info("run %s: %d episodes, %d windows, %d operator steps", self.mapping.task_id,
                 self.summary.episodes - done_before, self.summary.windows, self.summary.human_steps)
        return self.summary

    def start(self, episodes: int) -> None:
        """Reset the env and open the first episodes; then call ``tick`` while ``running``."""
        if self.safety.estopped:
            raise HgDaggerError(f"e-stop from {self.safety.estop_source or 'unknown'} is latched: clear it before running")
        self._target = self._started + episodes
        self._queued.clear()
        self.summary.stopped_by = ""
        self.robot_hold = ""  # starting is the operator's action; the reset below lifts a robot hold
        obs, info = self.env.reset(seed=[self.seed + self._started + i for i in range(self.n)])
        self._take_obs(obs, info, np.ones(self.n, bool))
        self.safety.reset(np.arange(self.n))
        self._prev_device_ok = np.ones(self.n, bool)
        self._begin_rows(list(range(self.n)))

    # ---- one tick --------------------------------------------------------------------------

    def tick(self) -> None:
        """One control step for every env row; sets ``last``."""
        if self.robot_hold:
            self._held_tick()
            return
        self._start_due()
        active = self.writer.active()
        if not active.any():  # between episodes (the pause before the next, or starts held): nothing to step
            self.poll_idle()
            return
        out, t_policy = self._act()
        state_before = self.machine.state.copy()
        op = self._poll_operators(active, state_before, t_policy)
        estop = np.full(self.n, self.safety.estopped, bool)
        armed = ((state_before == AUTO) | (state_before == WARNING)) & self._gating
        g = self._gates(out, op, armed, active, t_policy)
        d = self._handover(out, op, g, estop, t_policy)
        command, flags = self._choose_command(out, op, d)
        step = self.ep_step.copy()
        paused = d.paused if d.paused.any() else None
        if paused is not None:  # the simulator waits for the person: nothing is applied or recorded in those rows
            self.summary.paused_ticks += 1
            if not (self.env.pauses_rows and (active & ~paused).any()):  # the others go on where the env can
                self._view(step, out, t_policy, op, d, g, None, None, d.source)
                return
            active = active & ~paused
        tick = Tick(obs=self.obs, t_obs=self.t_obs, active=active, policy=out, t_policy=t_policy, command=command,
                    source=d.source.copy(), control_state=d.state, flags=flags, operator=op,
                    expert_action=op.expert_action, expert_valid=op.expert_valid)
        self._safety(tick, d)
        result = self._step_env(tick.applied, t_policy, paused)
        if result is None:  # the robot refused: the action never moved it, nothing to record
            return
        acted = active.copy()
        if self.count_acting:  # holding for the person is no step of the episode
            acted &= ~((d.state == REQUESTED) & (d.source == SRC_HOLD))
        self.acted += acted
        tick.env = cut(result, np.where(acted, self.acted, 0), self.step_limit)  # the cut row's last step: truncated
        self._after_step(tick)
        self._record(tick)
        self._view(step, out, t_policy, op, d, g, tick.applied, result.t_action_apply, tick.source)
        self._episode_ends(d.state == SAFE_STOP, tick.env, active)

    def _act(self):
        """The student (it keeps computing during human control)."""
        out = self.student.act(self.obs)
        return out, now_ns()

    def _poll_operators(self, active, state_before, t_ns: int) -> OperatorTick:
        """The operator's answer, the app's buttons, and the e-stops from a device button or the env."""
        op = self.operator.poll(self.obs, state_before, active)
        if self._pressed:  # the operator's answer may be read-only (an idle one, shared between ticks)
            op = replace(op, takeover=op.takeover | ("takeover" in self._pressed),
                         ret=op.ret | ("return" in self._pressed))
            self._pressed.clear()
        if op.estop_by:
            self.safety.request_estop(op.estop_by, "device e-stop button")
        if self.operator.has_devices:
            self._device_events(op.device_ok, t_ns)
        env_estop = self._env_info.get("estop")  # the env contract's robot e-stop of the last step
        if env_estop is not None and np.any(env_estop):
            self.safety.request_estop("bridge", "robot-side e-stop")
        return op

    def _gates(self, out, op: OperatorTick, armed, active, t_ns: int):
        """Gates run only where the policy is in control; a takeover (button or grab) is the operator gate."""
        unc = np.asarray(out.uncertainty, np.float32)
        gate_in = GateInputs(step=self.ep_step, t_ns=t_ns, action=np.asarray(out.action, np.float32), uncertainty=unc,
                             obs=self.obs, signals=self.signals, takeover=op.takeover,
                             prev_applied=self.safety.prev, prev_ok=self.safety.prev_ok, succeeding=self.succeeding,
                             steps_left=self._steps_left())
        g = self.gates.update(gate_in, armed & active)
        for r, ev in g.events:
            self._event(r, ev.kind, ev.t_ns, ev.reason, ev.source, ev.values)
            if ev.kind == EventKind.GATE_TRIGGER:
                self.summary.gate_triggers += int(self.eids[r] is not None)
        self.gates.observe_autonomous(unc[armed & active])
        return g

    def _handover(self, out, op: OperatorTick, g, estop, t_ns: int):
        policy = np.asarray(out.action, np.float32)
        tol = self.machine.cfg.auto_return.agree_tol
        agree = np.all(np.abs(policy - op.action) <= tol, axis=1)  # NaN (no command) never agrees, silently
        decline = np.full(self.n, self._decline, bool) if self._decline else None
        self._decline = False
        d = self.machine.update(TickInputs(
            step=self.ep_step, t_ns=t_ns, gate_level=g.level, engaged=op.engaged, device_ok=op.device_ok,
            return_button=op.ret, agree=agree, confident=self.gates.confident(), estop=estop,
            gate_trip=self.gates.trip, t_warn=self.gates.t_warn, t_gate=self.gates.t_gate, decline=decline))
        self.gates.rearm(d.rearm, grace="handback", step=self.ep_step)
        drop = getattr(self.student, "drop_chunks", None)  # a chunking policy starts afresh at a handover or hand-back
        if drop is not None and d.transitions:
            drop([r for r, frm, to, _ in d.transitions if frm in (HUMAN, EXPERT) or to in (HUMAN, EXPERT)])
        self._transition_events(d, t_ns)
        self._request_events(d.requests_ended, t_ns)
        return d

    def _request_events(self, ended: list[RequestEnd], t_ns: int) -> None:
        """One REQUEST_END event per request that ended: how (answered, declined, expired) and how long it waited."""
        for e in ended:
            if self.eids[e.row] is None:
                continue
            values = e.values(self.mapping.dt, t_ns)
            self._event(e.row, EventKind.REQUEST_END, t_ns, e.why, "handover", values)
            field_name = f"requests_{e.outcome}"
            setattr(self.summary, field_name, getattr(self.summary, field_name) + 1)

    def _choose_command(self, out, op: OperatorTick, d):
        """The command each row applies (policy, operator or hold), smoothed at switches."""
        target = np.asarray(out.action, np.float32).copy()
        op_rows = (d.source == SRC_HUMAN) | (d.source == SRC_EXPERT)
        if op_rows.any():
            target[op_rows] = op.action[op_rows]
        hold = d.source == SRC_HOLD
        if hold.any():
            target[hold] = self.safety.hold()[hold]
        return self.machine.smooth(target, self.safety.prev, self.safety.prev_ok)

    def _safety(self, tick: Tick, d) -> None:
        """The engine's safety stage (action conversion, the monitor, CLAMPED, the safety controller's source)."""
        command_source = d.source
        # a blended (or ramped) hand-back step applies the controller's mix of the last applied action and the
        # policy's, not the policy's action: it is recorded as the controller's (context only, never a label)
        tick.source[((tick.flags & StepFlag.INTERPOLATED) != 0) & (tick.source == SRC_POLICY)] = SRC_HOLD

        def on_clamp(r: int, names: str, t: Tick) -> None:
            self._event(r, EventKind.SAFETY_CLAMP, t.t_policy, names, "safety", clamp_values(t, r, command_source))
            self.summary.safety_clamps += 1

        safety_stage(self.safety, self.mapping, tick, on_clamp)
        tick.flags = tick.flags | np.where(d.device_lost, StepFlag.DEVICE_LOST, 0).astype(np.uint16)
        person = d.state == HUMAN
        if person.any():  # a person in control whose device sent no command: the step says why it has none
            silent = person & ~np.isfinite(tick.operator.raw).all(axis=1) & ~d.device_lost
            tick.flags = tick.flags | np.where(silent, StepFlag.INCOMPLETE_INPUT, 0).astype(np.uint16)

    def _step_env(self, applied, t_ns: int, paused: np.ndarray | None = None):
        try:
            result = self.env.step(applied) if paused is None else self.env.step(applied, paused=paused)
        except EnvError as exc:
            code = getattr(exc, "code", None)  # ErrorCode.STATE: the robot holds or is e-stopped
            if code == "unreachable" or (code == "state" and getattr(exc, "robot_state", None) == "hold"):
                self._robot_held(str(exc), t_ns)  # unreachable: the robot holds on its own heartbeat timeout
            elif code != "state":
                raise
            else:
                self._robot_refused(str(exc), t_ns)
            return None
        self.safety.commit(applied, None if paused is None else ~paused)
        return result

    def _after_step(self, tick: Tick) -> None:
        """Flag late steps, and steps whose observation the env reported stale or missing (info "sensor_loss" of
        the reply that delivered it); both are excluded from labels."""
        result = tick.env
        t_apply = result.t_action_apply
        self.machine.note_applied(t_apply)
        self._window_events(t_apply)
        resumed = result.info.get("robot_resumed")  # the bridge's explicit resume_on_reconnect flag lifted a hold
        if resumed:
            for r in range(self.n):
                if self.eids[r] is not None:
                    self._event(r, EventKind.NOTE, int(t_apply[r]), f"robot resumed by {resumed}", "bridge",
                                {"resumed_by": resumed})
        if self.latency_budget_ns is not None:
            late = (t_apply - self.t_obs) > self.latency_budget_ns
            tick.flags = tick.flags | np.where(late, StepFlag.LATENCY_EXCEEDED, 0).astype(np.uint16)
        sensor_loss = self._env_info.get("sensor_loss")
        if sensor_loss is not None:
            tick.flags = tick.flags | np.where(np.asarray(sensor_loss, bool), StepFlag.SENSOR_LOSS, 0).astype(np.uint16)

    def _record(self, tick: Tick) -> None:
        """The episode writer's sink: one step per active row."""
        env, op, source = tick.env, tick.operator, tick.source
        out = tick.policy
        align = env.info.get("alignment_error_ms")
        transport = env.info.get("transport_ns")
        human_cmd = (source == SRC_HUMAN) | (tick.control_state == HUMAN)
        if human_cmd.any():  # the common tick: nobody commands, nothing more to look at
            human_cmd &= np.isfinite(op.raw).all(axis=1)
        cols = {
            "t_obs": tick.t_obs, "t_action_apply": env.t_action_apply,
            "policy_action": np.asarray(out.action, np.float32),
            "policy_confidence": np.asarray(out.confidence, np.float32),
            "policy_uncertainty": np.asarray(out.uncertainty, np.float32),
            "applied_action": tick.applied, "action_source": source, "control_state": tick.control_state,
            "step_flags": tick.flags, "reward": env.reward, "terminated": env.terminated, "truncated": env.truncated,
            "success": env.success, **{f"obs/{k}": v for k, v in tick.obs.items()},
        }
        if align is not None:  # a row's stamps come from two replies (t_obs, t_action_apply): keep the worse bound
            align = np.asarray(align, np.float32)
            cols["alignment_error_ms"] = align if self.t_obs_align_ms is None else np.maximum(align, self.t_obs_align_ms)
        if transport is not None:
            cols["transport_ns"] = np.asarray(transport, np.int64)
        if self.operator.records_expert_labels:
            cols.update(expert_action=tick.expert_action, expert_valid=tick.expert_valid,
                        expert_used=source == SRC_EXPERT)
        shared = {"t_policy": tick.t_policy, "inference_ns": int(out.inference_ns), "valid": True}
        rows = np.flatnonzero(tick.active)
        self.writer.write(rows, cols, shared, only=(human_cmd, {"human_command": op.raw, "t_device": op.t_device}))
        self.summary.steps += int(rows.size)
        operated = (source == SRC_HUMAN) | (source == SRC_EXPERT)
        self.summary.human_steps += int((tick.active & operated).sum()) if operated.any() else 0

    def _view(self, step, out, t_policy, op: OperatorTick, d, g, applied, t_apply, source) -> None:
        """Publish the tick as ``last`` (reusing the tick's arrays)."""
        n = self.n
        reasons = [""] * n
        for r in np.flatnonzero(g.level) if g.level.any() else ():
            reasons[r] = self.gates.trip[r].get("reason", "")
        t_request = np.full(n, NO_TIME, np.int64)
        t_handover = np.full(n, NO_TIME, np.int64)
        windows = self.machine.open
        if windows.count(None) < n:  # some row is under correction or asked for it
            for r, w in enumerate(windows):
                if w is not None:
                    t_request[r] = w.t_gate
                    t_handover[r] = w.t_handover
        progress = self.signals.get("progress")
        self.last = TickView(
            step=step, t_obs=self.t_obs, t_policy=np.full(n, t_policy, np.int64),
            t_action_apply=t_apply if t_apply is not None else np.full(n, NO_TIME, np.int64),
            policy_action=np.asarray(out.action, np.float32), operator_action=op.action,
            applied_action=applied if applied is not None else np.full_like(op.action, np.nan),
            action_source=source, control_state=d.state, gate_level=g.level, gate_reason=reasons,
            confidence=np.asarray(out.confidence, np.float32), uncertainty=np.asarray(out.uncertainty, np.float32),
            progress=progress if progress is not None else np.full(n, np.nan), t_request=t_request,
            t_handover=t_handover, paused=applied is None)

    def _window_events(self, t_apply: np.ndarray | None, num_steps: int | None = None) -> None:
        """Each window as it closes becomes a WINDOW_CLOSED event: a run killed before the episode's commit still
        leaves its corrections' bounds and ids in the log (auditable, never trainable)."""
        for r, w in self.machine.take_closed():
            if self.eids[r] is None:
                continue
            if self.machine.operator == "human":
                self.last_window_id = w.window_id
                self.window_episode[w.window_id] = self.eids[r]
            values = w.values(num_steps)
            t_ns = w.t_return if w.t_return != NO_TIME else (int(t_apply[r]) if t_apply is not None else now_ns())
            self.writer.event(r, Event(kind=EventKind.WINDOW_CLOSED, step=values["handover_end"], t_ns=int(t_ns),
                                       reason=w.cause, source="handover",
                                       values={**values, "operator": self.machine.operator_name}))

    def _event(self, r: int, kind: EventKind, t_ns: int, reason: str = "", source: str = "",
               values: dict[str, Any] | None = None) -> None:
        self.writer.event(r, Event(kind=kind, step=int(self.ep_step[r]), t_ns=int(t_ns), reason=reason,
                                   source=source, values=values or {}))
        safety_log.event(kind, r, int(self.ep_step[r]), reason, source, values, self.eids[r])  # the incident file

    def _episode_ends(self, stopped, result: StepResult, active) -> None:
        """End finished episodes, reset their rows with fresh seeds and begin the next ones."""
        term, trunc, success = result.terminated, result.truncated, result.success
        ended = (term | trunc | stopped) & active
        for r in np.flatnonzero(ended):
            r = int(r)
            reason = EndReason.SAFETY_STOP if stopped[r] else end_reason(bool(term[r]), bool(success[r]))
            self._end(r, reason, bool(success[r]))
        new_episode = result.episode_start
        info = {**result.info, "t_obs": result.t_obs, "success": result.success}  # what the next tick observes
        if self.safety.estopped:
            self._stop_all()
            self._take_obs(result.obs, info, new_episode)
            if hasattr(self.env, "estop"):  # latch the robot's own e-stop too (robot bridge)
                self.env.estop(f"{self.safety.estop_source}: {self.safety.estop_reason or 'e-stop'}")
            return
        self._restart([int(r) for r in np.flatnonzero(ended)], result.obs, info, new_episode)

    # ---- events ----------------------------------------------------------------------------

    def _device_events(self, device_ok: np.ndarray, t_ns: int) -> None:
        changed = [] if device_ok is self._prev_device_ok else np.flatnonzero(device_ok != self._prev_device_ok)
        for r in changed:  # nothing changed when the operator handed out its shared read-only idle answer again
            r = int(r)
            kind = EventKind.DEVICE_CONNECT if device_ok[r] else EventKind.DEVICE_DISCONNECT
            self._event(r, kind, t_ns, source=self.operator.device_id(r),
                        values={"control_state": ControlState.from_code(int(self.machine.state[r])).value})
        frozen = not device_ok.flags.writeable and device_ok.base is None  # its own data, write-protected: kept
        self._prev_device_ok = device_ok if frozen else device_ok.copy()

    def _transition_events(self, d, t_ns: int) -> None:
        in_control = (HUMAN, EXPERT)
        kind = self.operator.kind
        for r, frm, to, why in d.transitions:
            if self.eids[r] is None:
                continue
            if to in in_control:  # who took control (after a lost device: who resumed)
                self.summary.context_switches += 1
                self._event(r, EventKind.HANDOVER_START, t_ns, why, kind,
                            {"operator": self.operator.name, "device": self.operator.device_id(r)})
            if frm in in_control:
                self._event(r, EventKind.HANDOVER_END, t_ns, why, kind)
                self.operator.release(r)
            if to == SAFE_STOP:
                ev = EventKind.ESTOP if why == "estop" else EventKind.NOTE
                src = self.safety.estop_source if why == "estop" else "handover"
                self._event(r, ev, t_ns, why if why != "estop" else (self.safety.estop_reason or "estop"), src,
                            {"from_state": ControlState.from_code(frm).value})


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.3g}"
