"""E-stop, episode controls, loop health and the window keyboard, driven through real widgets; the
commands they send are drained from a real CommandQueue."""

from __future__ import annotations

import pytest
from PyQt6.QtCore import QEvent, Qt
from PyQt6.QtGui import QKeyEvent
from PyQt6.QtTest import QTest
from PyQt6.QtWidgets import (
    QApplication,
    QDialogButtonBox,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.control.live import (
    AbortEpisode,
    ClearEStop,
    CommandQueue,
    Counters,
    DiscardEpisode,
    EStop,
    HandBack,
    HoldStarts,
    KeyEvent,
    LatestSlot,
    LoopHealth,
    Pause,
    ReleaseKeys,
    ResetEpisode,
    SetMode,
    Snapshot,
    StartEpisodes,
    TakeOver,
)
from hg_dagger.ui import style
from hg_dagger.ui.controls import EpisodeControls, EStopPanel
from hg_dagger.ui.health import LoopHealthPanel
from hg_dagger.ui.keys import KeyboardBridge, key_name
from hg_dagger.ui.snapshots import SnapshotReader

pytestmark = [pytest.mark.app]


@pytest.fixture
def live(qtbot):
    slot = LatestSlot()
    reader = SnapshotReader(slot, hz=60)
    reader.start()
    yield slot, reader, CommandQueue()
    reader.stop()


def publish_and_wait(qtbot, slot, reader, s: Snapshot) -> None:
    slot.publish(s)
    qtbot.waitUntil(lambda: reader.last is s, timeout=5000)


def click(b: QPushButton) -> None:
    assert b.isEnabled(), b.text()
    QTest.mouseClick(b, Qt.MouseButton.LeftButton)


def test_estop_button_latched_and_confirmed_reset(qtbot, live):
    slot, reader, q = live
    panel = EStopPanel(q, operator="op7")
    qtbot.addWidget(panel)
    reader.snapshot.connect(panel.show_snapshot)
    panel.show()
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1))
    assert panel.button.text() == "E-STOP (Esc)" and not panel.reset.isVisible()  # named with its key
    click(panel.button)
    assert q.drain() == [EStop(source="app", reason="e-stop button")]
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=2, phase="estopped", estop=("pedal", "foot switch")))
    assert panel.button.text() == "E-STOP LATCHED" and panel.reset.isVisible()
    assert panel.detail.toolTip() == "pedal: foot switch" and panel.detail.isVisible()
    click(panel.reset)  # asks first; cancelling sends nothing
    qtbot.waitUntil(lambda: panel.confirm is not None and panel.confirm.isVisible(), timeout=5000)
    panel.confirm.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: panel.confirm is None, timeout=5000)
    assert q.drain() == []
    click(panel.reset)
    qtbot.waitUntil(lambda: panel.confirm is not None and panel.confirm.isVisible(), timeout=5000)
    panel.confirm.button(QMessageBox.StandardButton.Yes).click()
    assert q.drain() == [ClearEStop(by="op7")]
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=3))
    assert panel.button.text() == "E-STOP (Esc)" and not panel.reset.isVisible()


