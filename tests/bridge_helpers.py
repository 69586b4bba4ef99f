"""A real `hg-dagger bridge serve` subprocess on an ephemeral loopback port, shared by the bridge and session tests."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from hg_dagger.envs.bridge import BridgeEnv

TOKEN = "s3cret-token-for-tests"


class Robot:
    """A `hg-dagger bridge serve` subprocess; its log (stderr) goes to a file we can read."""

    def __init__(self, tmp_path: Path, task: str = "toy_reach", *args: str, port: int = 0, num_envs: int = 1,
                 seed: int = 0, heartbeat: float = 0.5):
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN + "\n")
        n = len(list(tmp_path.glob("robot*.log")))
        self.log_path = tmp_path / f"robot{n}.log"
        cmd = [sys.executable, "-m", "hg_dagger", "bridge", "serve", task, "--port", str(port), "--token-file",
               str(self.token_file), "--num-envs", str(num_envs), "--seed", str(seed), "--heartbeat-timeout",
               str(heartbeat), *args]
        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, env=env, text=True)
        self._port: int | None = None

    @property
    def port(self) -> int:
        """Waits for the server's "listening on HOST:PORT" line (so callers can work while it starts)."""
        if self._port is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 60)
            line = self.proc.stdout.readline() if ready else ""
            if not line.startswith("listening on "):
                self.stop()
                raise RuntimeError(f"robot server did not start: {line!r}\n{self.log()}")
            self._port = int(line.strip().rsplit(":", 1)[1])
        return self._port

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            time.sleep(0.02)
        return False

    def client(self, **kw) -> BridgeEnv:
        kw.setdefault("token", TOKEN)
        return BridgeEnv(port=self.port, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._log.close()
