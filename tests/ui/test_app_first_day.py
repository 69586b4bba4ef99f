"""A first day at the console, with a human-paced operator model at the real window's keyboard.

Fresh home and settings; the app bootstraps a first student; episodes run while the model (seeded:
reaction times of 0.4-3 s, a look-away, a decline) answers the gates through Qt key events: it takes over
after its delay, steers, lets go after a release delay. Meanwhile the person discards an episode through
the dialog that names it; a reviewer approves the corrections and a round trains from the Rounds tab;
the app quits and starts again with the same student. Assertions are on recorded facts (the model's
log, the snapshot counters, the store), never on timing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from PyQt6 import sip
from PyQt6.QtCore import Qt, QTimer
from PyQt6.QtWidgets import QApplication, QMessageBox, QProgressDialog
from support.app import WAIT_MS, close_app, wait_snap

from hg_dagger.contract import ActionSource, EventKind, LabelMask
from hg_dagger.control.human_model import HumanOperatorModel, HumanProfile
from hg_dagger.envs import load_mapping
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui.application import AppOptions, OperatorApp
from hg_dagger.ui.operator_model import ModelDriver

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation, pytest.mark.app]

# Seed 7 with this profile: request 0 is taken over, request 1 declined, request 2 comes while the person
# looks away (3-3.5 s), then takes over (the draws of request k depend only on (seed, k)).
PROFILE = HumanProfile(look_away_p=0.3, look_away_s=(3.0, 3.5), decline_p=0.2, correction_median_s=1.5,
                       correction_max_s=3.0)
SEED = 7
NEEDED = 3  # requests the model must have answered (take-over, decline, look-away + take-over)


@dataclass(frozen=True)
class Day:
    task: str
    episodes: int
    bootstrap_demos: int
    bootstrap_steps: int
    train_steps: int


DAYS = {
    "toy_reach": Day("toy_reach", episodes=40, bootstrap_demos=3, bootstrap_steps=80, train_steps=60),
    "fetch_pick_place": Day("fetch_pick_place", episodes=30, bootstrap_demos=2, bootstrap_steps=100, train_steps=60),
}


@pytest.fixture
def apps():
    """The apps a test opened: any still running when it ends (a failed assertion) are closed, so their control
    processes and training jobs never outlive the test (the app's watch stops with its window)."""
    opened: list[OperatorApp] = []
    yield opened
    for op in opened:
        if op.window is not None and not sip.isdeleted(op.window):
            op.window.close()
        if op.job is not None:
            op.job.cancel()
        if op.loop is not None:
            op.loop.stop()


def launch(qtbot, apps, opts: AppOptions, settings, progress: list[str] | None = None) -> OperatorApp:
    """The app, started and idle. ``progress`` collects what its first-student dialog said meanwhile."""
    op = OperatorApp(opts, settings)
    apps.append(op)
    ended: list[int] = []
    op.finished.connect(ended.append)
    op.start()

    def opened() -> bool:
        if progress is not None:
            progress.extend(w.labelText() for w in QApplication.topLevelWidgets()
                            if isinstance(w, QProgressDialog) and w.isVisible())
        return op.window is not None or bool(ended)

    # the window opens after the first student, if one is made; a failed bootstrap ends the app (said on stderr)
    qtbot.waitUntil(opened, timeout=WAIT_MS)
    assert op.window is not None, f"the app ended with exit code {ended[0]} before its window opened"
    qtbot.addWidget(op.window)
    wait_snap(qtbot, op, lambda s: s.phase == "idle" and not s.loading and s.seq > 2)
    qtbot.waitUntil(op.window.controls.start.isEnabled, timeout=WAIT_MS)  # the window has drawn that snapshot
    return op


def click_when_asked(qtbot, text: str) -> QTimer:
    """Answer the next message box that offers a button ``text`` (the app asks with a nested event loop)."""
    timer = QTimer()

    def look():
        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox):
            for b in box.buttons():
                if b.text() == text:
                    timer.stop()
                    b.click()
                    return

    timer.timeout.connect(look)
    timer.start(50)
    return timer


