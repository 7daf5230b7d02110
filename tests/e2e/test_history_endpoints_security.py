"""The history job's query endpoints against hostile clients, on the whole stack as
scripts/run.sh starts it (embedded Kafka, the broker with its sink and devices' password file,
the history job serving Spark Connect and JDBC): no secret on any process's command line, JDBC
only for operators, and both endpoints read-only (no writes, DDL, settings, file paths or user
code), the table's rows intact after every attempt."""
from __future__ import annotations

import json
import os
import secrets as random
import signal
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from settings import secrets
from tests.conftest import BrokerProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
ROWS = 30
REFUSED = "read-only session"


def _password_file(path: Path, user: str, password: str) -> Path:
    from broker.auth.passwords import hash_password
    path.write_text(f"{user}:" + hash_password(password, n=1024) + "\n")
    return path


class Stack:
    def __init__(self, tmp: Path, bootstrap: str) -> None:
        self.tmp = tmp
        self.table = str(tmp / "history")
        self.device_password = "dev-" + random.token_hex(8)
        self.operator_password = "op-" + random.token_hex(8)
        self.devices = _password_file(tmp / "devices", "dev1", self.device_password)
        self.operators = _password_file(tmp / "operators", "op", self.operator_password)
        self.jdbc_port, self.connect_port = free_port(), free_port()
        self.broker = BrokerProcess(tmp, settings={"auth.password_file": str(self.devices),
                                                   "auth.allow_anonymous": False},
                                    args=["--kafka-bootstrap", bootstrap])
        self.cfg = tmp / "broker.toml"
        self.cfg.write_text(f'[auth]\npassword_file = "{self.devices}"\n'
                            f'[history]\njdbc = true\njdbc_port = {self.jdbc_port}\n'
                            f'jdbc_password_file = "{self.operators}"\n')
        self.log = tmp / "job.log"
        self.cmd = [sys.executable, "-m", "sink.job", "--config", str(self.cfg),
                    "--kafka-bootstrap", bootstrap, "--table", self.table, "--data-dir", str(tmp),
                    "--trigger-seconds", "1", "--connect-port", str(self.connect_port),
                    "--nice", "0"]
        self.job: subprocess.Popen | None = None

    def start(self) -> None:
        self.broker.start()
        env = {k: v for k, v in os.environ.items() if k not in (secrets.TOKEN_ENV, secrets.KEY_ENV)}
        self.job = subprocess.Popen(self.cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                                    stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="dev1", protocol=mqtt.MQTTv5)
        c.username_pw_set("dev1", self.device_password)
        c.connect("127.0.0.1", self.broker.port)
        c.loop_start()
        for i in range(ROWS):
            c.publish(f"dev/dev1/t{i}", f"reading {i}".encode(), qos=1).wait_for_publish(10)
        c.loop_stop()
        c.disconnect()
        deadline = time.monotonic() + 900  # a safety net only: a busy machine is slow
        while not all(s in self.log.read_text(errors="replace")
                      for s in ("JDBC/ODBC (HiveServer2) on", "Spark Connect on")):
            assert self.job.poll() is None and time.monotonic() < deadline, self.job_log()
            time.sleep(1)
        while self.count() < ROWS:
            assert time.monotonic() < deadline, self.job_log()
            time.sleep(1)

    def job_log(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def jdbc(self, user: str = "op", password: str | None = None):
        from pyhive import hive
        return hive.connect(host="127.0.0.1", port=self.jdbc_port, username=user,
                            password=password or self.operator_password, auth="CUSTOM")

    def sql(self, statement: str) -> list:
        c = self.jdbc()
        try:
            cur = c.cursor()
            cur.execute(statement)
            return cur.fetchall() if cur.description else []
        finally:
            c.close()

    def count(self) -> int:
        return self.sql("SELECT count(*) FROM messages")[0][0]

    def stop(self) -> None:
        if self.job is not None:
            os.killpg(self.job.pid, signal.SIGTERM)
            try:
                self.job.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.job.pid, signal.SIGKILL)
                self.job.wait()
        self.broker.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from kafka_client.embedded import EmbeddedKafka
    tmp = tmp_path_factory.mktemp("endpoints")
    kafka = EmbeddedKafka(log_file=str(tmp / "tansu.log"))
    kafka.start()
    s = Stack(tmp, kafka.bootstrap)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        kafka.stop()


def the_secrets(stack: Stack) -> dict[str, str]:
    out = {"the JDBC operator's password": stack.operator_password,
           "the device's password": stack.device_password}
    for name, label in ((secrets.TOKEN_FILE, "the Spark Connect token"),
                        (secrets.KEY_FILE, "the sink key")):
        text = Path(secrets.secret_path(str(stack.tmp), name)).read_text().strip()
        assert len(text) >= 32, (label, text)
        out[label] = text
    return out


def command_lines() -> dict[int, str]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:   # ended meanwhile, or not ours to read
                continue
            out[int(entry)] = raw.replace(b"\0", b" ").decode(errors="replace")
    return out


def test_no_secret_is_on_any_process_command_line(stack):
    """Every local user reads every process's arguments (ps -eww, /proc/PID/cmdline): none of
    the stack's processes (broker, forwarder, the job, its JVM and Python workers) has a secret
    there: the Connect token, the sink key, the operators' or the devices' passwords."""
    lines = command_lines()
    jvm = [pid for pid, line in lines.items()
           if f"spark.connect.grpc.binding.port={stack.connect_port}" in line]
    assert jvm, "the job's JVM was not found among the processes"   # (the scan sees it)
    assert any(str(stack.tmp) in line for line in lines.values())
    for label, secret in the_secrets(stack).items():
        found = [pid for pid, line in lines.items() if secret in line]
        assert not found, f"{label} is on the command line of process(es) {found}"


