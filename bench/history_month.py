"""A month of history at the job's cadence, in simulated time: does the table stay fast as it ages?

    .venv/bin/python bench/history_month.py                         # 30 days, 17,280 batches/day, 1.04M rows/day
    .venv/bin/python bench/history_month.py --days 3 --batches-per-day 1440 --rows-per-batch 700

Each simulated micro-batch (every 86,400 / batches-per-day seconds of simulated time) is
committed to the table exactly as the job commits one (sink/history/manifest.py: one file per
UTC hour it touches, moved into place, one version of the log), its rows written with pyarrow
instead of a Spark job (so a month of batches takes minutes, not days; the rows are the table's
columns). The job's compaction (sink/history/compaction.py, run with Spark as in the job) runs
after every simulated hour, as the job's maintenance thread would. The manifest's fsyncs are
skipped (the disk is not what is measured). Then it prints:

* files per closed day, and the bytes a query reads to plan (the newest
  _spark_metadata/<N>.compact), after day 1 and after the last day;
* the time of ``count(*)`` over one day and of a ``topic LIKE`` filter over one hour through
  Spark Connect (a server in this process, queried by ``python -m sink.query --connect``),
  on the last day's table;
* compaction throughput (MB of input per second) and its CPU (this process and its JVM), as a
  share of the two cores over the simulated day, and against the rate 25,000 msg/s needs.

Times need quiet cores: on a shared machine say so next to the figures.

``--json-rows N`` measures ``payload_json`` (the payload parsed as JSON, a VARIANT) instead:
N rows of one day (19 in 20 on ``sensors/...`` with a JSON object payload, the rest on
``cmd/...`` with plain text), made from Kafka-shaped rows by the job's own expressions
(schema.to_history) and written as compaction writes a closed day (sorted by accepted_at, the
job's Parquet options; Spark 4 shreds the variant: each field seen in the rows becomes a
Parquet column). It prints the CPU (JVM) of writing the rows with and without the column, then
through Spark Connect: ``count(*)``, a ``payload_json:temp::double > X`` count (and the same
with ``try_cast(... AS double)``, which the job reads as the typed field (its variant rule),
with ``variant_get(..., 'decimal(18,2)')``, the type the field is shredded as, and with
``try_parse_json(payload_text)`` as before the column), and a one-hour average by topic.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

UTC = dt.timezone.utc
DAY_MS = 86_400_000


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError):
            pass
    return total


def jvm_pids() -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                st = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            if int(st.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.append(int(p))
    return out


_TEMPLATE: dict = {}


def make_rows(start_ms: int, n: int, seq: int, topics: int):
    """n rows of the table's columns (without `date`), accepted evenly over the 5 s from
    start_ms: the columns that vary per row are built with numpy, the rest come from a template."""
    import numpy as np
    import pyarrow as pa
    key = (n, topics)
    if key not in _TEMPLATE:
        topic = [f"site{i % 10}/dev{i % topics}/temp" for i in range(n)]
        rnd = random.Random(n)  # readings that vary: compressed about as devices' data does
        payload = [f'{{"v":{rnd.uniform(-40, 60):.3f},"u":"C"}}'.encode() for _ in range(n)]
        _TEMPLATE[key] = {
            "topic": pa.array(topic), "payload": pa.array(payload),
            "payload_text": pa.array([p.decode() for p in payload]),
            "qos": pa.array([1] * n, pa.int32()), "retain": pa.array([False] * n),
            "client_id": pa.array([t.split("/")[1] for t in topic]),
            "username": pa.array(["svc"] * n), "protocol": pa.array([5] * n, pa.int32()),
            "kafka_topic": pa.array(["mqtt.messages"] * n),
            "kafka_partition": pa.array([i % 4 for i in range(n)], pa.int32()),
            "content_type": pa.nulls(n, pa.string()), "payload_format": pa.nulls(n, pa.int32()),
            "response_topic": pa.nulls(n, pa.string()),
            "correlation_data": pa.nulls(n, pa.binary()),
            "message_expiry": pa.nulls(n, pa.int64()),
            "user_properties": pa.array([[]] * n, pa.list_(pa.struct([("key", pa.string()),
                                                                     ("value", pa.string())]))),
        }
    t = _TEMPLATE[key]
    offsets = np.arange(seq, seq + n, dtype=np.int64)
    at = pa.array((start_ms + np.arange(n, dtype=np.int64) * 5000 // max(n, 1)) * 1000,
                  pa.timestamp("us", "UTC"))
    ids = pa.array(np.char.add("bench-", offsets.astype(str)))
    cols = {"message_id": ids, "topic": t["topic"], "payload": t["payload"],
            "payload_text": t["payload_text"], "qos": t["qos"], "retain": t["retain"],
            "client_id": t["client_id"], "username": t["username"], "protocol": t["protocol"],
            "accepted_at": at, "kafka_topic": t["kafka_topic"],
            "kafka_partition": t["kafka_partition"], "kafka_offset": pa.array(offsets),
            "ingested_at": at}
    cols.update({k: t[k] for k in ("content_type", "payload_format", "response_topic",
                                   "correlation_data", "message_expiry", "user_properties")})
    return pa.table(cols)


def query_time(url: str, sql: str) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-m", "sink.query", "--connect", url, "-v",
                          "--format", "csv", sql], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    import re
    m = re.search(r"answered by Spark Connect in ([0-9.]+) s", out.stderr)
    return (float(m.group(1)) if m else float("nan")), out.stdout.strip().splitlines()[-1:]


def json_rows(spark, n: int, day: str):
    """n history rows of one UTC day, through the job's expressions (schema.to_history)."""
    from sink.history.schema import HEADER_COLUMNS, to_history
    step = 86_400_000 // n
    t0 = int(dt.datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp() * 1000)
    kafka = spark.range(n).selectExpr(
        "CAST(CASE WHEN id % 20 = 0 THEN concat('cmd/dev', id % 1000, '/set') "
        "ELSE concat('sensors/dev', id % 1000, '/env') END AS BINARY) AS key",
        "CAST(CASE WHEN id % 20 = 0 THEN 'reboot' ELSE format_string("
        "'{\"temp\":%.2f,\"hum\":%d,\"bat\":%d,\"fw\":\"1.%d\"}', "
        "CAST((id * 7919 % 10000) / 100.0 - 20 AS DOUBLE), id % 100, id % 101, id % 9) END "
        "AS BINARY) AS value",
        "'mqtt.messages' AS topic", "CAST(id % 4 AS INT) AS partition", "id AS offset",
        f"timestamp_millis({t0} + id * {step}) AS timestamp", "0 AS timestampType",
        *[f"CAST(NULL AS BINARY) AS {col}" for _, col in HEADER_COLUMNS],
        "CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>) AS user_headers",
        f"timestamp_millis({t0} + id * {step}) AS ingested_at")
    return to_history(kafka)


