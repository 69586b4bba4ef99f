"""Smoke test of benchmarks/bench_learning.py's code path: every arm on toy_reach, tiny settings, one seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(1200), pytest.mark.subprocess, pytest.mark.slow]  # a spawned worker runs every arm; slow on a loaded 2-core machine

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_learning

        yield bench_learning
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_learning")
    rc = bench.main(["--quick", "--seeds", "1", "--rounds", "2", "--warm-episodes", "2", "--episodes-per-round", "2",
                     "--eval-episodes", "4", "--steps-per-label", "0.2", "--gated-episodes", "3", "--jobs", "1",
                     "--out", str(out)])
    assert rc == 0
    return out, json.loads((out / "results.json").read_text())


def test_every_arm_runs_and_writes_results(result):
    out, res = result
    assert (out / "learning_curve.png").stat().st_size > 1000
    assert sorted(a["method"] for a in res["arms"]) == ["bc", "dagger", "gated"]
    for arm in res["arms"]:
        assert [r["round"] for r in arm["rounds"]] == [0, 1]
        lines = (out / f"{arm['method']}_s0" / "curve.jsonl").read_text().splitlines()
        assert [json.loads(x)["round"] for x in lines] == [0, 1]  # the curve file grows round by round
    assert set(res["summary"]) >= {"bc", "dagger", "gated"}


def test_same_round_zero_and_same_steps_per_label(result):
    _, res = result
    first = {a["method"]: a["rounds"][0] for a in res["arms"]}
    # round 0 is the same demonstrations, the same student and training for every arm
    assert len({r["labels"] for r in first.values()}) == 1
    assert len({r["policy_version"] for r in first.values()}) == 1
    for arm in res["arms"]:
        for r in arm["rounds"]:
            assert r["grad_steps"] == round(0.2 * r["labels"])


def test_the_gated_arm_watches_its_own_number_of_episodes_per_round(result):
    _, res = result
    after_round_0 = {a["method"]: a["rounds"][1]["episodes"] for a in res["arms"]}
    assert after_round_0 == {"bc": 2, "dagger": 2, "gated": 3}
    assert res["spec"]["gated"]["episodes_per_round"] == 3


def test_effort_is_counted_three_ways(result):
    _, res = result
    for arm in res["arms"]:
        prev = 0
        for r in arm["rounds"]:
            assert r["labels"] >= prev
            prev = r["labels"]
        demo = arm["rounds"][0]
        assert demo["context_switches"] == demo["episodes"] == 2
        assert demo["operator_s"] == pytest.approx(demo["env_steps"] * 0.04)
    gated = next(a for a in res["arms"] if a["method"] == "gated")["rounds"][1]
    assert gated["mode"] == "gated"
    assert gated["context_switches"] == gated["windows"]
    assert (gated["operator_s"] > 0) == (gated["context_switches"] > 0)
    assert 0.0 <= gated["intervention_rate"] <= 1.0


def test_gated_rounds_report_gate_recall_from_their_store(result):
    """The gated round's recall figures are the store's: recomputed from the arm's episodes they agree, and a
    round whose student failed with no gate asking is a gate miss naming those episodes."""
    from hg_dagger.review.recall import recall_figures
    from hg_dagger.store import EpisodeStore

    out, res = result
    arm = next(a for a in res["arms"] if a["method"] == "gated")
    fig = arm["rounds"][1]["gates"]
    assert "gates" not in arm["rounds"][0]  # round 0 is demonstrations: no gate ran
    store = EpisodeStore.open(str(out / "gated_s0" / "store"), mode="r")
    gated = [i for i in store.episodes() if i.start.policy_version == arm["rounds"][0]["policy_version"]]
    assert len(gated) == fig["episodes"] == 3
    assert recall_figures(gated) == fig
    assert fig["caught"] <= fig["failed"] <= 3 and fig["requests_before_failure"] <= fig["requests"]
    assert fig["gate_miss"] == (fig["failed"] > 0 and fig["requests"] == 0)
    assert len(fig["missed_episodes"]) == fig["failed"] - fig["caught"]
    s = res["summary"]["gated"]
    assert s["gate_failed_per_round"] == [0, fig["failed"]]
    assert s["gate_recall_per_round"][1] == (fig["recall"] if fig["failed"] else None)


def test_report_rebuilds_the_summary_from_the_curve_files(bench, result):
    out, res = result
    (out / "results.json").unlink()
    assert bench.main(["--quick", "--report", "--rounds", "3", "--steps-per-label", "0.2", "--out", str(out)]) == 0
    again = json.loads((out / "results.json").read_text())
    for m in ("bc", "dagger", "gated"):
        assert again["summary"][m]["success_mean"] == res["summary"][m]["success_mean"]
        assert again["summary"][m]["labels_mean"] == res["summary"][m]["labels_mean"]
    # the arms ran 2 of the 3 rounds asked for: reported, and marked partial
    assert sorted(again["partial_arms"]) == ["bc_s0", "dagger_s0", "gated_s0"]


def test_a_human_paced_arm_is_answered_in_real_time_by_the_operator_model(bench, tmp_path):
    """The fourth arm: the app's control loop (no window) at the keyboard device, answered by the human operator
    model reading the loop's snapshots. Its corrections are the model's key presses, recorded as a person's
    (operator "human-model", not certified), and they train as if a reviewer approved them."""
    from learning_common import run_arm

    from hg_dagger.review.decisions import list_windows

    spec = bench.arm_spec("toy_reach", 0, rounds=2, warm_episodes=2, episodes_per_round=2, eval_episodes=4,
                          steps_per_label=0.2)
    arm = run_arm("gated_human", spec, tmp_path / "human", log=lambda *_: None)
    gated = arm["rounds"][1]
    person = gated["human_model"]
    assert gated["mode"] == "gated" and gated["episodes"] == 2
    assert person["requests"] >= 1 and person["took_over"] >= 1 and person["act_p50_s"] >= 0.4  # a person's pace
    people = [w for w in list_windows(tmp_path / "human" / "store") if w.source == "human"]  # round 0: the planner's
    assert people and all(w.operator == "human-model" and not w.certified for w in people)
    assert gated["new_labels"] > 0  # the windows' steps reached the replay without a review


def test_a_gated_round_stops_watching_once_it_holds_its_windows(bench, tmp_path):
    """--gated-windows: whole batches of episodes until the round holds that many correction windows, at most
    --gated-episodes; an untrained student is corrected in its first batch, so the round stops there."""
    from learning_common import run_arm

    spec = bench.arm_spec("toy_reach", 0, rounds=2, warm_episodes=2, eval_episodes=4, steps_per_label=0.2,
                          gated_episodes=6, gated_windows=1)
    spec["gated"]["num_envs"] = 2
    arm = run_arm("gated", spec, tmp_path / "gated", log=lambda *_: None)
    gated = arm["rounds"][1]
    assert gated["windows"] >= 1
    assert gated["episodes"] == 2  # one batch of the two envs, not the six allowed


def test_no_seeds_to_run_is_a_usage_error_that_says_how_to_name_one(bench, capsys):
    """``--seeds 0`` is a count of none; one seed is written ``0,``. Nothing runs, and no traceback."""
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--quick", "--seeds", "0", "--methods", "gated"])
    assert exit_.value.code == 2
    assert "--seeds 0: no seeds to run" in capsys.readouterr().err


def test_every_arm_runs_to_one_budget_and_promotes_by_the_held_out_rule(result):
    """Every episode of every arm is cut at the task time budget, and after each round the held-out evaluation's
    two figures and the decision are recorded; the reported success is the acting student's."""
    from hg_dagger.learn.budget import task_budget
    from hg_dagger.learn.promotion import decide
    from hg_dagger.store import EpisodeStore

    out, res = result
    assert res["spec"]["max_episode_steps"] == res["spec"]["eval"]["max_steps"] == task_budget("toy_reach")
    for arm in res["arms"]:
        store = EpisodeStore.open(str(out / f"{arm['method']}_s0" / "store"), mode="r")
        assert max(i.num_steps for i in store.episodes()) <= task_budget("toy_reach")
        first, second = arm["rounds"][0]["promotion"], arm["rounds"][1]["promotion"]
        assert first["promoted"] and first["incumbent_success"] is None
        assert second["incumbent_version"] == arm["rounds"][0]["policy_version"]
        n = second["episodes"]
        again = decide((round(second["candidate_success"] * n), n), (round(second["incumbent_success"] * n), n))
        assert again["promoted"] == second["promoted"]
        acting = second["candidate_version"] if second["promoted"] else second["incumbent_version"]
        assert arm["rounds"][1]["policy_version"] == acting
    assert len(res["summary"]["gated"]["promoted_per_round"]) == 2


def test_gated_is_compared_with_bc_at_equal_labels_and_equal_operator_seconds(bench, result):
    _, res = result
    c = res["summary"]["gated_vs_bc"]
    row = c["per_seed"][0]
    bc = next(a for a in res["arms"] if a["method"] == "bc")["rounds"]
    gated = next(a for a in res["arms"] if a["method"] == "gated")["rounds"]
    assert row["b_final_labels"] == bc[-1]["labels"] and row["a_final_operator_s"] == gated[-1]["operator_s_total"]
    within = [r["success"] for r in gated if r["labels"] <= bc[-1]["labels"]]
    assert row["a_at_b_labels"] == within[-1]  # round 0 is shared, so some point is always within BC's labels
    assert bench.at_budget([1, 2, 3], [0.1, 0.5, 0.4], 2.5) == 0.5
    assert bench.at_budget([1, 2, 3], [0.1, 0.5, 0.4], 0.5) is None
