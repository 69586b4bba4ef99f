"""PolicyExpert (a student checkpoint as the expert) and the BC-only DemoAdapter."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from hg_dagger.contract import EpisodeEnd, EpisodeStart, TaskInfo, step_fields
from hg_dagger.contract.enums import CollectionMode, EndReason
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.errors import ConfigError, ContractError
from hg_dagger.experts import Demo, DemoAdapter, PolicyExpert, make_expert, query_expert, require_relabeler
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.simulation]

# ------------------------------------------------------------------------------------ PolicyExpert


@pytest.fixture
def checkpoint(tmp_path):
    mapping = load_mapping("toy_reach")
    student = Student.create(mapping, ensemble=3, seed=4)
    path = tmp_path / "expert.pt"
    student.save(path)
    return path, student


def test_policy_expert_labels_like_the_student_in_one_forward_pass(checkpoint):
    path, student = checkpoint
    env = make_env("toy_reach", num_envs=5, seed=2)
    obs, _ = env.reset(seed=2)
    expert = make_expert("toy_reach", kind="policy", checkpoint=path, mapping=env.mapping)
    assert isinstance(expert, PolicyExpert) and expert.output_space == "policy"
    calls = []
    hook = expert.student.net.head.register_forward_hook(lambda mod, args, out: calls.append(tuple(out.shape)))
    q = query_expert(expert, obs, np.arange(5), env.mapping)
    hook.remove()
    assert calls == [(3, 5, 2)]  # the whole batch in one forward pass of the network (3 members, 5 rows, 2 dims)
    out = student.act(obs)
    # its labels reach raw space through the same policy_to_raw as the learner's own actions
    np.testing.assert_allclose(q.action, out.action, atol=1e-6)
    np.testing.assert_allclose(q.confidence, out.confidence, atol=1e-6)
    assert q.valid.all() and q.metadata["policy_version"] == student.version
    env.step(q.action)


def test_policy_expert_refuses_a_checkpoint_of_another_mapping(checkpoint, tmp_path):
    path, _ = checkpoint
    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    data["horizon"] = 50
    other = tmp_path / "toy_reach_short.yaml"
    other.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match="mapping hash"):
        PolicyExpert.from_checkpoint(path, load_mapping(other))
    with pytest.raises(ConfigError, match="no such checkpoint"):
        make_expert("toy_reach", kind="policy", checkpoint=tmp_path / "missing.pt")
    with pytest.raises(ConfigError, match="needs a checkpoint"):
        make_expert("toy_reach", kind="policy")


# ------------------------------------------------------------------------------------ DemoAdapter


def record_demo(task: str, seed: int, steps: int | None = None) -> Demo:
    """Roll the planner out from reset(seed) and keep its actions and the observations before them."""
    env = make_env(task, num_envs=1, seed=seed)
    expert = make_expert(task, mapping=env.mapping)
    obs, _ = env.reset(seed=seed)
    seen, actions = [], []
    for _ in range(steps or env.mapping.horizon):
        q = query_expert(expert, obs, [0], env.mapping)
        seen.append({k: v[0].copy() for k, v in obs.items()})
        actions.append(q.action[0])
        res = env.step(q.action)
        if res.terminated[0] or res.truncated[0]:
            break
        obs = res.obs
    env.close()
    return Demo(actions=np.stack(actions), obs={k: np.stack([o[k] for o in seen]) for k in seen[0]}, seed=seed)


def test_demo_replays_open_loop_and_reproduces_its_success_on_mujoco():
    demo = record_demo("fetch_pick_place", seed=21)
    adapter = DemoAdapter([demo])
    env = make_env("fetch_pick_place", num_envs=1, seed=21)
    obs, info = env.reset(seed=adapter.seeds[0])
    adapter.reset([0], obs, info)
    for t in range(len(demo.actions)):
        q = query_expert(adapter, obs, [0], env.mapping)
        assert q.valid[0], q.invalid_reason
        assert q.metadata["demo_step"][0] == t
        res = env.step(q.action)
        obs = res.obs
    assert res.truncated[0] and res.success[0]
    env.close()


def test_demo_refuses_to_label_a_state_the_learner_visited():
    demo = record_demo("toy_reach", seed=5, steps=30)
    adapter = DemoAdapter([demo])
    env = make_env("toy_reach", num_envs=1, seed=5)
    obs, info = env.reset(seed=5)
    adapter.reset([0], obs, info)
    for _ in range(10):
        obs = env.step(query_expert(adapter, obs, [0], env.mapping).action).obs
    learner_action = -query_expert(adapter, obs, [0], env.mapping).action  # the learner goes elsewhere
    obs = env.step(learner_action).obs
    q = query_expert(adapter, obs, [0], env.mapping)
    assert not q.valid[0]
    assert "never relabel learner-visited states" in q.invalid_reason[0]


def test_demo_adapter_is_bc_only_and_rows_without_a_demo_are_invalid():
    demo = record_demo("toy_reach", seed=5, steps=20)
    adapter = make_expert("toy_reach", kind="demo", demos=[demo])
    assert adapter.bc_only and adapter.collection_mode is CollectionMode.EXPERT_DEMO
    with pytest.raises(ContractError, match="BC-only"):
        require_relabeler(adapter)
    require_relabeler(make_expert("toy_reach"))  # a planner relabels
    start = EpisodeStart(task=TaskInfo(task_id="toy_reach"), control_hz=25, **adapter.episode_start_fields())
    assert start.bc_only and start.mode is CollectionMode.EXPERT_DEMO
    env = make_env("toy_reach", num_envs=2, seed=5)
    obs, info = env.reset(seed=5)  # row 0 starts where the demo starts, row 1 does not
    adapter.reset([0, 1], obs, info)
    q = query_expert(adapter, obs, [0, 1], env.mapping)
    np.testing.assert_array_equal(q.valid, [True, False])
    assert "no demo starts" in q.invalid_reason[1]


def test_demos_load_from_recorded_expert_demo_episodes(tmp_path):
    demo = record_demo("toy_reach", seed=8, steps=40)
    mapping = load_mapping("toy_reach")
    store = EpisodeStore.create(tmp_path / "store")
    rec = store.recorder(flush_interval_s=0.05)
    start = EpisodeStart(task=TaskInfo(task_id="toy_reach"), control_hz=25, mode=CollectionMode.EXPERT_DEMO,
                         bc_only=True, initial_state={"seed": 8}, mapping=mapping.as_metadata())
    eid = rec.begin_episode(start, step_fields(mapping.obs_spec(), mapping.action_dim))
    for t in range(len(demo.actions)):
        rec.put(eid, {"applied_action": demo.actions[t], **{f"obs/{k}": v[t] for k, v in demo.obs.items()}})
    rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.TIMEOUT, task_success=False, num_steps=len(demo.actions)))
    rec.close()

    adapter = DemoAdapter.from_store(EpisodeStore.open(tmp_path / "store", mode="r"))
    assert adapter.seeds == [8]
    env = make_env("toy_reach", num_envs=1, seed=8)
    obs, info = env.reset(seed=adapter.seeds[0])
    adapter.reset([0], obs, info)
    for t in range(len(demo.actions)):
        q = query_expert(adapter, obs, [0], env.mapping)
        assert q.valid[0], q.invalid_reason
        np.testing.assert_allclose(q.action[0], demo.actions[t])
        obs = env.step(q.action).obs
