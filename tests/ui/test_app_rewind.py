"""Rewind and correct through the real window: a request waits, the person presses Backspace, the simulator goes
back two seconds before the request into a branch episode that waits for them, they take over with the keys and
hand back; the store binds the branch to the attempt it came from, and both replay."""

from __future__ import annotations

import pytest
from PyQt6.QtCore import Qt
from support.app import close_app, wait_snap

from hg_dagger.contract import ActionSource, EndReason
from hg_dagger.envs import load_mapping
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import save_checkpoint
from hg_dagger.review.decisions import list_windows
from hg_dagger.review.replay import replay_store
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui.application import AppOptions, OperatorApp
from hg_dagger.ui.review.browser import CELLS
from hg_dagger.ui.review.model import ReviewRow

pytestmark = [pytest.mark.subprocess, pytest.mark.app]

# a gate that asks once the student has driven for 2.4 s (60 ticks; no progress ever counts): late enough to go
# back 2 s
LATE_GATE = """kind: gates
gates:
  - {type: progress_stall, trigger: 2.4, min_delta: 100.0}
"""


def test_backspace_rewinds_a_request_and_the_person_corrects_the_branch(qtbot, tmp_path, settings):
    gates = tmp_path / "late.yaml"
    gates.write_text(LATE_GATE)
    student = tmp_path / "untrained.pt"  # it never reaches the goal, so the gate asks in the first episode
    save_checkpoint(student, Student.create(load_mapping("toy_reach"), seed=0))
    store = str(tmp_path / "store.zarr")
    opts = AppOptions(task="toy_reach", store=store, student=str(student), operator="device", device="keyboard",
                      name="op-rw", home=str(tmp_path / "home"), gates=str(gates))
    op = OperatorApp(opts, settings)
    op.start()
    qtbot.addWidget(op.window)
    win = op.window
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and s.seq > 2)
    assert op.loop.slot.read().rewindable
    qtbot.waitUntil(win.controls.start.isEnabled, timeout=60_000)
    qtbot.mouseClick(win.controls.start, Qt.MouseButton.LeftButton)
    asked = wait_snap(qtbot, op, lambda s: s.control_state == "handover_requested" and s.episode_step >= 50)
    parent = asked.episode_id
    qtbot.waitUntil(lambda: win.banner.rewind.isVisible(), timeout=10_000)  # the strip offers it too

    qtbot.keyPress(win, Qt.Key.Key_Backspace)
    branch = wait_snap(qtbot, op, lambda s: s.episode_id not in (None, parent)
                       and s.control_state == "handover_requested")
    assert "rewound" in branch.message and branch.episode_step == 0  # it waits for the person before any step
    assert branch.gate_reason == "rewind"
    qtbot.waitUntil(lambda: "went back" in win.gate.reason.text(), timeout=10_000)  # the light says why it asks
    qtbot.keyPress(win, Qt.Key.Key_Space)
    qtbot.keyPress(win, Qt.Key.Key_W)
    wait_snap(qtbot, op, lambda s: s.control_state == "human" and s.episode_step >= 10)
    qtbot.keyRelease(win, Qt.Key.Key_W)
    qtbot.keyRelease(win, Qt.Key.Key_Space)
    wait_snap(qtbot, op, lambda s: s.control_state != "human")
    assert close_app(qtbot, op) == 0

    st = EpisodeStore.open(store)
    assert list(validate_store(st)) == []
    p_info, b_info = st.info(parent), st.info(branch.episode_id)
    assert p_info.end.end_reason == EndReason.OPERATOR_ABORT and "rewound" in p_info.end.quality_flags
    back = b_info.start.parent_step_id
    assert b_info.start.parent_episode_id == parent and 0 <= back <= asked.episode_step - 45
    window = st.labels(branch.episode_id).windows[0]
    assert window.gate_reason == "rewind" and window.handover_start == 0 and window.handover_end >= 10
    src = st.read_steps(branch.episode_id)["action_source"]
    assert (src[:10] == ActionSource.HUMAN.code).all()
    # the review lists the branch's window with the attempt and step it went back into
    (row,) = [r for r in list_windows(store) if r.window_id == window.window_id]
    assert row.branch_of == f"{parent}@{back}"
    assert CELLS["branch of"](ReviewRow(store=store, window=row))[0] == f"{parent[:12]} step {back}"
    report = replay_store(store, progress=False)
    assert report.counts()["replay_mismatch"] == 0
