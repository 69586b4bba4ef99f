"""The operator app: one window over one ControlLoop, plus the jobs around it (first student, rounds).

The window only reads snapshots and sends commands (hg_dagger.control.live); the session lives in
the control thread that ControlLoop starts (it builds the env there, so MuJoCo's GL context
belongs to the thread that renders). Training runs in a spawned process (hg_dagger.learn.rounds);
when it finishes, the new student is swapped in with a SwapStudent command.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from PyQt6 import QtCore, QtWidgets, sip

from hg_dagger.contract.enums import SessionMode
from hg_dagger.control import live
from hg_dagger.control.build import open_session, unused_seed
from hg_dagger.control.fleet_desk import fleet_keyboard
from hg_dagger.control.loop import ControlLoop, ControlProcess
from hg_dagger.control.run_config import load_run_config, parse_endpoint, task_name
from hg_dagger.devices import make_device
from hg_dagger.envs import load_mapping
from hg_dagger.errors import HgDaggerError
from hg_dagger.experts import planner_spec
from hg_dagger.learn.promotion import promotion_line
from hg_dagger.learn.rounds import BackgroundJob, bootstrap_student, train_round
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui import settings as saved
from hg_dagger.ui.lifetime import close_on_signals, delete_now
from hg_dagger.ui.main_window import MainWindow
from hg_dagger.ui.rounds import OwnTrainerRounds, read_training_summary, training_summary
from hg_dagger.ui.start_dialog import StartDialog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppOptions:
    """Everything needed to open a session (from the command line or the start dialog)."""

    task: str = "fetch_pick_place"  # a task id, or a task YAML file of the user's
    store: str = ""  # default: runs/app/<task id>/store.zarr
    student: str = ""  # a policy spec (policy.sources); default: this task's newest app student, else a bootstrapped one
    policy_options: Any = None  # how a policy from elsewhere is opened (policy.PolicyOptions; None: the defaults)
    operator: str = "device"  # device | synthetic | expert | none
    device: str = "keyboard"  # for operator 'device': a name in configs/devices or a path
    mode: str = "human_gated"
    name: str = ""  # operator pseudonym
    robot: str = ""  # HOST:PORT of `hg-dagger bridge serve`; empty = embedded simulator
    token_file: str = ""
    episodes: int = 0  # start this many episodes at once (scripted runs)
    quit_when_done: bool = False
    rate_hz: float | None = None
    view_size: int = 256
    seed: int = 0
    train_steps: int = 1500
    promotion_episodes: int = 50  # held-out episodes a trained student must pass to take over (0: it always does)
    bootstrap_demos: int = 6
    bootstrap_steps: int = 600
    home: str = "runs/app"  # where stores and students go by default
    control_process: bool = True  # the control loop in a process of its own (False: a thread of the app)
    config: str = ""  # run config (a file or a name in run/); default: run/<task id>.yaml if there is one
    gates: str = ""  # gate config (a file or a name in gates/); default: the run config's
    robots: int = 1  # simulated robots one person serves through a request queue (docs/fleet.md)
    allocation: str = ""  # how the fleet's queue is ranked: cur | fcfs | random (default: cur)
    wait_limit: float | None = None  # a fleet request nobody took within this many seconds expires (student goes on)
    flag_wait: float | None = None  # flag a fleet request that waited this long (default: the run config's)

    @property
    def task_dir(self) -> Path:
        return Path(self.home) / task_name(self.task)

    @property
    def store_url(self) -> str:
        return self.store or str(self.task_dir / "store.zarr")


def first_student_impossible(task: str) -> str:
    """Why no first student can be made for ``task`` ("" when its planner can): the first student learns from
    planner demonstrations, and a task of the user's may have no planner."""
    mapping = load_mapping(task)
    if planner_spec(mapping) is not None:
        return ""
    return (f"no policy for {mapping.task_id} and no planner to make a first student from: give your policy "
            "(--policy PATH.pt | ws://HOST:PORT | lerobot:DIR, or the start dialog's Policy field; docs/policies.md) "
            "or register a planner for the task (docs/extending.md)")


def newest_student(opts: AppOptions) -> str:
    """The newest checkpoint the app trained for this task ("" if none yet)."""
    found = sorted(opts.task_dir.glob("students/*/student.pt"), key=lambda p: p.stat().st_mtime)
    return str(found[-1]) if found else ""


