"""The rollout engine's shared stages on every path: the safety monitor clamps an unsafe action in auto collection
and evaluation exactly as it does in a session, and every mode follows one seeding rule and one episode cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hg_dagger.contract.enums import ActionSource, EventKind, LabelMask, StepFlag
from hg_dagger.control.build import build_session
from hg_dagger.control.engine import Engine, EpisodeRows, StudentOnly, task_safety
from hg_dagger.control.expert_runs import run_expert
from hg_dagger.control.gate_specs import GateConfig, OperatorGate
from hg_dagger.control.run_config import load_run_config
from hg_dagger.control.safety import SafetyConfig, SafetyMonitor
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.experts import make_expert, query_expert
from hg_dagger.learn.collect import Collector
from hg_dagger.learn.evaluate import EvalConfig, closed_loop
from hg_dagger.policy import Student
from hg_dagger.review.replay import replay_store
from hg_dagger.store import EpisodeStore, validate_store

SAFETY = ActionSource.SAFETY_CONTROLLER.code
EXPERT = ActionSource.EXPERT.code
TIGHT = {"limits": {"low": [-0.01, -0.01], "high": [0.01, 0.01]}}


@pytest.fixture(scope="module")
def student():
    return Student.create(load_mapping("toy_reach"), seed=0, ensemble=3, hidden=(32, 32))


def _clamp_events(info):
    return [e for e in info.end.events if e.kind == EventKind.SAFETY_CLAMP]


def test_auto_clamps_an_unsafe_action_through_the_safety_monitor_as_the_session_does(tmp_path, student):
    mapping = load_mapping("toy_reach")
    expert = make_expert("toy_reach", "planner", mapping=mapping)
    store = EpisodeStore.create(str(tmp_path / "auto"))
    with make_env(mapping, num_envs=2, seed=0) as env:
        rec = store.recorder()
        col = Collector(env, expert, rec, mode="expert_demo", seed=0, max_episode_steps=8,
                        safety=SafetyConfig.model_validate(TIGHT))
        col.set_policy(student, iteration=0, beta=1.0)
        stats = col.run(episodes=2, reset_seed=3)
        rec.close()
    assert stats.safety_clamps > 0 and stats.summary()["safety_clamps"] == stats.safety_clamps
    assert validate_store(store) == []
    for info in store.episodes():
        d = store.read_steps(info.episode_id)
        obs = {k: d[f"obs/{k}"] for k in mapping.obs_spec()}
        label = query_expert(expert, obs, np.arange(len(d["valid"])), mapping).action
        np.testing.assert_allclose(d["expert_action"], label, atol=1e-6)  # the label is the expert's, unclamped
        big = (np.abs(d["expert_action"]) > 0.01).any(axis=1)
        assert big.any(), "the planner asks for more than the limits allow"
        assert (np.abs(d["applied_action"]) <= 0.01 + 1e-7).all(), "nothing outside the limits reached the env"
        assert (d["action_source"][big] == SAFETY).all() and (d["action_source"][~big] == EXPERT).all()
        assert ((d["step_flags"][big] & int(StepFlag.CLAMPED)) != 0).all()
        assert not d["expert_used"][big].any(), "a clamped step applied the safety controller's action"
        evs = _clamp_events(info)
        assert len(evs) == int(big.sum())
        np.testing.assert_allclose(evs[0].values["command"], d["expert_action"][np.flatnonzero(big)[0]], rtol=1e-6)
        assert evs[0].reason == "action_bounds" and evs[0].values["command_source"] == "expert"
        mask = store.labels(info.episode_id).mask
        assert (mask == LabelMask.TRAINABLE.code).any(), "the expert's labels still train"

    # the session, under the same limits, marks its clamped steps the same way
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, max_episode_steps=8,
                          gates=GateConfig(name="none", gates=[OperatorGate()]), **{"safety.limits": TIGHT["limits"]})
    rec = EpisodeStore.create(str(tmp_path / "gated")).recorder(flush_interval_s=0.05)
    with make_env("toy_reach", num_envs=1, seed=0) as env:
        build_session(cfg, rec, student, env=env).run(1, progress=False)
        rec.close()
    gated = EpisodeStore.open(str(tmp_path / "gated"))
    info = gated.episodes()[0]
    d = gated.read_steps(info.episode_id)
    assert (d["action_source"] == SAFETY).all() and ((d["step_flags"] & int(StepFlag.CLAMPED)) != 0).all()
    ev = _clamp_events(info)[0]
    assert set(ev.values) == set(_clamp_events(store.episodes()[0])[0].values) and ev.reason == "action_bounds"


def test_evaluation_applies_the_safety_monitor_too(student):
    mapping = load_mapping("toy_reach")
    trace = []
    with make_env(mapping, num_envs=2, seed=1) as env:
        res = closed_loop(student, env, EvalConfig(episodes=3, num_envs=2, seed=1, max_steps=10), trace=trace,
                          safety=SafetyConfig.model_validate(TIGHT))
    assert res["episodes"] == 3 and res["env_steps"] == len(trace)
    applied = np.concatenate([a for _, a in trace])
    assert (np.abs(applied) <= 0.01 + 1e-7).all()


def test_expert_measurements_step_through_the_engine_and_its_safety_monitor():
    """run_expert: the task's safety monitor sees every action (random first steps jump further than toy_reach's
    max_delta and are clamped; the planner alone never is), and episode k starts from seed + k whatever the rows."""
    reports = {}
    for rows in (1, 3):
        with make_env("toy_reach", num_envs=rows, seed=0) as env:
            reports[rows] = (run_expert(env, make_expert("toy_reach"), episodes=6, seed=40),
                             run_expert(env, make_expert("toy_reach"), episodes=6, seed=40, perturb_steps=(5, 20)))
    calm, pushed = reports[3]
    assert calm.episodes == pushed.episodes == 6 and calm.queries > 0
    assert calm.clamped_rows == 0 and pushed.clamped_rows > 0
    assert sorted(f["seed"] for f in pushed.failures) == sorted(f["seed"] for f in reports[1][1].failures)
    assert (pushed.successes, pushed.queries) == (reports[1][1].successes, reports[1][1].queries)


def test_one_seeding_rule_and_one_cut_in_auto_evaluation_and_the_session(tmp_path, student):
    """Episode k starts from seed base + k in every mode, and a cut episode's last step says truncated."""
    mapping = load_mapping("toy_reach")
    store = EpisodeStore.create(str(tmp_path / "auto"))
    with make_env(mapping, num_envs=2, seed=0) as env:
        rec = store.recorder()
        col = Collector(env, make_expert("toy_reach", "planner", mapping=mapping), rec, mode="dagger_sync", seed=0,
                        max_episode_steps=6)
        col.set_policy(student, iteration=0, beta=0.5)
        col.run(episodes=5, reset_seed=20)
        rec.close()
        ev = closed_loop(student, env, EvalConfig(episodes=5, num_envs=2, seed=20, max_steps=6))
    cfg = load_run_config(None, "toy_reach", num_envs=2, calibrate_steps=0, seed=20, max_episode_steps=6,
                          gates=GateConfig(name="none", gates=[OperatorGate()]))
    rec = EpisodeStore.create(str(tmp_path / "gated")).recorder(flush_interval_s=0.05)
    with make_env("toy_reach", num_envs=2, seed=0) as env:
        build_session(cfg, rec, student, env=env).run(5, progress=False)
        rec.close()
    for path in ("auto", "gated"):
        s = EpisodeStore.open(str(tmp_path / path))
        infos = s.episodes()
        assert sorted(i.start.initial_state["seed"] for i in infos) == list(range(20, 25))
        for i in infos:
            d = s.read_steps(i.episode_id)
            assert len(d["truncated"]) == 6 and d["truncated"][-1] and not d["truncated"][:-1].any()
            assert i.end.end_reason.value == ("timeout" if not d["terminated"][-1] else
                                              "success" if i.end.task_success else "failure")
    assert [e["seed"] for e in ev["per_episode"]] == list(range(20, 25))
    for path in ("auto", "gated"):  # a cut step is the cut's, not the env's: a replay says so
        assert replay_store(str(tmp_path / path), write=False, progress=False).mismatches == []
    assert all(e["length"] == 6 for e in ev["per_episode"] if not e["success"])


