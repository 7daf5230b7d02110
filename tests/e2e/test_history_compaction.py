"""Compaction, retention and `python -m sink.maintain` on a real table (Spark + Tansu): a query
through the table's log sees every message exactly once before, during and after compaction, and
after a SIGKILL at each step of a compaction or of a micro-batch's commit; the progress file the
broker's spool reads (keep_until = "history") is unchanged by compaction."""
from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sink.history.commits import committed_path, read_committed
from sink.history.job import Job, run
from sink.history.maintenance import Settings, maintain_once, open_table
from sink.history.manifest import Table
from tests.e2e.test_spark_history import produce, simple_message

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc
N_PER_HOUR = 60
HOURS = [dt.datetime(2024, 5, 1, h, 10, tzinfo=UTC) for h in (9, 10, 11)] + \
        [dt.datetime(2024, 5, 2, 0, 30, tzinfo=UTC)]


def messages() -> list[dict]:
    out = []
    for k, start in enumerate(HOURS):
        base = int(start.timestamp() * 1000)
        out += [simple_message(k * N_PER_HOUR + i, "c", base + i * 1000) for i in range(N_PER_HOUR)]
    return out


def count_ids(spark, table: str) -> tuple[int, int]:
    """(rows, distinct ids) through the table's log, as any Spark reader sees it."""
    from sink.history.schema import HISTORY_SCHEMA
    r = spark.read.schema(HISTORY_SCHEMA).parquet(table) \
        .selectExpr("count(*) AS n", "count(DISTINCT message_id) AS ids").collect()[0]
    return r.n, r.ids


