"""A LeRobot policy that `lerobot-train` trained on an hg-dagger export, served by `hg-dagger policy serve lerobot:DIR`
from this environment (LeRobot 0.4.4), driven by `hg-dagger run` in the project's environment with the synthetic
operator: the reply is LeRobot's own inference (its saved processors normalize), the run records the served
version, its gates and windows, the store validates, and a task the policy does not fit is refused in one line.

The store: toy_reach with the expert answering the gates, its windows approved and authorized by a reviewer with
`hg-dagger review approve`, exported with `--labels trainable`. Runs in .venv-interop only (`make test-interop`)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = os.environ.get("HG_DAGGER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
LEROBOT_TRAIN = str(Path(sys.executable).with_name("lerobot-train"))
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}

pytestmark = pytest.mark.subprocess  # lerobot-train, hg-dagger and policy servers as processes

SMALL = {
    "act": ["--policy.dim_model=64", "--policy.n_heads=2", "--policy.dim_feedforward=128",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1", "--policy.chunk_size=8",
            "--policy.n_action_steps=4", "--policy.pretrained_backbone_weights=null"],
    "diffusion": ["--policy.horizon=8", "--policy.n_action_steps=4", "--policy.down_dims=[32,64]",
                  "--policy.num_inference_steps=2", "--policy.crop_shape=null"],
}
N_ACTION_STEPS = 4


def _hg(*args, python: str = PROJECT_PYTHON, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=timeout)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A toy_reach store whose windows a reviewer approved and authorized, and its `--labels trainable` export."""
    work = tmp_path_factory.mktemp("served")
    t0 = time.perf_counter()
    _ok(_hg("run", "--task", "toy_reach", "--operator", "expert", "--episodes", "4", "--max-episode-steps", "60",
            "--seed", "0", "--store", work / "demos", "--quiet"))
    windows = json.loads(_ok(_hg("review", "list", work / "demos", "--json", "--quiet")))
    assert windows
    for w in windows:
        _ok(_hg("review", "approve", work / "demos", w["window_id"], "--reviewer", "interop-reviewer", "--authorize"))
    _ok(_hg("export", work / "demos", "--format", "lerobot", "--labels", "trainable", "--out", work / "export",
            "--quiet"))
    print(f"store of {len(windows)} approved windows exported in {time.perf_counter() - t0:.1f} s")
    return work


@pytest.fixture(scope="module", params=["act", "diffusion"])
def trained(request, work) -> Path:
    """`lerobot-train` run as a user runs it on the export: a few CPU steps of a small network."""
    policy = request.param
    out = work / f"train_{policy}"
    t0 = time.perf_counter()
    r = subprocess.run([LEROBOT_TRAIN, "--dataset.repo_id=local/hg_dagger_toy", f"--dataset.root={work / 'export'}",
                        f"--policy.type={policy}", "--policy.device=cpu", "--policy.push_to_hub=false",
                        "--wandb.enable=false", "--steps=5", "--batch_size=4", "--num_workers=0", "--save_freq=5",
                        "--eval_freq=0", "--log_freq=5", f"--output_dir={out}", *SMALL[policy]],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"lerobot-train {policy}: 5 steps in {time.perf_counter() - t0:.1f} s")
    return out / "checkpoints" / "last" / "pretrained_model"


