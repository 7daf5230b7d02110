"""The history job: Kafka (records written by the broker's forwarder) -> Parquet history table.

    python -m sink.job [--config FILE] [--set SECTION.KEY=VALUE] [--data-dir DIR]
                       [--kafka-bootstrap HOST:PORT] [--table DIR] [--checkpoint DIR]
                       [--kafka-topic T] [--trigger-seconds N]
                       [--source auto|kafka|python] [--available-now]

Its settings are the broker's tree, built from the same arguments and environment
(settings/parts.py): scripts/run.sh gives both commands the same ones.

Exactly once, and no duplicate message ids:
- The table's own commit log (sink/history/manifest.py, written by sink/history/writer.py in
  ``foreachBatch``) + Spark's checkpoint. Every micro-batch's offsets are logged before it runs;
  its files join the table in one atomic version of the log, which records the batch, before
  Spark commits the batch; ``spark.read.parquet(table)`` reads only the files of the newest
  version (``_spark_metadata``). A job killed at any step (even SIGKILL) re-runs that batch with
  the same offsets on restart, and a batch already in the table is not written again. The log
  lets compaction and retention (sink/history/maintenance.py) replace and drop files, which
  Spark's file sink (still used for hdfs:// and s3a:// tables) cannot.
- Duplicate message ids (producer retries, a replayed broker spool, a re-read after Kafka lost
  its log) are removed by the Python source (sink/history/dedup.py: the ids seen, as intervals per id
  prefix, in ``<checkpoint>/dedup``; exactly once with the offset log; cost independent of how
  many ids were seen). With Spark's Kafka connector, or a checkpoint made before, by
  ``dropDuplicatesWithinWatermark("message_id")`` on ``ingested_at`` (the micro-batch's time,
  kept in the offset log) with ``dedup_window``, whose cost grows with the ids it holds.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from settings import HistoryConfig, SinkConfig
from sink.history.paths import is_local_path
from sink.history.paths import local as _local

log = logging.getLogger(__spec__.name if __name__ == "__main__" else __name__)  # (python -m: its module path)

# pyspark's objects (pyspark is imported only where Spark runs)
Spark = Any           # a SparkSession
DataFrame = Any       # a (streaming) DataFrame
StreamingQuery = Any
Flag = tuple[str, str, Any, str]   # (section, key, value, the flag that set it)

QUERY_NAME = "mqtt_history"
SOURCE_MARKER = "sink_source"  # file in the checkpoint: which Kafka reader it was made with
DEDUP_MARKER = "sink_dedup"    # file in the checkpoint: "source" (sink.history.dedup) or "spark"
_HISTORY, _SINK = HistoryConfig(), SinkConfig()   # the defaults --help names: the tree's
SOURCES = ("auto", "kafka", "python")


class UsageError(Exception):
    """A problem the person running the job must fix (bad flag, config, path...)."""


@dataclass
class Job:
    """One run of the history job: its [history] section as the tree loaded and checked it
    (settings/tree.py: table, trigger_seconds, source, connect_*, the upkeep and catalog keys...),
    and what the rest of the config file and the command line add."""
    history: HistoryConfig = field(default_factory=HistoryConfig)
    # Kafka: [sink] bootstrap_servers (or --kafka-bootstrap); none: the broker's embedded Kafka
    bootstrap: str = f"127.0.0.1:{_SINK.embedded_port}"
    # [history] kafka_topics (or --kafka-topic); none: the topics [sink] forwards to
    topics: list[str] = field(default_factory=lambda: [_SINK.topic])
    # the broker's data directory: its secrets (settings/secrets.py: the Spark Connect token, the
    # key that signs records and the committed file). None (tests): no token, nothing checked
    data_dir: str | None = None
    available_now: bool = False   # --available-now: what Kafka holds now, then exit
    embedded_kafka: bool = False  # the broker's embedded Kafka (empty after each restart: routine)
    log_level: str = "INFO"       # [broker] log_level (the job's own: --log-level, $SINK_LOG_LEVEL)

    @classmethod
    def of(cls, **values: Any) -> Job:
        """A Job from keywords: its own fields, the rest [history] keys (tests, benchmarks)."""
        own = {k: values.pop(k) for k in list(values) if k in cls.__dataclass_fields__}
        return cls(history=HistoryConfig(**values), **own)

    def kafka_options(self) -> dict[str, str]:
        """Options understood by both Spark's kafka source and sink.history.source (same names):
        Kafka client properties of [history.kafka] (security.protocol, sasl.mechanism,
        ssl.cafile, ...) as kafka.<name>."""
        h = self.history
        opts = {"kafka.bootstrap.servers": self.bootstrap, "startingOffsets": h.starting_offsets}
        if len(self.topics) == 1 and self.topics[0].startswith("re:"):
            opts["subscribePattern"] = self.topics[0][3:]
        else:
            opts["subscribe"] = ",".join(self.topics)
        if h.max_records_per_trigger:   # 0: no cap
            opts["maxOffsetsPerTrigger"] = str(h.max_records_per_trigger)
        for name, value in h.kafka.items():
            opts[f"kafka.{name}"] = str(value).lower() if isinstance(value, bool) else str(value)
        return opts

    def validate(self) -> "Job":
        """What no single key says (each key was checked when the tree loaded it)."""
        if not self.topics or any(not t for t in self.topics):
            raise UsageError("no Kafka topic given: use --kafka-topic T or [history] kafka_topics")
        if any(t.startswith("re:") for t in self.topics) and len(self.topics) > 1:
            raise UsageError("a topic pattern (re:<regex>) cannot be combined with other topics")
        if self.history.jdbc and not self.history.jdbc_password_file:
            raise UsageError("[history] jdbc = true needs operators' accounts: set [history] "
                             "jdbc_password_file to a password file of their own (python -m "
                             "broker.auth passwd FILE add USER), not the devices' [auth] "
                             "password_file")
        return self


def load_job(path: str | None, flags: Iterable[Flag] = (), available_now: bool = False,
             sets: Iterable[str] = (), shared: Iterable[Flag] = (),
             with_broker: bool = False) -> tuple[Job, list[str]]:
    """The job from the run's tree (settings/parts.py): the config file (none: the tree's
    defaults), the MQTT_BROKER_* environment, --set items and the flags the broker shares
    (`shared`), as the broker builds it from the same arguments, then the job's own flags
    (--table, --trigger-seconds...: (section, key, value, flag) tuples); and notes to log.
    Every key is checked the way the broker checks it (settings.ConfigError: one line naming
    the key), and a --set or flag that nothing running reads is refused (with_broker: the
    broker runs beside, scripts/run.sh)."""
    from settings import ConfigError, load, parts
    from settings.load import apply_setting
    sets, shared, flags = list(sets), list(shared), list(flags)
    cfg = load(path, sets=sets, flags=shared)
    file_history = dataclasses.replace(cfg.history)   # what a broker given the same arguments reads
    for section, key, value, flag in flags:
        apply_setting(cfg, section, key, value, flag)
    commands = [parts.JOB] + ([parts.BROKER] if with_broker else [])
    parts.check_used(cfg, parts.set_keys(sets) + [(f[0], f[1], f[3]) for f in shared + flags],
                     commands, "the history job" + (" and the broker" if with_broker else ""))
    sink, hist = cfg.sink, cfg.history
    notes = table_notes(file_history, hist, sink.keep_until, path)
    # [sink] is the broker's section (config/broker.toml): read Kafka from where it forwards to
    bootstrap, embedded = sink.bootstrap_servers, not sink.bootstrap_servers
    if embedded:   # empty = the broker starts an embedded Kafka on this port
        if sink.embedded_port <= 0:
            raise ConfigError("sink.embedded_port", "an embedded Kafka on a random port cannot "
                              "be found by the history job: give its address with "
                              "--kafka-bootstrap", sink.embedded_port, os.path.basename(path or ""))
        bootstrap = f"127.0.0.1:{sink.embedded_port}"
    topics = [sink.topic]
    for rule in sink.rules:
        if rule.topic not in topics:
            topics.append(rule.topic)
    # [history] kafka_topics (() means: the topics [sink] forwards to), or --kafka-topic
    topics = list(hist.kafka_topics) or topics
    if hist.jdbc and same_file(hist.jdbc_password_file, cfg.auth.password_file):
        raise UsageError(f"[history] jdbc_password_file is the devices' password file ([auth] "
                         f"password_file {cfg.auth.password_file}): an MQTT login must not open "
                         "the whole history over JDBC. Give the operators a file of their own "
                         "(python -m broker.auth passwd FILE add USER)")
    job = Job(hist, bootstrap, topics, data_dir=cfg.data_dir, available_now=available_now,
              embedded_kafka=embedded, log_level=cfg.log_level)
    return job.validate(), notes


def same_file(a: str, b: str) -> bool:
    """Both name one file (by path, or as hard/symbolic links of one file)."""
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def build_parser() -> argparse.ArgumentParser:
    from settings import environment, parts
    p = argparse.ArgumentParser(
        prog="python -m sink.job",
        description="Copy MQTT messages from Kafka into the Parquet history table "
                    "(Spark Structured Streaming, exactly once, duplicate message ids dropped).",
        formatter_class=environment.HelpFormatter,
        epilog="Flags override the config file, which overrides the defaults. "
               "Query the table with: python -m sink.query \"SELECT ... FROM messages\"\n\n"
               + environment.epilog(environment.JOB))
    parts.add_arguments(p, log_level_help="the job's log level: DEBUG, INFO, WARNING or ERROR "
                                          f"(default ${environment.SINK_LOG_LEVEL.name}, else "
                                          "log_level of the settings: INFO)")
    p.add_argument("--with-broker", action="store_true",
                   help="the broker runs beside this job with the same arguments "
                        "(scripts/run.sh): settings only the broker reads are accepted here")
    p.add_argument("--table", metavar="DIR", help=f"history table directory (default {_HISTORY.table})")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="checkpoint directory (default: <table>_checkpoint beside the table)")
    p.add_argument("--kafka-topic", metavar="T", action="append",
                   help=f"Kafka topic to read (repeat or comma-separate for several; "
                        f"re:<regex> for a pattern; default {_SINK.topic})")
    p.add_argument("--trigger-seconds", metavar="N", type=float,
                   help=f"micro-batch interval in seconds (default {_HISTORY.trigger_seconds:g})")
    p.add_argument("--source", choices=SOURCES,
                   help="Kafka reader: Spark's connector (kafka), our Python source (python), or "
                        "auto: the connector when it is on the classpath (default auto)")
    p.add_argument("--available-now", action="store_true",
                   help="process the records that are in Kafka now, then exit")
    p.add_argument("--connect-port", metavar="N", type=int,
                   help=f"serve Spark Connect on this port while the job runs (default "
                        f"{_HISTORY.connect_port}, or [history] connect_port)")
    p.add_argument("--no-verify-records", action="store_true",
                   help="keep Kafka records that do not carry the broker's signature (other "
                        "producers); [history] verify_records = false")
    p.add_argument("--no-connect", action="store_true",
                   help="do not serve Spark Connect (sink.query then starts its own session)")
    p.add_argument("--nice", metavar="N", type=int,
                   help=f"run at this niceness (0-19; default {_HISTORY.nice}, or [history] nice): "
                        "on a machine shared with the broker, the broker's CPU comes first")
    return p


#: flag (its argparse dest) -> the key it sets
FLAG_KEYS = {"table": ("history", "table"), "checkpoint": ("history", "checkpoint"),
             "trigger_seconds": ("history", "trigger_seconds"), "source": ("history", "source"),
             "connect_port": ("history", "connect_port"), "nice": ("history", "nice")}


def flags_of(args: argparse.Namespace) -> list[Flag]:
    """The keys the job's own flags set, as (section, key, value, flag) for the tree to check
    (the flags it shares with the broker: settings.parts.flags_of)."""
    flags = [(*key, getattr(args, dest), "--" + dest.replace("_", "-"))
             for dest, key in FLAG_KEYS.items() if getattr(args, dest, None) is not None]
    if getattr(args, "kafka_topic", None):
        flags.append(("history", "kafka_topics", ",".join(args.kafka_topic), "--kafka-topic"))
    if getattr(args, "no_connect", False):
        flags.append(("history", "connect", False, "--no-connect"))
    if getattr(args, "no_verify_records", False):
        flags.append(("history", "verify_records", False, "--no-verify-records"))
    return flags


def config_from_args(argv: Sequence[str] | None = None) -> tuple[Job, argparse.Namespace]:
    from settings import environment, parts
    args = build_parser().parse_args(argv)
    job, args.notes = load_job(args.config, flags_of(args), args.available_now, sets=args.set,
                               shared=parts.flags_of(args), with_broker=args.with_broker)
    # the job's own level: --log-level, else $SINK_LOG_LEVEL, else the tree's log_level
    if args.log_level is None:
        args.log_level = environment.SINK_LOG_LEVEL.get() or job.log_level
    if not isinstance(logging.getLevelName(args.log_level.upper()), int):
        raise UsageError(f"${environment.SINK_LOG_LEVEL.name} must be DEBUG, INFO, WARNING or "
                         f"ERROR, not {args.log_level!r}")
    return job, args


def table_notes(configured: HistoryConfig, used: HistoryConfig, keep_until: str,
                path: str | None) -> list[str]:
    """A warning when the broker keeps records until the table has them ([sink] keep_until =
    "history") and --table / --checkpoint make the job report its commits somewhere else than
    the config's [history] says, which is where the broker looks for them."""
    from sink.progress import committed_path
    mine = committed_path(used.table, used.checkpoint or None)
    theirs = committed_path(configured.table, configured.checkpoint or None)
    if keep_until != "history" or os.path.abspath(mine) == os.path.abspath(theirs):
        return []
    flags = " ".join(f"{f} {v}" for f, v, was in (("--table", used.table, configured.table),
                                                  ("--checkpoint", used.checkpoint,
                                                   configured.checkpoint)) if v != was)
    return [f"{flags}: this job reports what the table committed in {mine}, but the broker reads "
            f"{theirs} ([history] of {path or 'the default config'}): with [sink] "
            "keep_until = \"history\" its spool keeps every record until spool_max_bytes, then "
            "refuses publishers. Set [history] table/checkpoint in the config both use instead "
            "of the flags"]


