"""Task mappings: shipped files validate, bad files fail naming file and key, conversions agree."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from hg_dagger import config
from hg_dagger.envs import known_tasks, load_mapping
from hg_dagger.envs.mapping import TASKS_DIR, TaskMapping
from hg_dagger.errors import ConfigError, EnvError

pytestmark = [pytest.mark.simulation]

SHIPPED = known_tasks()


def _toy_data() -> dict:
    return yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())


def _write(tmp_path, data, name="bad_task.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("task", SHIPPED)
def test_every_shipped_task_validates_by_kind(task):
    model = config.check(TASKS_DIR / f"{task}.yaml")
    assert isinstance(model, TaskMapping) and model.task_id == task
    assert abs(model.dt * model.control_hz - 1) < 1e-9


def test_expected_tasks_are_shipped():
    expected = {"toy_reach", "fetch_reach", "fetch_push", "fetch_pick_place", "fetch_pick_place_rgb",
                "mw_reach", "mw_push", "mw_pick_place", "mw_drawer_open"}
    assert expected <= set(SHIPPED), expected - set(SHIPPED)


def test_unknown_task_lists_known_ones():
    with pytest.raises(EnvError) as e:
        load_mapping("no_such_task")
    assert "no_such_task" in str(e.value) and "toy_reach" in str(e.value)


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda d: d["action"].update(low=[-1.0]), "action"),
        (lambda d: d.update(step_dt=0.05), "step_dt"),
        (lambda d: d["human"].update(axes=["x", "warp"]), "human.axes"),
        (lambda d: d["human"].update(axes=["x"]), "human.axes"),
        (lambda d: d["joints"].update(names=["a", "b", "c"]), "joints.names"),
        (lambda d: d["observation"][0].update(dtype="floaty"), "observation.0.dtype"),
        (lambda d: d["observation"][0]["normalize"].update(std=[0.0]), "observation.0.normalize.std"),
        (lambda d: d["policy"].update(scale=[0.0]), "policy.scale"),
        (lambda d: d.update(horizon=0), "horizon"),
        (lambda d: d.update(backend="pybullet"), "backend"),
        (lambda d: d.update(surprise=1), "surprise"),
    ],
)
def test_bad_mapping_names_file_and_key(tmp_path, edit, key):
    data = _toy_data()
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_mapping(path)
    msg = str(e.value)
    assert str(path) in msg and key in msg, msg


def test_hash_is_stable_and_tracks_content(tmp_path):
    a = load_mapping("toy_reach")
    assert a.hash == load_mapping("toy_reach").hash
    data = _toy_data()
    data["horizon"] = 101
    assert load_mapping(_write(tmp_path, data, "t.yaml")).hash != a.hash


def test_metadata_round_trip_and_tamper_refused():
    m = load_mapping("toy_reach")
    meta = m.as_metadata()
    assert meta["hash"] == m.hash and meta["task_id"] == "toy_reach"
    back = TaskMapping.from_metadata(meta)
    assert back.model_dump() == m.model_dump() and back.hash == m.hash
    meta["horizon"] = 7
    with pytest.raises(ConfigError, match="hash"):
        TaskMapping.from_metadata(meta)


def test_flatten_obs_orders_and_normalizes():
    m = load_mapping("toy_reach")
    obs = {
        "target": np.array([[5.0, 6.0]], np.float32),
        "qpos": np.array([[np.pi, -np.pi / 2]], np.float32),
        "ee_pos": np.array([[3.0, 4.0]], np.float32),
    }
    flat = m.flatten_obs(obs)
    assert flat.dtype == np.float32 and flat.shape == (1, m.flat_dim) == (1, 6)
    np.testing.assert_allclose(flat[0], [np.pi / 3.1416, -np.pi / 2 / 3.1416, 3, 4, 5, 6], rtol=1e-5)


def test_obs_spec_matches_declared_keys():
    m = load_mapping("toy_reach")
    assert m.obs_spec() == {"qpos": ((2,), "float32"), "ee_pos": ((2,), "float32"), "target": ((2,), "float32")}


def _scaled_mapping(tmp_path) -> TaskMapping:
    data = _toy_data()
    data["action"].update(low=[-2.0, -0.5], high=[2.0, 0.5])
    data["policy"] = {"low": [-1.0], "high": [1.0], "scale": [2.0, 0.5], "offset": [0.0, 0.0]}
    data["expert"] = {"scale": [0.1], "offset": [0.0]}
    data["human"] = {"axes": ["z", "gripper"], "scale": [2.0, -0.5]}
    return load_mapping(_write(tmp_path, data, "scaled.yaml"))


def test_every_source_lands_in_the_raw_bounds(tmp_path):
    m = _scaled_mapping(tmp_path)
    big = np.full((3, 2), 100.0, np.float32)
    lo, hi = np.array([-2.0, -0.5]), np.array([2.0, 0.5])
    for raw in (m.policy_to_raw(big), m.expert_to_raw(big), m.human_to_raw(np.full((3, 7), 100.0)), m.clip_raw(-big)):
        assert raw.dtype == np.float32
        assert np.all(raw >= lo) and np.all(raw <= hi)
    np.testing.assert_allclose(m.expert_to_raw(np.array([[3.0, -2.0]])), [[0.3, -0.2]], rtol=1e-6)


def test_conversions_invert(tmp_path):
    m = _scaled_mapping(tmp_path)
    rng = np.random.default_rng(0)
    p = rng.uniform(-1, 1, (16, 2)).astype(np.float32)
    np.testing.assert_allclose(m.raw_to_policy(m.policy_to_raw(p)), p, atol=1e-6)
    raw = rng.uniform([-2, -0.5], [2, 0.5], (16, 2)).astype(np.float32)
    motion = m.raw_to_human(raw)
    assert motion.shape == (16, 7) and np.all(motion[:, [0, 1, 3, 4, 5]] == 0)
    np.testing.assert_allclose(m.human_to_raw(motion), raw, atol=1e-6)
    # a single command (no batch dim) works too
    np.testing.assert_allclose(m.human_to_raw(motion[0]), raw[0], atol=1e-6)


def test_human_command_of_wrong_width_refused():
    with pytest.raises(EnvError, match="last dim 6"):
        load_mapping("toy_reach").human_to_raw(np.zeros((2, 6)))


def test_copy_revalidates_and_refreshes_derived_values():
    m = load_mapping("toy_reach")
    h, _ = m.hash, m.flatten_obs  # derived values computed before the copy
    c = m.model_copy(update={"action": {**m.action.model_dump(), "low": [-0.5, -0.5]}})
    assert c.hash != h
    np.testing.assert_array_equal(c.clip_raw(np.full((1, 2), -9.0)), [[-0.5, -0.5]])
    with pytest.raises(ConfigError, match="horizon"):
        m.model_copy(update={"horizon": -1})


@pytest.mark.parametrize("task", SHIPPED)
def test_mapping_fits_episode_metadata(task):
    from hg_dagger.contract import CollectionMode, EpisodeStart, TaskInfo

    m = load_mapping(task)
    start = EpisodeStart(
        task=TaskInfo(task_id=m.task_id, task_version=m.task_version), mode=CollectionMode.HUMAN_GATED,
        control_hz=m.control_hz, action_alignment=m.action_alignment, mapping=m.as_metadata(), mapping_hash=m.hash,
    )
    back = EpisodeStart.model_validate_json(start.model_dump_json())
    assert TaskMapping.from_metadata(back.mapping).hash == back.mapping_hash == m.hash
