"""The history job's Spark Connect server, sink.query over it, and the dashboard against a running
broker + job: MQTT clients -> broker (sink, dashboard) -> embedded Kafka -> `python -m sink.job`
(a subprocess with its own Spark session serving Spark Connect on a free port).

One stack per module (a Spark session takes 8-14 s to start): the query test, the history API
test and the Chromium test share it. Set DASHBOARD_SCREENSHOTS=docs/screenshots to refresh the
README's screenshots.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from kafka_client.embedded import EmbeddedKafka
from tests.conftest import ROOT, BrokerProcess, free_port, wait_port
from tests.e2e.chromium import log_in, start_chromium
from tests.integration.dashboard_http import ADMIN, ADMIN_PW, make_accounts

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(600)]

DEVICES = 3
READINGS = 20          # numeric readings per device, published over MQTT
ROOMS = 3
ROOM_MINUTES = 55      # readings per room written straight to Kafka, one a minute before now
JSON_READINGS = 5      # JSON payloads per device ({"temp": N, "env": {"hum": [..]}}), and one not JSON


def http_json(url: str, timeout: float = 60.0) -> tuple[int, dict]:
    """GET as the stack's operator (HTTP Basic)."""
    import base64
    req = urllib.request.Request(url, headers={"Authorization": "Basic " + base64.b64encode(
        f"{ADMIN}:{ADMIN_PW}".encode()).decode()})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def sink_query(sql: str, url: str, *args: str, data_dir: Path) -> subprocess.CompletedProcess:
    """sink.query as an operator runs it: with the broker's data directory (its token)."""
    return subprocess.run(
        [sys.executable, "-m", "sink.query", "-v", "--connect", url, "--format", "json",
         "--data-dir", str(data_dir), *args, sql],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def rows(proc: subprocess.CompletedProcess) -> list[dict]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def port_open(port: int) -> bool:
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for(check, timeout: float, what: str, every: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.table = str(tmp / "history")
        self.connect_port = free_port()
        self.url = f"sc://127.0.0.1:{self.connect_port}"
        self.dash_port = free_port()
        self.dashboard = f"http://127.0.0.1:{self.dash_port}"
        self.kafka = self.broker = self.job = None
        self.clients: list = []
        self.published_at = 0.0

    def start(self) -> "Stack":
        self.kafka = EmbeddedKafka(log_file=str(self.tmp / "tansu.log")).start()
        self.broker = BrokerProcess(self.tmp, settings={
            "dashboard.enabled": True, "dashboard.port": self.dash_port,
            "dashboard.sample_seconds": 1, "dashboard.connect_url": self.url,
            "dashboard.users_file": make_accounts(self.tmp),
            "history.table": self.table}, args=["--kafka-bootstrap", self.kafka.bootstrap]).start()
        wait_port(self.dash_port, self.broker.proc)
        self.job_log = open(self.tmp / "job.log", "ab")
        self.job = subprocess.Popen(
            [sys.executable, "-m", "sink.job", "--kafka-bootstrap", self.kafka.bootstrap,
             "--table", self.table, "--data-dir", str(self.tmp), "--trigger-seconds", "1",
             "--no-verify-records",  # seed_history() writes to Kafka as another producer
             "--connect-port",
             str(self.connect_port)],
            cwd=ROOT, stdout=self.job_log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        return self

    def job_logs(self) -> str:
        return (self.tmp / "job.log").read_text(errors="replace")[-4000:]

    def publish_readings(self) -> None:
        self.published_at = time.time()
        for d in range(DEVICES):
            c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev-{d}",
                            protocol=mqtt.MQTTv5 if d else mqtt.MQTTv311)
            c.username_pw_set(f"user{d}")
            c.connect("127.0.0.1", self.broker.port)
            c.loop_start()
            c.subscribe(f"cmd/dev-{d}/#", qos=1)
            for i in range(READINGS):
                c.publish(f"sensors/dev-{d}/temp", f"{20 + d + (i % 5) * 0.5}", qos=1).wait_for_publish(10)
            c.publish(f"sensors/dev-{d}/status", b"online", qos=1, retain=True).wait_for_publish(10)
            for i in range(JSON_READINGS):
                doc = {"temp": 20 + d + i, "env": {"hum": [40, 50 + i]}}
                c.publish(f"things/dev-{d}/env", json.dumps(doc), qos=1).wait_for_publish(10)
            c.publish(f"things/dev-{d}/env", b"{not json", qos=1).wait_for_publish(10)
            self.clients.append(c)  # stay connected: the Clients tab lists them

    def seed_history(self) -> None:
        """Readings of the last hour (a day-shaped curve per room), produced straight to Kafka
        with past accept times, so that the history charts have something to draw."""
        import math

        from kafka import KafkaProducer

        from kafka_client.record import SinkRecord, to_kafka
        prod = KafkaProducer(bootstrap_servers=self.kafka.bootstrap)
        now = time.time()
        for r in range(ROOMS):
            for m in range(ROOM_MINUTES):
                at = now - (ROOM_MINUTES - m) * 60
                value = 19 + 2 * r + 3 * math.sin(m / 9 + r)
                rec = SinkRecord(topic=f"sensors/room-{r}/temp", payload=f"{value:.2f}".encode(),
                                 qos=1, retain=False, client_id=f"room-{r}", username=None,
                                 protocol=5, accepted_at_ms=int(at * 1000),
                                 message_id=str(uuid.uuid4()))
                key, val, headers, ts = to_kafka(rec)
                prod.send("mqtt.messages", key=key, value=val, headers=headers, timestamp_ms=ts)
        prod.flush(30)
        prod.close()

    def stop(self) -> None:
        for c in self.clients:
            c.loop_stop()
            c.disconnect()
        if self.job is not None and self.job.poll() is None:
            self.job.terminate()
            try:
                self.job.wait(60)
            except subprocess.TimeoutExpired:
                self.job.kill()
                self.job.wait()
        if self.job is not None:
            self.job_log.close()
        if self.broker is not None:
            self.broker.stop()
        if self.kafka is not None:
            self.kafka.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("dashboard")).start()
    try:
        s.publish_readings()
        s.seed_history()
        expected = DEVICES * (READINGS + 1 + JSON_READINGS + 1) + ROOMS * ROOM_MINUTES

        def listening():
            if s.job.poll() is not None:
                raise AssertionError("the history job exited:\n" + s.job_logs())
            return port_open(s.connect_port)
        wait_for(listening, 240, "the job's Spark Connect port", every=1)

        def ready():
            if s.job.poll() is not None:
                raise AssertionError("the history job exited:\n" + s.job_logs())
            p = sink_query("SELECT count(*) AS n FROM messages", s.url, data_dir=s.tmp)
            return p.returncode == 0 and "Spark Connect" in p.stderr and \
                rows(p)[0]["n"] >= expected and p
        wait_for(ready, 300, "the job's Spark Connect server to serve every message", every=3)
        yield s
    finally:
        s.stop()


def test_sink_query_answers_through_the_jobs_spark_connect_server(stack):
    p = sink_query("SELECT topic, count(*) AS n, min(payload_text) AS lo FROM messages "
                   "WHERE topic LIKE 'sensors/dev-%/temp' GROUP BY topic ORDER BY topic",
                   stack.url, data_dir=stack.tmp)
    got = rows(p)
    assert [r["topic"] for r in got] == [f"sensors/dev-{d}/temp" for d in range(DEVICES)]
    assert all(r["n"] == READINGS for r in got)
    assert "using the history job's Spark Connect server" in p.stderr
    assert "answered by Spark Connect" in p.stderr
    # a table named by path is read by a local session (Spark Connect's sessions read only the
    # job's catalog tables, never a path), and -v says so
    dead = f"sc://127.0.0.1:{free_port()}"
    p = sink_query("SELECT count(*) AS n FROM messages WHERE client_id LIKE 'dev-%'", dead,
                   "--table", stack.table, data_dir=stack.tmp)
    assert rows(p)[0]["n"] == DEVICES * (READINGS + 1 + JSON_READINGS + 1)
    assert "starting a local Spark session (--table" in p.stderr
    assert "answered by a local Spark session" in p.stderr


def test_batches_and_days_written_later_are_visible_to_the_server(stack):
    """The server's `messages` lists the file sink's log on every query: a new batch and a new
    date partition (a record accepted three days ago) appear without any refresh."""
    from kafka import KafkaProducer

    from kafka_client.record import SinkRecord, to_kafka
    old_ms = int((time.time() - 3 * 86400) * 1000)
    rec = SinkRecord(topic="late/arrival", payload=b"42", qos=1, retain=False, client_id="late",
                     username=None, protocol=5, accepted_at_ms=old_ms,
                     message_id=str(uuid.uuid4()))
    key, value, headers, ts = to_kafka(rec)
    prod = KafkaProducer(bootstrap_servers=stack.kafka.bootstrap)
    prod.send("mqtt.messages", key=key, value=value, headers=headers, timestamp_ms=ts).get(30)
    prod.close()
    c = stack.clients[0]
    c.publish("sensors/dev-0/temp", b"30.5", qos=1).wait_for_publish(10)

    def both():
        got = rows(sink_query("SELECT CAST(date AS STRING) AS d, count(*) AS n FROM messages "
                              "WHERE topic IN ('late/arrival') OR payload_text = '30.5' "
                              "GROUP BY date ORDER BY d", stack.url, data_dir=stack.tmp))
        return len(got) == 2 and got
    got = wait_for(both, 120, "the new batch and the new date partition")
    import datetime as dt
    old_day = dt.datetime.fromtimestamp(old_ms / 1000, dt.timezone.utc).date().isoformat()
    assert got[0] == {"d": old_day, "n": 1}


def _mapped_files(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def test_history_questions_do_not_load_spark_into_the_broker(stack):
    """The Spark Connect client (pyspark, grpc, pyarrow: ~120 MiB) answers from a child process;
    the broker's own memory holds none of it, before or after a question."""
    pid = stack.broker.proc.pid
    # the login's password hash (scrypt: 16 MiB in the login thread) comes before the baseline
    assert http_json(f"{stack.dashboard}/api/live")[0] == 200
    before = _rss_kib(pid)
    q = urllib.parse.urlencode({"filter": "sensors/#", "from": time.time() - 3700})
    status, r = http_json(f"{stack.dashboard}/api/history?{q}", timeout=120)
    assert status == 200 and r["total"] > 0, r
    maps = _mapped_files(pid)
    for lib in ("pyspark", "grpc", "pyarrow", "pandas"):
        assert lib not in maps, f"{lib} is loaded into the broker process"
    grown = (_rss_kib(pid) - before) / 1024
    print(f"broker RSS {before / 1024:.1f} MiB before the question, grew {grown:.1f} MiB")
    assert grown < 8, f"the broker grew {grown:.1f} MiB answering a history question"
    workers = [c for c in _children(pid)
               if b"history_worker" in open(f"/proc/{c}/cmdline", "rb").read()]
    assert len(workers) == 1  # the one worker process answers, and stays for the next question
    status, r = http_json(f"{stack.dashboard}/api/history?{q}", timeout=120)
    assert status == 200 and workers == [c for c in _children(pid)
                                         if b"history_worker" in open(f"/proc/{c}/cmdline", "rb").read()]


def test_history_api_answers_from_spark(stack):
    q = urllib.parse.urlencode({"filter": "sensors/+/temp", "from": time.time() - 3700,
                                "to": time.time() + 60})
    status, r = http_json(f"{stack.dashboard}/api/history?{q}")
    assert status == 200, r
    assert r["total"] >= DEVICES * READINGS + ROOMS * (ROOM_MINUTES - 5)
    assert sum(n for _, n in r["counts"]) == r["total"]
    assert all(t.endswith("Z") and "T" in t for t, _ in r["counts"]) and r["from"].endswith("Z")
    assert len(r["counts"]) > 10  # spread over the hour
    topics = {s["topic"] for s in r["values"]}
    assert topics == {f"sensors/dev-{d}/temp" for d in range(DEVICES)} | \
        {f"sensors/room-{d}/temp" for d in range(ROOMS)}
    for s in r["values"]:
        assert all(15 <= x <= 31 for _, x in s["points"]), s
    assert r["latest"] and all(m["topic"].endswith("/temp") for m in r["latest"])
    # a filter matching no topic: an answer with zero messages, not an error
    status, r = http_json(f"{stack.dashboard}/api/history?filter=nothing/%23")
    assert status == 200 and r["total"] == 0 and r["counts"] == [] and r["latest"] == []
    # '#' does not match $-topics [MQTT-4.7.2-1]; status topics are text, not numeric
    status, r = http_json(f"{stack.dashboard}/api/history?filter=%23&from={stack.published_at - 300}")
    assert status == 200 and not any(m["topic"].startswith("$") for m in r["latest"])
    assert "sensors/dev-0/status" not in {s["topic"] for s in r["values"]}


def test_a_rules_sql_is_checked_by_the_jobs_spark_before_it_is_stored(stack):
    """POST /api/v1/rules: Spark analyses the SQL over an empty `messages` with the table's
    columns (payload_json a VARIANT): refused with Spark's message (400, nothing stored), else
    stored with its columns; the history questions afterwards still read the table."""
    from tests.integration.dashboard_http import as_admin
    status, r = as_admin(f"{stack.dashboard}/api/v1/rules", "POST", {
        "name": "typo", "sql": "SELECT nope FROM messages", "publish": "alerts/typo"})
    assert status == 400, r
    assert "Spark refused the rule's SQL" in r["error"] and "nope" in r["error"]
    assert "UNRESOLVED_COLUMN" in r["error"] and "Project" not in r["error"]
    status, r = as_admin(f"{stack.dashboard}/api/v1/rules", "POST", {
        "name": "warm", "publish": "alerts/warm",
        "sql": "SELECT topic, payload_json:temp::double AS temp FROM messages "
               "WHERE payload_json:temp::double > 21"})
    assert status == 200, r
    assert r["columns"] == [["topic", "string"], ["temp", "double"]]
    _, listed = as_admin(f"{stack.dashboard}/api/v1/rules")
    assert [x["name"] for x in listed["rules"]] == ["warm"]
    assert as_admin(f"{stack.dashboard}/api/v1/rules/warm", "DELETE")[0] == 200
    status, h = http_json(f"{stack.dashboard}/api/history?filter=sensors/%2B/temp")
    assert status == 200 and h["total"] > 0   # the table, not the check's empty view


def test_field_history_api_reads_a_json_field_from_spark(stack):
    """/api/field/history: avg/min/max per interval of a JSON field (try_variant_get over
    payload_json); payloads that are not JSON are left out; a bad field path is a 400."""
    q = {"filter": "things/#", "from": stack.published_at - 300, "to": time.time() + 60}
    status, r = http_json(f"{stack.dashboard}/api/field/history?"
                          + urllib.parse.urlencode({**q, "field": "temp"}))
    assert status == 200, r
    assert r["field"] == "temp" and r["total"] == DEVICES * JSON_READINGS, r
    assert min(p[2] for p in r["points"]) == 20
    assert max(p[3] for p in r["points"]) == 20 + (DEVICES - 1) + (JSON_READINGS - 1)
    assert all(p[2] <= p[1] <= p[3] and p[0].endswith("Z") for p in r["points"])
    status, r = http_json(f"{stack.dashboard}/api/field/history?"
                          + urllib.parse.urlencode({**q, "field": "env.hum[1]"}))
    assert status == 200 and r["total"] == DEVICES * JSON_READINGS, r
    assert min(p[2] for p in r["points"]) == 50 and max(p[3] for p in r["points"]) == 54
    status, r = http_json(f"{stack.dashboard}/api/field/history?"
                          + urllib.parse.urlencode({**q, "field": "temp' OR 1=1 --"}))
    assert status == 400 and "invalid field path" in r["error"], r


# ---- the page in a real headless Chromium ------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield driver
    finally:
        driver.quit()


def _attr(driver, css: str, name: str) -> str | None:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e && e.getAttribute(arguments[1]);",
        css, name)


def _wait_attr(driver, css: str, name: str, ok, timeout: float = 120):
    return wait_for(lambda: (lambda v: v if v is not None and ok(v) else None)(
        _attr(driver, css, name)), timeout, f"{css}[{name}]", every=0.5)


def _shot(driver, tmp_path: Path, name: str) -> Path:
    out = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path)
    if not out.is_absolute():
        out = ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    return path