# ---- building the query ------------------------------------------------------------------

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


def start_query(spark: Spark, job: Job) -> tuple[StreamingQuery, str]:
    """Start the streaming query (file sink + checkpoint). Returns (query, source used)."""
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
        writer = history.writeStream.foreachBatch(batch_writer(spark, job.history, PARQUET_OPTIONS))
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
    _report_commits(spark, job, query)
    log.info("history job started: source=%s topics=%s bootstrap=%s table=%s checkpoint=%s %s",
             used, ",".join(job.topics), job.bootstrap, job.history.table, job.history.checkpoint_dir,
             "available-now" if job.available_now else f"trigger={job.history.trigger_seconds:g}s")
    return query, used


# ---- progress ------------------------------------------------------------------------------

def _offsets(value: Any) -> dict[str, int]:
    """{"topic-p": offset} from either source's offset JSON."""
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, dict) and "t" in value and isinstance(value["t"], dict):
        value = value["t"]  # sink.history.source format
    out = {}
    for topic, parts in (value or {}).items():
        if isinstance(parts, dict):
            for p, off in parts.items():
                if isinstance(off, int):
                    out[f"{topic}-{p}"] = off
    return out


def backlog(progress: dict) -> int | None:
    """Records in Kafka not yet processed, from a StreamingQueryProgress dict."""
    total, known = 0, False
    for src in progress.get("sources", []):
        end, latest = _offsets(src.get("endOffset")), _offsets(src.get("latestOffset"))
        if latest:
            known = True
            total += sum(max(0, off - end.get(k, 0)) for k, off in latest.items())
    return total if known else None


