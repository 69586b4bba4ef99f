"""`hg-dagger train` from a real store: only trainable labels reach the loss; checkpoints resume exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.auto import small_student
from support.labels import toy_replay

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EndReason,
    EpisodeEnd,
    EpisodeStart,
    LabelMask,
    TaskInfo,
    step_fields,
)
from hg_dagger.contract.labels import planner_certifications
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.toy import toy_ik_action
from hg_dagger.learn.aggregate import LabelBufferConfig
from hg_dagger.learn.train import StudentConfig, TrainConfig, Trainer, store_loader, train_from_store
from hg_dagger.policy import Student, read_checkpoint
from hg_dagger.store import EpisodeStore

WINDOW = (5, 15)
STEPS = 25
POISON = 1e6


def record(store_path, *, poison: bool, episodes: int = 4, seed: int = 0) -> list[str]:
    """Toy episodes with a planner-certified expert window over WINDOW; every 4th in-window label invalid (NaN).

    With poison=True every non-trainable row holds absurd observations and actions.
    """
    mapping = load_mapping("toy_reach")
    store = EpisodeStore.create(store_path)
    fields = step_fields(mapping.obs_spec(), mapping.action_dim)
    ids = []
    with store.recorder() as rec:
        for e in range(episodes):
            env = make_env(mapping, num_envs=1, seed=seed + e)
            obs, _ = env.reset(seed=seed + e)
            start = EpisodeStart(task=TaskInfo(task_id="toy_reach"), mode=CollectionMode.DAGGER_SYNC,
                                 control_hz=mapping.control_hz, mapping_hash=mapping.hash, policy_version="test")
            eid = rec.begin_episode(start, fields)
            for t in range(STEPS):
                a = toy_ik_action(obs)[0]
                inside = WINDOW[0] <= t < WINDOW[1]
                valid = inside and t % 4 != 0
                bad = poison and not (inside and valid)
                step = {f"obs/{k}": (np.full_like(obs[k][0], POISON) if bad else obs[k][0]) for k in obs}
                step.update(
                    expert_action=(np.full(2, POISON, np.float32) if bad and valid else
                                   a if valid else np.full(2, np.nan, np.float32)),
                    expert_valid=valid, expert_used=valid,
                    applied_action=np.full(2, POISON, np.float32) if bad else a,
                    action_source=np.uint8(ActionSource.EXPERT.code if valid else ActionSource.POLICY.code),
                )
                rec.put(eid, step)
                obs = env.step(a[None]).obs
            windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=WINDOW[0], handover_start=WINDOW[0],
                                        handover_end=WINDOW[1], source=ActionSource.EXPERT)]
            rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.TIMEOUT, task_success=False, num_steps=STEPS),
                            windows=windows, certifications=planner_certifications(eid, windows, "toy_ik"))
            ids.append(eid)
    return ids


SMALL = dict(student_cfg=StudentConfig(ensemble=3, hidden=(32, 32)),
             train_cfg=TrainConfig(steps=60, batch_size=32, seed=1, log_every=10), progress=False)


def test_non_trainable_rows_never_reach_the_loss(tmp_path):
    record(tmp_path / "clean", poison=False)
    record(tmp_path / "poisoned", poison=True)
    a = train_from_store(str(tmp_path / "clean"), "toy_reach", tmp_path / "a", **SMALL)
    b = train_from_store(str(tmp_path / "poisoned"), "toy_reach", tmp_path / "b", **SMALL)
    # 4 episodes x 10 window steps, minus the invalid labels at steps 8 and 12
    assert a["labels"] == b["labels"] == 4 * 8
    assert a["version"] == b["version"]  # bit-identical weights: poisoned rows had no influence
    assert np.isfinite(b["loss_last"]) and b["loss_last"] < 10
    losses = [json.loads(x) for x in (tmp_path / "b" / "loss.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and all(np.isfinite(x["loss"]) for x in losses)


def test_every_sampled_row_is_a_trainable_label(tmp_path):
    record(tmp_path / "s", poison=True)
    mapping = load_mapping("toy_reach")
    store = EpisodeStore.open(tmp_path / "s")
    loader = store_loader(store, mapping)
    from hg_dagger.learn.aggregate import LabelBuffer

    replay = LabelBuffer(LabelBufferConfig())
    replay.add(loader(i.episode_id) for i in store.episodes())
    masks = {i.episode_id: store.labels(i.episode_id).mask for i in store.episodes()}
    a = replay.arrays()
    seen = []

    def check(rows):
        for r in rows:
            eid = replay.episodes[a["episode"][r]].episode_id
            assert masks[eid][a["step"][r]] == LabelMask.TRAINABLE.code
            seen.append(int(r))

    Trainer(small_student(), TrainConfig(steps=20, batch_size=16), replay).fit(
        progress=False, on_batch=check)
    assert len(seen) == 20 * 16 and np.all(np.abs(a["target"]) < 2)


def test_training_is_deterministic_and_resumes_exactly(tmp_path):
    record(tmp_path / "s", poison=False)
    url = str(tmp_path / "s")
    cfg = TrainConfig(steps=40, batch_size=32, seed=4, log_every=10)
    once = train_from_store(url, "toy_reach", tmp_path / "once", **{**SMALL, "train_cfg": cfg})
    again = train_from_store(url, "toy_reach", tmp_path / "again", **{**SMALL, "train_cfg": cfg})
    assert once["version"] == again["version"]
    # resume: weights, optimizer, RNG and replay state come back; a second round continues from them
    mapping = load_mapping("toy_reach")
    store = EpisodeStore.open(url)
    t1 = Trainer.resume(tmp_path / "once" / "student.pt", mapping, store_loader(store, mapping))
    t2 = Trainer.resume(tmp_path / "once" / "student.pt", mapping, store_loader(store, mapping))
    assert t1.total_steps == 40 and t1.optimizer.t == 40 and len(t1.replay) == 32
    assert t1.student.version == once["version"]
    r1, r2 = t1.fit(progress=False), t2.fit(progress=False)
    assert r1["version"] == r2["version"] != once["version"] and r1["round"] == 2
    data = read_checkpoint(tmp_path / "once" / "student.pt")
    assert set(data["extra"]["train"]) >= {"optimizer", "iteration", "beta", "replay", "rng"}


def test_intervention_weighting_pulls_the_student_toward_corrections():
    """Conflicting labels on the same states: corrections say +0.5, other certified rows say -0.5.

    Unweighted, the student lands near the mean (0); with corrections weighted 3x it lands near
    (3 * 0.5 - 0.5) / 4 = 0.25.
    """
    from hg_dagger.contract import LabelTarget
    from hg_dagger.learn.aggregate import LabelBuffer
    from hg_dagger.store.trainable import extract_labels

    mapping = load_mapping("toy_reach")
    rng = np.random.default_rng(0)
    n = 400
    source = np.where(np.arange(n) % 2 == 0, ActionSource.EXPERT.code, ActionSource.POLICY.code).astype(np.uint8)
    target = np.where((source == ActionSource.EXPERT.code)[:, None], 0.5, -0.5).astype(np.float32) * np.ones((n, 2))
    data = {"obs/qpos": rng.normal(0, 0.1, (n, 2)), "obs/ee_pos": rng.normal(0, 0.1, (n, 2)),
            "obs/target": rng.normal(0, 0.1, (n, 2)), "expert_action": target, "applied_action": target,
            "action_source": source, "label_mask": np.full(n, LabelMask.TRAINABLE.code, np.uint8),
            "label_target": np.full(n, LabelTarget.EXPERT_ACTION.code, np.uint8)}
    means = {}
    for weight in (None, 3.0):
        replay = LabelBuffer(LabelBufferConfig(intervention_weight=weight))
        replay.add([extract_labels(data, episode_id="e", obs_keys=["qpos", "ee_pos", "target"])])
        student = Student.create(mapping, ensemble=2, hidden=(32,), seed=0)
        Trainer(student, TrainConfig(steps=300, batch_size=128, lr=3e-3, seed=0), replay).fit(progress=False)
        obs = {k: data[f"obs/{k}"].astype(np.float32) for k in ("qpos", "ee_pos", "target")}
        means[weight] = float(student.act(obs).action.mean())
    assert abs(means[None]) < 0.1
    assert means[3.0] == pytest.approx(0.25, abs=0.1)


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_every_round_runs_the_lr_schedule_from_the_top(schedule):
    cfg = TrainConfig(steps=30, batch_size=16, lr=2e-3, lr_min=1e-5, lr_schedule=schedule)
    trainer = Trainer(small_student(), cfg, toy_replay())
    for _ in range(2):
        lrs = []
        trainer.fit(progress=False, on_batch=lambda rows, lrs=lrs: lrs.append(trainer.optimizer.lr))
        assert len(lrs) == 30 and lrs[0] == pytest.approx(2e-3)
        if schedule == "cosine":
            assert lrs[-1] == pytest.approx(1e-5) and all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
            assert lrs[15] == pytest.approx((2e-3 + 1e-5) / 2, rel=0.1)
        else:
            assert set(lrs) == {2e-3}


@pytest.mark.parametrize("warm", [True, False])
def test_rounds_warm_start_or_restart_from_fresh_weights(warm):
    mapping = load_mapping("toy_reach")
    student = small_student(seed=3)
    trainer = Trainer(student, TrainConfig(steps=20, batch_size=16, warm_start=warm), toy_replay())
    trainer.fit(progress=False)
    after_first = {k: v.clone() for k, v in student.net.head.state_dict().items()}
    fresh = Student(mapping, student.spec, seed=student.seed + 1).net.head.state_dict()  # round 1's re-init seed
    at_start = {}

    def grab(rows):
        if not at_start:
            at_start.update({k: v.clone() for k, v in student.net.head.state_dict().items()})

    trainer.fit(progress=False, on_batch=grab)
    expected = after_first if warm else fresh
    other = fresh if warm else after_first
    assert all(np.array_equal(at_start[k].numpy(), expected[k].numpy()) for k in expected)
    assert not all(np.array_equal(at_start[k].numpy(), other[k].numpy()) for k in other)
    if not warm:
        assert trainer.optimizer.t == 20  # the optimizer restarted with the weights


@pytest.mark.parametrize("warm", [True, False])
def test_a_per_label_budget_sets_each_rounds_steps(warm):
    """train.steps_per_label: the round's steps follow the labels the replay holds; with fresh weights every round
    trains the whole budget, with warm start only what the new labels add."""
    student = small_student(seed=3)
    trainer = Trainer(student, TrainConfig(steps=999, batch_size=16, warm_start=warm, steps_per_label=0.3),
                      toy_replay(100))
    assert trainer.fit(progress=False)["steps"] == 30
    trainer.replay = toy_replay(250)  # the next round holds 150 more labels
    assert trainer.round_steps() == (75 - 30 if warm else 75)
    assert trainer.fit(progress=False)["steps"] == trainer.total_steps - 30
    assert trainer.total_steps == (75 if warm else 105)
    assert Trainer(student, TrainConfig(steps=40), toy_replay(100)).round_steps() == 40  # no per-label budget


def test_train_cli_and_its_errors(tmp_path, capsys):
    from hg_dagger.cli import main

    record(tmp_path / "s", poison=False)
    args = ["train", "--store", str(tmp_path / "s"), "--task", "toy_reach", "--out", str(tmp_path / "out"),
            "--steps", "20", "--ensemble", "2", "--quiet"]
    assert main(args) == 0
    assert "trained" in capsys.readouterr().out and (tmp_path / "out" / "student.pt").is_file()
    assert json.loads((tmp_path / "out" / "train.json").read_text())["labels"] == 32
    assert main(args[:2] + [str(tmp_path / "nowhere")] + args[3:]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "Traceback" not in err


def test_episodes_recorded_under_another_mapping_are_refused(tmp_path):
    record(tmp_path / "s", poison=False)
    import yaml

    from hg_dagger.envs.mapping import TASKS_DIR

    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    data["horizon"] = 300
    (tmp_path / "toy_reach.yaml").write_text(yaml.safe_dump(data))
    from hg_dagger.errors import ContractError

    with pytest.raises(ContractError, match="recorded under mapping hash"):
        train_from_store(str(tmp_path / "s"), str(tmp_path / "toy_reach.yaml"), tmp_path / "o", **SMALL)
