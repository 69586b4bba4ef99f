"""The console as a person meets it: a window of the size they use (1600 x 1000), real widgets, snapshots
through a real LatestSlot, commands drained from a real CommandQueue.

Nothing moves when a gate asks; the banner says what to do with the chosen device; a dialog open on an
episode names it, sends its id whatever runs meanwhile, holds new episodes back and never keeps the
keyboard from taking over; Esc in a dialog closes it and stops nothing; loading, the key map, the e-stop,
the rounds and the plots read as they should."""

from __future__ import annotations

import numpy as np
import pytest
from PyQt6.QtCore import QEvent, QRect, Qt
from PyQt6.QtGui import QKeyEvent
from PyQt6.QtTest import QTest
from PyQt6.QtWidgets import QApplication, QDialogButtonBox, QLabel

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.live import (
    CommandQueue,
    Counters,
    DeclineRequest,
    DeviceState,
    DiscardEpisode,
    EStop,
    FlagCorrection,
    HoldStarts,
    KeyEvent,
    LatestSlot,
    MarkOutcome,
    ReleaseKeys,
    Snapshot,
    UndoDiscard,
)
from hg_dagger.devices.discovery import KEYBOARD
from hg_dagger.ui import style
from hg_dagger.ui.main_window import MainWindow
from hg_dagger.ui.rounds import read_training_summary, training_summary
from hg_dagger.ui.start_dialog import StartDialog
from hg_dagger.ui.view import LOADING

pytestmark = [pytest.mark.simulation, pytest.mark.app]

EP1, EP2 = "68a3f1c2" + "0" * 24, "4720e4aa" + "1" * 24
KEYBOARD_STATE = DeviceState(device_id="keyboard", kind="keyboard", connected=True)


@pytest.fixture
def console(qtbot, settings):
    slot, q = LatestSlot(), CommandQueue()
    win = MainWindow(slot, q, settings=settings, scan=lambda: [KEYBOARD], refresh_hz=60)
    qtbot.addWidget(win)
    win.resize(1600, 1000)
    win.show()
    qtbot.waitExposed(win)
    yield win, slot, q
    win.close()


def show(qtbot, win, slot, s: Snapshot) -> None:
    slot.publish(s)
    qtbot.waitUntil(lambda: win.reader.last is s, timeout=5000)
    QApplication.processEvents()


_seq = iter(range(1, 1_000_000))


def running(task="fetch_pick_place", **kw) -> Snapshot:
    n = 4 if task.startswith("fetch") else 2
    names = ("dx", "dy", "dz", "gripper") if n == 4 else ("shoulder_vel", "elbow_vel")
    base = dict(seq=next(_seq), t_ns=now_ns(), task=task, phase="running", episode_id=EP1, episode_step=30,
                control_state="autonomous", action_names=names, policy_action=np.zeros(n, np.float32),
                applied_action=np.zeros(n, np.float32), uncertainty=0.05, confidence=0.5,
                thresholds={"warn": 0.180, "trigger": 0.183}, progress=-0.2, device=KEYBOARD_STATE,
                frame=np.zeros((64, 96, 3), np.uint8), operator="op-07",
                rounds=tuple({"round": i, "policy_version": f"round-{i:02d}", "episodes": 10, "success_rate": 0.4,
                              "intervention_rate": 0.3, "human_labels": 100 * i, "requests_answered": 2,
                              "requests_declined": 1, "requests_expired": 0} for i in range(4)))
    base.update(kw)
    return Snapshot(**base)


def requested(**kw) -> Snapshot:
    return running(control_state="handover_requested", gate_level=2, gate_reason="confidence",
                   t_request_ns=now_ns() - 2_000_000_000, request_wait_s=2.0, **kw)


def geometry(win) -> dict[str, QRect]:
    """Where each part of the console sits in the window."""
    parts = {"view": win.view, "plots": win.plots, "gate_plot": win.plots.gate, "actions": win.plots.actions,
             "controls": win.controls, "tabs": win.tabs, "health": win.health, "gate": win.gate,
             "estop": win.estop, "banner": win.banner, "estop_button": win.estop.button}
    return {k: QRect(w.mapTo(win, w.rect().topLeft()), w.size()) for k, w in parts.items()}


