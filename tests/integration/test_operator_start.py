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


def run_sh(args, tmp_path, env=None, timeout=90):
    """scripts/run.sh with args on free ports and a data directory of its own; killed (with
    everything it started) when it is still running after timeout seconds."""
    import signal

    from broker import native
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MQTT_BROKER_")},
           **(env or {}), "DASHBOARD_PORT": str(free_port())}
    if native.state(native.NATIVE, str(ROOT)) != "compiled":
        env["MQTT_PURE_PYTHON"] = "1"   # run.sh's setup would compile the core first (1-2 min)
    cmd = ["bash", "scripts/run.sh", "--data-dir", str(tmp_path / "data"),
           "--port", str(free_port()), "--set", f"sink.embedded_port={free_port()}",
           "--set", f"history.connect_port={free_port()}", *args]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
        raise AssertionError(f"run.sh {' '.join(args)} started instead of refusing:\n{err[-3000:]}") from None
    return p.returncode, out, err


def test_run_sh_gives_a_job_setting_to_the_job(tmp_path):
    """`run.sh --set history.jdbc=true` was accepted by the broker alone and nothing listened
    for JDBC: the job gets it now, and its own check (JDBC needs operators' accounts) stops
    the run before anything starts."""
    code, _, err = run_sh(["--set", "history.jdbc=true"], tmp_path)
    assert code == 2 and "jdbc_password_file" in err and "Traceback" not in err, err
    assert not (tmp_path / "data" / "broker.lock").exists()   # no broker started


def test_run_sh_refuses_a_setting_no_part_reads_naming_the_part(tmp_path):
    code, _, err = run_sh(["--set", "dashboard.port=18099"], tmp_path, env={"DASHBOARD": "0"})
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        "config error: dashboard.port = 18099 (--set): not used: it is read by the dashboard"), err
