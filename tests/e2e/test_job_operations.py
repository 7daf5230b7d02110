"""Operating a real history job (`python -m sink.job`, its own Spark session serving Spark
Connect): what a local process can and cannot do with it, queries made while it starts, and
stopping it with Ctrl-C and a supervisor's SIGTERM.

One job for the module (Spark takes 10-30 s to start); the stop test runs last."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_client.embedded import EmbeddedKafka
from kafka_client.record import SinkRecord, to_kafka
from settings import secrets
from sink.forward.service import Sink
from sink.history import commits
from tests.conftest import ROOT, free_port
from tests.e2e.test_dashboard_history import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(900)]
GENUINE = 30


class Job:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.data = tmp / "data"
        self.table = str(tmp / "history")
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.kafka = EmbeddedKafka(log_file=str(tmp / "tansu.log")).start()
        self.proc = None

    def feed(self) -> None:
        """GENUINE records through the broker's sink (signed), and a forged one produced
        straight to Kafka by "another local process" claiming to be client dev-0."""
        s = Sink.from_config({"bootstrap_servers": self.kafka.bootstrap, "forwarder": "thread"},
                             str(self.data))
        s.start()
        for i in range(GENUINE):
            assert s.submit(SinkRecord(topic=f"sensors/dev-{i % 3}/temp", payload=b"%d" % i, qos=1,
                                       retain=False, client_id=f"dev-{i % 3}", username=None,
                                       protocol=5, accepted_at_ms=int(time.time() * 1000)))
        wait_for(lambda: s.stats()["forwarded"] >= GENUINE, 30, "records forwarded", 0.2)
        s.close()
        from kafka import KafkaProducer
        key, value, headers, ts = to_kafka(SinkRecord(
            topic="sensors/dev-0/temp", payload=b"FORGED", qos=1, retain=False, client_id="dev-0",
            username="admin", protocol=5, accepted_at_ms=int(time.time() * 1000), message_id="forged-1"))
        p = KafkaProducer(bootstrap_servers=self.kafka.bootstrap)
        p.send("mqtt.messages", key=key, value=value, headers=headers, timestamp_ms=ts).get(10)
        p.close()

    def start(self) -> "Job":
        self.log = open(self.tmp / "job.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sink.job", "--kafka-bootstrap", self.kafka.bootstrap,
             "--table", self.table, "--trigger-seconds", "1", "--connect-port", str(self.port),
             "--data-dir", str(self.data)],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        return self

    def logs(self) -> str:
        return (self.tmp / "job.log").read_text(errors="replace")

    def query(self, sql: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "sink.query", "-v", "--data-dir", str(self.data), "--connect",
             self.url, "--format", "json", *args, sql],
            cwd=self.tmp, capture_output=True, text=True, timeout=500,
            env={**os.environ, "PYTHONPATH": str(ROOT)})

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.kafka.stop()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    j = Job(tmp_path_factory.mktemp("job"))
    try:
        j.feed()
        j.start()
        yield j
    finally:
        j.stop()


def rows(p: subprocess.CompletedProcess) -> list[dict]:
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def test_a_query_made_while_the_job_starts_waits_for_it(job):
    """Right after the job was started (its Spark needs 10-30 s): sink.query waits for its
    Spark Connect server with a progress line, and answers from it, not from a second Spark."""
    announced = Path(commits.job_file(str(job.data), job.table))  # at once, before its Spark
    wait_for(lambda: announced.exists() and json.loads(announced.read_text())["pid"] == job.proc.pid,
             60, "the job to announce itself", 0.1)
    p = job.query("SELECT count(*) AS n FROM messages", "--wait", "400")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "waiting for the history job (pid" in p.stderr
    assert "using the history job's Spark Connect server" in p.stderr
    assert "local Spark session" not in p.stderr


def test_forged_records_do_not_become_rows(job):
    """The record produced straight to Kafka with forged mqtt.client_id/mqtt.username headers
    carries no broker signature: the job drops it, and says so."""
    got = wait_for(lambda: (lambda r: r if r[0]["n"] >= GENUINE else None)(
        rows(job.query("SELECT count(*) AS n FROM messages"))), 120, "the genuine records")
    assert got[0]["n"] == GENUINE
    assert rows(job.query("SELECT count(*) AS n FROM messages WHERE message_id = 'forged-1' "
                          "OR payload_text = 'FORGED' OR username = 'admin'"))[0]["n"] == 0
    assert "without a signature" in job.logs()


def test_json_payloads_are_queryable_as_payload_json_through_spark_connect(job):
    """The genuine payloads are JSON numbers: payload_json holds them, a query on it runs in the
    job's Spark Connect server, and sink.query prints the variant as JSON."""
    wait_for(lambda: rows(job.query("SELECT count(*) AS n FROM messages", "--wait", "400")
                          )[0]["n"] >= GENUINE, 500, "the genuine records")
    p = job.query("SELECT sum(payload_json::int) AS s, count(payload_json) AS j FROM messages")
    assert "using the history job's Spark Connect server" in p.stderr
    assert rows(p) == [{"s": GENUINE * (GENUINE - 1) // 2, "j": GENUINE}]
    assert rows(job.query("SELECT payload_json FROM messages WHERE payload_text = '7'")) == \
        [{"payload_json": 7}]


def test_the_running_job_keeps_no_python_planning_daemons(job):
    """Once its query is planned and has reported progress, the job stops the Python daemons Spark
    keeps for planning a Python data source (46 MB each), and goes on ingesting."""
    wait_for(lambda: "stopped 3 idle Python planning daemons" in job.logs(), 120,
             "the job to stop the planning daemons", 0.5)
    assert rows(job.query("SELECT count(*) AS n FROM messages"))[0]["n"] == GENUINE
    from tests.e2e.test_spark_workers import _descendants
    cmds = []
    for pid in _descendants(job.proc.pid):
        try:
            cmds.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except OSError:
            pass
    assert not [c for c in cmds if "pyspark.sql.worker." in c], cmds


def test_spark_connect_needs_the_token(job):
    """Any local process reaches the port; only one holding the token (0600 in the data
    directory) gets an answer."""
    token = secrets.connect_token(str(job.data))
    assert token and (os.stat(secrets.secret_path(str(job.data), secrets.TOKEN_FILE)).st_mode & 0o077) == 0
    code = ("import sys\nfrom pyspark.sql import SparkSession\n"
            "try:\n    SparkSession.builder.remote(sys.argv[1]).getOrCreate().sql('SELECT 1').collect()\n"
            "    print('ANSWERED')\nexcept Exception as e:\n    print('REFUSED', str(e)[:300])\n")
    env = {k: v for k, v in os.environ.items() if k != secrets.TOKEN_ENV}
    for url, want in ((job.url, "REFUSED"), (f"sc://localhost:{job.port}/;token=guess", "REFUSED"),
                      (secrets.client_url(job.url, token), "ANSWERED")):
        out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True,
                             timeout=120, env=env).stdout
        assert out.startswith(want), (url.replace(token, "<token>"), out)
        if want == "REFUSED":
            assert "UNAUTHENTICATED" in out or "nauthenticated" in out, out


def test_the_committed_file_is_signed_and_names_the_table(job):
    path = commits.committed_path(job.table)
    key = secrets.derive(secrets.sink_key(str(job.data)), secrets.COMMITTED)
    st = wait_for(lambda: commits.read_committed(path, key), 60, "a committed file")
    assert st["signature"] == "ok" and st["table"] == os.path.abspath(job.table)
    announced = json.loads(Path(commits.job_file(str(job.data), job.table)).read_text())
    assert announced["pid"] == job.proc.pid and announced["committed_file"] == os.path.abspath(path)


def test_ctrl_c_then_sigterm_stops_cleanly_and_reports_the_last_commit(job):
    """Ctrl-C in a terminal reaches the job's whole process group, and scripts/run.sh then also
    sends SIGTERM: the second signal must not cut the clean stop short."""
    assert job.proc.poll() is None, job.logs()[-3000:]
    os.killpg(job.proc.pid, signal.SIGINT)
    # SIGTERM while the stop is under way (it takes about 0.2 s once the SIGINT is seen)
    wait_for(lambda: "SIGINT received" in job.logs(), 60, "the job to take the SIGINT", 0.01)
    job.proc.send_signal(signal.SIGTERM)
    code = job.proc.wait(120)
    text = job.logs()
    assert code == 0, text[-3000:]
    assert "already stopping" in text and "history job stopped" in text
    from sink.history.job import committed_from_checkpoint
    last = committed_from_checkpoint(commits.committed_path(job.table).rsplit("/", 1)[0])
    reported = commits.read_committed(commits.committed_path(job.table))
    assert last is not None and reported["batch_id"] == last[0]