def discard_through_the_dialog(qtbot, op) -> str:
    """The person opens Discard... on the running episode, types why and confirms; returns the id it named."""
    win = op.window
    for _ in range(5):  # an episode may end just as the button is pressed: then the person presses it again
        before = wait_snap(qtbot, op, lambda s: s.phase == "running" and s.episode_id is not None
                           and s.control_state == "autonomous" and s.episode_step >= 3)
        qtbot.waitUntil(lambda: win.controls.discard.isEnabled(), timeout=WAIT_MS)
        qtbot.mouseClick(win.controls.discard, Qt.MouseButton.LeftButton)
        if win.controls.dialogs:
            break
    dlg = win.controls.dialogs[-1]
    named = dlg.target
    assert named is not None and named[:8] in dlg.text.text(), "the dialog names the episode it discards"
    assert named in (before.episode_id, op.loop.slot.read().episode_id, op.loop.slot.read().ended_episode_id)
    dlg.reason.setText("first day: knocked the block over")
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Ok), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not win.controls.dialogs, timeout=10_000)
    return named


def stop_when_idle(qtbot, driver, model) -> None:
    """Stop the model between corrections (checked and stopped in one GUI-thread turn, so no key slips in)."""
    qtbot.waitUntil(lambda: not model.in_control and (driver.stop() or True), timeout=WAIT_MS)


def approve_corrections(qtbot, store: str, episodes: set[str], discarded: str) -> int:
    """A reviewer approves (and authorizes) every correction of ``episodes`` but the discarded one."""
    from hg_dagger.review.decisions import decide, list_windows

    want = episodes - {discarded}
    qtbot.waitUntil(lambda: want <= {r.episode_id for r in list_windows(store)}, timeout=WAIT_MS)  # commits landed
    rows = [r for r in list_windows(store) if r.episode_id in want and r.source == ActionSource.HUMAN.value]
    for r in rows:
        decide(store, r.window_id, "approved", "rev-day1", authorize=True)
    return len(rows)


def gate_thresholds(snap) -> tuple[float, float]:
    return float(snap.thresholds["warn"]), float(snap.thresholds["trigger"])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("task", sorted(DAYS))