def describe_progress(p: dict) -> str:
    rows = p.get("numInputRows", 0)
    lag = backlog(p)
    dur = p.get("durationMs", {}).get("triggerExecution")
    return (f"batch {p.get('batchId')}: {rows} rows, "
            f"{p.get('processedRowsPerSecond', 0.0) or 0.0:.0f} rows/s processed, "
            f"{p.get('inputRowsPerSecond', 0.0) or 0.0:.0f} rows/s arriving, "
            f"took {dur if dur is not None else '?'} ms, "
            f"backlog {lag if lag is not None else 'unknown'} records")


# ---- what the table has committed (sink/progress.py: read by the broker's spool) -------------

def committed_offsets(end_offsets: Iterable[object]) -> dict[str, dict[str, Any]]:
    """{kafka_topic: {"topic_id", "offsets": {partition: next offset}}} from the end offsets of
    a committed micro-batch: one JSON (str or dict) per source, either sink.history.source's
    ({"t": {topic: {p: n}}, "ids": {topic: id}}) or Spark's Kafka connector's ({topic: {p: n}},
    which carries no topic id: null)."""
    out: dict[str, dict] = {}
    for value in end_offsets:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        if not isinstance(value, dict):
            continue
        ids = value.get("ids", {}) if "t" in value else {}
        for topic, parts in (value["t"] if "t" in value else value).items():
            if isinstance(parts, dict):
                out[topic] = {"topic_id": ids.get(topic) or None,
                              "offsets": {int(p): int(n) for p, n in parts.items()
                                          if isinstance(n, int) and n >= 0}}
    return out


