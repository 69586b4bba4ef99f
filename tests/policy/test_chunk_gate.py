"""A single chunking model behind a policy server: which chunk each step's action came from is recorded (and
validates), and the chunk gate asks for help where consecutive chunks disagree about the steps they share, and stays
quiet where they agree. The served policies are real servers over the real protocol: the built-in chunking student
in a `hg-dagger policy serve` child process, and test-only policies in a `PolicyServer` thread."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.enums import ActionSource, EventKind
from hg_dagger.control import GateConfig, GateEngine
from hg_dagger.control.build import build_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.policy import PolicyOptions, RemotePolicy, Student
from hg_dagger.policy.server import PolicyServer
from hg_dagger.store import EpisodeStore, validate_store

H, STEPS = 4, 2  # served chunk length, actions executed of each: the next chunk's first 2 actions overlap


class Chunks:
    """A served policy of the test's own: chunks of H constant actions, the k-th reply's value from ``value(k)``."""

    def __init__(self, value):
        self.value, self.k = value, 0

    def metadata(self):
        return {"policy_version": "chunks-test", "chunk_size": H, "n_action_steps": STEPS}

    def infer(self, obs):
        self.k += 1
        return {"actions": np.full((H, 2), self.value(self.k), np.float32)}


@pytest.fixture
def served():
    servers: list[PolicyServer] = []

    def start(policy) -> str:
        servers.append(PolicyServer(policy, port=0).start())
        return servers[-1].address

    yield start
    for s in servers:
        s.shutdown()


def _run(tmp_path, remote, gates: str, episodes: int, num_envs: int = 1):
    path = tmp_path / "gates.yaml"
    path.write_text(gates)
    cfg = load_run_config(None, "toy_reach", episodes=episodes, num_envs=num_envs, gates=str(path),
                          calibrate_steps=0, max_episode_steps=30)
    store = EpisodeStore.create(tmp_path / "s.zarr")
    rec = store.recorder(flush_interval_s=0.05)
    session = build_session(cfg, rec, remote)
    try:
        summary = session.run(episodes, progress=False)
    finally:
        rec.close()
        session.env.close()
    return summary, EpisodeStore.open(tmp_path / "s.zarr")


CHUNK_GATE = "kind: gates\nname: chunk\ntask: toy_reach\ngates:\n  - {type: chunk, trigger: 0.25, debounce_ticks: 1}\n"


@pytest.mark.subprocess
def test_chunk_ids_and_indices_are_recorded_and_validate(tmp_path, mapping, serve_process):
    ckpt = tmp_path / "chunk.pt"
    Student.create(mapping, kind="mlp_chunk", seed=0).save(ckpt)
    server = serve_process(ckpt, "--task", "toy_reach")
    stall = "kind: gates\nname: stall\ntask: toy_reach\ngates:\n  - {type: progress_stall, trigger: 0.5, min_delta: 0.03}\n"
    with RemotePolicy(server.url, mapping, PolicyOptions(action_steps=3)) as remote:
        assert remote.reports_uncertainty  # the served student's own ensemble disagreement
        summary, store = _run(tmp_path, remote, stall, episodes=2, num_envs=2)
    assert summary.episodes == 2 and summary.windows >= 1, "someone took over: chunks were dropped and restarted"
    assert validate_store(store) == []
    for info in store.episodes():
        d = store.read_steps(info.episode_id, ["chunk_id", "chunk_index", "action_source"])
        cid, idx = d["chunk_id"], d["chunk_index"]
        assert cid.dtype == np.int64 and idx.dtype == np.int32
        assert (cid >= 1).all() and (np.diff(cid) >= 0).all() and (idx >= 0).all() and (idx < 3).all()
        starts = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
        assert (idx[starts] == 0).all(), "every chunk's first step is its index 0"
        same = cid[1:] == cid[:-1]
        assert (idx[1:][same] == idx[:-1][same] + 1).all(), "within a chunk the index counts up one per step"
        assert len(starts) > len(cid) / 3 and len(starts) < len(cid)  # chunks of 3, cut short at handovers
    assert (d["action_source"] == ActionSource.POLICY.code).any()


def test_a_built_in_student_records_no_chunk_fields(tmp_path, mapping):
    summary, store = _run(tmp_path, Student.create(mapping, seed=0), CHUNK_GATE, episodes=1)
    info = store.episodes()[0]
    assert not {"chunk_id", "chunk_index"} & set(store.read_steps(info.episode_id))
    assert summary.gate_triggers == 0  # its ensemble spread stays below a quarter of the action range here


def test_chunks_that_disagree_trigger_the_chunk_gate_and_a_window_is_recorded(tmp_path, mapping, served):
    url = served(Chunks(lambda k: 0.5 if k % 2 else -0.5))  # each chunk reverses what the last one predicted
    with RemotePolicy(url, mapping) as remote:
        assert remote.action_steps == STEPS and not remote.server_uncertainty and remote.reports_uncertainty
        summary, store = _run(tmp_path, remote, CHUNK_GATE, episodes=2)
    assert summary.gate_triggers >= 1 and summary.windows >= 1
    assert validate_store(store) == []
    windows = [w for info in store.episodes() for w in store.labels(info.episode_id).windows]
    assert windows and all(w.gate_reason == "chunk" for w in windows)
    info = store.episodes()[0]
    trig = [e for e in info.end.events if e.kind == EventKind.GATE_TRIGGER]
    assert trig and trig[0].reason == "chunk"
    assert trig[0].values["chunk"]["chunk_disagreement"] == pytest.approx(0.5)  # |0.5 - -0.5| / range 2
    d = store.read_steps(info.episode_id, ["policy_uncertainty", "chunk_id"])
    assert np.isnan(d["policy_uncertainty"][:STEPS]).all()  # the first chunk has nothing to disagree with
    assert d["policy_uncertainty"][STEPS] == pytest.approx(0.5)


def test_chunks_that_agree_do_not_ask(tmp_path, mapping, served):
    url = served(Chunks(lambda k: 0.3))
    with RemotePolicy(url, mapping) as remote:
        summary, store = _run(tmp_path, remote, CHUNK_GATE, episodes=2)
    assert summary.episodes == 2 and summary.gate_triggers == 0 and summary.windows == 0
    for info in store.episodes():
        d = store.read_steps(info.episode_id, ["policy_uncertainty", "chunk_id"])
        assert (d["policy_uncertainty"][STEPS:] == 0).all()  # compared, and equal: not merely unmeasured
        assert d["chunk_id"][-1] > d["chunk_id"][0]


def test_the_chunk_gate_calibrates_by_the_confidence_gates_quantile_rule():
    cfg = GateConfig.model_validate({"gates": [{"type": "chunk", "calibration": {"target_rate": 0.1,
                                                                                 "min_samples": 50}}]})
    engine = GateEngine(cfg, num_envs=1, step_dt=0.05, action_dim=2)
    res = engine.calibrate(np.linspace(0.0, 1.0, 101, dtype=np.float32))
    assert res["trigger"] == pytest.approx(0.9, abs=1e-6)
    assert engine.thresholds()["chunk"]["trigger"] == pytest.approx(0.9, abs=1e-6)
