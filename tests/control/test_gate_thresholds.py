"""The gate survives a restart: thresholds are calibrated when a student is trained, stored with its checkpoint and
adopted by every session that loads it; a start-up calibration runs only for a student without them and refuses
samples that cannot set a gate; the warning band always leads the trigger."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.gate_thresholds import Calibration, quantile_thresholds
from hg_dagger.control.gates import TRIGGER, WARN, GateEngine
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import load_mapping
from hg_dagger.learn.rounds import BackgroundJob, train_round
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import read_checkpoint, store_gate_thresholds
from hg_dagger.store import EpisodeStore

WAIT = 600.0


def _engine(**cal) -> GateEngine:
    spec = ConfidenceGate(warn=0.35, trigger=0.5, hysteresis=0.15, debounce_ticks=1,
                          calibration=Calibration(target_rate=0.1, min_samples=100, **cal))
    return GateEngine(GateConfig(gates=[spec]), num_envs=1, step_dt=0.04, action_dim=2)


def _level(engine: GateEngine, u: float) -> int:
    engine.rearm([0])
    inp = GateInputs(step=np.zeros(1, np.int64), t_ns=0, action=np.zeros((1, 2), np.float32),
                     uncertainty=np.array([u], np.float32), obs={})
    return int(engine.update(inp, np.ones(1, bool)).level[0])


def test_the_warning_band_leads_the_trigger_even_for_a_narrow_spread():
    rng = np.random.default_rng(3)
    u = 0.18 + rng.uniform(0, 0.004, 2000)  # a student whose uncertainty barely varies (warn 0.180, trigger 0.183)
    res = quantile_thresholds(u, Calibration(target_rate=0.1))
    assert res["trigger"] == pytest.approx(np.quantile(u, 0.9))
    assert res["warn"] <= 0.8 * res["trigger"], "at least a fifth of the trigger of amber before a request"
    assert res["uncertainty"]["max"] == pytest.approx(u.max()) and res["samples"] == 2000
    e = _engine()
    cal = e.calibrate(u)
    assert not cal.get("refused") and e.confidence.trigger == pytest.approx(res["trigger"])
    assert _level(e, 0.5 * (cal["warn"] + cal["trigger"])) == WARN
    assert _level(e, cal["trigger"] * 1.01) == TRIGGER


def test_a_calibration_that_cannot_set_a_gate_is_refused_and_the_gate_keeps_its_thresholds():
    e = _engine()
    cal = e.calibrate(np.full(500, 11.47, np.float32))
    assert "refused" in cal and "do not vary" in cal["refused"] and "trigger 0.5" in cal["refused"]
    assert (e.confidence.warn, e.confidence.trigger) == (0.35, 0.5)
    assert e.calibrate(np.linspace(0, 1, 50)) is None, "too few samples: unchanged, as before"


def test_thresholds_travel_with_the_checkpoint_and_only_with_its_weights(tmp_path):
    mapping = load_mapping("toy_reach")
    s = Student.create(mapping, seed=1, ensemble=3, hidden=(16, 16))
    path = tmp_path / "s.pt"
    s.save(path)
    version = read_checkpoint(path)["version"]
    thr = {"confidence": {"trigger": 0.12, "warn": 0.08, "samples": 900, "target_rate": 0.1}}
    store_gate_thresholds(path, thr)
    again = Student.load(path, mapping)
    assert again.gate_thresholds == thr and again.version == version, "the weights and their version are unchanged"
    again.save(tmp_path / "copy.pt")
    assert Student.load(tmp_path / "copy.pt", mapping).gate_thresholds == thr
    again.weights_changed()  # trained further: the thresholds were for the old weights
    assert again.gate_thresholds == {}


@pytest.fixture(scope="module")
def round_trained(tmp_path_factory, toy_student):
    """A session's episodes, then a round trained by the app's real rounds process (a spawned BackgroundJob), on a
    copy of the first student's demo store."""
    from hg_dagger.control.build import run_gated

    d = tmp_path_factory.mktemp("round")
    store = d / "store.zarr"
    shutil.copytree(Path(toy_student).parent.parent / "demos.zarr", store)
    cfg = load_run_config(None, "toy_reach", num_envs=1, episodes=3, calibrate_steps=0,
                          **{"operator.type": "synthetic"})
    run_gated(cfg, str(store), student_path=toy_student, progress=False)
    job = BackgroundJob(train_round, store=str(store), task="toy_reach", out_dir=str(d / "round-01"),
                        resume=toy_student, steps=40, seed=1)
    assert job.wait(WAIT) and not job.error, job.error
    return job.result, store