class _PerEpisode:
    """A sink that keeps each episode's applied actions and action sources, by episode seed."""

    def __init__(self, n):
        self.seed_of, self.steps = [None] * n, {}

    def begin(self, row, seed, index):
        self.seed_of[row] = seed
        self.steps[seed] = []

    def step(self, tick):
        for r in np.flatnonzero(tick.active).tolist():
            self.steps[self.seed_of[r]].append((tick.applied[r].copy(), int(tick.source[r])))

    def end(self, row, tick, *, complete):
        pass


def _take_over_run(student, switch_at, seeds):
    from hg_dagger.control.engine import Engine, EpisodeRows, TakeOver, task_safety
    from hg_dagger.control.safety import SafetyMonitor

    mapping = load_mapping("toy_reach")
    sink = _PerEpisode(2)
    with make_env(mapping, num_envs=2, seed=0) as env:
        arbiter = TakeOver(make_expert("toy_reach", "planner", mapping=mapping), mapping, switch_at)
        monitor = SafetyMonitor(task_safety("toy_reach"), num_envs=2, action_dim=mapping.action_dim)
        Engine(env, student, arbiter, monitor, rows=EpisodeRows(2, seeds=seeds, limit=40), sinks=[sink]).run(
            episodes=len(seeds))
    return sink.steps


