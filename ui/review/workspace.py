"""The review workspace: window browser on the left, the selected window's episode and the decision panel.

Widgets only read state and call the review API; reading rows, episodes and audit trails and writing
decisions all run on the StoreWorker's thread, so a large store never freezes the window.
"""

from __future__ import annotations

import os

from PyQt6.QtCore import Qt
from PyQt6.QtWidgets import QLabel, QMainWindow, QSplitter, QVBoxLayout, QWidget

from hg_dagger.errors import HgDaggerError
from hg_dagger.ui import style
from hg_dagger.ui.review.browser import WindowBrowser
from hg_dagger.ui.review.decision import DecisionPanel
from hg_dagger.ui.review.episode_view import EpisodeView
from hg_dagger.ui.review.model import ReviewRow, load_episode, rows_of_store, with_window
from hg_dagger.ui.review.worker import StoreWorker


class ReviewWorkspace(QMainWindow):
    """Review correction windows of ``stores`` as ``reviewer`` (a pseudonym)."""

    def __init__(self, stores: list[str], reviewer: str, parent=None):
        super().__init__(parent)
        if not (reviewer or "").strip():
            raise HgDaggerError("a reviewer pseudonym is required")
        self.stores = [os.fspath(s) for s in stores]
        self.reviewer = reviewer.strip()
        self.setWindowTitle(f"hg-dagger review: {', '.join(self.stores)} ({self.reviewer})")
        self.worker = StoreWorker(self)
        self.browser = WindowBrowser()
        self.episode = EpisodeView()
        self.panel = DecisionPanel(self.reviewer, self.worker)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.rows_loaded = False
        self.errors: list[str] = []
        self.shown: ReviewRow | None = None  # the row whose episode the view shows
        self._episode_key: tuple[str, str] | None = None
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.episode)
        right.addWidget(self.panel)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.browser)
        split.addWidget(right)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.addWidget(split, 1)
        lay.addWidget(self.status)
        self.setCentralWidget(central)
        self.resize(1500, 900)
        self.browser.selected.connect(self._selected)
        self.panel.decided.connect(self._decided)
        self.reload()

    # ----------------------------------------------------------------------------------------- loading

    def reload(self) -> None:
        """Read the windows of every store again (in the background)."""
        self.rows_loaded = False
        self.errors = []
        self._message(f"reading {len(self.stores)} store(s)...")
        stores = list(self.stores)

        def read(worker):
            rows, errors = [], []
            for url in stores:
                try:
                    st = worker.store(url)
                    st.refresh()
                    rows += rows_of_store(st, url)
                except HgDaggerError as exc:
                    errors.append(str(exc))
            return rows, errors

        self.worker.submit(read, self._rows_read, self._failed)

    def _rows_read(self, result) -> None:
        rows, errors = result
        self.errors = errors
        self.browser.set_rows(rows)
        self.rows_loaded = True
        text = f"{len(rows)} correction window(s) in {len(self.stores)} store(s)"
        if errors:
            self._message(text + "; " + "; ".join(errors), error=True)
        else:
            self._message(text)

    def _failed(self, exc: BaseException) -> None:
        self.errors.append(str(exc))
        self._message(str(exc) if isinstance(exc, HgDaggerError) else f"{type(exc).__name__}: {exc}", error=True)

    def _message(self, text: str, *, error: bool = False) -> None:
        self.status.setStyleSheet(f"color: {style.SAFETY};" if error else "")
        self.status.setText(text)

    # ----------------------------------------------------------------------------------------- selection

    def _selected(self, row: ReviewRow) -> None:
        self.panel.set_row(row)
        key = (row.store, row.window.episode_id)
        if key == self._episode_key and self.episode.data is not None:
            self.shown = row
            self.episode.timeline.show_episode(self.episode.data, row.window_id)
            self._jump(row)
            return
        self._episode_key = key
        self.episode.title.setText(f"reading episode {row.window.episode_id}...")

        def read(worker):
            return load_episode(worker.store(row.store), row.window.episode_id)

        def done(data):
            if self._episode_key != key:
                return  # another window was selected meanwhile
            current = self.browser.current() or row
            self.shown = current
            self.episode.show_episode(data, current.window_id, step=self._start_step(current))

        self.worker.submit(read, done, self._failed)

    def _start_step(self, row: ReviewRow) -> int:
        return max(0, row.window.handover_start - row.context_before)

    def _jump(self, row: ReviewRow) -> None:
        self.episode.set_step(self._start_step(row))

    def _decided(self, store: str, window) -> None:
        old = next((r for r in self.browser.model.rows if r.key == (store, window.window_id)), None)
        if old is None:
            return
        new = with_window(old, window)
        self.browser.update_row(new)
        if self.panel.row is not None and self.panel.row.key == new.key:
            self.panel.set_row(new)

    def closeEvent(self, event):
        self.episode.stop()
        self.worker.close()
        super().closeEvent(event)
