"""Building the streaming query: Kafka (Spark's connector or sink.history.source) -> history
rows -> the table (our commit log, or Spark's file sink for hdfs:// and s3a://)."""
from __future__ import annotations

import logging
import os
from typing import Any

from settings import HistoryConfig
from sink.history.job.config import Job, UsageError
from sink.history.paths import is_local_path
from sink.history.paths import local as _local

log = logging.getLogger(__name__)

# pyspark's objects (pyspark is imported only where Spark runs)
Spark = Any           # a SparkSession
DataFrame = Any       # a (streaming) DataFrame
StreamingQuery = Any

QUERY_NAME = "mqtt_history"
SOURCE_MARKER = "sink_source"  # file in the checkpoint: which Kafka reader it was made with
DEDUP_MARKER = "sink_dedup"    # file in the checkpoint: "source" (sink.history.dedup) or "spark"
_HISTORY = HistoryConfig()     # the defaults


def _native_kafka_available(spark: Spark, job: Job) -> DataFrame | None:
    """Try Spark's kafka source. Returns the streaming DataFrame, or None when the
    spark-sql-kafka connector is not on the classpath (KAFKA_DATA_SOURCE_NOT_ENABLED)."""
    from pyspark.errors import AnalysisException
    reader = spark.readStream.format("kafka").option("includeHeaders", "true") \
        .option("failOnDataLoss", "false")
    for k, v in job.kafka_options().items():
        reader = reader.option(k, v)
    try:
        return reader.load()
    except AnalysisException as exc:
        cond = getattr(exc, "getCondition", lambda: None)() or ""
        if cond == "KAFKA_DATA_SOURCE_NOT_ENABLED" or "KAFKA_DATA_SOURCE_NOT_ENABLED" in str(exc):
            return None
        raise


def dedup_in_source(job: Job) -> bool:
    """Whether the Python source drops duplicate ids (sink.history.dedup: state in the checkpoint, cost
    independent of the window) rather than Spark's dropDuplicatesWithinWatermark, whose every
    batch scans all ids of the window. The source needs a local checkpoint (its tasks write
    there); a checkpoint made with Spark's operator keeps it (its plan has that state)."""
    if not is_local_path(job.history.checkpoint_dir):
        return False
    ck = _local(job.history.checkpoint_dir)
    try:
        return (ck / DEDUP_MARKER).read_text().strip() == "source"
    except OSError:
        pass
    offsets = ck / "offsets"
    return not (offsets.is_dir() and any(offsets.iterdir()))  # a new checkpoint


def _python_kafka(spark: Spark, job: Job, dedup: bool) -> DataFrame:
    from sink.history.source import FORMAT_NAME, KafkaPythonSource
    if not getattr(spark, "_mqtt_kafka_registered", False):
        spark.dataSource.register(KafkaPythonSource)
        spark._mqtt_kafka_registered = True
    reader = (spark.readStream.format(FORMAT_NAME).option("headers", "columns")
              .option("maxPartitions", str(job.history.read_tasks
                                           or spark.sparkContext.defaultParallelism)))
    for k, v in job.kafka_options().items():
        reader = reader.option(k, v)
    if job.embedded_kafka:
        reader = reader.option("embeddedKafka", "true")
    if job.history.verify_records and job.data_dir:   # the broker's record signatures (sink/history/verify.py)
        reader = reader.option("verify.dataDir", os.path.abspath(job.data_dir))
    if dedup:
        reader = (reader.option("dedup.dir", str(_local(job.history.checkpoint_dir) / "dedup"))
                  .option("dedup.windowMs", str(job.history.dedup_window_ms))
                  .option("dedup.maxGroups", str(job.history.dedup_max_prefixes)))
    return reader.load()


def _recorded_source(checkpoint: str) -> str | None:
    if not is_local_path(checkpoint):
        return None
    try:
        return (_local(checkpoint) / SOURCE_MARKER).read_text().strip() or None
    except OSError:
        return None


