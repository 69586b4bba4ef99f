"""Recorder behaviour: back-pressure (drop is counted and recorded, block loses nothing), bad steps, misuse."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.store import check_steps, end, fields, human_window, record, start, step

from hg_dagger.contract import ActionSource, EventKind, LabelMask
from hg_dagger.contract.schema import Event
from hg_dagger.errors import ContractError
from hg_dagger.store import EpisodeStore, validate_store


def test_drop_policy_counts_and_records_every_dropped_step(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder(queue_steps=1, on_full="drop", flush_interval_s=0.2)
    eid = rec.begin_episode(start(), fields())
    n = 0
    while rec.stats.dropped_steps == 0 or n < 50:  # a one-slot queue overflows as soon as puts outrun the writer
        rec.put(eid, step(1, n, source=ActionSource.HUMAN))
        n += 1
        assert n < 100_000
    rec.end_episode(eid, end(n), windows=[human_window(eid, 0, n)])
    rec.close()
    dropped = rec.stats.dropped_steps
    assert rec.stats.queued_steps + dropped == n

    store = EpisodeStore.open(tmp_path / "s")
    info = store.info(eid)
    assert info.complete and info.num_steps == n and info.end.dropped_steps == dropped
    assert "dropped_steps" in info.end.quality_flags
    ev = [e for e in info.end.events if e.kind == EventKind.DROPPED_STEPS]
    assert len(ev) == 1 and ev[0].values["count"] == dropped
    td = store.load(eid)
    invalid = np.flatnonzero(~td["valid"].numpy())
    assert len(invalid) == dropped and sorted(ev[0].values["steps"]) == invalid.tolist()
    kept = np.flatnonzero(td["valid"].numpy())
    assert td["t_obs"].numpy()[kept].tolist() == [step(1, t)["t_obs"] for t in kept]  # numbering kept
    assert (td["label_mask"].numpy()[invalid] == LabelMask.EXCLUDED.code).all()
    assert (td["label_mask"].numpy()[kept] == LabelMask.TRAINABLE.code).all()
    assert validate_store(store) == []


def test_block_policy_loses_nothing(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(queue_steps=2, on_full="block", flush_interval_s=0.2) as rec:
        eid = record(rec, 2, 300)
    assert rec.stats.dropped_steps == 0 and rec.stats.written_steps == 300
    check_steps(EpisodeStore.open(tmp_path / "s").load(eid), 2, 300)


def test_bad_shape_names_episode_step_and_field(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder(flush_interval_s=0.01)
    eid = rec.begin_episode(start(), fields())
    good = record(rec, 9, 4)
    for t in range(5):
        rec.put(eid, step(3, t))
    bad = step(3, 5)
    bad["applied_action"] = np.zeros(3, np.float32)
    rec.put(eid, bad)
    with pytest.raises(ContractError, match=rf"episode {eid} step 5: field 'applied_action' expected shape \(4,\)"):
        t, deadline = 6, time.monotonic() + 60
        while time.monotonic() < deadline:  # raises as soon as the writer has seen the bad step
            rec.put(eid, step(3, t))
            t += 1
            time.sleep(0.001)  # a loaded machine may not run the writer thread during a burst of puts
    rec.close()  # already reported: close does not raise it again
    store = EpisodeStore.open(tmp_path / "s")
    info = store.info(eid)
    assert not info.complete and info.num_steps == 5  # the good prefix is kept, never presented as complete
    check_steps(store.load(eid), 3, 5)
    assert store.info(good).complete


def test_bad_dtype_is_reported_at_close(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder()
    eid = rec.begin_episode(start(), fields())
    s = step(1, 0)
    s["terminated"] = 0.5  # a float where a bool belongs
    rec.put(eid, s)
    with pytest.raises(ContractError, match=f"episode {eid} step 0: field 'terminated'"):
        rec.close()
    assert not EpisodeStore.open(tmp_path / "s").info(eid).complete


def test_a_ragged_value_poisons_its_episode_not_the_recorder(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder()
    eid = rec.begin_episode(start(), fields())
    s = step(1, 0)
    s["applied_action"] = [1.0, [2.0, 3.0]]  # no array at all
    rec.put(eid, s)
    with pytest.raises(ContractError, match=f"episode {eid} step 0: field 'applied_action' .* got a list that is no array"):
        rec.close()
    assert not EpisodeStore.open(tmp_path / "s").info(eid).complete


def test_misuse_is_refused_with_the_episode_named(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        with pytest.raises(ContractError, match="episode nope: not begun"):
            rec.put("nope", step(0, 0))
        eid = record(rec, 1, 3)
        with pytest.raises(ContractError, match=f"episode {eid}: already ended"):
            rec.put(eid, step(1, 3))
        other = rec.begin_episode(start(), fields())
        rec.put(other, step(2, 0))
        with pytest.raises(ContractError, match="parent_episode_id"):
            rec.end_episode(other, end(1), windows=[human_window(eid, 0, 1)])
        with pytest.raises(ContractError, match="ends at step 5 > 1 steps"):
            rec.end_episode(other, end(1), windows=[human_window(other, 0, 5)])
    with pytest.raises(ValueError, match="on_full"):
        store.recorder(on_full="spill")


def test_events_survive_with_and_without_a_commit(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(flush_interval_s=0.01) as rec:
        done = rec.begin_episode(start(), fields())
        cut = rec.begin_episode(start(), fields())
        for eid in (done, cut):
            rec.put(eid, step(1, 0))
            rec.event(eid, Event(kind=EventKind.GATE_TRIGGER, step=0, t_ns=1, reason="uncertainty"))
        rec.end_episode(done, end(1))
    store = EpisodeStore.open(tmp_path / "s")
    for eid in (done, cut):
        kinds = [e.kind for e in store.info(eid).end.events]
        assert kinds == [EventKind.GATE_TRIGGER]
    assert store.info(done).complete and not store.info(cut).complete


def test_put_returns_immediately_with_a_stalled_writer(tmp_path):
    """put() hands over without touching the disk: with the queue full it drops instead of waiting."""
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder(queue_steps=4, on_full="drop", flush_interval_s=10)
    eid = rec.begin_episode(start(), fields(image=True))
    results = [rec.put(eid, step(1, t, image=True)) for t in range(2000)]
    rec.end_episode(eid, end(2000))
    rec.close()
    assert results.count(False) == rec.stats.dropped_steps > 0
    assert EpisodeStore.open(tmp_path / "s").info(eid).end.dropped_steps == results.count(False)
