"""Who answers a handover request: one interface the session's tick calls without knowing which it has.

    tick = operator.poll(obs, state, active)   # once per tick: what every env row's operator says
    operator.release(row)                      # control left the operator in this row
    operator.begin(row, obs_row)               # a new episode starts in this row
    operator.close()

Implementations: ``DeviceOperator`` (any hg_dagger.devices.Device per row: gamepad, SpaceMouse, the
keyboard the app feeds from its key events), ``SyntheticOperators`` (the planner-driven synthetic
operator standing in for a person), ``ExpertOperator`` (the planner answers: ``run --operator expert``)
and ``NoOperator`` (nobody answers: student-only runs). What differs between them is data on the
instance (``role``, ``person_available``, ``records_expert_labels``, ``has_devices``), so the tick
never branches on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.command import COMMAND_DIM, ESTOP, RETURN, TAKEOVER
from hg_dagger.contract.labels import planner_certifications
from hg_dagger.control.handover import AUTO, HUMAN, REQUESTED, WARNING
from hg_dagger.control.human_model import (
    HumanProfile,
    RequestFact,
    draw_answer,
    draw_correction_s,
    draw_switch_s,
)
from hg_dagger.devices import CommandPipelines, SyntheticConfig, SyntheticOperatorRows, make_device
from hg_dagger.errors import ConfigError
from hg_dagger.experts import query_expert


@dataclass
class OperatorTick:
    """What the operators said this tick, per env row."""

    motion: np.ndarray  # float32 [N, 7] processed command (NaN: none)
    raw: np.ndarray  # float32 [N, 7] raw device value, recorded as human_command
    t_device: np.ndarray  # int64 [N]
    engaged: np.ndarray  # bool [N]
    device_ok: np.ndarray  # bool [N] the device (or expert) answered
    takeover: np.ndarray  # bool [N] takeover button, or a hold-to-intervene device grabbed while the policy drives
    ret: np.ndarray  # bool [N] return button
    action: np.ndarray  # float32 [N, A] the operator's command in the raw action space (NaN: none)
    expert_action: np.ndarray  # float32 [N, A] expert operator's labels (NaN: none)
    expert_valid: np.ndarray  # bool [N]
    estop_by: str = ""  # a device whose e-stop button is pressed ("" = none)
    decline: np.ndarray | None = None  # bool [N] the operator lets the student go on (None: nowhere)

    @classmethod
    def empty(cls, n: int, action_dim: int) -> OperatorTick:
        return cls(motion=np.full((n, COMMAND_DIM), np.nan, np.float32),
                   raw=np.full((n, COMMAND_DIM), np.nan, np.float32), t_device=np.full(n, NO_TIME, np.int64),
                   engaged=np.zeros(n, bool), device_ok=np.ones(n, bool), takeover=np.zeros(n, bool),
                   ret=np.zeros(n, bool), action=np.full((n, action_dim), np.nan, np.float32),
                   expert_action=np.full((n, action_dim), np.nan, np.float32), expert_valid=np.zeros(n, bool))

    def read_only(self) -> OperatorTick:
        """The same answer with its arrays write-protected, so one can be handed out tick after tick."""
        for v in self.__dict__.values():
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
        return self


class Operator:
    """Base of every operator. Subclasses set the class attributes and implement ``poll``."""

    kind: str = "none"  # metadata: device | synthetic | expert | none
    role: Literal["human", "expert"] = "human"  # who holds control in the handover machine
    person_available: bool = False  # stored in EpisodeStart.gate_config
    records_expert_labels: bool = False  # the step records carry expert_action / expert_valid / expert_used
    has_devices: bool = False  # device connect / disconnect events are recorded

    def __init__(self, num_envs: int, mapping, name: str = ""):
        self.n, self.mapping = num_envs, mapping
        self.name = name or self.kind
        self.certifier = ""  # the planner that certifies this operator's windows (planner_auto); "" = none

    def certify(self, episode_id: str, windows: list) -> list:
        """Certifications recorded with an episode's windows: planner_auto ones when a run config asked for them."""
        return planner_certifications(episode_id, windows, self.certifier) if self.certifier else []

    def poll(self, obs: dict[str, np.ndarray] | None, state: np.ndarray, active: np.ndarray) -> OperatorTick:
        """This tick's answer per row; ``state`` is the handover state before the tick, ``active`` the
        rows with an open episode."""
        tick = OperatorTick.empty(self.n, self.mapping.action_dim)
        tick.device_ok[:] = False
        return tick

    def poll_idle(self) -> OperatorTick:
        """Between episodes: read the devices (for the operator's panel and the e-stop button) without obs."""
        return self.poll({}, np.full(self.n, AUTO, np.uint8), np.zeros(self.n, bool))

    def begin(self, row: int, obs_row: dict[str, np.ndarray]) -> None:
        """A new episode starts in ``row``."""
        self.release(row)

    def release(self, row: int) -> None:
        """Control left the operator in ``row`` (a person simply lets go: nothing to do)."""

    def close(self) -> None:
        """Disconnect what this operator opened."""

    def device_id(self, row: int) -> str:
        return ""

    def key(self, key: str, down: bool) -> bool:
        """A key event from the app's window; False when no keyboard device takes keys."""
        return False

    def release_keys(self) -> None:
        """The window lost focus: let go of every held key."""

    def device_state(self, row: int) -> dict[str, Any]:
        """What the operator's panel shows for ``row`` (fields of control.live.DeviceState)."""
        return {"kind": self.kind, "device_id": self.device_id(row)}


