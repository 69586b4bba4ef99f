"""The review workspace shows the scene of episodes recorded without a camera: re-rendered through the simulator
from the recorded initial state and applied actions on a background thread, cached per episode, scrubbed with
the timeline. Held steps read "waiting for operator"; axes are labelled; Left/Right/Space scrub from anywhere in
the workspace but a text box. Stores are recorded by real gated sessions (toy_reach, fetch_pick_place) with the
synthetic operator and an eager gate."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PyQt6.QtCore import Qt
from PyQt6.QtGui import QImage

from hg_dagger.contract.enums import ActionSource, ControlState
from hg_dagger.envs import load_mapping, make_env, toy
from hg_dagger.review.render import FRAME_SIZE, FrameCache, NoScene, Scene, render_episode
from hg_dagger.store import EpisodeStore
from hg_dagger.ui.review import ReviewWorkspace
from hg_dagger.ui.review.model import STEP_KINDS

pytestmark = [pytest.mark.simulation, pytest.mark.app]

REVIEWER = "rev-scene"
WAIT = 120_000  # ms; generous, the machine is shared


def _record(path, task: str, episodes: int, **overrides) -> str:
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    gates = {"name": "eager", "task": task, "gates": [{"type": "confidence", "trigger": 1e-9, "debounce_ticks": 1}]}
    # the robot holds while a request waits (as on a robot over the bridge): the held steps are recorded
    cfg = load_run_config(None, task, episodes=episodes, num_envs=1, calibrate_steps=0, gates=gates,
                          **{"operator.return_after_steps": 12, "handover.wait": "hold", **overrides})
    run_gated(cfg, str(path), progress=False)
    return str(path)


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("scene") / "toy", "toy_reach", 2)


@pytest.fixture
def store(toy_store, tmp_path):
    path = tmp_path / "store"
    shutil.copytree(toy_store, path)
    return str(path)


def _workspace(qtbot, store):
    ws = ReviewWorkspace([store], REVIEWER)
    qtbot.addWidget(ws)
    ws.resize(1500, 900)
    ws.show()
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    return ws


def _select(qtbot, ws, row):
    ws.browser.select(row.window_id)
    qtbot.waitUntil(lambda: ws.episode.data is not None and ws.episode.data.episode_id == row.window.episode_id
                    and ws.worker.pending == 0, timeout=WAIT)


def _settled(qtbot, ws) -> None:
    """Wait until the layout has placed the picture and the pixmap fills it (a square scene: its shorter side)."""
    frame = ws.episode.frame

    def fits():
        size = frame.picture.size()
        return not frame.pixmap().isNull() and frame.pixmap().width() == max(min(size.width(), size.height()), 64)

    qtbot.waitUntil(fits, timeout=WAIT)


def _picture(ws) -> np.ndarray:
    """The frame view's pixmap as an RGB array (what is on screen)."""
    img = ws.episode.frame.pixmap().toImage().convertToFormat(QImage.Format.Format_RGB888)
    h, w, bpl = img.height(), img.width(), img.bytesPerLine()
    return np.frombuffer(img.bits().asstring(h * bpl), np.uint8).reshape(h, bpl)[:, : 3 * w].reshape(h, w, 3).copy()


def _toy_pixel(xy, size: int = FRAME_SIZE) -> tuple[int, int]:
    """The (row, col) where toy_reach's view draws a world point (see ToyReachEnv.render_view)."""
    extent = 1.15 * sum(toy.LINKS)
    col = int(round((xy[0] / extent + 1) / 2 * size - 0.5))
    row = int(round((-xy[1] / extent + 1) / 2 * size - 0.5))
    return row, col


