"""Promotion, not replacement: the held-out rule, and a refused candidate leaving the acting student in place."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.auto import small_student
from support.labels import toy_replay

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.learn.evaluate import EvalConfig, closed_loop
from hg_dagger.learn.promotion import Promoter, decide, worse_by
from hg_dagger.learn.train import TrainConfig, Trainer


def test_the_noise_of_both_evaluations_sets_how_much_worse_is_worse():
    assert worse_by((43, 50), (48, 50)) == pytest.approx(0.1 / math.sqrt(0.91 * 0.09 * 2 / 50))
    assert worse_by((48, 50), (43, 50)) < 0  # ahead
    assert worse_by((50, 50), (50, 50)) == 0.0 == worse_by((0, 20), (0, 20))  # nothing varies
    with pytest.raises(ValueError, match="at least one episode"):
        worse_by((0, 0), (1, 2))
    with pytest.raises(ValueError, match="outside"):
        worse_by((51, 50), (1, 2))


def test_a_candidate_worse_beyond_the_noise_is_refused_and_within_it_promoted():
    # the falls: 96% -> 86% and 96% -> 84% on 50 episodes are beyond the noise, 96% -> 92% is not
    assert decide((43, 50), (48, 50))["promoted"] is False
    assert decide((42, 50), (48, 50))["promoted"] is False
    assert decide((46, 50), (48, 50))["promoted"] is True
    assert decide((12, 50), None)["promoted"] is True  # nobody acted before
    # the same fall on fewer episodes is within the noise
    assert decide((26, 30), (29, 30))["promoted"] is True
    assert decide((20, 30), (29, 30))["promoted"] is False
    assert decide((43, 50), (48, 50), confidence=0.99)["promoted"] is True  # a stricter test refuses less
    d = decide((43, 50), (48, 50))
    assert d["candidate_success"] == 0.86 and d["incumbent_success"] == 0.96 and "beyond" in d["reason"]


def test_a_refused_candidate_gives_way_to_the_acting_student_and_lineage_records_both():
    student = small_student(seed=3)
    trainer = Trainer(student, TrainConfig(steps=20, batch_size=16, warm_start=False),
                      toy_replay(200, 0, episode_id="e0"))
    figures: dict[str, float] = {}  # held-out success per version: what the held-out evaluation would report

    def evaluate(s):
        return {"episodes": 50, "success_rate": figures[s.version]}

    promoter = Promoter(evaluate)
    promoter.before_fit(student)  # a fresh student: nobody to defend
    trainer.fit(progress=False)
    figures[student.version] = 0.96
    first = promoter.judge(student, {"round": 0})
    assert first["promoted"] and first["incumbent_success"] is None
    acting = student.version
    acting_weights = {k: v.clone() for k, v in student.net.state_dict().items()}

    promoter.before_fit(student)
    trainer.fit(progress=False)
    candidate = student.version
    assert candidate != acting
    figures[candidate] = 0.86
    d = promoter.judge(student, {"round": 1})
    assert not d["promoted"] and d["candidate_success"] == 0.86 and d["incumbent_success"] == 0.96
    assert d["candidate_version"] == candidate and d["acting_version"] == acting
    assert student.version == acting  # the acting student's weights are back, in place
    assert all(np.array_equal(v.numpy(), acting_weights[k].numpy()) for k, v in student.net.state_dict().items())
    assert [e["version"] for e in student.lineage] == [acting, candidate]
    assert student.lineage[0]["info"]["promotion"]["promoted"] is True
    assert student.lineage[1]["info"]["promotion"]["promoted"] is False
    assert len(trainer.replay) == 200  # the round's labels stay

    trainer.replay = toy_replay(300, 1, episode_id="e1")  # the next round: more labels, a candidate within the noise
    promoter.before_fit(student)
    trainer.fit(progress=False)
    figures[student.version] = 0.94
    d = promoter.judge(student, {"round": 2})
    assert d["promoted"] and d["incumbent_version"] == acting and student.version == d["candidate_version"]
    assert student.lineage[-1]["info"]["promotion"]["incumbent_success"] == 0.96


def test_the_promoter_evaluates_on_real_rollouts_and_each_version_once():
    mapping = load_mapping("toy_reach")
    student = small_student(seed=5)
    trainer = Trainer(student, TrainConfig(steps=10, batch_size=16), toy_replay(100, 2, episode_id="e2"))
    calls: list[str] = []
    with make_env(mapping, num_envs=4, seed=0) as env:
        held = EvalConfig(episodes=8, num_envs=4, seed=200_000)

        def evaluate(s):
            calls.append(s.version)
            return closed_loop(s, env, held)

        promoter = Promoter(evaluate)
        trainer.fit(progress=False)
        promoter.before_fit(student)  # a trained student acting: evaluated once, before the candidate
        promoter.before_fit(student)
        trainer.fit(progress=False)
        d = promoter.judge(student)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert d["episodes"] == 8 and 0.0 <= d["candidate_success"] <= 1.0
    assert d["promoted"] == (d["z"] <= d["z_limit"])