def files_per_day(table: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in Table(table).snapshot().files:
        out[f.date] = out.get(f.date, 0) + 1
    return out


def env_for(crash_at: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("SINK_HISTORY_CRASH_AT", None)
    if crash_at:
        env["SINK_HISTORY_CRASH_AT"] = crash_at
    return env


@pytest.fixture(scope="module")
def small_files_table(tmp_path_factory, spark):
    """A table of 240 messages over three hours of 2024-05-01 and one of 05-02, written by the
    job 25 records a micro-batch: many small files. Copied by each test."""
    from kafka_client.embedded import EmbeddedKafka
    tmp = tmp_path_factory.mktemp("base")
    kafka = EmbeddedKafka(log_file=str(tmp / "tansu.log"))
    kafka.start()
    try:
        produce(kafka.bootstrap, messages())
        cfg = Job.of(bootstrap=kafka.bootstrap, table=str(tmp / "history"), trigger_seconds=1,
                        available_now=True, source="python", max_records_per_trigger=25)
        assert run(spark, cfg) == 0
    finally:
        kafka.stop()
    return tmp


def copy_table(base: Path, dest: Path) -> str:
    shutil.copytree(base / "history", dest / "history", symlinks=True)
    shutil.copytree(base / "history_checkpoint", dest / "history_checkpoint", symlinks=True)
    return str(dest / "history")


def test_maintain_compacts_closed_days_once_each_and_is_idempotent(spark, small_files_table,
                                                                   tmp_path):
    table = copy_table(small_files_table, tmp_path)
    n = len(messages())
    before = files_per_day(table)
    assert before["2024-05-01"] >= 6 and count_ids(spark, table) == (n, n)
    progress = read_committed(committed_path(table))
    # as of 11:30 on 05-01: hours 9 and 10 are closed (one file each), 11 is open
    out = subprocess.run([sys.executable, "-m", "sink.maintain", "--table", table,
                          "--as-of", "2024-05-01T11:30:00Z"], cwd=ROOT, env=env_for(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "compacted" in out.stdout and "compacted nothing" not in out.stdout
    assert "in hours or days still open" in out.stdout  # hour 11, and why it waits
    hours = {}
    for f in Table(table).snapshot().files:
        hours.setdefault((f.date, f.hour), []).append(f.level)
    assert hours[("2024-05-01", 9)] == [1] and hours[("2024-05-01", 10)] == [1]
    assert len(hours[("2024-05-01", 11)]) > 1  # still open
    assert count_ids(spark, table) == (n, n)
    # now: every day closed, one file each
    settings = Settings()
    t = open_table(spark, table, None)
    maintain_once(spark, t, settings)
    assert files_per_day(table) == {"2024-05-01": 1, "2024-05-02": 1}
    assert count_ids(spark, table) == (n, n)
    version = t.snapshot().id
    again = maintain_once(spark, t, settings)        # idempotent: nothing left to do
    assert again["compaction"]["tasks"] == 0 and t.snapshot().id == version
    # compaction changed no Kafka offset the broker's spool relies on
    assert read_committed(committed_path(table))["topics"] == progress["topics"]
    # a compacted file is sorted by accepted_at: an hour's filter skips the others' row groups
    rows = spark.read.parquet(table).where("accepted_at >= '2024-05-01 10:00:00' AND "
                                          "accepted_at < '2024-05-01 11:00:00'").count()
    assert rows == N_PER_HOUR


COMPACT_STEPS = ["compact:after-write", "compact:after-place", "compact:before-manifest",
                 "compact:after-manifest", "compact:after-spark-log"]


@pytest.mark.parametrize("step", COMPACT_STEPS)
def test_a_compaction_killed_at_any_step_loses_and_doubles_nothing(spark, small_files_table,
                                                                   tmp_path, step):
    table = copy_table(small_files_table, tmp_path)
    n = len(messages())
    before = Table(table).snapshot()
    proc = subprocess.run([sys.executable, "-m", "sink.maintain", "--table", table],
                          cwd=ROOT, env=env_for(step), capture_output=True, text=True,
                          timeout=900, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    after = Table(table).snapshot()
    committed = step in ("compact:after-manifest", "compact:after-spark-log")
    assert (after.id > before.id) == committed
    # what every Spark reader sees right after the crash: each message once
    assert count_ids(spark, table) == (n, n)
    # the next writer (the job or sink.maintain) finishes the work
    t = open_table(spark, table, None)
    maintain_once(spark, t, Settings())
    assert count_ids(spark, table) == (n, n)
    assert files_per_day(table) == {"2024-05-01": 1, "2024-05-02": 1}
    # output of the killed run that was never committed is found as left-over, and only that
    known = t.snapshot().paths | {r.path for r in t.snapshot().removed}
    stray = [p for p in Path(table).glob("date=*/*.parquet")
             if p.relative_to(table).as_posix() not in known]
    assert bool(stray) == (step in ("compact:after-place", "compact:before-manifest"))
    left = t.orphans(min_age_ms=0)
    assert sorted(p for p in left if "_staging" not in p.parts) == sorted(stray)
    assert any("_staging" in p.parts for p in left)  # the killed run's staging directory
    assert t.delete_orphans(min_age_ms=0) == len(left)
    assert count_ids(spark, table) == (n, n)


APPEND_STEPS = ["append:after-write", "append:after-place", "append:before-manifest",
                "append:after-manifest", "append:after-spark-log", "append:after-commit"]


@pytest.mark.parametrize("step", APPEND_STEPS)
def test_a_micro_batch_killed_at_any_step_is_written_once(spark, kafka, tmp_path, step):
    """The job SIGKILLed inside its first micro-batch's commit (after-commit: our version is
    committed, Spark's checkpoint is not, so the batch runs again): after a restart the table
    holds every message once."""
    msgs = [simple_message(i, "a") for i in range(120)]
    produce(kafka.bootstrap, msgs)
    table = str(tmp_path / "history")
    cmd = [sys.executable, "-m", "sink.job", "--kafka-bootstrap", kafka.bootstrap, "--table",
           table, "--data-dir", str(tmp_path), "--source", "python", "--available-now", "--no-connect",
           "--nice", "0"]  # niceness 10 starves it on a machine other work keeps busy
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(step), capture_output=True, text=True,
                          timeout=900, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    n, ids = count_ids(spark, table) if Path(table, "_spark_metadata").is_dir() else (0, 0)
    assert n == ids and n in (0, 120)
    cfg = Job.of(bootstrap=kafka.bootstrap, table=table, available_now=True, source="python")
    assert run(spark, cfg) == 0
    assert count_ids(spark, table) == (120, 120)
    # and the progress file covers all of it
    done = read_committed(committed_path(table))
    assert sum(done["topics"]["mqtt.messages"]["offsets"].values()) == 120


def test_retention_drops_old_days_by_command(spark, small_files_table, tmp_path):
    table = copy_table(small_files_table, tmp_path)
    # as of 2024-05-03 12:00 with 1 day kept: 05-01 has expired (its end is 36 h back), 05-02 not
    out = subprocess.run([sys.executable, "-m", "sink.maintain", "--table", table,
                          "--as-of", "2024-05-03T12:00:00Z", "--retention", "1d"],
                         cwd=ROOT, env=env_for(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dropped 1 day(s)" in out.stdout
    assert count_ids(spark, table) == (N_PER_HOUR, N_PER_HOUR)
    assert set(files_per_day(table)) == {"2024-05-02"}
    dates = spark.read.parquet(table).select("date").distinct().collect()
    assert [r.date for r in dates] == [dt.date(2024, 5, 2)]


def test_a_replay_reader_reads_a_topic_filter_from_a_time_in_order(spark, small_files_table,
                                                                   tmp_path):
    """sink.history.reader (what a replay over MQTT reads): the rows of a topic filter from a
    time, each once, in accepted_at order, before and after compaction."""
    from sink.history.reader import read_history
    table = copy_table(small_files_table, tmp_path)
    since = int(dt.datetime(2024, 5, 1, 10, 10, 30, tzinfo=UTC).timestamp() * 1000)  # mid-hour
    want = [r.message_id for r in spark.read.parquet(table).where(
        f"topic LIKE 'devices/%/temp' AND client_id = 'dev-1' AND "
        f"accepted_at >= timestamp_millis({since})").orderBy("accepted_at").collect()]
    assert want

    def got():
        out = []
        for b in read_history(table, "devices/d1/+", since, columns=["message_id", "topic",
                                                                        "accepted_at"]):
            out += b.column("message_id").to_pylist()
        return out
    assert got() == want
    maintain_once(spark, open_table(spark, table, None), Settings())
    assert got() == want
    until = int(dt.datetime(2024, 5, 1, 11, 0, tzinfo=UTC).timestamp() * 1000)
    part = [m for b in read_history(table, "devices/d1/temp", since, until)
            for m in b.column("message_id").to_pylist()]
    assert part and part == want[:len(part)] and len(part) < len(want)
