"""One person at a console serving three robots, headless (control.fleet_desk through the real ControlLoop): the robot
on screen is theirs when it asks, N lets only its student go on, P takes the top of the queue, a number takes any
robot, and one robot's e-stop keeps it stopped (no new episode, even back to back) while the others run on."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hg_dagger.contract import EventKind
from hg_dagger.control import live
from hg_dagger.control.build import build_session
from hg_dagger.control.fleet import FleetAllocator, FleetConfig
from hg_dagger.control.fleet_desk import fleet_keyboard
from hg_dagger.control.handover import AUTO, HUMAN, REQUESTED
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.devices import make_device
from hg_dagger.envs import make_env
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

WAIT = 120.0
EARLY_GATE = """kind: gates
gates:
  - {type: progress_stall, trigger: 0.6, min_delta: 100.0}
"""


def fleet_builder(store: str, gates: str):
    def build():
        cfg = load_run_config(None, "toy_reach", num_envs=3, seed=1, calibrate_steps=0, episode_gap_s=0, gates=gates,
                              **{"operator.type": "synthetic", "fleet.allocation": "fcfs", "handover.wait": "pause"})
        env = make_env("toy_reach", num_envs=3, seed=1)
        s = build_session(cfg, EpisodeStore.create(store, exist_ok=True).recorder(),
                          Student.create(env.mapping, seed=0), env=env)
        fleet_keyboard(s, make_device("keyboard"), "op")
        return s

    return build


def wait(loop: ControlLoop, pred, what: str) -> live.Snapshot:
    snap = loop.slot.wait_for(lambda s: s.phase != "error" and pred(s), WAIT)
    assert snap is not None, f"never: {what} (last: {loop.slot.read().message})"
    return snap


def test_picks_decline_and_one_robots_estop_at_the_console(tmp_path):
    gates = tmp_path / "early.yaml"
    gates.write_text(EARLY_GATE)
    store = str(tmp_path / "s.zarr")
    loop = ControlLoop(fleet_builder(store, str(gates)), view_hz=0, store=store).start()
    try:
        wait(loop, lambda s: s.phase == "idle" and len(s.robots) == 3, "the fleet loads")
        loop.commands.put(live.StartEpisodes(60))
        asked = wait(loop, lambda s: s.serving == 0 and s.robots[0].state == "waiting" and len(s.queue) == 2,
                     "robot 1 (on screen) asks and is served; the others queue")
        assert asked.robot == 0 and asked.control_state == "handover_requested"

        loop.commands.put(live.DeclineRequest())  # N: only the robot on screen goes on
        after = wait(loop, lambda s: s.robots[0].state != "waiting", "robot 1's student goes on")
        assert {q.robot for q in after.queue} == {1, 2}, "a decline reached the queued robots"

        loop.commands.put(live.TakeRobot(None))  # P: fcfs, so the top request is the one that came first
        top = after.queue[0].robot
        taken = wait(loop, lambda s: s.serving == top and s.robot == top, "P takes the top request")
        assert top not in {q.robot for q in taken.queue}

        other = next(r for r in (1, 2) if r != top)
        loop.commands.put(live.StopRobot(other))
        wait(loop, lambda s: s.robots[other].state == "e-stop" and s.robots[other].episode_id is None,
             "one robot stops")
        loop.commands.put(live.TakeRobot(0))  # robot 1 has not asked: a pre-emption
        wait(loop, lambda s: s.serving == 0 and s.robot == 0, "robot 1 taken before it asks")
        loop.commands.put(live.DeclineRequest())  # answered by the top robot's student if it still waited
        loop.commands.put(live.TakeRobot(top))
        before = wait(loop, lambda s: s.serving == top, "back to the top robot")
        time.sleep(1.5)  # back to back episodes (no pause between): the stopped robot still begins none
        snap = loop.slot.read()
        assert snap.robots[other].state == "e-stop" and snap.robots[other].episode_id is None
        assert snap.estop is None, "one robot's e-stop latched them all"
        assert snap.counters.steps > before.counters.steps, "the other robots stopped too"
        loop.commands.put(live.ClearRobot(other))
        wait(loop, lambda s: s.robots[other].episode_id is not None and s.robots[other].state != "e-stop",
             "the cleared robot begins its next episode")
    finally:
        loop.stop()
    assert not loop.error, loop.error
    st = EpisodeStore.open(store)
    assert list(validate_store(st)) == []
    infos = list(st.episodes())
    declined = [i for i in infos for e in i.end.events if e.kind == EventKind.REQUEST_END
                and e.values["outcome"] == "declined"]
    assert declined and declined[0].start.env_index == 0
    (stopped,) = [i for i in infos if any(e.reason == f"e-stop of robot {other + 1}" for e in i.end.events)]
    assert stopped.start.env_index == other and stopped.end.end_reason.value == "safety_stop"
    picks = {e.values["reason"] for i in infos for e in i.end.events if e.reason == "fleet:allocated"}
    assert {"selected", "top"} <= picks and picks & {"preempt", "picked", "top"}, picks


def test_the_person_picks_the_queue_the_robot_on_screen_and_a_robot_that_has_not_asked():
    alloc = FleetAllocator(FleetConfig(allocation="fcfs"), 4, 0.04, manual=True)
    inputs = lambda r: (False, 0.0, 0.0)  # noqa: E731
    waits = np.zeros(4, np.int64)
    state = np.array([AUTO, REQUESTED, AUTO, AUTO], np.uint8)
    seen = alloc.allocate(state, waits, inputs)
    assert alloc.serving is None and [q.row for q in alloc.ranked] == [1], "a console never takes a request itself"
    assert (seen == AUTO).all(), "a queued request is not the person's yet"
    state[3] = REQUESTED
    alloc.allocate(state, waits, inputs)
    assert [q.row for q in alloc.ranked] == [1, 3]
    assert alloc.pick(None) == 1 and alloc.serving == 1 and alloc.selected == 1  # P: the first to come
    state[1] = HUMAN
    alloc.allocate(state, waits, inputs)
    state[1] = AUTO  # handed back
    alloc.allocate(state, waits, inputs)
    assert alloc.serving is None and alloc.selected == 1
    state[1] = REQUESTED  # the robot on screen asks again while the person serves nobody: theirs at once
    alloc.allocate(state, waits, inputs)
    assert alloc.serving == 1
    assert alloc.pick(2) == 2 and alloc.serving == 2  # robot 3 has not asked: a pre-emption
    for _ in range(3):  # it stays theirs while it runs on its own, until they drive it and let go
        alloc.allocate(state, waits, inputs)
    assert alloc.serving == 2 and sorted(q.row for q in alloc.ranked) == [1, 3]
    state[2] = HUMAN
    alloc.allocate(state, waits, inputs)
    state[2] = AUTO
    alloc.allocate(state, waits, inputs)
    assert alloc.serving is None
    events = [(r, v["reason"], v["rank"]) for r, why, v in alloc.take_events() if why == "fleet:allocated"]
    assert events == [(1, "top", 1), (1, "selected", 2), (2, "preempt", 0)]
    with pytest.raises(ValueError, match="no robot 9"):
        alloc.pick(8)
