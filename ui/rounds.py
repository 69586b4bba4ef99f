"""Rounds of DAgger at a glance (success, intervention rate and human labels per round), how the
requests of this sitting ended, what reached the last training, the button that asks for the next
student (``OwnTrainerRounds`` when the policy trains with its own trainer), and the status line at the
bottom of the window."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import Qt, pyqtSignal
from PyQt6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QStatusBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.control.live import Snapshot
from hg_dagger.learn.lerobot_round import (
    LINEAGE_FILE,
    PYTHON_ENV,
    LeRobotTrainConfig,
    export_round,
    lerobot_round,
    load_train_config,
    promotion_words,
    record_new_version,
)
from hg_dagger.learn.rounds import BackgroundJob
from hg_dagger.ui import style

# (key in snap.rounds, header, header tooltip): headers short enough that six columns fit the Rounds tab
COLUMNS = (("round", "Round", "round (now: the student driving)"), ("policy_version", "Policy", "student version"),
           ("episodes", "Eps", "episodes run"), ("success_rate", "Success", "success rate"),
           ("intervention_rate", "Interv.", "intervention rate: share of steps you drove"),
           ("human_labels", "Labels", "your labelled steps"),
           ("requests", "Req.", "requests for you: answered / declined / expired"))


# TrainingBlock names (contract.labels) in the words the Rounds panel uses
_BLOCK_WORDS = {"not_reviewed": "not reviewed", "rejected": "rejected", "needs_fix": "sent back for a fix",
                "not_authorized": "approved but not authorized", "qc_not_run": "QC not run", "qc_failed": "failed QC",
                "replay_mismatch": "did not replay", "self_review": "approved by their own operator",
                "reviewer_not_listed": "reviewer not on the roster"}


def training_summary(selection: dict | None) -> str:
    """What reached training, from train.json's ``selection``: "956 of 1,020 labels reached training;
    35 rejected, 29 not reviewed" (a label stopped for several reasons counts under each)."""
    if not selection:
        return ""
    allowed, total = int(selection.get("allowed", 0)), int(selection.get("labels", 0))
    stops = [f"{int(selection[k]):,} {w}" for k, w in _BLOCK_WORDS.items() if int(selection.get(k) or 0)]
    return f"{allowed:,} of {total:,} labels reached training" + (f"; {', '.join(stops)}" if stops else "")


def read_training_summary(checkpoint: str) -> str:
    """``training_summary`` of the train.json beside a student checkpoint ("" when there is none or it is
    unreadable: a first student made elsewhere has none)."""
    try:
        data = json.loads((Path(checkpoint).parent / "train.json").read_text())
    except (OSError, ValueError):
        return ""
    return training_summary(data.get("selection")) if isinstance(data, dict) else ""


def requests_line(snap: Snapshot) -> str:
    """How this sitting's handover requests ended."""
    c = snap.counters
    return (f"Requests: {c.requests_answered} answered, {c.requests_declined} declined, "
            f"{c.requests_expired} expired")


def _cell(key: str, value) -> str:
    if key == "requests":
        return value
    if value is None:
        return "-"
    if key in ("success_rate", "intervention_rate"):
        v = float(value)
        return "-" if not math.isfinite(v) else f"{100 * v:.0f} %"
    return str(value)


