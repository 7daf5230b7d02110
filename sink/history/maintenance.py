"""Table maintenance: retention, compaction, deleting what no version needs any more.

One pass (``maintain_once``) does, in order: drop the days past ``[history] retention``
(retention.py), compact what ``compaction.plan`` finds, delete files removed more than the
delete delay ago and left-overs of writers that died before their commit (manifest.py). The job
runs a pass every ``compact_check_seconds`` in a thread of its own (``Maintainer``: its Spark
jobs go to a pool of the FAIR scheduler, beside the stream's); ``python -m sink.maintain`` runs
one on demand. Both can run at once: every change is one commit of the table's log, refused
when another writer changed the same files first.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from settings import HistoryConfig
from sink.history.compaction import Layout, Policy, compact, describe_left, survey
from sink.history.manifest import Table
from sink.history.retention import retention_change
from sink.history.writer import adopt_file_sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sink.history.writer import BatchHook, BatchWriter

log = logging.getLogger(__name__)

POOL = "maintenance"
JOB_GROUP = "history-maintenance"


@dataclass
class Settings:
    compact: bool = True
    policy: Policy = field(default_factory=Policy)
    retention_ms: int | None = None
    check_seconds: float = 60.0


def settings_of(hist: HistoryConfig) -> Settings:
    """The maintenance settings of a [history] section (retention, compact_*)."""
    from sink.history.retention import parse_duration
    return Settings(compact=hist.compact,
                    policy=Policy(target_bytes=int(hist.compact_target_mb) << 20,
                                  grace_ms=int(hist.compact_grace_seconds * 1000),
                                  open_max_files=int(hist.compact_open_files)),
                    retention_ms=parse_duration(hist.retention),
                    check_seconds=float(hist.compact_check_seconds))


def job_table(spark: Any, hist: HistoryConfig) -> Table:  # a SparkSession (keeps the tables on it)
    """The job's table (opened once per job: the writer and the maintainer share it)."""
    table = getattr(spark, "_mqtt_history_tables", {}).get(hist.table)
    if table is None:
        table = open_table(spark, hist.table, hist.checkpoint_dir,
                           int(hist.delete_delay_seconds * 1000))
        spark._mqtt_history_tables = {**getattr(spark, "_mqtt_history_tables", {}),
                                      hist.table: table}
    return table


def batch_writer(spark: SparkSession, hist: HistoryConfig, parquet_options: dict,
                 rules: BatchHook | None = None) -> BatchWriter:
    """The job's foreachBatch function (writer.BatchWriter) for hist.table; ``rules``: the
    stateless rules, run on each batch's staged files (sink/history/rules/shared.py)."""
    from sink.history.sparkplug.table import SparkplugWriter, table_path
    from sink.history.writer import BatchWriter
    sparkplug = SparkplugWriter(table_path(hist.table), hist.sparkplug_max_nodes)
    return BatchWriter(job_table(spark, hist), hist.checkpoint_dir, parquet_options,
                       settings_of(hist).retention_ms, sparkplug, rules)


def start_maintainer(spark: SparkSession, hist: HistoryConfig, parquet_options: dict,
                     available_now: bool = False) -> "Maintainer | None":
    """Start the job's maintenance thread (None: a remote table, written by Spark's file
    sink, or an --available-now run, which ends when Kafka is drained)."""
    from sink.history.paths import is_local_path
    settings = settings_of(hist)
    if not is_local_path(hist.table) or available_now:
        return None
    from sink.history.sparkplug.table import file_layout, table_path
    sparkplug = Table(table_path(hist.table), int(hist.delete_delay_seconds * 1000))
    m = Maintainer(spark, job_table(spark, hist), settings, parquet_options,
                   others=[(sparkplug, file_layout())])
    m.start()
    return m


def open_table(spark: SparkSession, table_path: str, checkpoint: str | None,
               delete_delay_ms: int | None = None) -> Table:
    """The table's log, ready for writing: a file-sink table adopted, the Spark log of the
    newest version written again (it names files by absolute path: the directory may have
    moved) and any missing one written."""
    kw: dict[str, Any] = {} if delete_delay_ms is None else {"delete_delay_ms": delete_delay_ms}
    table = Table(table_path, **kw)
    table.root.mkdir(parents=True, exist_ok=True)
    adopt_file_sink(spark, table, checkpoint)
    table.repair_spark_log(rewrite_latest=True)
    return table


