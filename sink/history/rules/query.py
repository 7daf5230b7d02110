"""One rule's streaming query: its own read of Kafka (the Python source, from the latest offsets
for a new checkpoint), the history columns (sink/history/schema.py, ``payload_json`` included)
with a watermark on ``accepted_at`` as the temp view ``messages`` of a session of its own, the
rule's SQL over it, in append mode (a windowed aggregation emits each window once, when the
watermark passes its end), and ``foreachBatch``: the rows appended to the rule's table (exactly
once: one Parquet file per micro-batch, named by the batch id), then published (at least once).

Its checkpoint: ``<checkpoint_dir>/rules/<name>`` (with ``rule.json``, the definition it was made
with: a rule started with another definition starts a new checkpoint).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from settings.rules import RuleSpec, client_id
from sink.history.job.config import Job
from sink.history.paths import is_local_path
from sink.history.paths import local as _local
from sink.history.rules.publish import Publisher
from sink.history.rules.rowjson import row_json

log = logging.getLogger(__name__)

DEFINITION_FILE = "rule.json"
VIEW = "messages"


class RuleSQLError(ValueError):
    """The rule's SQL cannot run as a stream (Spark's message): not retried until it changes."""


def checkpoint_dir(job: Job, name: str) -> str:
    return os.path.join(str(_local(job.history.checkpoint_dir)), "rules", name)


def derived_dir(job: Job, table: str) -> Path:
    """Where a rule's table lives: ``<table>_derived/<name>`` beside the history table."""
    return Path(str(_local(job.history.table)).rstrip("/") + "_derived") / table


def prepare_checkpoint(path: str, spec: RuleSpec) -> None:
    """Keep the checkpoint when it was made for this definition; else start a new one (the old
    state and offsets belong to other SQL)."""
    d = Path(path)
    want = {"sql": spec.sql, "publish": spec.publish, "table": spec.table}
    try:
        have = json.loads((d / DEFINITION_FILE).read_text())
    except (OSError, ValueError):
        have = None
    if have != want:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        (d / DEFINITION_FILE).write_text(json.dumps(want))


def remove_checkpoint(job: Job, name: str) -> None:
    shutil.rmtree(checkpoint_dir(job, name), ignore_errors=True)


def short_error(exc: BaseException) -> str:
    """Spark's message without the JVM stack (first lines)."""
    text = str(exc).strip()
    for cut in ("\nJVM stacktrace:", "\n\tat ", "\n== Physical Plan"):
        i = text.find(cut)
        if i > 0:
            text = text[:i]
    return text[:2000]


def rule_job(job: Job, spec: RuleSpec) -> Job:
    """The job as one rule's reader sees it: its checkpoint, a new one reading from the latest
    offsets (a rule sees the messages from when it started; a restart resumes)."""
    hist = dataclasses.replace(job.history, checkpoint=checkpoint_dir(job, spec.name),
                               starting_offsets="latest", max_records_per_trigger=0)
    return dataclasses.replace(job, history=hist)