def kafka_stream(spark: Spark, job: Job, dedup: bool = False) -> tuple[DataFrame, str]:
    """(streaming DataFrame of Kafka records, "kafka"|"python"); ``dedup``: the Python source
    drops duplicate ids (dedup_in_source)."""
    wanted = job.history.source
    recorded = _recorded_source(job.history.checkpoint_dir)
    if recorded and wanted != "auto" and wanted != recorded:
        raise UsageError(
            f"the checkpoint {job.history.checkpoint_dir} was written with --source {recorded}; its "
            f"offsets cannot be used with --source {wanted}. Use --source {recorded}, or a new "
            "--checkpoint (the message_id de-duplication does not span checkpoints)")
    if wanted == "auto" and recorded:
        wanted = recorded
    if wanted in ("auto", "kafka"):
        df = _native_kafka_available(spark, job)
        if df is not None:
            if job.history.verify_records and job.data_dir:
                log.warning("Spark's Kafka connector does not check the broker's record "
                            "signatures: any producer that can reach Kafka adds rows (use "
                            "Kafka ACLs, or --source python)")
            return df, "kafka"
        if wanted == "kafka":
            raise UsageError(
                "--source kafka needs Spark's Kafka connector, which is not on the classpath "
                "(KAFKA_DATA_SOURCE_NOT_ENABLED). Start with spark-submit --packages "
                "org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>, or use --source "
                "python (or auto)")
        log.info("Spark's Kafka connector is not on the classpath: using the Python Kafka "
                 "source (sink.history.source)")
    return _python_kafka(spark, job, dedup), "python"


def build_history_stream(kafka_df: DataFrame, dedup_window: str = _HISTORY.dedup_window,
                         deduplicated: bool = False) -> DataFrame:
    """Kafka records -> history rows with duplicate message ids removed (by Spark's operator,
    unless the source did it: ``deduplicated``)."""
    from sink.history.schema import to_history
    if deduplicated:
        return to_history(kafka_df)
    return (to_history(kafka_df)
            .withWatermark("ingested_at", dedup_window)
            .dropDuplicatesWithinWatermark(["message_id"]))


#: Parquet writer settings per column (parquet-mr's ``<key>#<column>``, passed through the file
#: sink's options): no dictionary for the columns whose values are distinct by construction (the
#: writer would hash every value into a dictionary, find it too big and fall back, page after
#: page), and no min/max statistics for the payload, which no query prunes on. Payloads keep
#: their dictionary: devices often repeat theirs.
PARQUET_OPTIONS = {
    **{f"parquet.enable.dictionary#{c}": "false" for c in ("message_id", "kafka_offset")},
    **{f"parquet.column.statistics.enabled#{c}": "false" for c in ("payload", "payload_text")},
}


def start_query(spark: Spark, job: Job, batch_rules: Any = None) -> tuple[StreamingQuery, str]:
    """Start the streaming query (file sink + checkpoint). Returns (query, source used).
    ``batch_rules``: run on each batch a local table's writer stages (rules/shared.py)."""
    from sink.history.schema import PARTITION_COLUMN
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # `date` is the UTC day
    in_source = dedup_in_source(job)  # decided before the marker below is written
    kafka_df, used = kafka_stream(spark, job, in_source)
    in_source = in_source and used == "python"
    if is_local_path(job.history.checkpoint_dir):  # remote (hdfs://, s3a://) dirs: Spark makes them
        _local(job.history.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        (_local(job.history.checkpoint_dir) / SOURCE_MARKER).write_text(used + "\n")
        (_local(job.history.checkpoint_dir) / DEDUP_MARKER).write_text(
            ("source" if in_source else "spark") + "\n")
    history = build_history_stream(kafka_df, job.history.dedup_window, in_source)
    if is_local_path(job.history.table):
        # our own commit log (sink/history/manifest.py): compaction and retention can take
        # files out of the table, which Spark's file sink log cannot
        from sink.history.maintenance import batch_writer
        writer = history.writeStream.foreachBatch(
            batch_writer(spark, job.history, PARQUET_OPTIONS, batch_rules))
    else:
        writer = history.writeStream.format("parquet")
        for key, value in PARQUET_OPTIONS.items():
            writer = writer.option(key, value)
        writer = writer.option("path", job.history.table).partitionBy(PARTITION_COLUMN)
    writer = (writer
              .option("checkpointLocation", job.history.checkpoint_dir)
              .outputMode("append")
              .queryName(QUERY_NAME))
    if job.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{job.history.trigger_seconds:g} seconds")
    query = writer.start()
    log.info("history job started: source=%s topics=%s bootstrap=%s table=%s checkpoint=%s %s",
             used, ",".join(job.topics), job.bootstrap, job.history.table, job.history.checkpoint_dir,
             "available-now" if job.available_now else f"trigger={job.history.trigger_seconds:g}s")
    return query, used