def json_bench(args: argparse.Namespace) -> int:
    """--json-rows: the payload_json column's write cost and query times (module docstring)."""
    from kafka_client.embedded import free_port
    from sink.history.catalog import create_table_sql
    from sink.history.compaction import LEVEL_DAY
    from sink.history.job import PARQUET_OPTIONS
    from sink.history.manifest import Change, Table, staged_files
    from sink.history.spark import get_spark
    base = Path(args.table or tempfile.mkdtemp(prefix="history-json-"))
    port = free_port()
    from sink.history import guard
    from sink.history.job import guard_build_root
    spark = get_spark("history-json", conf={"spark.connect.grpc.binding.address": "127.0.0.1",
                                            "spark.connect.grpc.binding.port": str(port),
                                            # the job's variant field rule, as it runs
                                            **guard.variant_conf(guard_build_root(None))})
    day, n = "2024-05-01", args.json_rows

    def write(df, root: Path) -> tuple[float, float]:
        """df -> one committed version of the table at root, as compaction writes a day."""
        shutil.rmtree(root, ignore_errors=True)
        table = Table(root)
        staging = table.staging("bench")
        c0, w0 = cpu_seconds([os.getpid()] + jvm_pids()), time.monotonic()
        w = (df.repartitionByRange(2, "accepted_at")
             .sortWithinPartitions("accepted_at", "kafka_partition", "kafka_offset").write)
        for k, v in PARQUET_OPTIONS.items():
            w = w.option(k, v)
        w.partitionBy("date").parquet(str(staging / "out"))
        files = table.place(staged_files(staging / "out"), "c00000001", None, LEVEL_DAY)
        table.commit(Change(op="compact", add=files))
        shutil.rmtree(staging, ignore_errors=True)
        return time.monotonic() - w0, cpu_seconds([os.getpid()] + jvm_pids()) - c0
    rows = json_rows(spark, n, day)
    reuse = args.json_reuse and Table(base / "history").exists()
    if not reuse:
        with_s, with_cpu = write(rows, base / "history")
        mb = sum(f.stat().st_size for f in (base / "history").rglob("*.parquet")) / 1e6
        print(f"write {n} rows with payload_json: {with_s:.0f} s, {with_cpu:.0f} CPU-s "
              f"({with_cpu / n * 1e6:.1f} us/row); {mb:.0f} MB", flush=True)
    if not args.json_no_baseline and not reuse:
        without_s, without_cpu = write(rows.drop("payload_json"), base / "without")
        mb0 = sum(f.stat().st_size for f in (base / "without").rglob("*.parquet")) / 1e6
        print(f"without it: {without_s:.0f} s, {without_cpu:.0f} CPU-s ({without_cpu / n * 1e6:.1f}"
              f" us/row), {mb0:.0f} MB: the column costs {(with_cpu - without_cpu) / n * 1e6:.1f} "
              "CPU-us per row", flush=True)
    spark.sparkContext._jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(
        spark.sparkContext._jsc.sc())
    spark.sql(create_table_sql(str(base / "history")))  # the job's catalog table
    url = f"sc://127.0.0.1:{port}"
    query_time(url, "SELECT 1")  # the first query of a session warms it
    hour = f"accepted_at >= TIMESTAMP '{day} 13:00:00' AND accepted_at < TIMESTAMP '{day} 14:00:00'"
    for label, sql in [
            ("count(*)", "SELECT count(*) FROM messages"),
            ("temp > 30", "SELECT count(*) FROM messages WHERE payload_json:temp::double > 30"),
            ("temp > 30 (sensors/%)", "SELECT count(*) FROM messages WHERE topic LIKE "
                                      "'sensors/%' AND payload_json:temp::double > 30"),
            ("temp > 30 (try_cast)", "SELECT count(*) FROM messages WHERE "
             "try_cast(payload_json:temp AS double) > 30"),
            ("temp > 30 (variant_get as shredded)", "SELECT count(*) FROM messages WHERE "
             "variant_get(payload_json, '$.temp', 'decimal(18,2)') > 30"),
            ("temp > 30 (variant_get double)", "SELECT count(*) FROM messages WHERE "
             "variant_get(payload_json, '$.temp', 'double') > 30"),
            ("temp > 30 (parsed at query time)", "SELECT count(*) FROM messages WHERE "
             "try_parse_json(payload_text):temp::double > 30"),
            ("one-hour average by topic", "SELECT topic, avg(payload_json:temp::double) AS t "
             f"FROM messages WHERE {hour} GROUP BY topic ORDER BY topic"),
            ("one-hour average by topic (try_cast)", "SELECT topic, avg(try_cast(payload_json:temp "
             f"AS double)) AS t FROM messages WHERE {hour} GROUP BY topic ORDER BY topic"),
            ("one-hour average by topic (variant_get double)", "SELECT topic, "
             "avg(variant_get(payload_json, '$.temp', 'double')) AS t FROM messages WHERE "
             f"{hour} GROUP BY topic ORDER BY topic"),
            ("one-hour average by topic (date given)", "SELECT topic, avg(payload_json:temp::double)"
             f" AS t FROM messages WHERE date = DATE '{day}' AND {hour} GROUP BY topic ORDER BY topic")]:
        best, out = min(query_time(url, sql) for _ in range(args.repeat))
        print(f"  {label}: {best:.2f} s (best of {args.repeat}, Spark Connect) -> {out[:1]}",
              flush=True)
    # in this process's session: the filter as above, and the shredded column read as the plain
    # struct it is in the files (the file's schema given, variant annotation ignored): what
    # Spark's reading of a variant adds to reading the column
    filt = "variant_get(payload_json, '$.temp', 'decimal(18,2)') > 30"

    def plain_struct() -> int:
        spark.conf.set("spark.sql.parquet.ignoreVariantAnnotation", "true")
        try:
            return spark.read.schema(
                "payload_json struct<metadata: binary, value: binary, typed_value: "
                "struct<temp: struct<value: binary, typed_value: decimal(18,2)>>>").parquet(
                str(base / "history" / f"date={day}")).where(
                "payload_json.typed_value.temp.typed_value > 30").count()
        finally:
            spark.conf.set("spark.sql.parquet.ignoreVariantAnnotation", "false")
    for label, count in [("temp > 30 (variant_get, direct session)",
                          lambda: spark.sql(f"SELECT count(*) FROM messages WHERE {filt}").collect()),
                         ("temp > 30 (the shredded column as a plain struct, direct session)",
                          plain_struct)]:
        times = []
        for _ in range(args.repeat + 1):   # the first run plans and warms
            t0 = time.monotonic()
            got = count()
            times.append(time.monotonic() - t0)
        print(f"  {label}: {min(times[1:]):.2f} s (best of {args.repeat}) -> {got}", flush=True)
    print(f"rows {n}; table {base / 'history'} (the shared machine's load: {os.getloadavg()})")
    spark.stop()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json-rows", type=int, default=0, metavar="N",
                    help="measure the payload_json column over N rows instead (see above)")
    ap.add_argument("--repeat", type=int, default=3, help="--json-rows: runs per query")
    ap.add_argument("--json-reuse", action="store_true",
                    help="--json-rows: query the table --table holds from an earlier run")
    ap.add_argument("--json-no-baseline", action="store_true",
                    help="--json-rows: do not write the rows without the column too")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--batches-per-day", type=int, default=17_280)
    ap.add_argument("--rows-per-batch", type=int, default=60)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--table", help="directory (default: a temporary one)")
    ap.add_argument("--check-minutes", type=int, default=60,
                    help="simulated minutes between compaction passes (the job: 1; hourly keeps "
                         "the number of Spark jobs down: an open hour then holds up to an "
                         "hour of batch files)")
    args = ap.parse_args()
    if args.json_rows:
        return json_bench(args)
    import pyarrow.parquet as pq

    import sink.history.manifest as manifest
    manifest._fsync_dir = lambda path: None        # the disk is not what is measured

    def _write(path, raw):
        with open(path, "wb") as f:
            f.write(raw)
    manifest._write_synced = _write
    from kafka_client.embedded import free_port
    from sink.history.compaction import Policy, plan, run_task
    from sink.history.job import PARQUET_OPTIONS
    from sink.history.manifest import Change, Table
    from sink.history.spark import get_spark

    root = Path(args.table or tempfile.mkdtemp(prefix="history-month-")) / "history"
    port = free_port()
    spark = get_spark("history-month", conf={"spark.connect.grpc.binding.address": "127.0.0.1",
                                             "spark.connect.grpc.binding.port": str(port)})
    table = Table(root)
    root.mkdir(parents=True, exist_ok=True)
    policy = Policy()
    step_ms = DAY_MS // args.batches_per_day
    t0 = int(dt.datetime(2024, 5, 1, tzinfo=UTC).timestamp() * 1000)
    seq = 0
    comp = {"seconds": 0.0, "cpu": 0.0, "bytes": 0, "tasks": 0, "rows": 0}
    per_day = []
    wall0 = time.monotonic()

    def compaction_pass(now_ms: int) -> None:
        """What the job's maintenance thread does at that (simulated) time, measured."""
        for task in plan(table.snapshot(), now_ms, policy):
            c0, w0 = cpu_seconds([os.getpid()] + jvm_pids()), time.monotonic()
            if run_task(spark, table, task, policy, PARQUET_OPTIONS):
                comp["tasks"] += 1
                comp["bytes"] += task.bytes
                comp["rows"] += task.rows
            comp["seconds"] += time.monotonic() - w0
            comp["cpu"] += cpu_seconds([os.getpid()] + jvm_pids()) - c0
    for day in range(args.days):
        for b in range(args.batches_per_day):
            now = t0 + day * DAY_MS + b * step_ms
            rows = make_rows(now, args.rows_per_batch, seq, args.topics)
            seq += args.rows_per_batch
            staging = table.staging(f"b{seq}")
            date = dt.datetime.fromtimestamp(now / 1000, UTC)
            out = staging / f"date={date.date()}" / f"_h={date.hour}"
            out.mkdir(parents=True)
            pq.write_table(rows, out / "part-0.parquet", compression="snappy")
            files = table.place(manifest.staged_files(staging), f"b{seq:08d}", seq, 0)
            table.commit(Change(op="append", add=files, stream={"id": "bench", "batch": seq}))
            shutil.rmtree(staging, ignore_errors=True)
            if (b + 1) % max(1, args.batches_per_day * args.check_minutes // 1440) == 0:
                compaction_pass(now + step_ms)
        # the day is over (and closed once the grace has passed): the next pass compacts it
        end = t0 + (day + 1) * DAY_MS + policy.grace_ms
        compaction_pass(end)
        snap = table.snapshot()
        date = str(dt.datetime.fromtimestamp((t0 + day * DAY_MS) / 1000, UTC).date())
        files = [f for f in snap.files if f.date == date]
        log_file = table.spark_log / f"{snap.id}.compact"
        per_day.append((date, len(files), sum(f.rows for f in files), sum(f.size for f in files),
                        log_file.stat().st_size, len(snap.files)))
        print(f"day {day + 1} ({date}): {len(files)} file(s), {per_day[-1][2]} rows, "
              f"{per_day[-1][3] / 1e6:.1f} MB; plan reads {per_day[-1][4]} bytes "
              f"({per_day[-1][5]} live files); {time.monotonic() - wall0:.0f} s so far",
              flush=True)
    spark.sparkContext._jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(
        spark.sparkContext._jsc.sc())
    spark.sql(f"CREATE TABLE IF NOT EXISTS messages USING parquet LOCATION '{root}'")
    url = f"sc://127.0.0.1:{port}"
    last = per_day[-1][0]
    query_time(url, "SELECT 1")  # the first query of a session warms it
    day_s, day_out = min(query_time(url, f"SELECT count(*) FROM messages WHERE date = DATE '{last}'")
                         for _ in range(3))
    hour_s, hour_out = min(query_time(
        url, f"SELECT count(*) FROM messages WHERE date = DATE '{last}' AND topic LIKE 'site3/%' "
             f"AND accepted_at >= TIMESTAMP '{last} 13:00:00' AND accepted_at < TIMESTAMP "
             f"'{last} 14:00:00'") for _ in range(3))
    first = per_day[0]
    print("\nsummary")
    print(f"  files per closed day: day 1 {first[1]}, day {args.days} {per_day[-1][1]}")
    print(f"  metadata read to plan a query: after day 1 {first[4]} bytes, after day {args.days} "
          f"{per_day[-1][4]} bytes ({per_day[-1][5]} live files)")
    print(f"  count(*) over one day ({day_out}): {day_s:.2f} s; topic LIKE over one hour "
          f"({hour_out}): {hour_s:.2f} s (best of 3, through Spark Connect)")
    mb = comp["bytes"] / 1e6
    rows_in = comp["rows"]
    print(f"  compaction: {comp['tasks']} tasks, {mb:.0f} MB ({rows_in} rows) in "
          f"{comp['seconds']:.0f} s = {mb / max(comp['seconds'], 1e-9):.1f} MB/s, "
          f"{rows_in / max(comp['seconds'], 1e-9):.0f} rows/s; CPU {comp['cpu']:.0f} s "
          f"({comp['cpu'] / args.days:.0f} s per simulated day: "
          f"{comp['cpu'] / args.days / (86400 * 2) * 100:.3f}% of two cores at this rate)")
    per_msg = per_day[-1][3] / max(per_day[-1][2], 1)
    per_row = comp["cpu"] / max(rows_in, 1)
    print(f"  at 25,000 msg/s ({25000 * per_msg / 1e6:.1f} MB/s of Parquet, {per_msg:.0f} "
          f"bytes/row): each row is rewritten about twice (hour, day): "
          f"{2 * 25000 * per_row:.2f} CPU-s/s = {2 * 25000 * per_row / 2 * 100:.0f}% of two "
          f"cores, at {per_row * 1e6:.1f} CPU-us per row rewritten (fixed costs per task "
          "included: an upper bound)")
    print(f"  rows {seq} in {args.days} days; wall {time.monotonic() - wall0:.0f} s; table {root}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
