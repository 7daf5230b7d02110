"""Shared fixtures: a broker started as a real process on a free port."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, never one this process was given before: two calls in a row
    (a broker's MQTT, metrics and dashboard ports) could otherwise get the same port back once
    the first probe socket is closed."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port left that this test run has not used")


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker did not listen on port {port} within {timeout}s")


class BrokerProcess:
    """`python -m broker` on 127.0.0.1:<free port>, with optional --set overrides."""

    def __init__(self, tmp: Path, settings: dict | None = None, args: list | None = None,
                 log_level: str = "DEBUG"):
        self.port = free_port()
        self.host = "127.0.0.1"
        self.data_dir = tmp
        self.log_path = tmp / f"broker-{self.port}.log"
        cmd = [sys.executable, "-m", "broker", "--host", self.host, "--port", str(self.port),
               "--data-dir", str(tmp), "--log-level", log_level]
        for k, v in (settings or {}).items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            cmd += ["--set", f"{k}={v}"]
        cmd += args or []
        self.cmd = cmd
        self.proc = None

    def start(self) -> "BrokerProcess":
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_port(self.port, self.proc)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            self.proc = None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One broker shared by the tests that need only default settings."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    yield b
    assert b.alive(), "the shared broker died during the tests:\n" + b.logs()[-3000:]
    b.stop()


@pytest.fixture
def make_broker(tmp_path):
    """Start a broker with custom settings: make_broker({'mqtt.maximum_qos': 1})."""
    started = []

    def make(settings=None, args=None):
        b = BrokerProcess(tmp_path, settings, args).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()
