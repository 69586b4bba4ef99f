"""The decision panel: approve (optionally authorizing training), reject or send back the selected window,
with a reason, and the window's audit trail. Every verdict goes through ``decisions.decide``."""

from __future__ import annotations

import html

from PyQt6.QtCore import pyqtSignal
from PyQt6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.contract.labels import is_operator
from hg_dagger.errors import HgDaggerError
from hg_dagger.review.decisions import AuditEntry, audit_trail, decide
from hg_dagger.ui import style
from hg_dagger.ui.review.model import ReviewRow
from hg_dagger.ui.review.worker import StoreWorker

TRAIL_COLUMNS = ("layer", "time", "reviewer", "decision", "authorized", "reason")


class DecisionPanel(QGroupBox):
    """Records verdicts for one reviewer; emits ``decided(store, WindowRow)`` after each stored decision.

    Without a reviewer (the app's review tab) the pseudonym is asked when the first decision is made, with an empty
    field: a reviewer is never the operator, so ``operator`` (the console's operator pseudonym) is refused there,
    as ``decide`` refuses any decision on a window by its own operator; *Change...* asks again."""

    decided = pyqtSignal(str, object)
    reviewer_changed = pyqtSignal(str)

    def __init__(self, reviewer: str | None, worker: StoreWorker, parent=None, *, operator: str = ""):
        super().__init__("Decision", parent)
        self.reviewer = (reviewer or "").strip()
        self.operator = (operator or "").strip()
        self.worker = worker
        self.busy = False
        self.row: ReviewRow | None = None
        self.trail: list[AuditEntry] = []
        self.current = QLabel("no window selected")
        self.current.setWordWrap(True)
        self.reason = QPlainTextEdit()
        self.reason.setPlaceholderText("reason (required to reject or send back)")
        self.reason.setMaximumHeight(70)
        self.authorize = QCheckBox("training authorized")
        self.approve_button = QPushButton("Approve")
        self.reject_button = QPushButton("Reject")
        self.fix_button = QPushButton("Needs fix")
        self.approve_button.setStyleSheet(f"color: {style.OK}; font-weight: bold;")
        self.reject_button.setStyleSheet(f"color: {style.SAFETY}; font-weight: bold;")
        self.fix_button.setStyleSheet(f"color: {style.WARNING}; font-weight: bold;")
        self.approve_button.clicked.connect(lambda: self.submit(ReviewStatus.APPROVED))
        self.reject_button.clicked.connect(lambda: self.submit(ReviewStatus.REJECTED))
        self.fix_button.clicked.connect(lambda: self.submit(ReviewStatus.NEEDS_FIX))
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.table = QTableWidget(0, len(TRAIL_COLUMNS))
        self.table.setHorizontalHeaderLabels(TRAIL_COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        vertical, horizontal = self.table.verticalHeader(), self.table.horizontalHeader()
        assert vertical is not None and horizontal is not None  # a table view always has its headers
        vertical.hide()
        horizontal.setStretchLastSection(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.approve_button)
        buttons.addWidget(self.authorize)
        buttons.addStretch(1)
        buttons.addWidget(self.reject_button)
        buttons.addWidget(self.fix_button)
        self.reviewer_label = QLabel()
        self.change_button = QPushButton("Change...")
        self.change_button.setToolTip("record the next decisions under another reviewer pseudonym")
        self.change_button.clicked.connect(self.ask_reviewer)
        who = QHBoxLayout()
        who.addWidget(self.reviewer_label, 1)
        who.addWidget(self.change_button)
        self._show_reviewer()
        lay = QVBoxLayout(self)
        lay.addLayout(who)
        lay.addWidget(self.current)
        lay.addWidget(self.reason)
        lay.addLayout(buttons)
        lay.addWidget(self.message)
        lay.addWidget(QLabel("audit trail (oldest first)"))
        lay.addWidget(self.table, 1)
        self._enable(False)

    def _show_reviewer(self) -> None:
        self.reviewer_label.setText(f"reviewer: <b>{self.reviewer}</b>" if self.reviewer else
                                    "reviewer: <i>asked at your first decision</i>")

    def ask_reviewer(self) -> str:
        """Ask for the reviewer's own pseudonym (offering the current one, never the operator's); "" when cancelled."""
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Reviewer")
        ask = "Your reviewer pseudonym (never a real name), recorded with every decision:"
        dialog.setLabelText(ask)
        dialog.setTextValue(self.reviewer)
        while dialog.exec():
            name = dialog.textValue().strip()
            if name and is_operator(name, self.operator):
                dialog.setLabelText(f"{name!r} is the operator's pseudonym: a reviewer is never the operator.\n{ask}")
                dialog.setTextValue("")
                continue
            if name:
                if name != self.reviewer:
                    self.reviewer = name
                    self._show_reviewer()
                    self.reviewer_changed.emit(name)
                return name
        return ""

    def _enable(self, on: bool) -> None:
        for w in (self.approve_button, self.reject_button, self.fix_button, self.authorize, self.reason):
            w.setEnabled(on)

    def set_row(self, row: ReviewRow | None) -> None:
        """Show a window (its state and audit trail), or nothing. Another window starts with an empty reason and
        no authorization: what was typed or ticked for one window never carries over to the next decision."""
        if row is None or self.row is None or row.key != self.row.key:
            self.reason.clear()
            self.authorize.setChecked(False)
        self.row = row
        self._enable(row is not None)
        self.message.setText("")
        if row is None:
            self.current.setText("no window selected")
            self.trail = []
            self._fill_trail()
            return
        w = row.window
        self.current.setText(f"window <b>{w.short_id}</b> steps [{w.handover_start}, {w.handover_end}) of episode "
                             f"{w.episode_id[:12]}: <b>{w.status.value}</b>"
                             + (", training authorized" if w.authorized else "")
                             + (f" (by {w.reviewer})" if w.reviewer else "")
                             + ("; certified by its planner: trains without authorization" if w.certified else "")
                             + (f"; <b>none of its steps is a trainable label</b> ({_excluded(w)}): no decision "
                                "trains it" if w.trainable_steps == 0 else ""))
        self.refresh_trail()

    def refresh_trail(self) -> None:
        """Read the shown window's audit trail in the background (the store is re-read for new layers)."""
        row = self.row
        if row is None:
            return

        def read(worker):
            st = worker.store(row.store)
            st.refresh()
            return audit_trail(st, row.window_id)

        def done(trail):
            if self.row is not None and self.row.key == row.key:
                self.trail = trail
                self._fill_trail()

        self.worker.submit(read, done, self._failed)

    def _failed(self, exc: BaseException) -> None:
        self.busy = False
        self._enable(self.row is not None)
        self._error(str(exc) if isinstance(exc, HgDaggerError) else f"{type(exc).__name__}: {exc}")

    def _fill_trail(self) -> None:
        self.table.setRowCount(len(self.trail))
        for i, e in enumerate(self.trail):
            d = e.decision
            cells = (f"v{e.version}", d.t_wall or e.created_wall, d.reviewer, d.status.value,
                     "yes" if d.replay_training_authorized else "no", d.notes)
            for j, text in enumerate(cells):
                self.table.setItem(i, j, QTableWidgetItem(str(text)))
        self.table.resizeColumnsToContents()

    def _error(self, text: str) -> None:
        self.message.setStyleSheet(f"color: {style.SAFETY};")
        self.message.setText(text)

    def submit(self, status: ReviewStatus) -> bool:
        """Record a verdict on the shown window; problems are shown in the panel. True when sent to the store."""
        if self.row is None:
            self._error("select a window first")
            return False
        reason = self.reason.toPlainText().strip()
        if status != ReviewStatus.APPROVED and not reason:
            verb = "reject" if status == ReviewStatus.REJECTED else "send back"
            self._error(f"a reason is required to {verb} a window")
            self.reason.setFocus()
            return False
        if self.busy:
            return False
        if not self.reviewer and not self.ask_reviewer():
            self._error("a reviewer pseudonym is needed to record a decision")
            return False
        authorize = status == ReviewStatus.APPROVED and self.authorize.isChecked()
        row, reviewer = self.row, self.reviewer

        def done(result):
            new, version = result
            self.busy = False
            self.reason.clear()
            self.authorize.setChecked(False)
            self.decided.emit(row.store, new)  # the workspace updates the table and shows the row again
            self.message.setStyleSheet(f"color: {style.OK};")
            self.message.setText(f"{new.status.value}{', training authorized' if new.authorized else ''}: "
                                 f"label layer v{version}")

        self.busy = True
        self._enable(False)
        self.message.setStyleSheet("")
        self.message.setText("recording...")
        self.worker.submit(lambda _w: decide(row.store, row.window_id, status, reviewer, reason, authorize),
                           done, self._failed)
        return True


def _excluded(w) -> str:
    """Why a window's steps train nothing, as the panel says it."""
    return html.escape(w.excluded_why) if w.excluded_why else "its episode was discarded, or its labels excluded"
