"""The Review tab of the operator app, on the store a real session records to: the windows of each episode the
session ends appear without a reload, decisions are recorded under a reviewer pseudonym asked at the first
decision, keys on the tab scrub the review instead of moving the robot (Esc still stops it), and a gate asking
for the operator brings the console back."""

from __future__ import annotations

import pytest
from PyQt6.QtCore import Qt, QTimer
from PyQt6.QtWidgets import QApplication, QInputDialog
from support.app import WAIT_MS, close_app, wait_snap

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.control import live
from hg_dagger.review.decisions import audit_trail, list_windows
from hg_dagger.ui.application import AppOptions, OperatorApp

pytestmark = [pytest.mark.subprocess, pytest.mark.app]


def answer_reviewer_dialog(seen: list[str], text: str | None = None) -> None:
    """Answer the reviewer dialog once it is open: record what it offered, keep it or type ``text``."""

    def poll():
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog):
            QTimer.singleShot(20, poll)
            return
        seen.append(dialog.textValue())
        if text is not None:
            dialog.setTextValue(text)
        dialog.accept()

    QTimer.singleShot(0, poll)


def open_app(qtbot, opts, settings):
    op = OperatorApp(opts, settings)
    op.start()
    assert op.window is not None and op.window.review is not None
    qtbot.addWidget(op.window)
    return op


