"""One person, four robots, through the real window (`hg-dagger app --robots 4`, docs/fleet.md): the human-paced
operator model plays the keyboard; requests queue while the person looks away (nothing expires without a wait
limit), P takes the top request, the other robots keep running, an e-stop of one robot leaves the others running,
every correction window lands in the episode of the robot the person drove, and the store validates. With a wait
limit, a request nobody takes expires and its robot's student goes on."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PyQt6 import sip
from PyQt6.QtCore import Qt, QTimer
from support.app import WAIT_MS, close_app, wait_snap

from hg_dagger.contract import ActionSource, EventKind
from hg_dagger.control.human_model import HumanOperatorModel, HumanProfile
from hg_dagger.envs import load_mapping
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import save_checkpoint
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui.application import AppOptions, OperatorApp
from hg_dagger.ui.fleet_model import FleetPersonModel
from hg_dagger.ui.operator_model import ModelDriver
from hg_dagger.ui.review.browser import WindowBrowser
from hg_dagger.ui.review.model import rows_of_store

pytestmark = [pytest.mark.subprocess, pytest.mark.app]

# the untrained student never reaches the goal: every robot asks 1.2 s into each episode, so requests queue
EARLY_GATE = """kind: gates
gates:
  - {type: progress_stall, trigger: 1.2, min_delta: 100.0}
