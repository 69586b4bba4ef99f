"""Loop health for a live front end: sliding-window rate, jitter, busy time and latency of the control thread,
and the absolute-schedule sleep (control.loop)."""

from __future__ import annotations

import gc
import sys
import time
from collections import deque

import numpy as np

from hg_dagger.control import live
from hg_dagger.store.shards import one_zarr_worker

WINDOW = 256  # ticks in the health window


def control_process_settings() -> None:
    """For a process that is a control loop, before it builds its session: the control thread gets the interpreter
    back quickly from the writer threads (a short switch interval), and zarr's I/O pool has one thread to compete
    with it for the cores. Together with steady_collector they halved the slowest 64-env ticks
    (docs/benchmarks.md)."""
    sys.setswitchinterval(0.0005)
    one_zarr_worker()


def steady_collector() -> None:
    """For a process that is a control loop, once what lives as long as it (the env, the student, the store) is
    built: the garbage collector stops rescanning those objects (gc.freeze) and runs its young generation less
    often. A collection of the whole heap stalled a 64-env tick by tens of milliseconds (docs/benchmarks.md).
    Never in a process that is not a control loop: frozen objects whose cycles die later are not collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


class HealthWindow:
    """Sliding-window loop figures; updated in the control thread only."""

    def __init__(self, target_hz: float):
        self.target_hz = target_hz
        self.starts: deque[int] = deque(maxlen=WINDOW)
        self.jitter: deque[float] = deque(maxlen=WINDOW)
        self.busy: deque[float] = deque(maxlen=WINDOW)
        self.latency: deque[float] = deque(maxlen=WINDOW)
        self.missed = 0
        self.ticks = 0

    def tick(self, start_ns: int, scheduled_ns: int, busy_ns: int) -> None:
        self.starts.append(start_ns)
        self.jitter.append(abs(start_ns - scheduled_ns) / 1e6)
        self.busy.append(busy_ns / 1e6)
        self.ticks += 1

    def snapshot(self, rec_queue: int, rec_dropped: int) -> live.LoopHealth:
        hz = 0.0
        if len(self.starts) >= 2:
            span = (self.starts[-1] - self.starts[0]) / 1e9
            hz = (len(self.starts) - 1) / span if span > 0 else 0.0
        lat = np.asarray(self.latency, np.float64)
        recent = list(self.jitter)[-max(2, int(self.target_hz)):]
        return live.LoopHealth(
            target_hz=self.target_hz, achieved_hz=hz,
            jitter_p99_ms=float(np.percentile(self.jitter, 99)) if self.jitter else 0.0,
            jitter_recent_max_ms=max(recent) if recent else 0.0,
            missed_ticks=self.missed,
            latency_p50_ms=float(np.percentile(lat, 50)) if lat.size else float("nan"),
            latency_p99_ms=float(np.percentile(lat, 99)) if lat.size else float("nan"),
            tick_ms_p99=float(np.percentile(self.busy, 99)) if self.busy else 0.0,
            recorder_queue=rec_queue, recorder_dropped=rec_dropped, ticks=self.ticks)


def sleep_until(t_ns: int) -> None:
    """Sleep to ``t_ns`` (monotonic): coarse sleep, then a short spin for the last half millisecond."""
    while True:
        left = t_ns - time.monotonic_ns()
        if left <= 0:
            return
        if left > 1_500_000:
            time.sleep((left - 1_000_000) / 1e9)
        elif left > 200_000:
            time.sleep(0.0001)
