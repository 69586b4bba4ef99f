"""LeRobot's own LeRobotDataset (lerobot 0.4.4) loads an `hg-dagger export --format lerobot` and every value
compares equal to the store. Runs in .venv-interop (`make test-interop`); the store and the export are made by
make_export.py in the project's environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = os.environ.get("HG_DAGGER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    work = tmp_path_factory.mktemp("interop")
    subprocess.run([PROJECT_PYTHON, str(Path(__file__).with_name("make_export.py")), str(work)], check=True,
                   cwd=ROOT, timeout=600)
    return work, dict(np.load(work / "expected.npz")), json.loads((work / "expected.json").read_text())


def _load(root, **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/hg_dagger_export", root=root, **kw)


def test_lerobot_loads_export_and_values_equal_the_store(export):
    work, want, meta = export
    ds = _load(work / "lerobot")
    n = len(want["frame_index"])
    assert len(ds) == n and ds.num_episodes == len(meta["lengths"]) and ds.fps == meta["fps"]
    assert ds.meta.camera_keys == ["observation.images.rgb"]
    starts = np.concatenate([[0], np.cumsum(meta["lengths"])[:-1]])
    episode = np.repeat(np.arange(len(meta["lengths"])), meta["lengths"])
    for i in range(n):
        item = ds[i]
        np.testing.assert_array_equal(item["observation.state"].numpy(), want["state"][i], err_msg=f"frame {i}")
        np.testing.assert_array_equal(item["action"].numpy(), want["action"][i], err_msg=f"frame {i}")
        # LeRobot hands images out as float CHW in [0, 1]; PNG is lossless, so x * 255 gives the stored bytes back
        img = (item["observation.images.rgb"] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(img, want["rgb"][i], err_msg=f"frame {i}")
        assert item["trainable"].item() == bool(want["trainable"][i]), i
        assert item["action_source"].item() == int(want["action_source"][i]), i
        assert item["intervene_flag"].item() == bool(want["trainable"][i] and want["action_source"][i] == 1), i
        assert item["frame_index"].item() == int(want["frame_index"][i])
        assert item["episode_index"].item() == int(episode[i])
        assert item["index"].item() == i
        assert item["timestamp"].item() == np.float32(want["frame_index"][i] / meta["fps"])
        assert item["task"] == meta["task"]
    assert ds.meta.episodes["dataset_from_index"] == [int(s) for s in starts]
    assert ds.meta.episodes["hg_dagger/episode_id"] == meta["episode_ids"]
    assert int(want["trainable"].sum()) > 0  # the windows' human steps are trainable labels


def test_lerobot_action_chunks_pad_at_episode_ends(export):
    """delta_timestamps (how RLinf's DAgger draws action chunks) uses the episode bounds of meta/episodes."""
    work, want, meta = export
    fps = meta["fps"]
    ds = _load(work / "lerobot", delta_timestamps={"action": [0, 1 / fps, 2 / fps]})
    last = meta["lengths"][0] - 1  # the last frame of episode 0
    item = ds[last]
    assert item["action_is_pad"].tolist() == [False, True, True]
    np.testing.assert_array_equal(item["action"][0].numpy(), want["action"][last])
    item = ds[last - 2]
    assert item["action_is_pad"].tolist() == [False, False, False]
    np.testing.assert_array_equal(item["action"].numpy(), want["action"][last - 2:last + 1])


def test_lerobot_loads_a_subset_of_episodes(export):
    work, want, meta = export
    ds = _load(work / "lerobot", episodes=[2])
    assert len(ds) == meta["lengths"][2]
    first = sum(meta["lengths"][:2])
    np.testing.assert_array_equal(ds[0]["observation.state"].numpy(), want["state"][first])
