"""The window browser: a sortable table of correction windows over one or more stores, with filters and counts."""

from __future__ import annotations

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

COLUMNS = ("window", "status", "auth", "QC", "replay", "task", "operator", "gate", "steps", "source", "outcome",
           "reviewer", "QC flags", "mode", "policy", "date", "episode", "store", "privacy")
STATUS_COLOURS = {"pending": style.NEUTRAL, "approved": style.OK, "rejected": style.SAFETY, "needs_fix": style.WARNING}
FILTERS = (("task", "task"), ("operator", "operator"), ("mode", "mode"), ("gate_reason", "gate reason"),
           ("outcome", "recovery"), ("status", "review"), ("qc", "QC"), ("qc_flag", "QC flag"), ("replay", "replay"),
           ("policy_version", "policy"), ("date", "date"))
FILTERS_PER_ROW = 6


def _cell(row: ReviewRow, col: int):
    """(display text, sort key) of one cell."""
    w = row.window
    flags = ", ".join(row.qc_flags)
    values = {
        "window": (w.short_id, w.window_id), "status": (w.status.value, w.status.value),
        "auth": ("yes" if w.authorized else "no", w.authorized), "QC": (row.qc, row.qc),
        "replay": (row.replay, row.replay), "task": (w.task, w.task), "operator": (w.operator or "-", w.operator),
        "gate": (w.gate_reason or "-", w.gate_reason),
        "steps": (f"[{w.handover_start}, {w.handover_end})", (w.handover_start, w.handover_end)),
        "source": (w.source, w.source), "outcome": (w.outcome, w.outcome), "reviewer": (w.reviewer or "-", w.reviewer),
        "QC flags": (flags or "-", flags), "mode": (row.mode, row.mode),
        "policy": (row.policy_version or "-", row.policy_version), "date": (row.date, row.date),
        "episode": (w.episode_id[:12], w.episode_id), "store": (row.store, row.store), "privacy": (row.privacy, row.privacy),
    }
    return values[COLUMNS[col]]


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
            return _cell(row, index.column())[0]
        if role == Qt.ItemDataRole.UserRole:
            key = _cell(row, index.column())[1]
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
        self._fill_choices()
        self.table.resizeColumnsToContents()
        self._update_counts()

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

    def select(self, window_id: str) -> bool:
        """Make the window with this id (or id prefix) the current row."""
        for i in range(self.proxy.rowCount()):
            row = self.model.rows[self.proxy.mapToSource(self.proxy.index(i, 0)).row()]
            if row.window_id.startswith(window_id):
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
        shown = self.visible_rows()
        total = len(self.model.rows)
        text = counts(shown)
        if len(shown) != total:
            text += f"  (of {total})"
        self.counts.setText(text)

    def _current_changed(self, current, _previous):
        if current.isValid():
            self.selected.emit(self.model.rows[self.proxy.mapToSource(current).row()])
