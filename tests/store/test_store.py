"""EpisodeStore on real zarr stores: round trips, filters, incomplete episodes, label layers, immutability,
fsspec URLs, batches and file counts."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import zarr
from support.store import check_steps, end, fields, human_window, record, start, step

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    EndReason,
    LabelMask,
    LabelTarget,
    ReplayStatus,
    ReviewDecision,
    ReviewStatus,
    Split,
    derive_labels,
)
from hg_dagger.contract.schema import ReplayCheck
from hg_dagger.errors import ContractError, StoreError
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.simulation]


def _files(path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()}


def test_round_trip_with_images_and_interleaved_episodes(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(flush_interval_s=0.01) as rec:
        a = rec.begin_episode(start(), fields(image=True))
        b = rec.begin_episode(start(), fields(image=True))
        for t in range(40):  # two envs at once: rows of a and b interleave in the shared arrays
            rec.put(a, step(1, t, image=True))
            if t < 25:
                rec.put(b, step(2, t, image=True))
        rec.end_episode(a, end(40))
        rec.end_episode(b, end(25))
        c = record(rec, 3, 10, image=True)
    store = EpisodeStore.open(tmp_path / "s")
    assert [i.episode_id for i in store.episodes()] == [a, b, c]
    for eid, seed, n in ((a, 1, 40), (b, 2, 25), (c, 3, 10)):
        td = store.load(eid)
        check_steps(td, seed, n, image=True)
        assert td["obs", "rgb"].dtype.is_floating_point is False and td["obs", "rgb"].shape == (n, 16, 16, 3)
        assert store.info(eid).complete and store.info(eid).num_steps == n
    assert validate_store(store) == []


def test_missing_fields_take_their_fill(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        eid = rec.begin_episode(start(), fields())
        rec.put(eid, {"t_obs": 5, "obs/state": np.ones(31, np.float32)})
        rec.end_episode(eid, end(1))
    td = EpisodeStore.open(tmp_path / "s").load(eid)
    assert int(td["t_obs"][0]) == 5 and int(td["t_device"][0]) == -1
    assert bool(td["valid"][0]) and not bool(td["expert_valid"][0])
    assert td["expert_action"][0].isnan().all() and td["policy_confidence"][0].isnan()
    assert int(td["action_source"][0]) == ActionSource.UNKNOWN.code


def test_load_slices_and_field_subsets(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        eid = record(rec, 4, 30, window=(10, 20))
    td = store.load(eid, fields=["t_obs", "obs/state"], steps=slice(5, 15))
    assert set(td.keys(True, True)) == {"t_obs", ("obs", "state"), "label_mask", "label_target"}
    assert td.batch_size[0] == 10
    assert td["t_obs"].tolist() == [step(4, t)["t_obs"] for t in range(5, 15)]
    assert td["label_mask"].tolist() == [LabelMask.CONTEXT_ONLY.code] * 5 + [LabelMask.TRAINABLE.code] * 5
    picked = store.read_steps(eid, ["reward"], steps=[29, 0, 7])
    assert picked["reward"].tolist() == [29.0, 0.0, 7.0]
    with pytest.raises(StoreError, match="no field 'nope'"):
        store.load(eid, fields=["nope"])


def test_filters(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        e1 = record(rec, 1, 3, task="fetch_push", split=Split.TRAIN, policy_version="p1")
        e2 = record(rec, 2, 3, task="fetch_reach", mode=CollectionMode.EVAL, policy_version="p2")
        e3 = rec.begin_episode(start(task="fetch_push", operator="op7"), fields())
        rec.put(e3, step(3, 0))
    assert [i.episode_id for i in store.episodes(task_id="fetch_push")] == [e1, e3]
    assert [i.episode_id for i in store.episodes(mode="eval")] == [e2]
    assert [i.episode_id for i in store.episodes(split=Split.TRAIN)] == [e1]
    assert [i.episode_id for i in store.episodes(policy_version="p2")] == [e2]
    assert [i.episode_id for i in store.episodes(complete=False)] == [e3]
    assert [i.episode_id for i in store.episodes(operator="op7")] == [e3]
    assert [i.episode_id for i in store.episodes(end_reason=EndReason.INCOMPLETE)] == [e3]
    assert [i.episode_id for i in store.episodes(where=lambda i: i.num_steps == 3)] == [e1, e2]


def test_unended_episode_is_incomplete_never_complete(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(flush_interval_s=0.01) as rec:
        eid = rec.begin_episode(start(), fields())
        for t in range(12):
            rec.put(eid, step(5, t, source=ActionSource.HUMAN))
    info = EpisodeStore.open(tmp_path / "s").info(eid)
    assert not info.complete and info.end.end_reason == EndReason.INCOMPLETE and info.num_steps == 12
    store = EpisodeStore.open(tmp_path / "s", mode="a")
    td = store.load(eid)
    check_steps(td, 5, 12)
    assert (td["label_mask"] == LabelMask.EXCLUDED.code).all()  # uncommitted data never trains
    assert store.label_versions(eid) == []
    with pytest.raises(ContractError, match=f"episode {eid}: incomplete"):
        store.write_labels(eid, author="rev")


def test_label_v1_is_contract_derive_labels(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        eid = rec.begin_episode(start(mode=CollectionMode.DAGGER_SYNC), fields())
        for t in range(20):
            s = step(6, t, source=ActionSource.EXPERT if 5 <= t < 12 else ActionSource.POLICY)
            s["expert_valid"] = t != 8
            s["valid"] = t != 15
            rec.put(eid, s)
        w = human_window(eid, 5, 12).model_copy(update={"source": ActionSource.EXPERT})
        rec.end_episode(eid, end(20), windows=[w])
    raw = store.read_steps(eid, ["action_source", "valid", "step_flags", "expert_valid"])
    want = derive_labels(**raw, windows=[w], mode=CollectionMode.DAGGER_SYNC, operator="", policy_version="")
    layer = store.labels(eid)
    assert layer.version == 1 and layer.author == "recorder" and layer.windows == [w]
    np.testing.assert_array_equal(layer.mask, want.mask)
    np.testing.assert_array_equal(layer.target, want.target)
    assert layer.target[5] == LabelTarget.EXPERT_ACTION.code and layer.mask[8] != LabelMask.TRAINABLE.code
    assert layer.mask[15] == LabelMask.EXCLUDED.code


def test_label_layers_are_versions_never_overwrites(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 7, 30, window=(10, 20))
    raw_before = _files(path / "segments")
    store = EpisodeStore.open(path, mode="a")
    v1 = store.labels(eid)
    w = v1.windows[0]
    review = ReviewDecision(window_id=w.window_id, reviewer="r1", status=ReviewStatus.APPROVED)
    assert store.write_labels(eid, author="r1", reviews=[review]) == 2
    stricter = v1.mask.copy()
    stricter[15:20] = LabelMask.EXCLUDED.code
    assert store.write_labels(eid, author="r2", mask=stricter) == 3
    looser = v1.mask.copy()
    looser[0:3] = LabelMask.TRAINABLE.code  # policy steps outside the window: the hard rule forbids this
    with pytest.raises(ContractError, match="outside any correction window"):
        store.write_labels(eid, author="r3", mask=looser)
    with pytest.raises(ContractError, match="unknown window"):  # its review would point nowhere
        store.write_labels(eid, author="r4", windows=[])
    assert store.write_labels(eid, author="r4", windows=[], reviews=[]) == 4

    again = EpisodeStore.open(path)
    assert again.label_versions(eid) == [1, 2, 3, 4]
    np.testing.assert_array_equal(again.labels(eid, 1).mask, v1.mask)
    assert again.labels(eid, 2).reviews == [review] and again.labels(eid, 2).windows == [w]
    v3 = again.labels(eid, 3)
    assert v3.reviews == [review]  # carried over
    assert (v3.mask[10:15] == LabelMask.TRAINABLE.code).all() and (v3.target[15:20] == LabelTarget.NONE.code).all()
    assert (again.labels(eid).mask != LabelMask.TRAINABLE.code).all()  # v4: no window, nothing trainable
    assert (again.load(eid)["label_mask"].numpy() == again.labels(eid, 4).mask).all()
    assert _files(path / "segments") == raw_before  # raw data untouched by labelling
    assert validate_store(again) == []


def test_replay_check_is_a_label_layer_carried_over_and_read_back(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 7, 30, window=(10, 20))
        rec.begin_episode(start(), fields())  # never committed
    incomplete = next(i.episode_id for i in EpisodeStore.open(path).episodes(complete=False))
    store = EpisodeStore.open(path, mode="a")
    assert store.replay_check(eid) is None and store.replay_status(eid) == ReplayStatus.UNVERIFIED
    assert store.replay_status(incomplete) == ReplayStatus.UNVERIFIED
    check = ReplayCheck(status=ReplayStatus.REPLAY_MISMATCH, first_divergent_step=12, key="obs/state", error=0.5,
                        steps_checked=12, checked_with={"seed": 7})
    assert store.write_labels(eid, author="replay", replay=check) == 2
    w = store.labels(eid).windows[0]
    review = ReviewDecision(window_id=w.window_id, reviewer="r1", status=ReviewStatus.APPROVED)
    assert store.write_labels(eid, author="r1", reviews=[review]) == 3  # the replay check is carried over
    again = EpisodeStore.open(path)
    assert again.labels(eid, 1).replay is None
    assert again.labels(eid, 3).replay == check and again.replay_check(eid) == check
    assert again.replay_status(eid) == ReplayStatus.REPLAY_MISMATCH
    assert validate_store(again) == []
    with pytest.raises(ContractError, match="step 30, outside the episode's 30 steps"):
        store.write_labels(eid, author="replay", replay=check.model_copy(update={"first_divergent_step": 30}))
    with pytest.raises(ContractError, match="incomplete"):
        store.write_labels(incomplete, author="replay", replay=check)
    with pytest.raises(ValueError, match="needs first_divergent_step and key"):
        ReplayCheck(status=ReplayStatus.REPLAY_MISMATCH, key="obs/state")
    with pytest.raises(ValueError, match="only meaningful for replay_mismatch"):
        ReplayCheck(status=ReplayStatus.REPLAYABLE, first_divergent_step=3)


def test_a_layer_written_meanwhile_by_another_handle_is_merged_not_dropped(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 5, 20, window=(5, 10))
    replayer, reviewer = EpisodeStore.open(path, mode="a"), EpisodeStore.open(path, mode="a")
    assert replayer.labels(eid).version == 1  # its view of the layers is now stale
    w = reviewer.labels(eid).windows[0]
    review = ReviewDecision(window_id=w.window_id, reviewer="r1", status=ReviewStatus.APPROVED)
    assert reviewer.write_labels(eid, author="r1", reviews=[review]) == 2
    check = ReplayCheck(status=ReplayStatus.REPLAYABLE, steps_checked=20)
    assert replayer.write_labels(eid, author="replay", replay=check) == 3
    latest = EpisodeStore.open(path).labels(eid)
    assert latest.version == 3 and latest.reviews == [review] and latest.replay == check


def test_validate_names_a_replay_check_outside_its_episode(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        eid = record(rec, 3, 10)
    store = EpisodeStore.open(path, mode="a")
    check = ReplayCheck(status=ReplayStatus.REPLAY_MISMATCH, first_divergent_step=4, key="obs/state", error=1.0)
    v = store.write_labels(eid, author="replay", replay=check)
    layer = path / "labels" / eid / f"v{v}.json"
    data = json.loads(layer.read_text())
    data["replay"]["first_divergent_step"] = 40  # written by something that skipped write_labels' checks
    layer.write_text(json.dumps(data))
    problems = [str(p) for p in validate_store(EpisodeStore.open(path))]
    assert problems == [f"episode {eid} step 40 field 'replay': label layer v{v}: replay check diverges at step 40, "
                        "outside the episode's 10 steps"]
    data["replay"]["status"] = "maybe"
    layer.write_text(json.dumps(data))
    problems = [str(p) for p in validate_store(EpisodeStore.open(path))]
    assert len(problems) == 1 and f"label layer {v} is corrupt" in problems[0] and "status" in problems[0]


def test_committed_segments_are_never_rewritten(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        record(rec, 1, 20, image=True)
    first = _files(path / "segments")
    store = EpisodeStore.open(path, mode="a")
    with store.recorder() as rec:
        record(rec, 2, 20, image=True)
    after = _files(path / "segments")
    assert {k: after[k] for k in first} == first
    assert len(EpisodeStore.open(path).segments) == 2


def test_write_labels_rejects_foreign_windows_and_reviews(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        eid = record(rec, 1, 10)
        other = record(rec, 2, 10)
    with pytest.raises(ContractError, match=f"belongs to episode {other}"):
        store.write_labels(eid, author="r", windows=[human_window(other, 1, 3)])
    with pytest.raises(ContractError, match="outside the episode"):
        store.write_labels(eid, author="r", windows=[human_window(eid, 5, 11)])
    with pytest.raises(ContractError, match="unknown window"):
        store.write_labels(eid, author="r", reviews=[ReviewDecision(window_id="x", reviewer="r", status="approved")])
    with pytest.raises(StoreError, match="read-only"):
        EpisodeStore.open(tmp_path / "s").write_labels(eid, author="r")


def test_fsspec_memory_url_and_file_url(tmp_path):
    for url in ("memory://hg-dagger-test-store", f"file://{tmp_path}/viafile"):
        store = EpisodeStore.create(url)
        with store.recorder() as rec:
            eid = record(rec, 9, 15, image=True, window=(3, 6))
        again = EpisodeStore.open(url)
        check_steps(again.load(eid), 9, 15, image=True)
        assert again.labels(eid).mask[4] == LabelMask.TRAINABLE.code
        assert EpisodeStore.open(url, mode="a").write_labels(eid, author="r", windows=[]) == 2
        assert validate_store(again) == []


def test_open_errors_name_the_path(tmp_path):
    with pytest.raises(StoreError, match="no episode store"):
        EpisodeStore.open(tmp_path / "missing")
    zarr.open_group(tmp_path / "plain", mode="w")
    with pytest.raises(StoreError, match="not an hg-dagger episode store"):
        EpisodeStore.open(tmp_path / "plain")
    EpisodeStore.create(tmp_path / "s")
    with pytest.raises(StoreError, match="already exists"):
        EpisodeStore.create(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "zarr.json").read_text())
    meta["attributes"]["hg_dagger"]["schema_version"] = "0.3"
    (tmp_path / "s" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"schema_version '0.3' is not supported"):
        EpisodeStore.open(tmp_path / "s")
    (tmp_path / "s" / "zarr.json").write_text('{"zarr_format": 3, "node_ty')  # truncated
    with pytest.raises(StoreError, match=str(tmp_path / "s")):
        EpisodeStore.open(tmp_path / "s")


def test_iter_batches_covers_every_step_once(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    n_steps = [12, 30, 7, 25]
    with store.recorder() as rec:
        ids = [record(rec, i, n, window=(2, 6)) for i, n in enumerate(n_steps)]
    seen = []
    for batch in store.iter_batches(16, fields=["obs/state", "t_obs"], seed=0, block_rows=20):
        assert batch.batch_size[0] <= 16
        for ei, s, state in zip(batch["episode_index"].tolist(), batch["step"].tolist(), batch["obs", "state"], strict=True):
            np.testing.assert_array_equal(state.numpy(), step(ei, s)["obs/state"])
            seen.append((ei, s))
    assert sorted(seen) == [(i, s) for i, n in enumerate(n_steps) for s in range(n)]
    trainable = [b for b in store.iter_batches(5, trainable_only=True, shuffle=False)]
    steps = sorted((e, s) for b in trainable for e, s in zip(b["episode_index"].tolist(), b["step"].tolist(), strict=True))
    assert steps == [(i, s) for i in range(4) for s in range(2, 6)]
    assert all((b["label_mask"] == LabelMask.TRAINABLE.code).all() for b in trainable)
    assert sum(b.batch_size[0] for b in store.iter_batches(16, episodes=ids[:1], drop_last=True)) == 0


def test_many_episodes_share_few_files(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder(flush_interval_s=0.05) as rec:
        for i in range(300):
            record(rec, i, 5)
    files = sum(1 for p in path.rglob("*") if p.is_file())
    assert files < 100, files  # not one file (or thirty) per episode
    assert len(EpisodeStore.open(path).episodes(complete=True)) == 300


def test_duplicate_episode_id_is_refused(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        eid = record(rec, 1, 2)
    with store.recorder() as rec:
        with pytest.raises(ContractError, match=f"episode {eid}: episode_id already used"):
            rec.begin_episode(start(episode_id=eid), fields())


class _KeyLog(zarr.storage.WrapperStore):
    """A real LocalStore that also notes (key, bytes) of every write, in order: what a reader killed at any point
    between two writes would see."""

    def __init__(self, store, written: list):
        super().__init__(store)
        self.written = written

    async def set(self, key, value):
        self.written.append((key, value.to_bytes()))
        await self._store.set(key, value)

    async def set_if_not_exists(self, key, value):
        self.written.append((key, value.to_bytes()))
        await self._store.set_if_not_exists(key, value)


def test_a_new_segment_gets_its_attributes_only_after_every_array(tmp_path):
    from hg_dagger.store.layout import SEGMENT_ATTR
    from hg_dagger.store.segment import SegmentWriter

    EpisodeStore.create(tmp_path / "s")
    written: list = []
    root = zarr.open_group(_KeyLog(zarr.storage.LocalStore(tmp_path / "s"), written), mode="r+")
    seg = SegmentWriter(root, fields(image=True))
    prefix = f"segments/{seg.segment_id}/"
    arrays = {k for k, _ in written if k.startswith(prefix) and k.endswith("/zarr.json") and k != prefix + "zarr.json"}
    assert {prefix + "log/zarr.json", prefix + "rows/episode/zarr.json", prefix + "data/obs/rgb/zarr.json"} <= arrays
    group_writes = [i for i, (k, _) in enumerate(written) if k == prefix + "zarr.json"]
    with_attr = [i for i in group_writes if SEGMENT_ATTR in json.loads(written[i][1]).get("attributes", {})]
    last_array = max(i for i, (k, _) in enumerate(written) if k in arrays)
    assert with_attr and min(with_attr) > last_array  # a kill at any earlier point leaves an uncommitted group
    assert EpisodeStore.open(tmp_path / "s").segments == [seg.segment_id]


def test_a_first_layer_another_handle_wrote_is_found_though_this_handle_listed_before(tmp_path):
    path = tmp_path / "s"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        a = record(rec, 0, 20, window=(5, 10))
        b = record(rec, 1, 20, window=(5, 10))
    mine, other = EpisodeStore.open(path, mode="a"), EpisodeStore.open(path, mode="a")
    assert mine.write_labels(a, author="me") == 2  # mine now knows which episodes have layer files: a only
    w = other.labels(b).windows[0]
    review = ReviewDecision(window_id=w.window_id, reviewer="r1", status=ReviewStatus.APPROVED)
    assert other.write_labels(b, author="r1", reviews=[review]) == 2
    check = ReplayCheck(status=ReplayStatus.REPLAYABLE, steps_checked=20)
    assert mine.write_labels(b, author="replay", replay=check) == 3  # takes the next number, keeps the review
    latest = EpisodeStore.open(path).labels(b)
    assert latest.version == 3 and latest.reviews == [review] and latest.replay == check
    assert EpisodeStore.open(path).label_versions(a) == [1, 2]


def test_a_regular_file_is_no_store_and_says_so(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    for call in (lambda: EpisodeStore.open(f), lambda: EpisodeStore.open(f, mode="a"), lambda: EpisodeStore.create(f)):
        with pytest.raises(StoreError, match=f"{f}: is a file, not an episode store"):
            call()
    assert f.read_text() == "hello"


def test_a_wrong_root_format_is_named_as_such(tmp_path):
    path = tmp_path / "s"
    EpisodeStore.create(path)
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["hg_dagger"]["format"] = "someone_else.store"
    (path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"hg_dagger.format is 'someone_else.store', expected "
                                         r"'hg_dagger.episode_store'") as err:
        EpisodeStore.open(path)
    assert "missing" not in str(err.value)
    meta["attributes"]["hg_dagger"] = ["not", "a", "mapping"]
    (path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="root attribute 'hg_dagger' is not a mapping"):
        EpisodeStore.open(path)
