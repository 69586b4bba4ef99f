"""A policy server that dies while the live loop runs: the open episode ends as a safety stop naming the server,
the loop keeps going and offers to reconnect; once the server is back on the same address, ReconnectPolicy opens
it again and the next episodes run on it."""

from __future__ import annotations

import time

import pytest

from hg_dagger.contract.enums import EndReason, EventKind
from hg_dagger.control import live
from hg_dagger.control.build import open_session
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]


def wait(loop, predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = loop.slot.read()
        if predicate(snap):
            return snap
        time.sleep(0.02)
    raise AssertionError(f"timed out; last snapshot: phase {snap.phase}, message {snap.message!r}")


def test_a_dead_server_ends_the_episode_and_the_loop_offers_to_reconnect(tmp_path, student_pt, serve_process):
    server = serve_process(student_pt, "--task", "toy_reach")
    port = server.url.rsplit(":", 1)[1]
    store = str(tmp_path / "s.zarr")
    cfg = load_run_config(None, "toy_reach", calibrate_steps=0)
    loop = ControlLoop(lambda: open_session(cfg, store, policy=server.url), view_size=0).start()
    try:
        wait(loop, lambda s: s.phase == "idle" and not s.loading)
        loop.commands.put(live.StartEpisodes(20))
        first = wait(loop, lambda s: s.phase == "running" and s.episode_step >= 5)
        server.stop()  # the server dies mid-episode
        lost = wait(loop, lambda s: bool(s.policy_lost))
        assert server.url in lost.policy_lost and "Reconnect policy" in lost.message
        assert lost.phase != "error"  # the loop goes on; nothing moves

        loop.commands.put(live.ReconnectPolicy())  # still down: refused in one line, the offer stays
        refused = wait(loop, lambda s: "cannot reach" in s.message)
        assert refused.policy_lost
        loop.commands.put(live.StartEpisodes(1))  # Start reconnects first: still down, so nothing starts
        time.sleep(0.5)
        still = wait(loop, lambda s: "cannot reach" in s.message and s.seq > refused.seq + 3)
        assert still.policy_lost and still.episode_id is None

        again = serve_process(student_pt, "--task", "toy_reach", "--port", port)
        assert again.url == server.url
        loop.commands.put(live.StartEpisodes(1))  # reconnects, then starts
        back = wait(loop, lambda s: not s.policy_lost and "reconnected" in s.message)
        wait(loop, lambda s: s.phase == "running" and s.episode_id not in (None, first.episode_id)
             and s.episode_step >= 5)
        assert back.policy_version == first.policy_version  # the same student behind the same address
    finally:
        loop.stop()
    st = EpisodeStore.open(store)
    assert validate_store(st) == []
    ended = st.info(first.episode_id)
    assert ended.end.end_reason == EndReason.SAFETY_STOP
    notes = [e for e in ended.end.events if e.kind == EventKind.NOTE and e.values.get("policy_lost")]
    assert notes and server.url in notes[0].reason
    assert len(list(st.episodes())) >= 2
