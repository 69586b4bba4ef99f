"""A policy behind a real policy server (openpi's websocket protocol): the built-in student served by
`PolicyServer` acts exactly like the local one; chunks run through a per-row queue that episode starts and
handovers drop; a policy that does not fit the task, answers badly, stalls or dies is one line naming its server.
The end-to-end runs (`hg-dagger run` / `eval` / `policy serve` in child processes) are marked subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError
from hg_dagger.policy import PolicyError, PolicyOptions, RemotePolicy, Student
from hg_dagger.policy.heads import CHUNK
from hg_dagger.policy.server import PolicyServer, StudentServed, student_chunk
from hg_dagger.store import EpisodeStore

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _obs(mapping, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, size=(n, *shape)).astype(dtype) for k, (shape, dtype) in mapping.obs_spec().items()}


class Scripted:
    """A served policy of the test's own: fixed metadata, and replies from ``reply(obs)``; it keeps the requests."""

    def __init__(self, meta, reply):
        self.meta, self.reply, self.seen = meta, reply, []

    def metadata(self):
        return dict(self.meta)

    def infer(self, obs):
        self.seen.append(obs)
        return self.reply(obs)


@pytest.fixture
def serve():
    servers = []

    def start(policy) -> PolicyServer:
        servers.append(PolicyServer(policy, port=0).start())
        return servers[-1]

    yield start
    for s in servers:
        s.shutdown()


def test_a_served_student_acts_exactly_like_the_local_one(mapping, serve):
    student = Student.create(mapping, ensemble=3, seed=4)
    student.gate_thresholds = {"confidence": {"trigger": 0.4, "warn": 0.3}}
    server = serve(StudentServed(student))
    obs = _obs(mapping, 3)
    with RemotePolicy(server.address, mapping) as remote:
        assert remote.version == student.version and remote.reports_uncertainty
        assert remote.gate_thresholds == student.gate_thresholds
        assert remote.names == ["observation.state"] and remote.batch and remote.action_steps == 1
        remote.reset_rows(range(3), 3)
        for seed in range(3):  # a new observation every tick: one action of each new one-step chunk
            obs = _obs(mapping, 3, seed)
            got, want = remote.act(obs), student.act(obs)
            np.testing.assert_array_equal(got.action, want.action)
            np.testing.assert_array_equal(got.uncertainty, want.uncertainty)
            np.testing.assert_array_equal(got.policy_action, mapping.raw_to_policy(want.action))
        assert server.requests == 3  # one batched request per tick