def test_episode_controls_follow_phase_and_send_commands(qtbot, live):
    slot, reader, q = live
    c = EpisodeControls(q)
    qtbot.addWidget(c)
    reader.snapshot.connect(c.show_snapshot)
    c.show()
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1, phase="idle"))
    assert c.start.isEnabled() and not c.pause.isEnabled() and not c.abort.isEnabled()
    assert not c.take_over.isEnabled() and not c.hand_back.isEnabled()
    c.count.setValue(5)
    click(c.start)
    assert q.drain() == [StartEpisodes(5)]

    run = dict(phase="running", episode_id="ep-1", control_state="autonomous")
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=2, **run))
    assert not c.start.isEnabled() and c.pause.text() == "Pause"
    assert c.title() == "Episode ep-1"  # the box names the episode its buttons act on
    for b in (c.pause, c.reset, c.abort, c.take_over):
        click(b)
    assert not c.hand_back.isEnabled()
    assert q.drain() == [Pause(True), ResetEpisode("ep-1"), AbortEpisode("ep-1"), TakeOver()]

    publish_and_wait(qtbot, slot, reader, Snapshot(seq=3, **{**run, "control_state": "human"}))
    assert not c.take_over.isEnabled()
    click(c.hand_back)
    assert q.drain() == [HandBack()]
    # running between two episodes: nothing to take over until the next one begins
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=31, **{**run, "episode_id": None}, next_start_in_s=1.0))
    assert not c.take_over.isEnabled() and c.pause.isEnabled()

    publish_and_wait(qtbot, slot, reader, Snapshot(seq=4, **{**run, "phase": "paused"}))
    assert c.pause.text() == "Resume"
    click(c.pause)
    assert q.drain() == [Pause(False)]

    publish_and_wait(qtbot, slot, reader, Snapshot(seq=5, **{**run, "phase": "estopped"}))
    assert c.abort.isEnabled() and not c.reset.isEnabled() and not c.pause.isEnabled()
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=6, phase="training"))
    assert not any(b.isEnabled() for b in (c.start, c.pause, c.abort, c.take_over, c.mode))

    publish_and_wait(qtbot, slot, reader, Snapshot(seq=7, phase="idle", mode="expert", next_mode="expert"))
    assert c.mode.currentData() == "expert" and "next episode" not in c.phase_label.text()
    c.mode.setCurrentIndex(c.mode.findData("teleop"))
    c.mode.activated.emit(c.mode.currentIndex())  # what a user's pick in the popup emits
    assert q.drain() == [SetMode("teleop")]
    # the episode running keeps its mode; the box keeps the person's pick and the phase line says when it starts
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=8, **{**run, "mode": "expert", "next_mode": "teleop"}))
    assert c.mode.currentData() == "teleop"
    assert "Teleoperated demonstrations from the next episode" in c.phase_label.text()


def test_discard_refuses_an_empty_reason(qtbot, live):
    slot, reader, q = live
    c = EpisodeControls(q)
    qtbot.addWidget(c)
    reader.snapshot.connect(c.show_snapshot)
    c.show()
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1, phase="running", episode_id="ep-1"))
    click(c.discard)
    qtbot.waitUntil(lambda: len(c.dialogs) == 1 and c.dialogs[0].isVisible(), timeout=5000)
    dlg = c.dialogs[0]
    assert q.drain() == [HoldStarts(True)]
    dlg.reason.setText("   ")
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert dlg.isVisible() and q.drain() == [] and "required" in dlg.text.text()  # asked again
    dlg.reason.setText("camera bumped")
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert q.drain() == [DiscardEpisode("camera bumped", episode_id="ep-1"), HoldStarts(False)] and not c.dialogs


def test_the_keyboard_returns_to_the_window_when_its_last_dialog_closes(qtbot, live):
    """A desktop without a window manager leaves the focus on a dialog that closed: the next Space would take over
    nothing. The window that routes the robot's keys is made active again once no dialog is open."""
    slot, reader, q = live
    win = QWidget()
    c = EpisodeControls(q, win)
    QVBoxLayout(win).addWidget(c)
    qtbot.addWidget(win)
    reader.snapshot.connect(c.show_snapshot)
    win.show()
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1, phase="running", episode_id="ep-1"))
    click(c.discard)
    qtbot.waitUntil(lambda: QApplication.activeWindow() is c.dialogs[0], timeout=5000)  # typing goes to the question
    c.dialogs[0].reason.setText("camera bumped")
    c.dialogs[0].buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert not c.dialogs
    qtbot.waitUntil(lambda: QApplication.activeWindow() is win, timeout=5000)


