"""Holes in a fetch's answer (kafka_client/gaps.py): Tansu, under concurrent writers to one
partition, sometimes answers with a batch left out while later ones are there. The decoders stop
at the first skipped offset, the reader keeps the records before it and asks again from the hole
(the record was acknowledged: it is in the log a moment later); a hole that stays is read past,
at once when compaction made it (the batch after it is old), else after a patience, said."""
from __future__ import annotations

import logging
import struct
from types import SimpleNamespace as NS
from typing import Any

from kafka_client.fetch import Fetcher
from kafka_client.gaps import PATIENCE, RECENT_MS, Gaps
from kafka_client.record import build_batch, encode_body
from kafka_client.recordbatch import decode
from kafka_client.recordscan import Scanned

TP = ("mqtt.cluster.messages", 0)
NOW_MS = 1_800_000_000_000


def batch(base: int, n: int = 1, ts: int = NOW_MS) -> bytes:
    """One batch of n records at offsets base.. (values b"<offset>")."""
    raw = bytearray(build_batch([(ts, encode_body(b"k", b"%d" % (base + i), []))
                                 for i in range(n)]))
    struct.pack_into(">q", raw, 0, base)  # the base offset, set by Kafka
    return bytes(raw)


def scanned_offsets(s: Scanned) -> list[int]:
    return [s.offsets[i] for i in s.since(0).indexes()] if s._batches else []


def test_the_decoders_stop_at_the_first_offset_the_answer_skips():
    """Batches at 10-11 and 14: asked from 10, both decoders give 10 and 11 and say the hole
    (12, going on at 14, that batch's max timestamp); without gap_from they read past it."""
    raw = batch(10, 2) + batch(14, 1, NOW_MS + 5)
    s = Scanned(raw, gap_from=10)
    assert scanned_offsets(s) == [10, 11] and s.next_offset == 12 and s.end == 12
    assert s.gap == (12, 14, NOW_MS + 5)
    d = decode(raw, gap_from=10)
    assert list(d.offset) == [10, 11] and d.next_offset == 12 and d.gap == (12, 14, NOW_MS + 5)
    assert scanned_offsets(Scanned(raw)) == [10, 11, 14] and Scanned(raw).gap is None
    assert list(decode(raw).offset) == [10, 11, 14] and decode(raw).gap is None


def test_a_fetch_from_inside_a_batch_is_no_hole_and_one_from_a_hole_has_no_records():
    """Kafka answers a fetch from 11 with the whole batch from 10: not a hole. Asked from 12,
    an answer starting at 14 holds nothing before its hole."""
    raw = batch(10, 2) + batch(12, 1)
    assert Scanned(raw, gap_from=11).gap is None and decode(raw, gap_from=11).gap is None
    late = batch(14, 2)
    s, d = Scanned(late, gap_from=12), decode(late, gap_from=12)
    assert s.gap == d.gap == (12, 14, NOW_MS)
    assert s.next_offset is None and s.end == -1 and not s._batches
    assert len(d) == 0 and d.next_offset is None


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_recent_hole_is_asked_for_again_until_the_patience_then_read_past_with_a_warning(caplog):
    clock = Clock()
    g = Gaps(clock, lambda: NOW_MS)
    assert g.wait(TP, (12, 14, NOW_MS)) is True
    clock.t += PATIENCE - 0.1
    assert g.wait(TP, (12, 14, NOW_MS)) is True
    clock.t += 0.2
    with caplog.at_level(logging.WARNING, logger="kafka_client.gaps"):
        assert g.wait(TP, (12, 14, NOW_MS)) is False
    assert "skip offsets 12 to 13" in caplog.text and "reading on from 14" in caplog.text
    assert g.skipped == 1 and g.waiting == {}


def test_a_hole_before_an_old_batch_is_compactions_and_read_past_at_once():
    g = Gaps(Clock(), lambda: NOW_MS)
    assert g.wait(TP, (12, 14, NOW_MS - RECENT_MS - 1)) is False
    assert g.skipped == 1 and g.waiting == {}


