"""A human-paced operator model: what a person at the console does with the keyboard, in seconds.

The synthetic operator (control.operators.SyntheticOperators) answers a request within a tick. A person
takes a reaction time to notice a request, sometimes looks away for several seconds, sometimes lets the
student go on, steers with keys held a little too long or too short (now and then the wrong key), and
lets go of the deadman a moment after the last motion key. ``HumanOperatorModel`` does that, seeded so a
run reproduces:

    model = HumanOperatorModel(mapping, seed=3)
    for action in model.step(snapshot, time.monotonic()):   # the Snapshot the window reads
        play(action.key, action.down)                         # e.g. a Qt key event (ui/operator_model.py)

It reads only what a person sees: the Snapshot (control state, the episode, the watched row's
observation and the device's last command). Which way to steer comes from the task's planner expert
(the person's intent), mapped to the human motion space (mapping.raw_to_human) and quantized to the
keyboard device's keys (configs/devices/keyboard.yaml): hold the hold key to take over, the axis keys
held for a share of each decision beat (the intent's size against what a held key gives), the
gripper key tapped when the gripper should change. Nothing here imports Qt or calls into the session.

Every draw for request k comes from its own generator (seed, k), so what the person does about the
k-th request does not depend on how many snapshots arrived before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from hg_dagger.contract.command import COMMAND_AXES, GRIPPER
from hg_dagger.devices import load_device_config
from hg_dagger.experts import make_expert, query_expert

if TYPE_CHECKING:
    from hg_dagger.devices import KeyboardConfig

REQUESTED = "handover_requested"
HUMAN = "human"
DECLINE = "decline"  # not a device key: the console's "let the student go on" key (the driver knows which)


@dataclass(frozen=True)
class HumanProfile:
    """How a person answers and steers. Times in seconds; lognormal draws are clipped to their bounds."""

    reaction_median_s: float = 0.9  # notice the banner and act (lognormal median)
    reaction_sigma: float = 0.45
    reaction_min_s: float = 0.4
    reaction_max_s: float = 3.0
    look_away_p: float = 0.15  # share of requests that come while the person looks elsewhere
    look_away_s: tuple[float, float] = (3.0, 8.0)  # uniform; the reaction time follows it
    decline_p: float = 0.1  # share of requests the person lets the student go on
    correction_median_s: float = 2.0  # how long the person steers before handing back
    correction_sigma: float = 0.35
    correction_min_s: float = 0.8
    correction_max_s: float = 5.0
    beat_s: tuple[float, float] = (0.12, 0.28)  # how often the person re-decides which keys to hold
    deadband: float = 0.12  # intent (human motion units) below which no key is pressed
    hold_noise_sigma: float = 0.3  # key held too long / too short: lognormal factor on each hold
    min_hold_s: float = 0.05
    wrong_key_p: float = 0.04  # per key press: the opposite key instead
    release_delay_s: tuple[float, float] = (0.15, 0.6)  # last motion key up -> hold key up
    tap_s: tuple[float, float] = (0.06, 0.14)  # a tap (gripper toggle, decline)
    gripper_settle_s: float = 0.5  # after a gripper tap, wait this long before judging the gripper again
    takeover_confirm_s: float = 3.0  # the take-over did not show in the console within this: let go
    context_switch_s: tuple[float, float] = (1.0, 3.0)  # uniform: reading another robot's scene than the last one


@dataclass(frozen=True)
class KeyAction:
    """A key of the in-window keyboard device by name (configs/devices/keyboard.yaml), or DECLINE (the
    console's decline key), down or up, due at ``t`` (the caller's clock, seconds)."""

    t: float
    key: str
    down: bool


@dataclass
class RequestFact:
    """What the person did about one handover request (recorded facts for tests and benchmarks)."""

    index: int
    episode_id: str | None
    t_request_ns: int | None
    seen_at: float
    answer: Literal["take_over", "decline"]
    look_away_s: float  # 0 when the person was looking
    reaction_s: float
    due_at: float  # seen_at + look_away_s + reaction_s
    acted_at: float | None = None  # when the key went down (None: the request was gone first)
    outcome: str = "pending"  # took_over | declined | gone | no_control (take-over never showed)
    control_s: float = 0.0  # seconds from the hold key down to its release
    keys_pressed: int = 0  # motion and gripper key presses while in control
    wrong_keys: int = 0
    switch_s: float = 0.0  # the context switch in due_at: the request came from another robot than the last one
    robot: int = 0


def draw_answer(p: HumanProfile, rng: np.random.Generator
                ) -> tuple[float, Literal["take_over", "decline"], float]:
    """(look-away s, take_over | decline, reaction s) for one request: one home for these draws, shared by the
    keyboard model and the headless one (control.operators.HumanPacedOperator)."""
    look = float(rng.uniform(*p.look_away_s)) if rng.random() < p.look_away_p else 0.0
    answer: Literal["take_over", "decline"] = "decline" if rng.random() < p.decline_p else "take_over"
    reaction = _lognormal(rng, p.reaction_median_s, p.reaction_sigma, p.reaction_min_s, p.reaction_max_s)
    return look, answer, reaction


def draw_correction_s(p: HumanProfile, rng: np.random.Generator) -> float:
    """How long the person steers before handing back."""
    return _lognormal(rng, p.correction_median_s, p.correction_sigma, p.correction_min_s, p.correction_max_s)


def draw_switch_s(p: HumanProfile, seed: int, request: int, switched: bool) -> float:
    """The context-switch cost of a request from another robot than the one the person read last (0 for the
    same robot); its own stream (seed, request, 3), so a run without switches draws exactly what it did before."""
    if not switched:
        return 0.0
    return float(np.random.default_rng([int(seed), int(request), 3]).uniform(*p.context_switch_s))


@dataclass
class _Control:
    fact: RequestFact
    until: float  # hand back from here on
    rng: np.random.Generator
    started: float
    next_beat: float
    seen_human: bool = False
    releasing_at: float | None = None  # hold key goes up at this time
    last_gripper_tap: float = -1e9
    gripper_closed: bool | None = None  # own belief where the console shows no command


@dataclass
class _Held:
    release_at: float | None  # None: held until the next beat decides


class HumanOperatorModel:
    """One person at the keyboard, watching row 0 of the console (see the module docstring)."""

    def __init__(self, mapping, profile: HumanProfile | None = None, *, seed: int = 0, expert=None,
                 keyboard=None):
        self.mapping = mapping
        self.profile = profile or HumanProfile()
        self.seed = int(seed)
        if expert is None:
            expert = make_expert(mapping.task_id, kind="planner", mapping=mapping)
        self.expert = expert
        self.keyboard: KeyboardConfig = keyboard if keyboard is not None else cast(
            "KeyboardConfig", load_device_config("keyboard"))
        cfg = self.keyboard
        if not cfg.hold_key:
            raise ValueError("the human operator model steers with a hold-to-intervene key: keyboard.hold_key is unset")
        self.hold_key = cfg.hold_key
        # action dim -> (positive key, negative key) for each dimension the person drives with axis keys
        scale = np.asarray(cfg.processing.scale, np.float64)
        self._axes: list[tuple[int, str, str, float]] = []  # (command slot, pos key, neg key, motion of a held key)
        self._gripper: tuple[int, str] | None = None  # (action dim, toggle key)
        for dim, axis in enumerate(mapping.human.axes):
            if axis is None:
                continue
            slot = COMMAND_AXES.index(axis)
            if axis in cfg.axes:
                pos, neg = cfg.axes[axis]
                self._axes.append((slot, pos, neg, float(scale[slot])))
            elif axis == GRIPPER and GRIPPER in cfg.buttons and cfg.gripper_toggle:
                self._gripper = (dim, cfg.buttons[GRIPPER][0])
        self.facts: list[RequestFact] = []
        self._wait: RequestFact | None = None  # the request the person is about to answer
        self._control: _Control | None = None
        self._held: dict[str, _Held] = {}
        self._out: list[KeyAction] = []
        self._last_request: tuple[str | None, int | None] | None = None
        self._episode: str | None = None
        self._last_robot: int | None = None  # the robot whose scene the person read last (context switches)

    # ---- what the caller reads ------------------------------------------------------------------

    @property
    def in_control(self) -> bool:
        """The person holds the hold key (took over, or is letting go)."""
        return self._control is not None

    @property
    def held_keys(self) -> tuple[str, ...]:
        return tuple(sorted(self._held))

    def release_all(self, now: float) -> list[KeyAction]:
        """Let go of every key now (the test or the app is done)."""
        self._out = []
        for k in list(self._held):
            self._release(k, now)
        if self._control is not None:
            self._control.fact.control_s = now - self._control.started
        self._control = None
        self._wait = None
        out, self._out = self._out, []
        return out

    # ---- one look at the console ----------------------------------------------------------------

    def step(self, snap, now: float) -> list[KeyAction]:
        """What the person does by ``now`` after seeing ``snap``: the key actions due, in order."""
        self._out = []
        if snap.episode_id != self._episode:
            self._episode = snap.episode_id
            if snap.episode_id is not None:
                self._reset_expert(snap)
        self._release_due(now)
        if self._control is not None:
            self._steer(snap, now)
        else:
            self._watch(snap, now)
        out, self._out = self._out, []
        return out

    def _watch(self, snap, now: float) -> None:
        key = (snap.episode_id, snap.t_request_ns)
        requested = snap.control_state == REQUESTED and snap.phase == "running"
        if requested and key != self._last_request:
            if self._wait is not None:
                self._wait.outcome = "gone"  # a new request replaced the one the person had not answered yet
            self._last_request = key
            self._wait = self._decide(snap, now)
        w = self._wait
        if w is None or now < w.due_at:
            return
        self._wait = None
        if not (requested and key == (w.episode_id, w.t_request_ns)):
            w.outcome = "gone"  # the person looks, and the banner is gone (answered elsewhere, expired, ended)
            return
        w.acted_at = now
        if w.answer == "decline":
            w.outcome = "declined"
            self._tap(DECLINE, now, self._rng(w.index, 2))
            return
        rng = self._rng(w.index, 1)
        p = self.profile
        until = now + draw_correction_s(p, rng)
        self._press(self.hold_key, now)
        self._control = _Control(fact=w, until=until, rng=rng, started=now, next_beat=now + float(rng.uniform(*p.beat_s)))

    def _decide(self, snap, now: float) -> RequestFact:
        p = self.profile
        k = len(self.facts)
        look, answer, reaction = draw_answer(p, self._rng(k, 0))
        robot = int(getattr(snap, "robot", 0) or 0)  # the console's robot (a fleet view); one robot: always 0
        switch = draw_switch_s(p, self.seed, k, self._last_robot is not None and robot != self._last_robot)
        self._last_robot = robot
        fact = RequestFact(index=k, episode_id=snap.episode_id, t_request_ns=snap.t_request_ns, seen_at=now,
                           answer=answer, look_away_s=look, reaction_s=reaction,
                           due_at=now + look + reaction + switch, switch_s=switch, robot=robot)
        self.facts.append(fact)
        return fact

    def _steer(self, snap, now: float) -> None:
        c = self._control
        assert c is not None  # called while the person is in control
        p = self.profile
        if c.releasing_at is not None:
            if now >= c.releasing_at:
                self._release(self.hold_key, now)
                c.fact.control_s = now - c.started
                self._control = None
                if not c.seen_human:
                    self._last_request = None  # the take-over never showed: look at the request afresh
            return
        if snap.control_state == HUMAN and snap.episode_id == c.fact.episode_id:
            if not c.seen_human:
                c.seen_human = True
                c.fact.outcome = "took_over"
        elif c.seen_human or now - c.started > p.takeover_confirm_s or snap.episode_id != c.fact.episode_id:
            # the episode ended, or the session took control back (auto-return, e-stop): let go
            if not c.seen_human:
                c.fact.outcome = "no_control"
            self._hand_back(now)
            return
        if now >= c.until and c.seen_human:
            self._hand_back(now)
            return
        if c.seen_human and now >= c.next_beat:
            self._beat(snap, now)

    def _beat(self, snap, now: float) -> None:
        """Re-decide which keys to hold for the next beat, from the intent on what the console shows."""
        c, p = self._control, self.profile
        assert c is not None  # called while the person is in control
        beat = float(c.rng.uniform(*p.beat_s))
        c.next_beat = now + beat
        raw = self._intent(snap)
        if raw is None:
            return
        motion = np.asarray(self.mapping.raw_to_human(raw), np.float64)
        for slot, pos, neg, gain in self._axes:
            v = float(motion[slot])
            want = None if abs(v) < p.deadband else (pos if v > 0 else neg)
            hold = 0.0
            if want is not None:
                hold = beat * min(1.0, abs(v) / max(gain, 1e-6)) * float(np.exp(c.rng.normal(0.0, p.hold_noise_sigma)))
                hold = max(p.min_hold_s, hold)
                if c.rng.random() < p.wrong_key_p:
                    want = neg if want == pos else pos
                    c.fact.wrong_keys += 1
            for k in (pos, neg):
                if k != want and k in self._held:
                    self._release(k, now)
            if want is None:
                continue
            if want not in self._held:
                self._press(want, now)
                c.fact.keys_pressed += 1
            self._held[want].release_at = now + hold if hold < beat else None
        if self._gripper is not None:
            self._grip(snap, raw, now)

    def _grip(self, snap, raw: np.ndarray, now: float) -> None:
        c, p = self._control, self.profile
        assert c is not None and self._gripper is not None  # in control, with a gripper key
        dim, key = self._gripper
        if now - c.last_gripper_tap < p.gripper_settle_s or key in self._held:
            return
        want = float(raw[dim])
        if abs(want) < 0.5:
            return
        shown = None if snap.human_action is None else float(np.asarray(snap.human_action)[dim])
        current = shown if shown is not None and np.isfinite(shown) and abs(shown) > 1e-6 else None
        if current is None:  # the console shows no command: the person goes by what they did last
            if c.gripper_closed is None:
                return
            current = -1.0 if c.gripper_closed else 1.0
        if np.sign(current) != np.sign(want):
            self._tap(key, now, c.rng)
            c.last_gripper_tap = now
            c.fact.keys_pressed += 1
            c.gripper_closed = want < 0

    def _hand_back(self, now: float) -> None:
        """Motion keys up now; the hold key after the person's release delay."""
        c = self._control
        assert c is not None  # called while the person is in control
        for k in [k for k in self._held if k != self.hold_key]:
            self._release(k, now)
        c.releasing_at = now + float(c.rng.uniform(*self.profile.release_delay_s))

    # ---- the person's intent ----------------------------------------------------------------------

    def _reset_expert(self, snap) -> None:
        obs = _rows(snap.observation)
        if obs is not None:
            self.expert.reset([0], obs, {})

    def _intent(self, snap) -> np.ndarray | None:
        """The planner's action for what the console shows, in raw action space (None: nothing to go by)."""
        obs = _rows(snap.observation)
        if obs is None:
            return None
        q = query_expert(self.expert, obs, [0], self.mapping)
        if not bool(q.valid[0]):
            return None
        return np.asarray(q.action[0], np.float64)

    # ---- keys ---------------------------------------------------------------------------------------

    def _press(self, key: str, now: float) -> None:
        self._held[key] = _Held(None)
        self._out.append(KeyAction(now, key, True))

    def _release(self, key: str, now: float) -> None:
        if self._held.pop(key, None) is not None:
            self._out.append(KeyAction(now, key, False))

    def _tap(self, key: str, now: float, rng: np.random.Generator) -> None:
        self._press(key, now)
        self._held[key].release_at = now + float(rng.uniform(*self.profile.tap_s))

    def _release_due(self, now: float) -> None:
        for k, h in sorted(self._held.items(), key=lambda kv: kv[1].release_at or 0.0):
            if h.release_at is not None and now >= h.release_at:
                self._held.pop(k)
                self._out.append(KeyAction(h.release_at, k, False))

    def _rng(self, request: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, request, stream])


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: float, hi: float) -> float:
    return float(np.clip(median * np.exp(rng.normal(0.0, sigma)), lo, hi))


