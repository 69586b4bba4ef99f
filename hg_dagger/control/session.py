"""The session: one control tick, batched over the env's rows, and the run loop around it.

    obs -> student -> gates -> handover -> operator (device, synthetic operator or expert) -> mapping
        -> safety -> env.step -> step dict -> recorder.put

Everything here stays in memory: the recorder's ``put`` is an O(1) hand-off to its writer thread.
The session records action_source, control_state, step_flags, correction windows and events; the store
derives the labels from them (contract.labels), never this module.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hg_dagger import config as config_io
from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.command import COMMAND_DIM, ESTOP, RETURN, TAKEOVER
from hg_dagger.contract.enums import (
    ActionSource,
    CollectionMode,
    ControlState,
    EndReason,
    EventKind,
    StepFlag,
)
from hg_dagger.contract.schema import EpisodeEnd, EpisodeStart, Event, TaskInfo, step_fields
from hg_dagger.control.gates import GateConfig, GateEngine, GateInputs
from hg_dagger.control.handover import (
    EXPERT,
    HUMAN,
    REQUESTED,
    SAFE_STOP,
    SRC_EXPERT,
    SRC_HOLD,
    SRC_HUMAN,
    HandoverConfig,
    HandoverMachine,
    TickInputs,
)
from hg_dagger.control.safety import SafetyConfig, SafetyMonitor
from hg_dagger.errors import ConfigError, EnvError, HgDaggerError

log = logging.getLogger(__name__)

_AUTO = ControlState.AUTONOMOUS.code
_WARNING = ControlState.WARNING.code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OperatorConfig(_Strict):
    """Who answers a handover request."""

    type: Literal["synthetic", "expert", "device"] = "synthetic"
    name: str = Field(default="", description="operator pseudonym stored with episodes and windows")
    # synthetic operator (driven by the task's planner expert through mapping.raw_to_human)
    reaction_delay_steps: int = Field(default=5, ge=0)
    noise_std: float = Field(default=0.0, ge=0.0)
    availability: float = Field(default=1.0, ge=0.0, le=1.0)
    return_after_steps: int | None = Field(default=None, ge=1)
    # a real device: a name in configs/devices or a path
    device: str | None = None


class RobotConfig(_Strict):
    """Run on a robot behind ``hg-dagger bridge serve`` instead of a local simulator.

    The token stays out of the config: it comes from ``token_file`` or the environment variable
    HG_DAGGER_BRIDGE_TOKEN. The heartbeat timeout is the robot's (``serve --heartbeat-timeout``);
    the client heartbeats at a quarter of it."""

    host: str = Field(default="127.0.0.1", min_length=1, description="robot bridge address (loopback by default)")
    port: int = Field(default=7650, ge=1, le=65535)
    token_file: str | None = Field(default=None, description="file holding the shared token; default: the "
                                   "environment variable HG_DAGGER_BRIDGE_TOKEN")
    connect_timeout_s: float = Field(default=2.0, gt=0)
    request_timeout_s: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=5, ge=0, description="reconnect attempts before the run fails")
    clock_pings: int = Field(default=8, ge=1, description="ping/pong exchanges per clock sync")
    clock_resync_s: float = Field(default=5.0, gt=0)
    resume_on_reconnect: bool = True

    @model_validator(mode="before")
    @classmethod
    def _no_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            raise ValueError("keep the bridge token out of the config: give robot.token_file, or set the "
                             "environment variable HG_DAGGER_BRIDGE_TOKEN")
        return data

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


class RunConfig(_Strict):
    """configs/run/<name>.yaml (kind: run): one human-gated collection run."""

    task: str
    scene: str = ""
    num_envs: int = Field(default=1, ge=1)
    episodes: int = Field(default=10, ge=1)
    seed: int = 0
    gates: str | GateConfig = Field(default="", description="a gate config: name in configs/gates, a path, or inline; "
                                    "empty = configs/gates/<task>.yaml")
    handover: HandoverConfig = Field(default_factory=HandoverConfig)
    safety: SafetyConfig = Field(default_factory=SafetyConfig)
    operator: OperatorConfig = Field(default_factory=OperatorConfig)
    calibrate_steps: int = Field(default=0, ge=0, description="autonomous steps to calibrate the confidence gate first")
    latency_budget_ms: float | None = Field(default=None, gt=0, description="obs-to-apply latency above which a step "
                                            "is flagged latency_exceeded (excluded from labels)")
    realtime: bool = Field(default=False, description="pace ticks at the task's control rate (live devices)")
    robot: RobotConfig | None = Field(default=None, description="drive a robot over the bridge instead of a "
                                      "local simulator")

    @model_validator(mode="after")
    def _one_env(self) -> RunConfig:
        if self.handover.wait == "pause" and self.num_envs != 1:
            raise ValueError("handover.wait 'pause' stops the simulator, which a batch of envs cannot do per env: "
                             "use num_envs 1, or wait 'hold' / 'policy'")
        if self.operator.type == "device" and self.num_envs != 1:
            raise ValueError("operator.type 'device': a live device drives one env, set num_envs 1")
        return self


def load_gate_config(ref: str | GateConfig, task: str) -> GateConfig:
    """A GateConfig from an inline model, a path, or a name in configs/gates/ (default: the task's)."""
    if isinstance(ref, GateConfig):
        return ref
    ref = ref or task
    path = Path(ref)
    if not path.suffix:
        path = Path(config_io.CONFIG_DIR, "gates", f"{ref}.yaml")
        if not path.is_file():
            path = Path(config_io.CONFIG_DIR, "gates", "default.yaml")
    return config_io.load(path, GateConfig)


def load_run_config(path: str | Path | None, task: str | None = None, **overrides) -> RunConfig:
    """The run config at ``path``, or configs/run/<task>.yaml, or defaults; ``overrides`` win (None = keep)."""
    data: dict[str, Any] = {}
    if path is None and task is not None:
        cand = Path(config_io.CONFIG_DIR, "run", f"{task}.yaml")
        path = cand if cand.is_file() else None
    source = str(path) if path else "run options"
    if path is not None:
        data = config_io.read_yaml(path)
        data.pop("kind", None)
    if task is not None:
        data["task"] = task
    if any(v is not None for v in overrides.values()) and path is not None:
        source = f"{path} with options {', '.join(k for k, v in overrides.items() if v is not None)}"
    for key, value in overrides.items():
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            if target.get(p) is None:
                target[p] = {}
            if not isinstance(target[p], dict):
                raise ConfigError(f"{source}: key {p!r} must be a mapping to take option {key}")
            target = target[p]
        target[leaf] = value
    return config_io.validate(RunConfig, data, source=source)


@dataclass
class _OperatorTick:
    """What the operators said this tick, per env row."""

    motion: np.ndarray  # float32 [N, 7] processed command (NaN: none)
    raw: np.ndarray  # float32 [N, 7] raw device value, recorded as human_command
    t_device: np.ndarray  # int64 [N]
    engaged: np.ndarray  # bool [N]
    device_ok: np.ndarray  # bool [N] the device (or expert) answered
    takeover: np.ndarray  # bool [N]
    ret: np.ndarray  # bool [N] return button
    expert_action: np.ndarray  # float32 [N, A] expert operator's labels (NaN: none)
    expert_valid: np.ndarray  # bool [N]


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
    stopped_by: str = ""  # "estop" when the run ended on an emergency stop
    episode_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Session:
    """Runs a student on a VecEnv with gates, handover, an operator and the safety monitor, and records
    every step, event and correction window to a store recorder."""

    def __init__(self, env, student, recorder, *, gates: GateEngine, handover: HandoverMachine,
                 safety: SafetyMonitor, operators: list | None = None, expert=None,
                 operator_kind: str = "synthetic", person_available: bool = True, operator_name: str = "",
                 latency_budget_ms: float | None = None, scene: str = "", seed: int = 0, realtime: bool = False,
                 gate_config_extra: dict[str, Any] | None = None, episode_extra: dict[str, Any] | None = None):
        self.env, self.student, self.rec = env, student, recorder
        self.mapping = env.mapping
        self.n = env.num_envs
        self.gates, self.machine, self.safety = gates, handover, safety
        if operators is not None and len(operators) != self.n:
            raise ConfigError(f"{len(operators)} operator devices for {self.n} envs: give one per env")
        self.operators = list(operators) if operators is not None else [None] * self.n
        self._mark_synthetic()
        self.expert = expert
        self.operator_kind = operator_kind
        if operator_kind in ("expert", "synthetic") and expert is None:
            raise ConfigError(f"operator {operator_kind!r} needs the task's expert")
        self.person_available = person_available
        self.operator_name = operator_name
        self.latency_budget_ns = None if latency_budget_ms is None else int(latency_budget_ms * 1e6)
        self.scene = scene
        self.seed = seed
        self.realtime = realtime
        self.gate_config_extra = gate_config_extra or {}
        self.episode_extra = episode_extra or {}
        self.fields = step_fields(self.mapping.obs_spec(), self.mapping.action_dim)
        a = self.mapping.action_dim
        self._operator_raw = np.full((self.n, a), np.nan, np.float32)  # synthetic operator's planner label per row
        self._prev_device_ok = np.ones(self.n, bool)
        self._prev_engaged = np.zeros(self.n, bool)
        self.obs: dict[str, np.ndarray] | None = None
        self.signals: dict[str, np.ndarray] = {}
        self.t_obs = np.full(self.n, NO_TIME, np.int64)
        self.t_obs_align_ms: np.ndarray | None = None  # clock-mapping error of t_obs (robot bridge)
        self.eids: list[str | None] = [None] * self.n
        self.ep_step = np.zeros(self.n, np.int64)
        self.ep_seed: list[int | None] = [None] * self.n
        self.summary = RunSummary()
        self._started = 0
        self._target = 0
        self._bridge_info: dict[str, Any] = {}

    def add_synthetic_operators(self, cfg: OperatorConfig) -> None:
        """One synthetic operator per env row, driven by the expert's label for that row (raw action ->
        mapping.raw_to_human), with the configured reaction delay, noise and availability."""
        from hg_dagger.devices import SyntheticOperator

        def command_fn(_obs_row, r: int):
            return self.mapping.raw_to_human(self._operator_raw[r])

        self.operators = [
            SyntheticOperator(lambda o, r=r: command_fn(o, r), reaction_delay_steps=cfg.reaction_delay_steps,
                              noise_std=cfg.noise_std, availability=cfg.availability, seed=self.seed * 1000 + r,
                              return_after_steps=cfg.return_after_steps)
            for r in range(self.n)
        ]
        self._mark_synthetic()

    def _mark_synthetic(self) -> None:
        from hg_dagger.devices import SyntheticOperator

        self._synthetic = [isinstance(op, SyntheticOperator) for op in self.operators]

    # ---- external controls ----------------------------------------------------------------

    def estop(self, source: str = "app", reason: str = "") -> None:
        """Emergency stop from the keyboard, the app's button or any other thread."""
        self.safety.request_estop(source, reason)

    # ---- calibration -----------------------------------------------------------------------

    def calibrate(self, steps: int) -> dict[str, float] | None:
        """Run the student alone for ``steps`` env steps (not recorded; the safety monitor still applies)
        and set the confidence gate's thresholds by the quantile rule."""
        obs, _ = self.env.reset(seed=self.seed + 10_000)
        self.safety.reset(np.arange(self.n))
        samples = []
        for _ in range(max(1, steps // self.n)):
            out = self.student.act(obs)
            samples.append(np.asarray(out.uncertainty, np.float32))
            res = self.safety.apply(out.action, obs)
            r = self.env.step(res.applied)
            self.safety.commit(res.applied)
            self.safety.reset(np.flatnonzero(r.info.get("episode_start", np.zeros(self.n, bool))))
            obs = r.obs
        self.obs = None  # the run starts from a fresh reset
        return self.gates.calibrate(np.concatenate(samples))

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
        self.summary.stopped_by = ""
        obs, info = self.env.reset(seed=[self.seed + self._started + i for i in range(self.n)])
        self._take_obs(obs, info, np.ones(self.n, bool))
        self.safety.reset(np.arange(self.n))
        self._prev_device_ok = np.ones(self.n, bool)
        for r in range(self.n):
            self._begin(r, seed=self.seed + self._started)

    @property
    def running(self) -> bool:
        return any(e is not None for e in self.eids) and not self.summary.stopped_by

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
        self._bridge_info = info

    def _begin(self, r: int, *, seed: int | None) -> None:
        if self._started >= self._target:
            self.eids[r] = None
            return
        m = self.mapping
        gate_config = {
            **self.gates.describe(),
            "policy_version": self.student.version,
            "person_available": bool(self.person_available),
            "operator": {"kind": self.operator_kind, "name": self.operator_name},
            "handover": self.machine.cfg.model_dump(mode="json"),
            "safety": self.safety.config.model_dump(mode="json"),
            **self.gate_config_extra,
        }
        start = EpisodeStart(
            task=TaskInfo(task_id=m.task_id, task_version=m.task_version, language_instruction=m.language_instruction,
                          scene_id=self.scene, success_condition=m.success_condition),
            policy_version=self.student.version, mode=CollectionMode.HUMAN_GATED, operator=self.operator_name,
            control_hz=m.control_hz, action_alignment=m.action_alignment, mapping=m.as_metadata(),
            mapping_hash=m.hash, gate_config=gate_config,
            initial_state={"seed": seed} if seed is not None else {}, env_index=r, extra=dict(self.episode_extra),
        )
        self.eids[r] = self.rec.begin_episode(start, self.fields)
        self.ep_step[r] = 0
        self._started += 1
        self.summary.episode_ids.append(self.eids[r])
        self.machine.reset([r])
        self.gates.rearm([r])
        if self.expert is not None:
            self.expert.reset([r], {k: v[r : r + 1] for k, v in self.obs.items()}, {})
        self._release_operator(r)

    def _event(self, r: int, kind: EventKind, t_ns: int, reason: str = "", source: str = "",
               values: dict[str, Any] | None = None) -> None:
        if self.eids[r] is not None:
            self.rec.event(self.eids[r], Event(kind=kind, step=int(self.ep_step[r]), t_ns=int(t_ns), reason=reason,
                                               source=source, values=values or {}))

    # ---- one tick --------------------------------------------------------------------------

    def tick(self) -> None:
        n, m = self.n, self.mapping
        obs = self.obs
        active = np.array([e is not None for e in self.eids])

        # 1. the student (it keeps computing during human control)
        out = self.student.act(obs)
        t_policy = now_ns()
        policy = np.asarray(out.action, np.float32)
        unc = np.asarray(out.uncertainty, np.float32)

        # 2. the operator: device / synthetic operator / expert
        state_before = self.machine.state.copy()
        op = self._poll_operators(active, state_before)
        self._device_events(op.device_ok, active, t_policy)
        bridge_estop = self._bridge_info.get("estop")
        if bridge_estop is not None and np.any(bridge_estop):
            self.safety.request_estop("bridge", "robot-side e-stop")
        estop = np.full(n, self.safety.estopped, bool)
        engaged, expert_action, expert_valid = op.engaged, op.expert_action, op.expert_valid

        # 3. gates (only where the policy is in control); grabbing a hold-to-intervene device is a takeover
        armed = (state_before == _AUTO) | (state_before == _WARNING)
        grabbed = engaged & ~self._prev_engaged & armed if self.operator_kind != "expert" else np.zeros(n, bool)
        self._prev_engaged = engaged
        gate_in = GateInputs(step=self.ep_step, t_ns=t_policy, action=policy, uncertainty=unc, obs=obs,
                             signals=self.signals, takeover=op.takeover | grabbed,
                             prev_applied=self.safety.prev, prev_ok=self.safety.prev_ok)
        g = self.gates.update(gate_in, armed & active)
        for r, ev in g.events:
            self._event(r, ev.kind, ev.t_ns, ev.reason, ev.source, ev.values)
            if ev.kind == EventKind.GATE_TRIGGER:
                self.summary.gate_triggers += int(self.eids[r] is not None)
        self.gates.observe_autonomous(unc[armed & active])

        # 4. handover
        if self.operator_kind == "expert":
            op_action = expert_action
        else:
            has_cmd = np.isfinite(op.motion).all(axis=1)
            op_action = np.full((n, m.action_dim), np.nan, np.float32)
            if has_cmd.any():
                op_action[has_cmd] = m.human_to_raw(op.motion[has_cmd])
        tol = self.machine.cfg.auto_return.agree_tol
        with np.errstate(invalid="ignore"):
            agree = np.all(np.abs(policy - op_action) <= tol, axis=1)
        d = self.machine.update(TickInputs(
            step=self.ep_step, t_ns=t_policy, gate_level=g.level, engaged=engaged, device_ok=op.device_ok,
            return_button=op.ret, agree=agree, confident=self.gates.confident(), estop=estop,
            gate_trip=self.gates.trip, t_warn=self.gates.t_warn, t_gate=self.gates.t_gate))
        self.gates.rearm(d.rearm)
        self._transition_events(d, t_policy)

        # 5. the command each row applies, smoothed at switches
        target = policy.copy()
        op_rows = (d.source == SRC_HUMAN) | (d.source == SRC_EXPERT)
        target[op_rows] = op_action[op_rows]
        hold = d.source == SRC_HOLD
        if hold.any():
            target[hold] = self.safety.hold()[hold]
        command, flags = self.machine.smooth(target, self.safety.prev, self.safety.prev_ok)

        if d.paused.any():  # the simulator waits for the person: nothing is applied or recorded
            self.summary.paused_ticks += 1
            return

        # 6. safety, then the env
        res = self.safety.apply(command, obs)
        applied = res.applied
        source = d.source.copy()
        source[res.changed] = SRC_HOLD
        flags = flags | np.where(res.changed, StepFlag.CLAMPED, 0).astype(np.uint16)
        flags |= np.where(d.device_lost, StepFlag.DEVICE_LOST, 0).astype(np.uint16)
        for r in np.flatnonzero(res.changed & active):
            names = [name for name, hit in res.reasons if hit[r]]
            self._event(int(r), EventKind.SAFETY_CLAMP, t_policy, "+".join(names), "safety",
                        {"command": command[r].tolist(), "applied": applied[r].tolist(),
                         "command_source": ActionSource.from_code(int(d.source[r])).value})
            self.summary.safety_clamps += 1
        try:
            result = self.env.step(applied)
        except EnvError as exc:
            if getattr(exc, "code", None) != "state":  # ErrorCode.STATE: the robot holds or is e-stopped
                raise
            self._robot_refused(str(exc), t_policy)  # the action never moved the robot: nothing to record
            return
        self.safety.commit(applied)
        info = result.info
        t_apply = np.asarray(info.get("t_action_apply", np.full(n, now_ns())), np.int64)
        self.machine.note_applied(t_apply)
        if self.latency_budget_ns is not None:
            late = (t_apply - self.t_obs) > self.latency_budget_ns
            flags |= np.where(late, StepFlag.LATENCY_EXCEEDED, 0).astype(np.uint16)
        sensor_loss = info.get("sensor_loss")
        if sensor_loss is not None:
            flags |= np.where(np.asarray(sensor_loss, bool), StepFlag.SENSOR_LOSS, 0).astype(np.uint16)

        # 7. record
        success = np.asarray(info.get("success", np.zeros(n, bool)), bool)
        term, trunc = np.asarray(result.terminated, bool), np.asarray(result.truncated, bool)
        align = info.get("alignment_error_ms")
        transport = info.get("transport_ns")
        human_cmd = ((source == SRC_HUMAN) | (d.state == HUMAN)) & np.isfinite(op.raw).all(axis=1)
        cols = {
            "t_obs": self.t_obs, "t_action_apply": t_apply, "policy_action": policy,
            "policy_confidence": np.asarray(out.confidence, np.float32), "policy_uncertainty": unc,
            "applied_action": applied, "action_source": source, "control_state": d.state, "step_flags": flags,
            "reward": np.asarray(result.reward, np.float32), "terminated": term, "truncated": trunc, "success": success,
            **{f"obs/{k}": v for k, v in obs.items()},
        }
        if align is not None:  # a row's stamps come from two replies (t_obs, t_action_apply): keep the worse bound
            align = np.asarray(align, np.float32)
            cols["alignment_error_ms"] = align if self.t_obs_align_ms is None else np.maximum(align, self.t_obs_align_ms)
        if transport is not None:
            cols["transport_ns"] = np.asarray(transport, np.int64)
        if self.operator_kind == "expert":
            cols.update(expert_action=expert_action, expert_valid=expert_valid, expert_used=source == SRC_EXPERT)
        rows = {k: list(v) for k, v in cols.items()}  # one C loop per field instead of one index per row and field
        common = {"t_policy": t_policy, "inference_ns": int(out.inference_ns), "valid": True}
        for r in np.flatnonzero(active).tolist():
            step = {k: v[r] for k, v in rows.items()}
            step.update(common)
            if human_cmd[r]:
                step["human_command"] = op.raw[r]
                step["t_device"] = op.t_device[r]
            self.rec.put(self.eids[r], step)
        self.summary.steps += int(active.sum())
        self.summary.human_steps += int((active & ((source == SRC_HUMAN) | (source == SRC_EXPERT))).sum())
        self.ep_step[active] += 1

        # 8. episode ends: env-driven, or a SAFE_STOP; an e-stop ends the run
        self._episode_ends(d.state == SAFE_STOP, term, trunc, success, active, result)

    def _episode_ends(self, stopped, term, trunc, success, active, result) -> None:
        """End finished episodes, reset their rows with fresh seeds and begin the next ones."""
        n, info = self.n, result.info
        ended = (term | trunc | stopped) & active
        for r in np.flatnonzero(ended):
            r = int(r)
            if stopped[r]:
                reason = EndReason.SAFETY_STOP
            elif term[r]:
                reason = EndReason.SUCCESS if success[r] else EndReason.FAILURE
            else:
                reason = EndReason.TIMEOUT
            self._end(r, reason, bool(success[r]))
        new_episode = np.asarray(info.get("episode_start", term | trunc), bool)
        if self.safety.estopped:
            self._stop_all()
            self._take_obs(result.obs, info, new_episode)
            if hasattr(self.env, "estop"):  # latch the robot's own e-stop too (robot bridge)
                self.env.estop(f"{self.safety.estop_source}: {self.safety.estop_reason or 'e-stop'}")
            return
        # rows that start a new episode are reset with a seed of their own (recorded for replay)
        begin = [int(r) for r in np.flatnonzero(ended)][: max(0, self._target - self._started)]
        obs_next, info_next = result.obs, info
        restarted = new_episode.copy()
        if begin:
            seeds = [self.seed + self._started + k for k in range(len(begin))]
            obs_next, reset_info = self.env.reset(seed=seeds, env_ids=begin)
            rows = np.zeros(n, bool)
            rows[begin] = True
            t_now = np.full(n, now_ns(), np.int64)
            info_next = {**info, "t_obs": np.where(rows, reset_info.get("t_obs", t_now), info.get("t_obs", t_now))}
            if "alignment_error_ms" in reset_info:
                info_next["alignment_error_ms"] = np.where(rows, reset_info["alignment_error_ms"],
                                                           info.get("alignment_error_ms", reset_info["alignment_error_ms"]))
            restarted |= rows
        self._take_obs(obs_next, info_next, restarted)
        self.safety.reset(np.flatnonzero(restarted))
        for r in begin:
            self._begin(r, seed=self.seed + self._started)

    def _stop_all(self) -> None:
        """E-stop: end every open episode as a safety stop and open no new ones."""
        self.summary.stopped_by = "estop"
        self.summary.estops += 1
        for r in range(self.n):
            if self.eids[r] is not None:
                self._end(r, EndReason.SAFETY_STOP, False)
        self._target = self._started

    def _robot_refused(self, message: str, t_ns: int) -> None:
        """The robot refused to move (its own e-stop or safe stop): an e-stop from the bridge."""
        self.safety.request_estop("bridge", message)
        for r in range(self.n):
            if self.eids[r] is not None:
                self._event(r, EventKind.ESTOP, t_ns, message, "bridge",
                            {"from_state": ControlState.from_code(int(self.machine.state[r])).value})
        self._stop_all()

    def _end(self, r: int, reason: EndReason, success: bool) -> None:
        eid = self.eids[r]
        windows, outcome = self.machine.finish(r, episode_id=eid, num_steps=int(self.ep_step[r]), success=success,
                                               end_reason=reason)
        flags = []
        if self.safety.estopped:
            flags.append("estop")
        self.rec.end_episode(eid, EpisodeEnd(end_reason=reason, task_success=success, recovery_outcome=outcome,
                                             num_steps=int(self.ep_step[r]), quality_flags=flags), windows)
        self.summary.episodes += 1
        self.summary.successes += int(success)
        self.summary.windows += len(windows)
        self.eids[r] = None
        self._release_operator(r)

    # ---- helpers ---------------------------------------------------------------------------

    def _poll_operators(self, active: np.ndarray, state_before: np.ndarray) -> _OperatorTick:
        """This tick's operator input per env row: the expert's labels, or each device's command."""
        n, a = self.n, self.mapping.action_dim
        op = _OperatorTick(
            motion=np.full((n, COMMAND_DIM), np.nan, np.float32), raw=np.full((n, COMMAND_DIM), np.nan, np.float32),
            t_device=np.full(n, NO_TIME, np.int64), engaged=np.zeros(n, bool), device_ok=np.ones(n, bool),
            takeover=np.zeros(n, bool), ret=np.zeros(n, bool), expert_action=np.full((n, a), np.nan, np.float32),
            expert_valid=np.zeros(n, bool))
        if self.operator_kind == "expert":
            op.expert_action, op.expert_valid = self._query_expert(np.arange(n))
            op.engaged[:] = True
            op.device_ok = op.expert_valid.copy()
            return op
        if self.operator_kind == "synthetic":
            want = np.flatnonzero(active & ((state_before == REQUESTED) | (state_before == HUMAN)))
            self._operator_raw[:] = np.nan
            if want.size:
                self._operator_raw[want] = self._query_expert(want)[0][want]
        obs = self.obs
        for r, dev in enumerate(self.operators):
            if dev is None:
                op.device_ok[r] = False
                continue
            if self._synthetic[r]:  # the synthetic operator watches the scene
                requested = bool(state_before[r] == REQUESTED)
                row = {k: v[r : r + 1] for k, v in obs.items()} if requested or dev.engaged else None
                dev.observe(row, requested)
                if not dev.engaged:  # nothing to say until it answers a request
                    op.device_ok[r] = dev.connected
                    continue
            cmd = dev.poll() if dev.connected else None
            if cmd is None:
                op.device_ok[r] = False
                continue
            op.motion[r], op.raw[r], op.t_device[r] = cmd.motion, cmd.raw, cmd.t_device
            op.engaged[r] = cmd.engaged
            op.takeover[r] = TAKEOVER in cmd.buttons
            op.ret[r] = RETURN in cmd.buttons
            if ESTOP in cmd.buttons:
                self.safety.request_estop(f"device:{cmd.device_id}", "device e-stop button")
        return op

    def _query_expert(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expert labels for ``rows`` in raw space, as (action [N, A], valid [N]) indexed by env row."""
        from hg_dagger.experts import query_expert

        q = query_expert(self.expert, {k: v[rows] for k, v in self.obs.items()}, rows, self.mapping)
        return q.scatter(rows, self.n)

    def _release_operator(self, r: int) -> None:
        """A synthetic operator lets go when control leaves it (a person simply releases the device)."""
        from hg_dagger.devices import SyntheticOperator

        op = self.operators[r]
        if isinstance(op, SyntheticOperator):
            op.release()

    def _device_events(self, device_ok: np.ndarray, active: np.ndarray, t_ns: int) -> None:
        if self.operator_kind == "expert":
            return
        for r in np.flatnonzero(device_ok != self._prev_device_ok):
            r = int(r)
            op = self.operators[r]
            kind = EventKind.DEVICE_CONNECT if device_ok[r] else EventKind.DEVICE_DISCONNECT
            self._event(r, kind, t_ns, source=getattr(op, "device_id", "") if op is not None else "",
                        values={"control_state": ControlState.from_code(int(self.machine.state[r])).value})
        self._prev_device_ok = device_ok.copy()

    def _transition_events(self, d, t_ns: int) -> None:
        in_control = (HUMAN, EXPERT)
        for r, frm, to, why in d.transitions:
            if self.eids[r] is None:
                continue
            if to in in_control:
                self.summary.context_switches += 1
                self._event(r, EventKind.HANDOVER_START, t_ns, why, self.operator_kind)
            if frm in in_control:
                self._event(r, EventKind.HANDOVER_END, t_ns, why, self.operator_kind)
                self._release_operator(r)
            if to == SAFE_STOP:
                kind = EventKind.ESTOP if why == "estop" else EventKind.NOTE
                src = self.safety.estop_source if why == "estop" else "handover"
                self._event(r, kind, t_ns, why if why != "estop" else (self.safety.estop_reason or "estop"), src,
                            {"from_state": ControlState.from_code(frm).value})


# --------------------------------------------------------------------------------------------
# Building a session from a run config
# --------------------------------------------------------------------------------------------


def make_run_env(cfg: RunConfig):
    """The run's env: the task's local simulator, or, when ``cfg.robot`` is set, the robot behind
    ``hg-dagger bridge serve`` (BridgeEnv refuses a robot serving another task or mapping)."""
    if cfg.robot is None:
        from hg_dagger.envs import make_env

        return make_env(cfg.task, num_envs=cfg.num_envs, seed=cfg.seed)
    from hg_dagger.envs.bridge import BridgeEnv, load_token

    rc = cfg.robot
    env = BridgeEnv(cfg.task, host=rc.host, port=rc.port, token=load_token(rc.token_file),
                    connect_timeout_s=rc.connect_timeout_s, request_timeout_s=rc.request_timeout_s,
                    max_retries=rc.max_retries, clock_pings=rc.clock_pings, clock_resync_s=rc.clock_resync_s,
                    resume_on_reconnect=rc.resume_on_reconnect)
    if env.num_envs != cfg.num_envs:
        log.info("robot bridge %s serves %d env(s); the run follows it (run config num_envs %d is for simulation)",
                 rc.endpoint, env.num_envs, cfg.num_envs)
    return env


def _follow_robot(cfg: RunConfig, env) -> RunConfig:
    """On a robot the batch size is the robot's (``bridge serve --num-envs``): re-check the run config with it."""
    if cfg.robot is None or env.num_envs == cfg.num_envs:
        return cfg
    data = {**cfg.model_dump(exclude_unset=True), "num_envs": env.num_envs}
    return config_io.validate(RunConfig, data, source=f"run config with the robot's num_envs {env.num_envs}")


def _robot_metadata(env) -> dict[str, Any]:
    """Which robot recorded the episode (stored in EpisodeStart.extra); empty for a local simulator."""
    from hg_dagger.envs.bridge.client import BridgeEnv

    if not isinstance(env, BridgeEnv):
        return {}
    return {"robot_bridge": {"endpoint": f"{env.host}:{env.port}", "instance": env.status().get("instance", "")}}


def build_session(cfg: RunConfig, recorder, student, *, env=None, expert=None, operators: list | None = None) -> Session:
    """Wire env, gates, handover, safety and the operator named by ``cfg`` around ``student``."""
    env = env if env is not None else make_run_env(cfg)
    cfg = _follow_robot(cfg, env)
    m = env.mapping
    gate_cfg = load_gate_config(cfg.gates, cfg.task)
    if gate_cfg.task and gate_cfg.task != cfg.task:
        raise ConfigError(f"gate config {gate_cfg.name!r} is for task {gate_cfg.task!r}, the run is for {cfg.task!r}")
    gates = GateEngine(gate_cfg, num_envs=env.num_envs, step_dt=m.step_dt or 1.0 / m.control_hz, action_dim=m.action_dim)
    op = cfg.operator
    kind = op.type
    machine = HandoverMachine(cfg.handover, num_envs=env.num_envs, action_dim=m.action_dim,
                              step_dt=m.step_dt or 1.0 / m.control_hz, operator="expert" if kind == "expert" else "human",
                              operator_name=op.name or kind)
    safety = SafetyMonitor(cfg.safety, num_envs=env.num_envs, action_dim=m.action_dim)
    if expert is None and kind in ("synthetic", "expert"):
        from hg_dagger.experts import make_expert

        expert = make_expert(cfg.task, kind="planner", mapping=m)
    person = {"synthetic": op.availability > 0, "expert": False, "device": True}[kind]
    if kind == "device" and operators is None:
        from hg_dagger.devices import make_device

        if env.num_envs != 1:
            raise ConfigError(f"a live device drives one env; the env has {env.num_envs}")
        if not op.device:
            raise ConfigError("operator.type 'device' needs operator.device (a name in configs/devices or a path)")
        dev = make_device(op.device)
        dev.connect()
        operators = [dev]
    session = Session(env, student, recorder, gates=gates, handover=machine, safety=safety, operators=operators,
                      expert=expert, operator_kind=kind, person_available=person, operator_name=op.name or kind,
                      latency_budget_ms=cfg.latency_budget_ms, scene=cfg.scene or gate_cfg.scene, seed=cfg.seed,
                      realtime=cfg.realtime,
                      gate_config_extra={"operator_config": op.model_dump(mode="json")},
                      episode_extra=_robot_metadata(env))
    if kind == "synthetic" and operators is None:
        session.add_synthetic_operators(op)
    return session


def run_gated(cfg: RunConfig, store_url: str, *, student_path: str | None = None, progress: bool = True) -> RunSummary:
    """A whole human-gated collection run: open (or create) the store, load the student (a fresh,
    untrained one when no checkpoint is given), calibrate if asked, record ``cfg.episodes`` episodes."""
    env = make_run_env(cfg)  # bad task, robot or checkpoint: fail before the store (and before loading torch)
    try:
        cfg = _follow_robot(cfg, env)
        from hg_dagger.policy import Student
        from hg_dagger.store import EpisodeStore

        student = Student.load(student_path, env.mapping) if student_path else Student.create(env.mapping, seed=cfg.seed)
        try:
            store = EpisodeStore.open(store_url, mode="a")
        except HgDaggerError:  # a missing store is created; a damaged one fails again below
            if Path(str(store_url)).exists() and any(Path(str(store_url)).iterdir()):
                raise
            store = EpisodeStore.create(store_url)
    except BaseException:
        env.close()
        raise
    rec = store.recorder()
    try:
        session = build_session(cfg, rec, student, env=env)
        if cfg.calibrate_steps:
            cal = session.calibrate(cfg.calibrate_steps)
            log.info("confidence gate calibrated: %s", cal if cal else "too few samples, thresholds unchanged")
        summary = session.run(cfg.episodes, progress=progress)
    finally:
        rec.close()
        env.close()
    return summary
