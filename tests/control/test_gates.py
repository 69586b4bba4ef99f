"""Gate engine: every gate type, warning before trigger, hysteresis, debounce, events, calibration, config."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger import config
from hg_dagger.contract.enums import EventKind
from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gate_specs import (
    ConfidenceGate,
    ConstraintGate,
    GateConfig,
    OperatorGate,
    PolicyFailedGate,
    ProgressEtaGate,
    ProgressStallGate,
    SignalGate,
)
from hg_dagger.control.gate_thresholds import Calibration, calibrate_threshold
from hg_dagger.control.gates import OK, TRIGGER, WARN, GateEngine
from hg_dagger.control.limits import ActionLimits, StateBox
from hg_dagger.control.run_config import load_gate_config
from hg_dagger.errors import ConfigError

A = 2


def _engine(*gates, n=1, dt=0.1):
    return GateEngine(GateConfig(gates=list(gates)), num_envs=n, step_dt=dt, action_dim=A)


def _inp(t, n=1, u=0.0, action=None, signals=None, takeover=None, obs=None, prev=None, succeeding=None,
         steps_left=None):
    return GateInputs(
        step=np.full(n, t, np.int64), t_ns=1000 + t, uncertainty=np.broadcast_to(np.float32(u), (n,)).copy(),
        action=np.zeros((n, A), np.float32) if action is None else np.asarray(action, np.float32),
        obs=obs or {}, signals=signals or {}, takeover=takeover,
        prev_applied=prev, prev_ok=None if prev is None else np.ones(n, bool),
        succeeding=None if succeeding is None else np.asarray(succeeding, bool),
        steps_left=None if steps_left is None else np.asarray(steps_left, np.int64))


def _run(engine, series, **kw):
    armed = np.ones(engine.n, bool)
    return [engine.update(_inp(t, n=engine.n, **{k: v[t] for k, v in series.items()}, **kw), armed) for t in range(len(next(iter(series.values()))))]


def test_confidence_warns_before_it_triggers_and_events_carry_times_and_values():
    e = _engine(ConfidenceGate(warn=0.3, trigger=0.5))
    outs = _run(e, {"u": [0.1, 0.35, 0.4, 0.7]})
    assert [int(o.level[0]) for o in outs] == [OK, WARN, WARN, TRIGGER]
    kinds = [(ev.kind, ev.step) for o in outs for _, ev in o.events]
    assert kinds == [(EventKind.GATE_WARNING, 1), (EventKind.GATE_TRIGGER, 3)]
    trig = outs[3].events[0][1]
    assert trig.reason == "confidence"
    assert trig.values["t_warn"] == 1001 and trig.values["t_gate"] == 1003
    assert trig.values["confidence"]["uncertainty"] == pytest.approx(0.7)
    assert trig.values["confidence"]["trigger"] == 0.5


def test_jump_straight_to_trigger_sets_warn_time_equal_to_gate_time():
    e = _engine(ConfidenceGate(warn=0.3, trigger=0.5))
    out = _run(e, {"u": [0.9]})[0]
    assert out.level[0] == TRIGGER
    assert e.t_warn[0] == e.t_gate[0] == 1000


def test_hysteresis_keeps_level_until_score_falls_below_clear_threshold():
    e = _engine(ConfidenceGate(warn=0.5, trigger=1.0, hysteresis=0.2))
    outs = _run(e, {"u": [0.6, 0.45, 0.41, 0.39, 0.6]})
    # warn clears only below 0.5 * 0.8 = 0.4
    assert [int(o.level[0]) for o in outs] == [WARN, WARN, WARN, OK, WARN]


def test_debounce_needs_consecutive_ticks():
    e = _engine(ConfidenceGate(trigger=0.5, debounce_ticks=3))
    outs = _run(e, {"u": [0.9, 0.9, 0.1, 0.9, 0.9, 0.9]})
    assert [int(o.level[0]) for o in outs] == [OK, OK, OK, OK, OK, TRIGGER]


def test_unarmed_envs_keep_their_level_and_rearm_clears():
    e = _engine(ConfidenceGate(trigger=0.5), n=2)
    e.update(_inp(0, n=2, u=0.9), np.array([True, False]))
    assert list(e.level) == [TRIGGER, OK]
    e.update(_inp(1, n=2, u=0.0), np.array([False, False]))
    assert list(e.level) == [TRIGGER, OK]
    e.rearm([0])
    assert e.level[0] == OK and e.t_gate[0] == -1


def test_progress_stall_counts_control_time_without_improvement():
    e = _engine(ProgressStallGate(warn=0.2, trigger=0.4, min_delta=0.01), dt=0.1)
    prog = [0.0, 0.05, 0.055, 0.055, 0.056, 0.056, 0.057]
    outs = _run(e, {"signals": [{"progress": np.array([p])} for p in prog]})
    levels = [int(o.level[0]) for o in outs]
    # best improves at step 1; stalled 0.1 s per step afterwards: warn at step 3 (0.2 s), trigger at step 5 (0.4 s)
    assert levels == [OK, OK, OK, WARN, WARN, TRIGGER, TRIGGER]
    ev = outs[5].events[0][1]
    assert ev.values["progress_stall"]["best_step"] == 1
    assert ev.values["progress_stall"]["stalled_s"] == pytest.approx(0.4)


def test_a_task_that_succeeds_is_not_stalled():
    """Holding the block at the goal cannot raise progress: while success holds the stall clock restarts; once
    success is lost (the block slips), stalling counts again from there."""
    e = _engine(ProgressStallGate(warn=0.2, trigger=0.4, min_delta=0.01), dt=0.1)
    prog = [0.0, 0.05] + [0.05] * 8 + [0.04] * 6
    ok = [False, False] + [True] * 8 + [False] * 6
    outs = _run(e, {"signals": [{"progress": np.array([p])} for p in prog], "succeeding": [[x] for x in ok]})
    levels = [int(o.level[0]) for o in outs]
    assert levels[:10] == [OK] * 10  # 0.8 s at the goal without progress: no stall
    assert levels[10:] == [OK, WARN, WARN, TRIGGER, TRIGGER, TRIGGER]  # counted from the last successful step (9)
    ev = next(ev for o in outs for _, ev in o.events if ev.kind == EventKind.GATE_TRIGGER)
    assert ev.values["progress_stall"]["best_step"] == 9


def test_progress_eta_asks_when_the_pace_cannot_reach_the_goal_in_the_time_left():
    """Two rows creep at the same pace, 0.1 per second (0.01 per 0.1 s tick), about 1.0 short of the goal: about
    10 s needed. The one with about 20 s left is in time (score about 0.5); the one with about 5 s left asks (about
    2). A stall gate would see neither: both improve every tick."""
    e = _engine(ProgressEtaGate(goal=0.0, window_s=0.5, warn=0.8, trigger=1.0), n=2, dt=0.1)
    prog = [np.full(2, -1.0 + 0.01 * t) for t in range(12)]
    left = [np.array([200 - t, 50 - t]) for t in range(12)]
    outs = _run(e, {"signals": [{"progress": p} for p in prog], "steps_left": left})
    assert [int(o.level[1]) for o in outs[:5]] == [OK] * 5  # the first half second measures the pace
    assert int(outs[5].level[1]) == TRIGGER and all(int(o.level[0]) == OK for o in outs)
    assert e.scores[0, 0] == pytest.approx(0.89 / 0.1 / 18.9, rel=1e-4)  # 8.9 s needed, 18.9 s left
    ev = outs[5].events[-1][1]
    assert ev.reason == "progress_eta" and ev.values["progress_eta"]["pace_per_s"] == pytest.approx(0.1)
    assert ev.values["progress_eta"]["seconds_left"] == pytest.approx(4.5)
    assert e.scores[0, 1] == pytest.approx(0.89 / 0.1 / 3.9, rel=1e-4)


def test_progress_eta_is_quiet_at_the_goal_without_a_limit_and_after_a_rearm():
    """No pace at all scores its cap once the window is full, but not at the goal, not where the episode has no
    step limit, not while the success condition holds, and not until a new window has filled after a rearm (a
    hand-back)."""
    e = _engine(ProgressEtaGate(goal=0.0, window_s=0.3, trigger=1.0, cap=10.0), n=3, dt=0.1)
    flat = {"progress": np.array([-0.5, 0.01, -0.5])}
    for t in range(4):
        out = e.update(_inp(t, n=3, signals=flat, steps_left=[100, 100, 100]), np.ones(3, bool))
    assert list(out.level) == [TRIGGER, OK, TRIGGER] and e.scores[0, 0] == pytest.approx(10.0)
    e.rearm([0, 2])
    out = e.update(_inp(4, n=3, signals=flat, steps_left=[100, 100, 100]), np.ones(3, bool))
    assert list(out.level) == [OK, OK, OK]
    out = e.update(_inp(5, n=3, signals=flat), np.ones(3, bool))  # steps_left None: no limit, no deadline
    assert list(out.level) == [OK, OK, OK]
    for t in range(6, 10):  # the success condition holds in row 2: done, whatever the signal says
        out = e.update(_inp(t, n=3, signals=flat, steps_left=[100] * 3, succeeding=[False, False, True]),
                       np.ones(3, bool))
    assert list(out.level) == [TRIGGER, OK, OK]


def test_progress_stall_without_signal_never_fires():
    e = _engine(ProgressStallGate(trigger=0.1))
    outs = _run(e, {"u": [0.0] * 5})
    assert all(o.level[0] == OK for o in outs)


def test_constraint_gate_action_bounds_rate_and_workspace():
    lim = ActionLimits(low=[-1, -1], high=[1, 1], max_delta=[0.5, 0.5],
                       boxes=[StateBox(obs_key="pos", index=[0], action_index=[0], gain=0.1, low=[0.0], high=[1.0])])
    e = _engine(ConstraintGate(limits=lim, warn=0.9, trigger=1.0))
    obs = {"pos": np.array([[0.5]], np.float32)}
    prev = np.zeros((1, A), np.float32)
    armed = np.ones(1, bool)
    assert e.update(_inp(0, action=[[0.2, 0.2]], obs=obs, prev=prev), armed).level[0] == OK
    # a per-tick change of 0.6 > 0.5 is an acceleration violation
    out = e.update(_inp(1, action=[[0.0, 0.6]], obs=obs, prev=prev), armed)
    assert out.level[0] == TRIGGER
    v = out.events[-1][1].values["constraint"]
    assert v["check"] == "max_delta" and v["dim"] == 1 and v["value"] == pytest.approx(0.6)
    e.rearm([0])
    # near the workspace edge: pos 0.95 + 0.1 * 0.3 = 0.98 -> usage 0.96 -> warning only
    out = e.update(_inp(2, action=[[0.3, 0.0]], obs={"pos": np.array([[0.95]], np.float32)}, prev=prev), armed)
    assert out.level[0] == WARN
    assert out.events[0][1].values["constraint"]["check"] == "workspace"
    # outside the workspace
    out = e.update(_inp(3, action=[[0.4, 0.0]], obs={"pos": np.array([[0.98]], np.float32)}, prev=prev), armed)
    assert out.level[0] == TRIGGER


def test_constraint_gate_dimension_mismatch_is_a_config_error():
    with pytest.raises(ConfigError, match="low has 3 values"):
        _engine(ConstraintGate(limits=ActionLimits(low=[-1, -1, -1], high=[1, 1, 1])))


@pytest.mark.parametrize("signal", ["collision_imminent", "object_dropped"])
def test_signal_gates_fire_on_the_signal(signal):
    e = _engine(SignalGate(name=signal, signal=signal), n=2)
    out = e.update(_inp(0, n=2, signals={signal: np.array([0.0, 1.0])}), np.ones(2, bool))
    assert list(out.level) == [OK, TRIGGER]
    assert out.events[-1][1].reason == signal and out.events[-1][1].values[signal][signal] == 1.0


def test_policy_failed_by_signal_and_by_progress_regression():
    e = _engine(PolicyFailedGate(max_regression=0.1), n=2)
    armed = np.ones(2, bool)
    e.update(_inp(0, n=2, signals={"progress": np.array([0.5, 0.5]), "policy_failed": np.array([0, 0])}), armed)
    out = e.update(_inp(1, n=2, signals={"progress": np.array([0.45, 0.35]), "policy_failed": np.array([0, 0])}), armed)
    assert list(out.level) == [OK, TRIGGER]
    assert out.events[-1][1].values["policy_failed"]["best_progress"] == pytest.approx(0.5)
    out = e.update(_inp(2, n=2, signals={"progress": np.array([0.45, 0.35]), "policy_failed": np.array([1, 0])}), armed)
    assert out.level[0] == TRIGGER


def test_operator_takeover_is_a_gate_event_even_when_not_configured():
    e = _engine(ConfidenceGate(trigger=0.5))
    assert [g.name for g in e.gates] == ["confidence", "operator"]
    out = e.update(_inp(0, takeover=np.array([True])), np.ones(1, bool))
    assert out.level[0] == TRIGGER and out.events[-1][1].reason == "operator"


def test_two_gates_tripping_together_both_named():
    e = _engine(ConfidenceGate(trigger=0.5), SignalGate(name="drop", signal="object_dropped"))
    out = e.update(_inp(0, u=0.9, signals={"object_dropped": np.array([1.0])}), np.ones(1, bool))
    ev = out.events[-1][1]
    assert ev.reason == "confidence+drop" and set(ev.values) >= {"confidence", "drop"}


def test_quantile_rule_matches_target_rate():
    rng = np.random.default_rng(0)
    u = rng.exponential(size=10_000)
    thr = calibrate_threshold(u, 0.1)
    assert np.mean(u > thr) == pytest.approx(0.1, abs=0.005)
    with pytest.raises(ValueError):
        calibrate_threshold(np.array([np.nan]), 0.1)


def test_engine_calibrates_from_recent_autonomous_data():
    e = _engine(ConfidenceGate(trigger=100.0, calibration=Calibration(target_rate=0.2, min_samples=50, window=100)))
    assert e.calibrate() is None  # too few samples yet
    for chunk in np.split(np.arange(300, dtype=np.float32), 6):  # the ring keeps only the last 100: 200..299
        e.observe_autonomous(chunk)
    res = e.calibrate()
    assert res["samples"] == 100
    assert res["trigger"] == pytest.approx(np.quantile(np.arange(200, 300), 0.8))
    assert res["warn"] <= res["trigger"]
    assert e.describe()["gates"][0]["trigger"] == pytest.approx(res["trigger"])
    out = e.update(_inp(0, u=res["trigger"] + 1), np.ones(1, bool))
    assert out.level[0] == TRIGGER


def test_calibration_without_section_is_a_config_error():
    with pytest.raises(ConfigError, match="calibration"):
        _engine(ConfidenceGate(trigger=1.0)).calibrate(np.ones(10))


def test_shipped_gate_configs_load(tmp_path):
    from pathlib import Path

    files = sorted(Path(config.CONFIG_DIR, "gates").glob("*.yaml"))
    assert files, "configs/gates/ ships at least one gate config"
    for f in files:
        assert isinstance(config.check(f), GateConfig)


def test_bad_gate_config_names_file_and_key(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text("kind: gates\ngates:\n  - type: confidence\n    warn: 0.9\n    trigger: 0.5\n  - type: nope\n    trigger: 1\n")
    with pytest.raises(ConfigError) as exc:
        config.check(p)
    msg = str(exc.value)
    assert str(p) in msg and "gates.0" in msg and "gates.1" in msg


def test_a_gate_config_that_extends_another_lists_only_what_it_changes(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("kind: gates\nname: base\ngrace_after_reset_s: 1.0\ngates:\n"
                    "  - {type: confidence, trigger: 0.5}\n  - {type: progress_stall, trigger: 3.0}\n"
                    "  - {type: signal, name: drop, signal: object_dropped, trigger: 0.5}\n")
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"kind: gates\nextends: {base}\nname: variant\ngates:\n"
                       "  - {type: progress_stall, trigger: 1.2}\n  - {type: progress_eta, goal: -0.06, trigger: 1.0}\n")
    cfg = config.check(variant)
    assert cfg.name == "variant" and cfg.grace_after_reset_s == 1.0  # the base's keys, its own on top
    # a gate of the base's name is replaced where it stood; a new one comes after the base's
    assert [g.name for g in cfg.gates] == ["confidence", "progress_stall", "drop", "progress_eta"]
    assert cfg.gates[1].trigger == 1.2

    shipped = load_gate_config("fetch_pick_place", "fetch_pick_place")
    eta = load_gate_config("fetch_pick_place_eta", "fetch_pick_place")
    # progress_eta is shipped in the task's own gates now; the variant's name stays for earlier commands
    assert eta.gates == shipped.gates and any(g.type == "progress_eta" for g in shipped.gates)


def test_a_gate_config_whose_base_is_missing_or_a_cycle_is_named(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("kind: gates\nextends: no_such_gates\n")
    with pytest.raises(ConfigError) as exc:
        config.check(a)
    assert str(a) in str(exc.value) and "no_such_gates" in str(exc.value) and "fetch_pick_place" in str(exc.value)
    a.write_text(f"kind: gates\nextends: {b}\n")
    b.write_text(f"kind: gates\nextends: {a}\n")
    with pytest.raises(ConfigError, match="cycle"):
        config.check(a)


def test_duplicate_gate_names_refused():
    with pytest.raises(ValueError, match="unique"):
        GateConfig(gates=[SignalGate(name="x", signal="a"), SignalGate(name="x", signal="b")])


def test_operator_gate_config_is_kept_when_given():
    e = _engine(OperatorGate(name="button", debounce_ticks=1))
    assert [g.name for g in e.gates] == ["button"]