class NoOperator(Operator):
    """Nobody answers: the student alone (evaluation runs)."""

    kind = "none"


class DeviceOperator(Operator):
    """One input device per env row (None = no device for that row)."""

    kind = "device"
    person_available = True
    has_devices = True

    def __init__(self, devices: list, mapping, name: str = ""):
        super().__init__(len(devices), mapping, name)
        self.devices = list(devices)
        self._prev_engaged = np.zeros(self.n, bool)
        self._last: list[Any] = [None] * self.n  # last HumanCommand per row, for the panel

    def _read(self, r: int, dev, obs, state) -> Any:
        """One row's command (None: no answer)."""
        return dev.poll() if dev.connected else None

    def _answering(self, r: int, dev) -> bool:
        return True

    def _rows_to_read(self, state) -> Any:
        """The rows whose device is read this tick (every row here; the synthetic operators skip idle ones)."""
        return range(self.n)

    def poll(self, obs, state, active) -> OperatorTick:
        tick = OperatorTick.empty(self.n, self.mapping.action_dim)
        for r in self._rows_to_read(state):
            dev = self.devices[r]
            if dev is None:
                tick.device_ok[r] = False
                continue
            cmd = self._read(r, dev, obs, state)
            if cmd is None and not self._answering(r, dev):
                tick.device_ok[r] = dev.connected
                continue
            self._last[r] = cmd
            if cmd is None:
                tick.device_ok[r] = False
                continue
            tick.motion[r], tick.raw[r], tick.t_device[r] = cmd.motion, cmd.raw, cmd.t_device
            tick.engaged[r] = cmd.engaged
            tick.takeover[r] = TAKEOVER in cmd.buttons
            tick.ret[r] = RETURN in cmd.buttons
            if ESTOP in cmd.buttons and not tick.estop_by:
                tick.estop_by = f"device:{cmd.device_id}"
        # grabbing a hold-to-intervene device while the policy drives is a takeover
        armed = (state == AUTO) | (state == WARNING)
        tick.takeover |= tick.engaged & ~self._prev_engaged & armed
        self._prev_engaged = tick.engaged
        has_cmd = np.isfinite(tick.motion).all(axis=1)
        if has_cmd.any():
            tick.action[has_cmd] = self.mapping.human_to_raw(tick.motion[has_cmd])
        return tick

    def close(self) -> None:
        for dev in self.devices:
            if dev is not None:
                dev.close()

    def device_id(self, row: int) -> str:
        dev = self.devices[row]
        return getattr(dev, "device_id", "") if dev is not None else ""

    def key(self, key: str, down: bool) -> bool:
        used = False
        for dev in self.devices:
            if dev is not None and hasattr(dev, "press"):  # the in-window keyboard
                (dev.press if down else dev.release)(key)
                used = True
        return used

    def release_keys(self) -> None:
        for dev in self.devices:
            if dev is not None and hasattr(dev, "release_all"):
                dev.release_all()

    def device_state(self, row: int) -> dict[str, Any]:
        dev = self.devices[row]
        if dev is None:
            return {"kind": "none"}
        cmd = self._last[row]
        return {"device_id": self.device_id(row), "kind": getattr(dev.config, "type", self.kind),
                "connected": bool(dev.connected), "engaged": bool(cmd is not None and cmd.engaged),
                "axes": None if cmd is None else np.array(dev.normalized(cmd.raw), np.float32),
                "buttons": tuple(sorted(cmd.buttons)) if cmd is not None else (),
                "deadzone": tuple(float(v) for v in dev.deadzone)}


