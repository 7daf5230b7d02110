"""What an operator meets when something else already uses what a broker needs: a taken MQTT
port names the process holding it, a second broker on the same data directory refuses to start,
and a broker's embedded Kafka never uses a Kafka port another process already listens on."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, BrokerProcess, free_port


def broker(args, tmp_path, timeout=60):
    return subprocess.run([sys.executable, "-m", "broker", "--host", "127.0.0.1", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def taken_port():
    """A port this test process listens on (as mosquitto's service, or another broker's
    embedded Kafka, would)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_mqtt_port_names_the_process_holding_it(tmp_path, taken_port):
    p = broker(["--port", str(taken_port), "--data-dir", str(tmp_path)], tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"cannot listen on 127.0.0.1:{taken_port}" in p.stderr
    assert f"held by pid {os.getpid()}" in p.stderr, p.stderr


def test_a_second_broker_on_the_same_data_directory_refuses_to_start(tmp_path):
    first = BrokerProcess(tmp_path).start()
    try:
        p = broker(["--port", str(free_port()), "--data-dir", str(tmp_path)], tmp_path)
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert f"another broker (pid {first.proc.pid}) uses the data directory" in p.stderr, p.stderr
        assert first.proc.poll() is None
    finally:
        first.stop()


@pytest.mark.kafka
def test_an_embedded_kafka_port_someone_listens_on_is_refused(tmp_path, taken_port):
    """Before, the readiness check connected to whoever owned the port and the second broker
    silently forwarded to the first one's Kafka."""
    p = broker(["--port", str(free_port()), "--data-dir", str(tmp_path), "--sink",
                "--set", f"sink.embedded_port={taken_port}"], tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"cannot start the embedded Kafka on 127.0.0.1:{taken_port}: the port is taken" in p.stderr
    assert f"held by pid {os.getpid()}" in p.stderr and "embedded_port" in p.stderr