def _rows(obs: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """One observation row as a batch of one (the expert contract's shape)."""
    if not obs:
        return None
    return {k: np.asarray(v)[None] for k, v in obs.items()}


def summarize(facts: list[RequestFact]) -> dict[str, float]:
    """Shares and times over the person's requests (for benchmarks and reports)."""
    n = len(facts)
    took = [f for f in facts if f.outcome == "took_over"]
    waits = np.array([f.acted_at - f.seen_at for f in took if f.acted_at is not None], np.float64)  # a take-over acted
    return {
        "requests": n,
        "took_over": len(took),
        "declined": sum(f.outcome == "declined" for f in facts),
        "gone": sum(f.outcome == "gone" for f in facts),
        "looked_away": sum(f.look_away_s > 0 for f in facts),
        "act_p50_s": float(np.percentile(waits, 50)) if waits.size else float("nan"),
        "act_p90_s": float(np.percentile(waits, 90)) if waits.size else float("nan"),
        "control_s_mean": float(np.mean([f.control_s for f in took])) if took else float("nan"),
        "context_switches": sum(f.switch_s > 0 for f in facts),
    }


__all__ = ["DECLINE", "HumanOperatorModel", "HumanProfile", "KeyAction", "RequestFact", "draw_answer",
           "draw_correction_s", "draw_switch_s", "summarize"]
