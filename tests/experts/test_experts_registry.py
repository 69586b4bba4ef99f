"""Planners come from the expert registry, found by a task's backend or its task id - not by the id's prefix: a
Fetch task of the user's under any id gets the Fetch planner, a record for a task id wins over its backend's, and
a task no planner labels (a Gymnasium env) is one line pointing at the policy expert."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hg_dagger.envs import known_tasks, load_mapping
from hg_dagger.envs.mapping import TASKS_DIR
from hg_dagger.errors import ConfigError
from hg_dagger.experts import EXPERTS, ExpertSpec, make_expert, planner_spec, planner_tasks
from hg_dagger.experts.fetch import FetchPlanner
from hg_dagger.experts.metaworld import MetaWorldExpert
from hg_dagger.experts.toy import ToyIKExpert


def _copy(tmp_path: Path, src: str, task_id: str, **options) -> Path:
    data = yaml.safe_load((TASKS_DIR / f"{src}.yaml").read_text())
    data["task_id"] = task_id
    data["backend_options"].update(options)
    path = tmp_path / f"{task_id}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_every_shipped_task_but_the_gymnasium_examples_has_its_planner():
    expected = {"toy_reach": "toy_ik", **{t: "fetch_planner" for t in known_tasks() if t.startswith("fetch_")},
                **{t: "metaworld_scripted" for t in known_tasks() if t.startswith("mw_")}}
    assert {t: planner_spec(load_mapping(t))[0] for t in expected} == expected
    assert set(planner_tasks()) >= set(expected)
    assert not {"gym_pusher", "gym_adroit_door"} & set(planner_tasks())
    assert type(make_expert("toy_reach")) is ToyIKExpert
    assert make_expert("mw_drawer_open").env_name == "drawer-open-v3"
    assert isinstance(make_expert("mw_push"), MetaWorldExpert)


def test_a_fetch_task_of_the_users_gets_the_fetch_planner_by_its_backend_not_its_name(tmp_path):
    mapping = load_mapping(_copy(tmp_path, "fetch_push", "my_block_pusher"))
    expert = make_expert(mapping.task_id, mapping=mapping)
    assert isinstance(expert, FetchPlanner) and expert.task == "push"  # from gym_id FetchPush-v4
    odd = load_mapping(_copy(tmp_path, "fetch_push", "my_slide", gym_id="FetchSlide-v4"))
    assert planner_spec(odd) is None  # the Fetch planner knows reach, push and pick-and-place only


def test_a_planner_registered_for_a_task_id_wins_over_its_backends(tmp_path):
    twin = load_mapping(_copy(tmp_path, "toy_reach", "toy_twin"))

    class Twin(ToyIKExpert):
        pass

    EXPERTS.register("test_twin_planner", ExpertSpec(lambda m: Twin(m), backend="toy", tasks=("toy_twin",)),
                     replace=True)
    assert planner_spec(twin)[0] == "test_twin_planner" and type(make_expert("toy_twin", mapping=twin)) is Twin
    assert planner_spec(load_mapping("toy_reach"))[0] == "toy_ik"  # the backend's planner for every other task


def test_a_task_without_a_planner_is_one_line_that_points_at_the_policy_expert():
    with pytest.raises(ConfigError) as err:
        make_expert("gym_pusher")
    msg = str(err.value)
    assert "\n" not in msg and "no planner expert for task 'gym_pusher' (backend gymnasium)" in msg
    assert "backend fetch (fetch_planner)" in msg and "expert_checkpoint" in msg and "hg_dagger.experts" in msg
    with pytest.raises(ConfigError, match="no planner expert for task 'cartpole': no such task"):
        make_expert("cartpole")
