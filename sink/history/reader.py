"""Reading the history of a topic filter from a time, without Spark: for a replay over MQTT.

    from sink.history.reader import read_history
    for batch in read_history("data/history", "sensors/+/temp", since_ms, until_ms):
        ...   # pyarrow RecordBatches, in (accepted_at, kafka_partition, kafka_offset) order

What it reads is one committed version of the table (manifest.Table.snapshot): each message
once. It visits only the files whose day (and, for today's files, hour) can hold rows at or
after ``since_ms``, one hour of accept times at a time, oldest first; inside a file, pyarrow
skips row groups by their ``accepted_at`` statistics (compacted files are sorted by it). Memory
is about one hour's matching rows.

Continuing from Kafka without a gap: the table holds everything below the offsets in the
progress file (sink/progress.py, ``history_committed.json``: written after each committed
batch), and possibly a little more (a batch between its table commit and that file). A replay
reads the table, then Kafka from those offsets, and drops message ids it has already sent
(``mqtt.message_id``: the table's ``message_id``).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

from sink.history.manifest import FileEntry, Snapshot, Table
from sink.history.retention import DAY_MS, day_start_ms

HOUR_MS = 3_600_000
ORDER = [("accepted_at", "ascending"), ("kafka_partition", "ascending"),
         ("kafka_offset", "ascending")]


def _units(files: list[FileEntry]) -> list[tuple[int, int, list[FileEntry]]]:
    """(start ms, end ms, files) per day, or per hour for days made only of hour files; in
    time order. A day with a whole-day file is one unit."""
    by_date: dict[str, list[FileEntry]] = defaultdict(list)
    for f in files:
        by_date[f.date].append(f)
    out = []
    for date in sorted(by_date):
        start = day_start_ms(date)
        fs = by_date[date]
        if any(f.hour is None for f in fs):
            out.append((start, start + DAY_MS, fs))
            continue
        by_hour: dict[int, list[FileEntry]] = defaultdict(list)
        for f in fs:
            by_hour[f.hour].append(f)  # type: ignore[index]  # no None hour here (above)
        for h in sorted(by_hour):
            out.append((start + h * HOUR_MS, start + (h + 1) * HOUR_MS, by_hour[h]))
    return out


def read_history(table: str, topic_filter: str, since_ms: int, until_ms: int | None = None,
                 columns: list[str] | None = None, snapshot: Snapshot | None = None) -> Iterator:
    """pyarrow RecordBatches of the messages on topics matching ``topic_filter`` accepted in
    [since_ms, until_ms), in time order (see the module's docstring). ``snapshot``: the version
    to read (``Table(table).snapshot()`` taken by the caller; default the newest at the first
    batch)."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from mqtt_topics import matches
    t = Table(table)
    snap = t.snapshot() if snapshot is None else snapshot

    def at(ms: int, typ: Any) -> "pa.Scalar":
        v = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
        return pa.scalar(v if typ.tz else v.replace(tzinfo=None), typ)  # naive = UTC (Spark)
    plain = not any(c in topic_filter for c in "+#")
    need = None if columns is None else list(dict.fromkeys(
        [*columns, "topic", *(c for c, _ in ORDER)]))
    for start, end, files in _units(snap.files):
        if end <= since_ms or (until_ms is not None and start >= until_ms):
            continue
        data = ds.dataset([str(t.abs(f.path)) for f in files], format="parquet")
        typ = data.schema.field("accepted_at").type
        # a day's files an hour at a time: memory is an hour's matching rows (a compacted day is
        # sorted by accepted_at, so each hour reads only its row groups)
        lo = max(start, since_ms - since_ms % HOUR_MS)
        for w in range(lo, end, HOUR_MS):
            w_end = min(w + HOUR_MS, end) if until_ms is None else min(w + HOUR_MS, end, until_ms)
            if w_end <= since_ms:
                continue
            if w >= w_end:
                break
            cond = (ds.field("accepted_at") >= at(max(w, since_ms), typ)) & \
                (ds.field("accepted_at") < at(w_end, typ))
            if plain:
                cond = cond & (ds.field("topic") == topic_filter)
            tbl = data.to_table(columns=need, filter=cond)
            if not plain and tbl.num_rows:
                topics = tbl.column("topic").to_pylist()
                keep = pa.array([matches(topic_filter, x) for x in topics], pa.bool_())
                tbl = tbl.filter(keep)
            if tbl.num_rows:
                tbl = tbl.take(pc.sort_indices(tbl, sort_keys=ORDER))
                yield from (tbl if columns is None else tbl.select(columns)).to_batches()
