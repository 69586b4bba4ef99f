"""The review workspace on stores recorded for real (toy_reach, synthetic operator, an eager gate): the window
table, the episode timeline coloured by action source, scrubbing, and decisions made through the buttons."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PyQt6.QtCore import QPointF, Qt

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.review.decisions import audit_trail, list_windows
from hg_dagger.store import EpisodeStore
from hg_dagger.ui import style
from hg_dagger.ui.review import ReviewWorkspace
from hg_dagger.ui.review.browser import COLUMNS
from hg_dagger.ui.review.model import Marker

pytestmark = [pytest.mark.subprocess, pytest.mark.app]

REVIEWER = "rev-7"
WAIT = 60_000  # ms; generous, the machine is shared
EAGER = {"name": "eager", "task": "toy_reach",
         "gates": [{"type": "confidence", "trigger": 1e-9, "debounce_ticks": 1}]}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two toy_reach episodes from the real gated session with the synthetic operator; several windows."""
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    path = tmp_path_factory.mktemp("review_ui") / "store"
    cfg = load_run_config(None, "toy_reach", episodes=2, num_envs=1, calibrate_steps=0, gates=EAGER,
                          **{"operator.return_after_steps": 12})
    run_gated(cfg, str(path), progress=False)
    assert len(list_windows(path)) >= 2
    return path


@pytest.fixture
def store(recorded, tmp_path):
    path = tmp_path / "store"
    shutil.copytree(recorded, path)
    return str(path)


def _opened(qtbot, stores, reviewer=REVIEWER):
    """A review workspace on ``stores``, shown, with its rows loaded."""
    ws = ReviewWorkspace(stores, reviewer)
    qtbot.addWidget(ws)
    ws.show()
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    return ws


def _auth_column(ws, key) -> dict:
    """The table's "auth" column by ``key(row)``."""
    model, col = ws.browser.model, COLUMNS.index("auth")
    return {key(model.rows[i]): model.data(model.index(i, col)) for i in range(model.rowCount())}


@pytest.fixture
def workspace(qtbot, store):
    ws = _opened(qtbot, [store])
    yield ws
    ws.close()


def _select(qtbot, ws, row_index: int):
    row = ws.browser.visible_rows()[row_index]
    ws.browser.select(row.window_id)
    qtbot.waitUntil(lambda: ws.shown is not None and ws.shown.window_id == row.window_id
                    and ws.episode.data is not None and ws.episode.data.episode_id == row.window.episode_id,
                    timeout=WAIT)
    qtbot.waitUntil(lambda: ws.worker.pending == 0, timeout=WAIT)
    return row


def test_table_lists_every_window_with_filters_and_counts(workspace, store):
    ws = workspace
    expected = list_windows(store)
    rows = ws.browser.visible_rows()
    assert [r.window_id for r in rows] == [r.window_id for r in expected]
    assert ws.browser.model.rowCount() == len(expected)
    assert ws.browser.counts.text().startswith(f"{len(expected)} window(s): {len(expected)} pending")
    assert all(r.qc == "no QC" and r.replay == "unverified" and r.window.operator == "synthetic" for r in rows)
    ws.browser.set_filter("status", "approved")
    assert ws.browser.visible_rows() == []
    ws.browser.set_filter("status", "pending")
    assert len(ws.browser.visible_rows()) == len(expected)
    # sorting by a column reorders the rows
    ws.browser.table.sortByColumn(COLUMNS.index("steps"), Qt.SortOrder.DescendingOrder)
    starts = [(r.window.handover_start, r.window.handover_end) for r in ws.browser.visible_rows()]
    assert starts == sorted(starts, reverse=True)


