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
from typing import TYPE_CHECKING, Any

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
    # payload_json (a VARIANT, sink/history/schema.py) is written shredded by compaction: each
    # file stores the fields most of its rows have as typed Parquet columns, which a filter on a
    # field reads instead of every payload (bench/history_month.py --json-rows); micro-batches
    # turn it off in the stream's session (writer.py). Spark 4.3's defaults, set here so that a
    # session configured otherwise still writes the table this way.
    # accepted_at as Parquet INT64 microseconds, not Spark's default INT96, which Parquet keeps no
    # min/max statistics for: a filter on a time range then skips the row groups and files
    # outside it (a compacted day is sorted by accepted_at). Files written before stay INT96;
    # Spark and the replay reader (reader.py) read both.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.variant.writeShredding.enabled": "true",
    "spark.sql.variant.inferShreddingSchema": "true",
    "spark.sql.variant.allowReadingShredded": "true",
    "spark.sql.variant.pushVariantIntoScan": "true",
    # A strict cast of a variant field read in the scan (`payload_json:temp::double`, made a typed
    # read by jvm/VariantCastPushdown.scala, or Spark's own variant_get) fails only on a row the
    # query uses, not on every row the scan reads: the error travels beside the value.
    "spark.sql.variant.pushVariantIntoScan.deferCastError": "true",
}

#: The history job's own session (sink/history/job/command.py main), local mode: its footprint
#: (bench/job_footprint.py). Idle it held 1.4 GB: the JVM 580-830 MB, its heap never below the
#: JVM's initial size (1/64 of the machine's memory: 384 MB here) and growing to 1 GB; Python
#: processes of 45-160 MB (a daemon per kind of worker, each keeping its idle workers). Now: a
#: heap of 64-512 MB (Spark's minimum maximum is 450) with the serial collector, which gives
#: free heap back after a full collection, and Spark's periodic collection every 2 minutes
#: (default 30) so that an idle job does have one; at most one idle Python worker kept per kind
#: (Spark ends those idle for a minute).
#: Its Spark log: sink/history/log4j2.properties (WARN, and the warnings every run gives, each
#: harmless, turned off: a normal start, run and stop print none).
JOB_LOG4J2 = os.path.join(PROJECT_ROOT, "sink", "history", "log4j2.properties")
#: the JVM gives the C heap's freed memory (the JIT compilers' arenas, Netty's buffers) back to
#: the system every 5 s: an idle job's JVM 461 -> 430-434 MB resident (bench/cold_start.py).
#: Java 17.0.9 and later have it (experimental until 22); an older JVM ignores it.
TRIM_NATIVE_HEAP = ("-XX:+UnlockExperimentalVMOptions -XX:+IgnoreUnrecognizedVMOptions "
                    "-XX:TrimNativeHeapInterval=5000 ")
