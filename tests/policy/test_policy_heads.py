"""The mixture-density (GMM) student head: it keeps one mode where the MSE head averages two, reports its
members' spread to the confidence gate, and is selected, saved and loaded as a student kind."""

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