@pytest.mark.parametrize("batch", [True, False])
def test_chunks_run_through_a_queue_that_resets_and_handovers_drop(mapping, serve, batch):
    student = Student.create(mapping, kind="mlp_chunk", ensemble=2, seed=1)
    server = serve(StudentServed(student))
    with RemotePolicy(server.address, mapping, PolicyOptions(action_steps=3, batch=batch)) as remote:
        assert remote.action_steps == 3 and CHUNK >= 3
        remote.reset_rows([0, 1], 2)
        per_tick = 1 if batch else 2
        chunks = []
        for t in range(7):
            obs = _obs(mapping, 2, seed=t)
            if t % 3 == 0:
                chunks.append(student_chunk(student, obs)[0])
            out = remote.act(obs)
            np.testing.assert_allclose(out.action, chunks[-1][:, t % 3], rtol=0, atol=1e-6)
            assert list(remote.chunk_index) == [t % 3] * 2
        assert server.requests == 3 * per_tick  # ticks 0, 3 and 6 asked; the others took the queue
        remote.drop_chunks([1])  # a handover in row 1: its next action comes from a fresh chunk
        obs = _obs(mapping, 2, seed=99)
        out = remote.act(obs)
        assert server.requests == 3 * per_tick + 1
        np.testing.assert_allclose(out.action[1], student_chunk(student, obs)[0][1, 0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(out.action[0], chunks[-1][0, 1], rtol=0, atol=1e-6)  # row 0 goes on
        remote.reset_rows([0], 2)  # an episode begins in row 0
        remote.act(obs)
        assert server.requests == 3 * per_tick + 2


def test_a_policy_that_declares_nothing_gets_the_default_names(mapping, serve):
    seen = Scripted({"note": "an openpi-style server"}, lambda obs: {"actions": np.zeros((4, 2), np.float32)})
    server = serve(seen)
    with RemotePolicy(server.address, mapping) as remote:
        assert remote.version.startswith("meta-") and remote.action_steps is None and not remote.batch
        remote.reset_rows([0], 1)
        out = remote.act(_obs(mapping, 1))
        assert np.isnan(out.uncertainty).all() and np.isnan(out.confidence).all()
        for _ in range(3):
            remote.act(_obs(mapping, 1))
        assert len(seen.seen) == 1  # the whole chunk of 4 ran
        req = seen.seen[0]
        assert sorted(req) == ["observation.environment_state", "observation.state", "task"]
        assert req["task"] == mapping.language_instruction and req["observation.state"].shape == (6,)


def test_a_policy_that_does_not_fit_the_task_is_refused_in_one_line(mapping, serve):
    for meta, words in (
        ({"input_features": {"observation.images.wrist": {"shape": [64, 64, 3]}}}, ["observation.images.wrist"]),
        ({"input_features": {"observation.state": {"shape": [9]}}}, ["observation.state", "[9]"]),
        ({"action_dim": 7, "policy_version": "v7"}, ["7 action dimensions"]),
    ):
        server = serve(Scripted(meta, lambda obs: {"actions": np.zeros((1, 2))}))
        with pytest.raises(ConfigError) as err:
            RemotePolicy(server.address, mapping)
        msg = str(err.value)
        assert "\n" not in msg and server.address in msg and all(w in msg for w in words), msg


def test_bad_answers_stop_the_policy_with_its_servers_address(mapping, serve):
    def fails(obs):
        raise RuntimeError("CUDA out of memory")

    def stalls(obs):
        time.sleep(1.5)
        return {"actions": np.zeros((1, 2))}

    cases = [
        (lambda obs: {"actions": np.array([[np.nan, 0.0]])}, "non-finite action"),
        (lambda obs: {"actions": np.zeros((2, 3))}, "shape [2, 3]"),
        (lambda obs: {"nothing": 1}, "without 'actions'"),
        (fails, "failed to act: RuntimeError: CUDA out of memory"),
        (stalls, "did not answer within 0.5 s"),
    ]
    for reply, words in cases:
        server = serve(Scripted({}, reply))
        with RemotePolicy(server.address, mapping, PolicyOptions(timeout_s=0.5)) as remote:
            with pytest.raises(PolicyError) as err:
                remote.act(_obs(mapping, 1))
        msg = str(err.value)
        assert server.address in msg and words in msg and "\n" not in msg, msg


def test_an_unreachable_or_dead_server_is_named(mapping, serve):
    server = serve(Scripted({}, lambda obs: {"actions": np.zeros((1, 2))}))
    url = server.address
    remote = RemotePolicy(url, mapping)
    server.shutdown()  # the server goes away under a connected client
    with pytest.raises(PolicyError, match=f"policy server {url} closed the connection \\(policy server shutting down"):
        remote.act(_obs(mapping, 1))
    remote.close()
    with pytest.raises(PolicyError, match=f"cannot reach policy server {url}"):
        RemotePolicy(url, mapping, PolicyOptions(connect_timeout_s=2))


def test_a_session_drops_chunks_at_handovers_and_records_the_servers_version(mapping, serve, tmp_path):
    from hg_dagger.control.build import build_session
    from hg_dagger.control.run_config import load_run_config

    student = Student.create(mapping, kind="mlp_chunk", seed=0)
    server = serve(StudentServed(student))
    gates = tmp_path / "gates.yaml"
    gates.write_text("kind: gates\nname: stall\ntask: toy_reach\ngates:\n"
                     "  - {type: progress_stall, warn: 0.3, trigger: 0.5, min_delta: 0.03}\n")
    cfg = load_run_config(None, "toy_reach", episodes=3, num_envs=2, gates=str(gates), calibrate_steps=0)
    store = EpisodeStore.create(tmp_path / "s.zarr")
    rec = store.recorder()
    dropped: list[list[int]] = []
    with RemotePolicy(server.address, mapping) as remote:
        drop = remote.drop_chunks
        remote.drop_chunks = lambda rows: (dropped.append(list(rows)), drop(rows))
        session = build_session(cfg, rec, remote)
        try:
            summary = session.run(3, progress=False)
        finally:
            rec.close()
            session.env.close()
    assert summary.windows >= 1 and summary.context_switches >= 1
    assert len(dropped) >= 2 * summary.context_switches - 2  # taken over and handed back (but at an episode end)
    infos = EpisodeStore.open(tmp_path / "s.zarr").episodes()
    assert {i.start.policy_version for i in infos} == {student.version}


# ---------------------------------------------------------------------- real processes


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _cli_process(*args):
    return subprocess.Popen([sys.executable, "-m", "hg_dagger", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


@pytest.mark.subprocess
def test_run_drives_a_served_policy_with_gates_and_windows_then_validates(tmp_path, student_pt, serve_process):
    served = serve_process(student_pt, "--task", "toy_reach")
    common = ("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "4", "--num-envs", "2",
              "--calibrate-steps", "0", "--quiet", "--json")
    r = _cli(*common, "--policy", served.url, "--store", tmp_path / "remote")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["episodes"] == 4 and summary["windows"] >= 1 and summary["gate_triggers"] >= 1
    v = _cli("validate", tmp_path / "remote")
    assert v.returncode == 0, v.stdout + v.stderr
    version = Student.load(student_pt, load_mapping("toy_reach")).version
    remote = EpisodeStore.open(tmp_path / "remote")
    infos = remote.episodes()
    assert {i.start.policy_version for i in infos} == {version}
    assert sum(len(remote.labels(i.episode_id).windows) for i in infos) == summary["windows"]
    kinds = {e.kind.value for i in infos for e in i.end.events}
    assert {"gate_trigger", "handover_start", "window_closed"} <= kinds
    # the same checkpoint acting locally (--student, the older spelling) records the same steps
    r = _cli(*common, "--student", student_pt, "--store", tmp_path / "local")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == summary
    local = EpisodeStore.open(tmp_path / "local")
    for a, b in zip(infos, local.episodes(), strict=True):
        np.testing.assert_array_equal(remote.read_steps(a.episode_id, ["applied_action"])["applied_action"],
                                      local.read_steps(b.episode_id, ["applied_action"])["applied_action"])


@pytest.mark.subprocess
@pytest.mark.app
def test_the_app_corrects_a_served_policy(tmp_path, student_pt, serve_process):
    """`hg-dagger app --policy ws://...` (a scripted sitting, its window offscreen): the served policy acts, the
    synthetic operator corrects it, and the store records the server's policy version."""
    served = serve_process(student_pt, "--task", "toy_reach")
    store = tmp_path / "app.zarr"
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "app", "--task", "toy_reach", "--policy", served.url,
                        "--name", "op-07", "--operator", "synthetic", "--episodes", "2", "--quit-when-done",
                        "--store", str(store)], capture_output=True, text=True, timeout=300,
                       env={**ENV, "QT_QPA_PLATFORM": "offscreen"}, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    assert "validate: ok" in r.stdout
    infos = EpisodeStore.open(store).episodes()
    assert len(infos) == 2
    assert {i.start.policy_version for i in infos} == {Student.load(student_pt, load_mapping("toy_reach")).version}


@pytest.mark.subprocess
def test_eval_takes_a_served_policy(tmp_path, student_pt, serve_process):
    served = serve_process(student_pt, "--task", "toy_reach")
    r = _cli("eval", "--policy", served.url, "--task", "toy_reach", "--out", tmp_path / "e", "--episodes", "4",
             "--num-envs", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert result["checkpoint"] == served.url and result["closed_loop"]["episodes"] == 4
    assert result["policy_version"] == Student.load(student_pt, load_mapping("toy_reach")).version


@pytest.mark.subprocess
def test_a_server_killed_mid_run_ends_the_run_with_one_line_and_keeps_what_was_committed(tmp_path, student_pt,
                                                                                         serve_process):
    served = serve_process(student_pt, "--task", "toy_reach")
    store = tmp_path / "s"
    run = _cli_process("run", "--task", "toy_reach", "--policy", served.url, "--operator", "synthetic", "--episodes",
                       "1000", "--num-envs", "2", "--calibrate-steps", "0", "--store", store, "--quiet")
    try:
        committed: list[str] = []
        deadline = time.monotonic() + 300
        while len(committed) < 2 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.5)
            try:
                committed = [i.episode_id for i in EpisodeStore.open(store).episodes(complete=True)]
            except Exception:  # the store is still being created
                continue
        assert len(committed) >= 2, "no episode was committed in time"
        served.proc.kill()  # mid-episode: rows begin their next episode as soon as one ends
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert lines == [f"error: policy server {served.url} closed the connection (it stopped or crashed)"], err
    assert "Traceback" not in err
    v = _cli("validate", store)
    assert v.returncode == 0, v.stdout + v.stderr
    infos = EpisodeStore.open(store).episodes()
    ids = [i.episode_id for i in infos]
    assert set(committed) <= set(ids) and all(i.complete for i in infos)
    stopped = [i for i in infos if i.end.end_reason.value == "safety_stop"]
    assert 1 <= len(stopped) <= 2  # the open episodes (one per row) ended, with why
    for i in stopped:
        notes = [e for e in i.end.events if e.kind.value == "note" and e.source == "policy"]
        assert notes and served.url in notes[0].reason


@pytest.mark.subprocess
def test_a_served_policy_for_another_task_is_refused_before_anything_is_recorded(tmp_path, serve_process):
    other = tmp_path / "fetch.pt"
    Student.create(load_mapping("fetch_reach"), seed=0).save(other)
    served = serve_process(other, "--task", "fetch_reach")
    r = _cli("run", "--task", "toy_reach", "--policy", served.url, "--operator", "synthetic", "--episodes", "1",
             "--store", tmp_path / "s", "--quiet")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert served.url in line and "action dimensions" in line and "toy_reach" in line
    assert not (tmp_path / "s").exists()
    r = _cli("policy", "check", served.url, "--task", "fetch_reach")
    assert r.returncode == 0 and "fits task fetch_reach" in r.stdout, r.stderr


@pytest.mark.subprocess
def test_lerobot_needs_its_own_environment(tmp_path):
    folder = tmp_path / "pretrained_model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "type": "act", "n_action_steps": 4, "input_features": {"observation.state": {"type": "STATE", "shape": [6]}},
        "output_features": {"action": {"type": "ACTION", "shape": [2]}}}))
    r = _cli("policy", "serve", f"lerobot:{folder}", "--port", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "needs LeRobot" in r.stderr and "lerobot" in r.stderr.lower() and r.stdout == ""
    # started from a run with this (LeRobot-less) Python as the policy's: the server's reason comes back
    r = _cli("run", "--task", "toy_reach", "--policy", f"lerobot:{folder}", "--policy-python", sys.executable,
             "--operator", "synthetic", "--episodes", "1", "--store", tmp_path / "s", "--quiet")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert "exited (2)" in line and "needs LeRobot" in line
    r = _cli("run", "--task", "toy_reach", "--policy", f"lerobot:{folder}", "--operator", "synthetic",
             "--episodes", "1", "--store", tmp_path / "s", "--quiet")
    assert r.returncode == 2 and "--policy-python" in r.stderr and "Traceback" not in r.stderr


FAKE_LEROBOT = Path(__file__).parents[1] / "fakes" / "lerobot_policy"


def _lerobot_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "outputs" / "checkpoints" / "last" / "pretrained_model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "type": "act", "n_action_steps": 4, "chunk_size": 8,
        "input_features": {"observation.state": {"type": "STATE", "shape": [6]},
                           "observation.environment_state": {"type": "ENV", "shape": [2]}},
        "output_features": {"action": {"type": "ACTION", "shape": [2]}}}))
    (folder / "model.safetensors").write_bytes(b"weights of the test")
    return folder


