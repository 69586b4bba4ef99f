"""The window browser: a sortable table of correction windows over one or more stores, with filters and counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PyQt6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, pyqtSignal
from PyQt6.QtGui import QColor
from PyQt6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QGridLayout,
    QHeaderView,
    QLabel,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.ui import style
from hg_dagger.ui.review.model import ANY, FILTER_VALUES, Filters, ReviewRow, counts

STATUS_COLOURS = {"pending": style.NEUTRAL, "approved": style.OK, "rejected": style.SAFETY, "needs_fix": style.WARNING}
FILTERS = (("task", "task"), ("operator", "operator"), ("mode", "mode"), ("gate_reason", "gate reason"),
           ("outcome", "recovery"), ("status", "review"), ("qc", "QC"), ("qc_flag", "QC flag"), ("replay", "replay"),
           ("policy_version", "policy"), ("date", "date"), ("robot", "robot"))
FILTERS_PER_ROW = 6


def _branch(branch_of: str) -> str:
    if not branch_of:
        return "-"
    parent, step = branch_of.rsplit("@", 1)
    return f"{parent[:12]} step {step}"


def _flags(r: ReviewRow) -> str:
    return ", ".join(r.qc_flags)


# column -> (display text, sort key) of a row's cell
CELLS: dict[str, Callable[[ReviewRow], tuple[Any, Any]]] = {
    "window": lambda r: (r.window.short_id, r.window.window_id),
    "status": lambda r: (r.window.status.value, r.window.status.value),
    # training authorization: a reviewer's, or a planner's certification (trains without one)
    "auth": lambda r: (r.window.auth, (r.window.authorized, r.window.certified)),
    "QC": lambda r: (r.qc, r.qc),
    "replay": lambda r: (r.replay, r.replay),
    "task": lambda r: (r.window.task, r.window.task),
    "operator": lambda r: (r.window.operator or "-", r.window.operator),
    "gate": lambda r: (r.window.gate_reason or "-", r.window.gate_reason),
    "steps": lambda r: (f"[{r.window.handover_start}, {r.window.handover_end})",
                        (r.window.handover_start, r.window.handover_end)),
    "source": lambda r: (r.window.source, r.window.source),
    "outcome": lambda r: (r.window.outcome, r.window.outcome),
    "reviewer": lambda r: (r.window.reviewer or "-", r.window.reviewer),
    "QC flags": lambda r: (_flags(r) or "-", _flags(r)),
    "mode": lambda r: (r.mode, r.mode),
    "policy": lambda r: (r.policy_version or "-", r.policy_version),
    "date": lambda r: (r.date, r.date),
    "episode": lambda r: (r.window.episode_id[:12], r.window.episode_id),
    # a branch (a rewind): the attempt it went back into and the step it started from
    "branch of": lambda r: (_branch(r.window.branch_of), r.window.branch_of),
    "store": lambda r: (r.store, r.store),
    "privacy": lambda r: (r.privacy, r.privacy),
}
COLUMNS = tuple(CELLS)
_GETTERS = tuple(CELLS.values())
SIZE_ROWS = 100
"""Rows sampled to size the columns (Qt would read up to 1,000 rows of every column, about 1 s at 19 columns)."""


class WindowTableModel(QAbstractTableModel):
    """All rows loaded so far; filtering and sorting happen in the proxy."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[ReviewRow] = []
        self._index: dict[tuple[str, str], int] = {}

    def set_rows(self, rows: list[ReviewRow]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self._index = {r.key: i for i, r in enumerate(self.rows)}
        self.endResetModel()

    def add_rows(self, rows: list[ReviewRow]) -> None:
        """Append rows not held yet (rows of newly committed episodes)."""
        new = [r for r in rows if r.key not in self._index]
        if not new:
            return
        first = len(self.rows)
        self.beginInsertRows(QModelIndex(), first, first + len(new) - 1)
        for i, r in enumerate(new, first):
            self.rows.append(r)
            self._index[r.key] = i
        self.endInsertRows()

    def update_row(self, row: ReviewRow) -> None:
        i = self._index.get(row.key)
        if i is None:
            return
        self.rows[i] = row
        self.dataChanged.emit(self.index(i, 0), self.index(i, len(COLUMNS) - 1))

    def rowCount(self, parent=QModelIndex()):  # noqa: B008 (Qt's signature)
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()):  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return _GETTERS[index.column()](row)[0]
        if role == Qt.ItemDataRole.UserRole:
            key = _GETTERS[index.column()](row)[1]
            return str(key) if isinstance(key, tuple) and not all(isinstance(k, int) for k in key) else key
        if role == Qt.ItemDataRole.ForegroundRole and COLUMNS[index.column()] == "status":
            return QColor(STATUS_COLOURS.get(row.window.status.value, style.NEUTRAL))
        return None


