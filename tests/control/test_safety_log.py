"""The safety log: a session that e-stops leaves its lines in STORE/safety.log (read after the terminal is gone), safety
clamps come as a summary rather than a line each, the file rotates, and `bridge serve` writes its holds and lost
sessions to its own log file."""

from __future__ import annotations

import time

import pytest
from support.bridge import Robot

from hg_dagger import safety_log
from hg_dagger.contract.enums import EventKind
from hg_dagger.control.build import open_session
from hg_dagger.control.run_config import load_run_config


def test_a_session_that_estops_leaves_lines_beside_its_store(tmp_path):
    store = tmp_path / "store"
    cfg = load_run_config(None, "toy_reach", num_envs=1, calibrate_steps=0)
    s = open_session(cfg, str(store))
    try:
        s.start(2)
        for _ in range(5):
            s.tick()
        s.estop("app", "stop button pressed")
        s.tick()
        assert s.summary.stopped_by == "estop"
        s.clear_estop("alice")  # the e-stop ended the episode: the log is the reset's only record
    finally:
        safety_log.detach_session()
        s.rec.close()
        s.env.close()
    text = (store / safety_log.FILE_NAME).read_text()
    estop = [ln for ln in text.splitlines() if " ESTOP row 0 episode " in ln]
    assert estop and "stop button pressed" in estop[0] and "(source app)" in estop[0] and "WARNING" in estop[0]
    assert f"recording into {store}" in text.splitlines()[0]
    assert any("NOTE no episode open: estop cleared by alice" in ln for ln in text.splitlines())
    # after detaching, another session's events do not reach this file
    safety_log.event(EventKind.ESTOP, 0, 1, "elsewhere", "app", None, "ep")
    assert "elsewhere" not in (store / safety_log.FILE_NAME).read_text()


def test_clamps_are_summarised_and_the_file_rotates(tmp_path, monkeypatch):
    monkeypatch.setattr(safety_log, "MAX_BYTES", 4000)
    safety_log.attach_session(str(tmp_path))
    try:
        for i in range(500):
            safety_log.event(EventKind.SAFETY_CLAMP, i % 2, i, "shoulder_vel", "safety", None, "ep")
        safety_log.event(EventKind.HEARTBEAT_LOSS, 0, 500, "robot holds: heartbeat lost", "bridge", None, "ep")
    finally:
        safety_log.detach_session()
    lines = (tmp_path / "safety.log").read_text().splitlines()
    clamp_lines = [ln for ln in lines if "SAFETY_CLAMP" in ln]
    assert len(clamp_lines) == 2  # the first at once, then one summary (written before the next event)
    assert "499 clamps" in clamp_lines[1] and "row 0: 249, row 1: 250" in clamp_lines[1]
    assert "shoulder_vel x499" in clamp_lines[1]
    assert "HEARTBEAT_LOSS" in lines[-1]
    for i in range(60):  # past 4000 bytes: rotated to safety.log.1
        safety_log.attach_session(str(tmp_path))
        safety_log.event(EventKind.ESTOP, 0, i, "x" * 80, "app", None, "ep")
        safety_log.detach_session()
    assert (tmp_path / "safety.log.1").is_file()
    assert (tmp_path / "safety.log").stat().st_size <= 4000


@pytest.mark.subprocess
def test_bridge_log_file_has_the_hold_after_a_lost_session(tmp_path):
    log_file = tmp_path / "logs" / "bridge.log"
    r = Robot(tmp_path, "toy_reach", "--log-file", str(log_file), heartbeat=0.3)
    try:
        env = r.client(heartbeat=False)
        env.reset(seed=0)  # the robot runs
        assert r.wait_log("heartbeat lost", timeout=10)
        env.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "safe stop: holding position" not in log_file.read_text():
            time.sleep(0.05)
        text = log_file.read_text()
        assert "heartbeat lost from 127.0.0.1:" in text and "safe stop: holding position (heartbeat lost" in text
        assert "backend commanded to hold position" in text
    finally:
        r.stop()
    assert not (tmp_path / "hg-dagger-bridge.log").exists()  # --log-file replaces the default