def test_dashboard_page_renders_live_and_history_charts(stack, browser, tmp_path):
    import threading
    d = browser
    stop = threading.Event()

    def traffic():  # keep messages flowing: live rates, per-topic rates
        i = 0
        while not stop.is_set():
            for n, c in enumerate(stack.clients):
                c.publish(f"sensors/dev-{n}/temp", f"{21 + n + (i % 9) * 0.2:.1f}", qos=i % 2)
                if i % 3 == 0:  # delivered to dev-n's subscription: messages out
                    c.publish(f"cmd/dev-{n}/led", b"on", qos=1)
            i += 1
            time.sleep(0.1 + 0.1 * (i % 20 > 10))
    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        _page_checks(stack, d, tmp_path)
    finally:
        stop.set()
        t.join(10)


def _page_checks(stack, d, tmp_path):
    time.sleep(5)
    log_in(d, stack.dashboard + "/#live", ADMIN, ADMIN_PW)
    _wait_attr(d, "#chart-in", "data-points", lambda v: int(v) >= 3)
    assert int(_attr(d, "#chart-in", "data-series")) == 3
    assert d.execute_script("return document.querySelectorAll('#chart-in canvas').length") >= 1
    assert int(_attr(d, "#chart-spool", "data-points")) >= 3  # the sink is on: spool depth
    received = d.execute_script(
        "return [...document.querySelectorAll('.card')].find(c => c.textContent.includes('received'))"
        ".querySelector('.v').textContent")
    assert int(received.replace(",", "")) >= DEVICES * READINGS
    assert d.find_element("id", "banner").get_attribute("hidden") is not None
    time.sleep(8)  # a few more points, for a fuller screenshot
    _shot(d, tmp_path, "dashboard-live")

    d.get(stack.dashboard + "/#clients")
    _wait_attr(d, "#clients-table", "data-rows", lambda v: int(v) >= DEVICES)
    text = d.find_element("id", "clients-table").text
    assert "dev-0" in text and "3.1.1" in text and "cmd/dev-2/#" in text
    _shot(d, tmp_path, "dashboard-clients")
    search = d.find_element("id", "client-search")
    search.send_keys("dev-2")
    _wait_attr(d, "#clients-table", "data-rows", lambda v: int(v) == 1)
    assert "dev-2" in d.find_element("id", "clients-table").text

    d.get(stack.dashboard + "/#topics")
    _wait_attr(d, "#topic-tree", "data-count", lambda v: int(v) >= 2 * DEVICES)
    tree = d.find_element("id", "topic-tree").text
    assert "online" in tree and "dev-1" in tree  # a retained value in the tree
    wait_for(lambda: "msg/s" in d.find_element("id", "topic-tree").text, 30, "per-topic rates",
             every=0.5)
    _shot(d, tmp_path, "dashboard-topics")

    d.get(stack.dashboard + "/#history?filter=" + urllib.parse.quote("sensors/+/temp", safe="")
          + "&range=3600")
    state = _wait_attr(d, "#history", "data-state", lambda v: v in ("done", "empty", "error"))
    assert state == "done", d.find_element("id", "history-message").text
    assert int(_attr(d, "#chart-counts", "data-points")) >= 2
    assert int(_attr(d, "#chart-values", "data-series")) == DEVICES + ROOMS
    assert int(_attr(d, "#latest-table", "data-rows")) > 0
    assert "sensors/dev-" in d.find_element("id", "latest-table").text
    _shot(d, tmp_path, "dashboard-history")

    # a JSON field over the same hour: the history series, and the live one as readings arrive
    d.find_element("id", "f-filter").clear()
    d.find_element("id", "f-filter").send_keys("things/#")
    d.find_element("id", "f-field").clear()
    d.find_element("id", "f-field").send_keys("temp")
    d.find_element("id", "field-form").submit()
    _wait_attr(d, "#chart-field", "data-history", lambda v: int(v) >= 1)

    def live_points():
        stack.clients[0].publish("things/dev-0/env", json.dumps({"temp": 21}), qos=1)
        return int(_attr(d, "#chart-field", "data-live") or 0) >= 2
    wait_for(live_points, 60, "the field chart's live series", every=1)
    drawn = d.execute_script("const u = field.chart.plot; return [1, 2, 3, 4].map("
                             "(i) => u.data[i].filter((y) => y != null).length)")
    assert drawn[0] >= 2 and all(n >= 1 for n in drawn[1:]), drawn
    assert "History: " in d.find_element("id", "field-note").text

    # bad input: a clear message on the page, no chart
    d.get(stack.dashboard + "/#history?filter=" + urllib.parse.quote("a/#/b", safe="") + "&range=60")
    _wait_attr(d, "#history", "data-state", lambda v: v == "error")
    assert "invalid topic filter" in d.find_element("id", "history-message").text


def test_broker_stops_promptly_after_the_job_stopped_first(stack):
    """The dashboard's Spark Connect session must not hold the broker's exit: pyspark's exit
    hook retried its clean-up calls against the stopped job for minutes (scripts/run.sh stops
    both at once). Runs last: it stops the module's stack."""
    status, body = http_json(f"{stack.dashboard}/api/history?filter=sensors/%23", timeout=120)
    assert status == 200, body  # the dashboard holds a session on the job's server
    stack.job.terminate()
    assert stack.job.wait(60) == 0
    # the job's JVM outlives its Python process for a moment
    wait_for(lambda: not port_open(stack.connect_port), 60, "the job's Spark Connect port to close",
             every=0.5)
    status, body = http_json(f"{stack.dashboard}/api/history?filter=sensors/%23", timeout=120)
    assert status == 503 and "not running" in body.get("error", ""), body
    # BrokerProcess.stop: SIGTERM, then SIGKILL after 10 s (-9): a clean exit is 0
    assert stack.broker.stop() == 0, "the broker did not exit on SIGTERM within 10 s"
