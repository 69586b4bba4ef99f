"""The student heads beyond MSE. The mixture-density (GMM) head keeps one mode where the MSE head averages two,
reports its members' spread to the confidence gate, and is selected, saved and loaded as a student kind. The
chunk head learns the steps ahead within one label segment and ensembles its chunks over a rollout's steps,
forgetting a row when an episode begins in it."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract import ActionSource, LabelMask, LabelTarget
from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError
from hg_dagger.learn.aggregate import LabelBuffer, LabelBufferConfig
from hg_dagger.learn.train import TrainConfig, Trainer
from hg_dagger.policy import Student, read_checkpoint
from hg_dagger.store.trainable import extract_labels

KEYS = ["qpos", "ee_pos", "target"]


def _two_mode_labels(n: int = 400, seed: int = 0):
    """Every state twice, labelled +0.5 once and -0.5 once (a switch the state does not show)."""
    rng = np.random.default_rng(seed)
    data = {f"obs/{k}": np.repeat(rng.normal(0, 0.1, (n // 2, 2)), 2, axis=0) for k in KEYS}
    target = np.where((np.arange(n) % 2 == 0)[:, None], 0.5, -0.5).astype(np.float32) * np.ones((n, 2), np.float32)
    data.update(expert_action=target, applied_action=target,
                action_source=np.full(n, ActionSource.EXPERT.code, np.uint8),
                label_mask=np.full(n, LabelMask.TRAINABLE.code, np.uint8),
                label_target=np.full(n, LabelTarget.EXPERT_ACTION.code, np.uint8))
    obs = {k: data[f"obs/{k}"].astype(np.float32) for k in KEYS}
    return data, obs


def _trained(kind: str, ensemble: int, data, steps: int = 600) -> Student:
    replay = LabelBuffer(LabelBufferConfig())
    replay.add([extract_labels(data, episode_id="e", obs_keys=KEYS)])
    student = Student.create(load_mapping("toy_reach"), kind=kind, ensemble=ensemble, hidden=(32, 32), seed=0)
    Trainer(student, TrainConfig(steps=steps, batch_size=128, lr=3e-3, seed=0), replay).fit(progress=False)
    return student


def test_the_gmm_head_acts_on_one_mode_where_the_mse_head_averages_both():
    data, obs = _two_mode_labels()
    mse = _trained("mlp", 1, data).act(obs).action
    gmm = _trained("mlp_gmm", 1, data).act(obs).action
    assert np.abs(mse).mean() < 0.15  # the blend of +0.5 and -0.5
    assert np.abs(gmm).mean() == pytest.approx(0.5, abs=0.12)  # one of the two labelled actions
    assert (np.abs(gmm) > 0.3).mean() > 0.9  # row by row a labelled action, never the blend


def test_the_gmm_ensemble_reports_member_spread_and_a_calibrated_confidence():
    data, obs = _two_mode_labels()
    student = _trained("mlp_gmm", 3, data, steps=300)
    out = student.act(obs)
    assert out.uncertainty.shape == (len(data["expert_action"]),) and out.confidence.shape == out.uncertainty.shape
    assert np.all(out.uncertainty >= 0) and np.all((out.confidence > 0) & (out.confidence <= 1))
    # calibrated after training: about 95% of training states score confidence >= exp(-1)
    assert (out.confidence >= np.exp(-1) - 1e-6).mean() == pytest.approx(0.95, abs=0.06)
    far = {k: v + 5.0 for k, v in obs.items()}  # states no label came near
    assert student.act(far).uncertainty.mean() > out.uncertainty.mean()


def test_a_gmm_student_round_trips_through_its_checkpoint(tmp_path):
    data, obs = _two_mode_labels(n=100)
    student = _trained("mlp_gmm", 2, data, steps=30)
    student.save(tmp_path / "s.pt")
    assert read_checkpoint(tmp_path / "s.pt")["spec"]["kind"] == "mlp_gmm"
    back = Student.load(tmp_path / "s.pt", load_mapping("toy_reach"))
    assert back.version == student.version and back.spec.kind == "mlp_gmm"
    np.testing.assert_array_equal(back.act(obs).action, student.act(obs).action)
    np.testing.assert_array_equal(back.act(obs).uncertainty, student.act(obs).uncertainty)


def test_an_unknown_head_or_a_camera_head_without_a_camera_is_refused():
    mapping = load_mapping("toy_reach")
    with pytest.raises(ConfigError, match="mlp_gmm"):
        Student.create(mapping, kind="mlp_flow")
    with pytest.raises(ConfigError, match="'cnn_gmm' needs a camera"):
        Student.create(mapping, kind="cnn_gmm")


def test_mse_students_keep_their_version_hash():
    """The head rides in the kind, so the spec of an MSE student (and its version) is what it was."""
    student = Student.create(load_mapping("toy_reach"), kind="mlp", ensemble=2, hidden=(16,), seed=3)
    assert set(student.spec.as_dict()) == {"kind", "ensemble", "hidden", "state_dim", "action_dim", "image_keys",
                                           "image_shape", "cnn_channels", "cnn_features"}


# ---------------------------------------------------------------------- action chunks (kind: *_chunk)


def _segmented_labels():
    """One episode: steps 0-5 labelled by the expert, 6-8 by a person's window (applied action), 9-10 not
    trainable, 11-14 the expert again; each label its step number, so a chunk's targets name their steps."""
    n = 15
    step = np.arange(n, dtype=np.float32)
    data = {f"obs/{k}": np.stack([step, -step], 1) for k in KEYS}
    expert = np.stack([step, step], 1).astype(np.float32)
    target = np.where(np.isin(np.arange(n), [6, 7, 8]), LabelTarget.APPLIED_ACTION.code,
                      LabelTarget.EXPERT_ACTION.code).astype(np.uint8)
    mask = np.where(np.isin(np.arange(n), [9, 10]), LabelMask.CONTEXT_ONLY.code, LabelMask.TRAINABLE.code)
    data.update(expert_action=expert, applied_action=expert.copy(),
                action_source=np.full(n, ActionSource.EXPERT.code, np.uint8), label_mask=mask.astype(np.uint8),
                label_target=target)
    return data


