"""openpi's own client package (openpi-client, which pins numpy < 2, in an environment of its own: `make
test-interop` builds .venv-openpi) talks to `hg-dagger policy serve`: it reads the server's metadata, sends an
observation under our export's names, and gets the built-in student's action chunk back, the same action the
student computes in-process for that observation."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = os.environ.get("HG_DAGGER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
OPENPI_PYTHON = os.environ.get("OPENPI_PYTHON", str(ROOT / ".venv-openpi" / "bin" / "python"))
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}

pytestmark = pytest.mark.subprocess  # the server and the client run in processes of their own environments

STUDENT = """
import sys
from hg_dagger.envs import load_mapping
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import save_checkpoint
save_checkpoint(sys.argv[1], Student.create(load_mapping("toy_reach"), seed=3))
"""

CLIENT = """
import json, sys
import numpy as np
from openpi_client import websocket_client_policy
host, port, obs_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = websocket_client_policy.WebsocketClientPolicy(host=host, port=port)
meta = client.get_server_metadata()
obs = {k: np.asarray(v, np.float32) for k, v in json.load(open(obs_file)).items()}
reply = client.infer(obs)
print(json.dumps({"numpy": np.__version__, "metadata": meta, "actions": np.asarray(reply["actions"]).tolist()}))
"""

EXPECTED = """
import json, sys
import numpy as np
from hg_dagger.envs import load_mapping
from hg_dagger.policy.checkpoint import load_student
from hg_dagger.policy.features import from_wire
mapping = load_mapping("toy_reach")
student = load_student(sys.argv[1], mapping)
obs, _ = from_wire({k: np.asarray(v, np.float32) for k, v in json.load(open(sys.argv[2])).items()}, mapping)
print(json.dumps(student.act(obs).action[0].tolist()))
"""


def _serve(checkpoint: Path) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([PROJECT_PYTHON, "-m", "hg_dagger", "policy", "serve", str(checkpoint), "--task",
                             "toy_reach", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("listening on "):
                address = line.split("listening on ", 1)[1].strip().removeprefix("ws://")
                host, port = address.rsplit(":", 1)
                return proc, host, int(port)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the policy server did not start: {proc.stderr.read()[-2000:]}")


def test_openpi_client_package_reads_metadata_and_gets_the_students_chunk(tmp_path):
    if not Path(OPENPI_PYTHON).exists():
        pytest.fail(f"{OPENPI_PYTHON} is missing: `make test-interop` builds it (openpi-client with numpy < 2)")
    checkpoint = tmp_path / "student.pt"
    subprocess.run([PROJECT_PYTHON, "-c", STUDENT, str(checkpoint)], check=True, cwd=ROOT, env=ENV, timeout=300)
    rng = np.random.default_rng(0)
    obs = {"observation.state": rng.uniform(-1, 1, 6).tolist()}  # toy_reach: qpos, ee_pos, target
    obs_file = tmp_path / "obs.json"
    obs_file.write_text(json.dumps(obs))
    proc, host, port = _serve(checkpoint)
    try:
        got = subprocess.run([OPENPI_PYTHON, "-c", CLIENT, host, str(port), str(obs_file)], capture_output=True,
                             text=True, timeout=120)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    reply = json.loads(got.stdout.strip().splitlines()[-1])
    assert reply["numpy"].startswith("1."), "the client ran with its own numpy < 2"
    assert reply["metadata"]["policy_version"], reply["metadata"]
    actions = np.asarray(reply["actions"], np.float32)
    assert actions.shape == (1, 2)  # the MLP student's chunk of one action, toy_reach's two joint velocities
    here = subprocess.run([PROJECT_PYTHON, "-c", EXPECTED, str(checkpoint), str(obs_file)], capture_output=True,
                          text=True, check=True, cwd=ROOT, env=ENV, timeout=300)
    np.testing.assert_allclose(actions[0], json.loads(here.stdout.strip().splitlines()[-1]), atol=1e-5)
