"""The risk gate (ThriftyDAgger's risk half): a classifier of failure from the state, its file, its
quantile calibration to a target intervention rate, and a real session on toy_reach asking for the operator."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.enums import EventKind
from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gate_specs import GateConfig, OperatorGate, RiskGate
from hg_dagger.control.gates import GateEngine
from hg_dagger.control.risk_model import RiskModel
from hg_dagger.errors import ConfigError


def _states(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 3)).astype(np.float32)
    return {"a": x[:, :2], "b": x[:, 2:]}, x


def _model(tmp_path, seed=0):
    obs, x = _states(2000, seed)
    failed = (x[:, 0] + 0.5 * x[:, 2] > 0.4)  # the policy fails from one region of the state space
    model = RiskModel.fit(obs, failed, hidden=16, steps=300, seed=seed)
    path = tmp_path / "risk.npz"
    model.save(path)
    return model, path


def test_risk_model_learns_where_the_policy_fails(tmp_path):
    model, _ = _model(tmp_path)
    obs, x = _states(1000, seed=1)
    truth = x[:, 0] + 0.5 * x[:, 2] > 0.4
    p = model.predict(obs)
    assert p.dtype == np.float32 and p.shape == (1000,)
    assert ((p > 0.5) == truth).mean() > 0.9
    assert p[truth].mean() > 0.7 and p[~truth].mean() < 0.3


def test_risk_model_file_round_trip_and_bad_file(tmp_path):
    model, path = _model(tmp_path)
    obs, _ = _states(50, seed=2)
    assert np.array_equal(RiskModel.load(path).predict(obs), model.predict(obs))
    bad = tmp_path / "bad.npz"
    bad.write_text("not numpy")
    with pytest.raises(ConfigError, match="bad.npz"):
        RiskModel.load(bad)
    with pytest.raises(ValueError, match="3 states and 2 outcomes"):
        RiskModel.fit({"a": np.zeros((3, 2))}, np.zeros(2))


def _engine(path, n, **kw):
    cfg = GateConfig.model_validate({"gates": [{"type": "risk", "model": str(path), "trigger": 0.5, **kw},
                                               {"type": "operator"}]})
    return GateEngine(cfg, num_envs=n, step_dt=0.04, action_dim=2)


def _inputs(obs, n):
    return GateInputs(step=np.zeros(n, np.int64), t_ns=1, action=np.zeros((n, 2), np.float32),
                      uncertainty=np.zeros(n, np.float32), obs=obs)


def test_risk_gate_triggers_on_risky_states_only(tmp_path):
    model, path = _model(tmp_path)
    obs, x = _states(64, seed=3)
    engine = _engine(path, 64)
    out = engine.update(_inputs(obs, 64), np.ones(64, bool))
    risky = model.predict(obs) >= 0.5
    assert risky.any() and (~risky).any()
    assert set(out.triggered.tolist()) == set(np.flatnonzero(risky).tolist())
    row, ev = next((r, e) for r, e in out.events if e.kind == EventKind.GATE_TRIGGER)
    assert ev.reason == "risk" and ev.values["risk"]["risk"] == pytest.approx(float(model.predict(obs)[row]))
    # unarmed rows (the operator in control) never change level
    engine.rearm(np.arange(64))
    out = engine.update(_inputs(obs, 64), np.zeros(64, bool))
    assert out.triggered.size == 0


def test_risk_gate_without_a_model_never_fires():
    engine = GateEngine(GateConfig(gates=[RiskGate(), OperatorGate()]), num_envs=4, step_dt=0.04, action_dim=2)
    obs, _ = _states(4)
    assert engine.update(_inputs(obs, 4), np.ones(4, bool)).triggered.size == 0


def test_calibration_sets_the_trigger_for_a_target_rate(tmp_path):
    model, path = _model(tmp_path)
    engine = _engine(path, 8, calibration={"target_rate": 0.05, "min_samples": 100})
    obs, _ = _states(4000, seed=4)
    scores = model.predict(obs)
    cal = engine.calibrate_gate("risk", scores)
    assert cal["samples"] == 4000 and cal["target_rate"] == 0.05
    assert engine.thresholds()["risk"]["trigger"] == pytest.approx(cal["trigger"])
    fresh, _ = _states(4000, seed=5)
    rate = (model.predict(fresh) >= cal["trigger"]).mean()
    assert 0.03 < rate < 0.07  # about the target on states from the same distribution
    assert engine.calibrate_gate("risk", scores[:50]) is None  # too few samples: unchanged
    with pytest.raises(ConfigError, match="operator"):
        engine.calibrate_gate("operator", scores)


def test_a_risk_gate_in_a_real_session_hands_risky_states_to_the_operator(tmp_path):
    from hg_dagger.control.build import build_session
    from hg_dagger.control.run_config import load_run_config
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    env = make_env("toy_reach", num_envs=2, seed=0)
    keys = list(env.mapping.obs_spec())
    obs, _ = env.reset(seed=0)
    # a model that calls every state risky: the gate must ask for the operator at once
    rng = np.random.default_rng(0)
    states = {k: np.repeat(v, 200, axis=0) + rng.normal(0, 0.3, (400, *v.shape[1:])).astype(np.float32)
              for k, v in obs.items() if k in keys}
    model = RiskModel.fit(states, np.ones(400), keys=keys, steps=50)
    model.w2[:] = 0.0
    model.b2[:] = 5.0
    model.save(tmp_path / "risk.npz")
    gates = GateConfig.model_validate({"name": "risk_only", "gates": [
        {"type": "risk", "model": str(tmp_path / "risk.npz"), "trigger": 0.5}, {"type": "operator"}]})
    cfg = load_run_config(None, "toy_reach", num_envs=2, gates=gates, calibrate_steps=0,
                          **{"operator.certification": "planner_auto", "operator.noise_std": 0.0})
    store = EpisodeStore.create(tmp_path / "store")
    rec = store.recorder()
    try:
        session = build_session(cfg, rec, Student.create(env.mapping, seed=0), env=env)
        summary = session.run(2, progress=False)
    finally:
        rec.close()
        env.close()
    assert summary.context_switches >= 1 and summary.human_steps > 0
    windows = [w for e in summary.episode_ids for w in store.labels(e).windows]
    assert windows and all("risk" in w.gate_reason for w in windows)
