"""Compaction: the many small files of micro-batches become few large ones.

Every micro-batch writes one file per UTC hour it touched (inside the ``date`` partition; the
hour is in the manifest and the file name). Files are merged in three cases:

- a **closed day** (its end, UTC midnight, is ``grace`` in the past): its files smaller than
  half the target are merged into ``ceil(bytes / target)`` files (target 128 MiB): one file per
  closed day when the day is smaller than the target. This is the unit the table is kept in.
- a **closed hour** of a day still open (the hour's end ``grace`` ago): its small files become
  one file, so today holds about one file per hour;
- an **open hour** with ``open_max_files`` small files (a 5 s trigger makes 720 an hour): they
  are merged, so today's queries never read more than about that many small files.

Rows that arrive late for a closed day (a replayed spool) add small files to it; the next pass
merges them in. Files written before the table had ``payload_json`` get it as they are merged
(parsed from ``payload_text``; schema.py). Merged files are sorted by ``accepted_at`` (then
Kafka partition and offset), so a time filter skips most row groups by their statistics.

A task writes its output to ``_staging``, moves it into the partition under new names, checks
that it holds exactly the rows of its inputs (Parquet footers), then commits "remove the
inputs, add the outputs" as one version (manifest.py). Readers see the inputs or the outputs,
never both and never neither. A crash at any step leaves the last committed version intact;
uncommitted output is deleted later as an orphan. If another writer removed an input first
(``sink.maintain`` and the job compacting the same hour), the commit is refused (Conflict)
and the output deleted.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from sink.history.manifest import Change, Conflict, FileEntry, Snapshot, Table, crash_point, staged_files
from sink.history.retention import DAY_MS, day_start_ms

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
DEFAULT_TARGET_BYTES = 128 << 20
DEFAULT_GRACE_MS = 300_000
DEFAULT_OPEN_MAX_FILES = 120
LEVEL_BATCH, LEVEL_HOUR, LEVEL_DAY = 0, 1, 2


@dataclass(frozen=True)
class Layout:
    """A table's files as compaction reads and sorts them (None: ``messages``'s, schema.py):
    the columns inside a file, SQL giving columns older files lack, the sort columns."""
    file_schema: Any = None
    fills: tuple[tuple[str, str], ...] = ()
    order: tuple[str, ...] = ()


def history_layout() -> Layout:
    from sink.history.schema import FILE_SCHEMA, PAYLOAD_JSON_FILL_SQL
    # files written before `payload_json` existed read it as NULL: parsed here, once
    return Layout(FILE_SCHEMA, (("payload_json", PAYLOAD_JSON_FILL_SQL),),
                  ("accepted_at", "kafka_partition", "kafka_offset"))


@dataclass(frozen=True)
class Policy:
    target_bytes: int = DEFAULT_TARGET_BYTES
    grace_ms: int = DEFAULT_GRACE_MS
    open_max_files: int = DEFAULT_OPEN_MAX_FILES

    @property
    def small(self) -> int:
        return self.target_bytes // 2


@dataclass
class Task:
    date: str
    hour: int | None           # None: the whole (closed) day
    inputs: list[FileEntry] = field(default_factory=list)
    reason: str = ""

    @property
    def level(self) -> int:
        return LEVEL_DAY if self.hour is None else LEVEL_HOUR

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.inputs)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.inputs)

    def __str__(self) -> str:
        where = self.date if self.hour is None else f"{self.date} {self.hour:02d}:00"
        return (f"{where} ({self.reason}: {len(self.inputs)} files, {self.rows} rows, "
                f"{self.bytes / 1e6:.1f} MB)")


# Why a file was left as it is (survey()), for sink.maintain's report
LEFT_LARGE = "large"           # at least half the target size: never merged again
LEFT_OPEN = "open"             # in an hour (or day) not yet closed, below open_max_files
LEFT_ALONE = "alone"           # the only small file of its closed hour or day


def plan(snap: Snapshot, now_ms: int, policy: Policy = Policy()) -> list[Task]:
    """The compaction tasks the table needs as of ``now_ms``, oldest first."""
    return survey(snap, now_ms, policy)[0]


def survey(snap: Snapshot, now_ms: int,
           policy: Policy = Policy()) -> tuple[list[Task], dict[str, int]]:
    """``plan``'s tasks, and how many files no task takes, by why (LEFT_*)."""
    by_date: dict[str, list[FileEntry]] = defaultdict(list)
    for f in snap.files:
        by_date[f.date].append(f)
    tasks = []
    left = {LEFT_LARGE: 0, LEFT_OPEN: 0, LEFT_ALONE: 0}

    def take(small: list[FileEntry], task: Task | None, why: str) -> None:
        if task is not None:
            tasks.append(task)
        else:
            left[why] += len(small)

    for date in sorted(by_date):
        files = by_date[date]
        large = [f for f in files if f.size >= policy.small]
        left[LEFT_LARGE] += len(large)
        start = day_start_ms(date)
        if start + DAY_MS + policy.grace_ms <= now_ms:  # closed day: one unit
            small = [f for f in files if f.size < policy.small]
            take(small, Task(date, None, small, "closed day") if len(small) >= 2 else None,
                 LEFT_ALONE)
            continue
        by_hour: dict[int | None, list[FileEntry]] = defaultdict(list)
        for f in files:
            by_hour[f.hour].append(f)
        for hour in sorted(by_hour, key=lambda h: -1 if h is None else h):
            small = [f for f in by_hour[hour] if f.size < policy.small]
            if hour is None:
                left[LEFT_OPEN] += len(small)  # whole-day files of an open day: merged when
                continue                       # the day closes
            closed = start + (hour + 1) * HOUR_MS + policy.grace_ms <= now_ms
            if closed:
                take(small, Task(date, hour, small, "closed hour") if len(small) >= 2 else None,
                     LEFT_ALONE)
            else:
                take(small, Task(date, hour, small, "open hour")
                     if len(small) >= policy.open_max_files else None, LEFT_OPEN)
    return tasks, left


