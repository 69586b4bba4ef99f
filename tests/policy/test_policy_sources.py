"""Policy specs and the wire: which source a spec opens, openpi's msgpack-numpy maps, the export's observation
names, and the check of a policy's declared features against a task."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from hg_dagger.errors import ConfigError
from hg_dagger.policy import POLICIES, PolicyOptions, open_policy, policy_source
from hg_dagger.policy.features import check_features, from_wire, task_features, wire_obs
from hg_dagger.policy.lerobot_served import lerobot_metadata
from hg_dagger.policy.sources import source_name
from hg_dagger.policy.wire import packb, unpackb
from hg_dagger.registry import RegistryError


def test_specs_pick_their_source(tmp_path):
    assert POLICIES.names() == ["lerobot", "student", "ws"]
    assert source_name("runs/a/student.pt") == "student"
    assert source_name("ws://gpu-box:8000") == "ws" and source_name("wss://gpu-box:8443") == "ws"
    assert source_name("lerobot:outputs/act/pretrained_model") == "lerobot"
    odd = tmp_path / "a:b.pt"  # a file whose name looks like a scheme is a file
    odd.write_bytes(b"")
    assert source_name(str(odd)) == "student"
    assert not policy_source("x.pt").remote and policy_source("ws://h:1").remote
    with pytest.raises(RegistryError) as err:
        policy_source("http://gpu-box:8000")
    msg = str(err.value)
    assert "'http'" in msg and "lerobot, student, ws" in msg and "\n" not in msg


def test_a_lerobot_folder_is_named_for_what_it_is(tmp_path, mapping):
    folder = tmp_path / "pretrained_model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"type": "act"}))
    with pytest.raises(ConfigError, match=f"--policy lerobot:{folder}"):  # given as a student checkpoint
        open_policy(str(folder), mapping)
    with pytest.raises(ConfigError, match="--policy-python"):  # no Python of LeRobot's to serve it from
        open_policy(f"lerobot:{folder}", mapping, PolicyOptions())
    with pytest.raises(ConfigError, match="did you mean lerobot:"):  # the run folder, not its pretrained_model
        open_policy(f"lerobot:{tmp_path}", mapping, PolicyOptions(python="/nowhere/python"))
    with pytest.raises(ConfigError, match="no such folder"):
        open_policy(f"lerobot:{tmp_path / 'missing'}", mapping, PolicyOptions(python="/nowhere/python"))


def test_the_wire_is_openpi_msgpack_numpy():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    # what openpi_client.msgpack_numpy writes: bytes keys, dtype.str, the shape as a list
    theirs = msgpack.packb({"actions": {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str,
                                        b"shape": [3, 4]},
                            "step": {b"__npgeneric__": True, b"data": 7, b"dtype": np.dtype(np.int64).str},
                            "prompt": "pick"}, use_bin_type=True)
    got = unpackb(theirs)
    np.testing.assert_array_equal(got["actions"], arr)
    assert got["actions"].dtype == np.float32 and got["step"] == np.int64(7) and got["prompt"] == "pick"
    raw = msgpack.unpackb(packb({"obs": np.ones((2, 2), np.uint8), "t": np.float32(0.5)}), raw=False)
    assert raw["obs"][b"__ndarray__"] is True and raw["obs"][b"dtype"] == "|u1" and raw["obs"][b"shape"] == [2, 2]
    assert raw["t"][b"__npgeneric__"] is True and raw["t"][b"data"] == 0.5
    with pytest.raises(TypeError, match="dtype object"):
        packb({"x": np.array([object()])})


def test_observations_go_out_under_the_export_names(mapping):
    feats = task_features(mapping)
    assert list(feats)[:2] == ["observation.state", "observation.environment_state"]
    assert feats["observation.state"].shape == (6,) and feats["observation.environment_state"].shape == (2,)
    rng = np.random.default_rng(0)
    obs = {k: rng.normal(size=(3, *shape)).astype(dtype) for k, (shape, dtype) in mapping.obs_spec().items()}
    out = wire_obs(obs, feats, ["observation.state", "observation.environment_state"], [2, 0])
    # raw, in flatten order: qpos (not normalized by the mapping, as the export writes it), ee_pos, target
    np.testing.assert_array_equal(out["observation.state"][0], np.concatenate([obs["qpos"][2], obs["ee_pos"][2],
                                                                               obs["target"][2]]))
    np.testing.assert_array_equal(out["observation.environment_state"][1], obs["target"][0])
    back, batched = from_wire({"observation.state": out["observation.state"]}, mapping)
    assert batched and all(np.array_equal(back[k], obs[k][[2, 0]]) for k in obs)


def test_declared_features_are_checked_against_the_task(mapping):
    where = "policy server ws://h:1"
    assert check_features({}, mapping, where=where) == ["observation.state", "observation.environment_state"]
    ok = {"input_features": {"observation.state": {"shape": [6]}, "task": {}}, "action_dim": 2}
    assert check_features(ok, mapping, where=where) == ["observation.state"]
    for meta, words in (
        ({"input_features": {"observation.images.wrist": {"shape": [3, 64, 64]}}},
         ["observation.images.wrist", "toy_reach", "observation.state float32[6]"]),
        ({"input_features": {"observation.state": {"shape": [7]}}}, ["observation.state", "[7]", "[6]"]),
        ({"output_features": {"action": {"shape": [4]}}}, ["4 action dimensions", "has 2"]),
    ):
        with pytest.raises(ConfigError) as err:
            check_features(meta, mapping, where=where)
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(where) and all(w in msg for w in words), msg


def test_lerobot_metadata_comes_from_its_config_alone(tmp_path, mapping):
    folder = tmp_path / "pretrained_model"
    folder.mkdir()
    cfg = {"type": "act", "n_action_steps": 8, "chunk_size": 8,
           "input_features": {"observation.state": {"type": "STATE", "shape": [6]},
                              "observation.environment_state": {"type": "ENV", "shape": [2]}},
           "output_features": {"action": {"type": "ACTION", "shape": [2]}}}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").write_bytes(b"weights")
    meta = lerobot_metadata(folder)
    assert meta["policy_version"].startswith("act-") and meta["n_action_steps"] == 8 and meta["action_dim"] == 2
    assert check_features(meta, mapping, where="x") == ["observation.state", "observation.environment_state"]
    cfg["input_features"]["observation.images.rgb"] = {"type": "VISUAL", "shape": [3, 64, 48]}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert lerobot_metadata(folder)["input_features"]["observation.images.rgb"] == {"shape": [64, 48, 3],
                                                                                    "dtype": "uint8"}
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert lerobot_metadata(folder)["policy_version"] != meta["policy_version"]


def test_a_served_camera_student_reads_its_camera_under_the_export_name():
    from hg_dagger.envs import load_mapping
    from hg_dagger.policy import Student
    from hg_dagger.policy.server import StudentServed

    m = load_mapping("fetch_pick_place_rgb")
    student = Student.create(m, kind="cnn", ensemble=2, seed=0)
    served = StudentServed(student)
    names = check_features(served.metadata(), m, where="x")
    assert names == ["observation.state", "observation.images.rgb"]
    rng = np.random.default_rng(0)
    obs = {k: rng.integers(0, 255, size=(2, *shape)).astype(dtype) if dtype == "uint8"
           else rng.normal(size=(2, *shape)).astype(dtype) for k, (shape, dtype) in m.obs_spec().items()}
    msg = {**wire_obs(obs, task_features(m), names, [0, 1]), "task": "pick"}
    np.testing.assert_array_equal(served.infer(msg)["actions"][:, 0], student.act(obs).action)
    one = served.infer({k: v[1] for k, v in msg.items() if k != "task"})  # one observation, no batch dimension
    np.testing.assert_allclose(one["actions"][0], student.act(obs).action[1], rtol=0, atol=1e-6)  # batch of 1
