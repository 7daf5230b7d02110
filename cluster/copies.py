"""Which message and retained records are new to this node, and which are copies of one it read.

Each node numbers the records it writes (mqtt.message_id `<node>-<incarnation>-<n>`, n increasing
in each partition's log), so a record whose n is not above the last one of its writer was written
again (a copied signed record, a retried write) and is ignored, counted. After Kafka lost its
data, the messages their writers wrote again (cluster/keep.py, header mqtt.again) are new here
unless this node read them before the loss or, in the new log, before their copies, or delivered
them as it accepted them (cluster/node.py ClusterNode._recover tells it: lost(), lost_here()).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from kafka_client.headers import H_MESSAGE_ID

from .keep import H_AGAIN
from .trust import MALFORMED, REPLAYED

if TYPE_CHECKING:
    from .trust import Trust


class Copies:
    """The message ids read, per (topic, partition, writer); `trust` counts what is ignored,
    `counters` the copies written again and skipped (resent_skipped)."""

    def __init__(self, trust: Trust, counters: dict[str, int]) -> None:
        self.trust = trust
        self.counters = counters
        self.last_ids: dict[tuple, int] = {}     # (topic, partition, writer) -> last message id
        # since Kafka last lost its data (None: never), per (messages topic, partition, writer):
        # the last message id read before the loss, the (lowest, highest) read in the new log,
        # the last copy written again (mqtt.again) taken, and the ids read of logs lost before
        # that one, as (lowest, highest): which copies are new here (fresh)
        self.lost_marks: dict[tuple, int] = {}
        self.window: dict[tuple, tuple[int, int]] | None = None
        self.again_last: dict[tuple, int] = {}
        self.read_before: dict[tuple, list[tuple[int, int]]] = {}
        # (writer, n) of the messages delivered here as they were accepted whose records were
        # not read back when Kafka lost them: their copies are not new here (fresh)
        self.here_lost: set[tuple[bytes, int]] = set()

    def read_own(self, topic: str, p: int, writer: bytes, n: int) -> None:
        """A record this node wrote, read back (not through fresh()): its writer's last message
        id moves past it (a copy of it read later is a replay)."""
        last_key = (topic, p, writer)
        if n > self.last_ids.get(last_key, 0):
            self.last_ids[last_key] = n

    def lost(self, messages: str) -> None:
        """Kafka lost its data: the ids read of the lost log (and of the new one since the loss
        before) say which copies written again are new here."""
        if self.window is None:  # the first loss: all up to the last one read
            self.lost_marks = {k: n for k, n in self.last_ids.items() if k[0] == messages}
        else:  # after another: those up to its last copy taken, and those of its new log
            for k, n in self.again_last.items():
                self.lost_marks[k] = max(self.lost_marks.get(k, 0), n)
            for k, w in self.window.items():
                self.read_before.setdefault(k, []).append(w)
        self.window, self.again_last = {}, {}  # ...and those read in the new log

    def lost_here(self, writer: bytes, n: int) -> None:
        """A message delivered here as it was accepted whose record was not read back when
        Kafka lost it: its copy is not new here."""
        self.here_lost.add((writer, n))

    def fresh(self, topic: str, p: int, off: int, headers: list) -> bool:
        """Whether a message or retained record is not a copy of one read before."""
        mid = None
        again = False
        for name, val in headers:
            if name == H_MESSAGE_ID:
                mid = val
            elif name == H_AGAIN:
                again = True
        writer, _, n = bytes(mid or b"").rpartition(b"-")
        if not writer or not n.isdigit() or len(n) > 18:
            self.trust.ignore(MALFORMED, f"{topic} offset {off}", "no message id")
            return False
        last_key = (topic, p, writer)
        seq = int(n)
        window = self.window
        if again:
            # a copy its writer wrote again after Kafka lost its data (cluster/keep.py): new here
            # unless it was read before the loss or, in the new log, before its copies, or it
            # was delivered here as this node accepted it
            if self.here_lost and (writer, int(n)) in self.here_lost:
                self.here_lost.discard((writer, int(n)))
                self.counters["resent_skipped"] += 1
                return False
            if window is None:  # (no loss seen here: a copy read first where it is not lost)
                before, seen = self.last_ids.get(last_key, 0), None
            else:
                before, seen = self.lost_marks.get(last_key, 0), window.get(last_key)
            if seq <= before or (seen is not None and seen[0] <= seq <= seen[1]) or \
                    any(lo <= seq <= hi for lo, hi in self.read_before.get(last_key, ())):
                self.counters["resent_skipped"] += 1
                return False
            if seq <= self.again_last.get(last_key, 0):
                self.trust.ignore(REPLAYED, f"{topic} offset {off}")
                return False
            self.again_last[last_key] = seq
            return True
        if seq <= self.last_ids.get(last_key, 0):
            self.trust.ignore(REPLAYED, f"{topic} offset {off}")
            return False
        self.last_ids[last_key] = seq
        if window is not None:
            seen = window.get(last_key)
            window[last_key] = (seq, seq) if seen is None else (seen[0], seq)
        return True
