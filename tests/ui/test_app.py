"""The whole app, driven through its real window: start an episode, a gate fires, the operator takes over
(Qt key events on toy_reach; posted pygame joystick events on fetch_pick_place), corrects, hands back,
ends the episode, trains the next student; then the store is checked."""

from __future__ import annotations

import time

import numpy as np
import pygame
import pytest
from PyQt6 import sip
from PyQt6.QtCore import Qt
from support.app import WAIT_MS, close_app, wait_snap

from hg_dagger.contract import ActionSource, EventKind, LabelMask
from hg_dagger.learn.rounds import bootstrap_student
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui.application import AppOptions, OperatorApp

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation, pytest.mark.app]


def check_correction(store_url: str, operator: str, policy_version: str):
    """One human window bound to its episode, human_command next to applied_action, labels trainable."""
    st = EpisodeStore.open(store_url)
    assert list(validate_store(st)) == []
    (info,) = [i for i in st.episodes() if i.start.mode.value == "human_gated" and i.start.policy_version ==
               policy_version]
    assert info.complete and info.start.operator == operator
    layer = st.labels(info.episode_id)
    human_windows = [w for w in layer.windows if w.source == ActionSource.HUMAN]
    assert human_windows, "the correction is a window bound to its episode"
    w = human_windows[0]
    assert w.parent_episode_id == info.episode_id and w.handover_end > w.handover_start
    td = st.load(info.episode_id, fields=["action_source", "human_command", "applied_action", "t_action_apply",
                                            "t_obs", "t_policy"])
    src = td["action_source"].numpy()
    human = np.flatnonzero(src == ActionSource.HUMAN.code)
    assert human.size >= 5
    assert np.isfinite(td["human_command"].numpy()[human]).all(), "the raw command is kept next to the applied one"
    assert np.isfinite(td["applied_action"].numpy()[human]).all()
    t_apply = td["t_action_apply"].numpy()
    assert w.t_handover == int(t_apply[w.handover_start]), "t_handover: the first applied human step"
    assert (td["t_obs"].numpy() <= td["t_policy"].numpy()).all() and (td["t_policy"].numpy() <= t_apply).all()
    mask = layer.mask
    assert (mask[human] == LabelMask.TRAINABLE.code).any()
    assert not (mask[src == ActionSource.POLICY.code] == LabelMask.TRAINABLE.code).any()
    kinds = [e.kind for e in info.end.events]
    assert EventKind.GATE_TRIGGER in kinds and EventKind.HANDOVER_START in kinds and EventKind.HANDOVER_END in kinds
    return info


def mark(dlg) -> None:
    """Answer a per-episode dialog with its OK button."""
    from PyQt6.QtWidgets import QDialogButtonBox

    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()