def committed_from_checkpoint(checkpoint: str) -> tuple[int, dict] | None:
    """(batch id, offsets) of the last batch in the checkpoint's commit log, or None."""
    root = _local(checkpoint)
    try:
        batches = [int(f.name) for f in (root / "commits").iterdir() if f.name.isdigit()]
        if not batches:
            return None
        lines = (root / "offsets" / str(max(batches))).read_text().splitlines()
    except (OSError, ValueError):
        return None
    # offsets/N: "v1", the batch metadata, then one line per source
    return max(batches), committed_offsets([ln for ln in lines[2:] if ln.strip()])


def _report_commits(spark: Spark, job: Job, query: StreamingQuery) -> None:
    """Keep ``progress.committed_path(table, checkpoint)`` up to date from the checkpoint's
    commit log: now (a job killed between a commit and its report catches up) and then at every
    poll of run() (``query._commit_catch_up``), so within a poll interval of each commit.

    The commit log is read rather than listening to query progress: a Python
    StreamingQueryListener costs the JVM a py4j callback per batch whose conversion looks
    classes up through the class path (about 5% of the job's JVM CPU, bench/spark_bench.py)."""
    if not is_local_path(job.history.checkpoint_dir):
        return  # the broker reads a local file only
    from sink.progress import committed_path, write_committed
    path = committed_path(job.history.table, str(_local(job.history.checkpoint_dir)))
    newest = [-1, False]    # last batch written, and whether it was signed
    key = committed_key(job)

    def catch_up() -> None:
        last = committed_from_checkpoint(job.history.checkpoint_dir)
        k = key()
        if not last or not last[1] or (last[0] <= newest[0] and (newest[1] or k is None)):
            return
        try:
            write_committed(path, *last, key=k, table=os.path.abspath(job.history.table))
            newest[:] = [last[0], k is not None]
        except OSError as exc:  # the table is still right; the spool just keeps more
            log.warning("cannot write %s (%s): the broker's spool keeps records longer", path, exc)

    catch_up()
    query._commit_catch_up = catch_up
    _hard_exit_hooks.append(catch_up)


