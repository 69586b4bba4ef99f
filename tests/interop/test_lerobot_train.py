"""`lerobot-train` (LeRobot 0.4.4's own training entry point, run as a user runs it) trains ACT and diffusion for a
few steps on `hg-dagger export --format lerobot` output as is: a state export (observation.state and the goal as
observation.environment_state), a camera export made with `--labels trainable`, and the same with the camera as
H.264 video (`--video h264`, decoded by torchcodec); the trained policy, loaded back with its saved processors, runs
`select_action` on a frame of the export. Runs in .venv-interop only (`make test-interop`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = os.environ.get("HG_DAGGER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
LEROBOT_TRAIN = str(Path(sys.executable).with_name("lerobot-train"))

pytestmark = pytest.mark.subprocess  # lerobot-train and hg-dagger run as processes

# Small networks so that three CPU steps take seconds, not minutes; the dataset side is what is tested.
SMALL = {
    "act": ["--policy.dim_model=64", "--policy.n_heads=2", "--policy.dim_feedforward=128",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1", "--policy.chunk_size=8",
            "--policy.n_action_steps=8", "--policy.pretrained_backbone_weights=null"],
    "diffusion": ["--policy.horizon=8", "--policy.n_action_steps=4", "--policy.down_dims=[32,64]",
                  "--policy.num_inference_steps=2", "--policy.crop_shape=null"],
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("train")
    subprocess.run([PROJECT_PYTHON, str(Path(__file__).with_name("make_export.py")), str(work)], check=True,
                   cwd=ROOT, timeout=900)
    return work


def _frames(root):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/hg_dagger_export", root=root)


def test_the_exports_are_what_lerobot_policies_need(work):
    meta = json.loads((work / "train.json").read_text())
    state = _frames(work / "lerobot_state")
    assert len(state) == meta["state_frames"]
    feats = state.meta.features
    assert feats["observation.state"]["names"] == ["shoulder", "elbow", "ee_x", "ee_y", "target_x", "target_y"]
    assert feats["observation.environment_state"]["names"] == ["target_x", "target_y"]
    row = state[5]
    np.testing.assert_array_equal(row["observation.environment_state"].numpy(), row["observation.state"][4:].numpy())
    cam = _frames(work / "lerobot_camera")
    allowed = meta["camera_allowed"]
    assert len(cam) == sum(len(v) for v in allowed.values()) > 0
    assert cam.meta.camera_keys == ["observation.images.rgb"]
    eps = cam.meta.episodes
    for e in range(cam.num_episodes):  # each episode one run of allowed labels, with its place in the store
        first, end = eps["hg_dagger/first_step"][e], eps["hg_dagger/end_step"][e]
        assert set(range(first, end)) <= set(allowed[eps["hg_dagger/episode_id"][e]])
    assert all(bool(cam[i]["trainable"]) for i in range(len(cam)))


def test_lerobot_decodes_the_video_export_with_torchcodec(work):
    """The video export holds the camera export's frames (H.264 is lossy: at least 30 dB PSNR), decoded by LeRobot's
    own video path, which needs torchcodec with torch 2.14.1 (torchvision 0.29 has no VideoReader)."""
    video, png = _frames(work / "lerobot_video"), _frames(work / "lerobot_camera")
    assert video.video_backend == "torchcodec" and video.meta.video_keys == ["observation.images.rgb"]
    assert len(video) == len(png) > 0
    for i in range(len(video)):
        a, b = video[i]["observation.images.rgb"], png[i]["observation.images.rgb"]
        assert a.shape == b.shape and a.dtype == torch.float32
        mse = float(((a - b) ** 2).mean())
        assert 10 * np.log10(1.0 / max(mse, 1e-12)) >= 30.0, (i, mse)
        np.testing.assert_array_equal(video[i]["action"].numpy(), png[i]["action"].numpy())


@pytest.mark.parametrize(("policy", "export"), [
    ("act", "lerobot_state"), ("diffusion", "lerobot_state"), ("act", "lerobot_camera"),
    ("diffusion", "lerobot_camera"), ("act", "lerobot_video")])
def test_lerobot_train_trains_and_the_policy_acts(work, policy, export):
    out = work / f"run_{policy}_{export}"
    cmd = [LEROBOT_TRAIN, "--dataset.repo_id=local/hg_dagger_export", f"--dataset.root={work / export}",
           f"--policy.type={policy}", "--policy.device=cpu", "--policy.push_to_hub=false", "--wandb.enable=false",
           "--steps=3", "--batch_size=2", "--num_workers=0", "--save_freq=3", "--eval_freq=0", "--log_freq=1",
           f"--output_dir={out}", *SMALL[policy]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "step:3 " in log and "End of training" in log, log[-2000:]
    loss = float(log.split("step:3 ")[1].split("loss:")[1].split()[0])
    assert np.isfinite(loss)

    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    path = out / "checkpoints" / "last" / "pretrained_model"
    trained = get_policy_class(policy).from_pretrained(str(path))
    trained.eval()
    pre, post = make_pre_post_processors(trained.config, pretrained_path=str(path))
    ds = _frames(work / export)
    frame = {k: v for k, v in ds[0].items() if k.startswith("observation.") or k == "task"}
    with torch.no_grad():
        action = post(trained.select_action(pre(frame)))
    assert tuple(action.shape) == (1, ds.meta.features["action"]["shape"][0])
    assert torch.isfinite(action).all()
    print(f"{policy} on {export}: step 3 loss {loss:.4f}, select_action -> {action.numpy().round(4).tolist()}")
