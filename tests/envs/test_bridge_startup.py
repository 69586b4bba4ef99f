"""A client whose start-up keeps it silent right after connecting does not lose its session: on a
real `hg-dagger bridge serve` with the default 0.5 s heartbeat timeout, under CPU load, 10 starts in a
row whose caller is busy for over 0.5 s after connecting (sleeping, or holding Python's GIL as
importing torch does, which stops every Python thread, the heartbeat thread included)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from support.bridge import Robot

from hg_dagger.envs.bridge import RobotState

pytestmark = [pytest.mark.subprocess]

STARTS = 10
BUSY_S = 0.8  # the caller's start-up after connecting, > the 0.5 s heartbeat timeout


def hold_the_gil(seconds: float) -> None:
    """One C-level loop that never lets another Python thread run (as a large extension's import does)."""
    per_item = float("inf")
    for _ in range(5):  # the fastest of a few: a measurement stretched by a busy machine would make the hold short
        t0 = time.perf_counter()
        sum(range(200_000))
        per_item = min(per_item, (time.perf_counter() - t0) / 200_000)
    sum(range(int(seconds / per_item)))


@pytest.fixture
def cpu_load():
    """Busy-loop processes on every core (at most 4), for the test's duration. Each runs under the normal
    time-sharing policy whatever the test process runs under: a busy loop that inherited a real-time policy
    would never give its core back."""
    hog = "import os\nos.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(min(os.cpu_count() or 1, 4))]
    yield
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


@pytest.mark.timeout(180)
def test_no_session_is_lost_to_a_slow_start_up_under_load(tmp_path, cpu_load):
    robot = Robot(tmp_path, heartbeat=0.5)
    losses = 0
    try:
        for start in range(STARTS):
            env = robot.client()  # the session opens here
            try:
                t0 = time.monotonic()
                if start % 2:
                    time.sleep(BUSY_S)
                else:
                    hold_the_gil(BUSY_S)
                busy = time.monotonic() - t0
                status = env.status()  # the first word after the start-up
                assert busy > 0.5
                # the same session: not dropped by the robot (a dropped one would have needed a reconnect)
                assert env.reconnects == 0 and status["sessions"] == start + 1, (start, status, robot.log())
                assert status["heartbeat_losses"] == losses and status["session"] is not None
                assert status["state"] == RobotState.HOLD  # it never ran, so it stayed still
                env.reset(seed=start)
                env.step(np.zeros((1, 2), np.float32))  # and it drives the robot
                losses = env.status()["heartbeat_losses"]
            finally:
                env.close()
    finally:
        robot.stop()