def test_a_chunk_never_crosses_a_handover_boundary_or_mixes_label_sources():
    replay = LabelBuffer(LabelBufferConfig())
    replay.add([extract_labels(_segmented_labels(), episode_id="a", obs_keys=KEYS),
                extract_labels(_segmented_labels(), episode_id="b", obs_keys=KEYS)])
    idx, valid = replay.chunk_rows(4)
    a = replay.arrays()
    labelled = a["target"][:, 0]  # each row's label is its own step
    for row in range(len(labelled)):
        ahead = labelled[idx[row][valid[row]]]
        assert valid[row, 0] and ahead[0] == labelled[row]
        np.testing.assert_array_equal(ahead, labelled[row] + np.arange(len(ahead)))  # consecutive steps only
        same_episode = a["episode"][idx[row][valid[row]]] == a["episode"][row]
        assert same_episode.all()
    by_step = {int(s): valid[r].sum() for r, s in enumerate(labelled[: len(labelled) // 2])}
    assert by_step == {0: 4, 1: 4, 2: 4, 3: 3, 4: 2, 5: 1,  # the expert's segment ends where the person's begins
                       6: 3, 7: 2, 8: 1,  # the person's window ends where the labels stop
                       11: 4, 12: 3, 13: 2, 14: 1}  # and the last segment at the episode's end


def test_temporal_ensembling_weighs_what_each_prediction_said_about_the_step():
    from hg_dagger.policy.heads import CHUNK_DECAY, TemporalEnsemble

    te = TemporalEnsemble(num_envs=2, horizon=3, action_dim=1)
    first = te.step(np.array([[[1.0], [2.0], [3.0]], [[10.0], [20.0], [30.0]]], np.float32))
    np.testing.assert_allclose(first, [[1.0], [10.0]])  # one prediction so far: its first step
    second = te.step(np.array([[[5.0], [6.0], [7.0]], [[50.0], [60.0], [70.0]]], np.float32))
    w_old, w_new = np.exp(CHUNK_DECAY), 1.0  # the older prediction weighs a little more
    np.testing.assert_allclose(second[:, 0], [(2.0 * w_old + 5.0 * w_new) / (w_old + w_new),
                                              (20.0 * w_old + 50.0 * w_new) / (w_old + w_new)], rtol=1e-6)
    te.trust(np.array([1.0, 0.0, 0.0]))  # training never reached one step ahead: only the newest chunk counts
    np.testing.assert_allclose(te.weights, [1.0, 0.0, 0.0])
    te.trust(np.ones(3))
    te.forget([1])  # an episode begins in row 1: its memory is gone, row 0 keeps its own
    third = te.step(np.array([[[9.0], [9.0], [9.0]], [[7.0], [8.0], [9.0]]], np.float32))
    assert third[1, 0] == pytest.approx(7.0)
    w = np.exp(CHUNK_DECAY * np.arange(3))
    assert third[0, 0] == pytest.approx((9.0 * w[0] + 6.0 * w[1] + 3.0 * w[2]) / w.sum())


def test_a_chunk_student_learns_the_steps_ahead_and_forgets_a_row_when_its_episode_begins():
    data = _segmented_labels()
    data["label_mask"][:] = LabelMask.TRAINABLE.code
    data["label_target"][:] = LabelTarget.EXPERT_ACTION.code
    data["expert_action"] = np.where(np.arange(15)[:, None] < 8, 0.5, -0.5).astype(np.float32) * np.ones((15, 2))
    for k in KEYS:
        data[f"obs/{k}"] = data[f"obs/{k}"] / 15.0
    student = _trained("mlp_chunk", 2, data, steps=800)
    assert student.spec.kind == "mlp_chunk"
    obs = {k: data[f"obs/{k}"].astype(np.float32) for k in KEYS}
    import torch

    with torch.inference_mode():
        state, images = student.encode(obs)
        chunks = student.net.chunks(state, images).mean(0) * student.net.act_std + student.net.act_mean
    ahead = chunks.numpy()[4, :, 0]  # from step 4 (steps 4-13): +0.5 up to step 7, then the switch to -0.5
    assert (ahead[:3] > 0.3).all() and (ahead[5:] < -0.3).all()
    one, nxt = ({k: v[i : i + 1] for k, v in obs.items()} for i in (4, 5))
    alone = student.act(one).policy_action  # no rollout: the current step of the chunk
    np.testing.assert_allclose(alone[0], chunks.numpy()[4, 0], atol=1e-5)
    student.reset_rows([0], 1)  # an episode begins in the rollout's one row
    np.testing.assert_allclose(student.act(one).policy_action, alone, atol=1e-6)  # a fresh row: the same
    from hg_dagger.policy.heads import CHUNK_DECAY

    coverage = student.net.chunk_coverage.numpy()  # trained on one 15-step segment: 14 of 15 rows reach 1 ahead
    np.testing.assert_allclose(coverage, (15 - np.arange(10)) / 15, rtol=1e-6)
    w = np.exp(CHUNK_DECAY) * coverage[1]  # next step: what step 4's chunk said about it, beside step 5's own
    expected = (chunks.numpy()[4, 1] * w + chunks.numpy()[5, 0]) / (w + 1.0)
    np.testing.assert_allclose(student.act(nxt).policy_action[0], expected, atol=1e-5)
    student.reset_rows([0], 1)  # the next episode: step 4's chunk is forgotten
    np.testing.assert_allclose(student.act(nxt).policy_action[0], chunks.numpy()[5, 0], atol=1e-5)


def test_a_chunk_student_round_trips_and_is_refused_without_a_camera_as_cnn():
    data = _two_mode_labels(n=60)[0]
    student = _trained("mlp_chunk", 2, data, steps=20)
    obs = {k: data[f"obs/{k}"].astype(np.float32) for k in KEYS}
    mapping = load_mapping("toy_reach")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        student.save(Path(tmp) / "s.pt")
        back = Student.load(Path(tmp) / "s.pt", mapping)
    assert back.version == student.version and back.spec.kind == "mlp_chunk"
    np.testing.assert_array_equal(back.act(obs).action, student.act(obs).action)
    with pytest.raises(ConfigError, match="'cnn_chunk' needs a camera"):
        Student.create(mapping, kind="cnn_chunk")
