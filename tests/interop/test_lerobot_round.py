"""One round with LeRobot's own trainer: a LeRobot ACT or diffusion policy that `lerobot-train` trained a few steps
on an hg-dagger export runs in `hg-dagger run --policy lerobot:DIR` (its server started from this environment's
python), the gates fire and the operator's windows are recorded; a reviewer approves them, and `hg-dagger policy
train-next` builds the next dataset version, exports it with `--labels trainable`, fine-tunes the acting checkpoint
with the real `lerobot-train` (steps and batch from a config section), evaluates both policies served on the same
held-out seeds (the promotion rule) and writes the lineage; the next run acts with the new version. A bad trainer config fails in one line and changes nothing.
Runs in .venv-interop only (`make test-interop`)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = os.environ.get("HG_DAGGER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
LEROBOT_TRAIN = str(Path(sys.executable).with_name("lerobot-train"))
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}

pytestmark = pytest.mark.subprocess  # lerobot-train, hg-dagger and policy servers as processes

SMALL = {  # a few CPU steps of a small network, as tests/interop/test_served_lerobot_policy.py
    "act": ["--policy.dim_model=64", "--policy.n_heads=2", "--policy.dim_feedforward=128",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1", "--policy.chunk_size=8",
            "--policy.n_action_steps=4", "--policy.pretrained_backbone_weights=null"],
    "diffusion": ["--policy.horizon=8", "--policy.n_action_steps=4", "--policy.down_dims=[32,64]",
                  "--policy.num_inference_steps=2", "--policy.crop_shape=null"],
}
ROUND_STEPS = 3
PROMOTION_EPISODES = 4  # held-out episodes each policy runs before the new one may take over


def _hg(*args, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([PROJECT_PYTHON, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=timeout)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def _approve_all(store: Path) -> int:
    windows = json.loads(_ok(_hg("review", "list", store, "--json", "--quiet")))
    for w in windows:
        _ok(_hg("review", "approve", store, w["window_id"], "--reviewer", "interop-reviewer", "--authorize"))
    return len(windows)


def _digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """The user's first dataset: planner demonstrations of toy_reach, reviewed and exported `--labels trainable`."""
    work = tmp_path_factory.mktemp("round")
    _ok(_hg("run", "--task", "toy_reach", "--operator", "expert", "--episodes", "4", "--max-episode-steps", "60",
            "--seed", "0", "--store", work / "demos", "--quiet"))
    assert _approve_all(work / "demos")
    _ok(_hg("export", work / "demos", "--format", "lerobot", "--labels", "trainable", "--out", work / "export",
            "--quiet"))
    return work / "export"


