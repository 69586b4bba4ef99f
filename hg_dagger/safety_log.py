"""The safety log: e-stops, holds, resumes, refused steps, lost sessions and a summary of safety clamps, written to
a rotated file beside the store (a session) or the bridge (``bridge serve --log-file``), so an incident can be read
after the terminal is gone.

A session writes its safety events to the logger ``hg_dagger.safety`` (``event``); they do not propagate to the
terminal, where the operator already sees them. ``bridge serve`` sends its whole log (every refusal, session and
state change of the robot) to its file as well. One module, stdlib only, so every layer may use it.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

LOGGER = "hg_dagger.safety"
FILE_NAME = "safety.log"  # in the store's folder
MAX_BYTES = 1 << 20  # 1 MiB per file, 5 old files kept: ~6 MiB; at ~150 bytes a line, ~40,000 events
BACKUP_COUNT = 5
CLAMP_SUMMARY_S = 10.0  # safety clamps: the first is written at once, the rest as one summary line per 10 s
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
DATEFMT = "%Y-%m-%dT%H:%M:%S"

log = logging.getLogger(LOGGER)
log.propagate = False
log.addHandler(logging.NullHandler())  # nothing attached: silent (not Python's last-resort stderr handler)

_lock = threading.Lock()
_session_handler: logging.Handler | None = None


class _Clamps:
    """Safety clamps come every step while an action leans on a limit: counted, written once per period."""

    def __init__(self) -> None:
        self.rows: Counter[int] = Counter()
        self.names: Counter[str] = Counter()
        self.t_written = float("-inf")
        self.t_first = 0.0

    def add(self, row: int, names: str, where: str) -> None:
        now = time.monotonic()
        if not self.rows and now - self.t_written >= CLAMP_SUMMARY_S:
            self.t_written = now
            log.warning("SAFETY_CLAMP %s: %s (further clamps: one summary line per %g s)", where, names or "clamped",
                        CLAMP_SUMMARY_S)
            return
        if not self.rows:
            self.t_first = now
        self.rows[row] += 1
        for name in (names or "clamped").split(","):
            self.names[name.strip()] += 1
        if now - self.t_written >= CLAMP_SUMMARY_S:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        now = time.monotonic()
        total = sum(self.rows.values())
        rows = ", ".join(f"row {r}: {n}" for r, n in sorted(self.rows.items()))
        names = ", ".join(f"{k} x{n}" for k, n in self.names.most_common())
        log.warning("SAFETY_CLAMP summary: %d clamps in %.1f s (%s; %s)", total, now - self.t_first, rows, names)
        self.rows.clear()
        self.names.clear()
        self.t_written = now


_clamps = _Clamps()

# the session's event kinds (contract.enums.EventKind values) that go to the safety log, and at which level
_LEVELS = {"estop": logging.WARNING, "heartbeat_loss": logging.WARNING, "device_disconnect": logging.WARNING,
           "device_connect": logging.INFO, "note": logging.INFO}


def _handler(path: Path) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    h = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUP_COUNT, encoding="utf-8",
                                             delay=True)
    h.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    h.setLevel(logging.INFO)
    return h


def attach(path: str | os.PathLike[str], loggers: tuple[str, ...] = (LOGGER,)) -> logging.Handler:
    """Send ``loggers`` (INFO and up) to the rotated file ``path`` too (created on the first line)."""
    h = _handler(Path(path))
    for name in loggers:
        lg = logging.getLogger(name)
        lg.addHandler(h)
        if lg.getEffectiveLevel() > logging.INFO:  # -v (DEBUG) stays DEBUG
            lg.setLevel(logging.INFO)
    return h


def detach(handler: logging.Handler | None, loggers: tuple[str, ...] = (LOGGER,)) -> None:
    """Write the pending clamp summary and close the file."""
    global _session_handler
    if handler is None:
        return
    with _lock:
        _clamps.flush()
        for name in loggers:
            logging.getLogger(name).removeHandler(handler)
        if handler is _session_handler:
            _session_handler = None
    handler.close()


def store_log_path(store_url: str | os.PathLike[str]) -> Path | None:
    """``STORE/safety.log`` for a store on the local file system; None for a remote store (nothing to write)."""
    s = os.fspath(store_url)
    if s.startswith("file://"):
        s = s[len("file://"):]
    return None if "://" in s else Path(s) / FILE_NAME


def attach_session(store_url: str | os.PathLike[str]) -> logging.Handler | None:
    """The session's safety log beside its store. One per process: a new session's replaces the last one's."""
    global _session_handler
    path = store_log_path(store_url)
    if path is None:
        return None
    detach(_session_handler)
    with _lock:
        _session_handler = attach(path)
    log.info("safety log of a session recording into %s (pid %d)", store_url, os.getpid())
    return _session_handler


def event(kind: Any, row: int, step: int, reason: str, source: str, values: dict[str, Any] | None,
          episode: str | None) -> None:
    """One session event: e-stops, robot holds and refusals, lost devices and notes (resume, e-stop cleared, a lost
    policy) become a line each; safety clamps are summarised. Other kinds are not safety events."""
    if _session_handler is None:
        return
    name = getattr(kind, "value", kind)
    where = f"row {row} episode {episode or '-'} step {step}"
    with _lock:
        if name == "safety_clamp":
            _clamps.add(row, reason, where)
            return
        level = _LEVELS.get(name)
        if level is None:
            return
        _clamps.flush()  # clamps before this event come first
        extra = f" {values}" if values else ""
        log.log(level, "%s %s: %s (source %s)%s", name.upper(), where, reason or "-", source or "-", extra)


def note(text: str, source: str) -> None:
    """A safety action taken while no episode is open (an e-stop cleared, a robot resumed between episodes): the
    session has no episode to record it in, so the log is its only record beside the run summary."""
    if _session_handler is None:
        return
    with _lock:
        _clamps.flush()
        log.warning("NOTE no episode open: %s (source %s)", text, source or "-")


@atexit.register
def _flush_at_exit() -> None:
    with _lock:
        _clamps.flush()


def detach_session() -> None:
    """Close the session's safety log (its pending clamp summary written)."""
    detach(_session_handler)