def test_a_state_only_episode_shows_its_scene_rendered_in_the_background(qtbot, store):
    ws = _workspace(qtbot, store)
    row = ws.browser.visible_rows()[0]
    eid = row.window.episode_id
    seen: list[tuple[int, int, str]] = []
    # connected after the view's own slot: the text is the one the view just set
    ws.episode.renderer.progress.connect(lambda key, done, total: seen.append((done, total,
                                                                               ws.episode.frame.picture.text())))
    _select(qtbot, ws, row)
    assert ws.episode.data.images is None  # toy_reach records no camera
    qtbot.waitUntil(lambda: ws.episode.frame.state == "rendered", timeout=WAIT)
    info = EpisodeStore.open(store).info(eid)
    n = info.num_steps
    frames = ws.episode.frame.scene.frames
    assert frames.shape == (n, FRAME_SIZE, FRAME_SIZE, 3) and frames.dtype == np.uint8
    # progress was shown as "rendering k/n" and reached n
    assert seen and seen[-1][:2] == (n, n) and all(t == n for _, t, _ in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    assert any(text == f"rendering {d}/{n}" for d, _, text in seen if d < n)
    assert "re-rendered from the recorded initial state" in ws.episode.frame.caption.text()
    # scrubbing swaps the picture: two steps differ on screen, and each is the scene of its own step
    a, b = 0, n - 1
    ws.episode.set_step(a)
    _settled(qtbot, ws)
    first = _picture(ws)
    np.testing.assert_array_equal(ws.episode.frame.shown, frames[a])
    ws.episode.set_step(b)
    last = _picture(ws)
    np.testing.assert_array_equal(ws.episode.frame.shown, frames[b])
    assert first.shape == last.shape and np.abs(first.astype(int) - last.astype(int)).sum() > 1000
    # every frame draws the arm where the record has it: the hand at step t's recorded fingertip
    ee = EpisodeStore.open(store).read_steps(eid, ["obs/ee_pos"])["obs/ee_pos"]
    for t in range(0, n, 5):
        r, c = _toy_pixel(ee[t])
        assert tuple(frames[t][r, c]) == toy.HAND, t
    assert f"ee_pos: {ee[b][0]:+.3f}" in ws.episode.frame.text()  # the values stay under the picture
    # the same episode again comes from the cache at once; another one renders its own
    other = next(r for r in ws.browser.visible_rows() if r.window.episode_id != eid)
    _select(qtbot, ws, other)
    qtbot.waitUntil(lambda: ws.episode.frame.state == "rendered", timeout=WAIT)
    assert len(ws.episode.frame.scene.frames) == EpisodeStore.open(store).info(other.window.episode_id).num_steps
    assert len(ws.episode.renderer.cache) == 2
    seen.clear()
    _select(qtbot, ws, row)
    assert ws.episode.frame.state == "rendered" and ws.episode.frame.scene.frames is frames and not seen
    ws.close()


def test_the_scene_is_the_recorded_initial_state_and_renders_the_same_every_time(store):
    st = EpisodeStore.open(store)
    for info in st.episodes(complete=True):
        scene = render_episode(store, info.episode_id)
        assert scene.diverged_at is None and scene.note() == ""  # the re-run stayed on the record
        again = render_episode(store, info.episode_id)
        np.testing.assert_array_equal(scene.frames, again.frames)
        seed = info.start.initial_state["seed"]
        env = make_env(load_mapping(info.task_id), num_envs=1, seed=seed)
        try:
            env.reset(seed=[seed], env_ids=[0])
            np.testing.assert_array_equal(scene.frames[0], env.render_view(0, FRAME_SIZE))
        finally:
            env.close()
        assert np.abs(scene.frames[0].astype(int) - scene.frames[-1].astype(int)).sum() > 1000  # the arm moved


def test_an_episode_that_cannot_be_rerun_says_why(qtbot, tmp_path):
    from support.store import record

    path = str(tmp_path / "no_seed")
    rec = EpisodeStore.create(path).recorder()
    eid = record(rec, 1, 30, window=(5, 10))  # no initial state recorded
    rec.close()
    with pytest.raises(NoScene, match=f"no scene for episode {eid}: no recorded initial state"):
        render_episode(path, eid)
    ws = _workspace(qtbot, path)
    _select(qtbot, ws, ws.browser.visible_rows()[0])
    qtbot.waitUntil(lambda: ws.episode.frame.state == "no scene", timeout=WAIT)
    assert ws.episode.frame.pixmap().isNull() and ws.episode.frame.picture.text() == "no scene to show"
    assert ws.episode.frame.caption.text() == f"no scene for episode {eid}: no recorded initial state"
    assert "state:" in ws.episode.frame.text()  # the observation values still show
    ws.close()


def test_held_steps_read_waiting_for_operator_and_the_axes_say_their_units(qtbot, store):
    ws = _workspace(qtbot, store)
    row = ws.browser.visible_rows()[0]
    _select(qtbot, ws, row)
    rec = EpisodeStore.open(store).read_steps(row.window.episode_id, ["action_source", "control_state"])
    src, cs = rec["action_source"], rec["control_state"]
    hold = src == ActionSource.SAFETY_CONTROLLER.code
    waiting = np.flatnonzero(hold & (cs == ControlState.HANDOVER_REQUESTED.code))
    handback = np.flatnonzero(hold & (cs == ControlState.RETURNING.code))
    assert waiting.size and handback.size  # the session held for the operator, and blended the hand-back
    colours = ws.episode.timeline.colours
    assert {colours[t] for t in waiting} == {STEP_KINDS["waiting"][0]}
    assert {colours[t] for t in handback} == {STEP_KINDS["handback"][0]}
    assert STEP_KINDS["safety"][0] not in set(colours)  # nothing here was a safety stop
    t = int(waiting[0])
    ws.episode.set_step(t)
    assert ws.episode.step_label.text() == f"step {t} / {len(src) - 1}, {t / 25:.2f} s  (waiting for operator)"
    # each request that waited is a marker that says for how long
    info = EpisodeStore.open(store).info(row.window.episode_id)
    ends = [e for e in info.end.events if e.kind.value == "request_end"]
    assert ends and sum(k == "request_end" for _, k in ws.episode.timeline.markers) == len(ends)
    # the held steps show the wait already: beside them the marker reads short ("0.2 s"), its tooltip in full
    drawn = [text for (_, k), text in zip(ws.episode.timeline.markers, ws.episode.timeline.marker_texts, strict=True)
             if k == "request_end"]
    assert drawn == [f"{e.values['wait_s']:.1f} s" for e in ends]
    # axes: steps below and seconds above the timeline, the step axis under the last action plot
    plot = ws.episode.timeline.getPlotItem()
    assert plot.getAxis("bottom").labelText == "step" and plot.getAxis("top").labelText == "time (s)"
    seconds = ws.episode.timeline.seconds
    assert seconds.hz == 25 and seconds.tickStrings([0.0, 25.0, 50.0], 1, 25) == ["0", "1", "2"]
    spacing, major = seconds.tickValues(0, 46, 600)[0]  # 46 steps = 1.84 s: major ticks every half second
    assert spacing / 25 == pytest.approx(0.5) and [v / 25 for v in major] == pytest.approx([0, 0.5, 1, 1.5])
    assert [p.getAxis("left").labelText for p in ws.episode.plots.plots] == ["shoulder_vel", "elbow_vel"]
    assert ws.episode.plots.plots[-1].getAxis("bottom").labelText == "step"
    assert "joint velocity command" in ws.episode.action_caption.text()
    ws.close()


@pytest.mark.parametrize("operator", ["answers", "never answers"])
def test_a_paused_wait_is_one_marker_that_says_how_long(qtbot, tmp_path, operator):
    """In simulation the world pauses while a request waits: no rows, one request_end event with the wait."""
    kw = ({"operator.reaction_delay_steps": 10} if operator == "answers" else
          {"operator.availability": 0.0, "handover.wait_timeout_s": 0.4, "handover.on_wait_timeout": "policy",
           "max_episode_steps": 8})
    path = _record(tmp_path / "paused", "toy_reach", 1, **{"handover.wait": "pause", **kw})
    ws = _workspace(qtbot, path)
    row = ws.browser.visible_rows()[0] if ws.browser.visible_rows() else None
    info = EpisodeStore.open(path).episodes(complete=True)[0]
    if row is None:  # nobody took over: no correction window, so show the episode itself
        from hg_dagger.ui.review.model import load_episode

        ws.episode.show_episode(load_episode(path, info.episode_id))
    else:
        _select(qtbot, ws, row)
    ends = [e for e in info.end.events if e.kind.value == "request_end"]
    assert ends and {e.values["outcome"] for e in ends} == ({"answered"} if operator == "answers" else {"expired"})
    assert "waiting" not in ws.episode.data.kinds  # the world waited: nothing held, nothing recorded
    tl = ws.episode.timeline
    got = [(step, text) for (step, kind), text in zip(tl.markers, tl.marker_texts, strict=True)
           if kind == "request_end"]
    suffix = "" if operator == "answers" else ", expired"
    assert got == [(e.step, f"waited {e.values['wait_s']:.1f} s for operator{suffix}") for e in ends]
    if operator == "answers":
        assert all(e.values["wait_s"] >= 0.4 for e in ends)  # the operator's reaction delay
    # the scene re-renders all the same: the pause stepped nothing
    qtbot.waitUntil(lambda: ws.episode.frame.state == "rendered", timeout=WAIT)
    assert len(ws.episode.frame.scene.frames) == info.num_steps and ws.episode.frame.scene.diverged_at is None
    ws.close()


def test_left_right_and_space_scrub_from_the_table_but_not_from_the_reason_box(qtbot, store):
    ws = _workspace(qtbot, store)
    row = ws.browser.visible_rows()[0]
    _select(qtbot, ws, row)
    start = ws.episode.step
    table = ws.browser.table
    table.setFocus()
    qtbot.keyClick(table, Qt.Key.Key_Right)
    qtbot.keyClick(table, Qt.Key.Key_Right)
    assert ws.episode.step == start + 2 and ws.episode.slider.value() == start + 2
    assert ws.episode.timeline.cursor.value() == pytest.approx(start + 2.5)
    qtbot.keyClick(table, Qt.Key.Key_Left)
    assert ws.episode.step == start + 1
    assert ws.browser.current().window_id == row.window_id  # the table kept its row
    qtbot.keyClick(table, Qt.Key.Key_Space)
    assert ws.episode.playing
    qtbot.keyClick(table, Qt.Key.Key_Space)
    assert not ws.episode.playing
    # on a button Space plays too, and never clicks it
    trail = len(ws.panel.trail)
    qtbot.keyClick(ws.panel.reject_button, Qt.Key.Key_Space)
    assert ws.episode.playing
    qtbot.keyClick(ws.panel.reject_button, Qt.Key.Key_Space)
    assert not ws.episode.playing and ws.worker.pending == 0 and len(ws.panel.trail) == trail
    # in the reason box the keys are text
    step = ws.episode.step
    ws.panel.reason.setFocus()
    qtbot.keyClicks(ws.panel.reason, "too late")
    qtbot.keyClick(ws.panel.reason, Qt.Key.Key_Left)
    assert ws.panel.reason.toPlainText() == "too late" and ws.episode.step == step and not ws.episode.playing
    ws.close()


def test_frame_cache_keeps_the_latest_scenes_within_its_budget():
    def scene(name: str) -> Scene:
        return Scene(name, np.zeros((10, 8, 8, 3), np.uint8))  # 1,920 bytes

    cache = FrameCache(max_bytes=5_000)
    for name in ("a", "b"):
        cache.put(("s", name), scene(name))
    assert cache.get(("s", "a")) is not None  # a is now the most recent
    cache.put(("s", "c"), scene("c"))
    assert ("s", "b") not in cache and ("s", "a") in cache and ("s", "c") in cache and cache.nbytes <= 5_000


@pytest.mark.subprocess  # MuJoCo's GL setup probes glfw in a child process
def test_a_fetch_episode_renders_through_mujoco(qtbot, tmp_path):
    from hg_dagger.review.replay import replay_episode

    path = _record(tmp_path / "fetch", "fetch_pick_place", 1, max_episode_steps=40)
    info = EpisodeStore.open(path).episodes(complete=True)[0]
    assert info.end.end_reason.value == "timeout"  # cut by the run: its last step records a truncation
    # the simulator's own horizon is longer: the cut is not a divergence
    assert replay_episode(EpisodeStore.open(path), info.episode_id).status.value == "replayable"
    ws = _workspace(qtbot, path)
    row = ws.browser.visible_rows()[0]
    _select(qtbot, ws, row)
    qtbot.waitUntil(lambda: ws.episode.frame.state in ("rendered", "no scene"), timeout=WAIT)
    assert ws.episode.frame.state == "rendered", ws.episode.frame.caption.text()
    frames = ws.episode.frame.scene.frames
    assert len(frames) == EpisodeStore.open(path).info(row.window.episode_id).num_steps
    assert ws.episode.frame.scene.diverged_at is None
    ws.episode.set_step(0)
    _settled(qtbot, ws)
    first = _picture(ws)
    ws.episode.set_step(len(frames) - 1)
    assert np.abs(first.astype(int) - _picture(ws).astype(int)).sum() > 1000  # the arm moved on screen
    ws.close()


def test_keys_on_the_apps_review_tab_scrub_the_review_and_never_reach_the_robot(qtbot, store, tmp_path):
    from hg_dagger.control.live import CommandQueue, KeyEvent, LatestSlot
    from hg_dagger.devices.discovery import KEYBOARD
    from hg_dagger.ui.main_window import MainWindow
    from hg_dagger.ui.settings import SettingsFile

    slot, q = LatestSlot(), CommandQueue()
    settings = SettingsFile(tmp_path / "app.yaml")
    win = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD], review_store=store, operator="op-1")
    qtbot.addWidget(win)
    win.show()
    # on the console Space is the keyboard device's take-over key
    qtbot.keyPress(win, Qt.Key.Key_Space)
    qtbot.keyRelease(win, Qt.Key.Key_Space)
    assert [c for c in q.drain() if isinstance(c, KeyEvent)] == [KeyEvent("space", True), KeyEvent("space", False)]
    win.show_review()
    ws = win.review
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    _select(qtbot, ws, ws.browser.visible_rows()[0])
    qtbot.waitUntil(lambda: ws.episode.frame.state == "rendered", timeout=WAIT)  # the tab shows the scene too
    assert len(ws.episode.frame.scene.frames) == ws.episode.data.num_steps
    start = ws.episode.step
    q.drain()
    table = ws.browser.table
    table.setFocus()
    qtbot.keyClick(table, Qt.Key.Key_Right)
    assert ws.episode.step == start + 1
    qtbot.keyPress(table, Qt.Key.Key_Space)
    qtbot.keyRelease(table, Qt.Key.Key_Space)
    assert ws.episode.playing
    qtbot.keyClick(table, Qt.Key.Key_Space)
    assert not ws.episode.playing
    assert not [c for c in q.drain() if isinstance(c, KeyEvent)]  # the robot's keyboard saw none of them
    # back on the console the review is hidden and Space is the robot's again
    win.show_console()
    step = ws.episode.step
    qtbot.keyPress(win, Qt.Key.Key_Space)
    qtbot.keyRelease(win, Qt.Key.Key_Space)
    assert [c for c in q.drain() if isinstance(c, KeyEvent)] == [KeyEvent("space", True), KeyEvent("space", False)]
    assert ws.episode.step == step and not ws.episode.playing
    win.close()
