"""Rewind and correct: the person takes a simulated robot back to before the gate asked and corrects from there, in
a branch episode bound to the attempt it came from, which replays like any other episode."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.enums import ActionSource, ControlState, EndReason, EventKind
from hg_dagger.control.build import open_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import make_env
from hg_dagger.envs.rewind import restore_row, why_not_rewindable
from hg_dagger.errors import HgDaggerError
from hg_dagger.review.replay import replay_store
from hg_dagger.store import EpisodeStore, validate_store

REQUESTED = ControlState.HANDOVER_REQUESTED.code


def test_restoring_a_row_re_runs_its_actions_and_leaves_the_other_rows_alone():
    with make_env("toy_reach", num_envs=3, seed=0) as env:
        assert why_not_rewindable(env) == ""
        obs, _ = env.reset(seed=[7, 8, 9])
        rng = np.random.default_rng(0)
        actions = rng.uniform(-1, 1, (12, 3, env.action_dim)).astype(np.float32)
        seen = []
        for a in actions:
            seen.append(obs["ee_pos"].copy())
            obs = env.step(a).obs
        others = obs["ee_pos"][[0, 2]].copy()
        back, _ = restore_row(env, 1, 8, actions[:5, 1])  # row 1 back to its step 5
        np.testing.assert_allclose(back["ee_pos"][1], seen[5][1], atol=1e-6)
        np.testing.assert_array_equal(back["ee_pos"][[0, 2]], others)


def test_a_person_rewinds_a_request_and_corrects_from_before_it(tmp_path):
    store = tmp_path / "s.zarr"
    cfg = load_run_config(None, "toy_reach", num_envs=2, calibrate_steps=0,
                          **{"handover.wait": "pause", "operator.reaction_delay_steps": 25})
    s = open_session(cfg, str(store))
    branch = None
    try:
        s.start(4)
        for _ in range(3000):
            s.tick()
            waiting = np.flatnonzero((s.machine.state == REQUESTED) & (s.ep_step > 10))
            if waiting.size and branch is None:
                r = int(waiting[0])
                parent, asked_at = s.eids[r], int(s.machine.open[r].parent_step)
                back = s.rewind(r, 0.2)  # 5 steps at 25 Hz
                assert back == asked_at - 5
                assert s.machine.state[r] == REQUESTED and s.eids[r] != parent  # the branch waits for the person
                branch = (s.eids[r], parent, back)
            if not s.running:
                break
        assert branch is not None, "no request to rewind"
        while s.running:
            s.tick()
    finally:
        s.rec.close()
        s.env.close()
    st = EpisodeStore.open(str(store))
    assert validate_store(st) == []
    eid, parent, back = branch
    p_info = st.info(parent)
    assert p_info.end.end_reason == EndReason.OPERATOR_ABORT and p_info.end.quality_flags == ["rewound"]
    note = [e for e in p_info.end.events if e.kind == EventKind.NOTE and "rewind_to_step" in e.values]
    assert note and note[0].values["rewind_to_step"] == back
    b_info = st.info(eid)
    assert b_info.start.parent_episode_id == parent and b_info.start.parent_step_id == back
    assert b_info.start.initial_state["seed"] == p_info.start.initial_state["seed"]
    first = st.labels(eid).windows[0]
    assert (first.gate_reason, first.parent_step_id, first.handover_start) == ("rewind", 0, 0)  # nothing ran before
    src = st.read_steps(eid)["action_source"]
    assert (src[first.handover_start:first.handover_end] == ActionSource.HUMAN.code).all()
    assert first.handover_end > first.handover_start  # the person corrected from the branch's first steps
    # the branch's first observation is the parent's at the step it went back to
    np.testing.assert_allclose(st.read_steps(eid)["obs/ee_pos"][0], st.read_steps(parent)["obs/ee_pos"][back],
                               atol=1e-6)
    report = replay_store(str(store), progress=False)
    assert report.counts()["replay_mismatch"] == 0 and report.counts()["replayable"] == len(list(st.episodes()))


def test_rewind_is_refused_without_an_episode_or_a_person(tmp_path):
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0, **{"operator.type": "expert"})
    s = open_session(cfg, str(tmp_path / "s.zarr"))
    try:
        with pytest.raises(HgDaggerError, match="no open episode"):
            s.rewind(0, 1.0)
        s.start(1)
        s.tick()
        with pytest.raises(HgDaggerError, match="gives control to a person"):
            s.rewind(0, 1.0)
    finally:
        s.rec.close()
        s.env.close()