def test_nothing_moves_when_a_gate_asks_or_the_person_drives_or_the_estop_latches(qtbot, console):
    win, slot, q = console
    show(qtbot, win, slot, running())
    qtbot.wait(50)
    before = geometry(win)
    show(qtbot, win, slot, requested())
    assert win.banner.look == "request" and win.banner.decline.isVisible()
    assert geometry(win) == before
    show(qtbot, win, slot, running(control_state="human"))
    assert win.banner.look == "human" and geometry(win) == before
    show(qtbot, win, slot, running(control_state="warning", gate_reason="a much longer gate reason " * 8))
    assert geometry(win) == before  # a long reason is cut to its line, in full as tooltip
    r = win.gate.reason
    assert r.fontMetrics().horizontalAdvance(r.text()) <= r.width() and r.text().endswith("…")
    assert r.toolTip().startswith("a much longer gate reason")
    show(qtbot, win, slot, running(phase="estopped", control_state="safe_stop", estop=("keyboard", "Esc key")))
    assert win.estop.reset.isVisible() and geometry(win) == before


def test_take_over_and_in_control_look_different(qtbot, console):
    win, slot, _ = console
    show(qtbot, win, slot, requested())
    asked = (win.gate.colour, win.gate.headline.text())
    show(qtbot, win, slot, running(control_state="human"))
    driving = (win.gate.colour, win.gate.headline.text())
    assert asked == (style.REQUEST, "HANDOVER REQUESTED") and driving == (style.HUMAN, "YOU ARE IN CONTROL")
    synthetic = DeviceState(device_id="synthetic", kind="synthetic", connected=True)
    show(qtbot, win, slot, running(control_state="human", device=synthetic))
    assert win.gate.headline.text() == "SYNTHETIC OPERATOR IN CONTROL"  # not "you" when a script drives


def test_a_waiting_request_says_take_over_once_and_the_phase_line_says_the_robot_waits(qtbot, console):
    win, slot, _ = console
    show(qtbot, win, slot, requested())
    saying = [w.text() for w in win.findChildren(QLabel) if "TAKE OVER" in w.text().upper() and w.isVisible()]
    assert saying == ["TAKE OVER!   waiting 2.0 s"]  # the strip; the light names the state
    assert win.controls.phase_label.text() == "Phase: running · the robot waits for the operator"
    show(qtbot, win, slot, running(control_state="human"))
    assert "waits for the operator" not in win.controls.phase_label.text()
    show(qtbot, win, slot, requested(estop=("keyboard", "Esc key"), phase="estopped"))
    assert "waits for the operator" not in win.controls.phase_label.text()  # the e-stop says why it holds


def test_decline_key_and_button_let_the_student_go_on(qtbot, console):
    win, slot, q = console
    show(qtbot, win, slot, running())
    q.drain()
    QTest.keyClick(win.view, Qt.Key.Key_N)  # nothing asks: N is just a key
    assert DeclineRequest() not in q.drain()
    show(qtbot, win, slot, requested())
    assert "N or the button: let the student go on" in win.banner.hint.text()
    assert win.banner.decline.text() == "Let the student go on (N)"
    QTest.keyClick(win.view, Qt.Key.Key_N)
    assert q.drain() == [DeclineRequest()]
    QTest.mouseClick(win.banner.decline, Qt.MouseButton.LeftButton)
    assert q.drain() == [DeclineRequest()]


def sent(q: CommandQueue) -> list:
    """The commands sent, less the ReleaseKeys that focus moving between the window and a dialog sends
    (tests/ui/test_ui_controls.py covers those)."""
    return [c for c in q.drain() if not isinstance(c, ReleaseKeys)]


def ok(dlg) -> None:
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()


