"""validate_store and `hg-dagger validate`: each contract invariant is detected and named; corrupt input gives
clear errors without tracebacks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from support.auto import collect_toy
from support.store import end, fields, human_window, record, start, step

from hg_dagger.cli import main
from hg_dagger.contract import ActionSource, EventKind, ExpertCertification, LabelMask, LabelTarget, StepFlag
from hg_dagger.errors import ContractError, StoreError
from hg_dagger.store import EpisodeStore, LabelLayer, layout, validate_store


def _bad_episode(rec) -> str:
    eid = rec.begin_episode(start(), fields())
    for t in range(12):
        s = step(1, t)
        if t == 3:
            s["t_obs"] = step(1, 1)["t_obs"]  # goes back in time
            s["t_policy"], s["t_action_apply"] = s["t_obs"] + 1, s["t_obs"] + 2
        if t == 4:
            s["t_policy"] = s["t_obs"] - 50  # policy before its observation
        if t == 5:
            s["applied_action"] = np.array([0, np.nan, 0, 0], np.float32)
        if t == 6:
            s["policy_action"] = np.array([np.inf, 0, 0, 0], np.float32)
        if t == 7:
            s["action_source"] = np.uint8(9)
        if t == 8:
            s["step_flags"] = np.uint16(1 << 12)
        rec.put(eid, s)
    rec.end_episode(eid, end(12))
    return eid


def _write_layer(path, eid, version, mask, target, windows=(), certifications=()):
    layer = LabelLayer(version=version, author="foreign", mask=mask, target=target, windows=list(windows),
                       certifications=list(certifications))
    f = path / layout.LABELS / eid / f"v{version}.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(layer.to_json()))


def test_every_invariant_is_reported_with_episode_step_and_field(tmp_path, capsys):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        clean = record(rec, 0, 20, window=(5, 10))
        bad = _bad_episode(rec)
        hard = record(rec, 2, 20, window=(5, 10))
        orphan = rec.begin_episode(start(parent_episode_id="f" * 32, parent_step_id=3), fields())
        rec.put(orphan, step(3, 0))
        rec.end_episode(orphan, end(1))
    # a foreign writer broke the hard rule: policy steps 0..4 trainable with no window or certification
    v1 = EpisodeStore.open(path).labels(hard)
    mask, target = v1.mask.copy(), v1.target.copy()
    mask[0:5], target[0:5] = LabelMask.TRAINABLE.code, LabelTarget.APPLIED_ACTION.code
    _write_layer(path, hard, 2, mask, target, v1.windows)
    # and bound a window to steps the episode does not have
    _write_layer(path, hard, 3, v1.mask, v1.target, [human_window(hard, 15, 25)])

    found = {(v.episode_id, v.step, v.field) for v in validate_store(EpisodeStore.open(path))}
    assert (bad, 3, "t_obs") in found
    assert (bad, 4, "t_policy") in found
    assert (bad, 5, "applied_action") in found
    assert (bad, 6, "policy_action") in found
    assert (bad, 7, "action_source") in found
    assert (bad, 8, "step_flags") in found
    assert {(hard, s, "label_mask") for s in range(5)} <= found
    assert (hard, None, "labels") in found  # v3's window outside the episode
    assert (orphan, None, "parent_episode_id") in found
    assert not any(eid == clean for eid, _, _ in found)

    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"episode {hard} step 0 field 'label_mask': label layer v2: trainable policy action outside any correction window" in out
    assert f"episode {bad} step 5 field 'applied_action'" in out
    assert "violation(s)" in out


def test_clean_store_passes_and_lists(tmp_path, capsys):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 0, 10, image=True, window=(2, 4))
        cut = rec.begin_episode(start(), fields(image=True))
        rec.put(cut, step(1, 0, image=True))
    assert main(["validate", str(path)]) == 0
    assert "2 episodes (1 incomplete), 0 violation(s)" in capsys.readouterr().out
    assert main(["store", "ls", str(path)]) == 0
    out = capsys.readouterr().out
    assert eid in out and "(INCOMPLETE)" in out
    assert main(["store", "info", str(path), eid[:10]]) == 0
    assert "label layer v1 by recorder: {'trainable': 2" in capsys.readouterr().out


def test_truncated_image_shard_is_named(tmp_path, capsys):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 0, 10, image=True)
    shard = next((path / "segments").glob("*/data/obs/rgb/c/0/0/0/0"))
    shard.write_bytes(shard.read_bytes()[:100])
    store = EpisodeStore.open(path)
    with pytest.raises(StoreError, match=f"episode {eid}: field 'obs/rgb' unreadable"):
        store.load(eid)
    assert any(v.field == "obs/rgb" for v in validate_store(store))
    assert main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert "field 'obs/rgb'" in captured.out and "Traceback" not in captured.out + captured.err


def test_corrupt_log_keeps_the_store_open_and_fails_validation(tmp_path, capsys):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        record(rec, 0, 5)
    chunk = next((path / "segments").glob("*/log/c/0"))
    chunk.write_bytes(b"\x00garbage" * 10)
    store = EpisodeStore.open(path)
    assert store.episodes() == [] and any("log unreadable" in msg for _, msg in store.damaged)
    assert main(["validate", str(path)]) == 1
    assert "log unreadable" in capsys.readouterr().out


def test_store_ls_names_a_segment_with_garbage_metadata_and_fails_like_validate(tmp_path, capsys):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        kept = record(rec, 0, 5)
    first = {p.name for p in (path / "segments").iterdir() if p.is_dir()}
    with EpisodeStore.open(path, mode="a").recorder() as rec:
        record(rec, 1, 5)
    (broken,) = (p for p in (path / "segments").iterdir() if p.is_dir() and p.name not in first)  # the second one's
    (broken / "zarr.json").write_bytes(b"\x00not json{")
    assert main(["store", "ls", str(path)]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert kept in out and "1 episode(s); 1 damaged" in out
    assert any(ln.startswith(f"damaged: segment {broken.name}: unreadable segment metadata") for ln in out.splitlines())
    assert "Traceback" not in out + captured.err
    assert main(["validate", str(path)]) == 1
    assert f"segment {broken.name}" in capsys.readouterr().out


def test_wrong_schema_version_is_one_clear_line(tmp_path, capsys):
    path = tmp_path / "s"
    EpisodeStore.create(path)
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["hg_dagger"]["schema_version"] = "9.9"
    (path / "zarr.json").write_text(json.dumps(meta))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "schema_version '9.9' is not supported" in err and "Traceback" not in err


def test_episode_with_wrong_schema_version_is_damaged_not_loaded(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 0, 3)
    import zarr

    log = zarr.open_group(path)[f"segments/{store.segments[0]}/log"]
    records = [json.loads(r) for r in log[:]]
    records[0]["start"]["schema_version"] = "0.1"
    log[:] = np.array([json.dumps(r) for r in records], dtype=object)
    store = EpisodeStore.open(path)
    assert not store.has_episode(eid)
    violations = validate_store(store)
    assert any(v.episode_id == eid and "schema_version" in v.message for v in violations)


def test_duplicate_ids_from_two_writers_are_reported(tmp_path):
    path = tmp_path / "s"
    EpisodeStore.create(path)
    a, b = EpisodeStore.open(path, mode="a"), EpisodeStore.open(path, mode="a")
    st = start()
    for s in (a, b):  # two processes that never saw each other's episodes
        with s.recorder() as rec:
            rec.begin_episode(st, fields())
            rec.put(st.episode_id, step(0, 0))
            rec.end_episode(st.episode_id, end(1))
    violations = validate_store(EpisodeStore.open(path))
    assert any(v.episode_id == st.episode_id and "id used twice" in v.message for v in violations)


def test_action_source_codes_use_the_contract(tmp_path):
    """The validator accepts every defined ActionSource code and only those."""
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = rec.begin_episode(start(), fields())
        for t, src in enumerate(ActionSource):
            rec.put(eid, step(0, t, source=src))
        rec.end_episode(eid, end(len(ActionSource)))
    assert validate_store(EpisodeStore.open(path)) == []


@pytest.fixture(scope="module")
def gated_store(tmp_path_factory):
    """A real human-gated recording: toy_reach driven by the synthetic operator (at least one window)."""
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    path = tmp_path_factory.mktemp("gated") / "s.zarr"
    cfg = load_run_config(None, "toy_reach", episodes=2, num_envs=1, **{"operator.return_after_steps": 8})
    run_gated(cfg, str(path), progress=False)  # the operator hands back early: a blended return follows
    store = EpisodeStore.open(path)
    with_window = [i.episode_id for i in store.episodes() if store.labels(i.episode_id).windows]
    assert with_window, "the synthetic operator corrected nothing"
    return path, with_window[0]


def _copy(src, tmp_path):
    import shutil

    dst = tmp_path / "s.zarr"
    shutil.copytree(src, dst)
    return dst


def test_recorded_gated_store_passes_the_window_and_human_step_checks(gated_store):
    path, eid = gated_store
    store = EpisodeStore.open(path)
    assert validate_store(store) == []
    w = store.labels(eid).windows[0]
    d = store.read_steps(eid, ["t_action_apply", "action_source", "human_command", "policy_action"])
    assert w.t_handover == d["t_action_apply"][w.handover_start]
    human = d["action_source"] == ActionSource.HUMAN.code
    assert human.any() and np.isfinite(d["human_command"][human]).all() and np.isfinite(d["policy_action"][human]).all()


def test_window_t_handover_must_be_its_first_applied_step(gated_store, tmp_path, capsys):
    path = _copy(gated_store[0], tmp_path)
    eid = gated_store[1]
    store = EpisodeStore.open(path, mode="a")
    w = store.labels(eid).windows[0]
    late = w.model_copy(update={"t_handover": w.t_handover + 1_000_000})
    version = store.write_labels(eid, author="foreign", windows=[late])
    found = [v for v in validate_store(EpisodeStore.open(path)) if v.field == "t_handover"]
    assert [(v.episode_id, v.step) for v in found] == [(eid, w.handover_start)]
    assert f"label layer v{version}: window {w.window_id} t_handover={late.t_handover}" in found[0].message
    assert main(["validate", str(path)]) == 1
    assert f"episode {eid} step {w.handover_start} field 't_handover'" in capsys.readouterr().out


def _copy_with(store, eid, new_eid, change):
    """A copy of a recorded episode, written through the recorder, with ``change(t, step)`` applied to each step
    (NaN is the contract's "absent")."""
    info, specs = store.info(eid), store.fields(eid)
    data = store.read_steps(eid, list(specs))
    layer = store.labels(eid)
    copy = info.start.model_copy(update={"episode_id": new_eid})
    with store.recorder() as rec:
        rec.begin_episode(copy, specs)
        for t in range(info.num_steps):
            s = {k: v[t] for k, v in data.items()}
            change(t, s)
            rec.put(copy.episode_id, s)
        rec.end_episode(copy.episode_id, info.end.model_copy(update={"events": []}),
                        windows=[w.model_copy(update={"parent_episode_id": copy.episode_id,
                                                      "window_id": new_eid[:1] * 31 + "d"})
                                 for w in layer.windows])
    return data


@pytest.mark.parametrize("missing", ["human_command", "policy_action"])
def test_human_step_needs_its_command_and_the_policy_action(gated_store, tmp_path, missing):
    path = _copy(gated_store[0], tmp_path)
    eid = gated_store[1]
    store = EpisodeStore.open(path, mode="a")
    human = np.flatnonzero(store.read_steps(eid, ["action_source"])["action_source"] == ActionSource.HUMAN.code)

    def drop(t, s):
        if t in human:
            s[missing] = np.full_like(s[missing], np.nan)

    _copy_with(store, eid, "c" * 32, drop)
    found = [v for v in validate_store(EpisodeStore.open(path)) if v.field == missing]
    assert {v.episode_id for v in found} == {"c" * 32}
    assert found[0].step == int(human[0]) and f"without {missing}" in found[0].message


def test_a_clamped_step_under_a_person_keeps_the_device_command_unless_a_flag_says_why(gated_store, tmp_path):
    """The safety monitor clamped a person's command: the step is the controller's, but the raw device value stays
    in human_command; a step without it is reported unless device_lost or incomplete_input explains the gap."""
    path = _copy(gated_store[0], tmp_path)
    eid = gated_store[1]
    store = EpisodeStore.open(path, mode="a")
    d = store.read_steps(eid, ["action_source", "step_flags"])
    human = np.flatnonzero((d["action_source"] == ActionSource.HUMAN.code) & (d["step_flags"] == 0))
    lost, silent, kept = int(human[0]), int(human[1]), int(human[2])

    def clamp(t, s, *, flag_lost: bool, flag_silent: bool):
        if t in (lost, silent, kept):  # the monitor clamped these: the controller's source, flagged clamped
            s["action_source"] = np.uint8(ActionSource.SAFETY_CONTROLLER.code)
            s["step_flags"] = np.uint16(int(s["step_flags"]) | StepFlag.CLAMPED)
        if t in (lost, silent):
            s["human_command"] = np.full_like(s["human_command"], np.nan)
        if t == lost and flag_lost:
            s["step_flags"] = np.uint16(int(s["step_flags"]) | StepFlag.DEVICE_LOST)
        if t == silent and flag_silent:
            s["step_flags"] = np.uint16(int(s["step_flags"]) | StepFlag.INCOMPLETE_INPUT)

    _copy_with(store, eid, "a" * 32, lambda t, s: clamp(t, s, flag_lost=False, flag_silent=False))
    _copy_with(store, eid, "b" * 32, lambda t, s: clamp(t, s, flag_lost=True, flag_silent=True))
    violations = validate_store(EpisodeStore.open(path))
    found = [v for v in violations if v.field == "human_command"]
    assert [(v.episode_id, v.step) for v in found] == [("a" * 32, lost), ("a" * 32, silent)], violations
    assert "device_lost or incomplete_input" in found[0].message


def test_an_expert_command_the_monitor_clamped_keeps_the_expert_action(tmp_path):
    """Planner demonstrations on toy_reach with a tight safety limit: the clamped steps keep the expert's action;
    a copy that lost it at a clamped step is reported."""
    from hg_dagger.contract import CollectionMode, ControlState
    from hg_dagger.envs import make_env
    from hg_dagger.learn.auto_config import ExpertSpec
    from hg_dagger.learn.collect import Collector, build_expert
    from hg_dagger.policy import Student

    path = tmp_path / "s.zarr"
    store = EpisodeStore.create(path)
    with make_env("toy_reach", num_envs=2, seed=0) as env:
        with store.recorder() as rec:
            collector = Collector(env, build_expert(ExpertSpec(), env.mapping, relabel=False), rec,
                                  mode=CollectionMode.EXPERT_DEMO.value, seed=0, certify=True)
            collector.set_policy(Student.create(env.mapping, seed=0), iteration=0, beta=1.0)
            collector.run(episodes=2, reset_seed=0)
    store = EpisodeStore.open(path, mode="a")
    assert validate_store(store) == []
    eid = store.episodes(mode=CollectionMode.EXPERT_DEMO)[0].episode_id
    d = store.read_steps(eid, ["control_state", "expert_action"])
    assert (d["control_state"] == ControlState.EXPERT.code).all() and np.isfinite(d["expert_action"]).all()
    target = 3

    def clamp_and_lose(t, s):
        if t == target:
            s["action_source"] = np.uint8(ActionSource.SAFETY_CONTROLLER.code)
            s["step_flags"] = np.uint16(int(s["step_flags"]) | StepFlag.CLAMPED)
            s["expert_action"] = np.full_like(s["expert_action"], np.nan)

    _copy_with(store, eid, "e" * 32, clamp_and_lose)
    found = [v for v in validate_store(EpisodeStore.open(path))
             if v.field == "expert_action" and "expert's step" in v.message]
    assert [(v.episode_id, v.step) for v in found] == [("e" * 32, target)]


def test_a_self_certification_is_refused_by_write_labels_and_reported_by_validate(tmp_path, capsys):
    """The operator (or the policy) certifying its own episode's actions makes nothing trainable."""
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 0, 10, operator="synthetic", policy_version="student-r1")
    store = EpisodeStore.open(path, mode="a")
    own = ExpertCertification(episode_id=eid, step_start=0, step_end=4, certifier="synthetic",
                              method="replay_verified", executability_verified=True)
    with pytest.raises(ContractError, match=f"certification {own.cert_id} by 'synthetic' refused: .*own operator"):
        store.write_labels(eid, author="foreign", certifications=[own])
    policy = own.model_copy(update={"certifier": "student-r1"})
    with pytest.raises(ContractError, match="the policy that acted"):
        store.write_labels(eid, author="foreign", certifications=[policy])
    independent = own.model_copy(update={"certifier": "reviewer-2", "method": "independent_review"})
    v = store.write_labels(eid, author="reviewer-2", certifications=[independent])
    assert (store.labels(eid, v).mask[0:4] == LabelMask.TRAINABLE.code).all()

    # a foreign writer stores the self-certification and marks its steps trainable anyway
    mask, target = store.labels(eid, v).mask, store.labels(eid, v).target
    _write_layer(path, eid, v + 1, mask, target, certifications=[own])
    found = validate_store(EpisodeStore.open(path))
    cert = [x for x in found if x.field == "certifications"]
    assert [(x.episode_id, x.step) for x in cert] == [(eid, 0)]
    assert f"certification {own.cert_id} by 'synthetic' (method 'replay_verified') does not count" in cert[0].message
    assert {(eid, s, "label_mask") for s in range(4)} <= {(x.episode_id, x.step, x.field) for x in found}
    assert main(["validate", str(path)]) == 1
    assert "is the episode's own operator" in capsys.readouterr().out


