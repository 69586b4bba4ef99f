"""Recorder.put_rows: one step of k episodes as (k, ...) columns stores exactly what k put() calls store."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.store import end, fields, start, step

from hg_dagger.contract import ActionSource, EventKind
from hg_dagger.errors import ContractError
from hg_dagger.store import EpisodeStore, validate_store

LENGTHS = {1: 40, 2: 25, 3: 33}  # episodes of different lengths: the batches shrink as episodes end


def _columns(steps: list[dict]) -> dict[str, np.ndarray]:
    names = set().union(*steps)
    return {name: np.stack([s[name] for s in steps]) for name in names if all(name in s for s in steps)}


def _source(seed: int, t: int) -> ActionSource:
    return ActionSource.HUMAN if seed == 2 and 5 <= t < 12 else ActionSource.POLICY


def _record(store, *, rows: bool, image: bool) -> dict[int, str]:
    with store.recorder(flush_interval_s=0.01) as rec:
        spec = fields(image)
        eids = {seed: rec.begin_episode(start(), spec) for seed in LENGTHS}
        for t in range(max(LENGTHS.values())):
            live = [seed for seed, n in LENGTHS.items() if t < n]
            steps = [step(seed, t, image=image, source=_source(seed, t)) for seed in live]
            if rows:
                cols = _columns(steps)
                if any("human_command" in s for s in steps):  # a column some rows lack: the rest take its fill
                    cols["human_command"] = np.stack([s.get("human_command", np.full(7, np.nan, np.float32))
                                                      for s in steps])
                assert rec.put_rows([eids[seed] for seed in live], cols)
            else:
                for seed, s in zip(live, steps, strict=True):
                    assert rec.put(eids[seed], s)
            for seed in live:
                if t == LENGTHS[seed] - 1:
                    rec.end_episode(eids[seed], end(LENGTHS[seed]))
            if t % 7 == 0:
                time.sleep(0.02)  # let flushes fall between steps, so episodes span several
    return eids


@pytest.mark.parametrize("image", [False, True], ids=["state", "camera"])
def test_put_rows_stores_what_put_stores(tmp_path, image):
    one = EpisodeStore.create(tmp_path / "put")
    many = EpisodeStore.create(tmp_path / "rows")
    by_put, by_rows = _record(one, rows=False, image=image), _record(many, rows=True, image=image)
    one, many = EpisodeStore.open(tmp_path / "put"), EpisodeStore.open(tmp_path / "rows")
    names = list(fields(image))
    for seed, n in LENGTHS.items():
        a, b = one.info(by_put[seed]), many.info(by_rows[seed])
        assert a.complete and b.complete and a.num_steps == b.num_steps == n
        got, want = many.read_steps(by_rows[seed], names), one.read_steps(by_put[seed], names)
        for name in names:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"seed {seed} field {name}")
        np.testing.assert_array_equal(many.load(by_rows[seed])["label_mask"].numpy(),
                                      one.load(by_put[seed])["label_mask"].numpy())
    assert validate_store(many) == []


def test_a_bad_column_poisons_the_episodes_of_its_batch_and_keeps_their_steps_before(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder(flush_interval_s=0.01)
    a, b, other = (rec.begin_episode(start(), fields()) for _ in range(3))
    for t in range(5):
        rec.put_rows([a, b], _columns([step(1, t), step(2, t)]))
        rec.put(other, step(3, t))
    bad = _columns([step(1, 5), step(2, 5)])
    bad["applied_action"] = np.zeros((2, 3), np.float32)
    rec.put_rows([a, b], bad)
    with pytest.raises(ContractError, match=rf"episode {a} step 5: field 'applied_action' expected shape \(4,\)"):
        t, deadline = 6, time.monotonic() + 60
        while time.monotonic() < deadline:  # raises as soon as the writer has seen the bad batch
            rec.put_rows([a, b], _columns([step(1, t), step(2, t)]))
            t += 1
            time.sleep(0.001)
    with pytest.raises(ContractError, match=f"episode {b} step 5: field 'applied_action'"):
        rec.put_rows([b], _columns([step(2, 99)]))
    rec.end_episode(other, end(5))
    rec.close()
    store = EpisodeStore.open(tmp_path / "s")
    for eid, seed in ((a, 1), (b, 2)):
        info = store.info(eid)
        assert not info.complete and info.num_steps == 5
        kept = store.read_steps(eid, ["t_obs"])["t_obs"]
        assert kept.tolist() == [step(seed, t)["t_obs"] for t in range(5)]
    assert store.info(other).complete


def test_batches_dropped_on_a_full_queue_become_invalid_rows_and_one_event(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    rec = store.recorder(queue_steps=2, on_full="drop", flush_interval_s=10)  # the writer drains, never flushes
    a, b = rec.begin_episode(start(), fields()), rec.begin_episode(start(), fields())
    accepted = [rec.put_rows([a, b], _columns([step(1, t), step(2, t)])) for t in range(300)]
    rec.end_episode(a, end(300))
    rec.end_episode(b, end(300))
    rec.close()
    dropped = accepted.count(False)
    assert dropped > 0 and rec.stats.dropped_steps == 2 * dropped and rec.stats.queued_steps == 2 * (300 - dropped)
    store = EpisodeStore.open(tmp_path / "s")
    for eid, seed in ((a, 1), (b, 2)):
        info = store.info(eid)
        assert info.complete and info.num_steps == 300 and info.end.dropped_steps == dropped
        [ev] = [e for e in info.end.events if e.kind == EventKind.DROPPED_STEPS]
        d = store.read_steps(eid, ["valid", "t_obs"])
        lost = [t for t, ok in enumerate(accepted) if not ok]
        assert np.flatnonzero(~d["valid"]).tolist() == sorted(ev.values["steps"]) == lost
        kept = np.flatnonzero(d["valid"])
        assert d["t_obs"][kept].tolist() == [step(seed, t)["t_obs"] for t in kept]
    assert validate_store(store) == []


def test_put_and_put_rows_may_alternate_within_an_episode(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(flush_interval_s=0.01) as rec:
        a, b = rec.begin_episode(start(), fields()), rec.begin_episode(start(), fields())
        for t in range(30):
            if t % 3:
                rec.put_rows([a, b], _columns([step(1, t), step(2, t)]))
            else:
                rec.put(a, step(1, t))
                rec.put(b, step(2, t))
        rec.end_episode(a, end(30))
        rec.end_episode(b, end(30))
    store = EpisodeStore.open(tmp_path / "s")
    for eid, seed in ((a, 1), (b, 2)):
        d = store.read_steps(eid, ["t_obs", "obs/state"])
        assert d["t_obs"].tolist() == [step(seed, t)["t_obs"] for t in range(30)]
        np.testing.assert_array_equal(d["obs/state"], np.stack([step(seed, t)["obs/state"] for t in range(30)]))


def test_put_rows_refuses_episodes_of_different_fields_and_names_them(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder() as rec:
        a, b = rec.begin_episode(start(), fields()), rec.begin_episode(start(), fields(state_dim=5))
        with pytest.raises(ContractError, match=f"episode {b}: put_rows needs episodes begun with the same fields"):
            rec.put_rows([a, b], {})
        with pytest.raises(ContractError, match="episode nope: not begun"):
            rec.put_rows([a, "nope"], {})
        for eid in (a, b):
            rec.end_episode(eid, end(0))


def test_put_rows_of_the_same_rows_refuses_an_episode_ended_since_the_last_call(tmp_path):
    store = EpisodeStore.create(tmp_path / "s")
    with store.recorder(flush_interval_s=0.01) as rec:
        a, b = (rec.begin_episode(start(), fields()) for _ in range(2))
        rows = [a, b]
        for t in range(3):  # the same row set tick after tick
            assert rec.put_rows(rows, _columns([step(1, t), step(2, t)]))
        rec.end_episode(a, end(3))
        with pytest.raises(ContractError, match=f"episode {a}: already ended"):
            rec.put_rows(rows, _columns([step(1, 3), step(2, 3)]))
        assert rec.put_rows([b], _columns([step(2, 3)]))  # the episode left open takes its next step
        rec.end_episode(b, end(4))
    store = EpisodeStore.open(tmp_path / "s")
    assert [store.info(e).num_steps for e in (a, b)] == [3, 4]
    assert store.info(a).complete and store.info(b).complete