def committed_key(job: Job) -> Callable[[], bytes | None]:
    """A function giving the key that signs the committed file, once the broker made its secret
    (a job started first writes unsigned files, which the broker ignores, until then)."""
    from settings import secrets
    found: list = []
    warned = [False]

    def key() -> bytes | None:
        if not found and job.data_dir:
            k = secrets.sink_key(job.data_dir)
            if k is not None:
                found.append(secrets.derive(k, secrets.COMMITTED))
            elif not warned[0]:
                warned[0] = True
                log.warning("no broker key in %s yet (the broker makes it when its sink starts): "
                            "what the table commits is reported unsigned, which the broker "
                            "ignores, until it is there", secrets.secrets_dir(job.data_dir))
        return found[0] if found else None
    return key


def announce(job: Job) -> None:
    """Say in the broker's data directory, at once, that this job runs, which table it writes
    and where it reports its commits, so a broker that looks elsewhere can say so and one
    that waits for the first commit knows a job is starting (sink/forward/forwarder.py)."""
    if not job.data_dir or not is_local_path(job.history.checkpoint_dir):
        return
    from sink.progress import atomic_write, committed_path, job_file
    committed_file = committed_path(job.history.table, str(_local(job.history.checkpoint_dir)))
    table = job.history.table
    info = {"pid": os.getpid(), "started_at": time.time(),
            "table": os.path.abspath(table) if is_local_path(table) else table,
            "committed_file": os.path.abspath(committed_file),
            # where its Spark Connect server will answer (sink.query waits there, not elsewhere)
            "serves_connect_at": job.history.connect_url if connect_enabled(job) else None}
    try:
        os.makedirs(job.data_dir, exist_ok=True)
        atomic_write(job_file(job.data_dir, table), json.dumps(info).encode())
    except OSError as exc:
        log.warning("cannot write %s: %s", job_file(job.data_dir, table), exc)


def progress_since(query: StreamingQuery, after: int) -> list[dict[str, Any]]:
    """The query's progress reports with a batchId above ``after``, oldest first, as dicts.
    PySpark's ``recentProgress`` renders every retained report (up to 100) as JSON on each call;
    this walks the JVM's list from the newest back and renders only the new ones."""
    jsq = getattr(query, "_jsq", None)
    if jsq is None:  # Spark Connect's StreamingQuery
        return [p for p in query.recentProgress if p.get("batchId", -1) > after]
    reports = jsq.recentProgress()
    out = []
    for i in range(len(reports) - 1, -1, -1):
        jp = reports[i]
        if jp.batchId() <= after:
            break
        out.append(json.loads(jp.json()))
    out.reverse()
    return out


def run(spark: Spark, job: Job, stop_event: threading.Event | None = None,
        poll_seconds: float = 1.0) -> int:
    """Run the query until it ends (available-now) or stop_event is set. Returns an exit code."""
    stop_event = stop_event or threading.Event()
    query, _ = start_query(spark, job)
    commit_catch_up = getattr(query, "_commit_catch_up", None)
    from sink.history import catalog
    from sink.history.maintenance import start_maintainer
    from sink.history.spark import launched_by_spark_submit, release_planner_workers
    maintainer = start_maintainer(spark, job.history, PARQUET_OPTIONS, job.available_now)
    # `messages` for spark-sql & co (embedded Derby): once, a minute after the query started
    registration = None if job.available_now else catalog.start_registration(job.history)
    last_batch, last_idle_log = -1, time.monotonic()
    planners_released = launched_by_spark_submit() or getattr(query, "_jsq", None) is None

    def report() -> None:
        nonlocal last_batch, last_idle_log, planners_released
        for p in progress_since(query, last_batch):  # only batches after last_batch
            last_batch = p["batchId"]
            if not planners_released:  # planned by now: its planning workers are not needed
                planners_released = True
                log.info("stopped %d idle Python planning daemons (Spark starts them again when a query is planned)",
                          release_planner_workers(spark))
            if p.get("numInputRows", 0) or job.available_now:
                log.info("%s", describe_progress(p))
            elif time.monotonic() - last_idle_log > 60:
                last_idle_log = time.monotonic()
                log.info("idle: %s", describe_progress(p))

    try:
        while query.isActive and not stop_event.is_set():
            try:
                query.awaitTermination(poll_seconds)
            except Exception as err:
                if query.isActive:  # not the query's failure (that ends it): a failed wait
                    log.warning("waiting for the history query: %s (it goes on)", _short_error(err))
                    stop_event.wait(poll_seconds)
                    continue
                break  # it failed: query.exception() below says why
            report()
            if commit_catch_up:
                commit_catch_up()
        if stop_event.is_set() and query.isActive:
            log.info("stopping: waiting for the query to stop (committed batches are kept; an "
                     "unfinished batch is redone on the next start)")
            query.stop()
        report()
        exc = query.exception()
        if exc is not None:
            log.error("the history query failed: %s", _short_error(exc))
            return RESTART if any(t in str(exc) for t in TRANSIENT_FAILURES) else 1
        if not stop_event.is_set() and not job.available_now:
            # a streaming query ends only when stopped: nobody asked, so start it again
            log.error("the history query ended without an error and without a stop (last batch "
                      "%s): starting it again", last_batch)
            return RESTART
        log.info("history job stopped (last batch %s)", last_batch)
        return 0
    finally:
        if registration:
            registration.stop()
        if maintainer:
            maintainer.stop()
        if query.isActive:
            query.stop()
        if commit_catch_up:
            commit_catch_up()