def test_review_tab_shows_the_session_and_records_decisions(qtbot, tmp_path, settings, toy_student):
    store = str(tmp_path / "store.zarr")
    opts = AppOptions(task="toy_reach", store=store, student=toy_student, operator="synthetic", name="op-rev",
                      home=str(tmp_path / "home"), train_steps=60)
    op = open_app(qtbot, opts, settings)
    win, ws = op.window, op.window.review
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and s.seq > 2)
    assert not ws.rows_loaded and not ws.loading  # nothing is read before the tab is shown
    win.show_review()
    assert win.reviewing and not win.keys.enabled
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT_MS)
    assert ws.browser.model.rowCount() == 0

    # the session records while the reviewer looks: each ended episode's windows appear without a reload
    for k in range(1, 7):
        op.loop.commands.put(live.StartEpisodes(1))  # what the console's Start button sends
        wait_snap(qtbot, op, lambda s, k=k: s.counters.episodes == k and s.phase == "idle")
        expected = [w.window_id for w in list_windows(store)]
        qtbot.waitUntil(lambda expected=expected: [r.window_id for r in ws.browser.visible_rows()] == expected,
                        timeout=WAIT_MS)
        if k >= 2 and len(expected) >= 2:
            break
    assert len(expected) >= 2, "the session's gates fired"
    episodes = k
    rows = ws.browser.visible_rows()
    assert all(r.window.operator == "op-rev" and r.mode == "human_gated" and r.privacy.startswith("pseudonymised")
               for r in rows)
    n_eps = len({r.window.episode_id for r in rows})
    assert ws.browser.counts.text().startswith(f"{len(rows)} window(s): {len(rows)} pending; {n_eps} episode(s)")

    # select a window: its episode is read, and the keys scrub it (the keyboard bridge is off on this page)
    row = rows[0]
    ws.browser.select(row.window_id)
    qtbot.waitUntil(lambda: ws.episode.data is not None and ws.episode.data.episode_id == row.window.episode_id
                    and ws.worker.pending == 0, timeout=WAIT_MS)
    start = ws.episode.step
    assert start == max(0, row.window.handover_start - row.context_before)
    ws.episode.setFocus()
    qtbot.keyClick(ws.episode, Qt.Key.Key_Right)
    qtbot.keyClick(ws.episode, Qt.Key.Key_Right)
    assert ws.episode.step == start + 2 and win.keys.held == set()

    # the first decision asks for a reviewer pseudonym of their own: nothing offered, never the operator's
    offered: list[str] = []
    answer_reviewer_dialog(offered, "rev-1")
    ws.panel.authorize.setChecked(True)
    qtbot.mouseClick(ws.panel.approve_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(ws.panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT_MS)
    assert offered == [""] and ws.reviewer == "rev-1"
    # another pseudonym for the next decisions
    answer_reviewer_dialog(offered, "rev-2")
    qtbot.mouseClick(ws.panel.change_button, Qt.MouseButton.LeftButton)
    assert ws.reviewer == "rev-2" and offered == ["", "rev-1"]
    other = rows[1]
    ws.browser.select(other.window_id)
    qtbot.waitUntil(lambda: ws.panel.row is not None and ws.panel.row.window_id == other.window_id
                    and ws.worker.pending == 0, timeout=WAIT_MS)
    ws.panel.reason.setPlainText("hand-back too early")
    qtbot.mouseClick(ws.panel.reject_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(ws.panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT_MS)
    assert [(e.decision.reviewer, e.decision.status, e.decision.replay_training_authorized)
            for e in audit_trail(store, row.window_id)] == [("rev-1", ReviewStatus.APPROVED, True)]
    assert [(e.decision.reviewer, e.decision.status, e.decision.notes)
            for e in audit_trail(store, other.window_id)] == [("rev-2", ReviewStatus.REJECTED, "hand-back too early")]
    status = {r.window_id: r.window.status for r in ws.browser.model.rows}
    assert status[row.window_id] == ReviewStatus.APPROVED and status[other.window_id] == ReviewStatus.REJECTED

    # a third episode after the decisions: its windows join, the decided rows keep their state
    op.loop.commands.put(live.StartEpisodes(1))
    wait_snap(qtbot, op, lambda s: s.counters.episodes == episodes + 1 and s.phase == "idle")
    qtbot.waitUntil(lambda: ws.browser.model.rowCount() == len(list_windows(store)), timeout=WAIT_MS)
    status = {r.window_id: r.window.status for r in ws.browser.model.rows}
    assert status[row.window_id] == ReviewStatus.APPROVED and status[other.window_id] == ReviewStatus.REJECTED

    # the next round runs QC before training: the tab shows its verdicts and keeps the selected window
    op.train_next(keep_running=True)
    qtbot.waitUntil(lambda: op.job is None, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: ws.rows_loaded and ws.worker.pending == 0 and ws.browser.model.rowCount()
                    and all(r.qc != "no QC" for r in ws.browser.model.rows), timeout=WAIT_MS)
    assert ws.browser.current().window_id == other.window_id and ws.panel.row.window_id == other.window_id
    # and it trained on exactly the approved, authorized window's human labels; the rejected one stopped
    import json

    import numpy as np

    from hg_dagger.contract import ActionSource, LabelMask
    from hg_dagger.store import EpisodeStore

    def human_labels(w):
        st = EpisodeStore.open(store)
        src = st.read_steps(w.episode_id, ["action_source"])["action_source"][w.handover_start:w.handover_end]
        mask = st.labels(w.episode_id).mask[w.handover_start:w.handover_end]
        return int(np.sum((src == ActionSource.HUMAN.code) & (mask == LabelMask.TRAINABLE.code)))

    (train_json,) = op.opts.task_dir.glob("students/round-*/train.json")
    sel = json.loads(train_json.read_text())["selection"]
    assert sel["allowed"] == human_labels(row.window) > 0
    assert sel["rejected"] == human_labels(other.window)

    # Esc on the review page still stops the robot
    qtbot.keyClick(ws.browser.table, Qt.Key.Key_Escape)
    wait_snap(qtbot, op, lambda s: s.estop is not None)
    win.show_console()
    assert win.keys.enabled
    assert close_app(qtbot, op) == 0


def test_keys_on_the_review_tab_never_reach_the_robot_and_a_gate_brings_the_console_back(qtbot, tmp_path, settings,
                                                                                          toy_student):
    store = str(tmp_path / "store.zarr")
    opts = AppOptions(task="toy_reach", store=store, student=toy_student, operator="device", device="keyboard",
                      name="op-keys", home=str(tmp_path / "home"))
    op = open_app(qtbot, opts, settings)
    win, ws = op.window, op.window.review
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and s.seq > 2)
    win.show_review()
    op.loop.commands.put(live.StartEpisodes(1))
    running = wait_snap(qtbot, op, lambda s: s.phase == "running" and s.episode_step >= 2)
    # Space (hold to intervene) and W pressed on the review page: the robot's keyboard does not see them
    if win.reviewing:  # (a gate may already have brought the console back)
        qtbot.keyPress(ws.browser.table, Qt.Key.Key_Space)
        qtbot.keyPress(ws.browser.table, Qt.Key.Key_W)
        later = wait_snap(qtbot, op, lambda s: s.health.ticks >= running.health.ticks + 10)
        assert not later.device.engaged and later.control_state != "human"
        qtbot.keyRelease(ws.browser.table, Qt.Key.Key_W)
        qtbot.keyRelease(ws.browser.table, Qt.Key.Key_Space)
    # a gate fires and asks for the operator: the console comes back, and the keys drive again
    wait_snap(qtbot, op, lambda s: s.control_state == "handover_requested")
    qtbot.waitUntil(lambda: not win.reviewing, timeout=WAIT_MS)
    assert win.keys.enabled
    qtbot.keyPress(win, Qt.Key.Key_Space)
    qtbot.keyPress(win, Qt.Key.Key_W)
    wait_snap(qtbot, op, lambda s: s.control_state == "human" and s.device.engaged)
    qtbot.keyRelease(win, Qt.Key.Key_W)
    qtbot.keyRelease(win, Qt.Key.Key_Space)
    assert close_app(qtbot, op) == 0