def test_toy_reach_keys_take_over_hand_back_and_train_the_next_student(qtbot, tmp_path, settings, toy_student):
    store = str(tmp_path / "store.zarr")
    opts = AppOptions(task="toy_reach", store=store, student=toy_student, operator="device", device="keyboard",
                      name="op-qt", home=str(tmp_path / "home"), train_steps=60)
    op = OperatorApp(opts, settings)
    op.start()
    assert op.window is not None and op.loop is not None
    qtbot.addWidget(op.window)
    win = op.window
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and s.seq > 2)
    # the window draws the newest snapshot on its own timer: wait for it to show what the loop published
    qtbot.waitUntil(win.controls.start.isEnabled, timeout=WAIT_MS)
    qtbot.mouseClick(win.controls.start, Qt.MouseButton.LeftButton)
    wait_snap(qtbot, op, lambda s: s.phase == "running" and s.episode_step >= 5)
    qtbot.waitUntil(win.view.isVisible, timeout=WAIT_MS)

    qtbot.keyPress(win, Qt.Key.Key_Space)  # hold to intervene: grabbing the device is a takeover
    qtbot.keyPress(win, Qt.Key.Key_W)
    first = wait_snap(qtbot, op, lambda s: s.control_state == "human" and s.action_source == "human")
    qtbot.waitUntil(lambda: win.gate.headline.text() == "YOU ARE IN CONTROL" and win.banner.look == "human",
                    timeout=10_000)
    wait_snap(qtbot, op, lambda s: s.episode_step >= first.episode_step + 10)
    snap = op.loop.slot.read()
    assert snap.device.engaged and snap.device.axes[0] == pytest.approx(1.0)  # 'w' is x+
    qtbot.keyRelease(win, Qt.Key.Key_W)
    qtbot.keyRelease(win, Qt.Key.Key_Space)  # let go: control returns to the policy
    wait_snap(qtbot, op, lambda s: s.control_state in ("autonomous", "warning", "returning")
              and s.action_source == "policy")

    # the GUI thread blocked for a second: the control loop, in its own process, keeps ticking meanwhile
    before = op.loop.slot.read()
    time.sleep(0.5)
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    after = op.loop.slot.read()  # read without letting the GUI thread run: these ticks happened while it was blocked
    assert after.health.ticks >= before.health.ticks + 2, "the control loop waited for the GUI"

    eid = op.loop.slot.read().episode_id
    qtbot.mouseClick(win.controls.success, Qt.MouseButton.LeftButton)  # asks, naming the episode
    (dlg,) = win.controls.dialogs
    assert dlg.target == eid and eid[:8] in dlg.text.text()
    wait_snap(qtbot, op, lambda s: s.starts_held)  # new episodes wait while the dialog is open
    mark(dlg)
    done = wait_snap(qtbot, op, lambda s: s.counters.episodes == 1 and s.phase == "idle" and not s.starts_held)
    assert done.counters.successes == 1 and done.counters.windows >= 1 and done.counters.human_steps >= 10

    # a reviewer approves the correction for training; the next student: trained in the background, swapped in
    from hg_dagger.review.decisions import decide, list_windows

    qtbot.waitUntil(lambda: len(list_windows(store)) == 1, timeout=WAIT_MS)  # once the episode's commit lands
    (row,) = list_windows(store)
    decide(store, row.window_id, "approved", "rev-qt", authorize=True)
    old = done.policy_version
    op.train_next(keep_running=True)
    qtbot.waitUntil(lambda: op.job is None, timeout=WAIT_MS)
    # the new student took over after the held-out evaluation against the one that acted (the message has both)
    assert win.rounds.message.text().startswith("new student"), win.rounds.message.text()
    assert "held-out" in win.rounds.message.text() and "acting" in win.rounds.message.text()
    assert "labels reached training" in win.rounds.trained.text(), win.rounds.trained.text()  # from train.json
    new = wait_snap(qtbot, op, lambda s: "new student" in s.message)
    qtbot.mouseClick(win.controls.start, Qt.MouseButton.LeftButton)
    new = wait_snap(qtbot, op, lambda s: s.phase == "running" and s.policy_version != old and len(s.rounds) == 2)
    assert new.rounds[0]["policy_version"] == old and new.rounds[0]["human_labels"] >= 10
    assert new.rounds[0]["episodes"] == 1 and new.rounds[1]["policy_version"] == new.policy_version
    assert new.rounds[1]["current"] and not new.rounds[0]["current"]
    assert close_app(qtbot, op) == 0

    info = check_correction(store, "op-qt", old)
    st = EpisodeStore.open(store)
    versions = {i.start.policy_version for i in st.episodes() if i.start.mode.value == "human_gated"}
    assert versions == {old, new.policy_version}, "the second episode ran the new student"
    assert info.start.policy_version == old


def post(kind: str, instance_id: int, **attrs) -> None:
    pygame.event.post(pygame.event.Event(getattr(pygame, kind), instance_id=instance_id, joy=instance_id, **attrs))