#: Failures that say the machine was too busy, not that anything is wrong: Spark gives a Python
#: process it starts a fixed 10 s to connect back (seen with other work overloading both cores)
TRANSIENT_FAILURES = ("Python worker failed to connect back",)
RESTART = 75      # run()'s answer to such a failure (EX_TEMPFAIL)
RESTARTS = 5


def run_restarting(spark: Spark, job: Job, stop: threading.Event) -> int:
    """run(), started again (with the same checkpoint: exactly once holds) after a failure in
    TRANSIENT_FAILURES, up to RESTARTS times in a row, waiting a little longer each time."""
    for attempt in range(1, RESTARTS + 1):
        rc = run(spark, job, stop)
        if rc != RESTART or stop.is_set():
            return 0 if rc == RESTART else rc
        log.warning("starting the history query again (%d/%d) in %d s", attempt, RESTARTS,
                    10 * attempt)
        if stop.wait(10 * attempt):
            return 0
    return 1


def _short_error(exc: object) -> str:
    """The useful lines of a StreamingQueryException (our own messages, not the JVM stack)."""
    text = str(exc)
    for marker in ("ConnectionError:", "TimeoutError:", "ValueError:", "RuntimeError:"):
        idx = text.find(marker)
        if idx >= 0:
            return text[idx:].splitlines()[0]
    return text.splitlines()[0] if text else repr(exc)


# ---- Spark Connect: the job's session answers queries while it runs ------------------------

CONNECT_TOKEN_CONF = "spark.connect.authenticate.token"


def connect_enabled(job: Job) -> bool:
    # an --available-now run ends when Kafka is drained: nothing to serve
    return job.history.connect and not job.available_now


def jdbc_enabled(job: Job) -> bool:
    """[history] jdbc: the JDBC/ODBC endpoint (sink/history/thrift.py), not in an --available-now run."""
    return job.history.jdbc and not job.available_now


def connect_conf(job: Job) -> dict[str, str]:
    """Where the Spark Connect server of the job's SparkContext listens (read when it starts).

    Under spark-submit the SparkContext exists before this code runs: pass the same settings
    as --conf (see deploy/spark-submit.md)."""
    if not connect_enabled(job):
        return {}
    return {"spark.connect.grpc.binding.address": job.history.connect_host,
            "spark.connect.grpc.binding.port": str(job.history.connect_port)}


def check_connect_port(job: Job) -> None:
    """Fail early, with what to do, when the Spark Connect port is taken."""
    if not connect_enabled(job):
        return
    import socket
    host, port = job.history.connect_host, job.history.connect_port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UsageError(
                f"cannot serve Spark Connect on {host}:{port} ({exc}): is another history job "
                "running? Use --connect-port N ([history] connect_port), or --no-connect "
                "([history] connect = false)") from None


def set_connect_token(spark: Spark, token: str) -> None:
    """Give the Spark Connect server its token in the running SparkContext's own SparkConf (the
    SparkEnv's: read from there when the server starts, Connect.getAuthenticateToken), never as
    a launch setting: PySpark launches the JVM with every setting of the builder as ``--conf
    KEY=VALUE`` on its command line, which every local user reads (``ps``, /proc/PID/cmdline).
    Set after the SQL session exists, so no SQL session's settings (``SET``) copy it either."""
    spark.sparkContext._jsc.sc().conf().set(CONNECT_TOKEN_CONF, token)


def serve_connect(spark: Spark, job: Job) -> None:
    """Start the Spark Connect server in this session's SparkContext (the table ``messages`` is
    in its catalog already: sink/history/catalog.py) and say where to connect."""
    if not connect_enabled(job):
        return
    # Started only now (not with spark.plugins at SparkContext start): the server's sessions
    # derive from the first session it sees, which must be this one with `messages` in its
    # catalog, not one a client's early request would make the server create on its own.
    jvm = spark.sparkContext._jvm
    from settings import environment, secrets
    if job.data_dir:   # clients need the token (settings/secrets.py): made before Spark starts
        token = secrets.connect_token(job.data_dir, create=True)
        assert token is not None   # made when missing (create=True)
        set_connect_token(spark, token)
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    token = ("$" + secrets.TOKEN_ENV if environment.SPARK_CONNECT_TOKEN.is_set() else
             secrets.secret_path(job.data_dir, secrets.TOKEN_FILE) if job.data_dir else None)
    log.info("Spark Connect on %s%s: query the table as `messages`, e.g. python -m sink.query "
             "\"SELECT count(*) FROM messages\"", job.history.connect_url,
             f" (clients need the token in {token})" if token else " (no token: open to every "
             "local process)")


