"""Reading the history of a topic filter from a time, without Spark: for a replay over MQTT.

    from sink.history.reader import read_history
    for batch in read_history("data/history", "sensors/+/temp", since_ms, until_ms):
        ...   # pyarrow RecordBatches, in (accepted_at, kafka_partition, kafka_offset) order

What it reads is one committed version of the table (manifest.Table.snapshot): each message
once. It visits only the files whose day (and, for today's files, hour) can hold rows at or
after ``since_ms``, one hour of accept times at a time, oldest first. The topic filter is pushed
into the scan: row groups are skipped by their ``accepted_at`` statistics (compacted files are
sorted by it) and by their ``topic`` ones (the filter's literal prefix: ``sensors/`` of
``sensors/+/temp``), and each batch read is filtered on the topic (the filter as a regular
expression) before anything is kept, so a filter that matches nothing costs a batch, not an hour.

Memory: a batch of ``batch_rows`` rows being read (files are read through a buffered stream, not
a row group at once), plus the window's matching rows, at most ``max_bytes``: a window (an hour)
whose matching rows would take more is read again in halves, down to a second (a second's
matching rows over ``max_bytes``: HistoryTooLarge, saying which second and the setting).

Continuing from Kafka without a gap: the table holds everything below the offsets in the
progress file (sink/history/commits.py, ``history_committed.json``: written after each committed
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


class HistoryTooLarge(Exception):
    """One second of accept times holds more matching rows than a reader may hold."""


DEFAULT_BATCH_ROWS = 1024
DEFAULT_MAX_BYTES = 64 << 20
MIN_WINDOW_MS = 1000           # a window is split in halves down to this


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _iso(ms: int) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


def topic_regex(topic_filter: str) -> str:
    """The topics ``topic_filter`` matches (mqtt_topics.matches), as one RE2 pattern: '+' one
    level, a trailing '#' its parent and everything below; a first level '+' or '#' no topic
    starting with '$' ([MQTT-4.7.2-1])."""
    import re
    levels = topic_filter.split("/")
    multi = levels[-1] == "#"
    if multi:
        levels = levels[:-1]
    parts = []
    for i, level in enumerate(levels):
        if level == "+":
            parts.append("(?:[^/$][^/]*)?" if i == 0 else "[^/]*")
        else:
            parts.append(re.escape(level))
    body = "/".join(parts)
    if multi:
        body = "(?:[^$].*)?" if not levels else body + "(?:/.*)?"
    return "(?s)^" + body + "$"


def topic_prefix(topic_filter: str) -> str:
    """What every topic the filter matches starts with: its levels before the first wildcard
    ('a/b/' of 'a/b/+/c'; 'a/b' of 'a/b/#', which matches 'a/b' itself)."""
    literal: list[str] = []
    for level in topic_filter.split("/"):
        if level in ("+", "#"):
            prefix = "/".join(literal)
            return prefix + "/" if level == "+" and literal else prefix
        literal.append(level)
    return topic_filter


def read_history(table: str, topic_filter: str, since_ms: int, until_ms: int | None = None,
                 columns: list[str] | None = None, snapshot: Snapshot | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator:
    """pyarrow RecordBatches of the messages on topics matching ``topic_filter`` accepted in
    [since_ms, until_ms), in time order (see the module's docstring). ``snapshot``: the version
    to read (``Table(table).snapshot()`` taken by the caller; default the newest at the first
    batch). ``batch_rows``, ``max_bytes``: the memory bounds (the module's docstring)."""
    import struct

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = Table(table)
    snap = t.snapshot() if snapshot is None else snapshot

    def at(ms: int, typ: Any) -> "pa.Scalar":
        """The time as a scalar of the column's type, made from its bytes: pa.scalar() of a
        datetime or even of an int makes pyarrow import pandas (60 MB in a worker)."""
        unit = typ.unit
        v = -(-ms // 1000) if unit == "s" else ms * {"ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        raw = pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(struct.pack("<q", v))])
        return raw.view(typ)[0]  # (a naive column is UTC, as Spark writes it)
    plain = not any(c in topic_filter for c in "+#")
    pattern = topic_regex(topic_filter)  # (for a plain one too: an == would import pandas)
    lo_topic = topic_filter if plain else topic_prefix(topic_filter)
    hi_topic = None                         # every matching topic is below it (None: no bound)
    if lo_topic and ord(lo_topic[-1]) < 0x10FFFF:
        hi_topic = topic_filter + "\x00" if plain else lo_topic[:-1] + chr(ord(lo_topic[-1]) + 1)
    need = None if columns is None else list(dict.fromkeys(
        [*columns, "topic", *(c for c, _ in ORDER)]))
    unit_ms = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}

    def groups(f: Any, lo: int, hi: int) -> list[int]:
        """The row groups of a file that can hold a matching row in [lo, hi) (statistics)."""
        meta = f.metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        ti, ai = names.index("topic"), names.index("accepted_at")
        per_ms = unit_ms[f.schema_arrow.field("accepted_at").type.unit]
        out = []
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            a = rg.column(ai).statistics
            if a is not None and a.has_min_max and (a.max_raw < lo * per_ms
                                                    or a.min_raw >= hi * per_ms):
                continue
            st = rg.column(ti).statistics
            if st is not None and st.has_min_max and lo_topic and (
                    _text(st.max) < lo_topic or (hi_topic is not None
                                                 and _text(st.min) >= hi_topic)):
                continue
            out.append(g)
        return out

    def window(paths: list[str], lo: int, hi: int) -> Iterator:
        """[lo, hi): its matching rows, sorted; in halves when they would take too much."""
        kept, size = [], 0
        for path in paths:
            f = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
            rgs = groups(f, lo, hi)
            if not rgs:
                continue
            typ = f.schema_arrow.field("accepted_at").type
            first, last = at(lo, typ), at(hi, typ)
            cols = need if need is None else [c for c in need if c in f.schema_arrow.names]
            for batch in f.iter_batches(batch_size=batch_rows, row_groups=rgs, columns=cols,
                                        use_threads=False):
                t_at, t_topic = batch.column("accepted_at"), batch.column("topic")
                keep = pc.and_(pc.greater_equal(t_at, first), pc.less(t_at, last))
                keep = pc.and_(keep, pc.match_substring_regex(t_topic, pattern=pattern))
                if not pc.any(keep).as_py():
                    continue
                batch = batch.filter(keep)
                kept.append(pa.Table.from_batches([batch]))
                size += batch.nbytes
                if size > max_bytes:
                    break
            if size > max_bytes:
                break
        if size <= max_bytes:
            if kept:
                tbl = pa.concat_tables(kept, promote_options="permissive")
                kept = []
                tbl = tbl.take(pc.sort_indices(tbl, sort_keys=ORDER))
                yield from (tbl if columns is None else tbl.select(columns)).to_batches(
                    max_chunksize=batch_rows)
            return
        kept = []
        if hi - lo <= MIN_WINDOW_MS:
            raise HistoryTooLarge(
                f"the messages on {topic_filter} accepted from {_iso(lo)} to {_iso(hi)} take "
                f"more than {max_bytes:,} bytes, more than a replay may hold at once ([replay] "
                "table_buffer_bytes)")
        mid = lo + (hi - lo) // 2
        yield from window(paths, lo, mid)
        yield from window(paths, mid, hi)

    for start, end, files in _units(snap.files):
        if end <= since_ms or (until_ms is not None and start >= until_ms):
            continue
        paths = [str(t.abs(f.path)) for f in files]
        # a day's files an hour at a time (a compacted day is sorted by accepted_at, so each
        # hour reads only its row groups)
        lo = max(start, since_ms - since_ms % HOUR_MS)
        for w in range(lo, end, HOUR_MS):
            w_end = min(w + HOUR_MS, end) if until_ms is None else min(w + HOUR_MS, end, until_ms)
            if w_end <= since_ms:
                continue
            if w >= w_end:
                break
            yield from window(paths, max(w, since_ms), w_end)