def test_discard_names_its_episode_holds_starts_and_the_keyboard_still_takes_over(qtbot, console):
    win, slot, q = console
    c = win.controls
    show(qtbot, win, slot, running())
    assert c.title() == "Episode 68a3f1c2"
    sent(q)
    QTest.mouseClick(c.discard, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(c.dialogs) and c.dialogs[0].isVisible(), timeout=5000)
    dlg = c.dialogs[0]
    assert not dlg.isModal() and "68a3f1c2" in dlg.text.text()
    assert sent(q) == [HoldStarts(True)]
    qtbot.waitUntil(lambda: QApplication.focusWidget() is dlg.reason, timeout=5000)  # it asks with the focus on why
    QTest.keyClicks(dlg.reason, "bumped the table")  # typing is text while nothing asks
    assert dlg.reason.text() == "bumped the table" and sent(q) == []

    # a gate fires while the person types: the banner asks and says how to leave the field; the typing stays
    # text (its spaces never take over, its "n" never declines: the robot holds while it waits)
    show(qtbot, win, slot, requested())
    assert win.banner.look == "request" and win.banner.isVisible()
    QTest.keyClicks(dlg.reason, " again")
    assert dlg.reason.text() == "bumped the table again" and sent(q) == []
    qtbot.waitUntil(lambda: "typing in a dialog: Tab out of the field" in win.banner.hint.text(), timeout=5000)
    # Tab out of the field: now Space in the dialog takes over, and no button is clicked
    QTest.keyClick(dlg.reason, Qt.Key.Key_Tab)
    qtbot.waitUntil(lambda: QApplication.focusWidget() not in (None, dlg.reason), timeout=5000)
    button = QApplication.focusWidget()
    assert button.window() is dlg
    QTest.keyPress(button, Qt.Key.Key_Space)
    QTest.keyPress(button, Qt.Key.Key_W)
    assert sent(q) == [KeyEvent("space", True), KeyEvent("w", True)] and dlg.isVisible()
    qtbot.waitUntil(lambda: "typing in a dialog" not in win.banner.hint.text(), timeout=5000)
    assert dlg.reason.text() == "bumped the table again"  # the keys went to the robot, not into the reason
    show(qtbot, win, slot, running(control_state="human"))
    show(qtbot, win, slot, running(phase="idle", episode_id=None))  # the episode ends while W is still held
    QApplication.sendEvent(dlg.reason, QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_W, Qt.KeyboardModifier.NoModifier,
                                                 "w", True))  # its auto-repeat stays the robot's, never text
    assert dlg.reason.text() == "bumped the table again"
    QTest.keyRelease(dlg.reason, Qt.Key.Key_W)
    QTest.keyRelease(dlg.reason, Qt.Key.Key_Space)
    assert sent(q) == [KeyEvent("w", False), KeyEvent("space", False)]

    # the episode ends and another begins meanwhile (starts are held, but an episode may end): the
    # discard still names and hits the one the dialog opened on
    show(qtbot, win, slot, running(episode_id=EP2))
    assert "68a3f1c2 has ended" in dlg.note.text()
    ok(dlg)
    assert sent(q) == [DiscardEpisode("bumped the table again", episode_id=EP1), HoldStarts(False)]


def test_keys_meant_for_the_robot_never_answer_a_dialog(qtbot, console):
    """A person opens Discard..., types why, Tabs to the buttons and corrects with the dialog open. Space on
    a focused button is the take-over, never a click, even while nothing asks; the episode ends while Space is
    held and their Enter (hand back) stays the robot's, and in the reason field too for a moment after they
    let go: the correction is not discarded. Enter in the reason field answers the dialog once the drive is
    over; the mouse answers it any time."""
    from hg_dagger.ui import keys

    win, slot, q = console
    show(qtbot, win, slot, running())
    QTest.mouseClick(win.controls.discard, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(win.controls.dialogs) and win.controls.dialogs[0].isVisible(), timeout=5000)
    dlg = win.controls.dialogs[0]
    qtbot.waitUntil(lambda: QApplication.focusWidget() is dlg.reason, timeout=5000)
    QTest.keyClicks(dlg.reason, "bumped")
    QTest.keyClick(dlg.reason, Qt.Key.Key_Tab)
    qtbot.waitUntil(lambda: QApplication.focusWidget() not in (None, dlg.reason), timeout=5000)
    button = QApplication.focusWidget()
    assert button.window() is dlg
    sent(q)
    QTest.keyClick(button, Qt.Key.Key_Space)  # nothing asks: still the take-over key, not a click
    assert sent(q) == [KeyEvent("space", True), KeyEvent("space", False)] and dlg.isVisible()
    show(qtbot, win, slot, requested())
    QTest.keyPress(button, Qt.Key.Key_Space)
    show(qtbot, win, slot, running(control_state="human"))
    show(qtbot, win, slot, running(phase="idle", episode_id=None, ended_episode_id=EP1))  # the episode ends
    QTest.keyClick(button, Qt.Key.Key_Return)  # Space still held: the hand-back key is the robot's
    QTest.keyRelease(button, Qt.Key.Key_Space)
    assert sent(q) == [KeyEvent("space", True), KeyEvent("enter", True), KeyEvent("enter", False),
                       KeyEvent("space", False)] and dlg.isVisible()
    dlg.reason.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is dlg.reason, timeout=5000)
    QTest.keyClick(dlg.reason, Qt.Key.Key_Return)  # let go a moment ago: in the field too, the robot's
    assert sent(q) == [KeyEvent("enter", True), KeyEvent("enter", False)] and dlg.isVisible()
    assert dlg.reason.text() == "bumped"
    qtbot.wait(int(keys.AFTER_DRIVE_S * 1000) + 100)  # the moment passes
    QTest.keyClick(dlg.reason, Qt.Key.Key_Return)  # Enter in the field answers: the discard names the episode
    qtbot.waitUntil(lambda: not dlg.isVisible(), timeout=5000)
    assert sent(q) == [DiscardEpisode("bumped", episode_id=EP1), HoldStarts(False)]