def describe_left(left: dict[str, int], policy: Policy) -> str:
    """sink.maintain's words for survey()'s counts ("" when every file was taken)."""
    parts = []
    if left.get(LEFT_OPEN):
        parts.append(f"{left[LEFT_OPEN]} in hours or days still open (merged once they are over "
                     f"and a grace of {policy.grace_ms / 60000:g} min has passed, or when an "
                     f"hour reaches {policy.open_max_files} small files)")
    if left.get(LEFT_LARGE):
        parts.append(f"{left[LEFT_LARGE]} already at least half the target size "
                     f"({policy.target_bytes / 2**20:g} MiB)")
    if left.get(LEFT_ALONE):
        parts.append(f"{left[LEFT_ALONE]} alone in a closed hour or day (nothing to merge with)")
    return "left as they are: " + ", ".join(parts) if parts else ""


def output_files(task: Task, policy: Policy) -> int:
    return max(1, math.ceil(task.bytes / policy.target_bytes))


def run_task(spark: SparkSession, table: Table, task: Task, policy: Policy = Policy(),
             parquet_options: dict | None = None, layout: Layout | None = None) -> Snapshot | None:
    """Merge the task's files (Spark), then commit. Returns the new version, or None when the
    commit was refused (another writer changed those files first)."""
    from pyspark.sql import functions as F
    layout = layout or history_layout()
    started = time.monotonic()
    staging = table.staging(f"c{task.date}-{'d' if task.hour is None else task.hour}")
    placed: list[FileEntry] = []
    try:
        df = spark.read.schema(layout.file_schema).parquet(*[str(table.abs(f.path)) for f in task.inputs])
        for column, sql in layout.fills:
            df = df.withColumn(column, F.expr(sql))
        df = df.withColumn("date", F.lit(dt.date.fromisoformat(task.date)))
        n = output_files(task, policy)
        df = df.repartitionByRange(n, layout.order[0]) if n > 1 else df.coalesce(1)
        df = df.sortWithinPartitions(*layout.order)
        parts = ["date"]
        if task.hour is not None:
            df = df.withColumn("_h", F.lit(task.hour))
            parts.append("_h")
        writer = df.write.mode("overwrite")
        for k, v in (parquet_options or {}).items():
            writer = writer.option(k, v)
        writer.partitionBy(*parts).parquet(str(staging / "out"))
        crash_point("compact:after-write")
        placed = table.place(staged_files(staging / "out"), f"c{table.latest_id() + 1:08d}",
                             None, task.level)
        crash_point("compact:after-place")
        got = sum(f.rows for f in placed)
        if got != task.rows:
            raise RuntimeError(f"compaction of {task} wrote {got} rows, not {task.rows}: "
                               "nothing committed")
        new = table.commit(Change(op="compact", add=placed, remove=[f.path for f in task.inputs],
                                  detail={"date": task.date, "hour": task.hour,
                                          "inputs": len(task.inputs), "outputs": len(placed),
                                          "bytes_in": task.bytes,
                                          "bytes_out": sum(f.size for f in placed)}))
        placed = []
        log.info("compacted %s into %d file(s) in %.1f s (version %d)", task,
                 new.detail["outputs"], time.monotonic() - started, new.id)
        return new
    except Conflict as exc:
        log.info("compaction of %s skipped: %s", task, exc)
        return None
    finally:
        for f in placed:  # placed but not committed: nobody lists them
            try:
                table.abs(f.path).unlink()
            except OSError:
                pass
        shutil.rmtree(staging, ignore_errors=True)


def compact(spark: SparkSession, table: Table, now_ms: int, policy: Policy = Policy(),
            parquet_options: dict | None = None, should_stop: Callable[[], bool] = lambda: False,
            max_tasks: int | None = None, layout: Layout | None = None) -> dict:
    """Run every task ``plan`` finds (up to ``max_tasks``); returns counts for the log."""
    done = {"tasks": 0, "files_in": 0, "files_out": 0, "bytes_in": 0, "bytes_out": 0,
            "seconds": 0.0, "skipped": 0}
    started = time.monotonic()
    for task in plan(table.snapshot(), now_ms, policy)[:max_tasks]:
        if should_stop():
            break
        new = run_task(spark, table, task, policy, parquet_options, layout)
        if new is None:
            done["skipped"] += 1
            continue
        done["tasks"] += 1
        done["files_in"] += new.detail["inputs"]
        done["files_out"] += new.detail["outputs"]
        done["bytes_in"] += new.detail["bytes_in"]
        done["bytes_out"] += new.detail["bytes_out"]
    done["seconds"] = time.monotonic() - started
    return done