def maintain_once(spark: SparkSession, table: Table, settings: Settings, now_ms: int | None = None,
                  parquet_options: dict | None = None, should_stop: Callable[[], bool] = lambda: False,
                  layout: Layout | None = None) -> dict:
    """One maintenance pass as of ``now_ms`` (default: now). Returns what it did. ``layout``:
    the table's files, for compaction (None: ``messages``; sparkplug_metrics gives its own)."""
    now = table.clock() if now_ms is None else now_ms
    out: dict = {}
    dropped = table.commit(retention_change(now, settings.retention_ms))
    out["expired_days"] = dropped.detail["dates"] if dropped else []
    if settings.compact:
        out["compaction"] = compact(spark, table, now, settings.policy, parquet_options,
                                    should_stop=should_stop, layout=layout)
    out["deleted_removed"] = bool(table.expire_removed())
    out["orphans"] = table.delete_orphans()
    snap = table.snapshot()
    out.update(version=snap.id, files=len(snap.files), rows=snap.rows, bytes=snap.bytes)
    if settings.compact:
        out["left"] = survey(snap, now, settings.policy)[1]
    return out


def describe(result: dict, policy: Policy | None = None) -> str:
    """What a pass did and what it left, for a person (sink.maintain prints it)."""
    policy = policy or Policy()
    c = result.get("compaction") or {}
    parts = [f"version {result['version']}: {result['files']} files, {result['rows']} rows, "
             f"{result['bytes'] / 1e6:.1f} MB"]
    if c.get("tasks"):
        mb = c["bytes_in"] / 1e6
        parts.append(f"compacted {c['files_in']} files into {c['files_out']} ({mb:.1f} MB in "
                     f"{c['seconds']:.1f} s, {mb / max(c['seconds'], 1e-6):.1f} MB/s)")
    elif "compaction" in result:
        parts.append("compacted nothing")
    else:
        parts.append("compaction is off ([history] compact = false)")
    if c.get("skipped"):
        parts.append(f"{c['skipped']} compaction(s) left to another writer")
    if result.get("left"):
        left = describe_left(result["left"], policy)
        if left:
            parts.append(left)
    if result.get("expired_days"):
        parts.append(f"dropped {len(result['expired_days'])} day(s) past the retention "
                     f"({result['expired_days'][0]} .. {result['expired_days'][-1]})")
    if result.get("orphans"):
        parts.append(f"deleted {result['orphans']} left-over file(s)")
    return "; ".join(parts)


class Maintainer(threading.Thread):
    """The job's maintenance thread: a pass every ``settings.check_seconds``."""

    def __init__(self, spark: SparkSession, table: Table, settings: Settings,
                 parquet_options: dict | None = None,
                 others: list[tuple[Table, Layout]] | None = None) -> None:
        super().__init__(name="history-maintenance", daemon=True)
        self.spark, self.table, self.settings = spark, table, settings
        self.parquet_options = parquet_options
        # tables the job writes beside it (sparkplug_metrics): the same retention and compaction
        self.others = list(others or [])
        self._halt = threading.Event()
        self.passes = 0
        self.last: dict | None = None

    def run(self) -> None:
        sc = self.spark.sparkContext
        sc.setLocalProperty("spark.scheduler.pool", POOL)
        sc.setJobGroup(JOB_GROUP, "history table maintenance", interruptOnCancel=True)
        while not self._halt.wait(self.settings.check_seconds):
            started = time.monotonic()
            try:
                self.last = maintain_once(self.spark, self.table, self.settings,
                                          parquet_options=self.parquet_options,
                                          should_stop=self._halt.is_set)
                self.passes += 1
                c = self.last.get("compaction") or {}
                if c.get("tasks") or self.last.get("expired_days") or self.last.get("orphans"):
                    log.info("maintenance (%.1f s): %s", time.monotonic() - started,
                             describe(self.last, self.settings.policy))
                for table, layout in self.others:
                    if self._halt.is_set() or not table.exists():
                        continue
                    started = time.monotonic()
                    done = maintain_once(self.spark, table, self.settings, layout=layout,
                                         should_stop=self._halt.is_set)
                    c = done.get("compaction") or {}
                    if c.get("tasks") or done.get("expired_days") or done.get("orphans"):
                        log.info("maintenance of %s (%.1f s): %s", table.root.name,
                                 time.monotonic() - started, describe(done, self.settings.policy))
            except Exception as exc:  # the stream goes on; the next pass tries again
                if self._halt.is_set():
                    return
                log.warning("table maintenance failed (tried again in %g s): %s",
                            self.settings.check_seconds, str(exc).splitlines()[0][:500])

    def stop(self, timeout: float = 30.0) -> None:
        self._halt.set()
        try:  # a pass under way is cut short; none (the usual case): nothing to cancel
            sc = self.spark.sparkContext
            tracker = sc.statusTracker()
            if set(tracker.getJobIdsForGroup(JOB_GROUP)) & set(tracker.getActiveJobsIds()):
                sc.cancelJobGroup(JOB_GROUP)
        except Exception:  # the context may be stopping already
            pass
        self.join(timeout)


# ---- python -m sink.maintain ---------------------------------------------------------------

def parse_time(text: str) -> int:
    """'2024-05-03', '2024-05-03T10:00:00Z', '2024-05-03 10:00' (UTC unless an offset is given)
    or 'now' -> ms."""
    import datetime as dt
    if text.strip().lower() == "now":
        return int(time.time() * 1000)
    t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp() * 1000)
