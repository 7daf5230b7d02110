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
from typing import Callable, Hashable

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

    def any_waiting(self) -> bool:
        return bool(self.waiting)


def _name(tp: Hashable) -> str:
    return f"{tp[0]}-{tp[1]}" if isinstance(tp, tuple) and len(tp) == 2 else str(tp)