class RoundsPanel(QWidget):
    """Table of ``snap.rounds`` and a plot of their success and intervention rates beside it; "Train next
    student" emits ``train_requested``."""

    train_requested = pyqtSignal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([t for _, t, _ in COLUMNS])
        for c, (_, _, tip) in enumerate(COLUMNS):
            item = self.table.horizontalHeaderItem(c)
            assert item is not None  # setHorizontalHeaderLabels made one per column
            item.setToolTip(tip)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        vertical, header = self.table.verticalHeader(), self.table.horizontalHeader()
        assert vertical is not None and header is not None  # a table view always has its headers
        vertical.setVisible(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)  # the policy version gives way first
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setWordWrap(False)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        rows = self.table.fontMetrics().height() + 8
        vertical.setDefaultSectionSize(rows)
        self.table.setMinimumHeight(header.sizeHint().height() + 3 * rows + 6)  # 3+ rows
        self.graph = pg.GraphicsLayoutWidget()
        self.graph.setBackground("w")
        self.graph.setMinimumHeight(self.table.minimumHeight())
        self.requests = QLabel(requests_line(Snapshot()))
        self.requests.setObjectName("rounds_requests")
        self.trained = QLabel()
        self.trained.setObjectName("rounds_trained")
        self.trained.setWordWrap(True)
        self.rates = self.graph.addPlot(row=0, col=0)
        self.rates.setYRange(0, 1.05, padding=0)
        for p in (self.rates,):
            p.setMouseEnabled(x=False, y=False)
            p.setMenuEnabled(False)
            p.showGrid(x=False, y=True, alpha=0.25)
        self.rates.setTitle(f"<span style='color:{style.AUTONOMOUS}'>&#9679; success</span> "
                            f"<span style='color:{style.HUMAN}'>&#9679; interv.</span>", size="8pt")
        self.rates.getAxis("bottom").setTickSpacing(1, 1)
        sym = dict(symbol="o", symbolSize=7)
        self.success = self.rates.plot(pen=pg.mkPen(style.AUTONOMOUS, width=2), symbolBrush=style.AUTONOMOUS,
                                       name="success", **sym)
        self.intervention = self.rates.plot(pen=pg.mkPen(style.HUMAN, width=2), symbolBrush=style.HUMAN,
                                            name="intervention", **sym)
        self.train = QPushButton("Train next student")
        self.train.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.train.setToolTip("Train a new student on the approved labels so far (in the background)")
        self.train.clicked.connect(self.train_requested)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setVisible(False)
        self.message = QLabel()
        self.message.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addWidget(self.requests)
        side = QHBoxLayout()
        side.addWidget(self.table, 2)  # the rounds themselves first (labels per round too); the plot is the trend
        side.addWidget(self.graph, 1)
        lay.addLayout(side, 1)
        lay.addWidget(self.trained)
        row = QHBoxLayout()
        row.addWidget(self.train)
        row.addWidget(self.progress, 1)
        lay.addLayout(row)
        lay.addWidget(self.message)
        self._rounds: tuple = ()
        self._training = False  # a job this window started is running
        self._loop_message = ""  # the loop's line as last seen in a snapshot

    def show_snapshot(self, snap: Snapshot) -> None:
        if snap.rounds != self._rounds:
            self.set_rounds(snap.rounds)
        line = requests_line(snap)
        if self.requests.text() != line:
            self.requests.setText(line)
        training = snap.phase == "training" or self._training
        self.train.setEnabled(not training and snap.phase not in ("error", "stopped"))
        if snap.phase == "training":
            self.progress.setVisible(True)
            if self.progress.maximum() == 100 and not self._training:
                self.progress.setRange(0, 0)  # busy until a fraction is known
        elif not self._training:
            self.progress.setVisible(False)
        loading = snap.loading or snap.phase == "loading"  # the session's start-up line is not about rounds
        # the loop's line shows when it changes: a round's own result (set_training_done) stays until then
        fresh = snap.message != self._loop_message
        self._loop_message = snap.message
        if fresh and snap.message != self.message.text() and (snap.phase == "training" or snap.message) \
                and not loading:
            self.message.setText(snap.message)

    def set_rounds(self, rounds) -> None:
        self._rounds = tuple(rounds)
        self.table.setRowCount(len(self._rounds))
        for r, rd in enumerate(self._rounds):
            for c, (key, _, _) in enumerate(COLUMNS):
                value = rd.get(key) if key != "requests" else "/".join(
                    str(rd.get(f"requests_{k}", "-")) for k in ("answered", "declined", "expired"))
                text = _cell(key, value)
                if key == "round" and rd.get("current"):
                    text += " (now)"
                self.table.setItem(r, c, QTableWidgetItem(text))
        x = np.arange(len(self._rounds), dtype=float)

        def col(key: str) -> np.ndarray:
            return np.array([float(rd.get(key, np.nan) or 0.0) for rd in self._rounds], dtype=float)

        self.rates.setXRange(-0.5, max(1, len(self._rounds)) - 0.5, padding=0)  # one tick per round
        self.success.setData(x, col("success_rate"))
        self.intervention.setData(x, col("intervention_rate"))

    def set_training_progress(self, stage: str, fraction: float) -> None:
        """A training job's progress (from the app's job poller)."""
        self._training = True
        self.progress.setRange(0, 100)
        self.progress.setVisible(True)
        self.progress.setValue(int(round(100 * max(0.0, min(1.0, fraction)))))
        self.progress.setFormat(f"{stage} %p%")
        self.train.setEnabled(False)

    def set_training_done(self, message: str, trained: str = "") -> None:
        self._training = False
        self.progress.setVisible(False)
        self.message.setText(message)
        if trained:
            self.set_trained(trained)
        self.train.setEnabled(True)

    def set_trained(self, summary: str) -> None:
        """What reached the current student's training (training_summary)."""
        self.trained.setText(f"Last training: {summary}" if summary else "")


LEROBOT_CONFIG = "lerobot_train.yaml"  # in the app's task folder: its lerobot_train section (steps, batch_size, ...)