def build_session(opts: AppOptions, student_path: str):
    """The session the options describe (called in the control thread): `hg-dagger run`'s own wiring."""
    # each sitting continues the store's seeds: a restarted app does not repeat yesterday's start states
    overrides: dict[str, Any] = {"operator.type": "expert" if opts.mode == SessionMode.EXPERT else opts.operator,
                                 "operator.name": opts.name or None, "seed": opts.seed + unused_seed(opts.store_url),
                                 "num_envs": None if opts.robot else 1}
    if opts.operator == "device":
        overrides["operator.device"] = opts.device
    if opts.operator == "none":
        overrides["operator.type"] = None
    if opts.robot:
        overrides["robot.host"], overrides["robot.port"] = parse_endpoint(opts.robot)
        overrides["robot.token_file"] = opts.token_file or None
        overrides["calibrate_steps"] = 0  # never drive a robot unattended to calibrate a gate
    overrides["gates"] = opts.gates or None
    if opts.robots > 1 and opts.robot:
        raise HgDaggerError(f"{opts.robots} simulated robots and the robot at {opts.robot}: a fleet is simulated; "
                            "choose one")
    if opts.robots > 1:  # one person, N simulated robots: `hg-dagger run --robots N`'s wiring, the keyboard theirs
        overrides.update({"num_envs": opts.robots, "fleet.allocation": opts.allocation or "cur",
                          "fleet.flag_wait_s": opts.flag_wait, "handover.wait": "pause",
                          "handover.wait_timeout_s": opts.wait_limit})
        if opts.wait_limit is not None:
            overrides["handover.on_wait_timeout"] = "policy"  # an expired request lets the student go on
        if opts.operator == "device":  # a device is made for one env: the fleet's keyboard is set below
            overrides["operator.type"] = "synthetic"
    session = open_session(load_run_config(opts.config or None, opts.task, **overrides), opts.store_url,
                           student_path=student_path, policy_options=opts.policy_options)
    try:
        if opts.robots > 1 and opts.operator == "device":
            fleet_keyboard(session, make_device(opts.device), opts.name or "device")
            session.gate_config_extra["operator_config"] = {"type": "device", "device": opts.device,
                                                            "name": opts.name or None}
        session.set_mode(opts.mode)
    except BaseException:
        session.rec.close()
        session.env.close()
        raise
    return session