def test_a_hole_that_fills_is_counted_and_forgotten():
    g = Gaps(Clock(), lambda: NOW_MS)
    assert g.wait(TP, (12, 14, NOW_MS))
    g.read(TP, 12)
    assert g.filled == 1 and g.waiting == {}


def fetcher(answers: list[bytes], position: int, clock: Clock) -> Fetcher:
    """A Fetcher without sockets following TP from `position`: each fetch is answered by the
    next of `answers` (its records bytes; the high watermark past them)."""
    f = Fetcher.__new__(Fetcher)
    f.wait_ms, f.decoder = 5, Scanned
    f.positions, f.high, f.told = {TP: position}, {}, set()
    f.lost, f.cluster_id, f._meta = None, None, None
    f.create_topics = True
    f.gaps = Gaps(clock, lambda: NOW_MS)
    f.stuck_since, f.stuck = {}, 0
    f.cluster = NS(cluster_id="c1")  # type: ignore[assignment]
    f._by_leader = lambda tps: {0: list(tps)}  # type: ignore[method-assign]

    def ask(node: int, req: Any, timeout_ms: int = 0) -> Any:
        raw = answers.pop(0)
        return NS(responses=[NS(topic=TP[0], partitions=[NS(
            partition_index=TP[1], error_code=0, high_watermark=100, records=raw)])])
    f._ask = ask  # type: ignore[method-assign]
    return f


def offsets_of(out: list) -> list[int]:
    return [rec.offsets[i] for _, _, rec, start in out for i in rec.since(start).indexes()]


def test_the_reader_keeps_the_records_before_a_hole_and_reads_it_once_it_fills():
    """The cluster's reader (and the replay's): an answer 10-11, 14 gives 10 and 11, the
    position stays at the hole; an answer from the hole that skips it again gives nothing; the
    next, with 12-13 there, gives 12, 13 and 14: no acknowledged record is read past."""
    clock = Clock()
    f = fetcher([batch(10, 2) + batch(14, 1), batch(14, 1), batch(12, 2) + batch(14, 1)], 10, clock)
    assert offsets_of(f.fetch()) == [10, 11] and f.positions[TP] == 12
    assert f.fetch() == [] and f.positions[TP] == 12
    assert offsets_of(f.fetch()) == [12, 13, 14] and f.positions[TP] == 15
    assert f.gaps.filled == 1 and f.gaps.skipped == 0


def test_the_reader_reads_past_a_hole_that_stays_beyond_the_patience():
    clock = Clock()
    f = fetcher([batch(14, 1), batch(14, 1)], 12, clock)
    assert f.fetch() == [] and f.positions[TP] == 12
    clock.t += PATIENCE + 0.1
    assert offsets_of(f.fetch()) == [14] and f.positions[TP] == 15 and f.gaps.skipped == 1


def test_a_partition_answered_empty_below_its_end_is_said_once_after_a_while_and_read_on(caplog):
    """Tansu answered partitions with no record for up to 8 s while its answers put their end
    beyond the position asked (several readers fetching every 5 ms): the reader says so once
    when such a spell has lasted STUCK_WARN seconds, counts it, keeps its position, and takes
    the records when they come; an empty answer at the end of the log is no spell."""
    from kafka_client.fetch import STUCK_WARN
    clock = Clock()
    f = fetcher([None, None, None, None, batch(12, 2), None], 12, clock)  # (end: 100)
    with caplog.at_level(logging.WARNING, logger="kafka_client.fetch"):
        assert f.fetch() == []
        clock.t += STUCK_WARN - 0.1
        assert f.fetch() == [] and f.stuck == 0 and "no records" not in caplog.text
        clock.t += 0.2
        assert f.fetch() == [] and f.stuck == 1 and f.positions[TP] == 12
        clock.t += 5
        assert f.fetch() == [] and f.stuck == 1
    assert caplog.text.count("has answered with no records for 2 s") == 1, caplog.text
    assert "holds offsets 12 to 99" in caplog.text and "cluster.fetch_wait_ms" in caplog.text
    assert offsets_of(f.fetch()) == [12, 13] and f.stuck_since == {}
    at_end = fetcher([None], 100, clock)
    assert at_end.fetch() == [] and at_end.stuck_since == {}