def test_take_over_replays_the_students_episode_then_hands_it_to_the_expert(student):
    """An episode replayed from its seed is the student's own up to the switch step (the same applied actions), and
    the expert's from there on; switch steps are per episode seed, whatever row runs it."""
    seeds = [30, 31, 32]
    never = _take_over_run(student, {s: 10**6 for s in seeds}, seeds)
    switched = _take_over_run(student, {30: 5, 31: 0, 32: 12}, seeds)
    for seed, k in ((30, 5), (31, 0), (32, 12)):
        assert all(src == int(ActionSource.POLICY.code) for _, src in never[seed])
        for i, ((a, src), (b, _)) in enumerate(zip(switched[seed], never[seed], strict=False)):
            if i < k:
                assert src == int(ActionSource.POLICY.code) and np.array_equal(a, b), (seed, i)
            else:
                assert src in (EXPERT, SAFETY), (seed, i)
        assert any(not np.array_equal(a, b) for (a, _), (b, _) in zip(switched[seed][k:], never[seed][k:],
                                                                       strict=False))


def test_the_engine_tells_a_chunk_student_where_each_episode_begins():
    """A chunk head ensembles its chunks over a row's steps; each episode's first action is the fresh chunk's own
    (nothing of the row's previous episode), later ones blend the chunks made on the episode's earlier steps."""
    from hg_dagger.control.engine import Engine, EpisodeRows, StudentOnly, task_safety
    from hg_dagger.control.safety import SafetyMonitor

    mapping = load_mapping("toy_reach")
    chunked = Student.create(mapping, kind="mlp_chunk", ensemble=2, hidden=(16,), seed=0)
    seen = []

    class Actions:
        def begin(self, row, seed, index):
            pass

        def step(self, tick):
            seen.append(({k: v.copy() for k, v in tick.obs.items()}, tick.policy.action.copy(), tick.steps.copy()))

        def end(self, row, tick, *, complete):
            pass

    with make_env(mapping, num_envs=2, seed=0) as env:
        safety = SafetyMonitor(task_safety("toy_reach"), num_envs=2, action_dim=mapping.action_dim)
        Engine(env, chunked, StudentOnly(), safety, rows=EpisodeRows(2, limit=5), sinks=[Actions()]).run(episodes=4)
    firsts = lasts = 0
    for obs, action, steps in seen:
        for r in range(2):
            alone = chunked.act({k: v[r : r + 1] for k, v in obs.items()}).action[0]  # one row: no rollout memory
            if steps[r] == 1:
                np.testing.assert_allclose(action[r], alone, atol=1e-6)
                firsts += 1
            else:
                assert not np.allclose(action[r], alone, atol=1e-6)
                lasts += 1
    assert firsts == 4 and lasts > 0


def test_a_rollout_acts_on_one_inference_thread_and_gives_the_trainers_threads_back(student):
    """Evaluation inside a process that trains: the student acts on one thread during the run (a second one
    waiting on a busy core made each act() twenty times slower), and the trainer's thread count is back after."""
    seen: list[int] = []

    class Threads:
        def begin(self, row, seed, index):
            pass

        def step(self, tick):
            seen.append(torch.get_num_threads())

        def end(self, row, tick, *, complete):
            pass

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with make_env("toy_reach", num_envs=2, seed=0) as env:
            monitor = SafetyMonitor(task_safety("toy_reach"), num_envs=2, action_dim=env.mapping.action_dim)
            Engine(env, student, StudentOnly(), monitor, rows=EpisodeRows(2, seeds=[0, 1], limit=5),
                   sinks=[Threads()]).run(episodes=2)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
