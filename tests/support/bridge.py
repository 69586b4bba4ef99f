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
    """A `hg-dagger bridge serve` subprocess; its log (stderr) goes to a file we can read.

    The heartbeat timeout defaults to 5 s: a client is never dropped by chance on a busy machine (a
    dropped session holds the robot until someone resumes it); tests of heartbeat loss set their own."""

    def __init__(self, tmp_path: Path, task: str = "toy_reach", *args: str, port: int = 0, num_envs: int = 1,
                 seed: int = 0, heartbeat: float = 5.0):
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


class LinkProxy:
    """A TCP relay between the app and the robot server: the network link, which a test can break.

    ``cut()`` closes every connection it carries (a cable pulled, a VPN dropped): both sides see the
    connection end. ``freeze()`` keeps them open but stops carrying bytes (a silent link): the robot
    hears nothing until its heartbeat timeout. New connections are carried normally either way, except
    while the link is ``down()`` (until ``up()``): then they are closed at once, so the robot is unreachable."""

    def __init__(self, port: int):
        import socket
        import threading

        self._socket, self._threading = socket, threading
        self.upstream = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._pairs: list[tuple] = []  # (client socket, server socket, frozen event)
        self._lock = threading.Lock()
        self._closed = False
        self._down = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down:
                client.close()
                continue
            try:
                server = self._socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
            except OSError:
                client.close()
                continue
            frozen = self._threading.Event()
            with self._lock:
                self._pairs.append((client, server, frozen))
            for a, b in ((client, server), (server, client)):
                self._threading.Thread(target=self._pump, args=(a, b, frozen), daemon=True).start()

    @staticmethod
    def _pump(src, dst, frozen) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or frozen.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        if not frozen.is_set():
            for s in (src, dst):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server, _ in pairs:
            for s in (client, server):
                try:
                    s.shutdown(2)
                except OSError:
                    pass
                s.close()

    def freeze(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for _, _, frozen in pairs:
            frozen.set()

    def down(self) -> None:
        self._down = True
        self.cut()

    def up(self) -> None:
        self._down = False

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()
