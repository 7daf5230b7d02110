"""The floor Spark itself sets for a cold start and an idle stack, with none of the project's code
on the path: what `bench/cold_start.py` measures, minus the broker, Kafka and the history job.

    .venv/bin/python bench/spark_floor.py [--source python|rate] [--idle 90] [--java-opts "..."]

One Python process starts a local Spark session (the job's JVM settings, `sink/history/spark.py`
JOB_LOCAL_CONF, without its class-data archive unless `--java-opts` names one), starts Spark
Connect in it, and runs a streaming query from a source that has one row at once into a Parquet
directory, one-second trigger, as the history job does:

* `--source python` (the default): a Python data source (`pyspark.sql.datasource`), the kind the
  job reads Kafka with here (the spark-sql-kafka connector is not installable on this machine);
* `--source rate`: Spark's built-in `rate` source, all in the JVM: what a job with the Kafka
  connector would start like.

It prints when each step was reached, in seconds from the start of this script: the session
ready, Spark Connect started, the streaming query started, its first batch with the row
committed, and a fresh Spark Connect client process answering a count of the directory. Then,
after `--idle` seconds, the resident memory of the JVM and of every process under this one
(bench/job_footprint.py's tree). Needs quiet cores: the figures are start-up CPU work.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import free_port  # noqa: E402  (beside this script)
from job_footprint import show, tree  # noqa: E402

from sink.history.spark import JOB_LOCAL_CONF  # noqa: E402  (settings only, not the job)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=("python", "rate"), default="python")
    ap.add_argument("--idle", type=float, default=90.0,
                    help="seconds to wait after the query before measuring memory (Spark ends a "
                         "Python worker idle for a minute)")
    ap.add_argument("--java-opts", default=JOB_LOCAL_CONF["spark.driver.extraJavaOptions"],
                    help="the JVM's options (default: the history job's, without its archive)")
    a = ap.parse_args()
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:7.2f} s  {what}", flush=True)

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers: this interpreter (its venv)
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    mark("pyspark imported")
    port = free_port("127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName("spark-floor")
    for k, v in {**JOB_LOCAL_CONF, "spark.driver.extraJavaOptions": a.java_opts,
                 "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1",
                 "spark.connect.grpc.binding.address": "127.0.0.1",
                 "spark.connect.grpc.binding.port": str(port)}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    mark("session ready (JVM and SparkContext)")
    jvm: Any = spark.sparkContext._jvm
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    mark(f"Spark Connect on port {port}")

    class OneRow(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"at": 0}

        def latestOffset(self, start: dict, limit: object) -> dict:
            return {"at": 1}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)] if start["at"] < end["at"] else []

        def read(self, partition: InputPartition) -> Iterator[tuple]:
            yield ("sensors/1/temp", b"21.5", 1)

        def commit(self, end: dict) -> None:
            pass

    class One(DataSource):
        @classmethod
        def name(cls) -> str:
            return "one_row"

        def schema(self) -> str:
            return "topic string, payload binary, qos int"

        def streamReader(self, schema: object) -> DataSourceStreamReader:
            return OneRow()

    tmp = tempfile.mkdtemp(prefix="spark-floor-")
    try:
        if a.source == "python":
            spark.dataSource.register(One)
            src = spark.readStream.format("one_row").load()
        else:
            src = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        q = (src.writeStream.format("parquet").option("checkpointLocation", f"{tmp}/checkpoint")
             .option("path", f"{tmp}/table").trigger(processingTime="1 second").start())
        mark(f"streaming query started ({a.source} source)")
        while not any(p.get("numInputRows") for p in q.recentProgress):
            if q.exception() is not None:
                raise SystemExit(f"the query failed: {q.exception()}")
            time.sleep(0.02)
        first = next(p for p in q.recentProgress if p.get("numInputRows"))
        mark(f"first batch with rows committed (batch {first['batchId']} took "
             f"{first['batchDuration']} ms)")
        out = subprocess.run([sys.executable, "-c",
                              "import sys; from pyspark.sql import SparkSession; "
                              f"s = SparkSession.builder.remote('sc://127.0.0.1:{port}').getOrCreate(); "
                              f"print(s.read.parquet(sys.argv[1]).count())", f"{tmp}/table"],
                             capture_output=True, text=True, timeout=120)
        if out.returncode:
            raise SystemExit(f"the Spark Connect client failed: {out.stderr[-1000:]}")
        mark(f"a fresh Spark Connect client counted {out.stdout.strip()} rows")
        time.sleep(a.idle)  # the stream still running, without new rows: the job's idle state
        show(f"idle {a.idle:.0f} s after the query (this process's tree: driver, JVM, workers)",
             os.getpid(), tree(os.getpid()))
        q.stop()
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
