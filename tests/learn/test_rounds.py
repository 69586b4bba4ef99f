"""Training between rounds in a spawned process: progress, the checkpoint it hands back, and its errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hg_dagger.envs import load_mapping
from hg_dagger.learn.rounds import BackgroundJob, bootstrap_student, train_round
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore


@pytest.mark.subprocess
def test_bootstrap_then_next_round_in_background(tmp_path):
    store = str(tmp_path / "store.zarr")
    job = BackgroundJob(bootstrap_student, task="toy_reach", store=store, out_dir=str(tmp_path / "boot"),
                        demos=4, steps=60, seed=3)
    assert job.wait(240), "bootstrap did not finish"
    assert job.error == "", job.error
    boot = job.result
    assert boot["demos"] == 4 and boot["labels"] > 0
    modes = {i.start.mode.value for i in EpisodeStore.open(store).episodes()}
    assert modes == {"expert_demo"}
    first = Student.load(boot["checkpoint"], load_mapping("toy_reach"))
    assert first.version == boot["version"] and first.round == 1

    stages: list = []
    job = BackgroundJob(train_round, store=store, task="toy_reach", out_dir=str(tmp_path / "r2"),
                        resume=boot["checkpoint"], steps=50, seed=3)
    deadline = time.monotonic() + 240
    while not job.done and time.monotonic() < deadline:
        stages += job.poll()
        time.sleep(0.05)
    assert job.error == "", job.error
    fractions = [p.fraction for p in stages if p.stage == "training"]
    assert fractions and fractions[-1] == 1.0 and np.all(np.diff(fractions) > 0) and len(fractions) >= 10
    second = Student.load(job.result["checkpoint"], load_mapping("toy_reach"))
    assert second.round == 2 and second.version != first.version


@pytest.mark.slow
@pytest.mark.subprocess
def test_training_error_comes_back_as_text(tmp_path):
    missing = str(tmp_path / "nope.zarr")
    job = BackgroundJob(train_round, store=missing, task="toy_reach", out_dir=str(tmp_path / "out"), steps=5)
    assert job.wait(120)
    assert job.result is None
    assert "nope.zarr" in job.error and "Traceback" not in job.error


def test_train_round_reports_progress_in_process(tmp_path):
    store = str(tmp_path / "s.zarr")
    bootstrap_student(task="toy_reach", store=store, out_dir=str(tmp_path / "b"), demos=2, steps=10,
                      report=lambda *_: None)
    got = []
    res = train_round(store=store, task="toy_reach", out_dir=str(tmp_path / "r"), steps=100,
                      report=lambda s, f: got.append((s, f)))
    train = [f for s, f in got if s == "training"]
    assert train[-1] == 1.0 and len(train) >= 10 and res["labels"] > 0


def test_calibration_samples_come_from_states_the_policy_drove(tmp_path):
    from hg_dagger.contract import ActionSource, CollectionMode
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config
    from hg_dagger.learn.gate_calibration import autonomous_uncertainty
    from hg_dagger.store.trainable import flatten_td

    store = str(tmp_path / "s.zarr")
    boot = bootstrap_student(task="toy_reach", store=store, out_dir=str(tmp_path / "b"), demos=2, steps=20,
                             report=lambda *_: None)
    run_gated(load_run_config(None, "toy_reach", episodes=2, num_envs=1), store, student_path=boot["checkpoint"],
              progress=False)
    st = EpisodeStore.open(store)
    policy_steps = other_steps = 0
    for info in st.episodes():
        src = flatten_td(st.load(info.episode_id, fields=["action_source"]))["action_source"]
        mine = src == ActionSource.POLICY.code
        if info.start.mode == CollectionMode.HUMAN_GATED:
            policy_steps += int(mine.sum())
        other_steps += int((~mine).sum()) + (int(mine.sum()) if info.start.mode != CollectionMode.HUMAN_GATED else 0)
    assert policy_steps > 0
    unc = autonomous_uncertainty(store, boot["checkpoint"], "toy_reach", min_steps=1)
    assert len(unc) == policy_steps and np.isfinite(unc).all()
    filled = autonomous_uncertainty(store, boot["checkpoint"], "toy_reach", min_steps=10**6)
    assert len(filled) == min(5000, policy_steps + other_steps), "an early round fills up with other states"