def _relaunch(tmp_path, checkpoint: str, name: str):
    """What the app does on launch: `hg-dagger run`'s wiring from the task's shipped run config (which asks for a
    start-up calibration) with the same student."""
    from hg_dagger.control.build import open_session

    cfg = load_run_config(None, "toy_reach", num_envs=1, seed=0, **{"operator.type": "synthetic"})
    assert cfg.calibrate_steps > 0
    return open_session(cfg, str(tmp_path / f"{name}.zarr"), student_path=checkpoint)


@pytest.mark.slow
def test_a_relaunch_with_the_same_student_keeps_its_thresholds_and_asks_where_it_asked(tmp_path, round_trained):
    result, store = round_trained
    assert result["gate_calibration"]["thresholds"], result["gate_calibration"]["message"]
    stored = result["gate_calibration"]["thresholds"]["confidence"]
    assert stored["warn"] < stored["trigger"] <= stored["uncertainty"]["max"]
    assert read_checkpoint(result["checkpoint"])["extra"]["gate_thresholds"]["confidence"] == stored
    sessions = [_relaunch(tmp_path, result["checkpoint"], f"launch{i}") for i in range(2)]
    try:
        for s in sessions:
            conf = s.gates.confidence
            assert s.threshold_source == "student", "no start-up calibration for a student with thresholds"
            assert (conf.warn, conf.trigger) == (pytest.approx(stored["warn"]), pytest.approx(stored["trigger"]))
            assert "own thresholds" in s.notice
        # the state of the store the student is least sure about fired the gate in the first launch, and does again
        from hg_dagger.store.trainable import flatten_td

        st = EpisodeStore.open(str(store))
        keys = list(sessions[0].mapping.obs_spec())
        flats = [flatten_td(st.load(i.episode_id, fields=[f"obs/{k}" for k in keys])) for i in st.episodes()]
        obs = {k: np.concatenate([f[f"obs/{k}"] for f in flats]) for k in keys}
        unc = sessions[0].student.act(obs).uncertainty
        worst = int(np.argmax(unc))
        assert unc[worst] > stored["trigger"]
        for s in sessions:
            row = {k: v[worst:worst + 1] for k, v in obs.items()}
            out = s.student.act(row)
            s.gates.rearm([0])
            levels = []
            for step in range(3):  # the shipped gate debounces over two ticks
                inp = GateInputs(step=np.array([10 + step]), t_ns=step, action=out.action, uncertainty=out.uncertainty,
                                 obs=row)
                levels.append(int(s.gates.update(inp, np.ones(1, bool)).level[0]))
            assert levels[-1] == TRIGGER
    finally:
        for s in sessions:
            s.rec.close()
            s.env.close()


def test_a_student_without_thresholds_is_calibrated_at_start_up(tmp_path):
    mapping = load_mapping("toy_reach")
    path = tmp_path / "fresh.pt"
    Student.create(mapping, seed=2, ensemble=3, hidden=(16, 16)).save(path)
    s = _relaunch(tmp_path, str(path), "fresh")
    try:
        conf = s.gates.confidence
        assert s.threshold_source == "calibration" and conf.trigger != 0.5
        assert conf.warn <= 0.8 * conf.trigger
    finally:
        s.rec.close()
        s.env.close()