def test_first_day_with_a_human_paced_operator(qtbot, tmp_path, settings, apps, task):
    day = DAYS[task]
    opts = AppOptions(task=task, operator="device", device="keyboard", name="op-day1", home=str(tmp_path / "home"),
                      bootstrap_demos=day.bootstrap_demos, bootstrap_steps=day.bootstrap_steps,
                      train_steps=day.train_steps, seed=0)
    said: list[str] = []
    op = launch(qtbot, apps, opts, settings, said)  # no student yet: the app bootstraps one first
    # the dialog keeps saying why it is there while it names each stage under it
    assert any(f"No student for {task} yet" in t and "now: " in t for t in said), said[-3:]
    win = op.window
    store = op.opts.store_url
    first_student = op.student_path
    assert first_student and "round-00" in first_student
    model = HumanOperatorModel(load_mapping(task), PROFILE, seed=SEED)
    driver = ModelDriver(win, model)
    driver.start()

    win.controls.count.setValue(day.episodes)  # more than the day needs: the app is quit with episodes to go
    qtbot.mouseClick(win.controls.start, Qt.MouseButton.LeftButton)
    wait_snap(qtbot, op, lambda s: s.phase == "running")
    qtbot.waitUntil(lambda: sum(f.outcome in ("took_over", "declined") for f in model.facts) >= NEEDED
                    and not model.in_control, timeout=WAIT_MS)
    discarded = discard_through_the_dialog(qtbot, op)
    old = op.loop.slot.read().policy_version

    # a reviewer approves the corrections of ended episodes (one at least besides the discarded one); the next
    # student trains from the Rounds tab while episodes run
    def corrected_and_ended():
        snap = op.loop.slot.read()
        return {f.episode_id for f in model.facts if f.outcome == "took_over"} - {discarded, snap.episode_id}

    qtbot.waitUntil(lambda: bool(corrected_and_ended()), timeout=WAIT_MS)
    assert approve_corrections(qtbot, store, corrected_and_ended(), discarded) >= 1
    win.tabs.setCurrentWidget(win.rounds)
    answer = click_when_asked(qtbot, "Keep running")
    qtbot.mouseClick(win.rounds.train, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: win.rounds.message.text().startswith("new student"), timeout=WAIT_MS)
    answer.stop()
    trained = op.student_path
    assert trained != first_student and "round-01" in trained
    new = wait_snap(qtbot, op, lambda s: s.phase == "running" and s.policy_version != old and len(s.rounds) >= 2)
    assert new.rounds[-1]["current"] and new.rounds[0]["policy_version"] == old
    kept = gate_thresholds(new)
    stop_when_idle(qtbot, driver, model)
    outcomes = Counter(f.outcome for f in model.facts)
    last = wait_snap(qtbot, op, lambda s: s.counters.requests_answered == outcomes["took_over"]
                     and s.counters.requests_declined == outcomes["declined"])
    assert close_app(qtbot, op) == 0  # quit: the open episode ends as an operator abort

    # the relaunch: same home, same settings, the student the round made, the gate it had
    op2 = launch(qtbot, apps, opts, settings)
    assert op2.student_path == trained
    again = wait_snap(qtbot, op2, lambda s: bool(s.thresholds))
    assert gate_thresholds(again) == pytest.approx(kept), "the relaunch keeps the student's thresholds"
    assert close_app(qtbot, op2) == 0

    # ---- what was recorded -------------------------------------------------------------------------------
    facts = model.facts
    assert outcomes["took_over"] >= 2 and outcomes["declined"] >= 1, outcomes
    assert any(f.look_away_s >= 3.0 and f.outcome == "took_over" for f in facts), "a look-away lost nothing"
    # no request ran out under the person: each one was still waiting when the person acted on it. Only the
    # person's own actions end one first: the discard (its episode), the model stopped before the quit (the last)
    for f in facts[:-1]:
        assert f.outcome in ("took_over", "declined") or f.episode_id == discarded, [(g.index, g.outcome) for g in facts]
    assert facts[-1].outcome in ("took_over", "declined", "pending") or facts[-1].episode_id == discarded

    st = EpisodeStore.open(store)
    assert list(validate_store(st)) == []
    infos = {i.episode_id: i for i in st.episodes()}
    ends = {eid: [e for e in i.end.events if e.kind == EventKind.REQUEST_END] for eid, i in infos.items() if i.end}
    expired = [(eid, e) for eid, evs in ends.items() for e in evs if e.values["outcome"] == "expired"]
    for eid, e in expired:  # only the person's own quit or discard ended a waiting request (with its episode)
        assert e.reason == "episode_end" and infos[eid].end.end_reason.value == "operator_abort", (eid, e)
    assert last.counters.requests_expired == sum(eid == discarded for eid, _ in expired)
    # every take-over is one correction window bound to its episode, after the person's own delay
    per_episode = Counter(f.episode_id for f in facts if f.outcome == "took_over")
    for eid, n in per_episode.items():
        layer = st.labels(eid)
        human = [w for w in layer.windows if w.source == ActionSource.HUMAN]
        assert len(human) == n and all(w.parent_episode_id == eid for w in human), (eid, n, layer.windows)
        answered = [e for e in ends[eid] if e.values["outcome"] == "answered"]
        mine = [f for f in facts if f.episode_id == eid and f.outcome == "took_over"]
        assert len(answered) == len(mine)
        for e, f in zip(answered, mine, strict=True):
            assert e.values["wait_wall_s"] >= f.look_away_s + f.reaction_s, (e.values, f)
    for f in facts:
        if f.outcome == "declined":
            assert any(e.values["outcome"] == "declined" for e in ends[f.episode_id])
    # the discard hit the episode the dialog named, and only that one
    marked = [eid for eid, i in infos.items() if i.end and any(
        e.kind == EventKind.NOTE and e.values.get("discarded") for e in i.end.events)]
    assert marked == [discarded]
    assert not (st.labels(discarded).mask == LabelMask.TRAINABLE.code).any()
    # the round trained the next student; episodes ran with it
    versions = {i.start.policy_version for i in infos.values()}
    assert {old, new.policy_version} <= versions


def test_a_task_of_yours_without_a_planner_or_a_policy_is_one_line_not_a_failed_job(qtbot, tmp_path, settings, apps,
                                                                                    capsys):
    """A first student is learnt from planner demonstrations; a task file of the user's may have no planner. The
    app then says what to give (a policy) instead of starting a job that can only fail."""
    from pathlib import Path

    task = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "gym_pusher.yaml"
    op = OperatorApp(AppOptions(task=str(task), name="op-07", operator="none", episodes=1, quit_when_done=True,
                                home=str(tmp_path / "runs")), settings)
    apps.append(op)
    ended: list[int] = []
    op.finished.connect(ended.append)
    op.start()
    assert ended == [2] and op.job is None and op.loop is None
    err = capsys.readouterr().err
    assert "no policy for gym_pusher and no planner" in err and "--policy" in err
    assert not (tmp_path / "runs").exists()  # nothing written
