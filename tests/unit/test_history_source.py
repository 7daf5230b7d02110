"""The history job's Kafka source (sink/history/source.py): the offsets it plans a new query's
batches with."""
from __future__ import annotations

from typing import Any

TOPIC = "mqtt.messages"


def reader(monkeypatch: Any, starting: str, ends: list[dict[str, int]]) -> Any:
    """A source whose Kafka answers each snapshot with the next of ``ends`` (the log grows)."""
    from sink.history import source as S
    snaps = iter(ends)

    def snapshot(self: Any) -> dict:
        return {"t": {TOPIC: dict(next(snaps))}, "ids": {TOPIC: "id-1"}}
    monkeypatch.setattr(S.KafkaStreamReader, "_snapshot", snapshot)
    return S.KafkaStreamReader(S.SourceOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": TOPIC,
         "startingOffsets": starting}))


def test_a_new_query_from_latest_starts_where_it_first_asked_however_often_spark_asks(monkeypatch):
    """Spark asks a new query's initial offset more than once; the log grows meanwhile. The
    first batch reads from the first answer on, never the partition from 0 (a later answer as
    its start would be past its end, which is how offsets that went backwards look)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    r = reader(monkeypatch, "latest", [{"0": 100, "1": 50}, {"0": 130, "1": 60},
                                       {"0": 160, "1": 70}])
    first = r.initialOffset()
    end = r.latestOffset(first, ReadAllAvailable())          # the log at 130 / 60
    again = r.initialOffset()                               # the log is at 160 / 70 by now
    assert again["t"] == first["t"] == {TOPIC: {"0": 100, "1": 50}}
    ranges = sorted((x.partition, x.start, x.end) for x in _ranges(r.partitions(again, end)))
    assert ranges == [(0, 100, 130), (1, 50, 60)]


def test_a_new_query_from_earliest_starts_at_zero(monkeypatch):
    r = reader(monkeypatch, "earliest", [{"0": 100, "1": 50}, {"0": 130, "1": 60}])
    assert r.initialOffset()["t"] == r.initialOffset()["t"] == {TOPIC: {"0": 0, "1": 0}}


def _ranges(parts: list) -> list:
    out = []
    for p in parts:
        out.extend(getattr(p, "ranges", (p,)))
    return out
