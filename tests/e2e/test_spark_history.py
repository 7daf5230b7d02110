"""End-to-end tests of the Spark half of the sink: Kafka -> sink.job -> history table -> sink.query.

Run: .venv/bin/python -m pytest tests/e2e -q   (about 2 minutes; -m "not e2e" for the fast ones)
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sink.history.job import DEDUP_MARKER, SOURCE_MARKER, Job, run
from sink.history.query import run_sql

pytestmark = pytest.mark.timeout(600)


def e2e(fn):
    """Spark + embedded Kafka: slow (the last two tests of this file are not)."""
    return pytest.mark.e2e(pytest.mark.kafka(fn))

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "mqtt.messages"
UTC = dt.timezone.utc


# ---- producing records the way the broker's forwarder does -----------------------------------

def contract_headers(m: dict) -> list[tuple[str, bytes]]:
    h = [("mqtt.message_id", m["message_id"].encode()),
         ("mqtt.client_id", m["client_id"].encode())]
    if m.get("username") is not None:
        h.append(("mqtt.username", m["username"].encode()))
    h += [("mqtt.qos", str(m["qos"]).encode()),
          ("mqtt.retain", b"1" if m["retain"] else b"0"),
          ("mqtt.protocol", str(m["protocol"]).encode())]
    if m.get("payload_format") is not None:
        h.append(("mqtt.payload_format", str(m["payload_format"]).encode()))
    if m.get("content_type") is not None:
        h.append(("mqtt.content_type", m["content_type"].encode()))
    if m.get("response_topic") is not None:
        h.append(("mqtt.response_topic", m["response_topic"].encode()))
    if m.get("correlation_data") is not None:
        h.append(("mqtt.correlation_data", m["correlation_data"]))
    if m.get("message_expiry") is not None:
        h.append(("mqtt.message_expiry", str(m["message_expiry"]).encode()))
    for k, v in m.get("user_properties", []):
        h.append((f"mqtt.user.{k}", v.encode()))
    return h


def producer(bootstrap: str):
    from kafka import KafkaProducer
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)


def produce(bootstrap: str, messages: list[dict], topic: str = TOPIC, prod=None) -> None:
    own = prod is None
    prod = prod or producer(bootstrap)
    futures = [prod.send(topic, key=m["topic"].encode(), value=m["payload"],
                         headers=contract_headers(m), timestamp_ms=m["accepted_ms"])
               for m in messages]
    prod.flush()
    for f in futures:
        f.get(timeout=30)
    if own:
        prod.close()


def simple_message(i: int, prefix: str = "m", when_ms: int | None = None) -> dict:
    return {"message_id": f"{prefix}-{i:06d}", "topic": f"devices/d{i % 5}/temp",
            "payload": f"{{\"n\": {i}}}".encode(), "client_id": f"dev-{i % 5}",
            "username": "svc", "qos": i % 3, "retain": False, "protocol": 5,
            "accepted_ms": when_ms if when_ms is not None else int(time.time() * 1000)}


def history_job(bootstrap: str, tmp_path: Path, **kw) -> Job:
    return Job.of(bootstrap=bootstrap, table=str(tmp_path / "history"),
                     trigger_seconds=1, **kw)


def ids_and_count(spark, table: str) -> tuple[int, set]:
    rows = run_sql(spark, table, "SELECT message_id FROM messages")
    return len(rows), {r.message_id for r in rows}


# ---- 1: every column right, duplicates dropped ------------------------------------------------

@e2e
def test_history_columns_and_dedup(spark, kafka, tmp_path):
    t0 = int(dt.datetime(2024, 5, 1, 23, 59, 59, 250000, tzinfo=UTC).timestamp() * 1000)
    t1 = int(dt.datetime(2024, 5, 2, 0, 0, 1, tzinfo=UTC).timestamp() * 1000)
    props = [("a", "1"), ("b", "2"), ("a", "3"), ("unit", "°C"), ("a", "4"),
             ("x-empty", ""), ("b", "5"), ("k7", "v7"), ("k8", "v8"), ("a", "6")]
    full = {"message_id": "full-1", "topic": "devices/d1/raw", "payload": b"\xff\xfe\x00\x80bin",
            "client_id": "dev-1", "username": "alice", "qos": 2, "retain": True, "protocol": 5,
            "payload_format": 0, "content_type": "application/octet-stream",
            "response_topic": "devices/d1/reply", "correlation_data": b"\x00\x01corr\xff",
            "message_expiry": 3600, "user_properties": props, "accepted_ms": t0}
    anon = {"message_id": "anon-1", "topic": "lobby/chat", "payload": "héllo wörld".encode(),
            "client_id": "guest", "username": None, "qos": 0, "retain": False, "protocol": 4,
            "accepted_ms": t1}
    empty = {"message_id": "empty-1", "topic": "devices/d1/state", "payload": b"",
             "client_id": "dev-1", "username": "alice", "qos": 1, "retain": True, "protocol": 3,
             "payload_format": 1, "content_type": "text/plain", "accepted_ms": t1 + 5}
    def json_message(mid: str, payload: bytes, ms: int) -> dict:
        return {"message_id": mid, "topic": f"sensors/{mid}", "payload": payload,
                "client_id": "dev-2", "username": "svc", "qos": 1, "retain": False,
                "protocol": 5, "accepted_ms": ms}
    obj = json_message("json-object", b'{"temp": 21.5, "unit": "C", "tags": ["a", "b"]}', t1 + 6)
    arr = json_message("json-array", b'[1, 2.5, {"temp": 3}]', t1 + 7)
    num = json_message("json-scalar", b" 42 ", t1 + 8)
    bad = json_message("json-broken", b'{"temp": 21.5', t1 + 9)
    bulk = [simple_message(i, "bulk", t1 + 10 + i) for i in range(200)]
    produce(kafka.bootstrap, [full, anon, empty, obj, arr, num, bad] + bulk)
    # The same message again (a producer retry / replayed spool): must be stored once.
    produce(kafka.bootstrap, [full, bulk[7]])

    cfg = history_job(kafka.bootstrap, tmp_path, available_now=True)  # source auto
    assert run(spark, cfg) == 0
    assert Path(cfg.history.checkpoint_dir, SOURCE_MARKER).read_text().strip() == "python"
    # the Python source dropped the copies (sink/history/dedup.py), not Spark's watermark operator
    assert Path(cfg.history.checkpoint_dir, DEDUP_MARKER).read_text().strip() == "source"
    assert any(Path(cfg.history.checkpoint_dir, "dedup").glob("ledger-*.pkl"))

    rows = run_sql(spark, cfg.history.table, "SELECT * FROM messages")
    assert len(rows) == 207
    # the writer's per-column settings (job.PARQUET_OPTIONS) reached the files
    import pyarrow.parquet as pq
    chunks = {}
    for f in Path(cfg.history.table).rglob("*.parquet"):
        rg = pq.ParquetFile(f).metadata.row_group(0)
        chunks.update({rg.column(i).path_in_schema: rg.column(i) for i in range(rg.num_columns)})
    assert not any("DICTIONARY" in e for e in chunks["message_id"].encodings)
    assert not chunks["payload"].is_stats_set and chunks["topic"].is_stats_set
    # accepted_at as INT64 microseconds with min/max statistics (INT96 keeps none), so a filter
    # on an hour skips the row groups and files outside it
    assert chunks["accepted_at"].physical_type == "INT64" and chunks["accepted_at"].is_stats_set
    assert len({r.message_id for r in rows}) == 207
    by_id = {r.message_id: r for r in rows}

    r = by_id["full-1"]
    assert r.topic == "devices/d1/raw"
    assert bytes(r.payload) == b"\xff\xfe\x00\x80bin"
    assert r.payload_text is None
    assert (r.qos, r.retain, r.client_id, r.username, r.protocol) == (2, True, "dev-1", "alice", 5)
    assert r.accepted_at == dt.datetime(2024, 5, 1, 23, 59, 59, 250000)  # UTC session
    assert r.date == dt.date(2024, 5, 1)
    assert (r.content_type, r.payload_format, r.response_topic) == \
        ("application/octet-stream", 0, "devices/d1/reply")
    assert bytes(r.correlation_data) == b"\x00\x01corr\xff"
    assert r.message_expiry == 3600
    assert [(p.key, p.value) for p in r.user_properties] == props
    assert r.kafka_topic == TOPIC and r.kafka_partition >= 0 and r.kafka_offset >= 0
    assert r.ingested_at is not None and r.ingested_at > r.accepted_at

    a = by_id["anon-1"]
    assert a.username is None and a.payload_text == "héllo wörld"
    assert bytes(a.payload) == "héllo wörld".encode()
    assert (a.qos, a.retain, a.protocol) == (0, False, 4)
    assert a.date == dt.date(2024, 5, 2)
    assert (a.content_type, a.payload_format, a.response_topic, a.correlation_data,
            a.message_expiry) == (None, None, None, None, None)
    assert a.user_properties == []

    e = by_id["empty-1"]
    assert bytes(e.payload) == b"" and e.payload_text == ""
    assert (e.protocol, e.payload_format, e.content_type) == (3, 1, "text/plain")

    # payload_json: the payload parsed as JSON (any JSON value), NULL when it is not JSON
    def parsed(mid: str):
        v = by_id[mid].payload_json
        return None if v is None else json.loads(v.toJson())
    assert parsed("json-object") == {"temp": 21.5, "unit": "C", "tags": ["a", "b"]}
    assert parsed("json-array") == [1, 2.5, {"temp": 3}]
    assert parsed("json-scalar") == 42
    assert parsed("bulk-000007") == {"n": 7}
    assert bytes(by_id["json-object"].payload) == obj["payload"]  # the bytes stay
    for not_json in ("full-1", "anon-1", "empty-1", "json-broken"):  # non-UTF-8, text, empty
        assert by_id[not_json].payload_json is None, not_json
    # a field of it in SQL, as sink.query runs it; rows without the field give NULL
    temps = run_sql(spark, cfg.history.table,
                    "SELECT message_id, payload_json:temp::double AS t FROM messages "
                    "WHERE topic LIKE 'sensors/%' ORDER BY message_id")
    assert [(r.message_id, r.t) for r in temps] == [
        ("json-array", None), ("json-broken", None), ("json-object", 21.5), ("json-scalar", None)]
    assert run_sql(spark, cfg.history.table, "SELECT count(*) AS n FROM messages "
                   "WHERE payload_json:n::int >= 190")[0].n == 10
    assert run_sql(spark, cfg.history.table, "SELECT payload_json:[2].temp::int AS t FROM "
                   "messages WHERE message_id = 'json-array'")[0].t == 3
    assert run_sql(spark, cfg.history.table, "SELECT payload_json:tags[1]::string AS t FROM "
                   "messages WHERE message_id = 'json-object'")[0].t == "b"

    # Kafka coordinates are unique and the table is partitioned by UTC date.
    assert len({(r.kafka_partition, r.kafka_offset) for r in rows}) == 207
    dates = run_sql(spark, cfg.history.table,
                    "SELECT date, count(*) AS n FROM messages GROUP BY date ORDER BY date")
    assert [(d.date, d.n) for d in dates] == [(dt.date(2024, 5, 1), 1), (dt.date(2024, 5, 2), 206)]
    assert sorted(p.name for p in Path(cfg.history.table).glob("date=*")) == \
        ["date=2024-05-01", "date=2024-05-02"]

    # Running again with nothing new adds nothing; a late duplicate is still dropped.
    produce(kafka.bootstrap, [anon])
    assert run(spark, cfg) == 0
    assert ids_and_count(spark, cfg.history.table)[0] == 207


# ---- 1b: a table written before payload_json existed, read after the upgrade ------------------

@e2e
def test_a_table_written_before_payload_json_gets_the_column_after_the_upgrade(spark, kafka,
                                                                              tmp_path, monkeypatch):
    """Rows written before the column existed read it as NULL (through sink.query too), rows
    written after have it, compaction parses it into the old rows, and a catalog table defined
    before gains the column."""
    import dataclasses

    import pyarrow.parquet as pq

    from sink.history import catalog, schema
    from sink.history.compaction import compact
    from sink.history.manifest import Table
    t1 = int(dt.datetime(2024, 5, 2, 10, 0, tzinfo=UTC).timestamp() * 1000)

    def sensor(mid: str, temp: float, ms: int) -> dict:
        return {"message_id": mid, "topic": f"sensors/{mid}", "payload": json.dumps(
            {"temp": temp}).encode(), "client_id": "dev-1", "username": None, "qos": 1,
                "retain": False, "protocol": 5, "accepted_ms": ms}
    cfg = history_job(kafka.bootstrap, tmp_path, available_now=True)
    # the job as it was: no payload_json in its rows
    new_exprs = schema.history_select_exprs
    monkeypatch.setattr(schema, "history_select_exprs",
                        lambda: [e for e in new_exprs() if not e.endswith(" AS payload_json")])
    produce(kafka.bootstrap, [sensor("old-1", 20.5, t1), sensor("old-2", 30.5, t1 + 1)])
    assert run(spark, cfg) == 0
    monkeypatch.undo()
    old_files = list(Path(cfg.history.table).rglob("*.parquet"))
    assert old_files and all("payload_json" not in pq.read_schema(f).names for f in old_files)

    produce(kafka.bootstrap, [sensor("new-1", 40.5, t1 + 2)])
    assert run(spark, cfg) == 0   # the upgraded job, continuing from its checkpoint

    def shredded(f: Path) -> bool:  # payload_json's fields stored as typed Parquet columns
        return "typed_value" in str(pq.read_schema(f).field("payload_json").type)
    new_files = set(Path(cfg.history.table).rglob("*.parquet")) - set(old_files)
    # a micro-batch writes the column unshredded (cheaper per row); compaction shreds it
    assert new_files and not any(shredded(f) for f in new_files)
    sql = ("SELECT message_id, payload_json:temp::double AS t FROM messages "
           "WHERE topic LIKE 'sensors/%' ORDER BY message_id")
    rows = run_sql(spark, cfg.history.table, sql)
    assert [(r.message_id, r.t) for r in rows] == [("new-1", 40.5), ("old-1", None), ("old-2", None)]

    # the query CLI (a local session of its own) reads the mixed table the same way
    out = subprocess.run([sys.executable, "-m", "sink.query", "--local", "--table",
                          cfg.history.table, "--format", "json", sql], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert [json.loads(ln) for ln in out.stdout.splitlines()] == [
        {"message_id": "new-1", "t": 40.5}, {"message_id": "old-1", "t": None},
        {"message_id": "old-2", "t": None}]

    # compaction merges the closed day's files: the old rows get the column, parsed
    done = compact(spark, Table(cfg.history.table), now_ms=t1 + 3 * 86_400_000)
    assert done["tasks"] == 1
    live = Table(cfg.history.table).snapshot().files
    assert len(live) == 1 and shredded(Table(cfg.history.table).abs(live[0].path))
    rows = run_sql(spark, cfg.history.table, sql)
    assert [(r.message_id, r.t) for r in rows] == [("new-1", 40.5), ("old-1", 20.5), ("old-2", 30.5)]

    # a catalog table defined before the column (an external metastore keeps its definition)
    hist = dataclasses.replace(cfg.history, database="before_json")
    spark.sql("CREATE DATABASE IF NOT EXISTS before_json")
    spark.sql("CREATE TABLE before_json.messages (message_id string, topic string, "
              "payload binary, payload_text string, accepted_at timestamp, date date) "
              f"USING parquet LOCATION '{catalog.table_location(cfg.history.table)}'")
    try:
        catalog.register_in_session(spark, hist)
        got = spark.sql("SELECT message_id, payload_json:temp::double AS t FROM "
                        "before_json.messages WHERE payload_json:temp::double > 25 "
                        "ORDER BY message_id").collect()
        assert [(r.message_id, r.t) for r in got] == [("new-1", 40.5), ("old-2", 30.5)]
    finally:
        spark.sql("DROP DATABASE before_json CASCADE")   # an external table: the data stays


# ---- 2: SIGKILL mid-stream, restart from the checkpoint: no duplicates, no gaps ---------------

def _start_job(bootstrap: str, tmp_path: Path, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "sink.job", "--kafka-bootstrap", bootstrap,
           "--table", str(tmp_path / "history"), "--trigger-seconds", "1", "--source", "python",
           "--no-connect",  # no Spark Connect server on the fixed default port
           "--data-dir", str(tmp_path / "data"),  # not the checkout's ./data (its secrets)
           "--nice", "0"]   # niceness 10 starves it on a machine other work keeps busy
    out = open(log_path, "ab")
    # Own process group: SIGKILL then takes the JVM and the Python workers too (a crash).
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_group_gone(pgid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)


def _wait_for(predicate, timeout: float, what: str, log_path: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    tail = log_path.read_text(errors="replace")[-3000:] if log_path else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def _committed_rows(log_path: Path) -> int:
    import re
    return sum(int(n) for n in re.findall(r"batch \d+: (\d+) rows", log_path.read_text(errors="replace")))


@e2e
def test_restart_after_sigkill_no_duplicates_no_gaps(spark, kafka, tmp_path):
    n_total = 2400
    log_path = tmp_path / "job.log"
    table = str(tmp_path / "history")
    messages = [simple_message(i, "k") for i in range(n_total)]
    done, killed = threading.Event(), threading.Event()
    errors: list = []

    def background_producer():
        try:
            prod = producer(kafka.bootstrap)
            for start in range(0, n_total, 40):  # ~400 records/s
                chunk = messages[start:start + 40]
                for m in chunk:
                    m["accepted_ms"] = int(time.time() * 1000)
                produce(kafka.bootstrap, chunk, prod=prod)
                if start % 400 == 0:  # a retried send: same message id again
                    produce(kafka.bootstrap, chunk[:1], prod=prod)
                if start >= n_total // 2:
                    killed.wait(180)  # keep the second half coming across the crash
                time.sleep(0.1)
            prod.close()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    job = _start_job(kafka.bootstrap, tmp_path, log_path)
    try:
        _wait_for(lambda: "history job started" in log_path.read_text(errors="replace"),
                  120, "the job to start", log_path)
        writer = threading.Thread(target=background_producer, daemon=True)
        writer.start()
        # Let a few batches commit, then crash the job in the middle of the stream.
        _wait_for(lambda: _committed_rows(log_path) >= 300, 120, "first batches", log_path)
        assert not done.is_set(), "producer finished before the kill; slow it down"
        _kill_group(job, signal.SIGKILL)
        job.wait(30)
        _wait_group_gone(job.pid)
        killed.set()
        killed_at, _ = ids_and_count(spark, table)
        assert 0 < killed_at < n_total

        job = _start_job(kafka.bootstrap, tmp_path, log_path)
        writer.join(120)
        assert done.is_set() and not errors, errors
        _wait_for(lambda: ids_and_count(spark, table)[0] >= n_total, 180,
                  "all records in the table", log_path)
        time.sleep(3)  # a few more triggers: nothing more may appear
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, log_path.read_text(errors="replace")[-3000:]
    finally:
        if job.poll() is None:
            _kill_group(job, signal.SIGKILL)
            job.wait(30)
        _wait_group_gone(job.pid)

    count, ids = ids_and_count(spark, table)
    assert ids == {m["message_id"] for m in messages}  # no gaps
    assert count == n_total                             # no duplicates
    text = log_path.read_text(errors="replace")
    assert "history job stopped" in text
    assert "backlog" in text and "rows/s" in text

    # The command-line query tool sees the same table.
    out = subprocess.run(
        [sys.executable, "-m", "sink.query", "--table", table, "--format", "json",
         "SELECT count(*) AS n, count(DISTINCT message_id) AS ids FROM messages"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"n": n_total, "ids": n_total}


# ---- 3: the embedded Kafka restarts (loses its log: offsets go backwards) -----------------------

@e2e
def test_kafka_restart_offsets_go_backwards(spark, kafka, tmp_path):
    # A small per-trigger limit: several micro-batches per run (admission control).
    cfg = history_job(kafka.bootstrap, tmp_path, available_now=True, source="python",
                      max_records_per_trigger=30)
    base = int(time.time() * 1000)
    first = [simple_message(i, "before", base + i) for i in range(40)]
    produce(kafka.bootstrap, first)
    assert run(spark, cfg) == 0
    assert ids_and_count(spark, cfg.history.table)[0] == 40
    commits = [f for f in (Path(cfg.history.checkpoint_dir) / "commits").iterdir() if f.name.isdigit()]
    assert len(commits) >= 2  # 40 records, at most 30 per micro-batch
    # What the table holds, for the broker's spool (sink/history/commits.py): every offset, topic id
    from sink.history.commits import committed_path, read_committed
    done = read_committed(committed_path(cfg.history.table))
    assert done["batch_id"] == max(int(f.name) for f in commits)
    first_id = done["topics"][TOPIC]["topic_id"]
    assert first_id and sum(done["topics"][TOPIC]["offsets"].values()) == 40

    # Restart: the topic comes back empty and offsets start at 0 again. More records than
    # before, so the new log's offsets overtake the committed ones (detected by topic id).
    kafka.restart()
    second = [simple_message(i, "after", base + 1000 + i) for i in range(100)]
    produce(kafka.bootstrap, second)
    assert run(spark, cfg) == 0
    count, ids = ids_and_count(spark, cfg.history.table)
    assert count == 140
    assert ids == {m["message_id"] for m in first + second}
    done = read_committed(committed_path(cfg.history.table))  # offsets of the new log, its new id
    assert done["topics"][TOPIC]["topic_id"] not in (None, first_id)
    assert sum(done["topics"][TOPIC]["offsets"].values()) == 100

    # Restart again, fewer records than committed (the new end is below the committed start).
    kafka.restart()
    third = [simple_message(i, "again", base + 2000 + i) for i in range(3)]
    produce(kafka.bootstrap, third)
    assert run(spark, cfg) == 0
    count, ids = ids_and_count(spark, cfg.history.table)
    assert count == 143 and {m["message_id"] for m in third} <= ids
    # (sink.history.source logs a WARNING "... offsets went backwards ..." to the job's stderr.)


# ---- offset planning of the Python source (no Spark, no Kafka: fast) --------------------------

def test_source_offset_planning():
    from sink.history.source import KafkaRange, KafkaRanges, KafkaStreamReader, SourceOptions, _allocate
    r = KafkaStreamReader(SourceOptions.parse({"kafka.bootstrap.servers": "h:1",
                                               "subscribe": "a"}))
    same = {"a": "id1"}
    # normal: [start, end) per partition, empty ranges skipped; the end offset's ingest time
    assert r.partitions({"t": {"a": {"0": 5, "1": 7}}, "ids": same},
                        {"t": {"a": {"0": 9, "1": 7, "2": 3}}, "ids": same, "ts": 42}) == [
        KafkaRange("a", 0, 5, 9, False, 42), KafkaRange("a", 2, 0, 3, True, 42)]
    # end below start (log lost): read the new log from 0
    assert r.partitions({"t": {"a": {"0": 50}}, "ids": same},
                        {"t": {"a": {"0": 4}}, "ids": same, "ts": 1}) == [
        KafkaRange("a", 0, 0, 4, True, 1)]
    # topic re-created (new id) even though the new log is already longer: from 0
    assert r.partitions({"t": {"a": {"0": 5}}, "ids": same},
                        {"t": {"a": {"0": 8}}, "ids": {"a": "id2"}, "ts": 1}) == [
        KafkaRange("a", 0, 0, 8, True, 1)]
    # at most maxPartitions Spark tasks: ranges shared out by size, each read once
    r2 = KafkaStreamReader(SourceOptions.parse({"kafka.bootstrap.servers": "h:1",
                                                "subscribe": "a", "maxPartitions": "2"}))
    tasks = r2.partitions({"t": {"a": {}}, "ids": same},
                          {"t": {"a": {"0": 100, "1": 10, "2": 60, "3": 50}}, "ids": same, "ts": 1})
    assert len(tasks) == 2 and all(isinstance(t, KafkaRanges) for t in tasks)
    assert sorted(sum(x.end - x.start for x in t.ranges) for t in tasks) == [110, 110]
    assert sorted(x.partition for t in tasks for x in t.ranges) == [0, 1, 2, 3]
    # admission control shares the budget and never exceeds it
    assert _allocate([10, 0, 30], None) == [10, 0, 30]
    take = _allocate([10, 0, 30], 8)
    assert sum(take) == 8 and take[1] == 0 and all(t > 0 for i, t in enumerate(take) if i != 1)
    assert sum(_allocate([1, 1, 1, 1], 2)) == 2


def test_job_config(tmp_path):
    from sink.history.job import config_from_args
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[sink]\nbootstrap_servers = ""\nembedded_port = 9999\n'
                        'rules = [{ filter = "s/#", topic = "mqtt.s" }]\n'
                        '[history]\ntable = "/t/h"\ntrigger_seconds = 2\n'
                        'max_records_per_trigger = 100\n')
    cfg, _ = config_from_args(["--config", str(cfg_file), "--trigger-seconds", "7"])
    h = cfg.history
    assert (cfg.bootstrap, h.table, h.checkpoint_dir, h.trigger_seconds) == \
        ("127.0.0.1:9999", "/t/h", "/t/h_checkpoint", 7.0)
    assert cfg.topics == ["mqtt.messages", "mqtt.s"]
    assert cfg.kafka_options()["maxOffsetsPerTrigger"] == "100"
    cfg, _ = config_from_args(["--kafka-topic", "re:mqtt\\..*"])
    assert cfg.kafka_options()["subscribePattern"] == "mqtt\\..*"
    # TLS/SASL settings reach both readers: Spark's (kafka.<property>) and ours (kafka-python)
    cfg_file.write_text('[history.kafka]\n"security.protocol" = "SASL_SSL"\n'
                        '"ssl.cafile" = "/etc/ca.pem"\n"sasl.mechanism" = "PLAIN"\n'
                        '"ssl.check.hostname" = false\n"ssl.truststore.location" = "/etc/ts.jks"\n')
    cfg, _ = config_from_args(["--config", str(cfg_file)])
    opts = cfg.kafka_options()
    assert opts["kafka.security.protocol"] == "SASL_SSL" and opts["kafka.ssl.check.hostname"] == "false"
    from sink.history.source import SourceOptions
    conf = dict(SourceOptions.parse({k.lower(): v for k, v in opts.items()}).client_conf)
    assert conf == {"security_protocol": "SASL_SSL", "ssl_cafile": "/etc/ca.pem",
                    "sasl_mechanism": "PLAIN", "ssl_check_hostname": False}
    cfg_file.write_text('[history]\nsource = "spark"\n')
    from settings import ConfigError
    with pytest.raises(ConfigError, match="history.source = 'spark'.*must be one of 'auto'"):
        config_from_args(["--config", str(cfg_file)])