class SyntheticOperators(Operator):
    """The planner-driven synthetic operator in every row (hg_dagger.devices.SyntheticOperatorRows): it watches the
    scene, answers a request after its reaction delay (or not, by its availability) and sends the planner's label
    mapped to the human motion space (mapping.raw_to_human), through the same command pipeline stages as a device
    (hg_dagger.devices.CommandPipelines). All rows at once, as arrays: the tick costs the same few numpy calls
    with 64 envs as with one."""

    kind = "synthetic"
    has_devices = True

    def __init__(self, expert, mapping, num_envs: int, *, reaction_delay_steps: int = 5, noise_std: float = 0.0,
                 availability: float = 1.0, return_after_steps: int | None = None, seed: int = 0, name: str = ""):
        if expert is None:
            raise ConfigError("operator 'synthetic' needs the task's expert")
        super().__init__(num_envs, mapping, name)
        self.expert = expert
        config = SyntheticConfig(reaction_delay_steps=reaction_delay_steps, noise_std=noise_std,
                                 availability=availability, return_after_steps=return_after_steps, seed=seed)
        self.rows = SyntheticOperatorRows(config, [seed * 1000 + r for r in range(num_envs)])
        self.pipeline = CommandPipelines(config.processing, num_envs)
        self.person_available = availability > 0
        self._prev_engaged = np.zeros(num_envs, bool)
        self._last_raw = np.full((num_envs, COMMAND_DIM), np.nan, np.float32)  # for the operator's panel
        self._last_ret = np.zeros(num_envs, bool)
        self._idle: OperatorTick | None = None

    def poll(self, obs, state, active) -> OperatorTick:
        # the planner is asked wherever a person would be looking (it keeps its own phase per row), and what it
        # says reaches the rows whose operator is speaking
        requested = state == REQUESTED
        asked = requested | (state == HUMAN)
        if not (asked.any() or self.rows.watching.any() or self._prev_engaged.any()):
            return self.poll_idle()  # nobody asked, nobody is correcting: nothing of the below can change
        want = np.flatnonzero(active & asked)
        planner = np.full((self.n, self.mapping.action_dim), np.nan, np.float32)
        if want.size and obs:
            planner[want] = _query(self.expert, obs, want, self.mapping)[0][want]
        self.rows.observe(requested)
        tick = OperatorTick.empty(self.n, self.mapping.action_dim)
        tick.device_ok[:] = self.rows.connected
        speak = self.rows.speaking()
        if speak.size:
            t_ns = now_ns()
            raw, ret = self.rows.commands(speak, self.mapping.raw_to_human(planner[speak]))
            motion, engaged = self.pipeline.process(speak, raw, hold=np.ones(speak.size, bool), t_ns=t_ns)
            tick.raw[speak], tick.motion[speak], tick.t_device[speak] = raw, motion, t_ns
            tick.engaged[speak], tick.ret[speak] = engaged, ret
            self._last_raw[speak], self._last_ret[speak] = raw, ret
        armed = (state == AUTO) | (state == WARNING)  # as a device grabbed while the policy drives
        tick.takeover |= tick.engaged & ~self._prev_engaged & armed
        self._prev_engaged = tick.engaged
        has_cmd = np.isfinite(tick.motion).all(axis=1)
        if has_cmd.any():
            tick.action[has_cmd] = self.mapping.human_to_raw(tick.motion[has_cmd])
        return tick

    def poll_idle(self) -> OperatorTick:
        """Nobody asked and nobody corrects (the common tick): one read-only answer, made again when a device's
        connection changes."""
        idle = self._idle
        if idle is None or (idle.device_ok != self.rows.connected).any():
            idle = OperatorTick.empty(self.n, self.mapping.action_dim)
            idle.device_ok[:] = self.rows.connected
            self._idle = idle = idle.read_only()
        return idle

    def begin(self, row, obs_row) -> None:
        self.expert.reset([row], obs_row, {})
        self.release(row)

    def release(self, row: int) -> None:
        self.rows.release(row)

    def disconnect(self, row: int) -> None:
        """Simulate losing row's device: it sends nothing (the session holds) until connect(row)."""
        self.rows.connected[row] = False

    def connect(self, row: int) -> None:
        self.rows.connected[row] = True
        self.pipeline.reset(row)

    def close(self) -> None:
        self.rows.connected[:] = False

    def device_id(self, row: int) -> str:
        return f"synthetic:{self.rows.seeds[row]}"

    def device_state(self, row: int) -> dict[str, Any]:
        raw = self._last_raw[row]
        return {"device_id": self.device_id(row), "kind": self.kind, "connected": bool(self.rows.connected[row]),
                "engaged": bool(self._prev_engaged[row]),
                "axes": np.clip(raw, -1.0, 1.0) if np.isfinite(raw).all() else None,
                "buttons": (RETURN,) if self._last_ret[row] and self._prev_engaged[row] else (),
                "deadzone": tuple(float(v) for v in self.pipeline.cfg.deadzone)}


