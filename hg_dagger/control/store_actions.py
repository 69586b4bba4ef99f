"""What the console asks of the store while a session records: discard an episode, undo that, flag a correction.

Each is a label layer (never an edit of the episode), written in a thread of its own so the control
thread never waits on the disk. An episode's commit lands a moment after it ends (the recorder's
flush interval), and a flagged correction's episode may still run: a job waits for its episode's
commit (up to ``wait_s``; jobs wait side by side, in the order given) before it writes.

- ``discard(eid)``: a layer by ``operator:<name>`` whose mask keeps no step trainable (a stricter mask
  is always allowed; QC and review decisions carry it over). The episode stays on disk, out of training.
- ``undo(eid)``: a layer restoring the mask the episode had before the discard.
- ``flag(window_id)``: the operator's own REJECTED decision on their correction window (final: the
  training boundary stops a window its operator rejected, contract.labels.operator_rejected).

Results come back as one line each (``take_messages``), for Snapshot.message.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from hg_dagger.contract.enums import LabelMask
from hg_dagger.errors import HgDaggerError
from hg_dagger.review.decisions import flag_by_operator
from hg_dagger.store import EpisodeStore

log = logging.getLogger(__name__)

_TRAINABLE = LabelMask.TRAINABLE.code
_CONTEXT = LabelMask.CONTEXT_ONLY.code
_POLL_S = 0.1


@dataclass
class _Job:
    kind: str  # discard | undo | flag
    key: str  # episode id (discard, undo) or window id (flag)
    reason: str = ""
    episode_id: str = ""  # the episode whose commit the job waits for ("" for a flag whose episode is unknown)
    deadline: float = 0.0


class StoreActions:
    def __init__(self, store_url: str, operator: str, *, wait_s: float = 600.0):
        self.url = str(store_url)
        self.operator = operator or "operator"
        self.wait_s = wait_s
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._messages: deque[str] = deque()
        self._before: dict[str, tuple[np.ndarray, str]] = {}  # episode id -> its mask and note before the discard
        self._pending = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ---- any thread ----------------------------------------------------------------------

    def discard(self, episode_id: str, reason: str) -> None:
        self._put(_Job("discard", episode_id, reason, episode_id))

    def undo(self, episode_id: str) -> None:
        self._put(_Job("undo", episode_id, "", episode_id))

    def flag(self, window_id: str, reason: str, episode_id: str = "") -> None:
        self._put(_Job("flag", window_id, reason, episode_id))

    def take_messages(self) -> list[str]:
        out = []
        while self._messages:
            out.append(self._messages.popleft())
        return out

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def close(self, timeout: float = 30.0) -> None:
        """Finish the jobs still queued (their episodes are committed once the recorder closed), then stop."""
        if self._thread is None:
            return
        self._q.put(None)
        self._thread.join(timeout)

    # ---- the worker ----------------------------------------------------------------------

    def _put(self, job: _Job) -> None:
        job.deadline = time.monotonic() + self.wait_s
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hg-dagger-store-actions", daemon=True)
                self._thread.start()
        self._q.put(job)

    def _run(self) -> None:
        store = None
        waiting: list[_Job] = []
        closing = False
        while True:
            try:
                job = self._q.get(timeout=_POLL_S) if not closing else self._q.get_nowait()
                if job is None:
                    closing = True
                else:
                    waiting.append(job)
                continue
            except queue.Empty:
                pass
            if not waiting:
                if closing:
                    return
                continue
            try:
                if store is None:
                    store = EpisodeStore.open(self.url, mode="a")
                store.refresh()
            except Exception as exc:  # noqa: BLE001 - the store cannot be read yet: try again next time
                if closing:
                    for job in waiting:
                        self._done(job, f"{job.kind} {job.key[:12]} not recorded: {type(exc).__name__}: {exc}")
                    return
                continue
            later: list[_Job] = []
            for job in waiting:  # in order: an undo never overtakes its discard
                ready = not job.episode_id or self._committed(store, job.episode_id)
                if not ready and not closing and time.monotonic() < job.deadline and not _blocked(job, later):
                    later.append(job)
                    continue
                if not ready and (closing or time.monotonic() >= job.deadline):
                    self._done(job, f"episode {job.episode_id}: not committed in {self.url}; {job.kind} not recorded")
                    continue
                if _blocked(job, later):
                    later.append(job)
                    continue
                self._done(job, self._attempt(store, job))
            waiting = later
            if closing and not waiting:
                return

    def _attempt(self, store, job: _Job) -> str:
        try:
            return self._do(store, job)
        except HgDaggerError as exc:
            return f"{job.kind} {job.key[:12]}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a store fault is said, the session goes on
            log.exception("store action %s failed", job.kind)
            return f"{job.kind} {job.key[:12]} failed: {type(exc).__name__}: {exc}"

    def _done(self, job: _Job, line: str) -> None:
        self._say(line)
        with self._lock:
            self._pending -= 1

    def _say(self, line: str) -> None:
        log.info("%s", line)
        self._messages.append(line)

    @staticmethod
    def _committed(store, episode_id: str) -> bool:
        """Whether the episode's commit has landed (as of the store's last refresh)."""
        return store.has_episode(episode_id, refresh=False) and store.info(episode_id).complete

    def _do(self, store, job: _Job) -> str:
        if job.kind == "flag":
            return self._flag(store, job)
        eid = job.key
        latest = store.labels(eid)
        author = f"operator:{self.operator}"
        if job.kind == "discard":
            if eid in self._before:
                return f"episode {eid[:12]} is already discarded"
            self._before[eid] = (latest.mask.copy(), latest.note)
            mask = np.where(latest.mask == _TRAINABLE, _CONTEXT, latest.mask).astype(np.uint8)
            version = store.write_labels(eid, author=author, mask=mask, note=f"discarded by {self.operator}"
                                         + (f": {job.reason}" if job.reason else ""))
            return f"episode {eid[:12]} discarded ({job.reason}): kept on disk, never trained (labels v{version})"
        before = self._before.pop(eid, None)
        if before is None:
            return f"episode {eid[:12]}: no discard of it in this sitting to undo"
        version = store.write_labels(eid, author=author, mask=before[0], note=before[1])
        return f"episode {eid[:12]}: discard undone, trainable as before (labels v{version})"

    def _flag(self, store, job: _Job) -> str:
        flag_by_operator(store, job.key, self.operator, job.reason)
        return f"correction {job.key[:12]} flagged as bad by {self.operator}: it will never be trained on"


def _blocked(job: _Job, waiting: list[_Job]) -> bool:
    """A job waits while an earlier job for the same episode still waits (an undo after its discard)."""
    return any(j.episode_id == job.episode_id and j.episode_id for j in waiting)
