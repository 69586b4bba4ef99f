"""`hg-dagger auto` on toy_reach: same-observation relabelling, what is recorded, resume, producer modes,
and the end-to-end smoke test (short rollout + one update, nothing left running)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from support.auto import TINY, collect_toy, tiny

from hg_dagger.contract import ActionSource, CollectionMode, LabelMask, LabelTarget
from hg_dagger.envs import load_mapping
from hg_dagger.experts import make_expert, query_expert
from hg_dagger.learn.auto import AutoRun, leftover_workers
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store


def steps_of(store, info):
    return store.read_steps(info.episode_id)


def test_expert_labels_the_learners_pre_action_observation(tmp_path):
    cfg = tiny(beta={"kind": "constant", "beta0": 0.5})
    AutoRun(cfg, tmp_path / "run").run(progress=False)
    store = EpisodeStore.open(tmp_path / "run" / "store")
    mapping = load_mapping("toy_reach")
    student0 = Student.create(mapping, ensemble=3, hidden=(32, 32), seed=cfg.seed)  # the policy that collected
    expert = make_expert("toy_reach", "planner", mapping=mapping)
    infos = store.episodes(mode=CollectionMode.DAGGER_SYNC)
    assert len(infos) == 4 and all(i.complete for i in infos)
    used_any = np.zeros(2, dtype=bool)
    for info in infos:
        assert info.start.iteration == 0 and info.start.beta == 0.5
        assert info.start.policy_version == student0.version and info.start.mapping_hash == mapping.hash
        d = steps_of(store, info)
        obs = {k: d[f"obs/{k}"] for k in mapping.obs_spec()}
        # the stored label is what the expert says about the stored (pre-action) observation ...
        q = query_expert(expert, obs, np.arange(len(d["valid"])), mapping)
        np.testing.assert_allclose(d["expert_action"], q.action, atol=1e-6)
        # ... which is also what the student saw: its stored action is its answer to the same observation
        np.testing.assert_allclose(d["policy_action"], student0.act(obs).action, atol=1e-5)
        # and it is the observation the executed action was applied to (toy kinematics: q' = q + a * v * dt)
        q_next = d["obs/qpos"][:-1] + d["applied_action"][:-1] * 2.0 * 0.04
        wrapped = (q_next + np.pi) % (2 * np.pi) - np.pi
        np.testing.assert_allclose(wrapped, d["obs/qpos"][1:], atol=1e-4)
        # both sources reach the env through the mapping; the executed one is the expert's iff expert_used
        chosen = np.where(d["expert_used"][:, None], d["expert_action"], d["policy_action"])
        np.testing.assert_array_equal(d["applied_action"], mapping.clip_raw(chosen))
        assert np.array_equal(d["action_source"] == ActionSource.EXPERT.code, d["expert_used"])
        used_any |= [d["expert_used"].any(), (~d["expert_used"]).any()]
        # valid expert labels are the trainable ones, with the expert action as target
        layer = store.labels(info.episode_id)
        assert np.array_equal(layer.mask == LabelMask.TRAINABLE.code, d["expert_valid"])
        assert np.all(layer.target[d["expert_valid"]] == LabelTarget.EXPERT_ACTION.code)
        assert d["terminated"][-1] or d["truncated"][-1] or len(d["valid"]) == 25
        assert np.all(np.isfinite(d["policy_confidence"]))
    assert used_any.all()  # beta 0.5 mixed expert and student steps
    assert validate_store(store) == []


class FlakyExpert:
    """An outside expert that fails on env row 1 every other query and returns NaN on row 2."""

    output_space = "raw"

    def __init__(self, mapping):
        self.inner = make_expert("toy_reach", "planner", mapping=mapping)
        self.calls = 0

    def reset(self, env_ids, obs, info):
        pass

    def act(self, obs, *, env_ids):
        self.calls += 1
        ids = list(env_ids)
        if 1 in ids and self.calls % 2:
            raise RuntimeError("planner failed")
        q = self.inner.act(obs, env_ids=env_ids)
        if 2 in ids:
            q.action[ids.index(2)] = np.nan
        return q


def test_invalid_expert_rows_are_recorded_but_never_trainable(tmp_path):
    store, stats = collect_toy(tmp_path / "s", episodes=4, max_steps=20, expert=FlakyExpert(load_mapping("toy_reach")))
    assert stats.invalid > 0 and 0 < stats.summary()["invalid_label_rate"] < 1
    seen_invalid = 0
    for info in store.episodes():
        d = store.read_steps(info.episode_id)
        mask = store.labels(info.episode_id).mask
        bad = ~d["expert_valid"]
        seen_invalid += int(bad.sum())
        assert np.all(np.isnan(d["expert_action"][bad]))
        assert not d["expert_used"][bad].any()  # the student acted instead
        assert np.all(mask[bad] != LabelMask.TRAINABLE.code)
        assert np.all(mask[~bad] == LabelMask.TRAINABLE.code)
        if info.start.env_index == 0:
            assert not bad.any()  # other rows keep their labels
    assert seen_invalid == stats.invalid


def test_resume_keeps_iteration_policy_version_beta_and_replay(tmp_path):
    out = tmp_path / "run"
    cfg = tiny(iterations=2, beta={"kind": "exponential", "beta0": 1.0, "decay": 0.5})
    first = AutoRun(cfg, out).run(progress=False)
    assert [r["iteration"] for r in first] == [0, 1]
    version_after_1 = first[-1]["policy_version"]
    assert version_after_1.endswith("-r2")

    more = AutoRun(cfg.model_copy(update={"iterations": 3}), out).run(resume=True, progress=False)
    assert [r["iteration"] for r in more] == [2]
    row = more[0]
    assert row["beta"] == 0.25 and row["collected_with"] == [version_after_1]
    assert row["replay"]["iterations"] == [0, 1, 2] and row["replay"]["episodes"] == 12
    assert row["policy_version"].endswith("-r3")
    store = EpisodeStore.open(out / "store")
    it2 = [i for i in store.episodes() if i.start.iteration == 2]
    assert len(it2) == 4 and {i.start.policy_version for i in it2} == {version_after_1}
    assert {i.start.beta for i in it2} == {0.25}
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [0, 1, 2]
    for key in ("expert_latency_ms_mean", "invalid_label_rate", "disagreement", "beta", "eval_success_rate",
                "eval_episode_length"):
        assert all(key in x for x in lines)
    # a finished run resumes to nothing
    assert AutoRun(cfg.model_copy(update={"iterations": 3}), out).run(resume=True, progress=False) == []
    student = Student.load(out / "checkpoint.pt", load_mapping("toy_reach"))
    assert [e["round"] for e in student.lineage] == [1, 2, 3]
    assert [e["info"]["iteration"] for e in student.lineage] == [1, 2, 3]


def test_expert_demo_mode_is_bc_only_with_the_expert_driving(tmp_path):
    AutoRun(tiny(mode="expert_demo", beta={"kind": "constant", "beta0": 0.1}), tmp_path / "run").run(progress=False)
    store = EpisodeStore.open(tmp_path / "run" / "store")
    for info in store.episodes():
        assert info.start.bc_only and info.start.mode == CollectionMode.EXPERT_DEMO and info.start.beta == 1.0
        d = store.read_steps(info.episode_id, ["expert_used", "expert_valid"])
        assert np.array_equal(d["expert_used"], d["expert_valid"])


def test_policy_expert_drives_auto_on_toy(tmp_path):
    teacher = tmp_path / "teacher"
    AutoRun(tiny(), teacher).run(progress=False)
    cfg = tiny(expert={"kind": "policy", "checkpoint": str(teacher / "checkpoint.pt")},
               beta={"kind": "constant", "beta0": 0.5})
    rows = AutoRun(cfg, tmp_path / "run").run(progress=False)
    assert rows[0]["invalid_label_rate"] == 0.0
    mapping = load_mapping("toy_reach")
    teacher_student = Student.load(teacher / "checkpoint.pt", mapping)
    store = EpisodeStore.open(tmp_path / "run" / "store")
    for info in store.episodes():
        assert info.start.extra["expert"] == "PolicyExpert"
        d = store.read_steps(info.episode_id)
        obs = {k: d[f"obs/{k}"] for k in mapping.obs_spec()}
        np.testing.assert_allclose(d["expert_action"], teacher_student.act(obs).action, atol=1e-5)


def test_smoke_end_to_end_leaves_nothing_running(tmp_path):
    before = set(leftover_workers())
    rows = AutoRun(tiny(), tmp_path / "run").run(progress=False)
    after = set(leftover_workers())
    assert after - before == set(), f"left behind: {after - before}"
    assert not any(t.name == "hg-dagger-recorder" for t in threading.enumerate())
    row = rows[0]
    rec = row["recorder"]
    assert rec["dropped_steps"] == 0 and rec["written_steps"] == rec["queued_steps"] == row["env_steps"]
    assert row["replay"]["labels"] > 0 and row["train"]["steps"] == 30
    print(f"\nsmoke: {row['env_steps_per_s']:.0f} env-steps/s, expert latency {row['expert_latency_ms_mean']:.3f} ms, "
          f"replay {row['replay']['labels']} labels / {row['replay']['episodes']} episodes, "
          f"memory growth {row['rss_growth_mb']:+.1f} MiB during collection")


@pytest.mark.subprocess
def test_async_mode_hands_policies_over_by_snapshot_and_stops_cleanly(tmp_path):
    out = tmp_path / "run"
    cfg = tiny(mode="dagger_async", iterations=2, beta={"kind": "constant", "beta0": 0.5},
               **{"async": {"snapshot_check_steps": 5, "join_timeout_s": 60}})
    before = set(leftover_workers())
    rows = AutoRun(cfg, out).run(progress=False)
    assert set(leftover_workers()) - before == set()
    assert [r["iteration"] for r in rows] == [0, 1]
    # iteration 1 was collected by the simulation process with the snapshot written after round 1
    assert rows[1]["collected_with"] == [rows[0]["policy_version"]]
    store = EpisodeStore.open(out / "store")
    used = [i for i in store.episodes() if i.complete and i.episode_id in set(_replay_ids(out))]
    assert {i.start.mode for i in used} == {CollectionMode.DAGGER_ASYNC}
    assert sorted({i.start.iteration for i in used}) == [0, 1]
    assert (out / "snapshot.pt").is_file()
    # episodes cut short by the shutdown are committed but hold no trainable label
    for info in store.episodes(end_reason="env_reset"):
        assert not np.any(store.labels(info.episode_id).mask == LabelMask.TRAINABLE.code)


def _replay_ids(out):
    from hg_dagger.policy import read_checkpoint

    return [e for e, _ in read_checkpoint(out / "checkpoint.pt")["extra"]["train"]["replay"]["episodes"]]


def test_bad_config_is_a_config_error(tmp_path):
    from hg_dagger.errors import ConfigError
    from hg_dagger.learn.auto import load_config

    path = tmp_path / "a.yaml"
    path.write_text("kind: auto\ntask: toy_reach\nexpert: {kind: policy}\n")
    with pytest.raises(ConfigError, match="checkpoint"):
        load_config(path)
    path.write_text("kind: auto\ntask: toy_reach\nbeta: {kind: cosine}\n")
    with pytest.raises(ConfigError, match=r"a.yaml: key beta.kind"):
        load_config(path)


def test_auto_cli_runs_and_resumes(tmp_path, capsys):
    import yaml

    from hg_dagger.cli import main

    cfg = {"kind": "auto", **json.loads(json.dumps(TINY))}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    assert main(["auto", "--config", str(path), "--out", str(out), "--quiet"]) == 0
    assert "iteration 0: beta 1.000" in capsys.readouterr().out
    assert main(["auto", "--config", str(path), "--out", str(out), "--iterations", "2", "--resume", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "iteration 1: beta 0.500" in text and "iteration 0" not in text
    assert main(["auto", "--config", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_a_fresh_run_never_overwrites_an_existing_one(tmp_path):
    from hg_dagger.errors import ConfigError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"an earlier run")
    with pytest.raises(ConfigError, match="--resume"):
        AutoRun(tiny(), tmp_path / "run").run(progress=False)
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == b"an earlier run"


def test_planner_labels_reach_training_only_with_a_recorded_certification(tmp_path):
    """certification: planner_auto records one certification per expert window, and only those labels pass the
    training boundary; without it the planner's labels wait for a reviewer like any window."""
    from hg_dagger.contract import TrainingBlock
    from hg_dagger.errors import ContractError
    from hg_dagger.store.trainable import selection

    run = AutoRun(tiny(), tmp_path / "on")
    run.run(progress=False)
    store = EpisodeStore.open(str(run.store_url))
    for info in store.episodes():
        layer = store.labels(info.episode_id)
        assert [(c.step_start, c.step_end, c.method) for c in layer.certifications] == \
            [(w.handover_start, w.handover_end, "planner_auto") for w in layer.windows]
        sel = selection(store, info)
        assert sel.labels.any() and np.array_equal(sel.allowed, sel.labels)

    off = AutoRun(tiny(certification="none"), tmp_path / "off")
    with pytest.raises(ContractError, match="planner_auto"):
        off.run(progress=False)
    store = EpisodeStore.open(str(off.store_url))
    for info in store.episodes():
        assert store.labels(info.episode_id).certifications == []
        sel = selection(store, info)
        assert not sel.allowed.any()
        assert np.all(sel.blocks[sel.labels] == TrainingBlock.NOT_REVIEWED)
