"""One place that builds the SparkSession used by the history job, sink.query and the tests.

Local mode pitfalls handled here (all seen on our machines):
- Python workers must run *this* interpreter (PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON), otherwise
  Spark only reports that "the Python worker failed to connect back".
- Workers import ``sink.history.source`` (the Python Kafka data source), so the project root goes on
  their PYTHONPATH.
- Bind to 127.0.0.1 (no network besides loopback), UI off, few shuffle partitions.
- Session time zone is UTC, so ``date`` (the partition column) is the UTC day of accepted_at.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from settings import environment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PROJECT_ROOT = str(Path(__file__).resolve().parents[2])

#: Settings every session gets (the job, sink.query, tests); callers may override via ``conf``.
DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    # The message_id de-duplication's state (measured with bench/spark_bench.py, warm job,
    # 50,000-record batches: 37-40 -> 28-33 us/record): commit a changelog per batch instead
    # of a RocksDB checkpoint (snapshots in the background; existing checkpoints convert), and
    # no extra lookup per row to keep a total-rows metric nobody reads.
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
    # The file sink writes each micro-batch's `date` partitions with concurrent writers (at
    # most a few days in one batch) instead of sorting the batch by date first.
    "spark.sql.maxConcurrentOutputFileWriters": "4",
    # Python data source: ship rows to the JVM in big Arrow batches.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    # The history table changes under a session (the job commits, compacts, expires days):
    # a catalog table over it is planned from its newest log version at each query, not from
    # a relation cached with the file list of its first query.
    "spark.sql.filesourceTableRelationCacheSize": "0",
    # The job's table maintenance runs beside the stream in a pool of its own
    # (sink/history/maintenance.py), sharing the cores fairly instead of queueing behind it.
    "spark.scheduler.mode": "FAIR",
}

#: The history job's own session (sink/history/job.py main), local mode: its footprint
#: (bench/job_footprint.py). Idle it held 1.4 GB: the JVM 580-830 MB, its heap never below the
#: JVM's initial size (1/64 of the machine's memory: 384 MB here) and growing to 1 GB; Python
#: processes of 45-160 MB (a daemon per kind of worker, each keeping its idle workers). Now: a
#: heap of 64-512 MB (Spark's minimum maximum is 450) with the serial collector, which gives
#: free heap back after a full collection, and Spark's periodic collection every 2 minutes
#: (default 30) so that an idle job does have one; at most one idle Python worker kept per kind
#: (Spark ends those idle for a minute).
JOB_LOCAL_CONF = {
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-Xms64m -XX:+UseSerialGC -XX:MinHeapFreeRatio=10 "
                                     "-XX:MaxHeapFreeRatio=30 -XX:ReservedCodeCacheSize=96m",
    "spark.cleaner.periodicGC.interval": "2min",
    "spark.python.factory.idleWorkerMaxPoolSize": "1",
}
#: ... and its child processes' environment: glibc's malloc keeps up to 8 arenas per core
#: (64 MB address space each, partly resident) in the JVM and the Python workers; two suffice.
#: pyarrow's own allocator (jemalloc/mimalloc) keeps what the Kafka reader's batches freed: at
#: 3,000 msg/s each reader worker held 215 MB; the system allocator gives it back.
JOB_LOCAL_ENV = {"MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system"}

LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
}


def launched_by_spark_submit() -> bool:
    """True when spark-submit started this interpreter (the JVM already exists)."""
    return environment.PYSPARK_GATEWAY_PORT.is_set() or environment.SPARK_SUBMIT.is_set()


def prepare_python_env() -> None:
    """Make local-mode Python workers use this interpreter and find the ``sink`` package.

    Under spark-submit nothing is changed: the cluster's PYSPARK_PYTHON / --py-files apply.
    """
    if launched_by_spark_submit():
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in (environment.PYTHONPATH.get() or "").split(os.pathsep) if p]
    if PROJECT_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([PROJECT_ROOT, *paths])
    # Spark prints its own log4j lines to stderr; keep them at WARN unless asked otherwise.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def get_spark(app_name: str = "mqtt-history", master: str | None = None,
              conf: dict[str, str] | None = None, log_level: str = "WARN") -> SparkSession:
    """Return a SparkSession (the active one if it exists, else a new one).

    ``master`` defaults to $SPARK_MASTER or, when not launched by spark-submit, ``local[2]``.
    Under spark-submit the master and deploy settings come from the command line.
    """
    prepare_python_env()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    submitted = launched_by_spark_submit()
    master = master or environment.SPARK_MASTER.get()
    if master is None and not submitted:
        master = "local[2]"
    if master:
        builder = builder.master(master)
    settings = dict(DEFAULT_CONF)
    if master and master.startswith("local"):
        settings.update(LOCAL_CONF)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    # Runtime-settable confs: make sure they hold even if the session already existed.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark
