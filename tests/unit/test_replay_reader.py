"""The table's part of a replay without Spark: sink.history.reader over a table written through its
commit log (one whole-day file, read an hour of accept times at a time, and one hour file), and
the rows as the worker streams them (sink/replay/records.py): every property, in time order."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from broker.protocol import properties as PR
from sink.history.manifest import Change, FileEntry, Table
from sink.history.reader import read_history
from sink.replay.records import TABLE_COLUMNS, from_rows, iso_ms

DAY = int(dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
H = 3_600_000
UP = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))


def write(table: Table, rel: str, rows: list[dict], hour, int96: bool = False) -> FileEntry:
    cols = {
        "message_id": pa.array([r["id"] for r in rows], pa.string()),
        "topic": pa.array([r["topic"] for r in rows], pa.string()),
        "payload": pa.array([r["id"].encode() for r in rows], pa.binary()),
        "qos": pa.array([1] * len(rows), pa.int32()),
        "retain": pa.array([False] * len(rows), pa.bool_()),
        "client_id": pa.array(["dev"] * len(rows), pa.string()),
        "accepted_at": pa.array([r["at"] * 1000 for r in rows], pa.timestamp("us")),
        "kafka_partition": pa.array([0] * len(rows), pa.int32()),
        "kafka_offset": pa.array([r.get("offset", 0) for r in rows], pa.int64()),
        "payload_format": pa.array([r.get("pf") for r in rows], pa.int32()),
        "content_type": pa.array([r.get("ct") for r in rows], pa.string()),
        "response_topic": pa.array([None] * len(rows), pa.string()),
        "correlation_data": pa.array([r.get("cd") for r in rows], pa.binary()),
        "message_expiry": pa.array([r.get("exp") for r in rows], pa.int64()),
        "user_properties": pa.array([r.get("ups", []) for r in rows], UP),
    }
    path = table.abs(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, row_group_size=2, use_deprecated_int96_timestamps=int96)
    return FileEntry(rel, rel.split("/")[0][5:], hour, path.stat().st_size, len(rows))


def test_history_read_an_hour_at_a_time_in_time_order_with_every_property(tmp_path):
    t = Table(tmp_path / "h")
    # a compacted day (hour None) of messages every 30 minutes, and a late-arrival file
    day = [{"id": f"x-{i:x}", "topic": f"s/{i % 2}", "at": DAY + i * H // 2, "offset": i}
           for i in range(48)]
    day[5].update(pf=1, ct="text/plain", cd=b"\x00c", exp=60,
                  ups=[{"key": "u", "value": "1"}, {"key": "u", "value": "2"}])
    f1 = write(t, "date=2024-05-01/c1-day.parquet", day, None)
    f2 = write(t, "date=2024-05-02/b3-h00.parquet",
               [{"id": "y-1", "topic": "s/0", "at": DAY + 24 * H + 5}], 0)
    t.commit(Change("append", add=[f1, f2]))
    since, until = DAY + 2 * H + 1, DAY + 24 * H + 10
    batches = list(read_history(str(tmp_path / "h"), "s/+", since, until, columns=TABLE_COLUMNS))
    items = [it for b in batches for it in from_rows(b)]
    ats = [it[5] for it in items]
    assert ats == sorted(ats) and ats[0] == DAY + 5 * H // 2 and ats[-1] == DAY + 24 * H + 5
    assert len(items) == 48 - 5 + 1
    m5 = next(it for it in items if it[0] == b"x-5")
    mid, topic, payload, qos, retain, at, props, expiry, client = m5
    assert (topic, payload, qos, retain, expiry, client) == ("s/1", b"x-5", 1, False, 60, "dev")
    assert props[PR.PAYLOAD_FORMAT_INDICATOR] == 1 and props[PR.CONTENT_TYPE] == "text/plain"
    assert props[PR.CORRELATION_DATA] == b"\x00c"
    assert props[PR.USER_PROPERTY] == [("u", "1"), ("u", "2"), ("replay", iso_ms(at)),
                                       ("replay-id", "x-5")]
    only = [it[1] for b in read_history(str(tmp_path / "h"), "s/0", DAY, None,
                                        columns=TABLE_COLUMNS) for it in from_rows(b)]
    assert only == ["s/0"] * 25


def test_files_with_int96_and_int64_accept_times_read_together_in_time_order(tmp_path):
    """A table whose older files hold accepted_at as INT96 (Spark's default before) and newer
    ones as INT64 microseconds (with statistics): one hour of both, merged in time order."""
    t = Table(tmp_path / "h")
    old = [{"id": f"o-{i}", "topic": "s/1", "at": DAY + i * 60_000, "offset": i} for i in range(0, 60, 2)]
    new = [{"id": f"n-{i}", "topic": "s/1", "at": DAY + i * 60_000, "offset": i} for i in range(1, 60, 2)]
    f1 = write(t, "date=2024-05-01/a1-h00.parquet", old, 0, int96=True)
    f2 = write(t, "date=2024-05-01/a2-h00.parquet", new, 0)
    assert pq.ParquetFile(t.abs(f1.path)).metadata.row_group(0).column(6).physical_type == "INT96"
    t.commit(Change("append", add=[f1, f2]))
    items = [it for b in read_history(str(tmp_path / "h"), "s/#", DAY + 10 * 60_000, DAY + H,
                                      columns=TABLE_COLUMNS) for it in from_rows(b)]
    assert [it[5] for it in items] == [DAY + i * 60_000 for i in range(10, 60)]
    assert [it[0] for it in items[:3]] == [b"o-10", b"n-11", b"o-12"]


# ---------------------------------------------------------------- the filter pushed down, memory

def hour_of(table: Table, n: int, payload: int, topic=lambda i: f"dev/{i % 100}/t",
            rel="date=2024-05-01/b-h10.parquet", at=lambda i, n: DAY + 10 * H + i * H // n):
    """An hour of n messages of `payload` random bytes each, one row group (as Spark writes)."""
    import os
    rnd = os.urandom(payload * n)
    cols = {
        "message_id": pa.array([f"m-{i:x}" for i in range(n)], pa.string()),
        "topic": pa.array([topic(i) for i in range(n)], pa.string()),
        "payload": pa.array([rnd[i * payload:(i + 1) * payload] for i in range(n)], pa.binary()),
        "qos": pa.array([1] * n, pa.int32()),
        "retain": pa.array([False] * n, pa.bool_()),
        "client_id": pa.array(["dev"] * n, pa.string()),
        "accepted_at": pa.array([at(i, n) * 1000 for i in range(n)], pa.timestamp("us")),
        "kafka_partition": pa.array([0] * n, pa.int32()),
        "kafka_offset": pa.array(range(n), pa.int64()),
        "payload_format": pa.array([None] * n, pa.int32()),
        "content_type": pa.array([None] * n, pa.string()),
        "response_topic": pa.array([None] * n, pa.string()),
        "correlation_data": pa.array([None] * n, pa.binary()),
        "message_expiry": pa.array([None] * n, pa.int64()),
        "user_properties": pa.array([[]] * n, UP),
    }
    path = table.abs(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, row_group_size=n)
    table.commit(Change("append", add=[FileEntry(rel, "2024-05-01", 10, path.stat().st_size, n)]))


PEAK = r"""
import sys
from sink.replay import worker
from sink.history.reader import read_history
from sink.replay.records import TABLE_COLUMNS, from_rows

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import pyarrow.parquet, pyarrow.compute
before = hwm()
n = sum(len(from_rows(b)) for b in read_history(sys.argv[1], sys.argv[2], 0, None,
                                                  columns=TABLE_COLUMNS))
print(n, hwm() - before)
"""


def peak_growth(table: str, filt: str) -> tuple[int, int]:
    """(messages, bytes the peak RSS grew by) of a fresh process reading the filter's history."""
    import os
    import subprocess
    import sys
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", PEAK, table, filt], capture_output=True,
                         text=True, cwd=root, env={**os.environ, "PYTHONPATH": root}, check=True)
    n, grew = out.stdout.split()
    return int(n), int(grew)


def test_a_wildcard_matching_nothing_costs_no_more_memory_for_a_large_hour(tmp_path):
    """A replay's worker reading a wildcard filter that matches nothing holds a batch, not the
    hour: 60 MB more of the hour to scan grow its peak memory by less than half of that (it
    held the hour, decoded: 270 MiB more over a 60 MiB one)."""
    small, large = Table(tmp_path / "small"), Table(tmp_path / "large")
    hour_of(small, 4_000, 1000)           # 4 MB
    hour_of(large, 64_000, 1000)          # 64 MB
    for filt in ("+/nomatch", "nomatch/#"):
        n_small, grew_small = peak_growth(str(tmp_path / "small"), filt)
        n_large, grew_large = peak_growth(str(tmp_path / "large"), filt)
        assert n_small == n_large == 0
        assert grew_large < grew_small + 30_000_000, (filt, grew_small, grew_large)


def test_an_hour_over_the_buffer_is_read_in_parts_with_the_same_rows_in_order(tmp_path):
    t = Table(tmp_path / "h")
    hour_of(t, 600, 10_000)               # 6 MB matching
    whole = [it[0] for b in read_history(str(tmp_path / "h"), "dev/+/t", 0, None,
                                         columns=TABLE_COLUMNS) for it in from_rows(b)]
    parts = [it[0] for b in read_history(str(tmp_path / "h"), "dev/+/t", 0, None,
                                         columns=TABLE_COLUMNS, max_bytes=1 << 20)
             for it in from_rows(b)]
    assert len(whole) == 600 and parts == whole


def test_a_second_holding_more_than_the_buffer_fails_saying_which_and_the_setting(tmp_path):
    import pytest

    from sink.history.reader import HistoryTooLarge
    t = Table(tmp_path / "h")
    hour_of(t, 300, 10_000, at=lambda i, n: DAY + 10 * H + 500)   # 3 MB in one millisecond
    with pytest.raises(HistoryTooLarge, match=r"table_buffer_bytes"):
        list(read_history(str(tmp_path / "h"), "dev/#", 0, None, columns=TABLE_COLUMNS,
                          max_bytes=1 << 20))


def test_the_filter_pushed_down_matches_as_mqtt_does():
    """The scan's regular expression and prefix select the topics mqtt_topics.matches does:
    '+' one level, '#' its parent too, no '$' topic for a first-level wildcard [MQTT-4.7.2-1]."""
    from mqtt_topics import matches
    from sink.history.reader import topic_prefix, topic_regex
    filters = ["#", "+", "a/#", "a/+", "+/b", "a/+/c", "a/b", "+/+", "$SYS/#", "/#", "+/#",
               "a.b/#", "a b/+", "(a)/+", "a|b/#", "ä/+/x", "+/", "/+"]
    topics = ["a", "a/b", "a/b/c", "$SYS/x", "$SYS", "/", "/b", "a/", "x/b", "a.b", "axb/c",
              "a.b/c", "a b/x", "(a)/x", "a|b", "ä/1/x", "a/b\nc", "//", "a/c"]
    arr = pa.array(topics)
    for f in filters:
        got = pc.match_substring_regex(arr, pattern=topic_regex(f)).to_pylist()
        assert got == [matches(f, t) for t in topics], f
        assert all(t.startswith(topic_prefix(f)) for t in topics if matches(f, t)), f


def test_row_groups_of_other_topics_are_not_read(tmp_path, monkeypatch):
    """A row group whose topics (statistics) cannot match the filter's prefix is skipped."""
    t = Table(tmp_path / "h")
    hour_of(t, 100, 10, topic=lambda i: f"other/{i}", rel="date=2024-05-01/a-h10.parquet")
    hour_of(t, 100, 10, topic=lambda i: f"dev/{i}/t", rel="date=2024-05-01/b-h10.parquet")
    read = []
    real = pq.ParquetFile.iter_batches

    def counted(self, *a, **kw):
        read.append(kw.get("row_groups"))
        return real(self, *a, **kw)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    got = [it[1] for b in read_history(str(tmp_path / "h"), "dev/+/t", 0, None,
                                       columns=TABLE_COLUMNS) for it in from_rows(b)]
    assert len(got) == 100 and len(read) == 1