def test_every_recorded_window_is_also_a_window_closed_event(gated_store):
    path, eid = gated_store
    store = EpisodeStore.open(path)
    for info in store.episodes():
        events = {e.values["window_id"]: e for e in info.end.events if e.kind == EventKind.WINDOW_CLOSED}
        windows = store.labels(info.episode_id, 1).windows
        assert set(events) == {w.window_id for w in windows}
        for w in windows:
            v = events[w.window_id].values
            assert (v["parent_step_id"], v["handover_start"], v["handover_end"]) == (
                w.parent_step_id, w.handover_start, w.handover_end)
            assert (v["t_handover"], v["t_return"], v["source"], v["operator"]) == (
                w.t_handover, w.t_return, w.source.value, w.operator)
            assert events[w.window_id].step == w.handover_end


def test_an_episode_cut_off_before_its_commit_keeps_its_closed_windows_as_events(tmp_path):
    """No end record (the run stopped mid-episode): the window exists only as its event, and nothing trains."""
    from hg_dagger.control.build import build_session
    from hg_dagger.control.run_config import load_run_config
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student

    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, episodes=1,
                          **{"operator.return_after_steps": 5})
    env = make_env("toy_reach", num_envs=1, seed=0)
    rec = EpisodeStore.create(tmp_path / "s").recorder(flush_interval_s=0.05)
    session = build_session(cfg, rec, Student.create(env.mapping, seed=0), env=env)
    session.start(1)
    for _ in range(400):
        session.tick()
        if session.machine.closed[0]:
            break
    assert session.machine.closed[0], "no correction closed in 400 ticks"
    eid = session.writer.eids[0]
    rec.close()  # the episode was never ended
    env.close()
    store = EpisodeStore.open(tmp_path / "s")
    info = store.info(eid)
    assert not info.complete
    closed = [e for e in info.end.events if e.kind == EventKind.WINDOW_CLOSED]
    assert len(closed) == 1 and closed[0].values["handover_end"] > closed[0].values["handover_start"]
    assert closed[0].values["t_return"] > 0 and closed[0].values["window_id"]
    assert (store.load(eid, fields=["action_source"])["label_mask"].numpy() != LabelMask.TRAINABLE.code).all()
    assert validate_store(store) == []


