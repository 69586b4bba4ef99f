"""The human-paced operator model on a simulated console: reaction times, look-aways and declines for a seed,
keys that steer the way the planner would, the release delay before the hand-back, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.control.human_model import DECLINE, HumanOperatorModel, HumanProfile, summarize
from hg_dagger.control.live import Snapshot
from hg_dagger.envs import load_mapping, make_env

pytestmark = [pytest.mark.simulation]

DT = 0.02  # the driver's timer period


def toy_obs(seed: int = 0) -> dict[str, np.ndarray]:
    env = make_env("toy_reach", num_envs=1, seed=seed)
    obs, _ = env.reset(seed=[seed])
    env.close()
    return {k: np.array(v[0]) for k, v in obs.items()}


def snap(state: str, episode: str = "ep-0", t_request: int | None = None, obs=None, human=None) -> Snapshot:
    return Snapshot(phase="running", control_state=state, episode_id=episode, t_request_ns=t_request,
                    observation=obs, human_action=human)


class Console:
    """A stand-in for the session as the model sees it: a request, then whatever the person's keys make of it."""

    def __init__(self, obs, human=None):
        self.obs, self.human = obs, human
        self.state = "autonomous"
        self.t_request: int | None = None
        self.held: set[str] = set()
        self.log: list[tuple[float, str, bool]] = []

    def request(self, k: int) -> None:
        self.state, self.t_request = "handover_requested", 1_000 + k

    def snapshot(self) -> Snapshot:
        return snap(self.state, t_request=self.t_request, obs=self.obs, human=self.human)

    def play(self, actions) -> None:
        for a in actions:
            self.log.append((a.t, a.key, a.down))
            (self.held.add if a.down else self.held.discard)(a.key)
            if a.key == "space" and a.down and self.state == "handover_requested":
                self.state = "human"
            elif a.key == "space" and not a.down and self.state == "human":
                self.state, self.t_request = "autonomous", None
            elif a.key == DECLINE and a.down and self.state == "handover_requested":
                self.state, self.t_request = "autonomous", None


def run_requests(model, console: Console, n: int, t: float = 0.0, settle: float = 20.0) -> float:
    """n requests one after another, each until the person has answered and let go (or ``settle`` s passed)."""
    for k in range(n):
        console.request(k)
        end = t + settle
        while t < end:
            console.play(model.step(console.snapshot(), t))
            t += DT
            if console.state == "autonomous" and not model.in_control and not console.held:
                break
        assert console.state == "autonomous" and not console.held, f"request {k} left {console.held}"
        t += 1.0
    return t


@pytest.fixture(scope="module")
def mapping():
    return load_mapping("toy_reach")


def test_reaction_times_look_aways_and_declines_for_a_seed(mapping):
    model = HumanOperatorModel(mapping, seed=7)
    console = Console(toy_obs())
    run_requests(model, console, 300)
    facts = model.facts
    assert len(facts) == 300
    p = HumanProfile()
    reaction = np.array([f.reaction_s for f in facts])
    assert reaction.min() >= p.reaction_min_s and reaction.max() <= p.reaction_max_s
    assert 0.7 < np.median(reaction) < 1.1, "lognormal around the profile's median"
    looked = np.array([f.look_away_s for f in facts if f.look_away_s > 0])
    assert looked.min() >= 3.0 and looked.max() <= 8.0
    # shares of 300 draws: well inside binomial bounds of the profile's 15% and 10%
    assert 0.08 < looked.size / 300 < 0.22
    declined = [f for f in facts if f.outcome == "declined"]
    assert 0.05 < len(declined) / 300 < 0.16
    assert all(f.answer == "decline" for f in declined)
    took = [f for f in facts if f.outcome == "took_over"]
    assert len(took) + len(declined) == 300, "every request was answered (nothing else ended them)"
    for f in facts:  # the key went down when the person was due to act, not a tick earlier
        assert f.due_at <= f.acted_at < f.due_at + 2 * DT
        assert f.acted_at - f.seen_at >= p.reaction_min_s
    s = summarize(facts)
    assert s["requests"] == 300 and s["took_over"] == len(took) and s["declined"] == len(declined)
    assert p.reaction_min_s <= s["act_p50_s"] <= s["act_p90_s"]


