"""Regenerate the screenshots in docs/images/ from the real app window.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/screenshots.py [--task fetch_pick_place]

Opens the operator app on the embedded task with the in-window keyboard, starts an episode, and
grabs the window: the student driving, a gate asking for the operator, the operator correcting
(keys sent as the window would send them), the rounds tab after the next student was trained
and has run an episode, and the Review tab scrubbed into one of the session's corrections. Then
the review workspace (`hg-dagger review open`) on the same store, after a reviewer approved a
planner demonstration and sent the operator's correction back, then approved it on a second look. Needs a display (Xvfb is fine).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from PyQt6 import QtCore, QtWidgets

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.control import live
from hg_dagger.ui.application import AppOptions, OperatorApp
from hg_dagger.ui.review import ReviewWorkspace
from hg_dagger.ui.settings import SettingsFile

OUT = Path(__file__).resolve().parent / "images"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="fetch_pick_place")
    p.add_argument("--student", default="", help="checkpoint (default: bootstrap a first student in a temp folder)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    if not os.environ.get("DISPLAY"):
        print("no DISPLAY: run under xvfb-run (see the docstring)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    home = tempfile.mkdtemp(prefix="hg-dagger-shots-")
    app = QtWidgets.QApplication(["hg-dagger"])
    app.setQuitOnLastWindowClosed(False)
    settings = SettingsFile(Path(home) / "app.yaml")
    opts = AppOptions(task=args.task, student=args.student, name="op-07", operator="device", device="keyboard",
                      home=home, bootstrap_demos=6, bootstrap_steps=600)
    op = OperatorApp(opts, settings)
    shots: list[str] = []
    state = {"phase": "wait-window", "t": 0}
    review: dict = {}  # the standalone workspace and the rows it decided on

    def grab(name: str, widget=None) -> None:
        path = out / f"{name}.png"
        (widget or op.window).grab().save(str(path))
        shots.append(str(path))
        print(f"wrote {path}")

    def middle(row) -> int:
        return (row.window.handover_start + row.window.handover_end) // 2

    def shown(ws, row) -> bool:
        d = ws.episode.data
        return ws.worker.pending == 0 and d is not None and d.episode_id == row.window.episode_id

    def review_step(ph: str) -> None:
        """The Review tab, then the standalone workspace with three decisions."""
        tab = op.window.review
        if ph == "review-wait" and tab.rows_loaded and tab.browser.model.rowCount() and tab.worker.pending == 0:
            rows = tab.browser.visible_rows()
            row = next((r for r in rows if r.window.source == "human"), rows[0])
            tab.browser.select(row.window_id)
            review["tab_row"] = row
            state["phase"] = "review-select"
        elif ph == "review-select" and shown(tab, review["tab_row"]) and tab.episode.frame.state != "rendering":
            tab.episode.set_step(middle(review["tab_row"]))
            grab("app-review-tab")
            ws = ReviewWorkspace([op.opts.store_url], "rev-07")
            ws.resize(1500, 940)
            ws.show()
            review["ws"] = ws
            state["phase"] = "ws-wait"
        elif ph == "ws-wait" and review["ws"].rows_loaded and review["ws"].worker.pending == 0:
            ws = review["ws"]
            rows = ws.browser.visible_rows()
            human = next((r for r in rows if r.window.source == "human"), rows[-1])
            other = next((r for r in rows if r.window_id != human.window_id), human)
            review["rows"] = [other, human]  # decided in this order; the picture shows the human window
            ws.browser.select(other.window_id)
            state["phase"] = "ws-approve"
        elif ph == "ws-approve" and shown(review["ws"], review["rows"][0]):
            panel = review["ws"].panel
            panel.authorize.setChecked(True)
            panel.reason.setPlainText("clean planner demonstration")
            panel.submit(ReviewStatus.APPROVED)
            state["phase"] = "ws-second"
        elif ph == "ws-second" and review["ws"].worker.pending == 0 and not review["ws"].panel.busy:
            review["ws"].browser.select(review["rows"][1].window_id)
            state["phase"] = "ws-fix"
        elif ph == "ws-fix" and shown(review["ws"], review["rows"][1]) and not review["ws"].panel.busy:
            review["ws"].panel.reason.setPlainText("gripper closed late? check against the frames")
            review["ws"].panel.submit(ReviewStatus.NEEDS_FIX)
            state["phase"] = "ws-reapprove"
        elif ph == "ws-reapprove" and review["ws"].worker.pending == 0 and not review["ws"].panel.busy:
            panel = review["ws"].panel
            panel.authorize.setChecked(True)
            panel.reason.setPlainText("second look: the grasp holds after hand-back")
            panel.submit(ReviewStatus.APPROVED)
            state["phase"] = "ws-grab"
        elif ph == "ws-grab" and review["ws"].worker.pending == 0 and len(review["ws"].panel.trail) >= 2:
            ws = review["ws"]
            ws.episode.set_step(middle(review["rows"][1]))
            grab("review-workspace", ws)
            ws.close()
            op.window.close()
            state["phase"] = "closing"

    def step() -> None:
        state["t"] += 1
        if state["t"] * 0.1 > args.timeout:
            snap = op.loop.slot.read() if op.loop is not None else None
            print(f"timed out waiting for the app in step {state['phase']!r}"
                  + (f" (phase {snap.phase}, {snap.message!r})" if snap is not None else ""), file=sys.stderr)
            if op.window is not None:
                op.window.close()
            app.exit(1)
            return
        if op.window is None or op.loop is None:
            return
        snap = op.loop.slot.read()
        cmd = op.loop.commands.put
        ph = state["phase"]
        if (snap.control_state == "handover_requested" and snap.t_request_ns != state.get("declined")
                and ph not in ("wait-window", "autonomous", "wait-gate", "banner")):
            state["declined"] = snap.t_request_ns  # once per request
            cmd(live.DeclineRequest())  # pictures taken: let the student go on (a request waits for a person)
        if ph == "wait-window" and snap.phase == "idle" and snap.seq > 5:
            op.window.resize(1500, 940)
            cmd(live.StartEpisodes(3))
            state["phase"] = "autonomous"
        elif ph == "autonomous" and snap.phase == "running" and snap.episode_step >= 20:
            grab("console-autonomous")
            state["phase"] = "wait-gate"
        elif ph == "wait-gate" and snap.control_state == "handover_requested":
            state["phase"], state["mark"] = "banner", state["t"]
        elif ph == "banner" and state["t"] - state["mark"] >= 8:
            grab("console-handover-requested")
            for key in ("space", "w"):
                cmd(live.KeyEvent(key, True))
            state["phase"], state["mark"] = "human", state["t"]
        elif ph == "human" and snap.control_state == "human" and state["t"] - state["mark"] >= 15:
            grab("console-human")
            for key in ("w", "space"):
                cmd(live.KeyEvent(key, False))
            state["phase"] = "rounds"
        elif ph == "rounds" and snap.control_state in ("autonomous", "warning", "returning"):
            cmd(live.MarkOutcome(False))  # the operator's verdict ends the episode
            state["phase"] = "train"
        elif ph == "train" and snap.counters.episodes >= 1 and op.job is None:
            op.train_next(keep_running=True)  # the Rounds tab's button, without its question
            op.window.tabs.setCurrentWidget(op.window.rounds)
            state["phase"] = "training"
        elif ph == "training" and op.job is None and "new student" in snap.message:
            state["phase"], state["episodes"] = "second", snap.counters.episodes
            if snap.phase == "idle":
                cmd(live.StartEpisodes(1))
        elif ph == "second" and snap.counters.episodes >= state["episodes"] + 1:
            grab("console-rounds")
            op.window.show_review()
            state["phase"] = "review-wait"
        elif ph.startswith(("review-", "ws-")):
            review_step(ph)
        elif ph == "wait-gate" and snap.phase == "idle" and snap.counters.episodes >= 3:
            cmd(live.StartEpisodes(3))  # no gate fired yet: keep going

    timer = QtCore.QTimer()
    timer.timeout.connect(step)
    timer.start(100)
    op.finished.connect(lambda code: app.exit(code))
    QtCore.QTimer.singleShot(0, op.start)
    code = app.exec()
    print(f"{len(shots)} screenshots")
    return code if len(shots) == 6 else 1


if __name__ == "__main__":
    sys.exit(main())
