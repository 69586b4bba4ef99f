"""The spread gate with real policy servers in child processes: the built-in student served with `--samples K`
sends its ensemble members' chunks, and the client's spread is theirs; a stochastic policy whose samples part where
it is unsure (tests/control/served_sampler.py) makes the spread gate ask there and nowhere else, in a session that
records the windows; the spread gate calibrates by the quantile rule; bad samples and options are one line."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hg_dagger.contract.enums import EventKind
from hg_dagger.control import GateConfig, GateEngine
from hg_dagger.control.build import build_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import load_mapping
from hg_dagger.policy import PolicyError, RemotePolicy, Student
from hg_dagger.policy.server import PolicyServer, student_samples
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = pytest.mark.subprocess
ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


@pytest.fixture
def mapping():
    return load_mapping("toy_reach")


@pytest.fixture
def server(tmp_path):
    """A policy server in a child process (``start(cmd...)`` -> its ws:// address), killed at the end."""
    procs = []

    def start(*cmd: str) -> str:
        log = open(tmp_path / f"server{len(procs)}.log", "w")
        proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE, stderr=log, text=True, env=ENV)
        procs.append((proc, log))
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("listening on "), (line, (tmp_path / f"server{len(procs) - 1}.log").read_text())
        return line.strip().removeprefix("listening on ")

    yield start
    for proc, log in procs:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        log.close()


def _obs(mapping, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, size=(n, *shape)).astype(dtype) for k, (shape, dtype) in mapping.obs_spec().items()}


def test_a_served_student_sends_its_members_as_samples_and_the_spread_is_theirs(mapping, server, tmp_path):
    student = Student.create(mapping, kind="mlp_chunk", ensemble=3, seed=2)
    student.save(tmp_path / "s.pt")
    url = server("-m", "hg_dagger", "policy", "serve", str(tmp_path / "s.pt"), "--task", "toy_reach", "--port", "0",
                 "--samples", "3")
    obs = _obs(mapping, 2)
    with RemotePolicy(url, mapping) as remote:
        assert remote.samples == 3 and remote.reports_uncertainty
        remote.reset_rows([0, 1], 2)
        remote.act(obs)
        samples = student_samples(student, obs)  # [N, K, H, A], raw
        span = np.asarray(mapping.action.high, np.float32) - np.asarray(mapping.action.low, np.float32)
        want = (samples[:, :, : remote.action_steps].std(axis=1) / span).max(axis=-1).mean(axis=-1)
        np.testing.assert_allclose(remote.sample_spread, want, rtol=1e-4)
        assert (remote.sample_spread > 0).all()
        remote.drop_chunks([1])
        assert np.isnan(remote.sample_spread[1]) and remote.sample_spread[0] == pytest.approx(want[0], rel=1e-4)


def test_the_spread_gate_asks_where_the_samples_part_and_nowhere_else(mapping, server, tmp_path):
    url = server(str(Path(__file__).with_name("served_sampler.py")), "--samples", "4", "--push", "0.6",
                 "--unsure-above", "0.4")
    gates = tmp_path / "gates.yaml"
    gates.write_text("kind: gates\nname: spread\ntask: toy_reach\ngates:\n  - {type: spread, trigger: 0.1}\n")
    cfg = load_run_config(None, "toy_reach", episodes=2, num_envs=1, gates=str(gates), calibrate_steps=0,
                          max_episode_steps=60)
    store = EpisodeStore.create(tmp_path / "s.zarr")
    rec = store.recorder(flush_interval_s=0.05)
    with RemotePolicy(url, mapping) as remote:
        session = build_session(cfg, rec, remote)
        try:
            summary = session.run(2, progress=False)
        finally:
            rec.close()
            session.env.close()
    store = EpisodeStore.open(tmp_path / "s.zarr")
    assert validate_store(store) == []
    assert summary.gate_triggers >= 1 and summary.windows >= 1
    keys = mapping.state_keys()
    seen = {True: 0, False: 0}
    for info in store.episodes():
        d = store.read_steps(info.episode_id, ["policy_uncertainty", "chunk_index", f"obs/{keys[0]}"])
        unsure = d[f"obs/{keys[0]}"][:, 0] > 0.4
        spread = d["policy_uncertainty"]
        ok = np.isfinite(spread)
        start = d["chunk_index"] == 0  # a chunk's spread is the one of the observation it was computed on
        np.testing.assert_allclose(spread[ok & start & ~unsure], 0.01, rtol=1e-4)
        np.testing.assert_allclose(spread[ok & start & unsure], 0.4, rtol=1e-4)
        seen[True] += int((ok & start & unsure).sum())
        seen[False] += int((ok & start & ~unsure).sum())
        for ev in info.end.events:
            if ev.kind == EventKind.GATE_TRIGGER:
                assert ev.reason == "spread" and ev.values["spread"]["sample_spread"] == pytest.approx(0.4)
                assert d[f"obs/{keys[0]}"][max(0, ev.step - 4): ev.step + 1, 0].max() > 0.4  # where it was unsure
    assert seen[True] and seen[False], seen  # chunks of both kinds ran


def test_the_spread_gate_calibrates_by_the_quantile_rule():
    cfg = GateConfig.model_validate({"gates": [{"type": "spread", "calibration": {"target_rate": 0.2,
                                                                                  "min_samples": 50}}]})
    engine = GateEngine(cfg, num_envs=1, step_dt=0.04, action_dim=2)
    res = engine.calibrate(np.linspace(0.0, 1.0, 101, dtype=np.float32))
    assert res["trigger"] == pytest.approx(0.8, abs=1e-6)
    assert engine.thresholds()["spread"]["trigger"] == pytest.approx(0.8, abs=1e-6)


class BadSamples:
    """A served policy of the test's own whose samples have the wrong action size."""

    def metadata(self):
        return {"policy_version": "bad-samples", "chunk_size": 2, "samples": 3}

    def infer(self, obs):
        return {"actions": np.zeros((2, 2), np.float32), "action_samples": np.zeros((3, 2, 5), np.float32)}


def test_bad_samples_and_options_are_one_line(mapping, tmp_path):
    with PolicyServer(BadSamples(), port=0).start() as srv, RemotePolicy(srv.address, mapping) as remote:
        remote.reset_rows([0], 1)
        with pytest.raises(PolicyError, match=r"sent action_samples of shape \[3, 2, 5\]; expected \[K >= 2, H, A = 2\]"):
            remote.act(_obs(mapping, 1))
    Student.create(mapping, ensemble=2, seed=0).save(tmp_path / "s.pt")
    res = subprocess.run([sys.executable, "-m", "hg_dagger", "policy", "serve", str(tmp_path / "s.pt"), "--task",
                          "toy_reach", "--port", "0", "--samples", "5"], capture_output=True, text=True, env=ENV,
                         timeout=300)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert "--samples 5: the student has 2 ensemble members" in last and "Traceback" not in res.stderr
