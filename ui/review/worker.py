"""One background thread for everything that reads or writes a store, so the GUI never waits on disk.

Jobs run one at a time, in order, on a single thread that also owns the open EpisodeStores (a store is
only ever touched by that thread); each job's result or error comes back to its callback on the GUI thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from PyQt6.QtCore import QObject, pyqtSignal

from hg_dagger.review.decisions import open_store
from hg_dagger.store import EpisodeStore


class StoreWorker(QObject):
    """``submit(fn, on_done, on_error)``: ``fn(worker)`` runs in the background; callbacks run on the GUI thread."""

    _finished = pyqtSignal(object, object, object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="review-store")
        self._stores: dict[str, EpisodeStore] = {}
        self._finished.connect(self._deliver)
        self.pending = 0

    def store(self, url: str) -> EpisodeStore:
        """The worker's open (read) store for a path; call only from a job."""
        key = os.fspath(url)
        st = self._stores.get(key)
        if st is None:
            st = self._stores[key] = open_store(key)
        return st

    def submit(self, fn: Callable[[StoreWorker], Any], on_done: Callable[[Any], None],
               on_error: Callable[[BaseException], None]) -> Future:
        self.pending += 1

        def job():
            try:
                result, exc = fn(self), None
            except Exception as e:  # delivered to on_error and shown, never a traceback
                result, exc = None, e
            self._finished.emit((on_done, on_error), result, exc)

        return self._pool.submit(job)

    def _deliver(self, callbacks, result, exc) -> None:
        self.pending -= 1
        on_done, on_error = callbacks
        if exc is not None:
            on_error(exc)
        else:
            on_done(result)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
