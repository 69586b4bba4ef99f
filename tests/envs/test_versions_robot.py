"""EpisodeStart.versions.robot says what was stepped: a simulator model with its asset hash, or the robot
the bridge server reports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.bridge import Robot

from hg_dagger.envs import make_env
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


def test_mujoco_robot_names_the_model_and_a_hash_that_follows_the_assets():
    a, b, push, mw = (make_env(t) for t in ("fetch_pick_place", "fetch_pick_place", "fetch_push", "mw_push"))
    try:
        assert a.robot == b.robot  # same assets, same string
        assert a.robot.startswith("MujocoFetchPickAndPlaceEnv model sha256:") and len(a.robot.split(":")[-1]) == 16
        assert push.robot != a.robot and push.robot.startswith("MujocoFetchPushEnv")
        assert "sha256:" in mw.robot and mw.robot != a.robot
    finally:
        for env in (a, b, push, mw):
            env.close()


def test_toy_robot_names_its_parameters():
    env = make_env("toy_reach")
    assert env.robot.startswith("toy 2-link arm links=") and "max_speed=" in env.robot


def test_recorded_episodes_carry_the_robot(tmp_path):
    store = tmp_path / "s.zarr"
    subprocess.run([sys.executable, "-m", "hg_dagger", "run", "--task", "toy_reach", "--operator", "synthetic",
                    "--episodes", "1", "--store", str(store), "--quiet"], check=True, capture_output=True, timeout=240)
    (info,) = EpisodeStore.open(store).episodes()
    assert info.start.versions.robot == make_env("toy_reach").robot


def test_bridge_robot_is_what_the_server_reports(tmp_path):
    robot = Robot(tmp_path, "fetch_reach")
    try:
        client = robot.client(task_id="fetch_reach")
        try:
            served = make_env("fetch_reach")
            assert client.robot.endswith(": " + served.robot)
            assert f":{robot.port} instance " in client.robot
            served.close()
        finally:
            client.close()
    finally:
        robot.stop()