def test_health_panel_levels(qtbot, live):
    slot, reader, _ = live
    p = LoopHealthPanel()
    qtbot.addWidget(p)
    reader.snapshot.connect(p.show_snapshot)
    good = LoopHealth(target_hz=50, achieved_hz=49.9, jitter_p99_ms=0.8, latency_p50_ms=3.0, latency_p99_ms=6.0,
                      recorder_queue=3, ticks=500)
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1, health=good))
    assert set(p.levels.values()) == {"ok"} and p.title() == "Loop health"
    assert p.values["rate"].text() == "49.9 / 50 Hz" and p.values["latency"].text() == "3.0 ms / 6.0 ms"
    bad = LoopHealth(target_hz=50, achieved_hz=49.0, jitter_p99_ms=7.5, missed_ticks=2, latency_p99_ms=120.0,
                     recorder_dropped=4, ticks=500)
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=2, health=bad, counters=Counters(episodes=1)))
    assert p.levels == {"rate": "warn", "jitter": "warn", "missed": "warn", "latency": "bad", "tick": "ok",
                        "queue": "ok", "dropped": "bad"}
    assert style.SAFETY in p.values["dropped"].styleSheet() and p.title() == "Loop health (BAD)"


def test_key_names():
    assert key_name(Qt.Key.Key_W) == "w" and key_name(Qt.Key.Key_Space) == "space"
    assert key_name(Qt.Key.Key_Return) == key_name(Qt.Key.Key_Enter) == "enter"
    assert key_name(Qt.Key.Key_Up) == "up" and key_name(Qt.Key.Key_Shift) == "shift"
    assert key_name(Qt.Key.Key_Escape) is None and key_name(Qt.Key.Key_F1) is None


@pytest.fixture
def keyboard_window(qtbot):
    win = QWidget()
    lay = QVBoxLayout(win)
    button, edit, spin = QPushButton("a button"), QLineEdit(), QSpinBox()
    for w in (button, edit, spin):
        lay.addWidget(w)
    qtbot.addWidget(win)
    q = CommandQueue()
    bridge = KeyboardBridge(win, q)
    QApplication.instance().installEventFilter(bridge)
    win.show()
    yield win, q, button, edit, spin
    QApplication.instance().removeEventFilter(bridge)


def test_keys_become_key_events_and_esc_estops(qtbot, keyboard_window):
    win, q, button, edit, spin = keyboard_window
    clicks = []
    button.clicked.connect(lambda: clicks.append(1))
    button.setFocus()
    QTest.keyPress(button, Qt.Key.Key_W)
    QApplication.sendEvent(button, QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_W, Qt.KeyboardModifier.NoModifier,
                                             "w", True))  # auto-repeat: not a new press
    QTest.keyRelease(button, Qt.Key.Key_W)
    QTest.keyClick(button, Qt.Key.Key_Space)
    assert q.drain() == [KeyEvent("w", True), KeyEvent("w", False), KeyEvent("space", True), KeyEvent("space", False)]
    assert clicks == []  # space is the deadman, it never clicks the focused button
    QTest.keyClick(win, Qt.Key.Key_Escape)
    assert q.drain() == [EStop(source="keyboard", reason="Esc key")]
    edit.setFocus()
    QTest.keyClick(edit, Qt.Key.Key_W)  # typing stays text
    spin.setFocus()
    QTest.keyClick(spin, Qt.Key.Key_5)
    assert edit.text() == "w" and q.drain() == []
    edit.setFocus()
    QTest.keyClick(edit, Qt.Key.Key_Escape)  # but Esc always stops
    assert q.drain() == [EStop(source="keyboard", reason="Esc key")]
    button.setFocus()
    QTest.keyClick(win, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)  # a shortcut, not motion
    assert KeyEvent("q", True) not in q.drain()


def test_focus_loss_releases_keys(qtbot, keyboard_window):
    win, q, *_ = keyboard_window
    QTest.keyPress(win, Qt.Key.Key_W)
    QApplication.sendEvent(win, QEvent(QEvent.Type.WindowDeactivate))
    assert q.drain() == [KeyEvent("w", True), ReleaseKeys()]


def test_focus_into_a_text_input_releases_held_keys(qtbot, keyboard_window):
    win, q, button, edit, _ = keyboard_window
    button.setFocus()
    QTest.keyPress(button, Qt.Key.Key_D)
    QApplication.sendEvent(edit, QEvent(QEvent.Type.FocusIn))
    assert q.drain() == [KeyEvent("d", True), ReleaseKeys()]
