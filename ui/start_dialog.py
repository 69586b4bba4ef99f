"""The first question of a session: who operates, which task, which backend, which student, which store.

``StartDialog.choices()`` returns a plain ``StartChoices`` (no Qt types), so whatever opens the session
does not depend on Qt. The pseudonym, task, backend and recent stores are remembered in the app's settings file
(ui.settings: app.yaml in the config home).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PyQt6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.config import known_names
from hg_dagger.ui import settings as saved
from hg_dagger.ui import style

RECENT_STORES = saved.RECENT_STORES
BACKENDS = (("embedded", "Embedded MuJoCo simulator"), ("bridge", "Robot bridge"))


@dataclass(frozen=True)
class StartChoices:
    operator: str
    task: str
    backend: Literal["embedded", "bridge"] = "embedded"
    host: str = ""
    port: int = 0
    token_file: str = ""
    student: str = ""  # checkpoint path; "" = the app's default
    store: str = ""  # "" = the app's default for the task

    @property
    def robot(self) -> str:
        """HOST:PORT of the bridge, "" for the embedded simulator."""
        return f"{self.host}:{self.port}" if self.backend == "bridge" else ""


def task_names() -> list[str]:
    """Task names: the YAML files in tasks/ on the config search path (./configs, the config home, shipped)."""
    return known_names("tasks")


def _picker(edit: QLineEdit, title: str, filters: str, parent: QWidget, directory: bool = False) -> QPushButton:
    b = QPushButton("Browse...")

    def pick() -> None:
        if directory:
            path = QFileDialog.getExistingDirectory(parent, title, edit.text())
        else:
            path, _ = QFileDialog.getOpenFileName(parent, title, edit.text(), filters)
        if path:
            edit.setText(path)

    b.clicked.connect(pick)
    return b


def _row(*widgets: QWidget) -> QWidget:
    w = QWidget()
    lay = QHBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    for i, x in enumerate(widgets):
        lay.addWidget(x, 1 if i == 0 else 0)
    return w


class StartDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, *, settings: saved.SettingsFile | None = None,
                 tasks: list[str] | None = None, task: str = ""):
        super().__init__(parent)
        self.setWindowTitle("hg-dagger: start a session")
        self.setMinimumWidth(520)
        self.settings = settings if settings is not None else saved.SettingsFile()
        s = self.settings.data.start
        self.operator = QLineEdit(s.operator)
        self.operator.setPlaceholderText("a pseudonym, e.g. op-07 (stored with every episode)")
        self.task = QComboBox()
        self.task.addItems(tasks if tasks is not None else task_names())
        chosen = task or s.task  # the command line's task wins
        if chosen and self.task.findText(chosen) < 0 and Path(chosen).suffix in (".yaml", ".yml") and (
                task or Path(chosen).is_file()):
            self.task.addItem(chosen)  # a task file of the user's: offered beside the named tasks
        i = self.task.findText(chosen)
        if i >= 0:
            self.task.setCurrentIndex(i)
        self.backend = QComboBox()
        for value, label in BACKENDS:
            self.backend.addItem(label, value)
        i = self.backend.findData(s.backend)
        self.backend.setCurrentIndex(max(0, i))
        self.host = QLineEdit(s.host)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(s.port)
        self.token = QLineEdit(s.token_file)
        self.student = QLineEdit(s.policy)
        self.student.setPlaceholderText("optional: a checkpoint (.pt), ws://HOST:PORT or lerobot:DIR; default: the "
                                        "newest student for this task, or a first one")
        self.store = QComboBox()
        self.store.setEditable(True)
        self.store.addItems(self.recent_stores())
        store_edit = self.store.lineEdit()
        assert store_edit is not None  # an editable combo box has its line edit
        store_edit.setPlaceholderText("default: runs/app/<task>/store.zarr")
        if not self.store.count():
            self.store.setEditText("")
        self.error = QLabel()
        self.error.setStyleSheet(f"color: {style.SAFETY}; font-weight: bold;")

        form = QFormLayout()
        form.addRow("Operator pseudonym *", self.operator)
        form.addRow("Task", self.task)
        form.addRow("Backend", self.backend)
        self.bridge_rows = (_row(self.host, QLabel("port"), self.port),
                            _row(self.token, _picker(self.token, "Token file", "All files (*)", self)))
        form.addRow("Bridge host", self.bridge_rows[0])
        form.addRow("Token file", self.bridge_rows[1])
        form.addRow("Policy", _row(self.student, _picker(self.student, "Student checkpoint",
                                                                     "Checkpoints (*.pt);;All files (*)", self)))
        form.addRow("Store", _row(self.store, _picker(store_edit, "Store folder", "", self,
                                                      directory=True)))
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        assert ok is not None  # the box is made with its Ok button
        ok.setText("Start")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.error)
        lay.addWidget(self.buttons)
        self.backend.currentIndexChanged.connect(self._backend_changed)
        self.operator.textChanged.connect(self._validate)
        self.host.textChanged.connect(self._validate)
        self._backend_changed()

    def recent_stores(self) -> list[str]:
        return [x for x in self.settings.data.start.recent_stores if x]

    def _backend_changed(self) -> None:
        bridge = self.backend.currentData() == "bridge"
        for w in self.bridge_rows:
            w.setEnabled(bridge)
        self._validate()

    def problem(self) -> str:
        """Why the choices cannot start a session yet ("" when they can)."""
        if not self.operator.text().strip():
            return "Enter an operator pseudonym (required)."
        if self.task.count() == 0:
            return "No tasks found (tasks/ in ./configs, the config home and the shipped configs)."
        if self.backend.currentData() == "bridge" and not self.host.text().strip():
            return "Enter the robot bridge's host."
        return ""

    def _validate(self) -> None:
        p = self.problem()
        self.error.setText(p)
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        assert ok is not None  # the box is made with its Ok button
        ok.setEnabled(not p)

    def choices(self) -> StartChoices:
        bridge = self.backend.currentData() == "bridge"
        return StartChoices(
            operator=self.operator.text().strip(), task=self.task.currentText(),
            backend="bridge" if bridge else "embedded", host=self.host.text().strip() if bridge else "",
            port=self.port.value() if bridge else 0, token_file=self.token.text().strip() if bridge else "",
            student=self.student.text().strip(), store=self.store.currentText().strip())

    def accept(self) -> None:
        if self.problem():
            self._validate()
            return
        c = self.choices()
        s = self.settings.data.start
        s.operator, s.task, s.backend, s.policy = c.operator, c.task, c.backend, c.student
        if c.backend == "bridge":
            s.host, s.port, s.token_file = c.host, c.port, c.token_file
        if c.store:
            saved.remember_store(self.settings, c.store)
        self.settings.save()
        super().accept()

    @classmethod
    def ask(cls, parent: QWidget | None = None, *, settings: saved.SettingsFile | None = None,
            task: str = "") -> StartChoices | None:
        """Show the dialog and wait for the operator (before the session exists); None when cancelled.
        ``task`` (from the command line) is chosen over the remembered one."""
        dlg = cls(parent, settings=settings, task=task)
        return dlg.choices() if dlg.exec() == QDialog.DialogCode.Accepted else None
