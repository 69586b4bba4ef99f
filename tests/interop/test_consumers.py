"""The other consumers' own readers on our exports, where they need LeRobot's SDK: EmbodiChain 0.3.2's
LeRobotDataSource reads the LeRobot export with its default columns (observation.state, action), and LeRobot's
own v2.1 reader (its v2.1 -> v3.0 converter, which loads every v2.1 file: info.json, episodes.jsonl,
episodes_stats.jsonl, tasks.jsonl, the per-episode parquet files) opens the RLinf shard. Runs in .venv-interop
only (`make test-interop`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = os.environ.get("HG_DAGGER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("consumers")
    subprocess.run([PROJECT_PYTHON, str(Path(__file__).with_name("make_export.py")), str(work)], check=True,
                   cwd=ROOT, timeout=900)
    return work


def test_embodichain_lerobot_data_source_reads_the_export_with_its_defaults(work):
    sources = pytest.importorskip("embodichain.data_pipeline.datasets.lerobot")
    root = work / "lerobot_state"
    info = json.loads((root / "meta" / "info.json").read_text())
    src = sources.LeRobotDataSource(root, schema=info["hg_dagger"]["embodichain_schema"],
                                    memory_limit_bytes=1 << 28, source_id="hg_dagger:interop")
    rows = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    state = np.array(rows["observation.state"], np.float32)
    action = np.array(rows["action"], np.float32)
    episode = np.array(rows["episode_index"])
    assert src.data.batch_size[0] == info["total_episodes"]
    for e in range(info["total_episodes"]):
        n = int((episode == e).sum())
        np.testing.assert_array_equal(src.data["obs"][e, :n].numpy(), state[episode == e])
        np.testing.assert_array_equal(src.data["actions"][e, :n].numpy(), action[episode == e])
        assert src.data["valid"][e, :n].all() and not src.data["valid"][e, n:].any()


def test_lerobot_v21_reader_opens_the_rlinf_shard(work, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    shard = work / "rlinf" / "rank_0" / "id_0"
    base = tmp_path / "v21"
    shutil.copytree(shard, base / "shard")
    convert_dataset("shard", root=str(base), push_to_hub=False)
    ds = LeRobotDataset("local/shard", root=base / "shard")
    info = json.loads((shard / "meta" / "info.json").read_text())
    assert len(ds) == info["total_frames"] and ds.num_episodes == info["total_episodes"]
    assert ds.meta.camera_keys == ["image"]
    k = 0
    for e in range(info["total_episodes"]):
        rows = pq.read_table(shard / info["data_path"].format(episode_chunk=0, episode_index=e)).to_pydict()
        for t in range(len(rows["index"])):
            item = ds[k]
            np.testing.assert_array_equal(item["state"].numpy(), np.array(rows["state"][t], np.float32))
            np.testing.assert_array_equal(item["actions"].numpy(), np.array(rows["actions"][t], np.float32))
            assert item["image"].shape[0] == 3 and int(item["episode_index"]) == e
            k += 1
