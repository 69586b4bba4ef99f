"""Label extraction, aggregation across iterations and the trainer, on real toy_reach rollouts in memory."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    LabelMask,
    LabelTarget,
    derive_labels,
)
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.toy import toy_ik_action
from hg_dagger.errors import ContractError
from hg_dagger.learn.aggregate import LabelBuffer, LabelBufferConfig
from hg_dagger.learn.train import TrainConfig, Trainer
from hg_dagger.policy import Student
from hg_dagger.store.trainable import extract_labels


def rollout(seed: int, steps: int = 40, invalid_every: int = 0, window=None) -> dict[str, np.ndarray]:
    """One toy_reach episode driven by the IK expert, as flat per-step fields with derived labels."""
    env = make_env("toy_reach", num_envs=1, seed=seed)
    obs, _ = env.reset(seed=seed)
    rows: dict[str, list] = {k: [] for k in ("obs/qpos", "obs/ee_pos", "obs/target", "expert_action",
                                             "applied_action", "expert_valid", "action_source")}
    for t in range(steps):
        a = toy_ik_action(obs)
        valid = not (invalid_every and t % invalid_every == 0)
        for k in ("qpos", "ee_pos", "target"):
            rows[f"obs/{k}"].append(obs[k][0])
        rows["expert_action"].append(a[0] if valid else np.full(2, np.nan, np.float32))
        rows["applied_action"].append(a[0] * 0.5)  # what ran differs from the label on purpose
        rows["expert_valid"].append(valid)
        rows["action_source"].append(ActionSource.EXPERT.code)
        obs = env.step(a * 0.5).obs
    data = {k: np.asarray(v) for k, v in rows.items()}
    n = steps
    win = window or (0, n)
    labels = derive_labels(
        action_source=data["action_source"], valid=np.ones(n, bool), step_flags=np.zeros(n, np.uint16),
        expert_valid=data["expert_valid"],
        windows=[CorrectionWindow(parent_episode_id=f"e{seed}", parent_step_id=win[0], handover_start=win[0],
                                  handover_end=win[1], source=ActionSource.EXPERT)],
        mode=CollectionMode.DAGGER_SYNC, operator="", policy_version="",
    )
    data["label_mask"], data["label_target"] = labels.mask, labels.target
    return data


KEYS = ["qpos", "ee_pos", "target"]


def test_only_trainable_rows_with_their_target_are_extracted():
    data = rollout(0, steps=30, invalid_every=4, window=(5, 25))
    ep = extract_labels(data, episode_id="e0", obs_keys=KEYS)
    trainable = np.flatnonzero(data["label_mask"] == LabelMask.TRAINABLE.code)
    assert np.array_equal(ep.step, trainable)
    assert all(5 <= s < 25 and s % 4 for s in ep.step)  # inside the window, never an invalid label
    np.testing.assert_array_equal(ep.target, data["expert_action"][trainable])  # expert target, not applied
    np.testing.assert_array_equal(ep.obs["qpos"], data["obs/qpos"][trainable])
    # invalid rows split the window into segments: 5-7 | 9-11 | 13-15 | 17-19 | 21-23
    assert len(np.unique(ep.segment)) == 5 and ep.segment[0] == 0


def test_applied_action_target_is_used_when_the_label_says_so():
    data = rollout(1, steps=10)
    data["label_target"][:] = LabelTarget.APPLIED_ACTION.code
    ep = extract_labels(data, episode_id="e1", obs_keys=KEYS)
    np.testing.assert_array_equal(ep.target, data["applied_action"])


def test_a_trainable_row_with_a_nan_target_is_refused_with_its_step():
    data = rollout(2, steps=10)
    data["expert_action"][6] = np.nan  # a corrupt label layer claiming a NaN label is trainable
    with pytest.raises(ContractError, match="episode e2 step 6"):
        extract_labels(data, episode_id="e2", obs_keys=KEYS)


def _ep(seed, iteration, success, steps=10):
    return extract_labels(rollout(seed, steps=steps), episode_id=f"e{seed}", obs_keys=KEYS,
                          iteration=iteration, success=success)


def test_capacity_evicts_whole_oldest_episodes_and_keeps_boundaries():
    r = LabelBuffer(LabelBufferConfig(capacity=25))
    r.add([_ep(0, 0, True), _ep(1, 0, False)])
    r.add([_ep(2, 1, True)])
    assert r.episode_ids == ["e1", "e2"] and r.evicted == ["e0"] and len(r) == 20
    assert r.segments() == [("e1", 0, 10), ("e2", 0, 10)]
    a = r.arrays()
    assert set(a["iteration"]) == {0, 1} and a["step"][:10].tolist() == list(range(10))


def test_keep_iterations_and_success_only_filter():
    r = LabelBuffer(LabelBufferConfig(keep_iterations=1, filter="success_only"))
    r.add([_ep(0, 0, True), _ep(1, 0, False)])
    assert r.episode_ids == ["e0"]  # the failed episode never enters
    r.add([_ep(2, 1, True)])
    assert r.episode_ids == ["e2"]


def test_failure_focused_and_recent_sampling_shift_the_batch():
    eps = [_ep(0, 0, True), _ep(1, 0, False), _ep(2, 1, True)]
    rng = np.random.default_rng(0)
    plain = LabelBuffer(LabelBufferConfig())
    plain.add(eps)
    focused = LabelBuffer(LabelBufferConfig(filter="failure_focused", failure_weight=8.0))
    focused.add(eps)
    recent = LabelBuffer(LabelBufferConfig(sampling="recent", recent_fraction=0.9))
    recent.add(eps)

    def share(r, pick):
        rows = r.sample(20000, rng)
        return pick(r.arrays())[rows].mean()

    assert share(plain, lambda a: ~a["success"]) == pytest.approx(1 / 3, abs=0.02)
    assert share(focused, lambda a: ~a["success"]) == pytest.approx(0.8, abs=0.02)
    assert share(recent, lambda a: a["iteration"] == 1) == pytest.approx(0.9 + 0.1 / 3, abs=0.02)


def test_replay_state_roundtrip():
    r = LabelBuffer(LabelBufferConfig(capacity=25), seed=3)
    eps = {e.episode_id: e for e in (_ep(0, 0, True), _ep(1, 0, True), _ep(2, 1, False))}
    r.add(eps.values())
    state = json.loads(json.dumps(r.state()))  # checkpoint-safe plain data
    other = LabelBuffer(LabelBufferConfig.model_validate(state["config"]))
    other.restore(state, lambda eid: eps[eid])
    assert other.episode_ids == r.episode_ids and other.evicted == r.evicted
    np.testing.assert_array_equal(other.sample(50), r.sample(50))


def _replay(n_eps=6, steps=40, **cfg):
    r = LabelBuffer(LabelBufferConfig(**cfg))
    r.add(extract_labels(rollout(s, steps=steps), episode_id=f"e{s}", obs_keys=KEYS) for s in range(n_eps))
    return r


def test_training_fits_the_expert_and_is_deterministic():
    mapping = load_mapping("toy_reach")
    cfg = TrainConfig(steps=300, batch_size=64, lr=3e-3, seed=7)
    results = []
    for _ in range(2):
        student = Student.create(mapping, ensemble=3, seed=7, hidden=(64, 64))
        results.append((Trainer(student, cfg, _replay()).fit(progress=False), student))
    (r1, s1), (r2, s2) = results
    assert r1["version"] == r2["version"] == s1.version and s1.version.endswith("-r1")
    assert r1["loss_last"] < 0.5 * r1["loss_first"]
    # held-out states: the trained ensemble tracks the IK expert far better than chance
    held = rollout(99, steps=40)
    obs = {k: held[f"obs/{k}"] for k in KEYS}
    err = np.abs(s1.act(obs).action - held["expert_action"]).mean()
    base = np.abs(Student.create(mapping, ensemble=3, seed=7, hidden=(64, 64)).act(obs).action
                  - held["expert_action"]).mean()
    assert err < 0.5 * base


def test_intervention_weighting_balances_corrections():
    r = _replay(n_eps=2, steps=10, intervention_weight="balanced")
    r.episodes[0].intervention[:] = False
    r._arrays = None
    w = r.arrays()["weight"]
    assert w[:10].tolist() == [1.0] * 10 and np.allclose(w[10:], 1.0)  # 10 vs 10 -> weight 1
    r = _replay(n_eps=2, steps=10, intervention_weight=4.0)
    assert np.allclose(r.arrays()["weight"], 4.0)  # every expert row was executed


def test_cnn_student_trains_on_camera_labels(tmp_path):
    """The camera path end to end: uint8 frames in the replay -> encoder -> loss; the target is readable
    from the image only (a bright square's column), so fitting it needs the encoder."""
    import yaml

    from hg_dagger.envs.mapping import TASKS_DIR

    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    data["observation"].append({"name": "rgb", "shape": [32, 32, 3], "dtype": "uint8"})
    (tmp_path / "cam.yaml").write_text(yaml.safe_dump(data))
    mapping = load_mapping(str(tmp_path / "cam.yaml"))
    rng = np.random.default_rng(0)
    n = 256
    col = rng.integers(0, 24, n)
    rgb = np.zeros((n, 32, 32, 3), np.uint8)
    for i, c in enumerate(col):
        rgb[i, 12:20, c : c + 8] = 255
    target = np.stack([col / 12.0 - 1.0, np.zeros(n)], axis=1).astype(np.float32)
    rows = {"obs/qpos": np.zeros((n, 2), np.float32), "obs/ee_pos": np.zeros((n, 2), np.float32),
            "obs/target": np.zeros((n, 2), np.float32), "obs/rgb": rgb, "expert_action": target,
            "applied_action": target, "action_source": np.full(n, ActionSource.EXPERT.code, np.uint8),
            "label_mask": np.full(n, LabelMask.TRAINABLE.code, np.uint8),
            "label_target": np.full(n, LabelTarget.EXPERT_ACTION.code, np.uint8)}
    replay = LabelBuffer(LabelBufferConfig())
    replay.add([extract_labels(rows, episode_id="cam", obs_keys=["qpos", "ee_pos", "target", "rgb"])])
    student = Student.create(mapping, kind="cnn", ensemble=2, hidden=(32,), seed=0)
    result = Trainer(student, TrainConfig(steps=150, batch_size=64, lr=3e-3), replay).fit(progress=False)
    assert result["loss_last"] < 0.3 * result["loss_first"]
    obs = {k[4:]: v for k, v in rows.items() if k.startswith("obs/")}
    err = np.abs(student.act(obs).action[:, 0] - target[:, 0]).mean()
    assert err < 0.5 * np.abs(target[:, 0] - target[:, 0].mean()).mean()
