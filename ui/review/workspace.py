"""The review workspace: window browser on the left, the selected window's episode and the decision panel.

Widgets only read state and call the review API; reading rows, episodes and audit trails and writing
decisions all run on the StoreWorker's thread, so a large store never freezes the window. The same widget
is the window of ``hg-dagger review open`` and the Review tab of ``hg-dagger app``.
"""

from __future__ import annotations

import os

from PyQt6.QtCore import Qt, QTimer, pyqtSignal
from PyQt6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from hg_dagger.errors import HgDaggerError
from hg_dagger.ui import style
from hg_dagger.ui.review.browser import WindowBrowser
from hg_dagger.ui.review.decision import DecisionPanel
from hg_dagger.ui.review.episode_view import EpisodeView
from hg_dagger.ui.review.model import ReviewRow, load_episode, rows_of_episodes, with_window
from hg_dagger.ui.review.worker import StoreWorker

RETRY_MS = 500
"""How long to wait before looking again for an episode the session ended but whose commit has not landed."""
MAX_RETRIES = 20


class ReviewWorkspace(QWidget):
    """Review correction windows of ``stores`` as ``reviewer`` (a pseudonym).

    With ``reviewer`` None the pseudonym is asked at the first decision (never defaulting to ``operator``, the
    console operator's pseudonym, which is refused there). With
    ``load=False`` nothing is read until ``reload()`` (the app's tab reads when first shown)."""

    rows_changed = pyqtSignal()

    def __init__(self, stores: list[str], reviewer: str | None, parent=None, *, operator: str = "",
                 load: bool = True):
        super().__init__(parent)
        if reviewer is not None and not reviewer.strip():
            raise HgDaggerError("a reviewer pseudonym is required")
        self.stores = [os.fspath(s) for s in stores]
        self.worker = StoreWorker(self)
        self.browser = WindowBrowser()
        self.episode = EpisodeView()
        self.episode.scrub_keys_in(self)  # Left/Right/Space scrub wherever focus is in the workspace
        self.panel = DecisionPanel(reviewer, self.worker, operator=operator)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.reload_button = QPushButton("Reload")
        self.reload_button.setToolTip("read every store again (new episodes, QC runs, replay checks, decisions "
                                      "made elsewhere)")
        self.reload_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.reload_button.clicked.connect(self.reload)
        self.rows_loaded = False
        self.loading = False
        self.errors: list[str] = []
        self.shown: ReviewRow | None = None  # the row whose episode the view shows
        self._episode_key: tuple[str, str] | None = None
        self._seen: dict[str, set[str]] = {}  # store -> committed episodes whose rows are loaded
        self._awaiting = 0  # episodes the session ended whose rows have not been read yet
        self._retries = 0
        self._retry = QTimer(self)
        self._retry.setSingleShot(True)
        self._retry.timeout.connect(self.refresh_new)
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
        bottom = QHBoxLayout()
        bottom.addWidget(self.status, 1)
        bottom.addWidget(self.reload_button)
        lay = QVBoxLayout(self)
        lay.addWidget(split, 1)
        lay.addLayout(bottom)
        self._title()
        self.resize(1500, 900)
        self.browser.selected.connect(self._selected)
        self.panel.decided.connect(self._decided)
        self.panel.reviewer_changed.connect(lambda _name: self._title())
        if load:
            self.reload()

    @property
    def reviewer(self) -> str:
        return self.panel.reviewer

    def _title(self) -> None:
        self.setWindowTitle(f"hg-dagger review: {', '.join(self.stores)}"
                            + (f" ({self.reviewer})" if self.reviewer else ""))

    # ----------------------------------------------------------------------------------------- loading

    def reload(self) -> None:
        """Read the windows of every store again (in the background)."""
        self.rows_loaded = False
        self.loading = True
        self.errors = []
        self._message(f"reading {len(self.stores)} store(s)...")
        stores = list(self.stores)

        def read(worker):
            rows, errors, seen = [], [], {}
            for url in stores:
                try:
                    st = worker.store(url)
                    st.refresh()
                    infos = st.episodes(complete=True)
                    rows += rows_of_episodes(st, url, infos)
                    seen[url] = {i.episode_id for i in infos}
                except HgDaggerError as exc:
                    errors.append(str(exc))
            return rows, errors, seen

        self.worker.submit(read, self._rows_read, self._failed)

    def refresh_new(self) -> None:
        """Add the windows of episodes committed since the last read (the rest is kept as it is)."""
        if not self.rows_loaded:
            return  # a full read is under way or was never asked for; it will include them
        seen = {url: set(ids) for url, ids in self._seen.items()}
        stores = list(self.stores)

        def read(worker):
            rows, found = [], {}
            for url in stores:
                try:
                    st = worker.store(url)
                except HgDaggerError:
                    continue  # not created yet: the next commit creates it
                st.refresh()
                new = [i for i in st.episodes(complete=True) if i.episode_id not in seen.get(url, ())]
                rows += rows_of_episodes(st, url, new)
                found[url] = {i.episode_id for i in new}
            return rows, found

        self.worker.submit(read, self._new_rows_read, self._failed)

    def episodes_ended(self, count: int = 1) -> None:
        """The session ended ``count`` more episodes: show their windows once their commits are in the store."""
        self._awaiting += max(int(count), 0)
        self._retries = 0
        self.refresh_new()

    def _rows_read(self, result) -> None:
        rows, errors, seen = result
        self.errors = errors
        self._seen = seen
        current = self.browser.current()
        self.browser.set_rows(rows)
        if current is not None:
            self.browser.select(current.window_id, current.store)  # a reload keeps the reviewer's place
        self.rows_loaded = True
        self.loading = False
        self._awaiting = 0
        self._report()
        self.rows_changed.emit()

    def _new_rows_read(self, result) -> None:
        rows, found = result
        for url, ids in found.items():
            self._seen.setdefault(url, set()).update(ids)
        if rows:
            self.browser.add_rows(rows)
            self.rows_changed.emit()
        self._awaiting = max(0, self._awaiting - sum(len(ids) for ids in found.values()))
        if self._awaiting and self._retries < MAX_RETRIES:
            self._retries += 1
            self._retry.start(RETRY_MS)
        else:
            self._awaiting = 0
        self._report()

    def _report(self) -> None:
        n = len(self.browser.model.rows)
        text = f"{n} correction window(s) in {len(self.stores)} store(s)"
        if self.errors:
            self._message(text + "; " + "; ".join(self.errors), error=True)
        else:
            self._message(text)

    def _failed(self, exc: BaseException) -> None:
        self.loading = False
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

    # ----------------------------------------------------------------------------------------- lifetime

    def shutdown(self) -> None:
        """Stop playback and the background threads (waits for a read or decision in progress)."""
        self._retry.stop()
        self.episode.shutdown()
        self.worker.close()

    def closeEvent(self, event):
        self.shutdown()
        super().closeEvent(event)