def test_an_empty_reason_is_asked_for_and_the_dialog_grows_to_show_it(qtbot, console):
    win, slot, q = console
    show(qtbot, win, slot, running())
    dlg = win.controls.ask_discard()
    qtbot.waitUntil(dlg.isVisible, timeout=5000)
    ok(dlg)
    assert dlg.isVisible() and "A reason is required." in dlg.text.text()
    show(qtbot, win, slot, running(phase="idle", episode_id=None))  # and the note that it ended
    qtbot.waitUntil(lambda: "has ended" in dlg.note.text(), timeout=5000)
    for label in (dlg.text, dlg.note):  # every line shows: the dialog is at least as tall as its text needs
        qtbot.waitUntil(lambda label=label: label.height() >= label.heightForWidth(label.width()), timeout=5000)
    assert DiscardEpisode not in map(type, sent(q))


def test_between_episodes_discard_is_for_the_one_that_just_ended(qtbot, console):
    win, slot, q = console
    c = win.controls
    show(qtbot, win, slot, running(phase="idle", episode_id=None, ended_episode_id=EP1))
    assert c.title() == "Episode 68a3f1c2 (ended)" and c.discard.isEnabled() and not c.success.isEnabled()
    sent(q)
    dlg = c.ask_discard()
    dlg.reason.setText("the block fell off the table")
    ok(dlg)
    assert sent(q) == [HoldStarts(True), DiscardEpisode("the block fell off the table", episode_id=EP1),
                       HoldStarts(False)]
    show(qtbot, win, slot, running(phase="idle", episode_id=None, ended_episode_id=EP1,
                                   discarded_this_sitting=(EP1,)))
    assert not c.discard.isEnabled() and c.undo.isEnabled()  # discarded already: undo it instead


def test_esc_in_a_dialog_or_the_help_closes_it_and_stops_nothing(qtbot, console):
    win, slot, q = console
    show(qtbot, win, slot, running())
    sent(q)
    dlg = win.controls.ask_discard()
    qtbot.waitUntil(dlg.isVisible, timeout=5000)
    QTest.keyClick(dlg.reason, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not dlg.isVisible(), timeout=5000)
    assert sent(q) == [HoldStarts(True), HoldStarts(False)]  # no EStop
    win.help_action.trigger()
    qtbot.waitUntil(win.help_dialog.isVisible, timeout=5000)
    QTest.keyClick(win.help_dialog.table, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not win.help_dialog.isVisible(), timeout=5000)
    assert sent(q) == []
    QTest.keyClick(win.view, Qt.Key.Key_Escape)  # in the console Esc is the e-stop, as its button says
    assert sent(q) == [EStop(source="keyboard", reason="Esc key")]
    assert "(Esc)" in win.estop.button.text()