@pytest.fixture(scope="module")
def served(trained):
    """`hg-dagger policy serve lerobot:DIR` started from this environment's python; its address."""
    proc = subprocess.Popen([sys.executable, "-m", "hg_dagger", "policy", "serve", f"lerobot:{trained}", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    t0 = time.perf_counter()
    deadline = t0 + 180
    line = ""
    while not line.startswith("listening on ") and time.perf_counter() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        pytest.fail(f"the policy server did not start: {proc.stderr.read()[-3000:]}")
    print(f"policy server up in {time.perf_counter() - t0:.1f} s")
    yield line.split("listening on ", 1)[1].strip()
    proc.terminate()
    proc.wait(timeout=30)


def _lerobot(folder: Path):
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    policy_type = json.loads((folder / "config.json").read_text())["type"]
    policy = get_policy_class(policy_type).from_pretrained(str(folder))
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(folder))
    return policy, pre, post


def _own_actions(folder: Path, frame: dict, steps: int) -> np.ndarray:
    """What LeRobot itself executes from ``frame`` after a reset: ``select_action`` ``steps`` times, unnormalized."""
    policy, pre, post = _lerobot(folder)
    policy.reset()
    with torch.no_grad():
        return np.stack([post(policy.select_action(pre(dict(frame))))[0].numpy() for _ in range(steps)])


def _dataset(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/hg_dagger_toy", root=root)


def _ask(address: str, obs: dict) -> tuple[dict, dict]:
    """openpi's protocol by hand: the metadata frame, then one request and its reply."""
    from websockets.sync.client import connect

    from hg_dagger.policy.wire import packb, unpackb

    with connect(address, max_size=None, compression=None) as ws:
        meta = unpackb(ws.recv(timeout=60))
        ws.send(packb(obs))
        reply = ws.recv(timeout=120)
    assert isinstance(reply, bytes), reply
    return meta, unpackb(reply)


def test_the_server_answers_with_lerobots_own_inference(work, trained, served):
    from hg_dagger.policy.lerobot_served import weights_version

    cfg = json.loads((trained / "config.json").read_text())
    frame = _dataset(work / "export")[7]
    inputs = {k: frame[k].numpy().astype(np.float32) for k in cfg["input_features"]}
    meta, reply = _ask(served, {**inputs, "task": frame["task"]})
    assert meta["policy_version"] == weights_version(trained, cfg["type"])
    assert set(meta["input_features"]) == set(cfg["input_features"]) >= {"observation.state",
                                                                          "observation.environment_state"}
    assert meta["action_dim"] == 2 and meta["n_action_steps"] == N_ACTION_STEPS
    actions = np.asarray(reply["actions"])
    assert actions.dtype == np.float32 and np.isfinite(actions).all()
    assert reply["server_timing"]["infer_ms"] > 0
    if cfg["type"] == "act":  # the whole chunk; its first n_action_steps are what LeRobot's select_action executes
        assert actions.shape == (cfg["chunk_size"], 2)
        own = _own_actions(trained, {**{k: frame[k] for k in cfg["input_features"]}, "task": frame["task"]},
                           N_ACTION_STEPS)
        np.testing.assert_allclose(actions[:N_ACTION_STEPS], own, atol=1e-5)
    else:  # diffusion samples: the n_action_steps it queues from this observation
        assert actions.shape == (N_ACTION_STEPS, 2) == (meta["chunk_size"], 2)
    print(f"{cfg['type']} served: chunk {actions.shape}, infer {reply['server_timing']['infer_ms']:.1f} ms")


def test_hg_dagger_run_corrects_the_served_policy(work, trained, served):
    from hg_dagger.policy.lerobot_served import weights_version
    from hg_dagger.store import EpisodeStore

    policy_type = json.loads((trained / "config.json").read_text())["type"]
    store = work / f"run_{policy_type}"
    t0 = time.perf_counter()
    summary = json.loads(_ok(_hg("run", "--task", "toy_reach", "--policy", served, "--operator", "synthetic",
                                 "--episodes", "3", "--max-episode-steps", "100", "--seed", "5", "--store", store,
                                 "--quiet", "--json")))
    took = time.perf_counter() - t0
    assert summary["episodes"] == 3 and summary["stopped_by"] == ""
    # a policy trained five steps does not reach: the gates ask for help and the operator's windows are recorded
    assert summary["gate_triggers"] >= 1 and summary["windows"] >= 1, summary
    assert "0 violation(s)" in _ok(_hg("validate", store))

    s = EpisodeStore.open(store)
    infos = s.episodes(complete=True)
    assert len(infos) == 3
    version = weights_version(trained, policy_type)
    assert {i.start.policy_version for i in infos} == {version}
    windows = [w for i in infos for w in s.labels(i.episode_id).windows]
    assert len(windows) == summary["windows"]
    assert all(w.gate_reason and w.handover_end > w.handover_start for w in windows)
    steps = {i.episode_id: s.read_steps(i.episode_id, ["policy_action", "inference_ns"]) for i in infos}
    assert all(a["inference_ns"][0] > 0 and np.isfinite(a["policy_action"][0]).all() for a in steps.values())

    if policy_type == "act":  # deterministic: what was recorded is LeRobot's own policy on the recorded observation
        _ok(_hg("export", store, "--format", "lerobot", "--labels", "all", "--out", work / f"run_{policy_type}_export",
                "--quiet"))
        ds = _dataset(work / f"run_{policy_type}_export")
        cfg = json.loads((trained / "config.json").read_text())
        eps = ds.meta.episodes
        for e in range(ds.num_episodes):
            first = ds[int(eps["dataset_from_index"][e])]
            own = _own_actions(trained, {**{k: first[k] for k in cfg["input_features"]}, "task": first["task"]},
                               N_ACTION_STEPS)
            recorded = steps[eps["hg_dagger/episode_id"][e]]["policy_action"][:N_ACTION_STEPS]
            np.testing.assert_allclose(recorded, own, atol=1e-5)
    print(f"run with {policy_type} served: {summary['steps']} steps, {summary['windows']} windows, "
          f"{summary['gate_triggers']} gate triggers in {took:.1f} s")


def test_a_task_the_policy_does_not_fit_is_refused_in_one_line(served):
    r = _hg("policy", "check", served, "--task", "fetch_pick_place")
    assert r.returncode == 2 and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr and len([ln for ln in lines if ln.startswith("error:")]) == 1
    assert lines[-1].startswith(f"error: policy server {served}") and "2 action dimensions" in lines[-1] \
        and "fetch_pick_place has 4" in lines[-1], r.stderr


def test_run_starts_the_lerobot_server_from_the_policy_python(work, trained):
    """`--policy lerobot:DIR --policy-python PY`: the run starts `policy serve` in PY itself and stops it."""
    from hg_dagger.policy.lerobot_served import weights_version
    from hg_dagger.store import EpisodeStore

    policy_type = json.loads((trained / "config.json").read_text())["type"]
    store = work / f"run_{policy_type}_spawned"
    summary = json.loads(_ok(_hg("run", "--task", "toy_reach", "--policy", f"lerobot:{trained}", "--policy-python",
                                 sys.executable, "--operator", "synthetic", "--episodes", "1", "--max-episode-steps",
                                 "40", "--seed", "9", "--store", store, "--quiet", "--json")))
    assert summary["episodes"] == 1
    infos = EpisodeStore.open(store).episodes(complete=True)
    assert [i.start.policy_version for i in infos] == [weights_version(trained, policy_type)]
