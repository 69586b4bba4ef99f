"""The session: the gated-handover arbiter of the rollout engine (control.engine), one control tick batched
over the env's rows, and the run loop around it; the controls a live front end calls between ticks are in
control.session_controls, episode begin and end in control.session_episodes, its events in control.session_events.

    Engine.tick: act -> [decide: poll operators -> gates -> handover -> choose command] -> safety_stage
      -> env.step -> cut -> [stepped: record] -> [after: episode ends and restarts]

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
from tqdm import tqdm

from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.enums import (
    EndReason,
    EventKind,
    SessionMode,
    StepFlag,
)
from hg_dagger.control.action_history import ActionHistory
from hg_dagger.control.engine import (
    Arbiter,
    Engine,
    EpisodeRows,
    Samples,
    StudentOnly,
    Tick,
    clamp_values,
    end_reason,
)
from hg_dagger.control.episodes import EpisodeWriter
from hg_dagger.control.fleet import FleetAllocator, cur_inputs
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
from hg_dagger.control.session_events import SessionEvents
from hg_dagger.control.session_rewind import SessionRewind
from hg_dagger.errors import ConfigError, HgDaggerError

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
    fleet: dict[str, Any] = field(default_factory=dict)  # one person, several robots: the queue's figures

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("notes", "fleet"):
            if not d[key]:
                d.pop(key)
        return d


class Session(SessionControls, SessionEpisodes, SessionEvents, SessionRewind, Arbiter):
    """Runs a student on a VecEnv with gates, handover, an operator and the safety monitor, and records
    every step, event and correction window to a store recorder."""

    def __init__(self, env, student, recorder, *, gates: GateEngine, handover: HandoverMachine,
                 safety: SafetyMonitor, operator: Operator, expert=None, latency_budget_ms: float | None = None,
                 scene: str = "", seed: int = 0, iteration: int = 0, realtime: bool = False,
                 max_episode_steps: int | None = None, episode_gap_s: float | None = None,
                 gate_config_extra: dict[str, Any] | None = None, episode_extra: dict[str, Any] | None = None,
                 fleet: FleetAllocator | None = None):
        self.env, self.rec = env, recorder
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
        # episode k of the session starts from seed ``seed + k``; rows.steps counts each open episode's steps
        # against the limit (the cut)
        self.rows = EpisodeRows(self.n, base_seed=seed, limit=self.step_limit)
        self.engine = Engine(env, student, self, safety, rows=self.rows, on_clamp=self._on_clamp, copy_obs=False)
        self.history = ActionHistory(self.n)  # what each row's open episode applied (a rewind re-runs it)
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
        self.writer = EpisodeWriter(recorder, self.mapping, self.n, env.world_clock, env.robot,
                                    chunks=hasattr(student, "chunk_id"))
        self.fields = self.writer.fields
        self.mode = SessionMode.EXPERT if operator.role == "expert" else SessionMode.HUMAN_GATED
        self._person = None if operator.role == "expert" else operator  # the operator a person drives
        self._gating = True  # gates may ask for the operator (off for student_only and teleop)
        self._pending: dict[str, Any] = {}  # operator / student / mode changes for the next episode begin
        self._pressed: set[str] = set()
        self._prev_device_ok = np.ones(self.n, bool)
        self.signals: dict[str, np.ndarray] = {}
        self.succeeding = np.zeros(self.n, bool)  # the task's success condition after the last step, per row
        self.engine.t_obs = np.full(self.n, NO_TIME, np.int64)
        self.t_obs_align_ms: np.ndarray | None = None  # clock-mapping error of t_obs (robot bridge)
        self.ep_seed: list[int | None] = [None] * self.n
        self.summary = RunSummary()
        self.last: TickView | None = None
        self._target = 0
        self._env_info: dict[str, Any] = {}
        self.robot_hold = ""  # why the robot holds (link lost): nothing moves until a person calls resume()
        self.fleet = fleet  # one person serves every row: the request queue (control.fleet); None: one each
        self.stopped_rows: set[int] = set()  # rows e-stopped on their own (stop_row): not stepped, no new episode

    # ---- state read by callers -------------------------------------------------------------

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

    @property
    def calibrates(self) -> bool:
        """The gates have a confidence gate with a 'calibration' section (what start-up calibration sets)."""
        conf = self.gates.confidence
        return conf is not None and getattr(conf.spec, "calibration", None) is not None

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

    def run(self, episodes: int, *, progress: bool = True, windows: int | None = None) -> RunSummary:
        """Record ``episodes`` complete episodes (or fewer if an e-stop ends the run); with ``windows``, no episode
        begins once the run holds that many correction windows, and the open ones finish."""
        done_before = self.summary.episodes
        windows_before = self.summary.windows
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
                if windows is not None and self.summary.windows - windows_before >= windows:
                    self._target = min(self._target, self._started)  # enough corrections: the open episodes finish
                    self._queued.clear()
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
        self.stopped_rows.clear()  # a fresh start begins every row: a row's own e-stop is lifted with it
        self.summary.stopped_by = ""
        self.robot_hold = ""  # starting is the operator's action; the reset below lifts a robot hold
        obs, info = self.env.reset(seed=[self.rows.seed_of(self.rows.begun + i) for i in range(self.n)])
        self._take_obs(obs, info, np.ones(self.n, bool))
        self.safety.reset(np.arange(self.n))
        self._prev_device_ok = np.ones(self.n, bool)
        self._begin_rows(list(range(self.n)))

    # ---- one tick: the engine's, with the session as its arbiter -------------------------------

    def tick(self) -> None:
        """One control step for every env row (``Engine.tick`` through this arbiter's hooks); sets ``last``."""
        self.engine.tick()

    def ready(self) -> bool:
        """A tick steps unless the robot holds or no episode is open (the pause before the next, starts held)."""
        if self.robot_hold:
            self._held_tick()
            return False
        self._start_due()
        if not self.rows.active.any():
            self.poll_idle()
            return False
        return True

    def decide(self, tick: Tick) -> None:
        """Poll the operators, run the gates and the handover machine, and choose each row's command: the
        policy's, the operator's or a hold, smoothed at switches; rows waiting for a person pause."""
        out, t_policy, active = tick.policy, tick.t_policy, tick.active
        state_before = self.machine.state.copy()
        if self.fleet is None:
            op = self._poll_operators(active, state_before, t_policy)
        else:  # the person sees the request they serve; the others wait in the queue
            unc = out.uncertainty
            seen = self.fleet.allocate(state_before, self.machine.wait_ticks, lambda r: cur_inputs(self.gates, unc, r),
                                       active)
            for r, why, values in self.fleet.take_events():
                if self.eids[r] is not None:
                    self._event(r, EventKind.NOTE, t_policy, why, "fleet", values)
            op = self.fleet.hands(self._poll_operators(active, seen, t_policy))
        estop = np.full(self.n, self.safety.estopped, bool)
        armed = ((state_before == AUTO) | (state_before == WARNING)) & self._gating
        g = self._gates(out, op, armed, active, t_policy)
        d = self._handover(out, op, g, estop, t_policy)
        command, flags = self._choose_command(out, op, d)
        self._tick_parts = (self.ep_step.copy(), op, d, g)
        tick.command, tick.source, tick.control_state, tick.flags = command, d.source.copy(), d.state, flags
        tick.operator, tick.expert_action, tick.expert_valid = op, op.expert_action, op.expert_valid
        if d.paused.any():  # the simulator waits for the person: nothing is applied or recorded in those rows
            self.summary.paused_ticks += 1
            tick.paused = d.paused
        if self.stopped_rows:  # e-stopped rows stay where they are
            tick.paused = (tick.paused if tick.paused is not None else np.zeros(self.n, bool)).copy()
            tick.paused[sorted(self.stopped_rows)] = True
        if self.count_acting:  # holding for the person is no step of the episode
            tick.counted = ~((d.state == REQUESTED) & (d.source == SRC_HOLD))
        tick.stop = d.state == SAFE_STOP
        self._flag_command(tick, d)

    def waited(self, tick: Tick) -> None:
        step, op, d, g = self._tick_parts
        self._view(step, tick.policy, tick.t_policy, op, d, g, None, None, d.source)

    def refused(self, exc: Exception, tick: Tick) -> bool:
        """The robot refused the step: it holds (its heartbeat timeout, or a hold it reports), or it is
        e-stopped; any other fault of the env is no refusal."""
        code = getattr(exc, "code", None)  # ErrorCode.STATE: the robot holds or is e-stopped
        if code == "unreachable" or (code == "state" and getattr(exc, "robot_state", None) == "hold"):
            self._robot_held(str(exc), tick.t_policy)
        elif code == "state":
            self._robot_refused(str(exc), tick.t_policy)
        else:
            return False
        return True

    def stepped(self, tick: Tick) -> None:
        """Record the step and publish it."""
        assert tick.env is not None and tick.applied is not None  # a stepped tick
        self._after_step(tick)
        self._record(tick)
        self.history.append(tick.active, tick.applied)
        step, op, d, g = self._tick_parts
        self._view(step, tick.policy, tick.t_policy, op, d, g, tick.applied, tick.env.t_action_apply, tick.source)

    def after(self, tick: Tick, ended: list[int]) -> bool:
        """End the ended rows' episodes, reset their rows with fresh seeds and begin the next ones."""
        result = tick.env
        assert result is not None and tick.stop is not None  # a stepped tick, decided (decide sets stop)
        for r in ended:
            reason = EndReason.SAFETY_STOP if tick.stop[r] else end_reason(bool(result.terminated[r]),
                                                                            bool(result.success[r]))
            self._end(r, reason, bool(result.success[r]))
        new_episode = result.episode_start
        info = {**result.info, "t_obs": result.t_obs, "success": result.success}  # what the next tick observes
        if self.safety.estopped:
            self._stop_all()
            self._take_obs(result.obs, info, new_episode)
            if hasattr(self.env, "estop"):  # latch the robot's own e-stop too (robot bridge)
                self.env.estop(f"{self.safety.estop_source}: {self.safety.estop_reason or 'e-stop'}")
            return True
        self._restart(ended, result.obs, info, new_episode)
        return True

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
        assert self.obs is not None  # the rows began: there is an observation
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
        if op.decline is not None:  # the operator let the student go on in these rows
            decline = op.decline if decline is None else decline | op.decline
        self._decline = False
        d = self.machine.update(TickInputs(
            step=self.ep_step, t_ns=t_ns, gate_level=g.level, engaged=op.engaged, device_ok=op.device_ok,
            return_button=op.ret, agree=agree, confident=self.gates.confident(), estop=estop,
            gate_trip=self.gates.trip, t_warn=self.gates.t_warn, t_gate=self.gates.t_gate, decline=decline))
        self.gates.rearm(d.rearm, grace="handback", step=self.ep_step)
        self._transition_events(d, t_ns)
        drop = getattr(self.student, "drop_chunks", None)  # a chunking policy starts afresh at a handover or hand-back
        if drop is not None and d.transitions:  # each drop is an event: what was dropped, and why
            why = {r: "handover" if to in (HUMAN, EXPERT) else "hand-back: the next chunk is computed on the current "
                   "observation" for r, frm, to, _ in d.transitions if frm in (HUMAN, EXPERT) or to in (HUMAN, EXPERT)}
            dropped = drop(list(why))  # per row what went (RemotePolicy); another policy may say nothing
            for r, values in dropped.items() if isinstance(dropped, dict) else ():
                if self.eids[r] is not None:
                    self._event(r, EventKind.NOTE, t_ns, f"chunk dropped at {why[r]}", "handover", values)
        self._request_events(d.requests_ended, t_ns)
        return d

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

    def _flag_command(self, tick: Tick, d) -> None:
        """What the step says about its command before the safety stage: a blended (or ramped) hand-back step
        applies the controller's mix of the last applied action and the policy's, not the policy's action, so it
        is recorded as the controller's (context only, never a label); a lost device, and a person in control
        whose device sent no command, are flagged."""
        assert tick.source is not None and tick.flags is not None  # set by decide just before
        tick.source[((tick.flags & StepFlag.INTERPOLATED) != 0) & (tick.source == SRC_POLICY)] = SRC_HOLD
        tick.flags = tick.flags | np.where(d.device_lost, StepFlag.DEVICE_LOST, 0).astype(np.uint16)
        person = d.state == HUMAN
        if person.any():
            silent = person & ~np.isfinite(tick.operator.raw).all(axis=1) & ~d.device_lost
            tick.flags = tick.flags | np.where(silent, StepFlag.INCOMPLETE_INPUT, 0).astype(np.uint16)

    def _on_clamp(self, r: int, names: str, t: Tick, command_source: np.ndarray) -> None:
        self._event(r, EventKind.SAFETY_CLAMP, t.t_policy, names, "safety", clamp_values(t, r, command_source))
        self.summary.safety_clamps += 1

    def _after_step(self, tick: Tick) -> None:
        """Flag late steps, and steps whose observation the env reported stale or missing (info "sensor_loss" of
        the reply that delivered it); both are excluded from labels."""
        result = tick.env
        assert result is not None and tick.flags is not None  # a stepped tick
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
        behind = getattr(self.student, "late", None)  # a policy that asked ahead and still waited for its chunk
        if behind is not None:
            tick.flags = tick.flags | np.where(behind, StepFlag.LATENCY_EXCEEDED, 0).astype(np.uint16)
        sensor_loss = self._env_info.get("sensor_loss")
        if sensor_loss is not None:
            tick.flags = tick.flags | np.where(np.asarray(sensor_loss, bool), StepFlag.SENSOR_LOSS, 0).astype(np.uint16)

    def _record(self, tick: Tick) -> None:
        """The episode writer's sink: one step per active row."""
        env, op, source = tick.env, tick.operator, tick.source
        assert env is not None and source is not None  # a stepped, decided tick
        align = env.info.get("alignment_error_ms")
        human_cmd = (source == SRC_HUMAN) | (tick.control_state == HUMAN)
        if human_cmd.any():  # the common tick: nobody commands, nothing more to look at
            human_cmd &= np.isfinite(op.raw).all(axis=1)
        extra: dict[str, Any] = {}
        if align is not None:  # a row's stamps come from two replies (t_obs, t_action_apply): keep the worse bound
            align = np.asarray(align, np.float32)
            extra["alignment_error_ms"] = align if self.t_obs_align_ms is None else np.maximum(align, self.t_obs_align_ms)
        chunk_id = getattr(self.student, "chunk_id", None)  # a chunking policy: which chunk each action came from
        if chunk_id is not None and "chunk_id" in self.writer.fields:
            extra["chunk_id"] = np.asarray(chunk_id, np.int64)
            extra["chunk_index"] = np.asarray(self.student.chunk_index, np.int32)
        rows = self.writer.write_tick(tick, expert=self.operator.records_expert_labels, extra=extra,
                                      only=(human_cmd, {"human_command": op.raw, "t_device": op.t_device}))
        self.summary.steps += int(rows.size)
        operated = (source == SRC_HUMAN) | (source == SRC_EXPERT)
        self.summary.human_steps += int((tick.active & operated).sum()) if operated.any() else 0

    def _view(self, step, out, t_policy, op: OperatorTick, d, g, applied, t_apply, source) -> None:
        """Publish the tick as ``last`` (reusing the tick's arrays)."""
        n = self.n
        reasons = [""] * n
        for r in np.flatnonzero(g.level).tolist() if g.level.any() else ():
            reasons[r] = self.gates.trip[r].get("reason", "")
        for r in np.flatnonzero(d.state == REQUESTED).tolist() if (d.state == REQUESTED).any() else ():
            reasons[r] = reasons[r] or self.machine.request_reason[r]  # a request no gate raised (a rewind)
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


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.3g}"