JOB_LOCAL_CONF = {
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-Xms64m -XX:+UseSerialGC -XX:MinHeapFreeRatio=10 "
                                     "-XX:MaxHeapFreeRatio=30 -XX:ReservedCodeCacheSize=96m "
                                     + TRIM_NATIVE_HEAP +
                                     f"-Dlog4j2.configurationFile={JOB_LOG4J2}",
    "spark.cleaner.periodicGC.interval": "2min",
    "spark.python.factory.idleWorkerMaxPoolSize": "1",
}
#: ... and its child processes' environment: glibc's malloc keeps up to 8 arenas per core
#: (64 MB address space each, partly resident) in the JVM and the Python workers; two suffice.
#: pyarrow's own allocator (jemalloc/mimalloc) keeps what the Kafka reader's batches freed: at
#: 3,000 msg/s each reader worker held 215 MB; the system allocator gives it back.
#: Buffers of 1 MB and more (Kafka fetch responses, Arrow batches) are mapped on their own and
#: given back when freed: glibc otherwise raises that threshold to the largest block freed (up to
#: 32 MB) and serves later ones from the heap, which keeps the peak resident (a reading worker
#: 215 -> 178 MB at 25,000 msg/s).
JOB_LOCAL_ENV = {"MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system",
                 "MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "8388608"}

#: Python modules Spark runs only while it plans a Python data source query (looks the source
#: up, makes it, plans its read): in the job, once per start of the streaming query.
PLANNER_MODULES = ("pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source",
                   "pyspark.sql.worker.plan_data_source_read")


def release_planner_workers(spark: SparkSession) -> int:
    """Stop the Python daemons (and their idle workers) Spark keeps for planning a Python data
    source, once the streaming query has been planned; returns how many were stopped.

    Spark keeps one daemon per kind of Python worker for the JVM's lifetime; the three planning
    kinds are used once per query start, then hold 46 MB resident each, 138 MB of an idle job
    of 740 (bench/job_footprint.py). Spark has no setting for this (spark.python.use.daemon is
    for all workers: off, every micro-batch would start its reading worker anew, about 0.35 s
    of CPU), so this stops those daemons through the JVM's PythonWorkerFactory.stop(), as
    SparkEnv.stop() does; the factory starts its daemon again when a later query start plans
    again. Reflection on a Spark-private field: on a Spark without it, nothing is stopped.
    Call it from the thread that starts queries, after a progress report of the query (its
    planning is over by then), never while a query is being planned.
    """
    try:
        sc = spark.sparkContext
        env = sc._jsc.sc().env()
        # py4j cannot call SparkEnv's own methods (resolving them needs a class this classpath
        # lacks): only java.lang.reflect on it.
        field = sc._jvm.java.lang.Class.forName(  # type: ignore[union-attr]
            "org.apache.spark.SparkEnv").getDeclaredField("pythonWorkers")
        field.setAccessible(True)
        stopped = 0
        entries = field.get(env).iterator()
        while entries.hasNext():
            entry = entries.next()
            if entry._1().workerModule() in PLANNER_MODULES:
                entry._2().stop()
                stopped += 1
        return stopped
    except Exception as exc:  # another Spark version: the daemons stay, nothing else changes
        log.debug("cannot release the planning Python workers: %s", exc)
        return 0


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


class _NumpyOnlyWhenLoaded:
    """One of PySpark's py4j converters for NumPy values, asked only about NumPy objects.

    PySpark registers converters that py4j asks about every argument of every call into the JVM;
    the NumPy ones import ``pyspark.testing.utils`` to learn whether NumPy is installed, which
    imports pandas, pyarrow, NumPy and protobuf: 84 MB resident in a process that never passes
    a NumPy value (the job's driver: bench/job_footprint.py). An object can only be a NumPy value
    once NumPy is loaded, so asking PySpark's converter only then converts the same values."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def can_convert(self, obj: object) -> bool:
        np = sys.modules.get("numpy")
        # NumPy's types, once another thread's import of NumPy has made them (a module being
        # imported is in sys.modules from its first line: asking it for np.generic then failed
        # the job's start with "partially initialized module 'numpy'")
        generic, ndarray = getattr(np, "generic", None), getattr(np, "ndarray", None)
        if not (isinstance(generic, type) and isinstance(ndarray, type)):
            return False
        return isinstance(obj, (generic, ndarray)) and bool(self.inner.can_convert(obj))

    def convert(self, obj: object, gateway_client: Any) -> Any:
        return self.inner.convert(obj, gateway_client)


def _numpy_converters_only_when_loaded() -> None:
    from py4j import protocol
    from pyspark.sql import types
    for i, conv in enumerate(protocol.INPUT_CONVERTER):
        if isinstance(conv, (types.NumpyScalarConverter, types.NumpyArrayConverter)):
            protocol.INPUT_CONVERTER[i] = _NumpyOnlyWhenLoaded(conv)


#: What the JVM itself prints on stderr at every start, before any logging: Spark's launcher
#: always adds --add-modules=jdk.incubator.vector (org.apache.spark.launcher.JavaModuleOptions),
#: and Java says so; nothing here uses the module, no setting turns the notice off.
JVM_START_NOTICES = (b"WARNING: Using incubator modules: jdk.incubator.vector",)


def _launch_gateway_without_notices(app_name: str, master: str | None,
                                    settings: dict[str, str]) -> None:
    """Start the JVM as SparkSession.builder would (launch_gateway with the same settings), its
    stderr through ``grep -v`` of JVM_START_NOTICES (PySpark's popen_kwargs); the builder then
    uses this JVM. The filter runs in a session of its own (no terminal's or supervisor's
    signal ends it) and ends when the JVM and its Python workers have closed their stderr, so it
    passes on what they say after this process. Nothing when a JVM runs already or without
    grep (the notice is printed)."""
    import shutil
    import subprocess

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    grep = shutil.which("grep")
    if SparkContext._gateway is not None or grep is None:
        return
    notices = [x for n in JVM_START_NOTICES for x in ("-e", n.decode())]
    filt = subprocess.Popen([grep, "--line-buffered", "-v", "-x", "-F", *notices],
                            stdin=subprocess.PIPE, start_new_session=True)
    conf = SparkConf(loadDefaults=False).setAppName(app_name).setAll(list(settings.items()))
    if master:
        conf.setMaster(master)
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": filt.stdin})
    finally:
        filt.stdin.close()  # type: ignore[union-attr]  # (a pipe: given) the JVM holds it now
    SparkContext._ensure_initialized(gateway=gateway)


def get_spark(app_name: str = "mqtt-history", master: str | None = None,
              conf: dict[str, str] | None = None, log_level: str = "WARN",
              quiet_start: bool = False) -> SparkSession:
    """Return a SparkSession (the active one if it exists, else a new one).

    ``master`` defaults to $SPARK_MASTER or, when not launched by spark-submit, ``local[2]``.
    Under spark-submit the master and deploy settings come from the command line.
    ``quiet_start``: a JVM started here leaves out JVM_START_NOTICES (the history job).
    """
    prepare_python_env()
    from pyspark.sql import SparkSession
    _numpy_converters_only_when_loaded()

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
    if quiet_start and not submitted:
        _launch_gateway_without_notices(app_name, master, settings)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    # Runtime-settable confs: make sure they hold even if the session already existed.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark
