"""One row waits for a person while the others run: with `wait: pause` on a simulator that pauses rows, a request
pauses its own row (no physics, no time, nothing recorded) and the session steps the rest."""

from __future__ import annotations

import numpy as np

from hg_dagger.contract.enums import ControlState
from hg_dagger.control.build import open_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.learn.auto_config import AutoConfig
from hg_dagger.store import EpisodeStore, validate_store

REQUESTED = ControlState.HANDOVER_REQUESTED.code


def test_a_row_waiting_for_a_person_pauses_alone_while_three_others_run(tmp_path):
    store = tmp_path / "s.zarr"
    cfg = load_run_config(None, "toy_reach", num_envs=4, calibrate_steps=0,
                          **{"handover.wait": "pause", "operator.reaction_delay_steps": 25})
    s = open_session(cfg, str(store))
    try:
        assert s.env.pauses_rows
        s.start(12)
        waited = False
        for _ in range(2000):
            s.tick()
            waiting = np.flatnonzero(s.machine.state == REQUESTED)
            if waiting.size and waiting.size < 4:
                r = int(waiting[0])
                others = [i for i in range(4) if i != r and s.eids[i] is not None and s.machine.state[i] != REQUESTED]
                if not others:
                    continue
                pose, t_env, step = s.obs["ee_pos"][r].copy(), int(s.env._t[r]), int(s.ep_step[r])
                before = {i: (s.eids[i], int(s.ep_step[i])) for i in others}
                s.tick()
                if s.machine.state[r] != REQUESTED:
                    continue  # answered on this very tick
                np.testing.assert_array_equal(s.obs["ee_pos"][r], pose)  # no physics for the waiting row
                assert int(s.env._t[r]) == t_env and int(s.ep_step[r]) == step  # no time, nothing recorded
                moved = [i for i in others if s.eids[i] != before[i][0] or int(s.ep_step[i]) > before[i][1]]
                assert moved, "the other rows stood still while one waited"
                waited = True
                break
            if not s.running:
                break
        assert waited, "no request waited while another row ran"
        while s.running:
            s.tick()
    finally:
        s.rec.close()
        s.env.close()
    st = EpisodeStore.open(str(store))
    assert validate_store(st) == []
    assert s.summary.paused_ticks > 0 and s.summary.windows >= 1


def test_one_rows_e_stop_holds_it_still_while_the_others_run_until_it_is_cleared(tmp_path):
    store = tmp_path / "s.zarr"
    cfg = load_run_config(None, "toy_reach", num_envs=4, calibrate_steps=0, **{"handover.wait": "pause"})
    s = open_session(cfg, str(store))
    try:
        s.start(40)
        for _ in range(5):
            s.tick()
        stopped_eid = s.eids[1]
        s.stop_row(1, "operator-a")
        assert s.eids[1] is None and s.stopped_rows == {1}
        t_env, pose = int(s.env._t[1]), s.obs["ee_pos"][1].copy()
        others = {i: int(s.env._t[i]) for i in (0, 2, 3)}
        for _ in range(60):  # episodes end and begin back to back in the other rows
            s.tick()
        assert int(s.env._t[1]) == t_env and s.eids[1] is None  # not stepped, no new episode
        np.testing.assert_array_equal(s.obs["ee_pos"][1], pose)
        assert all(int(s.env._t[i]) != t for i, t in others.items()), "the other rows stood still"
        s.clear_row(1, "operator-a")
        s.tick()
        assert s.eids[1] is not None and s.stopped_rows == set()  # it begins its next episode
        s.close_all("test over")
    finally:
        s.rec.close()
        s.env.close()
    st = EpisodeStore.open(str(store))
    assert validate_store(st) == []
    (info,) = [i for i in st.episodes() if i.episode_id == stopped_eid]
    assert info.end.end_reason.value == "safety_stop"
    assert any(e.reason == "e-stop of robot 2" and e.source == "operator-a" for e in info.end.events)


def test_a_run_with_a_window_cap_begins_no_episode_once_it_holds_that_many_corrections(tmp_path):
    """run config ``windows``: the run watches at most ``episodes`` episodes and stops beginning them once it holds
    that many correction windows; the open ones finish, so the store holds whole episodes only."""
    store = tmp_path / "s.zarr"
    cfg = load_run_config(None, "toy_reach", num_envs=2, calibrate_steps=0, episodes=40, windows=2)
    s = open_session(cfg, str(store))
    try:
        summary = s.run(cfg.episodes, progress=False, windows=cfg.windows)
    finally:
        s.rec.close()
        s.env.close()
    infos = EpisodeStore.open(str(store)).episodes()
    assert 2 <= summary.windows and len(infos) < 40, "the cap did not stop the run"
    assert all(i.complete for i in infos) and validate_store(EpisodeStore.open(str(store))) == []


def test_auto_human_gated_rounds_take_their_window_caps_from_the_schedule():
    cfg = AutoConfig.model_validate({"task": "toy_reach", "mode": "human_gated", "certification": "planner_auto",
                                     "episodes_per_iteration": 96, "gated_windows": [20, 10],
                                     "gated": {"operator": {"certification": "planner_auto"}}})
    assert [cfg.gated_round(it).windows for it in range(4)] == [None, 20, 10, 10]
    assert all(cfg.gated_round(it).episodes == 96 for it in range(4))
