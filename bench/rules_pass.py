"""A batch's stateless rules outside the job: the JVM's CPU per batch, as the JIT settles.

    PYTHONPATH=. .venv/bin/python bench/rules_pass.py [--rows 25000] [--windows 6]

Stages one batch of ``--rows`` readings as the history writer does (the job's own expressions,
schema.to_history, written unshredded and partitioned by date and hour), then runs the five
rules of bench/rules_bench.py's ``DISTINCT`` over it as the job does each batch (the staged
files shown as the rules' view, then one statement), in windows of 20 batches, alternating:

- ``subqueries``: every rule a subquery of its own (shared.union_sql, the job before the one pass);
- ``one pass``: the rules of the form SELECT ... FROM messages [WHERE ...] as one pass over the
  batch (shared.batch_sql with sink/history/rules/merge.py; all five rules here).

Prints per window the JVM's CPU per batch (all its threads, from /proc) and the part of it its
JIT compiler threads took: the JIT compiles Spark's planner for hundreds of batches, so the
first windows cost more. Both give the same rows (checked before timing).
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rules_bench import DISTINCT  # noqa: E402


def jvm_threads(pid: str) -> collections.Counter:
    """CPU seconds so far per kind of JVM thread (names without their numbers)."""
    out: collections.Counter = collections.Counter()
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            name = open(f"{task}/comm").read().strip()
            fields = open(f"{task}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[re.sub(r"[0-9]+", "#", name)] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=25_000, help="rows in the batch (5 s at 5,000 msg/s)")
    ap.add_argument("--windows", type=int, default=6, help="windows of 20 batches per way")
    a = ap.parse_args()
    import pyspark.sql.functions as F

    from settings.rules import RuleSpec
    from sink.history.job import PARQUET_OPTIONS
    from sink.history.rules.shared import BATCH_VIEW, BatchRule, BatchRules, batch_sql, staged_batch, union_sql
    from sink.history.schema import HEADER_COLUMNS, to_history
    from sink.history.spark import get_spark
    from sink.history.writer import HOUR_COLUMN
    spark = get_spark("rules-pass", log_level="ERROR")
    t0 = int(time.time() * 1000)
    kafka = spark.range(a.rows).selectExpr(   # bench/rules_bench.py's readings
        "CAST(concat('plant/d', id % 50) AS BINARY) AS key",
        "CAST(format_string('{\"seq\": %d, \"t\": %f, \"hot\": %s, \"temp\": %d}', id, "
        "1.7e9 + id / 1000.0, CASE WHEN id % 100 = 0 THEN 'true' ELSE 'false' END, 20 + id % 17) "
        "AS BINARY) AS value",
        "'mqtt.messages' AS topic", "CAST(id % 4 AS INT) AS partition", "id AS offset",
        f"timestamp_millis({t0} + id) AS timestamp", "0 AS timestampType",
        *[f"CAST(NULL AS BINARY) AS {col}" for _, col in HEADER_COLUMNS],
        "CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>) AS user_headers",
        f"timestamp_millis({t0} + id) AS ingested_at")
    staged = Path(tempfile.mkdtemp(prefix="rules-pass-"))
    try:
        spark.conf.set("spark.sql.variant.writeShredding.enabled", "false")   # as the stream writes
        w = to_history(kafka).withColumn(HOUR_COLUMN, F.hour("accepted_at")).write
        for k, v in PARQUET_OPTIONS.items():
            w = w.option(k, v)
        w.partitionBy("date", HOUR_COLUMN).parquet(str(staged / "out"))
        rules = [BatchRule(None, RuleSpec(f"r{i}", sql), None, BatchRules())
                 for i, sql in enumerate(DISTINCT)]

        def once(statement) -> list:
            staged_batch(spark, staged / "out").createOrReplaceTempView(BATCH_VIEW)
            return spark.sql(statement()).collect()
        ways = {"subqueries": lambda: union_sql(rules), "one pass": lambda: batch_sql(spark, rules)}
        rows = {k: sorted(map(tuple, once(f))) for k, f in ways.items()}
        assert rows["subqueries"] == rows["one pass"], "the two ways gave different rows"
        merged = sum(isinstance(r.arm, str) for r in rules)
        print(f"{a.rows} rows, {len(rules)} rules ({merged} in the one pass), "
              f"{len(rows['one pass'])} rows out", flush=True)
        pid = os.popen("pgrep -f org.apache.spark.deploy.SparkSubmit | head -1").read().strip()
        for window in range(a.windows):
            for name, statement in ways.items():
                before = jvm_threads(pid)
                for _ in range(20):
                    once(statement)
                after = jvm_threads(pid)
                total = sum(after.values()) - sum(before.values())
                jit = sum(after[k] - before.get(k, 0) for k in after if k.startswith("C#"))
                print(f"window {window} {name:>10}: {total / 20 * 1000:5.0f} ms of CPU per batch "
                      f"(JIT compiler {jit / 20 * 1000:3.0f})", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(staged, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