class OwnTrainerRounds:
    """"Train next" for a policy that trains with its own trainer (learn.lerobot_round), in a background job.

    lerobot:DIR: the next dataset version, exported, ``lerobot-train`` fine-tuning DIR (steps and batch from the
    ``lerobot_train`` section of TASK_DIR/lerobot_train.yaml, else the defaults), then, with ``promotion_episodes``,
    the held-out evaluation of both; the app swaps the new checkpoint in when it takes over; on a failure the acting
    policy goes on and the reason is the message. ws://HOST:PORT: the version
    exported for the server's owner; the server's next ``policy_version`` (seen after Reconnect policy) is recorded
    as a lineage event in the round's folder."""

    def __init__(self, task_dir: Path, store: str, task: str, python: str | None = None, promotion_episodes: int = 0):
        self.task_dir, self.store, self.task = Path(task_dir), store, task
        self.promotion = {"episodes": promotion_episodes} if promotion_episodes > 0 else None  # learn.promotion
        self.python = python or os.environ.get(PYTHON_ENV) or None
        self.waiting: dict[str, Any] | None = None  # a ws:// round's record until the server's next version shows

    def config(self) -> LeRobotTrainConfig:
        path = self.task_dir / LEROBOT_CONFIG
        return load_train_config(path) if path.is_file() else LeRobotTrainConfig()

    def _next_folder(self) -> Path:
        k = len(list(self.task_dir.glob("own_rounds/round-*"))) if self.task_dir.exists() else 0
        return self.task_dir / "own_rounds" / f"round-{k:02d}"

    def start(self, spec: str, version: str) -> tuple[BackgroundJob, str]:
        """The job of a round for the acting policy ``spec`` (its served ``version``) and its first line."""
        out = str(self._next_folder())
        if spec.startswith("lerobot:"):
            cfg = self.config()
            job = BackgroundJob(lerobot_round, policy=spec, store=self.store, out_dir=out, python=self.python,
                                config=cfg.model_dump(), task=self.task, promotion=self.promotion)
            return job, f"lerobot-train: {cfg.steps} steps, batch {cfg.batch_size}"
        job = BackgroundJob(export_round, policy=spec, store=self.store, out_dir=out, version=version,
                            task=self.task)
        return job, "exporting for the server's own trainer"

    def finished(self, result: dict[str, Any] | None, error: str) -> tuple[str, str]:
        """(the message, the policy spec to swap in; "" when the acting policy goes on)."""
        if error or result is None:
            return f"{error or 'the round ended without a result'}; the acting policy goes on", ""
        if "round" in result:  # ws://: the owner trains; the next version is recorded when it answers
            self.waiting = result
            return (f"{result['dataset']} ({result['frames']} labelled steps) exported to {result['export']}: train "
                    f"on it with your trainer, serve the new checkpoint at {result['policy']} and press Reconnect "
                    "policy; its new version is recorded then"), ""
        loss, decision = result.get("loss_last"), result.get("promotion")
        if decision:  # the held-out evaluation decided which policy acts next
            return promotion_words(decision), result["spec"] if decision["promoted"] else ""
        return (f"new policy {result['version']} from {result['parent_version']}: {result['step_last']} lerobot-train "
                f"steps on {result['dataset']}" + (f", final loss {loss:.4g}" if loss is not None else "")
                + "; it acts from the next episode"), result["spec"]

    def watch(self, version: str) -> str:
        """A line when the server of a ws:// round answers with another version (recorded as its lineage), else ""."""
        w = self.waiting
        if w is None or not version or version == w["parent_version"]:
            return ""
        record_new_version(w["round"], version)
        self.waiting = None
        return (f"{w['policy']} now serves {version} (after {w['parent_version']}, trained on {w['dataset']}): "
                f"recorded in {Path(w['round']).with_name(LINEAGE_FILE)}")


class StatusLine:
    """The window's status bar: store, episode and step, counters, operator, policy version."""

    def __init__(self, bar: QStatusBar):
        self.bar = bar
        self.store = QLabel()
        self.episode = QLabel()
        self.counters = QLabel()
        self.operator = QLabel()
        self.policy = QLabel()
        self.message = QLabel()
        self.message.setStyleSheet(f"color: {style.SAFETY}; font-weight: bold;")
        bar.addWidget(self.message, 1)
        for w in (self.store, self.episode, self.counters, self.operator, self.policy):
            bar.addPermanentWidget(w)
        self.show_snapshot(Snapshot())

    def show_snapshot(self, snap: Snapshot) -> None:
        c = snap.counters
        texts = {
            self.store: f"Store: {snap.store or '-'}",
            self.episode: f"Episode: {snap.episode_id or '-'}  step {snap.episode_step}",
            self.counters: (f"Episodes {c.episodes} | Successes {c.successes} | E-stops {c.estops} | "
                            f"Windows {c.windows} | Human labels {c.human_steps}"),
            self.operator: f"Operator: {snap.operator or '-'}",
            self.policy: f"Policy: {snap.policy_version or '-'}",
            self.message: snap.message if snap.phase == "error" else "",
        }
        for label, text in texts.items():
            if label.text() != text:
                label.setText(text)
                if label is not self.message:
                    _hold_size(label)


def _hold_size(label: QLabel) -> None:
    """Fix a label's size, growing it when its text needs more room but never shrinking it.

    A fixed-size widget's new text posts no layout request, so the step counter ticking every frame does
    not re-lay-out and repaint the whole status bar (and the window behind it)."""
    hint = label.sizeHint()
    w, h = max(hint.width(), label.minimumWidth()), hint.height()
    if (w, h) != (label.maximumWidth(), label.maximumHeight()) or label.minimumHeight() != h:
        label.setFixedSize(w, h)