def rule_frame(session: Any, job: Job, spec: RuleSpec, watermark: str) -> Any:
    """The rule's streaming DataFrame (raises RuleSQLError when its SQL cannot run)."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from sink.history.job.stream import build_history_stream, kafka_stream
    kafka_df, _ = kafka_stream(session, rule_job(job, spec), dedup=False)
    stream = build_history_stream(kafka_df, deduplicated=True).withWatermark("accepted_at", watermark)
    # never the rule's own messages (settings.rules.client_id)
    stream.where(~F.col("client_id").eqNullSafe(F.lit(client_id(spec.name)))).createOrReplaceTempView(VIEW)
    try:
        df = session.sql(spec.sql)
    except PySparkException as exc:
        raise RuleSQLError(short_error(exc)) from exc
    if not df.isStreaming:
        raise RuleSQLError(f"rule {spec.name}: its SQL does not read the stream `messages`")
    return df


def rule_session(spark: Any, job: Job, spec: RuleSpec, watermark: str) -> tuple[Any, Any]:
    """(a session of the rule's own, its streaming DataFrame); raises RuleSQLError."""
    if spec.table and not is_local_path(job.history.table):
        raise RuleSQLError(f"rule {spec.name}: table rules need a local history table "
                           f"(not {job.history.table})")
    session = spark.newSession()
    session.conf.set("spark.sql.session.timeZone", "UTC")
    return session, rule_frame(session, job, spec, watermark)


class RuleQuery:
    """A running rule: the query, its publisher, what it put out."""

    def __init__(self, spark: Any, job: Job, spec: RuleSpec, publisher: Publisher | None,
                 watermark: str, trigger_seconds: float, frame: tuple[Any, Any] | None = None
                 ) -> None:
        """``frame``: (session, streaming DataFrame) made by rule_session (else made here)."""
        self.spec, self.job, self.publisher = spec, job, publisher
        self.rows: int = 0
        self.last_row_at: float | None = None
        self._lock = threading.Lock()
        session, df = frame or rule_session(spark, job, spec, watermark)
        self.session = session
        ck = checkpoint_dir(job, spec.name)
        prepare_checkpoint(ck, spec)
        from pyspark.errors import PySparkException
        writer = (df.writeStream.foreachBatch(self._batch).outputMode("append")
                  .option("checkpointLocation", ck).queryName(f"rule_{spec.name}")
                  .trigger(processingTime=f"{trigger_seconds:g} seconds"))
        try:
            self.query = writer.start()
        except PySparkException as exc:   # e.g. an aggregation without a window on accepted_at
            raise RuleSQLError(short_error(exc)) from exc

    def _batch(self, batch_df: Any, batch_id: int) -> None:
        batch_df = batch_df.persist()
        try:
            rows = batch_df.collect()
            if not rows:
                return
            if self.spec.table:
                append_once(self.session, self.job, self.spec.table, batch_df, batch_id)
            if self.spec.publish and self.publisher is not None:
                self.publisher.publish_all(self.spec.publish, [row_json(r) for r in rows])
            with self._lock:
                self.rows += len(rows)
                self.last_row_at = time.time()
        finally:
            batch_df.unpersist()

    def input_rate(self) -> float:
        p = self.query.lastProgress
        return float(p.get("processedRowsPerSecond") or 0.0) if p else 0.0

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            if self.publisher is not None:
                self.publisher.close()


def append_once(session: Any, job: Job, table: str, batch_df: Any, batch_id: int,
                prefix: str = "batch") -> None:
    """The batch's rows as one file ``<prefix>-<id>.parquet`` of the table's directory (prefix
    ``hbatch`` for a rule run on the history's batches: shared.py), made by an
    atomic rename: a batch run again after a crash finds its file and adds nothing (exactly
    once). The table is registered in the catalog (database [history] database) on first use."""
    from sink.history.catalog import quote_ident
    d = derived_dir(job, table)
    final = d / f"{prefix}-{batch_id:012d}.parquet"
    if not final.exists():
        tmp = d / f"_tmp-{batch_id:012d}"
        shutil.rmtree(tmp, ignore_errors=True)
        batch_df.coalesce(1).write.parquet(str(tmp))
        parts = sorted(tmp.glob("part-*.parquet"))
        if parts:
            os.replace(parts[0], final)
        shutil.rmtree(tmp, ignore_errors=True)
    cols = ", ".join(f"{quote_ident(f.name)} {f.dataType.simpleString()}"
                     for f in batch_df.schema.fields)
    loc = str(d.resolve()).replace("\\", "\\\\").replace("'", "\\'")
    name = f"{quote_ident(job.history.database)}.{quote_ident(table)}"
    session.sql(f"CREATE TABLE IF NOT EXISTS {name} ({cols}) USING parquet LOCATION '{loc}'")
    session.sql(f"REFRESH TABLE {name}")