def test_verdicts_flag_and_undo_name_what_they_act_on(qtbot, console):
    win, slot, q = console
    c = win.controls
    show(qtbot, win, slot, running(last_window_id="w" * 32, discarded_this_sitting=(EP2, "9" * 32)))
    sent(q)
    dlg = c.ask_outcome(True)
    assert "68a3f1c2" in dlg.text.text() and "success" in dlg.text.text()
    show(qtbot, win, slot, running(episode_step=40))  # still running: the verdict goes to it
    ok(dlg)
    assert sent(q) == [HoldStarts(True), MarkOutcome(True, episode_id=EP1), HoldStarts(False)]
    late = c.ask_outcome(False)
    show(qtbot, win, slot, running(episode_id=EP2))  # it ended meanwhile: a verdict now would be refused
    assert "68a3f1c2 has ended; its record stays" in late.note.text()
    assert not late.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    late.reject()
    assert sent(q) == [HoldStarts(True), HoldStarts(False)]

    show(qtbot, win, slot, running(last_window_id="w" * 32, discarded_this_sitting=(EP2, "9" * 32)))
    assert c.flag.isEnabled() and c.undo.isEnabled()
    flag = c.ask_flag()
    assert "wwwwwwww" in flag.text.text()
    flag.reason.setText("steered into the table")
    ok(flag)
    undo = c.ask_undo()
    assert undo.choice.count() == 2 and undo.target == "9" * 32  # the newest discard first
    undo.choice.setCurrentIndex(1)
    assert EP2[:8] in undo.text.text()
    ok(undo)
    assert sent(q) == [FlagCorrection("w" * 32, "steered into the table"), UndoDiscard(EP2)]  # no HoldStarts
    show(qtbot, win, slot, running())
    assert not c.flag.isEnabled() and not c.undo.isEnabled()


def test_loading_says_so_and_start_waits(qtbot, console):
    win, slot, _ = console
    show(qtbot, win, slot, Snapshot(seq=next(_seq), phase="loading", loading=True, task="toy_reach"))
    assert not win.controls.start.isEnabled() and win.controls.start.text() == "Loading..."
    assert win.gate.headline.text() == "LOADING" and win.view.message == LOADING
    assert win.device.link.text() == "loading..." and win.banner.label.text() == "Loading..."
    show(qtbot, win, slot, Snapshot(seq=next(_seq), phase="idle", task="toy_reach", device=KEYBOARD_STATE))
    assert win.controls.start.isEnabled() and win.controls.start.text() == "Start"
    assert win.device.link.text() == "connected"


def test_the_task_key_map_is_on_screen_and_keys_show_as_not_engaged(qtbot, console):
    win, slot, _ = console
    axes = np.array([1, 0, 0, 0, 0, 0, -1], np.float32)  # W held, Space not: the student drives
    show(qtbot, win, slot, running(task="toy_reach", device=DeviceState(device_id="keyboard", kind="keyboard",
                                                                         connected=True, axes=axes)))
    bars = win.device.bars
    assert [b.label for b in bars] == ["shoulder_vel  [W / S]", "elbow_vel  [A / D]"]  # two joints, two rows
    assert bars[0].value == 1.0 and not bars[0].engaged
    assert win.device.engaged.text() == "not engaged: moves nothing"
    assert "hold Space to steer" in win.banner.hint.text() and "A / D: elbow_vel" in win.banner.hint.text()
    show(qtbot, win, slot, running(task="toy_reach", device=DeviceState(device_id="keyboard", kind="keyboard",
                                                                         connected=True, engaged=True, axes=axes)))
    assert win.device.bars[0].engaged and win.device.engaged.text() == "ENGAGED"
    show(qtbot, win, slot, running())
    assert [b.name for b in win.device.bars] == ["dx", "dy", "dz", "gripper"]
    assert win.device.bars[3].control == "G (toggle)"
    win.help_action.trigger()
    assert win.help_dialog.task_keys.text().startswith("<b>fetch_pick_place</b>: W / S: dx")


def test_estop_latched_text_fits_its_button(qtbot, console):
    win, slot, _ = console
    show(qtbot, win, slot, running(phase="estopped", control_state="safe_stop",
                                   estop=("keyboard", "Esc key in the app window, pressed by a person in a hurry")))
    e = win.estop
    assert e.button.fontMetrics().horizontalAdvance(e.button.text()) < e.button.width()
    assert e.detail.fontMetrics().horizontalAdvance(e.detail.text()) <= e.detail.width()
    assert e.detail.text().startswith("keyboard: Esc key") and e.detail.toolTip().endswith("in a hurry")
    assert e.detail.geometry().top() > e.button.geometry().bottom()  # beneath the button, not over it
    assert e.reset.geometry().top() > e.detail.geometry().bottom()