def test_fetch_pick_place_gamepad_events_take_over_and_hand_back(qtbot, tmp_path, settings, pads):
    index = pads.attach()
    iid = pygame.joystick.Joystick(index).get_instance_id()
    store = str(tmp_path / "store.zarr")
    boot = bootstrap_student(task="fetch_pick_place", store=store, out_dir=str(tmp_path / "boot"), demos=2, steps=100,
                             report=lambda *_: None)
    # the pad lives in this process's SDL, so the control loop runs in a thread here (same loop, same window)
    opts = AppOptions(task="fetch_pick_place", store=store, student=boot["checkpoint"], operator="device",
                      device="gamepad", name="op-pad", home=str(tmp_path / "home"), control_process=False)
    op = OperatorApp(opts, settings)
    op.start()
    qtbot.addWidget(op.window)
    win = op.window
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and s.device.connected)
    qtbot.waitUntil(lambda: win.device.ident.text().startswith("gamepad"), timeout=10_000)
    qtbot.mouseClick(win.controls.start, Qt.MouseButton.LeftButton)
    wait_snap(qtbot, op, lambda s: s.phase == "running" and s.episode_step >= 5)
    assert op.loop.slot.read().frame.shape == (256, 256, 3)

    post("JOYBUTTONDOWN", iid, button=4)  # LB held: hold to intervene, grabbing is a takeover
    post("JOYAXISMOTION", iid, axis=4, value=-0.8)  # right stick up: z+
    first = wait_snap(qtbot, op, lambda s: s.control_state == "human" and s.action_source == "human")
    wait_snap(qtbot, op, lambda s: s.episode_step >= first.episode_step + 10)
    snap = op.loop.slot.read()
    assert snap.human_action[2] > 0.1 and snap.applied_action[2] > 0.1, "z+ reaches the applied action"
    post("JOYAXISMOTION", iid, axis=4, value=0.0)
    post("JOYBUTTONUP", iid, button=4)  # released: back to the policy
    wait_snap(qtbot, op, lambda s: s.control_state in ("autonomous", "warning", "returning")
              and s.action_source == "policy")
    qtbot.mouseClick(win.controls.failure, Qt.MouseButton.LeftButton)
    mark(win.controls.dialogs[0])
    wait_snap(qtbot, op, lambda s: s.counters.episodes == 1 and s.phase == "idle")
    assert close_app(qtbot, op) == 0
    info = check_correction(store, "op-pad", boot["version"])
    assert info.end.end_reason.value == "failure"


def run_cli(args: list[str], env_extra: dict, tmp_path, timeout: float = 600):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=timeout)


