"""The rollout engine: one loop steps episodes for every mode; modes differ in who acts and where steps go.

    rows = EpisodeRows(n, seeds=..., limit=...)          # one seeding rule, one episode cut
    engine = Engine(env, policy, arbiter, safety, sinks=[...], rows=rows)
    engine.run(episodes=8)                               # obs -> policy.act -> arbiter.decide -> safety -> env.step (a StepResult) -> sinks

Arbiters: ``BetaMix`` (automatic DAgger: one coin per row and step), ``ExpertOnly`` (demonstrations),
``StudentOnly`` (evaluation, calibration), ``TakeOver`` (recoverability probes: the student, then the
expert); the human-gated handover is the session (control.session), an arbiter whose hooks pause rows for a
person, refuse a tick while a robot holds and own its episodes' ends (``Arbiter``). Sinks receive every tick (``Tick``, one
typed record through the stages) and every episode begin and end: the store (learn.collect.Collector),
evaluation statistics (``EvalStats``), traces (``Trace``), calibration samples (``Samples``).

Seeding: episode k of a run starts from a reset with seed ``seeds[k]`` (default ``base + k``) in whichever
row is free, so its result does not depend on how episodes are spread over rows or workers. The first reset
seeds every row at once; later episodes each get an explicit seeded reset of their row (an env's own
auto-reset draws an unrecorded seed). Idle rows (no episode to run) are stepped and never recorded.
The cut: a row's step that reaches ``limit`` is truncated, exactly like the env's own horizon.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hg_dagger import config as config_io
from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.enums import ActionSource, ControlState, EndReason, StepFlag
from hg_dagger.control.safety import SafetyConfig
from hg_dagger.envs.base import StepResult
from hg_dagger.errors import EnvError

if TYPE_CHECKING:
    from hg_dagger.experts.base import ExpertQuery

SRC_POLICY = ActionSource.POLICY.code
SRC_EXPERT = ActionSource.EXPERT.code
SRC_SAFETY = ActionSource.SAFETY_CONTROLLER.code
CS_AUTO = ControlState.AUTONOMOUS.code
CS_EXPERT = ControlState.EXPERT.code


# ---------------------------------------------------------------------- the typed records


@dataclass
class Tick:
    """The values of one tick as they travel through the stages (arrays are [N, ...] over the env's rows)."""

    obs: dict[str, np.ndarray]  # the pre-action observation
    t_obs: np.ndarray  # int64 [N]
    active: np.ndarray  # bool [N] rows with an open episode (only they are recorded)
    policy: Any  # the student's PolicyOutput (action, confidence, uncertainty, inference_ns)
    t_policy: int = NO_TIME
    command: np.ndarray | None = None  # float32 [N, A] what the arbiter chose, in raw action space
    source: np.ndarray | None = None  # uint8 [N] ActionSource codes (after safety: the safety controller's)
    control_state: np.ndarray | None = None  # uint8 [N] ControlState codes
    flags: np.ndarray | None = None  # uint16 [N] StepFlag bits
    expert_action: np.ndarray | None = None  # float32 [N, A] the expert's label (NaN where invalid or unasked)
    expert_valid: np.ndarray | None = None  # bool [N]
    expert_used: np.ndarray | None = None  # bool [N] the expert's action was applied
    applied: np.ndarray | None = None  # float32 [N, A] what reached env.step
    clamped: np.ndarray | None = None  # bool [N] the safety monitor changed the command
    env: StepResult | None = None  # the env's step, the engine's cut included
    steps: np.ndarray | None = None  # int64 [N] steps of each row's episode, this one included
    operator: Any = None  # the session's OperatorTick: the operator's answer (raw command, t_device, buttons)
    paused: np.ndarray | None = None  # bool [N] rows that wait for a person: not stepped, not recorded, not counted
    counted: np.ndarray | None = None  # bool [N] rows whose step counts toward the cut (default: the active ones)
    stop: np.ndarray | None = None  # bool [N] rows whose episode the arbiter ends after this step (a safe stop)


# ---------------------------------------------------------------------- stages shared with the session


def safety_stage(safety, mapping, tick: Tick, on_clamp: Callable[[int, str, Tick], None] | None = None) -> None:
    """The action conversion every path shares (mapping.clip_raw) and the safety monitor: fills ``applied``;
    a changed command is recorded as the safety controller's, flagged CLAMPED, and reported per active row."""
    command = mapping.clip_raw(tick.command)
    res = safety.apply(command, tick.obs)
    tick.applied = res.applied
    tick.clamped = res.changed
    if not res.changed.any():
        return
    assert tick.source is not None and tick.flags is not None  # the arbiter decided; the tick began with flags
    tick.source = np.where(res.changed, np.uint8(SRC_SAFETY), tick.source).astype(np.uint8)
    tick.flags = tick.flags | np.where(res.changed, StepFlag.CLAMPED, 0).astype(np.uint16)
    if on_clamp is not None:
        for r in np.flatnonzero(res.changed & tick.active):
            on_clamp(int(r), "+".join(name for name, hit in res.reasons if hit[r]), tick)


def clamp_values(tick: Tick, row: int, command_source: np.ndarray) -> dict[str, Any]:
    """The values of a SAFETY_CLAMP event (the same in every mode): the command, what was applied, whose it was."""
    assert tick.command is not None and tick.applied is not None  # after the safety stage
    return {"command": np.asarray(tick.command[row], np.float32).tolist(), "applied": tick.applied[row].tolist(),
            "command_source": ActionSource.from_code(int(command_source[row])).value}


def end_reason(terminated: bool, success: bool):
    """How an episode the env ended (or the cut) ended, the same in every mode: a terminated episode succeeded or
    failed by the task's success condition; a truncated one (the horizon or the cut) timed out, whatever its
    success (recorded apart, as task_success), so a replay knows its last step was cut."""
    if terminated:
        return EndReason.SUCCESS if success else EndReason.FAILURE
    return EndReason.TIMEOUT


def task_safety(task: str):
    """The safety monitor's config of a task: the ``safety`` section of its run config (configs/run/<task>.yaml),
    the one a session on the task applies; defaults (non-finite actions held) for a task without one. Read alone,
    so a student-only path loads no gate or operator."""
    path = config_io.config_path("run", task)
    data = config_io.read_yaml(path).get("safety") if path.is_file() else None
    return config_io.validate(SafetyConfig, data or {}, source=f"{path}: safety")


def cut(step: StepResult, counted: np.ndarray, limit: int | None) -> StepResult:
    """The one episode cut: a row whose counted steps reach ``limit`` ends truncated, like a horizon (unless the
    env ended it on that step itself: then it ended as the env says, and a replay sees the same)."""
    if limit is None:
        return step
    over = (counted >= limit) & ~step.terminated
    if over.any():
        step.truncated = step.truncated | over
    return step


# ---------------------------------------------------------------------- arbiters


class Policy(Protocol):
    """What acts on every row each tick (the student; a zero action where no student runs)."""

    def reset_rows(self, rows: Sequence[int], num_envs: int) -> None: ...  # episodes begin in these rows

    def act(self, obs: dict[str, np.ndarray]) -> Any: ...  # a PolicyOutput


class Arbiter:
    """Who acts on each row: ``decide`` fills the tick's command, source and control state. The other hooks let an
    arbiter that works with a person (the session) pause rows, refuse a tick, and own its episodes' ends; their
    defaults are those of the batch modes."""

    def begin(self, rows: list[int], obs: dict[str, np.ndarray], info: dict) -> None:
        """Episodes begin in ``rows`` (``obs`` is theirs)."""

    def decide(self, tick: Tick) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether this tick steps at all (the session: not while a robot holds or between episodes)."""
        return True

    def waited(self, tick: Tick) -> None:
        """Every active row waits for a person and the env cannot step some rows alone: nothing was stepped."""

    def refused(self, exc: Exception, tick: Tick) -> bool:
        """The env refused the step (``exc``, an EnvError): True when handled (the tick ends unrecorded)."""
        return False

    def stepped(self, tick: Tick) -> None:
        """The env stepped and the cut applied; the sinks come next."""

    def after(self, tick: Tick, ended: list[int]) -> bool:
        """The sinks saw the step; ``ended`` rows' episodes end (env end, cut or ``tick.stop``). True when the
        arbiter ended and restarted them itself (the session); False: the engine's sinks close them."""
        return False


class StudentOnly(Arbiter):
    """The student acts on every row (evaluation, calibration)."""

    def begin(self, rows, obs, info) -> None:
        pass

    def decide(self, tick: Tick) -> None:
        n = len(tick.active)
        tick.command = tick.policy.action
        tick.source = np.full(n, SRC_POLICY, np.uint8)
        tick.control_state = np.full(n, CS_AUTO, np.uint8)


class BetaMix(Arbiter):
    """Automatic DAgger: the expert labels every active row's pre-action observation; a coin per row and step
    (one stream per episode, seeded by (seed, episode seed)) decides whether its valid label is executed."""

    def __init__(self, expert, mapping, *, seed: int, beta: float = 1.0, timeout_s: float | None = None):
        from hg_dagger.experts import query_expert  # lazily: student-only paths never import experts

        self._query = query_expert
        self.expert, self.mapping, self.seed, self.beta, self.timeout_s = expert, mapping, int(seed), beta, timeout_s
        self.coins: dict[int, np.random.Generator] = {}
        self.last: ExpertQuery | None = None  # the last ExpertQuery (latency, invalid rows)

    def seed_row(self, row: int, episode_seed: int) -> None:
        self.coins[row] = np.random.default_rng([self.seed, int(episode_seed)])

    def begin(self, rows, obs, info) -> None:
        self.expert.reset(rows, obs, info)

    def _coin(self, ids: np.ndarray, n: int) -> np.ndarray:
        coin = np.zeros(n, bool)
        for i in ids.tolist():
            coin[i] = self.coins[i].random() < self.beta
        return coin

    def decide(self, tick: Tick) -> None:
        n = len(tick.active)
        ids = np.flatnonzero(tick.active)
        q = self._query(self.expert, {k: v[ids] for k, v in tick.obs.items()}, ids, self.mapping,
                        timeout_s=self.timeout_s)
        self.last = q
        expert_action, expert_valid = q.scatter(ids, n)
        used = self._coin(ids, n) & expert_valid
        tick.expert_action, tick.expert_valid, tick.expert_used = expert_action, expert_valid, used
        tick.command = np.where(used[:, None], expert_action, tick.policy.action)
        tick.source = np.where(used, SRC_EXPERT, SRC_POLICY).astype(np.uint8)
        tick.control_state = np.where(used, CS_EXPERT, CS_AUTO).astype(np.uint8)


class ExpertOnly(BetaMix):
    """Demonstrations: the expert's valid label is executed on every active row (beta = 1, no coins)."""

    def __init__(self, expert, mapping, *, seed: int = 0, timeout_s: float | None = None):
        super().__init__(expert, mapping, seed=seed, beta=1.0, timeout_s=timeout_s)

    def _coin(self, ids: np.ndarray, n: int) -> np.ndarray:
        return np.ones(n, bool)


class TakeOver(BetaMix):
    """The student drives each episode for ``switch_at[episode seed]`` steps, then the expert's valid labels are
    executed to its end: replaying a student episode from its seed up to a state and asking whether the expert
    still succeeds from there (learn.evaluate.recoverability). The expert is asked on every step, so an expert
    that keeps state has seen the whole episode when it takes over."""

    def __init__(self, expert, mapping, switch_at: dict[int, int], *, timeout_s: float | None = None):
        super().__init__(expert, mapping, seed=0, beta=1.0, timeout_s=timeout_s)
        self.switch_at = {int(k): int(v) for k, v in switch_at.items()}
        self._switch: dict[int, int] = {}
        self._steps: dict[int, int] = {}

    def seed_row(self, row: int, episode_seed: int) -> None:
        self._switch[row] = self.switch_at[int(episode_seed)]
        self._steps[row] = 0

    def _coin(self, ids: np.ndarray, n: int) -> np.ndarray:
        coin = np.zeros(n, bool)
        for i in ids.tolist():
            coin[i] = self._steps[i] >= self._switch[i]
            self._steps[i] += 1
        return coin


# ---------------------------------------------------------------------- sinks


class Sink(Protocol):
    def begin(self, row: int, seed: int, index: int) -> None: ...

    def step(self, tick: Tick) -> None: ...

    def end(self, row: int, tick: Tick, *, complete: bool) -> None: ...


class Trace:
    """(obs, applied action) of every tick, for audits and tests."""

    def __init__(self, out: list):
        self.out = out

    def begin(self, row, seed, index) -> None:
        pass

    def step(self, tick: Tick) -> None:
        assert tick.applied is not None  # a sink sees a stepped tick
        self.out.append(({k: v.copy() for k, v in tick.obs.items()}, tick.applied.copy()))

    def end(self, row, tick, *, complete) -> None:
        pass


class Samples:
    """The student's uncertainty on every row of every tick (the confidence gate's calibration)."""

    def __init__(self):
        self.values: list[np.ndarray] = []

    def begin(self, row, seed, index) -> None:
        pass

    def step(self, tick: Tick) -> None:
        self.values.append(np.asarray(tick.policy.uncertainty, np.float32))

    def end(self, row, tick, *, complete) -> None:
        pass


class EvalStats:
    """Per-episode success, length, first-failure step, scene and initial progress (learn.evaluate)."""

    def __init__(self, n: int, seeds: Sequence[int]):
        self.seeds = seeds
        self.episodes: list[dict[str, Any]] = []
        self._index: list[int | None] = [None] * n
        self._hist: list[list[float]] = [[] for _ in range(n)]
        self._scene: list[str | None] = [None] * n
        self._info: dict = {}
        self.on_episode: Callable[[], None] | None = None

    def begin(self, row, seed, index) -> None:
        self._index[row] = index
        self._hist[row] = []
        sid = self._info.get("scene_id")
        self._scene[row] = None if sid is None else str(np.asarray(sid)[row])

    def reset_info(self, info: dict) -> None:
        self._info = info

    def step(self, tick: Tick) -> None:
        assert tick.env is not None  # a sink sees a stepped tick
        prog = tick.env.info.get("signals", {}).get("progress")
        if prog is not None:
            for i in np.flatnonzero(tick.active).tolist():
                self._hist[i].append(float(prog[i]))

    def end(self, row, tick, *, complete) -> None:
        if not complete:
            return
        success = bool(tick.env.success[row])
        hist = self._hist[row]
        length = int(tick.steps[row])
        self.episodes.append({"index": self._index[row], "seed": self.seeds[self._index[row]], "success": success,
                              "length": length, "first_failure_step": None if success else (
                                  int(np.argmax(hist)) + 1 if hist else length),
                              "scene": self._scene[row], "initial_progress": hist[0] if hist else None,
                              "return": None})
        if self.on_episode is not None:
            self.on_episode()


# ---------------------------------------------------------------------- episodes and the loop


class EpisodeRows:
    """Which episode each row runs: its index in the run, its seed, its counted steps (the cut)."""

    def __init__(self, n: int, *, base_seed: int = 0, seeds: Sequence[int] | None = None, limit: int | None = None):
        self.n = n
        self.base_seed = int(base_seed)
        self.seeds = None if seeds is None else [int(s) for s in seeds]
        self.limit = limit
        self.index: list[int | None] = [None] * n
        self.steps = np.zeros(n, np.int64)
        self.begun = 0
        self._active = np.zeros(n, bool)

    def seed_of(self, k: int) -> int:
        return self.seeds[k] if self.seeds is not None else self.base_seed + k

    @property
    def active(self) -> np.ndarray:
        """bool [N]: rows with an open episode (a copy the caller may keep)."""
        return self._active.copy()

    def take(self, row: int) -> tuple[int, int]:
        """The next episode goes to ``row``: (its index, its seed)."""
        k = self.begun
        self.begun += 1
        self.index[row] = k
        self._active[row] = True
        self.steps[row] = 0
        return k, self.seed_of(k)

    def free(self, row: int) -> None:
        self.index[row] = None
        self._active[row] = False


class Engine:
    """Steps ``env`` with ``policy`` through an arbiter, the safety monitor and sinks, one episode per row at a time."""

    def __init__(self, env, policy: Policy, arbiter: Arbiter, safety, *, rows: EpisodeRows, sinks: Sequence[Any] = (),
                 on_clamp: Callable[[int, str, Tick, np.ndarray], None] | None = None, copy_obs: bool = True):
        self.env, self.policy, self.arbiter, self.safety = env, policy, arbiter, safety
        self.copy_obs = copy_obs
        self.mapping = env.mapping
        self.n = env.num_envs
        self.rows = rows
        self.sinks = list(sinks)
        self.on_clamp = on_clamp
        self.ticks = 0
        self.obs: dict[str, np.ndarray] | None = None
        self.t_obs: np.ndarray | None = None
        self.info: dict = {}
        self.last: Tick | None = None

    # -------------------------------------------------------------- episodes

    def _begin_rows(self, starting: list[int], *, first: bool) -> None:
        """Open the next episodes in ``starting``: seeded resets (one for all rows on the first call)."""
        env, n = self.env, self.n
        plan = {r: self.rows.take(r) for r in starting}
        if first:
            idle = self.rows.seed_of(self.rows.begun) if self.rows.seeds is None else self.rows.seeds[-1] + 1
            seeds = [plan[r][1] if r in plan else idle + r for r in range(n)]
            obs, info = env.reset(seed=seeds)
            self.obs = {k: np.array(v) for k, v in obs.items()}
            self.t_obs = np.asarray(info.get("t_obs", np.full(n, now_ns())), np.int64).copy()
            self.info = info
            self.safety.reset(np.arange(n))
        elif starting:
            assert self.obs is not None and self.t_obs is not None  # the first reset observed every row
            ids = np.asarray(starting, np.int64)
            obs, info = env.reset(seed=[plan[r][1] for r in starting], env_ids=ids)
            for key in self.obs:
                self.obs[key][ids] = obs[key][ids]
            self.t_obs[ids] = np.asarray(info.get("t_obs", np.full(n, now_ns())), np.int64)[ids]
            self.safety.reset(ids)
            for s in self.sinks:  # the reset's info (scene ids) for the sinks that read it
                if hasattr(s, "reset_info"):
                    s.reset_info(info)
        if first:
            for s in self.sinks:
                if hasattr(s, "reset_info"):
                    s.reset_info(self.info)
        if first:
            self.policy.reset_rows(range(n), n)  # every row was reset, the idle ones too
        elif starting:
            self.policy.reset_rows(starting, n)
        if not starting:
            return
        for r in starting:
            k, seed = plan[r]
            if hasattr(self.arbiter, "seed_row"):
                self.arbiter.seed_row(r, seed)
            for s in self.sinks:
                s.begin(r, seed, k)
        assert self.obs is not None  # reset above
        self.arbiter.begin(starting, {k: v[starting] for k, v in self.obs.items()}, self.info)

    # -------------------------------------------------------------- one tick

    def tick(self) -> Tick | None:
        """One step of every row through the stages; None when the arbiter let nothing step."""
        if not self.arbiter.ready():
            return None
        n = self.n
        assert self.obs is not None and self.t_obs is not None  # the rows began (_begin) before any tick
        # the sinks own what they are handed (an arbiter that copies its observations itself says copy_obs=False)
        obs = {k: np.array(v) for k, v in self.obs.items()} if self.copy_obs else self.obs
        active = self.rows.active
        out = self.policy.act(obs)
        tick = Tick(obs=obs, t_obs=self.t_obs, active=active, policy=out, t_policy=now_ns(),
                    flags=np.zeros(n, np.uint16))
        self.arbiter.decide(tick)
        paused = tick.paused if tick.paused is not None and tick.paused.any() else None
        if paused is not None:
            if not (self.env.pauses_rows and (active & ~paused).any()):  # nothing steps: the others wait too
                self.arbiter.waited(tick)
                return None
            tick.active = active = active & ~paused
        command_source = tick.source
        assert command_source is not None  # the arbiter decided whose command each row runs
        report = self.on_clamp  # (row, clamp names, tick, whose command it was)
        on_clamp = None if report is None else (lambda r, names, t: report(r, names, t, command_source))
        safety_stage(self.safety, self.mapping, tick, on_clamp)
        assert tick.applied is not None and tick.clamped is not None  # filled by the safety stage
        if tick.expert_used is not None and tick.clamped.any():
            tick.expert_used = tick.expert_used & ~tick.clamped
        try:
            step = self.env.step(tick.applied) if paused is None else self.env.step(tick.applied, paused=paused)
        except EnvError as exc:
            if self.arbiter.refused(exc, tick):  # the action never moved anything: nothing to record
                return None
            raise
        self.safety.commit(tick.applied, None if paused is None else ~paused)
        self.ticks += 1
        counted = active if tick.counted is None else tick.counted & active
        self.rows.steps += counted
        tick.steps = self.rows.steps.copy()
        tick.env = cut(step, np.where(counted, self.rows.steps, 0), self.rows.limit)
        self.arbiter.stepped(tick)
        for s in self.sinks:
            s.step(tick)
        self.last = tick
        ended_rows = tick.env.ended if tick.stop is None else tick.env.ended | tick.stop
        ended = np.flatnonzero(ended_rows & active).tolist()
        self.obs, self.t_obs, self.info = step.obs, step.t_obs, step.info
        if self.arbiter.after(tick, ended):
            return tick
        for r in ended:
            for s in self.sinks:
                s.end(r, tick, complete=True)
            self.rows.free(r)
        return tick

    # -------------------------------------------------------------- the run

    def run(self, *, episodes: int | None, stop: Callable[[], bool] | None = None,
            may_begin: Callable[[], bool] | None = None, on_tick: Callable[[int, bool], None] | None = None,
            until_ended: bool = True) -> None:
        """Run ``episodes`` episodes (None: until ``stop()``). A free row begins the next episode while the quota
        and ``may_begin()`` allow; otherwise it idles (stepped, not recorded). Open episodes at a stop end
        incomplete (``complete=False`` to the sinks). A policy with ``acting()`` (the student: one inference thread)
        runs the whole run inside it."""
        with getattr(self.policy, "acting", nullcontext)():
            self._run(episodes, stop, may_begin, on_tick)

    def _run(self, episodes, stop, may_begin, on_tick) -> None:
        first = True
        try:
            while not (stop is not None and stop()):
                starting: list[int] = []
                for r in range(self.n):
                    if self.rows.index[r] is not None:
                        continue
                    if episodes is not None and self.rows.begun + len(starting) >= episodes:
                        break
                    if may_begin is not None and not may_begin():
                        break
                    starting.append(r)
                self._begin_rows(starting, first=first)
                first = False
                if not self.rows.active.any():
                    if episodes is not None and self.rows.begun >= episodes:
                        break
                    time.sleep(0.01)  # waiting for permission to begin (a newer policy snapshot)
                    if on_tick is not None:
                        on_tick(self.ticks, True)
                    continue
                self.tick()
                if on_tick is not None:
                    on_tick(self.ticks, False)
        finally:
            for r in range(self.n):  # stopped mid-episode: the sinks close what is open
                if self.rows.index[r] is not None:
                    for s in self.sinks:
                        s.end(r, self.last, complete=False)
                    self.rows.free(r)


__all__ = ["Arbiter", "BetaMix", "Engine", "EpisodeRows", "EvalStats", "ExpertOnly", "Policy", "Samples", "StudentOnly",
           "TakeOver", "Tick", "Trace", "clamp_values", "cut", "end_reason", "safety_stage", "task_safety"]