def test_the_history_source_reads_a_range_across_a_hole_once_it_fills(monkeypatch):
    """The history job's Kafka source (sink/history/source.py) reads the planned range [10, 15):
    an answer with 12-13 left out gives 10 and 11, asks again from 12, and reads 12-14 when the
    log has them; every planned record becomes a row, none is skipped."""
    import pyarrow as pa

    from sink.history import source as S
    answers = {10: [batch(10, 2) + batch(14, 1)], 12: [batch(14, 1), batch(12, 2) + batch(14, 1)]}
    asked: list[int] = []

    class Consumer:  # what _PartitionFetcher.fetch uses of kafka-python's client
        _client = NS(cluster=NS(leader_for_partition=lambda tp: 0))
        _manager = NS(send=lambda req, node_id: req, wait_for=None)

        class _net:
            @staticmethod
            def run(wait_for: Any, req: Any, timeout: int) -> Any:
                offset = req.topics[0].partitions[0].fetch_offset
                asked.append(offset)
                return NS(responses=[NS(partitions=[NS(error_code=0, high_watermark=15,
                                                       records=answers[offset].pop(0))])])
    monkeypatch.setattr(S._PartitionFetcher, "_client", lambda self: Consumer)
    monkeypatch.setattr("kafka_client.gaps.HOLE_WAIT", 0.0)
    reader = S.KafkaStreamReader(S.SourceOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "mqtt.messages"}))
    rows = list(reader._read_range(pa, reader._arrow_schema(), S.KafkaRange("mqtt.messages", 0, 10, 15)))
    assert [o for b in rows for o in b.column("offset").to_pylist()] == [10, 11, 12, 13, 14]
    assert asked == [10, 12, 12]


class Consumer:
    """What ConsumerHoles uses of a kafka-python KafkaConsumer: seek()."""

    def __init__(self) -> None:
        self.sought: list[tuple[Any, int]] = []

    def seek(self, tp: Any, offset: int) -> None:
        self.sought.append((tp, offset))


def records(*offsets: int) -> list:
    return [NS(offset=o, timestamp=NOW_MS) for o in offsets]


def test_a_consumers_records_stop_at_a_hole_and_the_consumer_is_sought_back_to_it():
    """The $share group streams and a moved session's scan (kafka-python consumers): a poll
    giving 5, 6, 9 of a partition last read up to 4 keeps 5 and 6 and seeks back to 7; the next
    poll, 7-9, is taken whole (the hole filled); another partition is not held up."""
    from kafka_client.gaps import ConsumerHoles
    holes, c, other = ConsumerHoles(Gaps(Clock(), lambda: NOW_MS)), Consumer(), ("t", 1)
    holes.expected[TP] = 5
    got = holes.cut(c, {TP: records(5, 6, 9), other: records(0, 1)})
    assert [r.offset for r in got[TP]] == [5, 6] and [r.offset for r in got[other]] == [0, 1]
    assert c.sought == [(TP, 7)]
    assert holes.cut(c, {TP: records(9)}) == {} and c.sought == [(TP, 7), (TP, 7)]
    got = holes.cut(c, {TP: records(7, 8, 9)})
    assert [r.offset for r in got[TP]] == [7, 8, 9] and holes.gaps.filled == 1
    assert holes.expected[TP] == 10


def test_a_partition_that_changed_hands_is_not_taken_for_a_hole():
    """A partition revoked and assigned again is read from its committed offset, maybe far past
    the last record taken here: forgotten on rebalance, its first records are taken as they
    come."""
    from kafka_client.gaps import ConsumerHoles
    holes, c = ConsumerHoles(Gaps(Clock(), lambda: NOW_MS)), Consumer()
    holes.cut(c, {TP: records(3, 4)})
    holes.forget([TP])
    got = holes.cut(c, {TP: records(50, 51)})
    assert [r.offset for r in got[TP]] == [50, 51] and c.sought == []
