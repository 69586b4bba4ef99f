"""`train --dataset` stores the student's calibrated gate thresholds with it, as `train --store` does: the
confidence gate of the task's gate config is calibrated on the recorded states of the version's stores (the store
given, else the version's, the newest first, the first whose states suffice) and the thresholds are written into
the checkpoint, so a session with this student starts from them. (Its re-check of every trainable sample's
authorization on an older version is tests/datasets/test_dataset_reauthorize.py.)"""

from __future__ import annotations

import numpy as np
from reviewed import approve
from support.store import end, human_window

from hg_dagger.contract import ActionSource, CollectionMode, EpisodeStart, TaskInfo, step_fields
from hg_dagger.datasets.build import build
from hg_dagger.envs.mapping import load_mapping
from hg_dagger.learn.train import TrainConfig, train_from_store
from hg_dagger.policy.checkpoint import read_checkpoint
from hg_dagger.store import EpisodeStore


def _store(path, episodes: int, steps: int, window: tuple[int, int] | None) -> EpisodeStore:
    """toy_reach episodes under the shipped mapping (policy-driven but for a human window, approved for
    training), values a smooth function of (episode, step)."""
    mapping = load_mapping("toy_reach")
    st = EpisodeStore.create(path)
    with st.recorder(on_full="block") as rec:
        for k in range(episodes):
            eid = rec.begin_episode(EpisodeStart(task=TaskInfo(task_id="toy_reach"), mode=CollectionMode.HUMAN_GATED,
                                                 control_hz=25.0, mapping=mapping.as_metadata(),
                                                 mapping_hash=mapping.hash, operator="op-a"),
                                    step_fields(obs=mapping.obs_spec(), action_dim=2))
            for t in range(steps):
                human = window is not None and window[0] <= t < window[1]
                x = np.float32(np.sin(0.1 * t + k))
                s = {"t_obs": 1_000_000 * (k + 1) + 40_000 * t, "obs/qpos": np.array([x, t / steps], np.float32),
                     "obs/ee_pos": np.array([-x, 0.5], np.float32), "obs/target": np.array([0.2 * k, 0.3], np.float32),
                     "applied_action": np.array([x / 2, -x / 3], np.float32),
                     "policy_action": np.array([x / 2, -x / 3], np.float32),
                     "action_source": np.uint8((ActionSource.HUMAN if human else ActionSource.POLICY).code)}
                if human:
                    s["human_command"] = np.zeros(7, np.float32)
                rec.put(eid, s)
            rec.end_episode(eid, end(steps), windows=[human_window(eid, *window)] if window else [])
    st = EpisodeStore.open(path)
    if window:
        for info in st.episodes():
            approve(st, info.episode_id)
    return EpisodeStore.open(path)


def test_train_dataset_stores_the_calibrated_gate_thresholds(tmp_path):
    big = _store(tmp_path / "big", 4, 60, (20, 30))  # 200 policy states: the shipped gate needs 100
    small = _store(tmp_path / "small", 1, 20, None)  # too few to calibrate on
    build("toy", [big.url, small.url], root=tmp_path / "datasets")
    cfg = TrainConfig(steps=5)
    # the version's stores, the newest first: the small one cannot calibrate, the big one does
    result = train_from_store(None, "toy_reach", tmp_path / "t", train_cfg=cfg, progress=False, dataset="toy",
                              datasets_root=tmp_path / "datasets")
    cal = result["gate_calibration"]
    assert cal["thresholds"] and cal["store"] == str(big.url), cal
    conf = cal["thresholds"]["confidence"]
    assert conf["warn"] < conf["trigger"] and "calibrated for the student" in cal["message"]
    ckpt = read_checkpoint(result["checkpoint"])
    assert ckpt["extra"]["gate_thresholds"] == cal["thresholds"] and ckpt["extra"]["dataset"]["dataset"] == "toy@v1"
    # --store names the store to calibrate on; one without enough states stores nothing and says why
    result = train_from_store(str(small.url), "toy_reach", tmp_path / "t2", train_cfg=cfg, progress=False,
                              dataset="toy", datasets_root=tmp_path / "datasets")
    cal = result["gate_calibration"]
    assert cal["thresholds"] is None and cal["store"] == str(small.url) and "needed" in cal["message"]
    assert "gate_thresholds" not in read_checkpoint(result["checkpoint"])["extra"]
