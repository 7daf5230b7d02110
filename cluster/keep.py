"""The messages a node wrote to Kafka and not every node has read yet, kept for a Kafka that
loses them (an in-memory Kafka restarted empty, a Kafka replaced).

Each QoS 1/2 message record this node writes is kept here, in the order written (its record
body before signing, its timestamp). When Kafka acknowledges it, it gets a mark: the offsets
this node's records had reached in each messages partition then (the record is below them).
Each node's heartbeat says how far it has read every messages partition; a kept record is let go
once every live node has read past its mark (it is then in the memory of every node that has a
subscriber for it). When Kafka loses its data, the node writes every record still kept again, in
order, before what it writes next, each with the header `mqtt.again` (ClusterNode._recover): a
reader delivers such a copy only when it had not read the original (before the loss, or from the
new log: cluster/copies.py), so what a node had delivered is not delivered twice.

Bounds: `cluster.keep_bytes` (record bytes and bookkeeping together) and `cluster.keep_seconds`
(age); beyond either, the oldest are dropped, counted (mqtt_cluster_kept_dropped), with a log
line at most every LOG_EVERY seconds naming the setting. The copies live in this process's
memory: a node that dies loses them (its records are then only in Kafka).
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable

from kafka_client.record import read_zz_varint, vlen

log = logging.getLogger(__name__)

H_AGAIN = "mqtt.again"      # on a record written again after Kafka lost its data
_AGAIN = vlen(len(H_AGAIN)) + H_AGAIN.encode() + vlen(1) + b"1"
OVERHEAD = 200              # bytes of bookkeeping per kept record (the entry, its deque slot)
LOG_EVERY = 10.0


# One kept record is a list (cheaper to make than an object, once per message):
# [record body (unsigned), timestamp ms, kept at (clock), what its publisher's acknowledgement
# waits for (None for a copy written again), its mark (partition -> offset its acknowledgement
# came with; None until then, FAILED when Kafka refused it)]
Entry = list
BODY, TS, AT, BATCH, MARK = range(5)
FAILED: dict[int, int] = {}  # (its identity is what counts)


class Keep:
    def __init__(self, max_bytes: int, max_seconds: float, clock: Callable[[], float],
                 floor: Callable[[], dict[int, int] | None] = lambda: None) -> None:
        """floor(): how far every live node has read (trim()), asked when the bytes are full."""
        self.floor = floor
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.clock = clock
        self.entries: deque[list] = deque()
        self.bytes = 0
        self.dropped = 0            # let go before every node had read them (a bound)
        self._unlogged: dict[str, int] = {}
        self._logged_at: float | None = None

    def add(self, body: bytes, ts: int, batch: Any) -> list | None:
        """Keep a record this node writes now; None when nothing is kept (keep_bytes = 0)."""
        if self.max_bytes <= 0:
            return None
        e = [body, ts, self.clock(), batch, None]
        self.entries.append(e)
        self.bytes += len(body) + OVERHEAD
        if self.bytes > self.max_bytes:
            self.trim(self.floor())
            n = 0
            while self.bytes > self.max_bytes and len(self.entries) > 1:
                self._pop()
                n += 1
            self._drop(n, "cluster.keep_bytes")
        return e

    @staticmethod
    def answered(e: list, failure: str | None, mark: dict[int, int]) -> None:
        """Kafka's answer for a kept record: acknowledged below `mark`, or refused (its
        publisher was told so: it is not written again)."""
        e[MARK] = mark if failure is None else FAILED

    def trim(self, floor: dict[int, int] | None) -> int:
        """Let go of the oldest records every live node has read: `floor` is, per messages
        partition, the lowest read position among them (None: some node's is unknown). Then
        drop those older than keep_seconds. Returns how many are kept."""
        entries = self.entries
        passed: object = FAILED  # the last mark found read (records acknowledged together share one)
        while entries:
            m = entries[0][MARK]
            if m is not passed:
                if floor is None or m is None or any(floor.get(p, 0) < o for p, o in m.items()):
                    break
                passed = m
            self._pop()
        old = self.clock() - self.max_seconds
        n = 0
        while entries and entries[0][AT] < old:
            self._pop()
            n += 1
        self._drop(n, "cluster.keep_seconds")
        return len(entries)

    def again(self) -> list[tuple[list, list]]:
        """Kafka lost its data: (kept record, its copy) of every record kept that Kafka had
        acknowledged (it was in the lost log), in order, to write again; the copies take those
        records' places here (each gets a mark when it is acknowledged). A record still on its
        way (no answer yet) stays as it is: it is written as it is, after the copies (the
        producer sends them first: cluster/produce.py send_again), so the new log has each
        publisher's messages in their order, and once."""
        kept: deque[list] = deque()
        pairs = []
        for e in self.entries:
            if e[MARK] is FAILED:
                continue
            if e[MARK] is None:
                kept.append(e)
                continue
            copy = [e[BODY], e[TS], e[AT], None, None]
            pairs.append((e, copy))
            kept.append(copy)
        self.entries = kept
        self.bytes = sum(len(e[BODY]) + OVERHEAD for e in kept)
        return pairs

    def _pop(self) -> None:
        e = self.entries.popleft()
        self.bytes -= len(e[BODY]) + OVERHEAD

    def _drop(self, n: int, setting: str) -> None:
        if not n:
            return
        self.dropped += n
        self._unlogged[setting] = self._unlogged.get(setting, 0) + n
        now = self.clock()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY:
            return
        self._logged_at = now
        for name, count in self._unlogged.items():
            log.warning("cluster: dropped %d kept messages that not every node had read yet "
                        "(%s = %s reached: a node reads slowly or is stalled); should Kafka "
                        "lose its data now, they are lost; raise %s to keep more", count, name,
                        self.max_bytes if name == "cluster.keep_bytes" else
                        f"{self.max_seconds:g}", name)
        self._unlogged.clear()


def with_again(body: bytes) -> bytes:
    """A record body (kafka_client.record.encode_body, unsigned) with one more header,
    `mqtt.again: 1`, after its others."""
    kl, o = read_zz_varint(body, 0)
    o += max(kl, 0)
    vl, o = read_zz_varint(body, o)
    o += max(vl, 0)
    nh, after = read_zz_varint(body, o)
    return b"".join((body[:o], vlen(nh + 1), body[after:], _AGAIN))