def test_scripted_app_run_leaves_a_valid_store(tmp_path, toy_student):
    store = str(tmp_path / "scripted.zarr")
    r = run_cli(["app", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "3", "--store", store,
                 "--student", toy_student, "--quit-when-done"], {"QT_QPA_PLATFORM": "offscreen"}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "this sitting: 3 episodes" in r.stdout and f"recorded in {store}" in r.stdout and "validate: ok" in r.stdout
    assert "Traceback" not in r.stderr and "propagateSizeHints" not in r.stderr
    st = EpisodeStore.open(store)
    assert len(st.episodes()) == 3 and list(validate_store(st)) == []
    # a second sitting on the same store continues its seeds: no start state is met twice
    # ... also without a display: a scripted run needs no person, so its window runs offscreen (what was asked)
    r = run_cli(["app", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "2", "--store", store,
                 "--student", toy_student, "--quit-when-done"], {}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no display: running the scripted session offscreen" in r.stdout and "validate: ok" in r.stdout
    seeds = sorted(i.start.initial_state["seed"] for i in EpisodeStore.open(store).episodes())
    assert seeds == [0, 1, 2, 3, 4]
    assert not (tmp_path / "runs").exists()  # never the demo instead


def test_an_unknown_task_on_the_command_line_is_one_line(tmp_path):
    r = run_cli(["app", "--task", "no_such_task"], {"QT_QPA_PLATFORM": "offscreen"}, tmp_path, timeout=120)
    assert r.returncode == 2 and "--task no_such_task: unknown task; known tasks: " in r.stderr
    assert "toy_reach" in r.stderr and "Traceback" not in r.stderr


def test_without_a_display_the_app_says_so(tmp_path):
    r = run_cli(["app", "--headless-fallback", "error"], {}, tmp_path, timeout=120)
    assert r.returncode == 2 and "no display" in r.stderr and "Traceback" not in r.stderr


def _app_args(*argv):
    from hg_dagger.cli import build_parser

    return build_parser().parse_args(["app", *argv])


def test_without_a_display_the_app_runs_what_was_asked_or_refuses_with_one_line(monkeypatch, capsys, tmp_path):
    """Never something else reported as success: alone it is the headless demo (`make run`), a scripted run runs
    offscreen, anything else asked (a store, a student, episodes for a person) is refused before anything is
    written."""
    from support.fuzz import run_cli as run_here

    from hg_dagger.cli.app import headless_plan

    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert headless_plan(_app_args()) == headless_plan(_app_args("--task", "toy_reach", "--seed", "3")) == "demo"
    assert headless_plan(_app_args("--operator", "expert", "--episodes", "2", "--quit-when-done")) == "offscreen"
    for asked in (["--store", "s.zarr", "--student", "x.pt", "--episodes", "3"], ["--episodes", "3"],
                  ["--operator", "synthetic", "--episodes", "2"],  # no --quit-when-done: it would never end
                  ["--quit-when-done", "--episodes", "2"],  # a person's device (the default operator)
                  ["--operator", "none", "--quit-when-done"], ["--config", "toy_reach"]):
        line = run_here(capsys, "app", *asked).refused()
        assert "no display" in line and " ".join(a for a in asked if a.startswith("--")) in line, (asked, line)
    assert list(tmp_path.iterdir()) == []  # no store, no demo folder


def test_the_apps_config_files_are_checked_before_any_window(capsys, tmp_path):
    from support.fuzz import run_cli as run_here

    from hg_dagger import config

    bad = tmp_path / "run.yaml"
    bad.write_text("kind: run\ntask: toy_reach\nepisodes: many\n")
    assert f"{bad}: key episodes:" in run_here(capsys, "app", "--config", bad).refused()
    task = tmp_path / "task.yaml"
    task.write_text((config.CONFIG_DIR / "tasks" / "toy_reach.yaml").read_text().replace("horizon: 100",
                                                                                        "horizon: -1"))
    assert f"{task}: key horizon:" in run_here(capsys, "app", "--task", task).refused()
    assert "gate config is for task 'fetch_pick_place', the run is for 'toy_reach'" in run_here(
        capsys, "app", "--task", "toy_reach", "--gates", "fetch_pick_place").refused()
    assert "unknown gate config 'nope'" in run_here(capsys, "app", "--gates", "nope").refused()
    assert "no such config file" in run_here(capsys, "app", "--task", tmp_path / "missing.yaml").refused()


def test_a_scripted_app_run_uses_the_run_config_and_gate_file_it_is_given(tmp_path, toy_student):
    from hg_dagger import config

    def gates(name: str):
        path = tmp_path / f"{name}.yaml"
        path.write_text((config.CONFIG_DIR / "gates" / "toy_reach.yaml").read_text().replace(
            "name: toy_reach_default", f"name: {name}"))
        return path

    run = tmp_path / "myrun.yaml"
    run.write_text(f"kind: run\ntask: toy_reach\ngates: {gates('from_config')}\n")
    store = str(tmp_path / "s.zarr")
    r = run_cli(["app", "--config", str(run), "--operator", "synthetic", "--episodes", "1", "--store", store,
                 "--student", toy_student, "--quit-when-done"], {"QT_QPA_PLATFORM": "offscreen"}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli(["app", "--config", str(run), "--gates", str(gates("from_flag")), "--operator", "synthetic",
                 "--episodes", "1", "--store", store, "--student", toy_student, "--quit-when-done"],
                {"QT_QPA_PLATFORM": "offscreen"}, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    names = [i.start.gate_config.get("name") for i in EpisodeStore.open(store).episodes()]
    assert sorted(names) == ["from_config", "from_flag"]


def test_a_task_file_of_the_users_names_its_folder_by_its_task_id(qtbot, tmp_path, settings):
    from hg_dagger import config
    from hg_dagger.ui.start_dialog import StartDialog

    task = tmp_path / "short.yaml"
    task.write_text((config.CONFIG_DIR / "tasks" / "toy_reach.yaml").read_text().replace("horizon: 100",
                                                                                        "horizon: 30"))
    opts = AppOptions(task=str(task), home=str(tmp_path / "home"))
    assert opts.task_dir == tmp_path / "home" / "toy_reach"
    dlg = StartDialog(settings=settings, task=str(task))  # offered beside the named tasks, and chosen
    qtbot.addWidget(dlg)
    assert dlg.task.currentText() == str(task) and dlg.task.findText("toy_reach") >= 0


def _spawn(args: list[str], tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    return subprocess.Popen([sys.executable, "-m", "hg_dagger", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def test_ctrl_c_in_the_terminal_closes_the_app_as_its_window_would(tmp_path, toy_student):
    """SIGINT mid-run (episodes going, one open): the app ends like a window close, with a valid store and no
    traceback, instead of ignoring the key until the next GUI event."""
    import signal
    import subprocess

    store = str(tmp_path / "interrupted.zarr")
    p = _spawn(["app", "--task", "toy_reach", "--name", "alice", "--operator", "synthetic", "--episodes", "200",
                "--store", store, "--student", toy_student], tmp_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and p.poll() is None:
            try:
                if any(i.complete for i in EpisodeStore.open(store).episodes()):
                    break
            except Exception:  # noqa: BLE001 - the store is not created yet
                pass
            time.sleep(0.5)
        assert p.poll() is None, p.communicate()[1][-2000:]
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the app was still running 60 s after Ctrl+C") from None
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out[-1000:] + err[-2000:]
    assert "SIGINT: closing" in err and "Traceback" not in err and "KeyboardInterrupt" not in err
    st = EpisodeStore.open(store)
    episodes = st.episodes()
    assert 1 <= len(episodes) < 200 and list(validate_store(st)) == []


def test_a_window_deleted_under_a_running_app_stops_the_loop_and_ends_the_run(qtbot, tmp_path, settings, toy_student):
    """The window can go without a close (its owner deletes it): the app's watch then stops the control loop,
    whose open episode ends as on a quit, instead of touching the deleted window."""
    store = str(tmp_path / "store.zarr")
    opts = AppOptions(task="toy_reach", store=store, student=toy_student, operator="device", device="keyboard",
                      name="op-gone", home=str(tmp_path / "home"), episodes=50)
    op = OperatorApp(opts, settings)
    codes: list[int] = []
    op.finished.connect(codes.append)
    op.start()
    wait_snap(qtbot, op, lambda s: s.phase == "running" and s.episode_step >= 5)
    watch = op._watch
    assert watch.parent() is op.window  # the watch is the window's: it goes with it
    op.window.deleteLater()
    qtbot.waitUntil(lambda: bool(codes), timeout=60_000)
    assert codes == [0] and op.window is None and not op.loop.alive and sip.isdeleted(watch)
    s = EpisodeStore.open(store)
    infos = s.episodes()
    assert infos and all(i.complete for i in infos)  # the episode open at the deletion ended, none left dangling
    assert validate_store(s) == []


def test_the_watch_stops_with_its_window_when_a_test_fails_midway(qtbot, tmp_path, settings, toy_student):
    """A test that fails leaves its window to pytest-qt, which closes it: the app's watch stops and its control
    loop ends right there, instead of ticking on into the tests after it."""
    store = str(tmp_path / "store.zarr")
    opts = AppOptions(task="toy_reach", store=store, student=toy_student, operator="device", device="keyboard",
                      name="op-fail", home=str(tmp_path / "home"), episodes=50)
    op = OperatorApp(opts, settings)
    codes: list[int] = []
    op.finished.connect(codes.append)
    op.start()
    qtbot.addWidget(op.window)
    wait_snap(qtbot, op, lambda s: s.phase == "running" and s.episode_step >= 5)
    with pytest.raises(AssertionError):
        assert op.loop.slot.read().phase == "never", "a test failing here"
    watch = op._watch
    op.window.close()  # what pytest-qt's teardown does with the window of a failed test
    assert not watch.isActive() and codes == [0] and not op.loop.alive  # at once, no further event needed
    assert all(i.complete for i in EpisodeStore.open(store).episodes())
