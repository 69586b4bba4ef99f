"""The assembled operator window, the start dialog and the import rules of the ui package."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PyQt6.QtCore import QEvent, Qt
from PyQt6.QtTest import QTest
from PyQt6.QtWidgets import QApplication, QDialogButtonBox

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.live import (
    CommandQueue,
    Counters,
    DeviceState,
    EStop,
    KeyEvent,
    LatestSlot,
    Quit,
    ReleaseKeys,
    Snapshot,
    StartEpisodes,
)
from hg_dagger.devices.discovery import KEYBOARD
from hg_dagger.ui.main_window import HelpDialog, MainWindow, shortcut_rows
from hg_dagger.ui.settings import SettingsFile
from hg_dagger.ui.start_dialog import StartChoices, StartDialog, task_names

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation, pytest.mark.app]


@pytest.fixture
def settings(tmp_path):
    """The app's settings in a temp file: tests never touch the user's settings."""
    return SettingsFile(tmp_path / "app.yaml")


@pytest.fixture
def window(qtbot, settings):
    slot, q = LatestSlot(), CommandQueue()
    win = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD], refresh_hz=60)
    qtbot.addWidget(win)
    win.show()
    yield win, slot, q
    win.close()


def publish_and_wait(qtbot, win, slot, s: Snapshot) -> None:
    slot.publish(s)
    qtbot.waitUntil(lambda: win.reader.last is s, timeout=5000)


def running(seq: int, **kw) -> Snapshot:
    base = dict(seq=seq, t_ns=now_ns(), task="fetch_reach", phase="running", episode_id="ep-0003", episode_step=41,
                store="/data/run.zarr", operator="op-07", policy_version="round-02",
                counters=Counters(episodes=3, successes=2, windows=4, human_steps=120),
                action_names=("dx", "dy", "dz", "gripper"), policy_action=np.zeros(4, np.float32),
                applied_action=np.zeros(4, np.float32), frame=np.zeros((64, 96, 3), np.uint8),
                device=DeviceState(device_id="keyboard", kind="keyboard", connected=True),
                rounds=({"round": 0, "policy_version": "round-00", "episodes": 10, "success_rate": 0.4,
                         "intervention_rate": 0.3, "human_labels": 400},))
    base.update(kw)
    return Snapshot(**base)


def test_window_shows_a_snapshot_everywhere(qtbot, window, qtlog):
    win, slot, q = window
    publish_and_wait(qtbot, win, slot, running(1, control_state="handover_requested",
                                               t_request_ns=now_ns() - 2_000_000_000))
    assert win.windowTitle() == "hg-dagger - fetch_reach"
    assert win.view.frame_size == (96, 64) and win.gate.state == "handover_requested" and win.banner.isVisible()
    assert win.banner.look == "request" and win.banner.label.text().startswith("TAKE OVER!   waiting ")
    assert len(win.plots.actions.plots) == 4 and len(win.plots.gate.uncertainty.getData()[0]) == 1
    st = win.status
    assert st.store.text() == "Store: /data/run.zarr" and st.episode.text() == "Episode: ep-0003  step 41"
    assert st.counters.text() == "Episodes 3 | Successes 2 | E-stops 0 | Windows 4 | Human labels 120"
    assert st.operator.text() == "Operator: op-07" and st.policy.text() == "Policy: round-02"
    assert win.rounds.table.rowCount() == 1 and win.rounds.table.item(0, 3).text() == "40 %"
    assert len(win.rounds.success.getData()[0]) == 1
    publish_and_wait(qtbot, win, slot, running(2, control_state="human"))
    assert win.banner.look == "human" and win.controls.hand_back.isEnabled()
    for step in (7, 1234567):  # the status labels keep a steady size, yet a longer text is never cut off
        publish_and_wait(qtbot, win, slot, running(2 + step, control_state="human", episode_step=step))
        assert st.episode.text().endswith(f"step {step}")
        assert st.episode.width() >= st.episode.fontMetrics().horizontalAdvance(st.episode.text())
    publish_and_wait(qtbot, win, slot, running(3, phase="estopped", estop=("app", "button"), control_state="safe_stop"))
    win.set_training_progress("training", 0.5)
    qtbot.wait(50)
    assert not [r.message for r in qtlog.records if "stylesheet" in r.message.lower()]


def test_window_keys_escape_and_focus_loss(qtbot, window):
    win, slot, q = window
    publish_and_wait(qtbot, win, slot, running(1))
    q.drain()
    target = win.view  # keys work wherever focus is in the window
    QTest.keyPress(target, Qt.Key.Key_W)
    QTest.keyRelease(target, Qt.Key.Key_W)
    QTest.keyClick(win.controls.start, Qt.Key.Key_Escape)
    QApplication.sendEvent(win, QEvent(QEvent.Type.WindowDeactivate))
    assert q.drain() == [KeyEvent("w", True), KeyEvent("w", False),
                         EStop(source="keyboard", reason="Esc key"), ReleaseKeys()]
    publish_and_wait(qtbot, win, slot, Snapshot(seq=2, phase="idle"))
    win.activateWindow()
    win.controls.count.setFocus()  # the spin box takes digits as text
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None, timeout=5000)
    QTest.keyClick(win.controls.count, Qt.Key.Key_7)
    assert q.drain() == [] and "7" in win.controls.count.text()


def test_start_click_estop_latch_and_train_signal(qtbot, window):
    win, slot, q = window
    publish_and_wait(qtbot, win, slot, Snapshot(seq=0, phase="loading", loading=True,
                                                message="loading the task and the student"))
    assert win.rounds.message.text() == ""  # the start-up line belongs to the status bar, not to the rounds
    publish_and_wait(qtbot, win, slot, Snapshot(seq=1, phase="idle"))
    QTest.mouseClick(win.controls.start, Qt.MouseButton.LeftButton)
    assert q.drain() == [StartEpisodes(1)]
    publish_and_wait(qtbot, win, slot, running(2, phase="estopped", estop=("keyboard", "Esc key"),
                                               control_state="safe_stop"))
    assert win.estop.button.text() == "E-STOP LATCHED" and win.estop.reset.isVisible()
    assert win.estop.detail.text() == "keyboard: Esc key"
    assert win.gate.state == "safe_stop" and win.banner.look == "calm"
    with qtbot.waitSignal(win.train_requested, timeout=5000):
        win.tabs.setCurrentWidget(win.rounds)
        QTest.mouseClick(win.rounds.train, Qt.MouseButton.LeftButton)
    win.set_training_progress("training", 0.25)
    assert win.rounds.progress.isVisible() and win.rounds.progress.value() == 25
    assert not win.rounds.train.isEnabled()
    win.set_training_done("new student round-03 (900 labels)")
    assert not win.rounds.progress.isVisible() and "round-03" in win.rounds.message.text()
    publish_and_wait(qtbot, win, slot, Snapshot(seq=3, phase="training", message="training 40%"))
    assert win.rounds.progress.isVisible() and win.rounds.message.text() == "training 40%"


def test_quit_sends_quit_once_and_layout_persists(qtbot, settings):
    slot, q = LatestSlot(), CommandQueue()
    win = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD])
    qtbot.addWidget(win)
    win.resize(1234, 777)
    win.show()
    qtbot.waitExposed(win)
    default = win.split_main.sizes()
    win.split_main.setSizes([1, 10_000])  # as far down as the minimum sizes allow
    sizes = win.split_main.sizes()
    assert abs(sizes[1] - default[1]) > 20
    win.quit_action.trigger()
    assert q.drain() == [Quit()] and not win.isVisible()
    win.close()
    assert q.drain() == []
    again = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD])
    qtbot.addWidget(again)
    again.show()
    qtbot.waitExposed(again)
    # the offscreen screen (800 x 800) clamps a restored geometry, so compare within a few pixels
    assert settings.data.window.geometry and settings.data.window.split_main
    assert SettingsFile(settings.path).data.window == settings.data.window  # on disk
    assert abs(again.height() - 777) <= 8 and again.split_main.sizes() == pytest.approx(sizes, abs=8)
    again.close()


def test_the_fleet_consoles_split_persists(qtbot, settings):
    slot, q = LatestSlot(), CommandQueue()
    win = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD], robots=4)
    qtbot.addWidget(win)
    win.resize(1400, 800)
    win.show()
    qtbot.waitExposed(win)
    width = sum(win.split_fleet.sizes())
    win.split_fleet.setSizes([width // 5, width - width // 5])  # the person narrows the robots' side (default 45%)
    sizes = win.split_fleet.sizes()
    win.close()
    assert settings.data.window.split_fleet
    again = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD], robots=4)
    qtbot.addWidget(again)
    again.show()
    qtbot.waitExposed(again)
    again_sizes = again.split_fleet.sizes()
    assert again_sizes[0] == pytest.approx(sizes[0], abs=12)  # Qt keeps the side's pixels; the rest takes the change
    again.close()


def test_help_lists_shortcuts_and_sound_setting_persists(qtbot, window, settings):
    win, *_ = window
    listed = shortcut_rows()
    rows = dict(listed)
    assert len(rows) == len(listed)  # each key once
    assert rows["Esc"].startswith("emergency stop") and rows["F1"] == "this help"
    assert rows["W"] and rows["Space"].startswith("hold to intervene")
    win.help_action.trigger()
    assert isinstance(win.help_dialog, HelpDialog) and win.help_dialog.isVisible()
    assert win.help_dialog.table.rowCount() == len(listed)
    win.sound_action.setChecked(False)
    assert not win.banner.sound_enabled and settings.data.ui.sound is False
    assert SettingsFile(settings.path).data.ui.sound is False


def test_start_dialog_requires_a_pseudonym_and_remembers(qtbot, settings):
    dlg = StartDialog(settings=settings)
    qtbot.addWidget(dlg)
    assert "fetch_reach" in task_names() and dlg.task.count() == len(task_names())
    ok = dlg.buttons.button(QDialogButtonBox.StandardButton.Ok)
    dlg.operator.setText("   ")
    assert not ok.isEnabled() and "pseudonym" in dlg.error.text()
    dlg.accept()
    assert dlg.result() == 0  # refused
    dlg.operator.setText("op-07")
    dlg.task.setCurrentText("toy_reach")
    dlg.backend.setCurrentIndex(dlg.backend.findData("bridge"))
    dlg.host.setText("")
    assert not ok.isEnabled() and "host" in dlg.error.text()
    dlg.host.setText("10.0.0.5")
    dlg.port.setValue(9000)
    dlg.store.setEditText("/data/a.zarr")
    assert ok.isEnabled()
    ok.click()
    c = dlg.choices()
    assert c == StartChoices(operator="op-07", task="toy_reach", backend="bridge", host="10.0.0.5", port=9000,
                             token_file="", student="", store="/data/a.zarr")
    assert c.robot == "10.0.0.5:9000"
    again = StartDialog(settings=settings)
    qtbot.addWidget(again)
    assert again.operator.text() == "op-07" and again.task.currentText() == "toy_reach"
    assert again.recent_stores() == ["/data/a.zarr"] and again.store.currentText() == "/data/a.zarr"
    again.backend.setCurrentIndex(again.backend.findData("embedded"))
    assert again.choices().robot == "" and again.choices().port == 0


def test_importing_the_ui_starts_no_thread_and_the_session_needs_no_qt():
    code = ("import pkgutil, importlib, threading; n = threading.active_count(); import hg_dagger.ui as u; "
            "[importlib.import_module(f'hg_dagger.ui.{m.name}') for m in pkgutil.iter_modules(u.__path__)]; "
            "assert threading.active_count() == n, threading.enumerate(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    code = ("import sys; import hg_dagger.control.session; import hg_dagger.control.live; "
            "bad = [m for m in sys.modules if m.startswith(('PyQt6', 'pyqtgraph', 'hg_dagger.ui'))]; "
            "assert not bad, bad; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
