"""Promotion for a round trained from the app: a worse new student does not take over, the decision names both
held-out figures and is written into the new checkpoint's lineage."""

from __future__ import annotations

import pytest

from hg_dagger.learn.promotion import PromotionConfig, promotion_line
from hg_dagger.learn.round_promotion import judge_checkpoint
from hg_dagger.learn.rounds import bootstrap_student
from hg_dagger.policy.checkpoint import read_checkpoint


def quiet(*_):
    pass


@pytest.mark.slow
def test_a_worse_student_is_kept_out_and_a_better_one_takes_over(tmp_path):
    # a student trained on 30 demonstrations against one that saw one demonstration for 3 gradient steps
    good = bootstrap_student(task="toy_reach", store=str(tmp_path / "a.zarr"), out_dir=str(tmp_path / "good"),
                             demos=30, steps=3000, report=quiet)
    bad = bootstrap_student(task="toy_reach", store=str(tmp_path / "b.zarr"), out_dir=str(tmp_path / "bad"),
                            demos=1, steps=3, report=quiet)
    cfg = PromotionConfig(episodes=20, num_envs=4)
    stages = []

    d = judge_checkpoint(bad["checkpoint"], good["checkpoint"], "toy_reach", cfg, lambda s, f: stages.append(s))
    assert not d["promoted"], d
    assert d["acting_version"] == good["version"] and d["candidate_version"] == bad["version"]
    assert d["incumbent_success"] > d["candidate_success"] and d["episodes"] == 20
    assert "held-out evaluation: the acting student" in stages and "held-out evaluation: the new student" in stages
    line = promotion_line(d)
    assert line.startswith(f"kept student {good['version']}") and "new against" in line and "/20" in line
    recorded = read_checkpoint(bad["checkpoint"])["lineage"][-1]["info"]["promotion"]
    assert recorded["promoted"] is False and recorded["incumbent_version"] == good["version"]

    d = judge_checkpoint(good["checkpoint"], bad["checkpoint"], "toy_reach", cfg, quiet)
    assert d["promoted"] and d["acting_version"] == good["version"]
    assert promotion_line(d).startswith(f"new student {good['version']} takes over")


def test_the_first_trained_student_takes_over_without_an_evaluation(tmp_path):
    first = bootstrap_student(task="toy_reach", store=str(tmp_path / "a.zarr"), out_dir=str(tmp_path / "first"),
                              demos=1, steps=3, report=quiet)
    stages = []
    d = judge_checkpoint(first["checkpoint"], None, "toy_reach", PromotionConfig(episodes=5),
                         lambda s, f: stages.append(s))
    assert d["promoted"] and d["acting_version"] == first["version"] and stages == []
    assert promotion_line(d) == f"new student {first['version']} takes over (no student acted before)"
    assert read_checkpoint(first["checkpoint"])["lineage"][-1]["info"]["promotion"]["promoted"] is True