def test_timeline_colours_markers_and_scrubbing(qtbot, workspace, store):
    ws = workspace
    row = _select(qtbot, ws, 0)
    eid = row.window.episode_id
    source = EpisodeStore.open(store).read_steps(eid, ["action_source"])["action_source"]
    colours = ws.episode.timeline.colours
    assert len(colours) == len(source)
    human = np.flatnonzero(source == 1)
    policy = np.flatnonzero(source == 0)
    assert human.size and policy.size
    assert {colours[i] for i in human} == {style.HUMAN}
    assert {colours[i] for i in policy} == {style.POLICY}
    assert all(source[s] == 1 for s in range(row.window.handover_start, row.window.handover_end))
    assert (row.window.handover_start, row.window.handover_end, "window") in ws.episode.timeline.regions
    info = EpisodeStore.open(store).info(eid)
    gates = {e.step for e in info.end.events if e.kind.value == "gate_trigger"}
    assert gates and gates <= {s for s, k in ws.episode.timeline.markers if k == "gate_trigger"}
    np.testing.assert_array_equal(ws.episode.plots.human_steps, human)
    assert len(ws.episode.plots.cursors) == len(ws.episode.data.action_names) == 2
    # the slider moves the timeline cursor, the plot cursors and the observation text
    ws.episode.slider.setValue(10)
    assert ws.episode.step == 10
    assert ws.episode.timeline.cursor.value() == pytest.approx(10.5)
    assert all(c.value() == pytest.approx(10) for c in ws.episode.plots.cursors)
    qpos = EpisodeStore.open(store).read_steps(eid, ["obs/qpos"])["obs/qpos"]
    assert f"qpos: {qpos[10][0]:+.3f}" in ws.episode.frame.text()
    # keys: Right, Left, and Space plays at the recorded rate until Space again
    ws.episode.setFocus()
    qtbot.keyClick(ws.episode, Qt.Key.Key_Right)
    assert ws.episode.step == 11 and all(c.value() == pytest.approx(11) for c in ws.episode.plots.cursors)
    qtbot.keyClick(ws.episode, Qt.Key.Key_Left)
    qtbot.keyClick(ws.episode, Qt.Key.Key_Left)
    assert ws.episode.step == 9 and ws.episode.slider.value() == 9
    qtbot.keyClick(ws.episode, Qt.Key.Key_Space)
    assert ws.episode.playing and ws.episode.timer.interval() == round(1000 / info.start.control_hz)
    qtbot.waitUntil(lambda: ws.episode.step >= 12, timeout=WAIT)
    qtbot.keyClick(ws.episode, Qt.Key.Key_Space)
    assert not ws.episode.playing
    assert ws.episode.timeline.cursor.value() == pytest.approx(ws.episode.step + 0.5)
    # pressing on the timeline scrubs to the step under the mouse, and dragging follows it
    tl = ws.episode.timeline

    def at(step):
        return tl.mapFromScene(tl.getPlotItem().vb.mapViewToScene(QPointF(step + 0.5, 0.5)))

    qtbot.mouseClick(tl.viewport(), Qt.MouseButton.LeftButton, pos=at(20))
    assert ws.episode.step == 20 and ws.episode.slider.value() == 20
    assert all(c.value() == pytest.approx(20) for c in ws.episode.plots.cursors)
    qtbot.mousePress(tl.viewport(), Qt.MouseButton.LeftButton, pos=at(5))
    qtbot.mouseMove(tl.viewport(), at(8))
    qtbot.mouseRelease(tl.viewport(), Qt.MouseButton.LeftButton, pos=at(8))
    assert ws.episode.step == 8 and f"qpos: {qpos[8][0]:+.3f}" in ws.episode.frame.text()