def test_rounds_show_requests_what_reached_training_and_several_rows(qtbot, console, tmp_path):
    win, slot, _ = console
    win.tabs.setCurrentWidget(win.rounds)
    show(qtbot, win, slot, running(counters=Counters(requests_answered=12, requests_declined=3, requests_expired=1)))
    assert win.rounds.requests.text() == "Requests: 12 answered, 3 declined, 1 expired"
    t = win.rounds.table
    assert t.rowCount() == 4 and t.item(0, 6).text() == "2/1/0"  # requests of that round
    visible = t.viewport().height() // t.rowHeight(0)
    assert visible >= 3, f"the rounds table shows {visible} rows"
    assert t.horizontalHeader().length() <= t.viewport().width()  # every column in view, none cut
    assert all(t.columnWidth(c) >= t.sizeHintForColumn(c) for c in range(t.columnCount()))
    selection = {"labels": 1020, "allowed": 956, "rejected": 20, "qc_failed": 15, "not_reviewed": 29}
    text = training_summary(selection)
    assert text == "956 of 1,020 labels reached training; 29 not reviewed, 20 rejected, 15 failed QC"
    (tmp_path / "train.json").write_text(f'{{"selection": {selection!r}}}'.replace("'", '"'))
    assert read_training_summary(str(tmp_path / "student.pt")) == text
    assert read_training_summary(str(tmp_path / "nowhere" / "student.pt")) == ""
    win.set_training_done("new student round-04 (956 labels)", text)
    assert win.rounds.trained.text() == f"Last training: {text}"


def test_plots_are_readable_at_1600_by_1000(qtbot, console):
    win, slot, _ = console
    for _ in range(3):
        show(qtbot, win, slot, running(uncertainty=0.19))
    qtbot.wait(700)  # a range growth falls due
    show(qtbot, win, slot, running(uncertainty=0.19))
    boxes = [win.plots.gate.plot.getPlotItem().vb, win.plots.progress.plot.getPlotItem().vb,
             *[p.vb for p in win.plots.actions.plots]]
    heights = [round(b.height()) for b in boxes]
    assert min(heights) >= 60, heights
    lines = win.plots.gate.lines
    warn, trigger = (lines[k].label.sceneBoundingRect() for k in ("warn", "trigger"))
    assert lines["warn"].isVisible() and lines["trigger"].isVisible()
    assert not warn.intersects(trigger), (warn, trigger)  # 0.180 and 0.183: apart all the same
    title = win.plots.gate.plot.getPlotItem().titleLabel.text
    assert all(k in title for k in ("uncertainty", "confidence", "warn", "trigger"))  # the legend is whole
    assert all(k in win.plots.actions.legend.text() for k in ("policy", "you", "applied"))


def test_status_bar_counts_estops_apart_from_successes(qtbot, console):
    win, slot, _ = console
    show(qtbot, win, slot, running(counters=Counters(episodes=2, successes=1, estops=1)))
    assert "Successes 1 | E-stops 1" in win.status.counters.text()


def test_a_task_from_the_command_line_wins_over_the_remembered_one(qtbot, settings):
    settings.data.start.task = "fetch_pick_place"
    remembered = StartDialog(settings=settings)
    qtbot.addWidget(remembered)
    assert remembered.task.currentText() == "fetch_pick_place"
    given = StartDialog(settings=settings, task="toy_reach")
    qtbot.addWidget(given)
    assert given.task.currentText() == "toy_reach"


def test_the_window_with_its_review_page_fits_a_1000_pixel_screen(qtbot, settings, tmp_path):
    win = MainWindow(LatestSlot(), CommandQueue(), settings=settings, scan=lambda: [KEYBOARD],
                     review_store=str(tmp_path / "store.zarr"))
    qtbot.addWidget(win)
    assert win.minimumSizeHint().height() <= 900, win.minimumSizeHint()  # the review page scrolls instead
    win.show_review()
    assert win.reviewing
    win.show_console()
    assert not win.reviewing
    win.close()