class HumanPacedOperator(Operator):
    """The human-paced operator model (control.human_model) without a window, in control time (ticks x dt): ONE
    person who notices a request after a look-away and a reaction time, plus a context switch when it comes from
    another robot than the one served last, declines some, steers with the planner's action (their intent) for a
    drawn correction time and lets go. It attends to one request at a time (the lowest row it sees asking; a
    fleet's allocator, control.fleet, shows it only the one it serves). Draws for request k come from (seed, k)."""

    kind = "human_model"
    person_available = True

    def __init__(self, expert, mapping, num_envs: int, *, profile: HumanProfile | None = None, seed: int = 0,
                 name: str = ""):
        if expert is None:
            raise ConfigError("operator 'human_model' needs the task's expert (the person's intent)")
        super().__init__(num_envs, mapping, name)
        self.expert = expert
        self.profile = profile or HumanProfile()
        self.seed = int(seed)
        self.t = 0.0  # the person's clock: control time
        self.facts: list[RequestFact] = []
        self.row: int | None = None  # the robot the person attends to
        self.last_row: int | None = None
        self._fact: RequestFact | None = None
        self._until: float | None = None  # in control until then (None: not yet in control)
        self._last_action = np.zeros((num_envs, mapping.action_dim), np.float32)

    def poll(self, obs, state, active) -> OperatorTick:
        self.t += self.mapping.dt
        tick = OperatorTick.empty(self.n, self.mapping.action_dim)
        r = self.row
        if r is not None and state[r] not in (REQUESTED, HUMAN):  # handed back, declined, expired or ended
            self._done(r)
            r = None
        if r is None:
            asked = np.flatnonzero((state == REQUESTED) & active)
            if not asked.size:
                return tick
            r = self._notice(int(asked[0]))
        f = self._fact
        assert f is not None  # a row is served: its request's fact (_notice)
        if self._until is None:
            if self.t < f.due_at:
                return tick
            if f.answer == "decline":
                f.outcome, f.acted_at = "declined", self.t
                tick.decline = np.zeros(self.n, bool)
                tick.decline[r] = True
                return tick
            f.acted_at = self.t
            self._until = self.t + draw_correction_s(self.profile, np.random.default_rng([self.seed, f.index, 1]))
        if self.t >= self._until:  # let go: the session takes the hand-back (return on release)
            return tick
        if state[r] == HUMAN:
            f.outcome = "took_over"
            f.control_s += self.mapping.dt
        action, valid = _query(self.expert, obs, np.array([r]), self.mapping) if obs else (None, None)
        if action is not None and valid is not None and valid[r]:  # both or neither
            self._last_action[r] = action[r]
        motion = np.asarray(self.mapping.raw_to_human(self._last_action[r : r + 1]), np.float32)
        tick.action[r] = self._last_action[r]
        tick.motion[r] = tick.raw[r] = motion[0]
        tick.t_device[r] = now_ns()
        tick.engaged[r] = True
        return tick

    def poll_idle(self) -> OperatorTick:
        """Between episodes the person's clock stands (a headless run never waits between episodes)."""
        return OperatorTick.empty(self.n, self.mapping.action_dim)

    def _notice(self, r: int) -> int:
        k = len(self.facts)
        look, answer, reaction = draw_answer(self.profile, np.random.default_rng([self.seed, k, 0]))
        switch = draw_switch_s(self.profile, self.seed, k, self.last_row is not None and r != self.last_row)
        fact = RequestFact(index=k, episode_id=None, t_request_ns=None, seen_at=self.t, answer=answer,
                           look_away_s=look, reaction_s=reaction, due_at=self.t + look + reaction + switch,
                           switch_s=switch, robot=r)
        self.facts.append(fact)
        self.row, self._fact, self._until = r, fact, None
        self.last_row = r  # the person has read this robot's scene
        return r

    def _done(self, r: int) -> None:
        if self._fact is not None and self._fact.outcome == "pending":
            self._fact.outcome = "gone"
        self.row, self._fact, self._until = None, None, None

    def begin(self, row, obs_row) -> None:
        self.expert.reset([row], obs_row, {})


