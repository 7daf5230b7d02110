"""The job's sink: each micro-batch's rows -> Parquet files -> one commit of the table's log.

Used as ``writeStream.foreachBatch(BatchWriter(...))`` in place of Spark's file sink (whose log
can never drop a file, see manifest.py). Per micro-batch:

1. skip it if the table's newest version already records this stream's batch (a batch run again
   after a crash between our commit and Spark's checkpoint commit: written once, not twice);
2. write its rows to ``_staging`` partitioned by ``date`` and UTC hour (one Spark action: the
   source is read once), rows of days past the retention left out;
3. move the files into their ``date=`` directory and commit them (manifest.Table.commit).

Spark commits the batch to its checkpoint after this returns; the progress file the broker
reads (sink/history/commits.py) follows the checkpoint, so it never runs ahead of the table.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sink.history.manifest import Change, FileEntry, Snapshot, Table, crash_point, date_of, staged_files
from sink.history.retention import first_kept_date

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

HOUR_COLUMN = "_h"   # staging-only partition column: the UTC hour of accepted_at
STREAM_SHREDDING = "spark.sql.variant.writeShredding.enabled"


def checkpoint_stream_id(checkpoint: str) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (None before the first start)."""
    try:
        return json.loads(Path(checkpoint, "metadata").read_text().splitlines()[0])["id"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


class BatchHook(Protocol):
    """What runs on each batch beside the table (the stateless rules: rules/shared.py)."""

    def wanted(self) -> bool: ...

    def __call__(self, df: DataFrame, batch_id: int, staged: Path) -> None: ...


class SideTable(Protocol):
    """What writes a table of its own from each batch's staged files, before the batch's commit
    (sink/history/sparkplug/table.py SparkplugWriter): `topic_prefix` names the rows it wants;
    called with (session, staged files, batch id, stream id, how many of the batch's rows have
    such a topic, or None when not counted)."""
    topic_prefix: str

    def __call__(self, spark: SparkSession, staged: Path, batch_id: int, stream_id: str,
                 wanted: int | None) -> object: ...


class BatchWriter:
    """``foreachBatch`` function writing micro-batches into ``table`` exactly once."""

    def __init__(self, table: Table, checkpoint: str, parquet_options: dict | None = None,
                 retention_ms: int | None = None,
                 sparkplug: SideTable | None = None,
                 rules: BatchHook | None = None) -> None:
        self.table = table
        self.checkpoint = checkpoint
        self.parquet_options = dict(parquet_options or {})
        self.retention_ms = retention_ms
        self.stream_id: str | None = None
        # sparkplug_metrics (sink/history/sparkplug/table.py): from the batch's staged files,
        # committed before the batch's own commit (a re-run batch skips what it holds)
        self.sparkplug = sparkplug
        # the stateless rules (sink/history/rules/shared.py): over the batch's staged files,
        # before the commit (a batch run again after a crash gives their rows again: at least
        # once)
        self.rules = rules
        self.last: Snapshot | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F
        if self.stream_id is None:
            self.stream_id = checkpoint_stream_id(self.checkpoint) or "unknown"
        snap = self.table.snapshot()
        if snap.stream_batch(self.stream_id) >= batch_id:
            log.info("batch %d is already in the table (version %d): not written again",
                     batch_id, snap.id)
            return
        staging = self.table.staging(f"b{batch_id}")
        # the stateless rules read the batch back from the files it is written to (only the
        # columns they use): keeping the whole batch in memory for them cost more than the
        # rules themselves (25,000-row batches: +0.4 s per batch to write, against ~0.1 s to
        # run a rule)
        rules = self.rules if self.rules is not None and self.rules.wanted() else None
        # payload_json unshredded in a micro-batch's small files (inferring and writing the
        # shredded columns was the larger part of the column's cost per row): compaction,
        # which merges them within the hour, writes it shredded. The stream's own session (a
        # clone): the compaction beside it keeps the setting of the job's session.
        df.sparkSession.conf.set(STREAM_SHREDDING, "false")
        try:
            out = df.withColumn(HOUR_COLUMN, F.hour("accepted_at"))
            if self.retention_ms:
                kept = first_kept_date(self.table.clock(), self.retention_ms)
                out = out.where(F.col("date") >= F.lit(kept))
            seen = None
            if self.sparkplug is not None:
                # how many of the batch's rows the Sparkplug B table wants, counted while they
                # are written (no second pass): most batches have none, and then the staged
                # files are not read again (nor pyarrow loaded into the driver for it)
                from pyspark.sql import Observation
                seen = Observation(f"sparkplug-{batch_id}")
                out = out.observe(seen, F.count_if(
                    F.col("topic").startswith(self.sparkplug.topic_prefix)).alias("rows"))
            writer = out.write.mode("overwrite")
            for k, v in self.parquet_options.items():
                writer = writer.option(k, v)
            writer.partitionBy("date", HOUR_COLUMN).parquet(str(staging / "out"))
            crash_point("append:after-write")
            if self.sparkplug is not None:
                wanted = int(seen.get["rows"]) if seen is not None else None
                self.sparkplug(df.sparkSession, staging / "out", batch_id, self.stream_id, wanted)
                crash_point("append:after-sparkplug")
            if rules is not None:
                rules(df, batch_id, staging / "out")
            files = self.table.place(staged_files(staging / "out"), f"b{batch_id:08d}",
                                     batch_id, 0)
            crash_point("append:after-place")
            if not files:
                return
            self.last = self.table.commit(Change(
                op="append", add=files, stream={"id": self.stream_id, "batch": batch_id},
                detail={"batch": batch_id, "rows": sum(f.rows for f in files)}))
            crash_point("append:after-commit")
        finally:
            shutil.rmtree(staging, ignore_errors=True)


# ---- a table written by Spark's file sink (before this log existed) ---------------------------

def legacy_log_ids(table: Table) -> list[int]:
    """Batch ids of Spark's file-sink log in ``_spark_metadata`` (empty: none)."""
    return table.spark_log_ids()


def adopt_file_sink(spark: SparkSession, table: Table, checkpoint: str | None) -> Snapshot | None:
    """Give a table written by Spark's file sink its first manifest version: the files its
    ``_spark_metadata`` lists (Spark reads them for us), then replace that log by ours. A
    no-op when the table has a manifest already or no file-sink log."""
    if table.exists():
        return None
    ids = legacy_log_ids(table)
    if not ids:
        return None
    import pyarrow.parquet as pq

    from sink.history.schema import HISTORY_SCHEMA
    paths = spark.read.schema(HISTORY_SCHEMA).parquet(str(table.root)).inputFiles()
    entries = []
    for uri in paths:
        p = Path(uri[len("file:"):] if uri.startswith("file:") else uri)
        p = Path("/" + str(p).lstrip("/"))
        rel = p.relative_to(table.root).as_posix()
        entries.append(FileEntry(path=rel, date=date_of(rel), hour=None, size=p.stat().st_size,
                                 rows=pq.read_metadata(p).num_rows, level=0))
    stream_id = checkpoint_stream_id(checkpoint) if checkpoint else None
    snap = table.adopt(entries, first_id=max(ids) + 1,
                       stream={"id": stream_id, "batch": max(ids)} if stream_id else None)
    log.info("adopted %d files of Spark's file-sink log into the table's manifest (version %d)",
             len(entries), snap.id)
    return snap