def test_run_episodes_record_versions_and_scene(gated_store):
    store = EpisodeStore.open(gated_store[0])
    for info in store.episodes():
        v = info.start.versions
        assert v.controller.startswith("hg_dagger ") and v.env and v.simulator.startswith("numpy ")
        assert info.start.task.scene_id == "default" and isinstance(info.start.initial_state["seed"], int)


def test_every_episode_auto_begins_records_a_seed_that_replays_it(tmp_path):
    """Rows reset by the env after an episode ends begin the next one from an explicit, recorded seed."""
    from hg_dagger.review.replay import replay_episode

    collect_toy(tmp_path / "s", episodes=5, num_envs=2, max_steps=8, beta=0.5, reset_seed=100)
    infos = EpisodeStore.open(tmp_path / "s").episodes()
    assert len(infos) == 5
    seeds = [i.start.initial_state.get("seed") for i in infos]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == 5, seeds
    assert all(i.start.task.scene_id == "default" and i.start.versions.controller for i in infos)
    store = EpisodeStore.open(tmp_path / "s")
    for info in infos:
        assert replay_episode(store, info.episode_id).status.value == "replayable", info.start.initial_state


def test_blended_hand_back_steps_are_the_controllers_not_the_policys(gated_store):
    """What reached the robot decides the source: a policy step applied exactly the policy's action."""
    from hg_dagger.contract import ControlState, StepFlag

    store = EpisodeStore.open(gated_store[0])
    eid = gated_store[1]
    d = store.read_steps(eid, ["action_source", "control_state", "step_flags", "applied_action", "policy_action"])
    blend = (d["control_state"] == ControlState.RETURNING.code) & ((d["step_flags"] & StepFlag.INTERPOLATED) != 0)
    assert blend.any(), "the toy run config blends the hand-back"
    assert (d["action_source"][blend] == ActionSource.SAFETY_CONTROLLER.code).all()
    policy = d["action_source"] == ActionSource.POLICY.code
    np.testing.assert_array_equal(d["applied_action"][policy], d["policy_action"][policy])
    assert (store.labels(eid).mask[blend] != LabelMask.TRAINABLE.code).all()


