"""The table's part of a replay without Spark: sink.history.reader over a table written through its
commit log (one whole-day file, read an hour of accept times at a time, and one hour file), and
the rows as the worker streams them (sink/replay/records.py): every property, in time order."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq

from broker.protocol import properties as PR
from sink.history.manifest import Change, FileEntry, Table
from sink.history.reader import read_history
from sink.replay.records import TABLE_COLUMNS, from_rows, iso_ms

DAY = int(dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
H = 3_600_000
UP = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))


def write(table: Table, rel: str, rows: list[dict], hour) -> FileEntry:
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
    pq.write_table(pa.table(cols), path, row_group_size=2)
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
