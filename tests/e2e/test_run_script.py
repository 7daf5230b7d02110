"""scripts/run.sh as an operator runs it: one command starts the embedded Kafka, the broker with
its sink and dashboard, and the history job, all from the same arguments; messages published
reach the table; Ctrl-C stops everything. A normal start, run and stop print no warning, error
or stack trace."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from sink.history import commits
from tests.conftest import ROOT, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(600)]
MESSAGES = 5
NOISE = re.compile(r"WARN|ERROR|Exception|Traceback")


def run_sh_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQTT_BROKER_")}
    from broker import native
    if native.state(native.NATIVE, str(ROOT)) != "compiled":
        # run.sh's setup would compile the core first (1-2 min): the pure-Python one runs the same
        env["MQTT_PURE_PYTHON"] = "1"
    return env


def wait_for(what, timeout: float, proc: subprocess.Popen, log: Path, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        assert proc.poll() is None, f"run.sh exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out:\n{log.read_text()[-4000:]}"
        time.sleep(interval)


def stop_everything(proc: subprocess.Popen, data: Path, table: str) -> None:
    """After a failure: Ctrl-C, then SIGKILL for run.sh and the parts it started (each in a
    process group of its own: the broker's pid is in its lock file, the job's in its status
    file)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(120)
            return
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    import json
    pids = []
    for path, read in ((data / "broker.lock", lambda t: int(t.split()[0])),
                       (Path(commits.job_file(str(data), table)), lambda t: json.loads(t)["pid"])):
        try:
            pids.append(read(path.read_text()))
        except (OSError, ValueError, IndexError, KeyError):
            pass
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def publish(port: int, n: int) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="run-sh-test", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        for i in range(n):
            c.publish(f"site/dev{i}/temp", f"{20 + i}".encode(), qos=1).wait_for_publish(10)
    finally:
        c.loop_stop()
        c.disconnect()


def test_run_sh_gives_every_part_its_arguments_and_a_ctrl_c_run_prints_no_warning(tmp_path):
    """`run.sh --data-dir D --set history.table=T ...` reaches the job: the records the broker
    signed with D's key are in T (a job on ./data dropped them all as signed with another
    broker's key), and the job's status file in D is the one of T. Then Ctrl-C (SIGINT to
    run.sh's process group) stops every part once, cleanly, and nothing in the whole output is a
    warning, an error or a stack trace."""
    data = tmp_path / "data"
    table = str(tmp_path / "history")
    mqtt_port = free_port()
    env = {**run_sh_env(), "DASHBOARD_PORT": str(free_port())}
    connect_port = free_port()
    query_args = ["--data-dir", str(data), "--connect", f"sc://127.0.0.1:{connect_port}",
                  "--wait", "0"]
    log = tmp_path / "run.log"
    cmd = ["bash", "scripts/run.sh", "--data-dir", str(data), "--port", str(mqtt_port),
           "--set", f"sink.embedded_port={free_port()}",
           "--set", f"history.connect_port={connect_port}",
           "--set", f"history.table={table}",
           "--set", "history.trigger_seconds=1",
           # a machine shared with other work: the job's CPU counts too, and its Spark may take
           # minutes to start, which the broker would rightly warn about after 120 s
           "--set", "history.nice=0", "--set", "sink.history_stale_seconds=600"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: "run.sh: MQTT listens" in log.read_text(errors="replace"), 120, proc, log)
        publish(mqtt_port, MESSAGES)
        from settings import secrets
        committed = commits.committed_path(table)

        def in_table() -> bool:
            key = secrets.sink_key(str(data))
            state = commits.read_committed(committed, secrets.derive(key, secrets.COMMITTED)
                                            if key else None)
            return bool(state and state["signature"] == "ok" and
                        sum(sum(t["offsets"].values()) for t in state["topics"].values()) >= MESSAGES)
        # a generous bound for a busy machine: Spark alone takes 10-30 s to start
        wait_for(in_table, 240, proc, log, 1.0)
        # queried as an operator does, through the job's Spark Connect server (the dashboard's
        # history charts too): none dropped as signed with another broker's key
        q = subprocess.run([sys.executable, "-m", "sink.query", *query_args, "--format", "csv",
                            "SELECT count(*) FROM messages"], cwd=ROOT, env=env, timeout=180,
                           capture_output=True, text=True)
        assert q.returncode == 0 and q.stdout.split() == ["count(1)", str(MESSAGES)], q
        status = Path(commits.job_file(str(data), table))
        assert status.name.startswith("history_job.history-") and status.exists()
        os.killpg(proc.pid, signal.SIGINT)   # Ctrl-C: the terminal signals run.sh's group
        proc.wait(120)
    finally:
        stop_everything(proc, data, table)
    text = log.read_text(errors="replace")
    assert "history job stopped" in text and "INFO broker: stopped" in text, text[-4000:]
    assert not re.search(r"SIG[A-Z]+ again", text), text[-4000:]   # one signal per part
    noisy = [line for line in text.splitlines() if NOISE.search(line)]
    assert not noisy, "\n".join(noisy)
