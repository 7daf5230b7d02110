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

The package, one concern a module: config.py (the command line and the run's settings: Job),
stream.py (building the streaming query), runner.py (the run that owns its query; restarts),
progress.py (progress reports, the offsets of committed batches), report.py (what the job
tells the broker in its data directory), connect.py (the Spark Connect server), probe.py (waiting
for Kafka), process.py (signals, niceness, the guard's build root), command.py (main, cli).
"""
from sink.history.job.command import cli, main
from sink.history.job.config import FLAG_KEYS, Job, UsageError, config_from_args, flags_of, load_job
from sink.history.job.connect import check_connect_port, connect_conf
from sink.history.job.process import guard_build_root, lower_priority
from sink.history.job.progress import committed_from_checkpoint, committed_offsets, progress_since
from sink.history.job.report import announce
from sink.history.job.runner import run
from sink.history.job.stream import DEDUP_MARKER, PARQUET_OPTIONS, SOURCE_MARKER, dedup_in_source, start_query

# what the commands (sink/job.py, sink/maintain.py, scripts/setup.sh), the tests and the
# benchmarks import from here
__all__ = ["DEDUP_MARKER", "FLAG_KEYS", "PARQUET_OPTIONS", "SOURCE_MARKER", "Job", "UsageError",
           "announce", "check_connect_port", "cli", "committed_from_checkpoint", "committed_offsets",
           "config_from_args", "connect_conf", "dedup_in_source", "flags_of", "guard_build_root",
           "load_job", "lower_priority", "main", "progress_since", "run", "start_query"]