class FilterProxy(QSortFilterProxyModel):
    """Applies a Filters value and sorts by each column's sort key."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.filters = Filters()
        self.setSortRole(Qt.ItemDataRole.UserRole)

    def set_filters(self, filters: Filters) -> None:
        if filters == self.filters:
            return  # the rows are filtered with these already (a model reset filters them)
        self.filters = filters
        self.invalidateFilter()

    def filterAcceptsRow(self, source_row, source_parent):
        return self.filters.accepts(self.sourceModel().rows[source_row])

    def lessThan(self, left, right):
        a, b = left.data(Qt.ItemDataRole.UserRole), right.data(Qt.ItemDataRole.UserRole)
        try:
            return a < b
        except TypeError:
            return str(a) < str(b)


class WindowBrowser(QWidget):
    """Filters above a table of windows; emits ``selected(ReviewRow)`` when the current row changes."""

    selected = pyqtSignal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model = WindowTableModel(self)
        self.proxy = FilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(-1, Qt.SortOrder.AscendingOrder)  # recording order until a header is clicked
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setResizeContentsPrecision(SIZE_ROWS)
        self.table.selectionModel().currentRowChanged.connect(self._current_changed)
        self.combos: dict[str, QComboBox] = {}
        form = QGridLayout()
        for i, (key, label) in enumerate(FILTERS):
            box = QComboBox()
            box.addItem("any", ANY)
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
            box.currentIndexChanged.connect(self._filters_changed)
            self.combos[key] = box
            r, c = divmod(i, FILTERS_PER_ROW)
            form.addWidget(QLabel(label), r, 2 * c, Qt.AlignmentFlag.AlignRight)
            form.addWidget(box, r, 2 * c + 1)
        form.setColumnStretch(2 * FILTERS_PER_ROW, 1)
        self.counts = QLabel("no windows loaded")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(form)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.counts)

    # ----------------------------------------------------------------------------------------- data

    def set_rows(self, rows: list[ReviewRow]) -> None:
        self.model.set_rows(rows)
        self.table.setColumnHidden(COLUMNS.index("store"), len({r.store for r in rows}) <= 1)
        self._fill_choices()  # also applies the filters and counts
        self.table.resizeColumnsToContents()

    def add_rows(self, rows: list[ReviewRow]) -> None:
        """Add the rows of newly committed episodes; filters, choices and counts follow."""
        self.model.add_rows(rows)
        self.table.setColumnHidden(COLUMNS.index("store"), len({r.store for r in self.model.rows}) <= 1)
        self._fill_choices()

    def update_row(self, row: ReviewRow) -> None:
        self.model.update_row(row)
        self.proxy.invalidateFilter()
        self._update_counts()

    def visible_rows(self) -> list[ReviewRow]:
        """The rows the table shows, in its current order."""
        return [self.model.rows[self.proxy.mapToSource(self.proxy.index(i, 0)).row()]
                for i in range(self.proxy.rowCount())]

    def current(self) -> ReviewRow | None:
        idx = self.table.currentIndex()
        if not idx.isValid():
            return None
        return self.model.rows[self.proxy.mapToSource(idx).row()]

    def select(self, window_id: str, store: str | None = None) -> bool:
        """Make the window with this id (or id prefix), of ``store`` if given, the current row."""
        for i in range(self.proxy.rowCount()):
            row = self.model.rows[self.proxy.mapToSource(self.proxy.index(i, 0)).row()]
            if row.window_id.startswith(window_id) and store in (None, row.store):
                self.table.selectRow(i)
                self.table.setCurrentIndex(self.proxy.index(i, 0))
                return True
        return False

    def set_filter(self, key: str, value: str) -> None:
        box = self.combos[key]
        i = box.findData(value)
        if i < 0:
            raise KeyError(f"filter {key!r} has no choice {value!r}")
        box.setCurrentIndex(i)

    # ----------------------------------------------------------------------------------------- internals

    def _choices(self, key: str) -> list[str]:
        if key == "status":
            return [s.value for s in ReviewStatus]
        get = FILTER_VALUES[key]
        return sorted({v for r in self.model.rows for v in get(r)} - {ANY})  # an empty value cannot be told from 'any'

    def _fill_choices(self) -> None:
        for key, box in self.combos.items():
            keep = box.currentData()
            box.blockSignals(True)
            box.clear()
            box.addItem("any", ANY)
            for v in self._choices(key):
                box.addItem(v or "-", v)
            i = box.findData(keep)
            box.setCurrentIndex(max(i, 0))
            box.blockSignals(False)
        self._filters_changed()

    def _filters_changed(self, *_):
        self.proxy.set_filters(Filters(**{k: (b.currentData() or ANY) for k, b in self.combos.items()}))
        self._update_counts()

    def _update_counts(self) -> None:
        total = len(self.model.rows)
        shown = self.model.rows if self.proxy.rowCount() == total else self.visible_rows()
        text = counts(shown)
        if len(shown) != total:
            text += f"  (of {total})"
        self.counts.setText(text)

    def _current_changed(self, current, _previous):
        if current.isValid():
            self.selected.emit(self.model.rows[self.proxy.mapToSource(current).row()])