def stop_connect(spark: Spark, job: Job) -> None:
    """Stop the Spark Connect server before its SparkContext: started by serve_connect (not as
    a plugin of the context), it would otherwise answer clients (the dashboard's history charts)
    from a stopped context until the JVM exits."""
    if not connect_enabled(job):
        return
    try:
        svc = spark.sparkContext._jvm.org.apache.spark.sql.connect.service.SparkConnectService
        # (nothing when it was not started, or is stopped already)
        svc.stop(getattr(svc, "stop$default$1")(), getattr(svc, "stop$default$2")())
    except Exception as exc:  # stopping anyway: the JVM ends with the job
        log.debug("cannot stop the Spark Connect server: %s", exc)


def check_kafka(bootstrap: str, timeout: float = 10.0,
                stop: threading.Event | None = None) -> None:
    """Wait until Kafka accepts connections; fail with a clear message after ``timeout`` s."""
    import socket
    last, warned = None, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        for server in bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    return
            except OSError as exc:
                last = exc
        if time.monotonic() - warned > 10:
            warned = time.monotonic()
            log.warning("waiting for Kafka at %s (%s)", bootstrap, last)
        time.sleep(0.5)
    if stop and stop.is_set():
        return
    raise ConnectionError(f"cannot reach Kafka at {bootstrap} ({last}). Is Kafka running? "
                          "Set the address with --kafka-bootstrap or [sink] bootstrap_servers")


AUTOGROUP = "/proc/self/autogroup"
AUTOGROUP_RETRY_SECONDS = 0.11  # the kernel takes one autogroup write per 100 ms (below)


def lower_priority(nice: int) -> None:
    """Run at niceness `nice` (never raised back if already lower); the JVM and the Python
    workers started later inherit it.

    Linux with autogroup scheduling (sched_autogroup_enabled=1) shares the CPU fairly between
    sessions first and applies a process's niceness only within its session: a job started in
    its own session (setsid, as a supervisor or `start_new_session` does) would still take
    half the CPU from the broker under load. Such a job leads its session, whose autogroup
    holds only it and its children, so it lowers the autogroup's niceness too."""
    try:
        now = os.getpriority(os.PRIO_PROCESS, 0)
        if nice > now:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            log.info("running at niceness %d ([history] nice): the broker's CPU comes first", nice)
    except OSError as exc:
        log.warning("cannot set niceness %d: %s", nice, exc)
    if os.getsid(0) != os.getpid():
        return  # sharing a session (and its autogroup) with others: the niceness above is enough
    try:
        with open(AUTOGROUP) as f:
            text = f.read()
        if not text.strip():
            return  # the kernel's default autogroup (init's session) shows nothing: none of ours
        now = int(text.rsplit("nice", 1)[1])
    except FileNotFoundError:
        return  # no autogroup scheduling on this kernel
    except (OSError, ValueError, IndexError) as exc:
        log.warning("cannot read this session's autogroup (%s): %s", AUTOGROUP, exc)
        return
    if nice > now:
        set_autogroup_nice(nice)


def set_autogroup_nice(nice: int, attempts: int = 10) -> bool:
    """Write `nice` to this session's autogroup. Without CAP_SYS_ADMIN the kernel accepts one
    such write per 100 ms on the whole machine and answers EAGAIN to the others
    (proc_sched_autogroup_set_nice): wait and retry."""
    for attempt in range(attempts):
        try:
            fd = os.open(AUTOGROUP, os.O_WRONLY)
            try:
                os.write(fd, str(nice).encode())
            finally:
                os.close(fd)
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(AUTOGROUP_RETRY_SECONDS)
        except OSError as exc:
            log.warning("cannot set the niceness of this session's autogroup (%s) to %d: %s",
                        AUTOGROUP, nice, exc)
            return False
    log.warning("cannot set the niceness of this session's autogroup (%s) to %d: the kernel "
                "kept answering EAGAIN (it rate-limits these writes) for %.1f s",
                AUTOGROUP, nice, attempts * AUTOGROUP_RETRY_SECONDS)
    return False


_hard_exit_hooks: list = []   # run before a third signal ends the job at once


