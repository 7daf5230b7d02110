"""Offsets a fetch's answer skipped: read again, not past.

Below a partition's high watermark every offset holds a record (a control record included),
except where compaction removed records, and a fetch answers with the batches in order from the
offset it asked. Tansu, the embedded Kafka, does not always: under concurrent writers to one
partition it answers, now and then, with one batch left out while later ones are there (a
reader of one partition written by three producer threads, on a loaded machine, saw 2-5 such
holes a minute; read again a moment later, the log holds every acknowledged record, in order).
A reader that moved its position past the hole never read that record: a cluster node did not
deliver an acknowledged message to its subscribers; the history job would not store it.

So the decoders stop at the first skipped offset (kafka_client.recordbatch.decode and
kafka_client.recordscan.Scanned with ``gap_from``: their ``gap``), the reader keeps the records
before it and asks again from the hole, which fills within milliseconds. A hole that stays is
read past: at once when the batch after it is older than RECENT_MS (compaction removes old
records, never ones just written), else after PATIENCE seconds, said in a warning and counted.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Hashable, Iterable

log = logging.getLogger(__name__)

PATIENCE = 2.0        # seconds a recent hole is asked for again before it is read past
RECENT_MS = 60_000    # a hole before a batch this old is compaction's: read past at once
HOLE_WAIT = 0.005     # seconds between two fetches asking again for a hole (the answer is at once)


class Gaps:
    """The holes a reader waits on, per partition. `clock`: seconds (monotonic); `wall`: ms."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = lambda: time.time() * 1000) -> None:
        self.clock = clock
        self.wall = wall
        self.waiting: dict[Hashable, tuple[int, float]] = {}  # partition -> (hole, since)
        self.filled = 0     # holes that filled while asked for again
        self.skipped = 0    # holes read past

    def wait(self, tp: Hashable, gap: tuple[int, int, int]) -> bool:
        """A fetch from `gap[0]` answered from `gap[1]` on (its batch's max timestamp
        `gap[2]`): True to ask again from the hole, False to read past it."""
        hole, resumes, ts = gap
        now = self.clock()
        w = self.waiting.get(tp)
        if w is None or w[0] != hole:
            if 0 <= ts < self.wall() - RECENT_MS:
                self.skipped += 1  # compacted away (an old batch follows): nothing is coming
                return False
            self.waiting[tp] = (hole, now)
            return True
        if now - w[1] < PATIENCE:
            return True
        del self.waiting[tp]
        self.skipped += 1
        log.warning("%s: Kafka's answers skip offsets %d to %d for %.0f s: reading on from %d "
                    "(records removed there, or lost by Kafka)", _name(tp), hole, resumes - 1,
                    now - w[1], resumes)
        return False

    def read(self, tp: Hashable, start: int) -> None:
        """Records came from `start` on: a hole waited on there has filled."""
        w = self.waiting.get(tp)
        if w is not None and w[0] <= start:
            del self.waiting[tp]
            self.filled += 1


def _name(tp: Hashable) -> str:
    return f"{tp[0]}-{tp[1]}" if isinstance(tp, tuple) and len(tp) == 2 else str(tp)


class ConsumerHoles:
    """The same for what a kafka-python KafkaConsumer's poll() returns (cluster/shares.py's
    group streams, cluster/rebuild.py's scans): per partition, the records up to the first one
    beyond the offset expected next are kept, and the consumer is sought back to that offset.
    `expected` is learnt from the records taken (or seeded by whoever seeks); a partition that
    changes hands is forgotten (forget())."""

    def __init__(self, gaps: Gaps | None = None) -> None:
        self.gaps = gaps or Gaps()
        self.expected: dict[Hashable, int] = {}  # partition -> the offset after the last record taken

    def forget(self, tps: Iterable[Hashable]) -> None:
        for tp in tps:
            self.expected.pop(tp, None)
            self.gaps.waiting.pop(tp, None)

    def cut(self, consumer: Any, polled: dict) -> dict:
        """`polled` ({partition: [ConsumerRecord]}) without the records from a hole on."""
        out = {}
        for tp, records in polled.items():
            expected = self.expected.get(tp)
            kept = records
            for i, r in enumerate(records):
                if expected is not None and r.offset > expected:
                    if self.gaps.wait(tp, (expected, r.offset, r.timestamp)):
                        consumer.seek(tp, expected)  # from the hole, again
                        kept = records[:i]
                        break
                elif expected is not None and r.offset == expected and tp in self.gaps.waiting:
                    self.gaps.read(tp, r.offset)
                expected = r.offset + 1
            if kept:
                self.expected[tp] = kept[-1].offset + 1
                out[tp] = kept
        if not out and self.gaps.waiting:
            time.sleep(HOLE_WAIT)
        return out