"""
# the person never looks away on their own (the test makes them) and always takes over
PROFILE = HumanProfile(look_away_p=0.0, decline_p=0.0, correction_median_s=1.0, correction_max_s=1.5,
                       reaction_median_s=0.5, reaction_max_s=1.0, context_switch_s=(0.2, 0.4))


@pytest.fixture
def apps():
    opened: list[OperatorApp] = []
    yield opened
    for op in opened:
        if op.window is not None and not sip.isdeleted(op.window):
            op.window.close()
        if op.loop is not None:
            op.loop.stop()


def launch(qtbot, apps, tmp_path, settings, **more) -> OperatorApp:
    gates = tmp_path / "early.yaml"
    gates.write_text(EARLY_GATE)
    student = tmp_path / "untrained.pt"
    save_checkpoint(student, Student.create(load_mapping("toy_reach"), seed=0))
    opts = AppOptions(task="toy_reach", store=str(tmp_path / "store.zarr"), student=str(student), operator="device",
                      device="keyboard", name="op-fleet", home=str(tmp_path / "home"), gates=str(gates), **more)
    op = OperatorApp(opts, settings)
    apps.append(op)
    op.start()
    qtbot.addWidget(op.window)
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and len(s.robots) == more["robots"] and s.seq > 2)
    qtbot.waitUntil(op.window.controls.start.isEnabled, timeout=WAIT_MS)
    op.window.controls.count.setValue(200)
    qtbot.mouseClick(op.window.controls.start, Qt.MouseButton.LeftButton)
    return op


def steps(snap) -> np.ndarray:
    return np.array([r.step if r.state != "idle" else -1 for r in snap.robots])


def test_one_person_drives_four_robots_through_the_fleet_view(qtbot, tmp_path, settings, apps):
    op = launch(qtbot, apps, tmp_path, settings, robots=4)
    win = op.window
    assert win.fleet is not None and len(win.fleet.tiles) == 4
    store = op.opts.store_url

    # the person looks away: requests queue, the robots that asked pause, nothing expires without a wait limit
    first = wait_snap(qtbot, op, lambda s: len(s.queue) >= 2)
    assert all(s.state == "waiting" for s in first.robots if s.robot in {q.robot for q in first.queue})
    qtbot.wait(4000)
    later = op.loop.slot.read()
    assert later.counters.requests_expired == 0, "a request expired without a wait limit"
    waited = {q.robot: q.wait_s for q in later.queue}
    assert max(waited.values()) >= 3.0, waited
    for q in first.queue:  # a queued robot stays where it was
        assert later.robots[q.robot].step == first.robots[q.robot].step
    qtbot.waitUntil(lambda: win.fleet.queue_lines() and "robot" in win.fleet.queue_lines()[0], timeout=10_000)
    top = later.queue[0].robot

    # P takes the top request: it comes up on screen as the person's
    qtbot.keyClick(win, Qt.Key.Key_P)
    taken = wait_snap(qtbot, op, lambda s: s.robot == top and s.serving == top)
    assert taken.control_state == "handover_requested"

    # the human-paced person takes it from here, and takes the next requests with P
    model = FleetPersonModel(HumanOperatorModel(load_mapping("toy_reach"), PROFILE, seed=3), seed=3)
    driver = ModelDriver(win, model)
    driven: dict[str, int] = {}  # episode -> the robot on screen while the person drove it
    ran_while_queued = 0
    last = op.loop.slot.read()

    def watch() -> None:
        nonlocal ran_while_queued, last
        snap = op.loop.slot.read()
        if snap.control_state == "human" and snap.episode_id is not None:
            driven[snap.episode_id] = snap.robot
        if snap.seq != last.seq and snap.queue and len(snap.robots) == len(last.robots):
            queued = {q.robot for q in snap.queue}
            moved = {r for r in range(4) if steps(snap)[r] > steps(last)[r] >= 0}
            if moved - queued and not moved & queued:
                ran_while_queued += 1
        last = snap


    spy = QTimer()
    spy.timeout.connect(watch)
    spy.start(20)
    driver.start()
    qtbot.waitUntil(lambda: len({r for r in driven.values()}) >= 2 and model.takes >= 1, timeout=WAIT_MS)
    assert ran_while_queued > 0, "no robot ran while others waited in the queue"

    # an e-stop of one robot (its tile's button, one click) leaves the others running
    serving = op.loop.slot.read().serving
    victim = next(r for r in range(4) if r != serving)
    qtbot.mouseClick(win.fleet.tiles[victim].stop, Qt.MouseButton.LeftButton)
    stopped = wait_snap(qtbot, op, lambda s: s.robots[victim].state == "e-stop")
    assert stopped.estop is None, "one robot's e-stop stopped them all"
    qtbot.waitUntil(lambda: win.fleet.tiles[victim].stop.text() == f"Clear {victim + 1}", timeout=10_000)
    episodes_before = stopped.counters.episodes
    wait_snap(qtbot, op, lambda s: s.counters.episodes >= episodes_before + 2 and s.robots[victim].state == "e-stop"
              and s.robots[victim].episode_id is None)
    driver.stop()
    spy.stop()
    qtbot.waitUntil(lambda: not model.in_control, timeout=WAIT_MS)
    assert close_app(qtbot, op) == 0

    st = EpisodeStore.open(store)
    assert list(validate_store(st)) == []
    infos = list(st.episodes())
    assert {i.start.env_index for i in infos} == {0, 1, 2, 3}
    assert all(i.start.extra.get("fleet_size") == 4 for i in infos)
    stops = [i for i in infos if any(e.reason == f"e-stop of robot {victim + 1}" for e in i.end.events)]
    assert len(stops) == 1 and stops[0].start.env_index == victim and stops[0].end.end_reason.value == "safety_stop"
    windows = 0
    for info in infos:
        layer = st.labels(info.episode_id)
        for w in layer.windows:
            windows += 1
            assert w.parent_episode_id == info.episode_id
            assert driven.get(info.episode_id) == info.start.env_index, "a window in another robot's episode"
            src = st.read_steps(info.episode_id)["action_source"]
            assert (src[w.handover_start:w.handover_end] == ActionSource.HUMAN.code).any()
        for e in info.end.events:
            if e.kind == EventKind.REQUEST_END:
                assert e.values.get("outcome") != "expired" or e.reason != "wait_limit"
    assert windows >= 2
    allocated = [e for i in infos for e in i.end.events if e.reason == "fleet:allocated"]
    assert any(e.values["reason"] == "top" for e in allocated)

    # the Review tab's robot filter lists one robot's windows
    browser = WindowBrowser()
    qtbot.addWidget(browser)
    browser.set_rows(rows_of_store(store))
    robot_of_episode = {i.episode_id: i.start.env_index for i in infos}
    some = browser.model.rows[0].robot
    browser.set_filter("robot", some)
    shown = browser.visible_rows()
    assert shown and all(r.robot == some for r in shown)
    assert {f"{robot_of_episode[r.window.episode_id] + 1} of 4" for r in shown} == {some}
    assert len(shown) == sum(1 for r in browser.model.rows if r.robot == some) < len(browser.model.rows) or len(
        {r.robot for r in browser.model.rows}) == 1


def test_with_a_wait_limit_a_request_nobody_takes_expires_and_the_robot_goes_on(qtbot, tmp_path, settings, apps):
    op = launch(qtbot, apps, tmp_path, settings, robots=2, wait_limit=1.0)
    store = op.opts.store_url
    t0 = time.monotonic()
    # nobody touches the keys: every request expires after 1 s of waiting and the student drives on
    wait_snap(qtbot, op, lambda s: s.counters.requests_expired >= 2)
    assert time.monotonic() - t0 < 120
    assert close_app(qtbot, op) == 0
    st = EpisodeStore.open(store)
    assert list(validate_store(st)) == []
    expired = [(i.start.env_index, e) for i in st.episodes() for e in i.end.events
               if e.kind == EventKind.REQUEST_END and e.reason == "wait_limit"]
    assert expired and all(e.values["outcome"] == "expired" for _, e in expired)
