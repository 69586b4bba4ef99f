"""Asking a served policy ahead: against a real slow policy server (tests/policy/served_clock.py, a child process
whose actions say which step they are for), a paced loop does not wait while actions are left; a chunk asked ahead
is aligned to the steps it is executed at; a drop while a request is in flight never executes that request's chunk;
a wait is recorded (late, and the session's step flag latency_exceeded). Assertions are on counts and on the actions'
stamps, not on measured times."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hg_dagger.contract.enums import EventKind, StepFlag
from hg_dagger.control.build import build_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.errors import ConfigError
from hg_dagger.policy import PolicyOptions, RemotePolicy
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = pytest.mark.subprocess


def _obs(mapping, n: int, t: int) -> dict[str, np.ndarray]:
    """An observation stamped with tick ``t`` (the clock server reads it back from observation.state)."""
    return {k: np.full((n, *shape), t, dtype) for k, (shape, dtype) in mapping.obs_spec().items()}


def _loop(remote, mapping, ticks: int, n: int = 1, period: float = 0.0, sleeps=None):
    """``ticks`` ticks of act() at ``period`` seconds (25 Hz: 0.04), or with the given sleeps after each tick."""
    outs = []
    due = time.perf_counter()
    for t in range(ticks):
        out = remote.act(_obs(mapping, n, t))
        outs.append((t, out, remote.waited.copy(), remote.late.copy(), remote.chunk_index.copy()))
        due += period if sleeps is None else sleeps[t]
        time.sleep(max(0.0, due - time.perf_counter()))
    return outs


@pytest.mark.parametrize("ask_ahead", [0, 8])
def test_a_paced_loop_waits_only_without_asking_ahead(mapping, clock_server, ask_ahead):
    delay = 0.15  # the reply takes 150 ms; asked 8 actions ahead it has 9 ticks (360 ms at 25 Hz) to come
    url = clock_server(delay, chunk=20, steps=10)
    with RemotePolicy(url, mapping, PolicyOptions(ask_ahead=ask_ahead)) as remote:
        remote.reset_rows([0], 1)
        outs = _loop(remote, mapping, 50, period=0.04)
        for t, out, *_ in outs:
            assert out.action[0, 0] == t, "every step acts on what the policy proposed for that step"
        waited = [t for t, _, w, _, _ in outs if w[0]]
        assert all(out.inference_ns >= delay * 1e9 for t, out, w, _, _ in outs if w[0])  # a wait is a real wait
        if ask_ahead:
            assert waited == [0] and remote.late_count == 0, "only the first chunk was waited for"
            assert remote.requests >= 5
        else:
            assert waited == [0, 10, 20, 30, 40] and remote.wait_count == 5 and remote.late_count == 0


@pytest.mark.parametrize("batch", [True, False])
def test_a_chunk_asked_ahead_is_aligned_to_the_steps_it_is_executed_at(mapping, clock_server, batch):
    url = clock_server(0.03, chunk=12, steps=6, batch=batch)
    sleeps = np.random.default_rng(0).choice([0.0, 0.01, 0.05], size=60)  # replies come after varying ticks
    with RemotePolicy(url, mapping, PolicyOptions(ask_ahead=3)) as remote:
        remote.reset_rows([0, 1], 2)
        outs = _loop(remote, mapping, 60, n=2, sleeps=sleeps)
    skipped = 0
    for t, out, _waited, _late, index in outs:
        step, seen = out.action[:, 0], out.action[:, 1]
        np.testing.assert_array_equal(step, [t, t])  # the action proposed for this very step
        np.testing.assert_array_equal(index, t - seen)  # its index in a chunk computed at tick `seen`
        skipped += int(((index > 0) & (t - seen == index)).sum())
    assert skipped > 0 and remote.requests > 2 * 60 // 6 * (1 if batch else 2) * 0.5


def test_a_reply_with_no_action_left_for_the_tick_is_late_and_the_row_asks_afresh(mapping, clock_server):
    url = clock_server(0.0, chunk=3, steps=3)  # asked 2 ahead, its reply's actions are all for ticks already past
    with RemotePolicy(url, mapping, PolicyOptions(ask_ahead=2)) as remote:
        remote.reset_rows([0], 1)
        outs = _loop(remote, mapping, 9)
    starts = [(t, late[0]) for t, out, _w, late, _i in outs if out.action[0, 1] == t]
    assert starts == [(0, False), (3, True), (6, True)]  # each later chunk: fresh on its own tick, flagged late
    assert all(out.action[0, 0] == t for t, out, *_ in outs)


def test_a_drop_while_a_request_is_in_flight_never_executes_its_chunk(mapping, clock_server):
    url = clock_server(0.3, chunk=20, steps=10, batch=True)
    with RemotePolicy(url, mapping, PolicyOptions(ask_ahead=5)) as remote:
        remote.reset_rows([0, 1], 2)
        before = _loop(remote, mapping, 5, n=2)  # tick 4 leaves 5 actions: the next request goes out on its obs
        dropped = remote.drop_chunks([1])  # a handover in row 1 while that request is in flight
        assert dropped == {1: {"chunk_id": 2, "actions_dropped": 5, "request_discarded": True}}
        after = []
        for t in range(5, 30):
            out = remote.act(_obs(mapping, 2, t))
            after.append((t, out.action.copy(), remote.waited.copy()))
    seen0 = {int(a[0, 1]) for _, a, _ in after}
    seen1 = {int(a[1, 1]) for _, a, _ in after}
    assert 4 in seen0, "row 0 went on with the chunk asked at tick 4"
    assert 4 not in seen1 and min(seen1) == 5, "row 1 never executed it: its next chunk was computed at tick 5"
    assert after[0][2].tolist() == [False, True] and all(a[0, 0] == t == a[1, 0] for t, a, _ in after)
    assert len(before) == 5


def test_a_session_records_late_steps_and_chunk_drops(mapping, clock_server, tmp_path):
    url = clock_server(0.05, chunk=8, steps=4)  # unpaced ticks take a few ms: a reply asked 1 ahead is always late
    gates = tmp_path / "gates.yaml"
    gates.write_text("kind: gates\nname: stall\ntask: toy_reach\ngates:\n"
                     "  - {type: progress_stall, warn: 0.3, trigger: 0.5, min_delta: 0.03}\n")
    cfg = load_run_config(None, "toy_reach", episodes=2, num_envs=1, gates=str(gates), calibrate_steps=0,
                          max_episode_steps=100)
    store = EpisodeStore.create(tmp_path / "s.zarr")
    rec = store.recorder(flush_interval_s=0.05)
    with RemotePolicy(url, mapping, PolicyOptions(ask_ahead=1)) as remote:
        session = build_session(cfg, rec, remote)
        try:
            summary = session.run(2, progress=False)
        finally:
            rec.close()
            session.env.close()
        late = remote.late_count
    store = EpisodeStore.open(tmp_path / "s.zarr")
    assert validate_store(store) == []
    flagged = 0
    notes = []
    for info in store.episodes():
        d = store.read_steps(info.episode_id, ["step_flags", "chunk_index"])
        is_late = (d["step_flags"] & StepFlag.LATENCY_EXCEEDED) != 0
        flagged += int(is_late.sum())
        assert (d["chunk_index"][is_late] == 2).all()  # sent with 1 action left: 2 actions were for ticks past
        notes += [e for e in info.end.events if e.kind == EventKind.NOTE and e.reason.startswith("chunk dropped")]
    assert 1 <= flagged <= late
    assert summary.context_switches >= 1, "the stalled arm was taken over"
    assert any(n.reason == "chunk dropped at handover" for n in notes)
    assert all({"chunk_id", "actions_dropped", "request_discarded"} <= set(n.values) for n in notes)


def test_a_negative_ask_ahead_is_one_line():
    with pytest.raises(ConfigError, match="--policy-ask-ahead must be >= 0 or auto, got -1"):
        PolicyOptions(ask_ahead=-1)