CUT_OFF = "20260101T000000-0badc0de"


def _cut_off_segment(path, how: str) -> None:
    """What a kill (or a full disk) during the creation of a segment leaves, in each of its forms."""
    seg = path / "segments" / CUT_OFF
    if how == "empty folder":  # the folder was made, its metadata never written (full disk)
        seg.mkdir()
    elif how == "arrays, no attributes":  # killed before the attributes (the current creation order)
        group = zarr.open_group(path, mode="r+").create_group(f"segments/{CUT_OFF}")
        layout.create_arrays(group, [layout.index_array_kwargs("rows/episode"), layout.log_array_kwargs()])
    elif how == "arrays, attributes, nothing committed":  # killed before its first flush
        first = next(p for p in (path / "segments").iterdir() if p.is_dir())
        meta = json.loads((first / "zarr.json").read_text())["attributes"][layout.SEGMENT_ATTR]
        meta.update(segment_id=CUT_OFF, committed_rows=0, committed_log=0, closed=False)
        group = zarr.open_group(path, mode="r+").create_group(f"segments/{CUT_OFF}")
        layout.create_arrays(group, [layout.index_array_kwargs("rows/episode"), layout.index_array_kwargs("rows/step"),
                                     layout.log_array_kwargs()])
        group.attrs.put({layout.SEGMENT_ATTR: meta})
    elif how == "attributes, no arrays":  # what writers before the creation order fix left
        first = next(p for p in (path / "segments").iterdir() if p.is_dir())
        meta = json.loads((first / "zarr.json").read_text())["attributes"][layout.SEGMENT_ATTR]
        meta.update(segment_id=CUT_OFF, committed_rows=0, committed_log=0, closed=False)
        zarr.open_group(path, mode="r+").create_group(f"segments/{CUT_OFF}", attributes={layout.SEGMENT_ATTR: meta})