def test_a_run_of_markers_on_consecutive_steps_is_labelled_once(qtbot, workspace):
    """A clamp held for several steps is one "clamp x4" on the timeline, not four labels drawn over each other;
    a clamp further on is a run of its own, and every marker keeps its line."""
    ws = workspace
    _select(qtbot, ws, 0)
    clamps = [Marker(s, "safety_clamp", "max_delta") for s in (5, 6, 7, 8, 20)]
    ws.episode.timeline.show_episode(dataclasses.replace(ws.episode.data, markers=clamps), None)
    tl = ws.episode.timeline
    assert list(zip(tl.markers, tl.marker_texts, strict=True)) == [
        ((5, "safety_clamp"), "clamp x4"), ((6, "safety_clamp"), ""), ((7, "safety_clamp"), ""),
        ((8, "safety_clamp"), ""), ((20, "safety_clamp"), "clamp")]
    # labels of different kinds a step apart are drawn at two heights, not over each other
    close = [Marker(30, "gate_warning", "confidence"), Marker(31, "gate_trigger", "confidence"), Marker(32, "estop")]
    ws.episode.timeline.show_episode(dataclasses.replace(ws.episode.data, markers=close), None)
    assert (tl.marker_texts, tl.marker_heights) == (["warn", "gate", "E-STOP"], [0.95, 0.8, 0.95])


def test_approve_and_reject_through_the_buttons(qtbot, workspace, store):
    ws = workspace
    panel = ws.panel
    first = _select(qtbot, ws, 0)
    panel.authorize.setChecked(True)
    panel.reason.setPlainText("clean recovery")
    qtbot.mouseClick(panel.approve_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT)
    assert panel.table.rowCount() == 1 and panel.table.item(0, 2).text() == REVIEWER
    assert panel.table.item(0, 3).text() == "approved" and panel.table.item(0, 4).text() == "yes"
    table_row = next(r for r in ws.browser.model.rows if r.window_id == first.window_id)
    assert table_row.window.status == ReviewStatus.APPROVED and table_row.window.authorized

    second = _select(qtbot, ws, 1)
    # an empty reason is refused in the panel and nothing is written
    qtbot.mouseClick(panel.reject_button, Qt.MouseButton.LeftButton)
    assert "reason is required" in panel.message.text()
    assert audit_trail(store, second.window_id) == []
    panel.reason.setPlainText("operator overshot the target")
    qtbot.mouseClick(panel.reject_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT)

    a = audit_trail(store, first.window_id)
    r = audit_trail(store, second.window_id)
    assert [(e.decision.reviewer, e.decision.status, e.decision.replay_training_authorized) for e in a] == [
        (REVIEWER, ReviewStatus.APPROVED, True)]
    assert [(e.decision.reviewer, e.decision.status, e.decision.notes) for e in r] == [
        (REVIEWER, ReviewStatus.REJECTED, "operator overshot the target")]
    st = EpisodeStore.open(store)
    reviews = {d.window_id: d for e in st.episodes() for d in st.labels(e.episode_id).reviews}
    assert reviews[first.window_id].reviewer == reviews[second.window_id].reviewer == REVIEWER
    ws.browser.set_filter("status", "rejected")
    assert [x.window_id for x in ws.browser.visible_rows()] == [second.window_id]
    assert ws.browser.counts.text().startswith("1 window(s): 1 rejected")

    # a later decision on the same window: the trail keeps both, oldest first
    ws.browser.set_filter("status", "")
    _select(qtbot, ws, 1)
    panel.reason.setPlainText("gripper timing needs a second look")
    qtbot.mouseClick(panel.fix_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel.trail) == 2 and ws.worker.pending == 0, timeout=WAIT)
    assert [panel.table.item(i, 3).text() for i in range(2)] == ["rejected", "needs_fix"]


def test_api_errors_are_shown_in_the_panel(qtbot, workspace, store):
    ws = workspace
    _select(qtbot, ws, 0)
    shutil.rmtree(store)  # the store disappears under the reviewer
    qtbot.mouseClick(ws.panel.approve_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: ws.worker.pending == 0 and not ws.panel.busy, timeout=WAIT)
    assert store in ws.panel.message.text()
    assert ws.panel.approve_button.isEnabled()


