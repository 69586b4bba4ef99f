"""Student policy: batched acting in raw space, ensemble uncertainty, versions and checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.errors import ConfigError, ContractError
from hg_dagger.policy import Student, read_checkpoint

pytestmark = [pytest.mark.simulation]


@pytest.fixture
def mapping():
    return load_mapping("toy_reach")


def _task_variant(tmp_path, name: str, **changes) -> str:
    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_act_is_batched_raw_and_carries_uncertainty(mapping):
    env = make_env("toy_reach", num_envs=6, seed=1)
    obs, _ = env.reset(seed=1)
    student = Student.create(mapping, ensemble=4, seed=0)
    out = student.act(obs)
    assert out.action.shape == (6, 2) and out.action.dtype == np.float32
    assert out.uncertainty.shape == (6,) and out.confidence.shape == (6,)
    assert np.all(out.uncertainty > 0)  # independently initialized members disagree
    assert np.all((out.confidence > 0) & (out.confidence <= 1))
    assert out.inference_ns > 0
    assert np.array_equal(out.action, mapping.policy_to_raw(out.policy_action))
    env.step(out.action)  # a valid raw action for the env


def test_acting_reuses_no_output_and_matches_the_training_forward(mapping):
    """act's hidden layers write into kept buffers: what it returned before stays as it was, from this thread or
    another, and its members' predictions are the training forward's."""
    import threading

    student = Student.create(mapping, ensemble=3, seed=0)
    rng = np.random.default_rng(0)
    batches = [{k: rng.normal(0, 0.3, (5, *shape)).astype(dtype) for k, (shape, dtype) in mapping.obs_spec().items()}
               for _ in range(3)]
    first = student.act(batches[0])
    kept = (first.action.copy(), first.uncertainty.copy())
    other: list = []
    worker = threading.Thread(target=lambda: other.append(student.act(batches[1])))
    worker.start()
    worker.join()
    student.act(batches[2])
    assert np.array_equal(first.action, kept[0]) and np.array_equal(first.uncertainty, kept[1])
    assert np.array_equal(student.act(batches[1]).action, other[0].action)  # the same answer in either thread
    state, images = student.encode(batches[2])
    with torch.inference_mode():
        acting = student.net(state, images)
    training = student.net(state, images).detach()
    assert torch.allclose(acting, training, atol=1e-6)


def test_action_bounds_follow_the_mapping(tmp_path):
    # policy space x0.5: a saturated student output must land on half the raw range
    m = load_mapping(_task_variant(tmp_path, "half", policy={"low": [-1.0], "high": [1.0], "scale": [0.5], "offset": [0.0]}))
    student = Student.create(m, ensemble=2, seed=0)
    with torch.no_grad():
        student.net.act_mean.fill_(100.0)  # push every prediction far past the policy bounds
    out = student.act({"qpos": np.zeros((3, 2), np.float32), "ee_pos": np.zeros((3, 2), np.float32),
                       "target": np.zeros((3, 2), np.float32)})
    assert np.allclose(out.action, 0.5)


def test_single_member_has_zero_uncertainty_and_full_confidence(mapping):
    student = Student.create(mapping, ensemble=1)
    obs = make_env("toy_reach", num_envs=2, seed=0).reset(seed=0)[0]
    out = student.act(obs)
    assert np.all(out.uncertainty == 0) and np.all(out.confidence == 1)


def test_same_seed_same_weights_and_version(mapping):
    a, b, c = (Student.create(mapping, seed=s) for s in (3, 3, 4))
    assert a.version == b.version != c.version
    assert a.version.endswith("-r0")


def test_version_tracks_weights_and_round(mapping):
    s = Student.create(mapping, seed=0)
    v0 = s.version
    with torch.no_grad():
        s.net.head.layers[0].weight.add_(0.01)
    s.weights_changed()
    assert s.version != v0 and s.version.endswith("-r0")
    v1 = s.finish_round({"note": "test"})
    assert v1.endswith("-r1") and s.lineage[-1]["parent_version"] != v1


def test_checkpoint_roundtrip_keeps_everything(tmp_path, mapping):
    s = Student.create(mapping, ensemble=3, seed=5, hidden=(32, 16))
    s.set_normalization(np.random.default_rng(0).normal(size=(100, mapping.flat_dim)), np.zeros((100, 2)) + 0.3)
    s.finish_round({"labels": 100})
    path = tmp_path / "s.pt"
    s.save(path)
    loaded = Student.load(path, mapping)
    assert loaded.version == s.version and loaded.round == 1
    assert loaded.lineage == s.lineage and loaded.spec == s.spec
    obs = make_env("toy_reach", num_envs=4, seed=2).reset(seed=2)[0]
    np.testing.assert_array_equal(loaded.act(obs).action, s.act(obs).action)
    data = read_checkpoint(path)
    assert data["mapping"] == {"task_id": "toy_reach", "hash": mapping.hash}


def test_loading_under_another_mapping_fails_clearly(tmp_path, mapping):
    path = tmp_path / "s.pt"
    Student.create(mapping).save(path)
    other = load_mapping(_task_variant(tmp_path, "longer", horizon=200))
    with pytest.raises(ContractError) as err:
        Student.load(path, other)
    msg = str(err.value)
    assert str(path) in msg and mapping.hash in msg and other.hash in msg


def test_bad_checkpoint_files_are_reported(tmp_path, mapping):
    with pytest.raises(ConfigError, match="no such checkpoint"):
        Student.load(tmp_path / "missing.pt", mapping)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="junk.pt"):
        Student.load(junk, mapping)
    torch.save({"kind": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="not a student checkpoint"):
        Student.load(tmp_path / "other.pt", mapping)


def test_tampered_weights_are_detected(tmp_path, mapping):
    path = tmp_path / "s.pt"
    Student.create(mapping).save(path)
    data = torch.load(path, weights_only=True)
    data["state_dict"]["head.layers.0.bias"] += 1.0
    torch.save(data, path)
    with pytest.raises(ContractError, match="corrupt"):
        Student.load(path, mapping)


def test_unknown_kind_and_cnn_without_camera_are_config_errors(mapping):
    with pytest.raises(ConfigError, match="unknown"):
        Student.create(mapping, kind="transformer")
    with pytest.raises(ConfigError, match="camera"):
        Student.create(mapping, kind="cnn")


def test_cnn_student_uses_the_camera(tmp_path):
    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    data["observation"].append({"name": "rgb", "shape": [32, 32, 3], "dtype": "uint8"})
    path = tmp_path / "cam.yaml"
    path.write_text(yaml.safe_dump(data))
    m = load_mapping(str(path))
    s = Student.create(m, kind="cnn", ensemble=3, seed=0, hidden=(32,))
    rng = np.random.default_rng(0)
    obs = {"qpos": np.zeros((2, 2), np.float32), "ee_pos": np.zeros((2, 2), np.float32),
           "target": np.zeros((2, 2), np.float32), "rgb": rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8)}
    out = s.act(obs)
    assert out.action.shape == (2, 2)
    # identical state, different images -> different actions: the encoder is in the path
    assert not np.allclose(out.action[0], out.action[1])
    s.save(tmp_path / "cnn.pt")
    np.testing.assert_array_equal(Student.load(tmp_path / "cnn.pt", m).act(obs).action, out.action)


def test_cnn_student_on_the_fetch_camera_task():
    m = load_mapping("fetch_pick_place_rgb")
    s = Student.create(m, kind="cnn", ensemble=2, hidden=(32,))
    assert s.spec.image_keys == ("rgb",) and s.spec.image_shape == (128, 128, 3)
    rng = np.random.default_rng(1)
    obs = {k: (rng.integers(0, 255, (3, *shape), dtype=np.uint8) if dtype == "uint8"
               else rng.normal(size=(3, *shape)).astype(dtype)) for k, (shape, dtype) in m.obs_spec().items()}
    out = s.act(obs)
    assert out.action.shape == (3, 4) and np.all(np.abs(out.action) <= 1)
    assert Student.create(m, kind="mlp").spec.image_keys == ()  # a state student ignores the camera