def stop_on_signals(stop: threading.Event) -> Callable[[int, FrameType | None], None]:
    """The SIGINT/SIGTERM handler: the first asks for a clean stop; the next one (Ctrl-C
    twice, or a terminal's SIGINT followed by a supervisor's SIGTERM) only says that the stop is
    under way; a third exits at once, after reporting the last committed batch to the broker."""
    count = [0]

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        count[0] += 1
        if count[0] == 1:
            log.info("%s received: stopping (every committed batch is kept; a batch in progress "
                     "is redone at the next start)", name)
            stop.set()
        elif count[0] == 2:
            log.info("%s again: already stopping, in a few seconds (the query stops, then the "
                     "last commit is reported to the broker); a third signal exits at once", name)
        else:
            log.warning("%s a third time: exiting now, without waiting for the query to stop (the "
                        "batch in progress is redone at the next start; committed batches are "
                        "kept and reported to the broker first)", name)
            for hook in _hard_exit_hooks:
                try:
                    hook()
                except Exception as exc:  # exiting anyway: say what was not done
                    log.error("could not report the last commit to the broker: %s", exc)
            os._exit(130)
    return on_signal


def guard_build_root(data_dir: str | None) -> Path:
    """Where the guard's classes are compiled: the checkout's build/, or, where that cannot be
    written (an image installed read-only, as deploy/Dockerfile's), the data directory's."""
    from sink.history.spark import PROJECT_ROOT
    root = Path(PROJECT_ROOT) / "build"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return Path(data_dir or tempfile.gettempdir()) / "build"


def quiet_py4j_retry(record: logging.LogRecord) -> bool:
    """A log filter: py4j logs "Exception while sending command." with its traceback at INFO on
    the root logger when a pooled connection to the JVM was closed while idle, then sends the
    command again on a new one (nothing failed). A retry that fails too is logged at ERROR
    (logging.exception), which passes."""
    return not (record.name == "root" and record.levelno == logging.INFO
                and record.module == "java_gateway")


def main(argv: Sequence[str] | None = None) -> int:
    from settings import ConfigError
    from settings import report as report_config_error
    try:
        job, args = config_from_args(argv)
    except ConfigError as exc:
        return report_config_error(exc)
    except UsageError as exc:
        print(f"sink.job: error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the source says what it recovers from (a Kafka restart) in one line; the client's own
    # warnings about each dropped connection read like data loss and add nothing
    logging.getLogger("kafka").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet_py4j_retry)
    for note in args.notes:
        log.warning("%s", note)
    announce(job)
    stop = threading.Event()
    on_signal = stop_on_signals(stop)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    lower_priority(job.history.nice)
    try:
        # A broker starting beside the job may need a moment to bring its (embedded) Kafka up.
        check_kafka(job.bootstrap, timeout=10.0 if job.available_now else 120.0, stop=stop)
        if stop.is_set():
            log.info("history job stopped before it started")
            return 0
        from sink.history import catalog, guard, thrift
        from sink.history.spark import (
            JOB_LOCAL_CONF,
            JOB_LOCAL_ENV,
            get_spark,
            launched_by_spark_submit,
        )
        check_connect_port(job)
        for k, v in JOB_LOCAL_ENV.items():
            os.environ.setdefault(k, v)
        conf = connect_conf(job)
        if conf and job.data_dir:
            # the token file first: a sink.query or dashboard started meanwhile reads it while
            # it waits for the server (given to the JVM only once it runs: serve_connect)
            from settings import secrets
            secrets.connect_token(job.data_dir, create=True)
        serving = connect_enabled(job) or jdbc_enabled(job)
        guard_conf: dict[str, str] = {}
        if serving:
            try:
                guard_conf = guard.launch_conf(guard_build_root(job.data_dir))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                # the table is still written; check_active below then serves no endpoint
                log.error("cannot build the read-only guard of Spark Connect and JDBC: %s", exc)
        spark = get_spark("mqtt-history-job", quiet_start=True, conf={
            **({} if launched_by_spark_submit() else JOB_LOCAL_CONF),
            **conf, **catalog.session_conf(job.history), **guard_conf})
        if serving:
            guard.trust(spark)   # first: its clients' sessions are read-only, not the job's
        catalog.register_in_session(spark, job.history)  # `messages` for Spark Connect and JDBC
        try:
            if serving:
                guard.check_active(spark)
            serve_connect(spark, job)
            if jdbc_enabled(job):
                thrift.serve_thrift(spark, job.history)
        except guard.GuardMissing as exc:   # the history is still written; nobody reads it here
            log.error("%s", exc)
        # SparkContext installs its own SIGINT handler (cancel jobs + KeyboardInterrupt): ours
        # must win so that Ctrl-C stops the query cleanly.
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            return run_restarting(spark, job, stop)
        finally:
            stop_connect(spark, job)
            spark.stop()
    except UsageError as exc:
        log.error("%s", exc)
        return 2
    except ConnectionError as exc:
        log.error("%s", exc)
        return 1


def cli(argv: Sequence[str] | None = None) -> int:
    """The command: main(), then SIGINT and SIGTERM ignored for the interpreter's exit, which
    drops the Python handlers (SIG_DFL): a supervisor's SIGTERM arriving then (scripts/run.sh
    sends one after Ctrl-C) would end a clean stop with -15. SIGKILL still ends a stuck exit."""
    code = main(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(cli())
