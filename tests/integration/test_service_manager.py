"""Readiness for a service manager (systemd Type=notify, deploy/broker.service): sd_notify(3)'s
protocol, a datagram "READY=1" to the socket named by $NOTIFY_SOCKET once every listener
accepts connections, and "STOPPING=1" when a stop begins. A datagram socket here stands in for
systemd's."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid

import pytest

from tests.conftest import ROOT, BrokerProcess, free_port


def notify_socket(tmp_path, kind: str) -> tuple[socket.socket, str]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if kind == "abstract":  # systemd's own form: NOTIFY_SOCKET=@name
        name = f"mqtt-test-notify-{uuid.uuid4().hex}"
        s.bind("\0" + name)
        return s, "@" + name
    path = str(tmp_path / "notify.sock")
    s.bind(path)
    return s, path


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def broker_told(tmp_path, notify_socket_env: str, settings: dict | None = None):
    """A broker process started with NOTIFY_SOCKET set, killed at the end if still running."""
    broker = BrokerProcess(tmp_path, settings=settings)
    with open(broker.log_path, "ab") as log:
        proc = subprocess.Popen(broker.cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT),
                                     "NOTIFY_SOCKET": notify_socket_env})
        try:
            yield broker, proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_ready_is_sent_once_every_listener_accepts_and_stopping_at_sigterm(tmp_path, kind):
    sock, address = notify_socket(tmp_path, kind)
    metrics_port, dashboard_port = free_port(), free_port()
    settings = {"metrics.enabled": True, "metrics.port": metrics_port,
                "dashboard.enabled": True, "dashboard.port": dashboard_port}
    with sock, broker_told(tmp_path, address, settings) as (broker, proc):
        sock.settimeout(60)
        ready = sock.recv(4096)
        # no retry: at the moment READY=1 arrives, every port already listens
        listening = {p: accepts(p) for p in (broker.port, metrics_port, dashboard_port)}
        assert ready == b"READY=1", broker.log_path.read_text()
        assert listening == {broker.port: True, metrics_port: True, dashboard_port: True}
        proc.send_signal(signal.SIGTERM)
        assert sock.recv(4096) == b"STOPPING=1"
        assert proc.wait(30) == 0


def test_a_notify_socket_nobody_listens_on_is_a_warning_not_a_failure(tmp_path):
    """A stale NOTIFY_SOCKET (e.g. inherited from a shell) must not stop the broker."""
    gone = str(tmp_path / "nobody.sock")
    warning = f"cannot tell the service manager READY=1 at NOTIFY_SOCKET={gone}"
    with broker_told(tmp_path, gone) as (broker, proc):
        deadline = time.monotonic() + 60
        while warning not in broker.log_path.read_text() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert warning in broker.log_path.read_text()
        assert accepts(broker.port)  # serving all the same
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
