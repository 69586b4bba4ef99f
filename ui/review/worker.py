"""Background threads, so the GUI never waits on disk or on a simulator.

StoreWorker: everything that reads or writes a store. Jobs run one at a time, in order, on a single thread
that also owns the open EpisodeStores (a store is only ever touched by that thread); each job's result or
error comes back to its callback on the GUI thread. SceneRenderer: re-rendering state-only episodes, on a
thread of its own that opens its own read-only store handle, so a render never delays a decision.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from PyQt6.QtCore import QObject, pyqtSignal

from hg_dagger.errors import HgDaggerError
from hg_dagger.review.decisions import open_store
from hg_dagger.review.render import FRAME_SIZE, FrameCache, RenderCancelled, Scene, render_episode
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


class SceneRenderer(QObject):
    """Re-renders episodes recorded without a camera (``review.render.render_episode``) on a thread of its own,
    so neither the GUI nor the store thread waits on the simulator. One render at a time: asking for another
    episode cancels the one under way unless it is the one asked for. Scenes are kept in a FrameCache.

    Signals carry the (store, episode_id) key: ``progress(key, done, total)``, ``rendered(key, Scene)``,
    ``failed(key, one-line reason)``."""

    progress = pyqtSignal(object, int, int)
    rendered = pyqtSignal(object, object)
    failed = pyqtSignal(object, str)

    def __init__(self, parent=None, *, size: int = FRAME_SIZE, cache: FrameCache | None = None):
        super().__init__(parent)
        self.size = int(size)
        self.cache = cache if cache is not None else FrameCache()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="review-render")
        self._lock = threading.Lock()
        self._wanted: tuple[str, str] | None = None
        self._queued: set[tuple[str, str]] = set()
        self._closed = False

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._queued)

    def request(self, store: str, episode_id: str) -> Scene | None:
        """The episode's scene if it is cached; otherwise None, and its render begins (signals follow)."""
        key = (os.fspath(store), episode_id)
        scene = self.cache.get(key)
        with self._lock:
            self._wanted = key
            if scene is not None or key in self._queued or self._closed:
                return scene
            self._queued.add(key)
        self._pool.submit(self._render, key)
        return None

    def cancel(self) -> None:
        """Nobody waits for a scene now (an episode with its own camera frames is shown)."""
        with self._lock:
            self._wanted = None

    def _render(self, key: tuple[str, str]) -> None:
        def cancelled() -> bool:
            return self._closed or self._wanted != key

        step = 1

        def progress(done: int, total: int) -> None:
            nonlocal step
            step = max(1, total // 50)
            if done == 1 or done % step == 0 or done == total:
                self.progress.emit(key, done, total)

        stopped = False
        try:
            if cancelled():
                stopped = True
                return
            scene = render_episode(key[0], key[1], size=self.size, progress=progress, cancelled=cancelled)
            self.cache.put(key, scene)
            self.rendered.emit(key, scene)
        except RenderCancelled:
            stopped = True
        except HgDaggerError as exc:
            self.failed.emit(key, str(exc))
        except Exception as exc:  # shown under the frame, never a traceback
            self.failed.emit(key, f"no scene for episode {key[1]}: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._queued.discard(key)
                # asked for again after this run saw itself cancelled: run it once more
                again = stopped and self._wanted == key and not self._closed
                if again:
                    self._queued.add(key)
            if again:
                self._pool.submit(self._render, key)

    def close(self) -> None:
        """Stop the render under way and the thread."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