def test_jdbc_is_for_operators_not_device_logins(stack):
    with pytest.raises(Exception, match="Error validating the login"):
        stack.jdbc("dev1", stack.device_password)
    assert stack.count() == ROWS


@pytest.mark.parametrize("statement", [
    "INSERT OVERWRITE DIRECTORY '{table}' USING parquet SELECT 1 AS x",
    "INSERT INTO messages SELECT * FROM messages",
    "DROP TABLE messages",
    "TRUNCATE TABLE messages",
    "CREATE TABLE stolen USING text LOCATION '{secrets}'",
    "CREATE TEMPORARY VIEW stolen USING text OPTIONS (path '{key}')",
    "SET spark.sql.runSQLOnFiles = true",
    "SELECT java_method('java.lang.System', 'getenv', 'HOME')",
    "SELECT TRANSFORM(topic) USING 'cat {key}' FROM messages",
    "ADD JAR {tmp}/nothing.jar",
    "CACHE TABLE messages",
])
def test_jdbc_sessions_are_read_only(stack, statement):
    """A JDBC user (an operator) only reads: every write, DDL, setting, server-side program
    or reflection is refused and the table keeps its rows."""
    sql = statement.format(table=stack.table, key=secrets.secret_path(str(stack.tmp), "sink.key"),
                           secrets=secrets.secrets_dir(str(stack.tmp)), tmp=stack.tmp)
    with pytest.raises(Exception) as e:
        stack.sql(sql)
    assert REFUSED in str(e.value), str(e.value)[-2000:]
    assert stack.count() == ROWS
    assert list(Path(stack.table).glob("date=*/*.parquet"))


@pytest.mark.parametrize("name", [secrets.KEY_FILE, secrets.TOKEN_FILE])
def test_jdbc_reads_no_file_by_its_path(stack, name):
    """``format`.`path`` in SQL reads nothing: the secrets of the data directory stay there."""
    path = secrets.secret_path(str(stack.tmp), name)
    secret = Path(path).read_text().strip()
    for fmt in ("text", "csv", "json", "binaryFile"):
        with pytest.raises(Exception) as e:
            stack.sql(f"SELECT * FROM {fmt}.`{path}`")
        assert secret not in str(e.value)


def test_jdbc_reads_and_shows_the_catalog(stack):
    assert stack.sql("SELECT count(*) FROM messages WHERE topic LIKE 'dev/dev1/%'") == [(ROWS,)]
    assert any("messages" in row for row in stack.sql("SHOW TABLES"))
    assert any(row[0] == "topic" for row in stack.sql("DESCRIBE messages"))


CONNECT_CLIENT = r'''
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql.functions import udf
url, table, key = sys.argv[1:4]
spark = SparkSession.builder.remote(url).create()
out = {}
def attempt(name, f):
    try:
        out[name] = ["ran", repr(f())[:300]]
    except Exception as exc:
        out[name] = ["refused", str(exc)[:2000]]
attempt("count", lambda: spark.sql("SELECT count(*) FROM messages").collect()[0][0])
attempt("read a file", lambda: spark.read.text(key).collect())
attempt("sql on a file", lambda: spark.sql(f"SELECT * FROM text.`{key}`").collect())
attempt("insert overwrite directory", lambda: spark.sql(
    f"INSERT OVERWRITE DIRECTORY '{table}' USING parquet SELECT 1 AS x").collect())
attempt("write over the table", lambda: spark.range(1).write.mode("overwrite").parquet(table))
attempt("python udf", lambda: spark.range(2).select(udf(lambda x: x)("id")).collect())
attempt("count again", lambda: spark.sql("SELECT count(*) FROM messages").collect()[0][0])
print(json.dumps(out))
'''


def test_spark_connect_clients_are_read_only(stack):
    """Spark Connect clients (with the token: sink.query, the dashboard) only read the
    catalog's tables: no file by its path, no write, no Python code run by the job."""
    token = secrets.connect_token(str(stack.tmp))
    url = secrets.client_url(f"sc://127.0.0.1:{stack.connect_port}", token)
    key = secrets.secret_path(str(stack.tmp), secrets.KEY_FILE)
    env = {k: v for k, v in os.environ.items() if k != secrets.TOKEN_ENV}
    res = subprocess.run([sys.executable, "-c", CONNECT_CLIENT, url, stack.table, key],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["count"] == ["ran", str(ROWS)], out
    assert out["count again"] == ["ran", str(ROWS)], out
    secret = Path(key).read_text().strip()
    for name in ("read a file", "sql on a file", "insert overwrite directory",
                 "write over the table", "python udf"):
        assert out[name][0] == "refused", (name, out[name])
        assert secret not in out[name][1]
    for name in ("read a file", "insert overwrite directory", "write over the table",
                 "python udf"):
        assert REFUSED in out[name][1], (name, out[name])
    assert stack.count() == ROWS


def test_without_the_guard_no_endpoint_is_served(spark):
    """A Spark without the read-only extension (a spark-submit not given it): the job's check
    fails, so it serves neither Spark Connect nor JDBC rather than serving them writable."""
    from sink.history import guard
    with pytest.raises(guard.GuardMissing, match="not served"):
        guard.check_active(spark)