def test_the_same_seed_plays_the_same_keys_and_another_does_not(mapping):
    obs = toy_obs(3)

    def keys(seed):
        model = HumanOperatorModel(mapping, seed=seed)
        console = Console(obs)
        run_requests(model, console, 12)
        return console.log

    a, b, c = keys(11), keys(11), keys(12)
    assert a == b and len(a) > 20
    assert a != c


def test_keys_steer_the_way_the_planner_would_and_let_go_after_a_release_delay(mapping):
    obs = toy_obs(5)
    model = HumanOperatorModel(mapping, HumanProfile(look_away_p=0.0, decline_p=0.0, wrong_key_p=0.0), seed=1)
    raw = model._intent(snap("human", obs=obs))
    motion = mapping.raw_to_human(raw)
    console = Console(obs)
    run_requests(model, console, 3)
    held: dict[str, float] = {}
    down_at: dict[str, float] = {}
    for t, key, down in console.log:
        if down:
            down_at[key] = t
        else:
            held[key] = held.get(key, 0.0) + t - down_at.pop(key)
    # toy_reach: human axes x, y drive shoulder and elbow; keyboard x = W/S, y = A/D
    for slot, pos, neg in ((0, "w", "s"), (1, "a", "d")):
        if abs(motion[slot]) > 0.3:
            want, other = (pos, neg) if motion[slot] > 0 else (neg, pos)
            assert held.get(want, 0.0) > 3 * held.get(other, 0.0), (slot, motion, held)
    # every hand-back: the motion keys up first, the hold key after the release delay
    p = model.profile
    spaces = [(t, d) for t, k, d in console.log if k == "space"]
    for (t_down, d1), (t_up, d2) in zip(spaces[::2], spaces[1::2], strict=True):
        assert d1 and not d2
        motion_ups = [t for t, k, d in console.log if k != "space" and not d and t_down <= t <= t_up]
        assert motion_ups, "the person steered before letting go"
        gap = t_up - max(motion_ups)
        assert p.release_delay_s[0] - DT <= gap <= p.release_delay_s[1] + DT
        assert p.correction_min_s <= t_up - t_down <= p.correction_max_s + p.release_delay_s[1] + DT


def test_a_request_gone_before_the_person_looks_back_gets_no_key(mapping):
    model = HumanOperatorModel(mapping, HumanProfile(look_away_p=1.0, decline_p=0.0), seed=2)
    obs = toy_obs()
    t = 0.0
    assert model.step(snap("handover_requested", t_request=5, obs=obs), t) == []
    fact = model.facts[0]
    assert 3.0 <= fact.look_away_s <= 8.0
    while t < 1.0:  # the request ends (the episode ended) while the person looks elsewhere
        t += DT
        assert model.step(snap("handover_requested", t_request=5, obs=obs), t) == []
    while t < fact.due_at + 1.0:
        t += DT
        assert model.step(snap("autonomous", obs=obs), t) == []
    assert fact.outcome == "gone" and fact.acted_at is None


def test_fetch_the_gripper_key_is_tapped_when_the_gripper_should_change():
    mapping = load_mapping("fetch_pick_place")
    env = make_env("fetch_pick_place", num_envs=1, seed=0)
    try:
        obs, _ = env.reset(seed=[0])
    finally:
        env.close()
    row = {k: np.array(v[0]) for k, v in obs.items()}
    model = HumanOperatorModel(mapping, HumanProfile(look_away_p=0.0, decline_p=0.0), seed=4)
    raw = model._intent(snap("human", obs=row))
    assert raw is not None and raw[3] > 0.5, "far from the block the planner keeps the gripper open"
    # the console shows the gripper closing (the person's command): the person taps G to open it
    console = Console(row, human=np.array([0.0, 0.0, 0.0, -0.6], np.float32))
    run_requests(model, console, 1)
    assert any(k == "g" and d for _, k, d in console.log)
    # shown open already: no tap
    model = HumanOperatorModel(mapping, HumanProfile(look_away_p=0.0, decline_p=0.0), seed=4)
    console = Console(row, human=np.array([0.0, 0.0, 0.0, 0.6], np.float32))
    run_requests(model, console, 1)
    assert not any(k == "g" for _, k, _ in console.log)
    assert any(k in ("w", "s", "a", "d", "r", "f") for _, k, _ in console.log)
