"""One task time budget: gated collection and evaluation cut episodes at the same step, and the progress-ETA
gate's goal is learned from successful rollouts only."""

from __future__ import annotations

import numpy as np
import pytest
from support.auto import small_student

from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gate_specs import EtaCalibration, GateConfig, ProgressEtaGate
from hg_dagger.control.gates import TRIGGER, GateEngine
from hg_dagger.control.run_config import load_gate_config, load_run_config
from hg_dagger.envs import load_mapping
from hg_dagger.learn.auto_config import AutoConfig
from hg_dagger.learn.budget import task_budget


def test_the_budget_lives_in_the_run_config_else_the_horizon():
    assert task_budget("fetch_pick_place") == load_run_config(None, "fetch_pick_place").max_episode_steps == 80
    assert task_budget("mw_push") == 200
    assert task_budget("toy_reach") == load_mapping("toy_reach").horizon  # no budget of its own
    assert task_budget(load_mapping("fetch_pick_place")) == 80


def test_human_gated_auto_uses_one_budget_and_refuses_two():
    cfg = AutoConfig(task="fetch_pick_place", mode="human_gated")
    assert cfg.eval.max_steps == cfg.gated.max_episode_steps == 80
    assert cfg.promoting and not AutoConfig(task="fetch_pick_place", mode="dagger_sync").promoting
    with pytest.raises(ValueError, match="cut at 80 steps and evaluation at 150"):
        AutoConfig(task="fetch_pick_place", mode="human_gated", eval={"max_steps": 150})


def test_the_eta_gate_is_on_wherever_a_task_has_a_progress_signal():
    for task in ("fetch_pick_place", "mw_push", "fetch_push"):  # fetch_push has no gates of its own: the default
        gates = {g.type: g for g in load_gate_config("", task).gates}
        assert "progress_eta" in gates and gates["progress_eta"].calibration is not None, task
    with pytest.raises(ValueError, match="give a goal, or a calibration"):
        ProgressEtaGate(trigger=1.0)


def _tick(engine, step, progress, succeeding, steps_left):
    n = len(progress)
    inp = GateInputs(step=np.full(n, step, np.int64), t_ns=step, action=np.zeros((n, 2), np.float32),
                     uncertainty=np.full(n, np.nan, np.float32), obs={},
                     signals={"progress": np.asarray(progress, np.float64)},
                     succeeding=np.asarray(succeeding, bool), steps_left=np.full(n, steps_left, np.int64))
    return engine.update(inp, np.ones(n, bool))


def test_the_eta_goal_is_learned_from_success_onsets_alone():
    spec = ProgressEtaGate(signal="progress", calibration=EtaCalibration(min_successes=3), window_s=0.2,
                           trigger=1.0)
    engine = GateEngine(GateConfig(gates=[spec]), num_envs=2, step_dt=0.1, action_dim=2)
    eta = engine.gates[0]
    # row 1 creeps towards the goal too slowly all along: no goal is known yet, so nothing asks
    for t in range(5):
        out = _tick(engine, t, [-0.5, -0.9 + 0.001 * t], [False, False], steps_left=10)
        assert out.triggered.size == 0
    # failures never teach the goal; three success onsets in row 0 do (at -0.1, -0.2, -0.3: median -0.2)
    asked_at = []
    for k, onset in enumerate((-0.1, -0.2, -0.3)):
        out = _tick(engine, 10 + 2 * k, [onset, -0.9], [True, False], steps_left=10)
        asked_at += [10 + 2 * k] * int(1 in out.triggered)
        assert engine.scores[0, 0] == 0.0  # a row whose task succeeds is done, whatever its signal says
        out = _tick(engine, 11 + 2 * k, [-0.6, -0.9], [False, False], steps_left=10)
        asked_at += [11 + 2 * k] * int(1 in out.triggered)
    state = eta.calibration_state()
    assert state == {"goal": pytest.approx(-0.2), "goal_source": "successes", "successes": 3}
    assert engine.describe()["gates"][0]["goal"] == pytest.approx(-0.2)
    # from the third onset on, row 1 (no pace at all, 0.7 to go, 1 s left) is asked for, not before
    assert asked_at == [14] and engine.level[1] == TRIGGER


@pytest.mark.simulation
@pytest.mark.subprocess  # the first import of gymnasium_robotics runs glfw's version check in a child process
def test_gated_collection_and_evaluation_cut_fetch_at_the_same_step(tmp_path):
    from hg_dagger.control.build import build_session
    from hg_dagger.envs import make_env
    from hg_dagger.learn.evaluate import EvalConfig, closed_loop
    from hg_dagger.store import EpisodeStore

    mapping = load_mapping("fetch_pick_place")
    student = small_student("fetch_pick_place")  # untrained: never succeeds in time
    cfg = load_run_config(None, "fetch_pick_place", num_envs=2, calibrate_steps=0, seed=3,
                          **{"operator.availability": 0.0})  # nobody answers: the student drives to the cut
    store = EpisodeStore.create(tmp_path / "store")
    rec = store.recorder()
    with make_env(mapping, num_envs=2, seed=3) as env:
        session = build_session(cfg, rec, student, env=env)
        session.run(2, progress=False)
        rec.close()
        ev = closed_loop(student, env, EvalConfig(episodes=2, num_envs=2))
    lengths = {i.end.num_steps for i in EpisodeStore.open(tmp_path / "store").episodes()}
    assert lengths == {80} and ev["episode_length_mean"] == 80 < mapping.horizon