class OperatorApp(QtCore.QObject):
    """Opens the window on a running ControlLoop and runs the jobs the operator starts from it."""

    finished = QtCore.pyqtSignal(int)

    def __init__(self, opts: AppOptions, settings: saved.SettingsFile | None = None):
        super().__init__()
        self.opts = opts
        self.settings = settings if settings is not None else saved.SettingsFile()
        self.loop: ControlProcess | ControlLoop | None = None
        self.window: MainWindow | None = None
        self.student_path = ""  # chosen in start(), once the task is known
        self.job: BackgroundJob | None = None
        self._job_kind = ""  # "bootstrap" | "train" | "own" (a round with the policy's own trainer)
        self._own: OwnTrainerRounds | None = None  # rounds of a policy from elsewhere (ui.rounds)
        self._paused_for_training = False
        self._reported = False  # an error snapshot was shown once
        self._watch: QtCore.QTimer | None = None  # the window's: watches the loop while the window is there
        self._ended = False  # the run ended with its window
        self.exit_code = 0
        self._poll = QtCore.QTimer(self)
        self._poll.setInterval(100)
        self._poll.timeout.connect(self._on_poll)
        self._progress: QtWidgets.QProgressDialog | None = None
        self._progress_intro = ""  # what the first-student dialog is for; its stages are added under it

    # ---- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Ask what is missing (pseudonym, task, backend), make a first student if there is none, open."""
        opts = self._complete(self.opts)
        if opts is None:
            self._finish(1, "")
            return
        self.opts = opts
        self.student_path = opts.student or newest_student(opts)
        if self.student_path:
            self._launch()
            return
        no_planner = first_student_impossible(opts.task)
        if no_planner:
            self._finish(2, no_planner)
            return
        log.info("no student for %s yet: a first one from %d planner demonstrations", opts.task, opts.bootstrap_demos)
        self.job = BackgroundJob(bootstrap_student, task=opts.task, store=opts.store_url,
                                 out_dir=str(opts.task_dir / "students" / "round-00"), demos=opts.bootstrap_demos,
                                 steps=opts.bootstrap_steps, seed=opts.seed)
        self._job_kind = "bootstrap"
        self._progress_intro = (f"No student for {opts.task} yet: recording planner demonstrations and training a "
                                "first, deliberately weak student, so the gates have something to catch.")
        self._progress = QtWidgets.QProgressDialog(self._progress_intro, "Cancel", 0, 100)
        self._progress.setWindowTitle("hg-dagger: first student")
        self._progress.setMinimumDuration(0)
        self._progress.setMinimumWidth(460)
        self._progress.canceled.connect(self._cancel_bootstrap)
        self._progress.show()
        self._poll.start()

    def _complete(self, o: AppOptions) -> AppOptions | None:
        """Defaults for a scripted run; the start dialog for whatever a person must choose."""
        s = self.settings
        o = replace(o, operator=o.operator or "device", device=o.device or "keyboard",
                    mode=o.mode or (SessionMode.STUDENT_ONLY if o.operator == "none" else SessionMode.HUMAN_GATED).value)
        if o.quit_when_done or (o.name and o.task):
            return replace(o, task=o.task or s.data.start.task or "fetch_pick_place",
                           name=o.name or o.operator)
        choices = StartDialog.ask(settings=s, task=o.task)  # a task given on the command line wins
        if choices is None:
            return None
        return replace(o, name=choices.operator, task=choices.task, robot=choices.robot or o.robot,
                       token_file=choices.token_file or o.token_file, student=choices.student or o.student,
                       store=choices.store or o.store)

    def _cancel_bootstrap(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job = None
        self._finish(1, "cancelled before the first student was ready")

    def _launch(self) -> None:
        o, path = self.opts, self.student_path
        kind = ControlProcess if o.control_process else ControlLoop
        self.loop = kind(functools.partial(build_session, o, path), rate_hz=o.rate_hz, view_size=o.view_size,
                         store=o.store_url)
        self.window = MainWindow(self.loop.slot, self.loop.commands, settings=self.settings,
                                 review_store=o.store_url, operator=o.name, robots=o.robots)
        self.window.setWindowTitle(f"hg-dagger - {o.task} - {o.name}")
        self.window.train_requested.connect(self._ask_train)
        self.window.rounds.set_trained(read_training_summary(path))
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()  # the keyboard is the robot's from the start (a bare X server focuses nothing)
        self.loop.start()
        if o.episodes:
            self.loop.commands.put(live.StartEpisodes(o.episodes))
        self._watch = QtCore.QTimer(self.window)  # a child of the window: it never outlives it
        self._watch.setInterval(100)
        self._watch.timeout.connect(self._on_watch)
        self.window.closed.connect(self._end_run)
        self.window.destroyed.connect(self._window_destroyed)
        self._watch.start()

    def _on_watch(self) -> None:
        """Scripted runs close their window when their episodes are done; a control loop that ended (an error, a
        stop) ends the run. The run ends with its window, whichever way it goes (``_end_run``)."""
        loop, win = self.loop, self.window
        assert loop is not None  # the watch starts in _launch, after the loop is made
        if win is None or sip.isdeleted(win):
            self._end_run()
            return
        snap = loop.slot.read()
        if snap.phase == "error" and not self._reported:
            self._reported = True
            if self.opts.quit_when_done:
                win.close()
                return
            QtWidgets.QMessageBox.critical(win, "hg-dagger", snap.message)
        seen = self._own.watch(snap.policy_version) if self._own is not None else ""
        if seen:  # a ws:// round's server came back with its next version
            win.set_training_done(seen)
        if (self.opts.quit_when_done and self.opts.episodes and snap.phase in ("idle", "estopped")
                and snap.counters.episodes >= self.opts.episodes and win.isVisible()):
            win.close()
            return
        if not loop.alive:
            self._end_run()

    def _window_destroyed(self) -> None:
        """The window went without a close (deleted by its owner): the run ends as on a close."""
        self.window = None
        self._end_run()

    def _end_run(self) -> None:
        """The run ends with its window (closed, deleted, or closed here because the loop ended): the watch stops,
        the control loop stops (its open episodes end as on a quit, before the report reads the store), and the
        summary is reported, once."""
        if self._ended:
            return
        self._ended = True
        watch = self._watch
        if watch is not None and not sip.isdeleted(watch):
            watch.stop()
        win = self.window
        if win is not None and not sip.isdeleted(win) and win.isVisible():
            win.close()  # its closed signal comes back here and finds the run ended
        assert self.loop is not None  # the run ends only after _launch made the loop
        self.loop.stop()
        self._finish(*self._report())

    def _report(self) -> tuple[int, str]:
        """The run's summary and, for a scripted run, the store's validation."""
        loop = self.loop
        assert loop is not None  # reported from _end_run, after _launch made the loop
        if loop.error:
            return 2, loop.error
        sm = loop.summary or {}
        line = (f"this sitting: {sm.get('episodes', 0)} episodes ({sm.get('successes', 0)} successful), "
                f"{sm.get('steps', 0)} steps, {sm.get('windows', 0)} correction windows, "
                f"{sm.get('human_steps', 0)} operator steps, recorded in {self.opts.store_url}")
        if not self.opts.quit_when_done:
            return 0, line
        bad = [str(v) for v in validate_store(EpisodeStore.open(self.opts.store_url))]
        if bad:
            return 1, line + f"\nvalidate: {len(bad)} violation(s)\n  " + "\n  ".join(bad[:20])
        return 0, line + "\nvalidate: ok"

    def _on_poll(self) -> None:
        job = self.job
        if job is None:
            return
        for p in job.poll():
            self._show_progress(p.stage, p.fraction)
        if not job.done:
            return
        self.job = None
        kind = self._job_kind
        if job.error:
            if kind == "bootstrap":
                self._finish(2, f"could not make a first student: {job.error}")
            else:
                self._training_done(None, job.error)
            return
        if kind == "bootstrap":
            if self._progress is not None:
                self._progress.canceled.disconnect(self._cancel_bootstrap)  # closing it would say "canceled"
                self._progress.close()
                self._progress = None
            self.student_path = job.result["checkpoint"]
            self._launch()
        else:
            self._training_done(job.result, "")

    def _show_progress(self, stage: str, fraction: float) -> None:
        if self._progress is not None:
            self._progress.setLabelText(f"{self._progress_intro}\n\nnow: {stage}...")  # the why stays in view
            self._progress.setValue(int(100 * fraction))
        elif self.window is not None:
            self.window.set_training_progress(stage, fraction)

    # ---- rounds ----------------------------------------------------------------------------

    def _ask_train(self) -> None:
        if self._trained_elsewhere():
            return
        box = QtWidgets.QMessageBox(self.window)
        box.setWindowTitle("Train the next student")
        box.setText("Train the next student on the labels reviewers approved for training (QC runs first; "
                    "approve windows in the Review tab).\n\n"
                    "Keep the control loop running while it trains, or pause it?")
        keep = box.addButton("Keep running", QtWidgets.QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Pause while training", QtWidgets.QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QtWidgets.QMessageBox.StandardButton.Cancel)
        box.exec()
        if box.buttonRole(box.clickedButton()) == QtWidgets.QMessageBox.ButtonRole.RejectRole:
            return
        self.train_next(keep_running=box.clickedButton() is keep)

    def _trained_elsewhere(self) -> bool:
        """A policy from elsewhere (a server) is trained by its own trainer: a round of ui.rounds.OwnTrainerRounds
        (lerobot:DIR fine-tuned by lerobot-train; ws:// exported for the server's owner), the loop running on."""
        # deferred: policy imports torch; importing this module stays free of it
        from hg_dagger.policy import is_remote

        if not is_remote(self.student_path):
            return False
        assert self.window is not None and self.loop is not None  # training is asked for from the open window
        if self.job is not None:
            return True
        o = self.opts
        if self._own is None:
            self._own = OwnTrainerRounds(o.task_dir, o.store_url, o.task, getattr(o.policy_options, "python", None),
                                         o.promotion_episodes)
        try:
            self.job, first = self._own.start(self.student_path, self.loop.slot.read().policy_version)
        except HgDaggerError as exc:  # a bad lerobot_train.yaml, no policy python: one line, nothing started
            self.window.set_training_done(str(exc))
            return True
        self._job_kind = "own"
        self._poll.start()
        self.window.set_training_progress(first, 0.0)
        return True

    def train_next(self, keep_running: bool = True) -> None:
        """Train the next student on the store's trainable labels in a background process."""
        if self.job is not None or self._trained_elsewhere():
            return
        o = self.opts
        k = len(list(o.task_dir.glob("students/round-*"))) if o.task_dir.exists() else 0
        if not keep_running and self.loop is not None:
            self.loop.commands.put(live.Pause(True))
        self._paused_for_training = not keep_running
        self.job = BackgroundJob(train_round, store=o.store_url, task=o.task,
                                 out_dir=str(o.task_dir / "students" / f"round-{k:02d}"), resume=self.student_path,
                                 steps=o.train_steps, seed=o.seed + k,
                                 promotion={"episodes": o.promotion_episodes} if o.promotion_episodes > 0 else None)
        self._job_kind = "train"
        self._poll.start()
        if self.window is not None:
            self.window.set_training_progress("starting", 0.0)

    def _training_done(self, result: dict | None, error: str) -> None:
        if self._job_kind == "own" and self._own is not None:
            message, spec = self._own.finished(result, error)
            if self.window is not None:
                self.window.set_training_done(message)
            if spec and self.loop is not None:  # the new checkpoint acts from the next episode
                self.student_path = spec
                self.loop.commands.put(live.SwapStudent(spec))
            return
        promotion = (result or {}).get("promotion")
        if self.window is not None:
            trained = training_summary(result.get("selection")) if result is not None else ""
            if error:
                message = error
            else:
                assert result is not None  # a job that ended without an error returned its result
                message = (promotion_line(promotion) if promotion else
                           f"new student {result['version']} ({result['labels']} labels)")
            self.window.set_training_done(message, trained)
        if promotion is not None and not promotion["promoted"]:  # the acting student goes on; the labels stay
            result = None
        if result is not None and self.loop is not None:
            self.student_path = result["checkpoint"]
            self.loop.commands.put(live.SwapStudent(result["checkpoint"], tuple(result.get("calibration", ()))))
        if self._paused_for_training and self.loop is not None:
            self.loop.commands.put(live.Pause(False))

    # ---- end -------------------------------------------------------------------------------

    def _finish(self, code: int, message: str = "") -> None:
        if message:
            print(("error: " if code else "") + message, file=sys.stderr if code else sys.stdout)
        self.exit_code = code
        if self.job is not None:
            self.job.cancel()
        if self.loop is not None:
            self.loop.stop()
        self.finished.emit(code)


_QT_NOISE = ("propagateSizeHints",)  # the offscreen platform says this for every window: not for people


def _qt_message(mode: QtCore.QtMsgType, context: QtCore.QMessageLogContext, message: str | None) -> None:
    assert message is not None  # Qt always passes the message's text
    if any(n in message for n in _QT_NOISE):
        return
    level = {QtCore.QtMsgType.QtDebugMsg: logging.DEBUG, QtCore.QtMsgType.QtInfoMsg: logging.INFO,
             QtCore.QtMsgType.QtWarningMsg: logging.WARNING}.get(mode, logging.ERROR)
    logging.getLogger("qt").log(level, "%s", message)


def display_available() -> bool:
    """A screen to open a window on (or Qt told to draw offscreen)."""
    if os.environ.get("QT_QPA_PLATFORM", "").startswith(("offscreen", "minimal", "vnc")):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run_app(opts: AppOptions, *, argv: list[str] | None = None) -> int:
    """Open the app and run until it is closed (or, with quit_when_done, until its episodes are done)."""
    # the process's application is a QApplication (the app has widgets); instance() is typed as the core one
    app = cast(QtWidgets.QApplication,
               QtWidgets.QApplication.instance() or QtWidgets.QApplication(argv or ["hg-dagger"]))
    app.setApplicationName("hg-dagger")
    app.setOrganizationName("hg-dagger")
    app.setQuitOnLastWindowClosed(False)  # the progress dialog closes before the main window opens
    QtCore.qInstallMessageHandler(_qt_message)
    op = OperatorApp(opts)
    op.finished.connect(lambda code: app.exit(code))
    QtCore.QTimer.singleShot(0, op.start)
    with close_on_signals(app):  # every window, a modal question's too: the main window's close ends the run
        code = app.exec()
    delete_now(op.window)
    return op.exit_code or code