@pytest.mark.subprocess
def test_run_starts_a_lerobot_policy_server_in_the_policy_python_and_records_its_version(tmp_path):
    """`--policy lerobot:DIR --policy-python PY` starts `hg-dagger policy serve lerobot:DIR` in PY and runs it; here
    PY is this Python with a stand-in for LeRobot's policy API on its path (tests/fakes/lerobot_policy)."""
    from hg_dagger.policy.lerobot_served import weights_version

    folder = _lerobot_folder(tmp_path)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(FAKE_LEROBOT), ENV.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    store = tmp_path / "s"
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "run", "--task", "toy_reach", "--policy", f"lerobot:{folder}",
                        "--policy-python", sys.executable, "--operator", "synthetic", "--episodes", "2",
                        "--num-envs", "2", "--calibrate-steps", "0", "--store", str(store), "--quiet", "--json"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["episodes"] == 2 and summary["steps"] > 0
    infos = EpisodeStore.open(store).episodes()
    assert {i.start.policy_version for i in infos} == {weights_version(folder, "act")}
    assert "4 action(s) per chunk, sends observation.state, observation.environment_state" in r.stderr


def test_the_server_answers_health_checks(mapping, serve):
    import urllib.request

    server = serve(StudentServed(Student.create(mapping, seed=0)))
    with urllib.request.urlopen(f"http://{server.host}:{server.port}/healthz", timeout=10) as resp:
        assert resp.status == 200


def test_requests_of_several_clients_are_served_one_at_a_time(mapping, serve):
    student = Student.create(mapping, seed=0)
    server = serve(StudentServed(student))
    errors = []

    def client(seed):
        try:
            with RemotePolicy(server.address, mapping) as remote:
                for t in range(5):
                    obs = _obs(mapping, 2, seed * 10 + t)
                    remote.reset_rows([0, 1], 2)
                    np.testing.assert_array_equal(remote.act(obs).action, student.act(obs).action)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and server.requests == 15