class ExpertOperator(Operator):
    """The task's expert answers every request at once; its labels are recorded on every step."""

    kind = "expert"
    role = "expert"
    records_expert_labels = True

    def __init__(self, expert, mapping, num_envs: int, name: str = ""):
        if expert is None:
            raise ConfigError("operator 'expert' needs the task's expert")
        super().__init__(num_envs, mapping, name)
        self.expert = expert

    def poll(self, obs, state, active) -> OperatorTick:
        tick = OperatorTick.empty(self.n, self.mapping.action_dim)
        if not obs:
            return tick
        tick.expert_action, tick.expert_valid = _query(self.expert, obs, np.arange(self.n), self.mapping)
        tick.engaged[:] = True
        tick.device_ok = tick.expert_valid.copy()
        tick.action = tick.expert_action
        return tick

    def begin(self, row, obs_row) -> None:
        self.expert.reset([row], obs_row, {})


def _query(expert, obs, rows: np.ndarray, mapping) -> tuple[np.ndarray, np.ndarray]:
    """Expert labels for ``rows`` in raw space, as (action [N, A], valid [N]) indexed by env row."""
    n = len(next(iter(obs.values())))
    q = query_expert(expert, {k: v[rows] for k, v in obs.items()}, rows, mapping)
    return q.scatter(rows, n)


def make_operator(cfg, *, mapping, num_envs: int, expert=None, devices: list | None = None, seed: int = 0) -> Operator:
    """The operator a run config's ``operator`` section names (``devices`` = devices already made)."""
    name = cfg.name or cfg.type
    if cfg.certification == "planner_auto" and (devices is not None or cfg.type == "device"):
        raise ConfigError("operator.certification 'planner_auto' certifies a planner's windows; a person's need review")
    if cfg.certification == "planner_auto" and cfg.type == "synthetic" and cfg.noise_std > 0:
        raise ConfigError("operator.certification 'planner_auto' needs noise_std 0: with noise the synthetic "
                          "operator's commands are not the planner's")
    if devices is not None:
        if len(devices) != num_envs:
            raise ConfigError(f"{len(devices)} operator devices for {num_envs} envs: give one per env")
        return DeviceOperator(devices, mapping, name)
    if cfg.type == "human_model":
        return HumanPacedOperator(expert, mapping, num_envs, seed=seed, name=name)
    if cfg.type in ("expert", "synthetic"):
        op = ExpertOperator(expert, mapping, num_envs, name) if cfg.type == "expert" else SyntheticOperators(
            expert, mapping, num_envs, reaction_delay_steps=cfg.reaction_delay_steps, noise_std=cfg.noise_std,
            availability=cfg.availability, return_after_steps=cfg.return_after_steps, seed=seed, name=name)
        if cfg.certification == "planner_auto":
            op.certifier = type(expert).__name__
        return op
    if num_envs != 1:
        raise ConfigError(f"a live device drives one env; the env has {num_envs}")
    if not cfg.device:
        raise ConfigError("operator.type 'device' needs operator.device (a name in configs/devices or a path)")
    dev = make_device(cfg.device)
    dev.connect()
    return DeviceOperator([dev], mapping, name)
