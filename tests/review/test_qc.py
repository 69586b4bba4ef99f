"""Automated QC (`hg-dagger qc`) on real stores: sessions recorded on toy_reach with the real session loop, and
episodes written through the public Recorder / write_labels API with a defect put in on purpose, one per check."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import support.store as sh

from hg_dagger.cli import main
from hg_dagger.contract.enums import (
    ActionSource,
    ControlState,
    EndReason,
    RecoveryOutcome,
    ReviewStatus,
)
from hg_dagger.contract.schema import EpisodeEnd, ReviewDecision
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import make_env
from hg_dagger.errors import ConfigError, ContractError, StoreError
from hg_dagger.policy import Student
from hg_dagger.review.qc import AUTHOR, run_qc
from hg_dagger.review.qc_checks import CHECKS
from hg_dagger.review.qc_config import QCConfig, load_qc_config
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

ALWAYS = GateConfig(name="always", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])
# Toy runs are not real time: a loaded test machine can take longer than two control periods per tick. Tests that
# are not about latency give QC a budget no tick reaches, so only recorded flags and the data decide.
LOOSE = QCConfig(latency_budget_ms=600_000)


@pytest.fixture(scope="module")
def student():
    return Student.create(make_env("toy_reach", num_envs=1).mapping, seed=0, ensemble=3, hidden=(32, 32))


def _record(path, student, episodes=2, n=1, *, ticks=None, **over):
    """Record ``episodes`` gated toy_reach episodes into a new store at ``path`` with the real session loop."""
    over.setdefault("calibrate_steps", 0)
    over.setdefault("operator.return_after_steps", 12)
    over.setdefault("gates", ALWAYS)
    cfg = load_run_config(None, "toy_reach", num_envs=n, **over)
    rec = EpisodeStore.create(str(path)).recorder(flush_interval_s=0.05)
    session = build_session(cfg, rec, student, env=make_env("toy_reach", num_envs=n, seed=0))
    if ticks is None:
        session.run(episodes, progress=False)
    else:
        ticks(session)
    rec.close()
    return str(path)


def _by_window(summary):
    return {r.window_id: r for e in summary.episodes for r in e.windows}


# ------------------------------------------------------------------------------------------ clean data


def test_clean_gated_store_passes_and_a_rerun_writes_nothing(tmp_path, student):
    url = _record(tmp_path / "s", student, episodes=3)
    before = EpisodeStore.open(url)
    prev = {i.episode_id: before.labels(i.episode_id) for i in before.episodes()}

    summary = run_qc(url, config=LOOSE)
    assert len(summary.episodes) == 3 and summary.layers_written == 3 and not summary.errors
    store = EpisodeStore.open(url)
    for e in summary.episodes:
        layer = store.labels(e.episode_id)
        old = prev[e.episode_id]
        assert layer.author == AUTHOR and layer.version == 2
        assert [w.window_id for w in layer.windows] == [w.window_id for w in old.windows] and old.windows
        np.testing.assert_array_equal(layer.mask, old.mask)  # QC never changes what is trainable
        assert layer.qc == e.results
        assert layer.qc[0].window_id is None and [q.window_id for q in layer.qc[1:]] == [w.window_id for w in old.windows]
        for r in layer.qc:
            assert set(r.checks) == set(CHECKS)
            assert r.passed, r.flags
            assert not r.checks["review"] and "review_pending" in r.flags  # nobody has reviewed yet
    assert not validate_store(store)
    wins = summary.to_json()["checks"]["windows"]
    assert wins["label_consistency"] == {"passed": len(_by_window(summary)), "failed": 0}

    again = run_qc(url, config=LOOSE)
    assert again.layers_written == 0 and again.unchanged == 3
    assert [EpisodeStore.open(url).label_versions(e.episode_id) for e in again.episodes] == [[1, 2]] * 3
    assert "0 layer(s) written, 3 unchanged" in again.line()
    stricter = run_qc(url, config=QCConfig(latency_budget_ms=1e-6))  # other thresholds, other results
    assert stricter.layers_written == 3 and not any(e.episode.passed for e in stricter.episodes)


def test_review_decisions_and_recovery_outcomes_are_reported_beside_quality(tmp_path, student):
    url = _record(tmp_path / "s", student, episodes=2)
    store = EpisodeStore.open(url, mode="a")
    eid = store.episodes()[0].episode_id
    w = store.labels(eid).windows[0]
    store.write_labels(eid, author="reviewer1", reviews=[
        ReviewDecision(window_id=w.window_id, reviewer="reviewer1", status=ReviewStatus.REJECTED),
        ReviewDecision(window_id=w.window_id, reviewer="reviewer2", status=ReviewStatus.APPROVED,
                       replay_training_authorized=True)])
    summary = run_qc(store, config=LOOSE)
    res = _by_window(summary)[w.window_id]
    ep = next(e for e in summary.episodes if e.episode_id == eid)
    assert res.checks["review"] and ep.figures[w.window_id]["review"] == "approved"  # the last decision counts
    assert ep.figures[w.window_id]["replay_training_authorized"] is True
    assert ep.figures[w.window_id]["outcome"] == w.outcome.value
    assert res.checks["recovery"] == (w.outcome == RecoveryOutcome.RECOVERY_SUCCESS)
    assert summary.figures()["window_reviews"]["approved"] == 1
    # the reviews of the layer QC read are kept in the layer it writes
    assert [r.reviewer for r in store.labels(eid).reviews] == ["reviewer1", "reviewer2"]


# ------------------------------------------------------------------------------------------ each check fails


def test_latency_over_the_recorded_or_configured_budget_fails_time_alignment(tmp_path, student):
    late = _record(tmp_path / "late", student, episodes=1, latency_budget_ms=1e-6)  # every step flagged late
    summary = run_qc(late, config=LOOSE)
    (e,) = summary.episodes
    assert not e.episode.checks["time_alignment"] and "latency_exceeded" in e.episode.flags
    assert e.windows and all(not r.checks["time_alignment"] and not r.passed for r in e.windows)
    assert e.figures[None]["latency_exceeded"] == e.figures[None]["num_steps"]
    assert e.episode.checks["completeness"] and e.episode.checks["executability"]

    clean = _record(tmp_path / "clean", student, episodes=1)
    assert all(r.passed for e in run_qc(clean, config=LOOSE, write=False).episodes for r in e.results)
    strict = run_qc(clean, config=QCConfig(latency_budget_ms=1e-6), write=False)
    assert all("latency_exceeded" in r.flags and not r.checks["time_alignment"] for r in strict.episodes[0].results)
    assert EpisodeStore.open(clean).label_versions(strict.episodes[0].episode_id) == [1]  # dry run wrote nothing


def test_the_default_latency_budget_applies_where_the_world_runs_on_its_own_clock(tmp_path, student):
    """A stepped simulator waits for every action: its latency is reported, not failed, unless a budget is set
    explicitly; an episode from a live world (a robot) fails the same default budget."""
    tight = QCConfig(latency_periods=1e-9)
    sim = _record(tmp_path / "sim", student, episodes=1)
    (e,) = run_qc(sim, config=tight, write=False).episodes
    assert EpisodeStore.open(sim).info(e.episode_id).start.extra["world_clock"] == "stepped"
    assert e.episode.checks["time_alignment"] and e.figures[None]["latency_max_ms"] > 0

    store = EpisodeStore.create(tmp_path / "live")
    with store.recorder() as rec:
        eid = rec.begin_episode(sh.start(extra={"world_clock": "live"}), sh.fields())
        for t in range(5):
            rec.put(eid, sh.step(0, t))
        rec.end_episode(eid, sh.end(5))
    (e,) = run_qc(store, config=tight, write=False).episodes
    assert not e.episode.checks["time_alignment"] and e.figures[None]["latency_exceeded"] == 5


def test_safety_clamps_in_a_window_fail_executability_and_are_counted(tmp_path, student):
    url = _record(tmp_path / "s", student, episodes=1,
                  **{"safety.limits": {"low": [-0.01, -0.01], "high": [0.01, 0.01]}})
    (e,) = run_qc(url, config=LOOSE).episodes
    assert e.windows
    for r in e.windows:
        f = e.figures[r.window_id]
        assert f["clamped"] > 0 and f["clamped_fraction"] > LOOSE.max_clamped_fraction
        assert "clamped" in r.flags and not r.checks["executability"] and not r.passed
        assert f["out_of_bounds"] == 0  # the monitor kept every applied action inside the recorded limits
    assert e.figures[None]["clamp_events"] == e.figures[None]["clamped"] > 0
    tolerant = run_qc(url, config=QCConfig(latency_budget_ms=600_000, max_clamped_fraction=1.0), write=False)
    assert all(r.checks["executability"] for r in tolerant.episodes[0].results)


def test_estop_fails_executability_of_the_episode_and_its_open_window(tmp_path, student):
    def ticks(s):
        s.start(1)
        for _ in range(300):
            if s.machine.state[0] == ControlState.HUMAN.code:
                break
            s.tick()
        for _ in range(3):
            s.tick()
        s.estop("app", "stop button")
        s.tick()

    url = _record(tmp_path / "s", student, ticks=ticks, **{"operator.return_after_steps": 200})
    (e,) = run_qc(url, config=LOOSE).episodes
    info = EpisodeStore.open(url).info(e.episode_id)
    assert info.end.end_reason == EndReason.SAFETY_STOP
    assert "estop" in e.episode.flags and "safety_stop" in e.episode.flags
    assert not e.episode.checks["executability"] and e.figures[None]["estops"] == 1
    (w,) = e.windows
    assert "estop" in w.flags and not w.checks["executability"]
    assert e.figures[w.window_id]["outcome"] == RecoveryOutcome.SAFETY_STOP.value and not w.checks["recovery"]


def test_a_window_that_disagrees_with_the_steps_fails_label_consistency(tmp_path, student):
    url = _record(tmp_path / "s", student, episodes=1)
    store = EpisodeStore.open(url, mode="a")
    (info,) = store.episodes()
    w, *rest = store.labels(info.episode_id).windows
    n = info.num_steps
    src = store.read_steps(info.episode_id, ["action_source"])["action_source"]
    end = rest[0].handover_start if rest else n  # up to the next window: the return to the policy lies between
    assert (src[w.handover_end:end] == ActionSource.POLICY.code).any()
    moved = w.model_copy(update={"handover_end": end, "t_handover": w.t_handover + 1})
    store.write_labels(info.episode_id, author="editor", windows=[moved, *rest])
    (e,) = run_qc(store, config=LOOSE).episodes
    r = e.windows[0]
    assert not r.checks["label_consistency"] and not r.passed
    assert {"policy_step_in_window", "t_handover_mismatch"} <= set(r.flags)
    assert e.figures[r.window_id]["handover_offset_ms"] != 0
    assert not e.episode.checks["label_consistency"] and e.figures[None]["windows_with_inconsistent_labels"] == 1

    shrunk = w.model_copy(update={"handover_end": w.handover_start + 2})  # human steps left outside any window
    store.write_labels(info.episode_id, author="editor", windows=[shrunk, *rest])
    (e,) = run_qc(store, config=LOOSE).episodes
    assert e.windows[0].checks["label_consistency"]
    assert "human_step_outside_window" in e.episode.flags and not e.episode.checks["label_consistency"]
    assert e.figures[None]["human_steps_outside_windows"] > 0


def _hand_recorded(path, steps, *, window=None, end=None, commit=True):
    """One episode written through the public Recorder, with the given step dicts (tests/support/store.py fields)."""
    store = EpisodeStore.create(str(path), exist_ok=True)
    rec = store.recorder(flush_interval_s=0.05)
    eid = rec.begin_episode(sh.start(), sh.fields())
    for s in steps:
        rec.put(eid, s)
    if commit:
        rec.end_episode(eid, end or sh.end(len(steps)), windows=[window(eid)] if window else [])
    rec.close()
    return eid


def _steps(n, human=range(0)):
    out = []
    for t in range(n):
        src = ActionSource.HUMAN if t in human else ActionSource.POLICY
        s = sh.step(0, t, source=src)
        s["t_policy"] = s["t_obs"] + 100
        if t in human:
            s["human_command"] = np.zeros(7, np.float32)
            s["t_device"] = s["t_obs"] + 50
        out.append(s)
    return out


def _window(s, e, t_handover, outcome=RecoveryOutcome.RECOVERY_SUCCESS):
    return lambda eid: sh.human_window(eid, s, e).model_copy(update={"t_handover": t_handover, "outcome": outcome})


def test_unsigned_human_steps_misordered_times_and_invalid_steps_fail(tmp_path):
    steps = _steps(12, human=range(4, 9))
    del steps[5]["human_command"]  # a human step with no device command
    steps[6]["t_policy"] = steps[6]["t_obs"] - 1  # policy time before the observation
    steps[10]["valid"] = False  # an unusable step the episode's end does not account for
    eid = _hand_recorded(tmp_path / "s", steps, window=_window(4, 9, steps[4]["t_action_apply"]))
    (e,) = run_qc(tmp_path / "s", config=LOOSE).episodes
    (w,) = e.windows
    assert "unsigned_human_step" in w.flags and not w.checks["label_consistency"]
    assert "time_order" in w.flags and not w.checks["time_alignment"]
    assert w.checks["completeness"] and "t_handover_mismatch" not in w.flags
    assert not e.episode.checks["completeness"] and "unaccounted_invalid_steps" in e.episode.flags
    assert e.figures[None]["invalid_steps"] == 1 and e.figures[w.window_id]["misordered_times"] == 1
    assert e.episode_id == eid and not e.episode.passed


def test_actions_outside_the_recorded_limits_and_clock_misalignment_fail(tmp_path):
    steps = _steps(10, human=range(2, 8))
    steps[4]["applied_action"] = np.full(sh.ACTION_DIM, 1.5, np.float32)  # beyond the mapping's bound and a jump
    steps[6]["alignment_error_ms"] = np.float32(50.0)
    store = EpisodeStore.create(str(tmp_path / "s"))
    rec = store.recorder(flush_interval_s=0.05)
    start = sh.start(mapping={"action": {"low": [-1.0] * sh.ACTION_DIM, "high": [1.0] * sh.ACTION_DIM}},
                     gate_config={"safety": {"enabled": True, "limits": {"max_delta": [0.5] * sh.ACTION_DIM}}})
    eid = rec.begin_episode(start, sh.fields())
    for s in steps:
        rec.put(eid, s)
    rec.end_episode(eid, sh.end(10), windows=[_window(2, 8, steps[2]["t_action_apply"])(eid)])
    rec.close()
    (e,) = run_qc(tmp_path / "s", config=LOOSE).episodes
    for r in e.results:
        f = e.figures[r.window_id]
        assert f["out_of_bounds"] == 1 and f["over_max_delta"] == 2  # into step 4 and back out of it
        assert {"out_of_bounds", "over_max_delta", "alignment_error"} <= set(r.flags)
        assert not r.checks["executability"] and not r.checks["time_alignment"] and not r.passed
        assert r.checks["completeness"] and r.checks["label_consistency"]
    assert e.figures[None]["alignment_error_max_ms"] == 50.0


def test_failed_recovery_is_a_figure_not_a_quality_failure(tmp_path):
    steps = _steps(10, human=range(3, 7))
    end = EpisodeEnd(end_reason=EndReason.FAILURE, task_success=False, num_steps=10,
                     recovery_outcome=RecoveryOutcome.FAILED_AGAIN)
    _hand_recorded(tmp_path / "s", steps, end=end,
                   window=_window(3, 7, steps[3]["t_action_apply"], RecoveryOutcome.FAILED_AGAIN))
    summary = run_qc(tmp_path / "s", config=LOOSE)
    (e,) = summary.episodes
    (w,) = e.windows
    assert w.passed and e.episode.passed  # the data is fine ...
    assert not w.checks["recovery"] and "recovery_failed_again" in w.flags  # ... the correction did not work
    assert not e.episode.checks["recovery"] and e.figures[None]["recovery_outcome"] == "failed_again"
    assert summary.figures()["window_outcomes"] == {"failed_again": 1}


def test_incomplete_episodes_are_skipped_and_naming_one_is_an_error(tmp_path):
    done = _hand_recorded(tmp_path / "s", _steps(5))
    open_eid = _hand_recorded(tmp_path / "s", _steps(4), commit=False)
    summary = run_qc(tmp_path / "s", config=LOOSE)
    assert summary.incomplete == [open_eid] and [e.episode_id for e in summary.episodes] == [done]
    assert "1 incomplete skipped" in summary.line()
    with pytest.raises(ContractError, match=f"episode {open_eid} is incomplete"):
        run_qc(tmp_path / "s", episodes=[open_eid])
    with pytest.raises(StoreError, match="no episode 'nope'"):
        run_qc(tmp_path / "s", episodes=["nope"])
    assert EpisodeStore.open(tmp_path / "s").label_versions(done) == [1, 2]


# ------------------------------------------------------------------------------------------ config and CLI


def test_shipped_config_holds_the_defaults_and_config_check_knows_its_kind():
    from hg_dagger.config import CONFIG_DIR, check

    path = CONFIG_DIR / "qc" / "default.yaml"
    assert load_qc_config(path) == QCConfig() and check(path) == QCConfig()


def test_config_file_is_validated_naming_the_key(tmp_path):
    good = tmp_path / "qc.yaml"
    good.write_text("kind: qc\nlatency_budget_ms: 50\nmax_clamped_fraction: 0.2\n")
    assert load_qc_config(good).latency_budget_ms == 50
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: qc\nmax_clamped_fraction: 2\nlatency_budjet_ms: 5\n")
    with pytest.raises(ConfigError) as exc:
        load_qc_config(bad)
    assert "max_clamped_fraction" in str(exc.value) and "latency_budjet_ms" in str(exc.value)
    other = tmp_path / "other.yaml"
    other.write_text("kind: run\n")
    with pytest.raises(ConfigError, match="'kind' must be 'qc'"):
        load_qc_config(other)


def test_cli_prints_json_and_a_summary_line(tmp_path, capsys):
    _hand_recorded(tmp_path / "s", _steps(6))
    cfg = tmp_path / "qc.yaml"
    cfg.write_text("kind: qc\nlatency_budget_ms: 600000\n")
    assert main(["qc", str(tmp_path / "s"), "--config", str(cfg), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 1 and out["passed"]["episodes"] == 1 and out["layers_written"] == 1
    assert out["checks"]["episodes"]["completeness"] == {"passed": 1, "failed": 0}
    assert main(["qc", str(tmp_path / "s"), "--config", str(cfg), "--dry-run"]) == 0
    cap = capsys.readouterr()
    assert cap.out.strip().endswith("dry run, nothing written") and "qc" in cap.err  # progress on stderr


def test_cli_bad_input_is_one_readable_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "hg_dagger", "qc", *args], capture_output=True, text=True,
                              timeout=120)

    missing = run(str(tmp_path / "nowhere"), "--quiet")
    assert missing.returncode == 2 and "no episode store here" in missing.stderr and "Traceback" not in missing.stderr

    _hand_recorded(tmp_path / "s", _steps(3))
    root = tmp_path / "s" / "zarr.json"
    meta = json.loads(root.read_text())
    meta["attributes"]["hg_dagger"]["schema_version"] = "9.9"
    root.write_text(json.dumps(meta))
    old = run(str(tmp_path / "s"), "--quiet")
    assert old.returncode == 2 and "schema_version '9.9'" in old.stderr and "Traceback" not in old.stderr

    cfg = tmp_path / "qc.yaml"
    cfg.write_text("kind: qc\nlatency_budget_ms: -1\n")
    bad = run(str(tmp_path / "s"), "--config", str(cfg))
    assert bad.returncode == 2 and "latency_budget_ms" in bad.stderr and "Traceback" not in bad.stderr
