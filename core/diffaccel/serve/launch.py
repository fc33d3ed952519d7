"""Start ``diffaccel serve`` as a child process on a free local port and wait until it answers
(the load test and the tests use it; always 127.0.0.1)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

from ..contract.errors import DiffaccelError

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@attrs.define
class Server:
    process: subprocess.Popen
    url: str
    log_path: Path
    config: str

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait (SIGKILL after ``timeout``); the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(config: str | Path, *options: str, env: dict[str, str] | None = None, timeout: float = 600.0,
                 log: str | Path | None = None) -> Server:
    """``diffaccel serve CONFIG --port P OPTIONS...`` on 127.0.0.1; returns once ``/health`` answers
    200. Raises ``DiffaccelError`` with the log's tail if it exits or does not answer in ``timeout``
    (10 minutes: the warm-up's batch checks took over 3 on a shared CPU under a training run)."""
    import httpx

    port = free_port()
    log_path = Path(log) if log else Path(tempfile.mkstemp(prefix="diffaccel-serve-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "diffaccel.cli.entry", "serve", str(config), "--host", HOST, "--port", str(port), *options]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(proc, f"http://{HOST}:{port}", log_path, str(config))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DiffaccelError(f"diffaccel serve exited with code {proc.returncode} before answering: {server.log()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop(10)
    raise DiffaccelError(f"diffaccel serve did not answer within {timeout:.0f} s: {server.log()[-2000:]}")