def test_two_stores_and_a_missing_one(qtbot, store, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(store, other)
    ws = ReviewWorkspace([store, str(other), str(tmp_path / "missing")], REVIEWER)
    qtbot.addWidget(ws)
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    n = len(list_windows(store))
    assert len(ws.browser.visible_rows()) == 2 * n
    assert {r.store for r in ws.browser.visible_rows()} == {store, str(other)}
    assert not ws.browser.table.isColumnHidden(COLUMNS.index("store"))
    assert len(ws.errors) == 1 and "missing" in ws.errors[0] and "missing" in ws.status.text()
    ws.close()


def test_cli_open_refuses_a_missing_store(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "review", "open", str(tmp_path / "nope"), "--reviewer", "x"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "nope" in errors[0]


def test_qc_verdicts_fill_the_qc_column_and_filter(qtbot, store):
    from hg_dagger.review.qc import run_qc
    from hg_dagger.review.qc_config import QCConfig

    summary = run_qc(store, config=QCConfig(latency_budget_ms=600_000), write=True, progress=False)
    verdict = {r.window_id: ("passed" if r.passed else "failed")
               for e in summary.episodes for r in e.results if r.window_id}
    assert verdict
    ws = ReviewWorkspace([store], REVIEWER)
    qtbot.addWidget(ws)
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    assert {r.window_id: r.qc for r in ws.browser.visible_rows()} == verdict
    ws.browser.set_filter("qc", "passed")
    assert {r.window_id for r in ws.browser.visible_rows()} == {w for w, v in verdict.items() if v == "passed"}
    ws.close()


def test_camera_frames_follow_the_cursor(qtbot, tmp_path):
    from support.store import record

    path = str(tmp_path / "images")
    rec = EpisodeStore.create(path).recorder()
    record(rec, 3, 30, image=True, window=(10, 20))
    rec.close()
    ws = ReviewWorkspace([path], REVIEWER)
    qtbot.addWidget(ws)
    ws.show()
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    _select(qtbot, ws, 0)
    assert ws.episode.data.image_key == "obs/rgb"
    assert ws.episode.step == 10  # a selected window opens at its first step
    assert ws.episode.timeline.colours[10:20] == [style.HUMAN] * 10
    for step in (12, 25):
        ws.episode.slider.setValue(step)
        pix = ws.episode.frame.pixmap()
        assert not pix.isNull()
        assert pix.toImage().pixelColor(0, 0).red() == (3 * 7 + step) % 256  # the frame recorded at that step
    ws.close()


def test_filters_for_every_field_and_the_privacy_status(qtbot, tmp_path):
    """Mode, recovery outcome, policy, date, QC flag filters over a store with two modes, two policies, a camera
    episode and one whose recorder recorded its own privacy processing."""
    from support.store import record

    from hg_dagger.contract import CollectionMode
    from hg_dagger.review.qc import run_qc
    from hg_dagger.review.qc_config import QCConfig
    from hg_dagger.ui.review.model import PSEUDONYMISED

    path = str(tmp_path / "mixed")
    rec = EpisodeStore.create(path).recorder()
    gated = record(rec, 1, 30, window=(5, 10), policy_version="p-1", operator="op-a")
    demo = record(rec, 2, 30, window=(0, 30), mode=CollectionMode.DAGGER_SYNC, policy_version="p-2", operator="op-b")
    blurred = record(rec, 3, 30, window=(8, 12), policy_version="p-2", operator="op-a",
                     extra={"privacy": "faces blurred at recording"})
    rec.close()
    rec = EpisodeStore.open(path, mode="a").recorder()
    camera = record(rec, 4, 30, image=True, window=(10, 20), policy_version="p-1", operator="op-c")
    rec.close()
    # QC with a zero latency budget: every window fails with latency_exceeded
    summary = run_qc(path, config=QCConfig(latency_budget_ms=1e-9), write=True, progress=False)
    flagged = {r.window_id for e in summary.episodes for r in e.results if r.window_id and "latency_exceeded" in r.flags}
    assert flagged
    ws = ReviewWorkspace([path], REVIEWER)
    qtbot.addWidget(ws)
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    b = ws.browser
    by_episode = {r.window.episode_id: r for r in b.visible_rows()}
    assert set(by_episode) == {gated, demo, blurred, camera}
    assert by_episode[gated].privacy == PSEUDONYMISED
    assert by_episode[blurred].privacy == "faces blurred at recording"
    assert by_episode[camera].privacy == PSEUDONYMISED + "; camera frames not processed"
    i = next(i for i, r in enumerate(b.model.rows) if r.window.episode_id == camera)
    assert b.model.data(b.model.index(i, COLUMNS.index("privacy"))) == PSEUDONYMISED + "; camera frames not processed"

    def shown(key, value):
        b.set_filter(key, value)
        eps = {r.window.episode_id for r in b.visible_rows()}
        b.set_filter(key, "")
        return eps

    assert shown("mode", "dagger_sync") == {demo}
    assert shown("mode", "human_gated") == {gated, blurred, camera}
    assert shown("policy_version", "p-2") == {demo, blurred}
    assert shown("operator", "op-a") == {gated, blurred}
    assert shown("qc", "failed") == {gated, demo, blurred, camera}
    assert {r.window_id for r in b.visible_rows() if "latency_exceeded" in r.qc_flags} == flagged
    assert {r.window.episode_id for r in b.visible_rows() if r.window_id in flagged} == shown("qc_flag",
                                                                                            "latency_exceeded")
    day = by_episode[gated].date
    assert len(day) == 10 and day[4] == day[7] == "-" and day[:4].isdigit()
    assert shown("date", day) == {e for e, r in by_episode.items() if r.date == day} >= {gated, demo, blurred}
    days = sorted({r.date for r in by_episode.values()})  # one day, or two if the test ran across midnight UTC
    assert [b.combos["date"].itemData(i) for i in range(b.combos["date"].count())] == ["", *days]
    outcome = by_episode[gated].window.outcome
    assert shown("outcome", outcome) == {r.window.episode_id for r in b.visible_rows() if r.window.outcome == outcome}
    # two filters at once, and the counts under the table follow them
    b.set_filter("policy_version", "p-1")
    b.set_filter("operator", "op-c")
    assert {r.window.episode_id for r in b.visible_rows()} == {camera}
    assert b.counts.text().startswith("1 window(s): 1 pending; 1 episode(s), 0 training authorized, QC 1 failed")
    assert b.counts.text().endswith("(of 4)")
    ws.close()


def test_human_command_plotted_on_the_dims_it_drives(qtbot, workspace, store):
    ws = workspace
    row = _select(qtbot, ws, 0)
    data = ws.episode.data
    info = EpisodeStore.open(store).info(row.window.episode_id)
    axes = info.start.mapping["human"]["axes"]
    assert data.human_axes == [["x", "y", "z", "roll", "pitch", "yaw", "gripper"].index(a) for a in axes]
    assert ws.episode.plots.human_dims == list(range(len(axes)))
    names = [item.name() for item in ws.episode.plots.plots[0].listDataItems()]
    assert "human command (x)" in names and "applied" in names and "policy" in names
    cmd = EpisodeStore.open(store).read_steps(row.window.episode_id, ["human_command"])["human_command"]
    curve = next(i for i in ws.episode.plots.plots[1].listDataItems() if i.name() == "human command (y)")
    np.testing.assert_array_equal(curve.yData, cmd[:, 1])
    assert data.privacy in ws.episode.privacy.text()
    # the legend is in the caption above the plots (it wraps there), never an overlay on the curves; it names
    # what the plots hold
    assert all(p.legend is None for p in ws.episode.plots.plots)
    caption = ws.episode.action_caption.text()
    assert all(k in caption for k in ("raw units", "applied", "policy", "human command", "human applied"))
    assert ("expert" in caption) == bool(np.isfinite(data.expert).any())


def _answer_dialogs(texts: list[str | None], offered: list[str]) -> None:
    """Answer the next reviewer dialogs in turn: type each text and accept, or cancel for None; records what each
    dialog offered."""
    from PyQt6.QtCore import QTimer
    from PyQt6.QtWidgets import QApplication, QInputDialog

    todo = list(texts)

    def poll():
        # an answered dialog is hidden at once; one shown when this runs again is the next prompt (asked again)
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog) or not dialog.isVisible():
            QTimer.singleShot(20, poll)
            return
        offered.append(dialog.textValue())
        text = todo.pop(0)
        if text is None:
            dialog.reject()
        else:
            dialog.setTextValue(text)
            dialog.accept()
        if todo:
            QTimer.singleShot(20, poll)

    QTimer.singleShot(0, poll)


def test_reviewer_asked_at_the_first_decision(qtbot, store):
    """Without a reviewer the first decision asks for one - an empty field, never the operator's pseudonym, which
    is refused there in any spelling - and later ones reuse it."""
    ws = ReviewWorkspace([store], None, operator="op-9")
    qtbot.addWidget(ws)
    ws.show()
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    assert "asked at your first decision" in ws.panel.reviewer_label.text()
    offered: list[str] = []

    first = _select(qtbot, ws, 0)
    # cancelled: nothing is written
    _answer_dialogs([None], offered)
    qtbot.mouseClick(ws.panel.approve_button, Qt.MouseButton.LeftButton)
    assert offered == [""] and "reviewer pseudonym is needed" in ws.panel.message.text()
    assert audit_trail(store, first.window_id) == []
    # the operator's own pseudonym is refused in the dialog, which asks again
    _answer_dialogs([" OP-9 ", "rev-3"], offered)
    ws.panel.authorize.setChecked(True)
    qtbot.mouseClick(ws.panel.approve_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(ws.panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT)
    assert offered == ["", "", ""] and ws.reviewer == "rev-3" and "rev-3" in ws.windowTitle()
    second = _select(qtbot, ws, 1)
    ws.panel.reason.setPlainText("drifted")
    qtbot.mouseClick(ws.panel.reject_button, Qt.MouseButton.LeftButton)  # no dialog this time
    qtbot.waitUntil(lambda: len(ws.panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT)
    assert len(offered) == 3
    assert [(e.decision.reviewer, e.decision.status, e.decision.replay_training_authorized)
            for e in audit_trail(store, first.window_id)] == [("rev-3", ReviewStatus.APPROVED, True)]
    assert [(e.decision.reviewer, e.decision.status) for e in audit_trail(store, second.window_id)] == [
        ("rev-3", ReviewStatus.REJECTED)]
    ws.close()


def test_a_decision_by_the_windows_operator_is_refused_in_one_line(qtbot, store):
    """A workspace opened under the recorded windows' operator pseudonym (`review open --reviewer` with it,
    respelled) records nothing: the panel shows decide's one-line refusal."""
    operator = list_windows(store)[0].operator
    assert operator
    ws = ReviewWorkspace([store], f" {operator.upper()} ")
    qtbot.addWidget(ws)
    ws.show()
    qtbot.waitUntil(lambda: ws.rows_loaded, timeout=WAIT)
    row = _select(qtbot, ws, 0)
    ws.panel.authorize.setChecked(True)
    qtbot.mouseClick(ws.panel.approve_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: ws.worker.pending == 0 and not ws.panel.busy, timeout=WAIT)
    text = ws.panel.message.text()
    assert "is the window's operator" in text and "\n" not in text
    assert audit_trail(store, row.window_id) == []
    assert ws.panel.approve_button.isEnabled()
    assert ws.panel.authorize.isChecked()  # kept for a retry on the same window
    ws.close()


def test_what_was_ticked_or_typed_for_one_window_never_carries_to_the_next(qtbot, workspace, store):
    """A reviewer who ticks "training authorized" and types a reason, then picks another window without deciding,
    finds both cleared: approving the other window does not authorize it. The same window shown again keeps them."""
    ws, panel = workspace, workspace.panel
    first = _select(qtbot, ws, 0)
    panel.authorize.setChecked(True)
    panel.reason.setPlainText("looked fine")
    panel.set_row(next(r for r in ws.browser.model.rows if r.window_id == first.window_id))
    assert panel.authorize.isChecked() and panel.reason.toPlainText() == "looked fine"
    second = _select(qtbot, ws, 1)
    assert not panel.authorize.isChecked() and panel.reason.toPlainText() == ""
    qtbot.mouseClick(panel.approve_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel.trail) == 1 and ws.worker.pending == 0, timeout=WAIT)
    assert [(e.decision.status, e.decision.replay_training_authorized, e.decision.notes)
            for e in audit_trail(store, second.window_id)] == [(ReviewStatus.APPROVED, False, "")]
    assert audit_trail(store, first.window_id) == []


def test_planner_certified_windows_show_as_certified_not_unauthorized(qtbot, store, tmp_path):
    """A certified operator's windows train without a reviewer: the table and the panel say so; a person's
    windows (the module's store) still read "no" until a reviewer authorizes them."""
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config

    path = str(tmp_path / "certified")
    cfg = load_run_config(None, "toy_reach", episodes=1, num_envs=1, calibrate_steps=0, gates=EAGER,
                          **{"operator.return_after_steps": 12, "operator.noise_std": 0.0,
                             "operator.certification": "planner_auto"})
    run_gated(cfg, path, progress=False)
    assert all(r.certified for r in list_windows(path)) and not any(r.certified for r in list_windows(store))
    ws = _opened(qtbot, [path, store])
    try:
        assert _auth_column(ws, lambda r: r.store) == {path: "certified", store: "no"}
        n = len(list_windows(path))
        assert f"{n} certified" in ws.browser.counts.text()
        row = next(r for r in ws.browser.visible_rows() if r.store == path)
        ws.browser.select(row.window_id)
        qtbot.waitUntil(lambda: ws.shown is not None and ws.shown.window_id == row.window_id, timeout=WAIT)
        assert "certified by its planner" in ws.panel.current.text()
    finally:
        ws.close()


def test_a_discarded_episode_s_window_says_why_it_trains_nothing(qtbot, store):
    """The operator discarded the episode after it ended, with a reason: the reviewer reads "no labels" in the
    table and the operator's words in the panel, not a guess."""
    from hg_dagger.control.store_actions import StoreActions

    gone = list_windows(store)[0]
    actions = StoreActions(store, "ana", wait_s=30)
    actions.discard(gone.episode_id, "the block slid off the table")
    actions.close()
    ws = _opened(qtbot, [store])
    try:
        assert _auth_column(ws, lambda r: r.window_id)[gone.window_id] == "no labels"
        ws.browser.select(gone.window_id)
        qtbot.waitUntil(lambda: ws.shown is not None and ws.shown.window_id == gone.window_id, timeout=WAIT)
        assert "discarded by ana: the block slid off the table" in ws.panel.current.text()
    finally:
        ws.close()


def test_the_review_window_closes_with_ctrl_q_as_the_operator_app_does(qtbot, store):
    """`hg-dagger review open` runs until its window closes; Ctrl+Q closes it, as in the operator app."""
    from PyQt6.QtCore import QTimer
    from PyQt6.QtTest import QTest
    from PyQt6.QtWidgets import QApplication

    from hg_dagger.ui.review_main import run_review

    seen = []

    def press_ctrl_q() -> None:  # at the window run_review opened (its title names the store), once it is active
        windows = [w for w in QApplication.topLevelWidgets()
                   if isinstance(w, ReviewWorkspace) and w.isVisible() and str(store) in w.windowTitle()]
        if not windows or not windows[0].isActiveWindow():
            if windows:
                windows[0].activateWindow()
            QTimer.singleShot(50, press_ctrl_q)
            return
        seen.append(windows[0].windowTitle())
        QTest.keyClick(windows[0], Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)

    QTimer.singleShot(100, press_ctrl_q)
    guard = QTimer()
    guard.setSingleShot(True)
    guard.timeout.connect(QApplication.closeAllWindows)  # a missing shortcut fails the test, never hangs it
    guard.start(20_000)
    assert run_review([str(store)], "rev-02") == 0
    assert guard.isActive(), "Ctrl+Q did not close the window"
    guard.stop()
    assert seen and "rev-02" in seen[0]