def _documented_reader(path) -> str:
    """Run the zarr+numpy reader printed in docs/data-format.md on `path`; returns what it prints."""
    import contextlib
    import io
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data-format.md").read_text()
    code = doc.split("## Reading with zarr and numpy only", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace('"STORE"', repr(str(path))), "docs/data-format.md", "exec"), {})
    return out.getvalue()


@pytest.mark.parametrize("how", ["empty folder", "arrays, no attributes", "attributes, no arrays",
                                 "arrays, attributes, nothing committed"])
def test_a_segment_cut_off_while_being_created_is_skipped_and_warned_never_invalid(tmp_path, capsys, how):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        kept = [record(rec, i, 8, image=True) for i in range(2)]
    _cut_off_segment(path, how)
    store = EpisodeStore.open(path)
    assert [i.episode_id for i in store.episodes()] == kept and store.damaged == []
    assert (CUT_OFF in store.segments) == (how == "arrays, attributes, nothing committed")  # it has attributes
    assert len(store.warnings) == 1 and f"segment {CUT_OFF}: uncommitted" in store.warnings[0]
    assert validate_store(store) == []
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"warning: segment {CUT_OFF}: uncommitted" in out and "0 violation(s), 1 warning(s)" in out
    printed = _documented_reader(path)
    assert all(f"{eid} toy_reach 8 complete" in printed for eid in kept)
    with EpisodeStore.open(path, mode="a").recorder() as rec:  # the store still takes new episodes
        kept.append(record(rec, 5, 8))
    again = EpisodeStore.open(path)
    assert {i.episode_id for i in again.episodes(complete=True)} == set(kept) and validate_store(again) == []
