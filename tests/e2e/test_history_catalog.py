"""The history table as `messages` in a Spark catalog, read from a fresh spark-sql with no path,
and the job's JDBC/ODBC endpoint (Spark's Thrift server, HiveServer2 protocol) with password
authentication, queried with beeline and with a Python HiveServer2 client (PyHive)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from sink.history import catalog
from sink.history.job import Job, run
from tests.conftest import free_port
from tests.e2e.test_spark_history import produce, simple_message

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(pyspark.__file__).parent / "bin"


def test_a_fresh_spark_sql_reads_messages_from_the_catalog(spark, kafka, tmp_path):
    msgs = [simple_message(i, "cat") for i in range(75)]
    produce(kafka.bootstrap, msgs)
    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(tmp_path / "history"),
                    available_now=True, source="python")
    assert run(spark, cfg) == 0
    assert catalog.register_in_derby(cfg.history)
    conf = catalog.metastore_dir(cfg.history) / "conf"
    env = {**os.environ, "SPARK_CONF_DIR": str(conf)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    out = subprocess.run([str(BIN / "spark-sql"), "--master", "local[1]", "-S", "-e",
                          "SELECT count(*), count(DISTINCT message_id) FROM messages; "
                          "SELECT count(*) FROM default.messages WHERE date = current_date(); "
                          "SELECT count(*) FROM messages WHERE payload_json:n::int >= 70; "
                          "SELECT count(*) FROM sparkplug_metrics; "
                          "SELECT count(*) FROM sparkplug_state"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    assert lines[:3] == ["75\t75", "75", "5"], out.stdout  # payload_json: the JSON payloads
    assert lines[3:5] == ["0", "0"], out.stdout  # beside it: Sparkplug B's table and view (none here)
    assert catalog.registered(cfg.history)  # registered once: the next start runs no spark-sql
    assert catalog.start_registration(cfg.history) is None


def _password_file(tmp_path: Path) -> Path:
    from broker.auth.passwords import hash_password
    p = tmp_path / "passwd"
    p.write_text("alice:" + hash_password("s3cret", n=1024) + "\n")
    return p


def test_jdbc_endpoint_with_beeline_and_pyhive(kafka, tmp_path):
    port = free_port()
    pw = _password_file(tmp_path)
    cfg_file = tmp_path / "broker.toml"
    cfg_file.write_text(f'[history]\njdbc = true\njdbc_port = {port}\n'
                        f'jdbc_password_file = "{pw}"\n')
    table = str(tmp_path / "history")
    produce(kafka.bootstrap, [simple_message(i, "jdbc") for i in range(40)])
    log_path = tmp_path / "job.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "sink.job", "--config", str(cfg_file), "--kafka-bootstrap",
         kafka.bootstrap, "--table", table, "--data-dir", str(tmp_path), "--trigger-seconds", "1", "--no-connect",
         "--nice", "0"],  # niceness 10 starves it on a machine other work keeps busy
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=open(log_path, "ab"),
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 900  # a safety net only: a busy machine is slow
        while "JDBC/ODBC (HiveServer2) on" not in log_path.read_text(errors="replace"):
            assert job.poll() is None and time.monotonic() < deadline, \
                log_path.read_text(errors="replace")[-3000:]
            time.sleep(1)
        from pyhive import hive

        def count() -> int:
            c = hive.connect(host="127.0.0.1", port=port, username="alice", password="s3cret",
                             auth="CUSTOM")
            try:
                cur = c.cursor()
                cur.execute("SELECT count(*) FROM messages")
                return cur.fetchall()[0][0]
            finally:
                c.close()
        while count() < 40:
            assert time.monotonic() < deadline
            time.sleep(1)
        assert count() == 40
        with pytest.raises(Exception, match="Error validating the login"):
            hive.connect(host="127.0.0.1", port=port, username="alice", password="wrong",
                         auth="CUSTOM")
        beeline = [str(BIN / "beeline"), "-u", f"jdbc:hive2://127.0.0.1:{port}/default",
                   "--outputformat=csv2", "--silent=true"]
        ok = subprocess.run(beeline + ["-n", "alice", "-p", "s3cret", "-e",
                                       "SELECT count(DISTINCT message_id) AS ids, "
                                       "count_if(payload_json:n::int >= 30) AS hot, "
                                       # (read as the typed field: the job's variant rule)
                                       "count_if(try_cast(payload_json:n AS int) >= 30) AS hot2 "
                                       "FROM messages"],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert ok.stdout.split()[-2:] == ["ids,hot,hot2", "40,10,10"], ok.stdout  # (after beeline's prompt)
        bad = subprocess.run(beeline + ["-n", "mallory", "-p", "s3cret", "-e", "SELECT 1"],
                             capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert "Error validating the login" in bad.stdout + bad.stderr
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