@pytest.fixture(scope="module", params=["act", "diffusion"])
def acting(request, export) -> Path:
    """The user's policy: `lerobot-train` a few steps on that export."""
    policy = request.param
    out = export.parent / f"train_{policy}"
    r = subprocess.run([LEROBOT_TRAIN, "--dataset.repo_id=local/hg_dagger_toy", f"--dataset.root={export}",
                        f"--policy.type={policy}", "--policy.device=cpu", "--policy.push_to_hub=false",
                        "--wandb.enable=false", "--steps=5", "--batch_size=4", "--num_workers=0", "--save_freq=5",
                        "--eval_freq=0", "--log_freq=5", f"--output_dir={out}", *SMALL[policy]],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out / "checkpoints" / "last" / "pretrained_model"


@pytest.fixture(scope="module")
def gated(acting) -> Path:
    """`hg-dagger run` with the acting policy: gates fire, the synthetic operator's windows are recorded and a
    reviewer approves them."""
    policy_type = json.loads((acting / "config.json").read_text())["type"]
    store = acting.parents[3] / f"gated_{policy_type}"
    summary = json.loads(_ok(_hg("run", "--task", "toy_reach", "--policy", f"lerobot:{acting}", "--policy-python",
                                 sys.executable, "--operator", "synthetic", "--episodes", "3", "--max-episode-steps",
                                 "100", "--seed", "5", "--store", store, "--quiet", "--json")))
    assert summary["gate_triggers"] >= 1 and summary["windows"] >= 1, summary
    assert _approve_all(store) == summary["windows"]
    return store


@pytest.mark.timeout(900)  # lerobot-train, two served policies' held-out episodes and a run: minutes on a busy CPU
def test_one_round_fine_tunes_with_lerobot_train_and_the_next_run_acts_with_it(acting, gated):
    from hg_dagger.learn.promotion import decide
    from hg_dagger.policy.lerobot_served import weights_version
    from hg_dagger.store import EpisodeStore

    cfg = json.loads((acting / "config.json").read_text())
    policy_type = cfg["type"]
    parent = weights_version(acting, policy_type)
    before = _digest(acting.parent)
    work = gated.parent
    conf = work / f"round_{policy_type}.yaml"
    conf.write_text(f"lerobot_train:\n  steps: {ROUND_STEPS}\n  batch_size: 4\n  log_freq: 1\n")
    out = work / f"round_{policy_type}"
    t0 = time.perf_counter()
    r = _hg("policy", "train-next", "--policy", f"lerobot:{acting}", "--store", gated, "--out", out, "--task",
            "toy_reach", "--config", conf, "--policy-python", sys.executable, "--dataset", f"rounds_{policy_type}",
            "--promotion-episodes", PROMOTION_EPISODES, "--json")
    took = time.perf_counter() - t0
    result = json.loads(_ok(r))

    # progress: the trainer's steps and losses, as they came
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("lerobot-train: step ")]
    assert progress[-1].startswith(f"lerobot-train: step {ROUND_STEPS}/{ROUND_STEPS}, loss "), r.stderr[-2000:]
    assert any(", loss " in ln for ln in progress[:-1]) and "held-out evaluation: the new policy" in r.stderr

    new = Path(result["checkpoint"])
    assert result["spec"] == f"lerobot:{new}" and new.is_relative_to(out / "train")
    assert result["version"] == weights_version(new, policy_type) != parent
    lineage = json.loads((new.parent / "hg_dagger_lineage.json").read_text())
    assert lineage["parent_version"] == parent and lineage["policy_version"] == result["version"]
    assert lineage["dataset"] == f"rounds_{policy_type}@v1" and lineage["dataset_new"] is True
    assert lineage["command"][0] == LEROBOT_TRAIN and f"--policy.path={acting.resolve()}" in lineage["command"]
    assert {f"--steps={ROUND_STEPS}", "--batch_size=4", f"--dataset.root={out / 'export'}"} <= set(lineage["command"])
    assert lineage["step_last"] == ROUND_STEPS and math.isfinite(lineage["loss_last"])
    assert [s for s, _ in lineage["losses"]] == list(range(1, ROUND_STEPS + 1))
    # the promotion rule of the built-in student's rounds: both policies served, on the same held-out seeds
    d = lineage["promotion"]
    assert d == result["promotion"] and d["episodes"] == PROMOTION_EPISODES
    assert (d["candidate_version"], d["incumbent_version"]) == (result["version"], parent)
    again = decide((round(d["candidate_success"] * d["episodes"]), d["episodes"]),
                   (round(d["incumbent_success"] * d["episodes"]), d["episodes"]), d["confidence"])
    assert again["promoted"] == d["promoted"] and d["acting_version"] == (result["version"] if d["promoted"] else parent)
    # the fine-tuned policy is the acting one's network, trained further: same architecture, other weights
    new_cfg = json.loads((new / "config.json").read_text())
    arch = ("dim_model", "n_encoder_layers", "chunk_size") if policy_type == "act" else ("horizon", "down_dims")
    assert {k: new_cfg[k] for k in arch} == {k: cfg[k] for k in arch}
    assert _digest(acting.parent) == before  # the acting checkpoint is left as it was
    trained = list((work / "datasets" / f"rounds_{policy_type}" / "trained").glob("v1-*.json"))
    assert [json.loads(p.read_text())["policy_version"] for p in trained] == [result["version"]]

    # the next run acts with the new version
    store = work / f"after_{policy_type}"
    summary = json.loads(_ok(_hg("run", "--task", "toy_reach", "--policy", result["spec"], "--policy-python",
                                 sys.executable, "--operator", "synthetic", "--episodes", "1", "--max-episode-steps",
                                 "40", "--seed", "9", "--store", store, "--quiet", "--json")))
    assert summary["episodes"] == 1
    assert [i.start.policy_version for i in EpisodeStore.open(store).episodes(complete=True)] == [result["version"]]
    print(f"{policy_type} round: {parent} -> {result['version']}, {ROUND_STEPS} lerobot-train steps on "
          f"{lineage['frames']} frames, loss {lineage['loss_last']:.4g}, held-out {d['candidate_success']:.2f} new "
          f"against {d['incumbent_success']:.2f} acting (promoted: {d['promoted']}); train-next took {took:.1f} s")


def test_a_bad_trainer_config_fails_in_one_line_and_keeps_the_acting_policy(acting, gated):
    policy_type = json.loads((acting / "config.json").read_text())["type"]
    if policy_type != "act":
        pytest.skip("the failure path is the trainer's, the same for every policy type: run once")
    before = _digest(acting.parent)
    work = gated.parent
    conf = work / "bad_round.yaml"
    conf.write_text("lerobot_train:\n  steps: 2\n  args: ['--policy.chunk_size=notanumber']\n")
    out = work / "bad_round"
    r = _hg("policy", "train-next", "--policy", f"lerobot:{acting}", "--store", gated, "--out", out, "--config", conf,
            "--policy-python", sys.executable, "--dataset", "bad_rounds")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    assert errors[0].startswith("error: lerobot-train failed (exit 1): ") and "notanumber" in errors[0], errors[0]
    assert _digest(acting.parent) == before and not list(out.rglob("hg_dagger_lineage.json"))
    assert not (out / "train" / "checkpoints").exists()
