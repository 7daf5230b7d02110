"""Messages accepted on this node, delivered to its own sessions at once (cluster/node.py
ClusterNode.route), held until their records are read back from the messages topic, where they
are then skipped (own): the sessions here have them, and a session rebuilt here before that
takes them from here (held_for). While nobody here can want them, or cluster.max_held are held,
they are "spilled": delivered from their records, as on the other nodes (spilling).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from mqtt_topics import matches

from .rebuild import match

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from broker.core.message import Message
    from kafka_client.recordscan import Scanned
    from settings import ClusterConfig

    from .checkpoints import Handle
    from .copies import Copies
    from .produce import Producer


class Local:
    """A message this node delivered to its own sessions as it accepted it, until its record is
    read back from the messages topic (then skipped there: not delivered twice)."""
    __slots__ = ("body", "msg", "sender", "writer", "n", "at", "handles", "deferred")

    def __init__(self, body: bytes, msg: Message, sender: str, writer: bytes, n: int,
                 at: float) -> None:
        self.body = body        # the record body as signed (what the log holds)
        self.msg = msg
        self.sender = sender    # the publisher's client id
        self.writer = writer    # the message id's prefix (<node>-<incarnation>) and number
        self.n = n
        self.at = at            # time.monotonic() when accepted
        self.handles: list[Handle] = []  # stored copies: their place in the log once known
        self.deferred = False   # not delivered here yet (Held.here)


# A held Local whose record was never read back (its write failed, or Kafka lost it) is
# forgotten after this many seconds
LOCAL_KEEP = 300.0
MAC_BYTES = 16  # the end of a signed record body: its HMAC (cluster/trust.py), unique per record


class Held:
    """`producer`: the node's producer (what it handed to Kafka and Kafka answered);
    `topic`: the messages topic; `read_upto`: per partition, the next offset this node delivers;
    `waiting_subs`: the new subscriptions still starting (ClusterNode.install); `writer`: the
    message ids' prefix of this node's incarnation; `copies`: told of the records read back."""

    def __init__(self, cfg: ClusterConfig, topic: str, producer: Callable[[], Producer],
                 read_upto: Callable[[], dict[int, int]], waiting_subs: Callable[[], list],
                 writer: Callable[[], bytes], copies: Copies, counters: dict[str, int]) -> None:
        self.cfg = cfg
        self.topic = topic
        self.producer = producer
        self.read_upto = read_upto
        self.waiting_subs = waiting_subs
        self.writer = writer
        self.copies = copies
        self.counters = counters
        self.broker: HookHost = None  # type: ignore[assignment]  # ClusterNode.attach()
        self.local: dict[bytes, Local] = {}     # the MAC of an own record -> delivered here
        self.placing: Local | None = None       # the Local being delivered here (its handles)
        # not delivering at once (spilling): (records handed to the producer then, the offsets
        # to read up to once all those were answered), until this node has read them all
        self.spill: tuple[int, dict[int, int] | None] | None = None
        self.deferred: list[Local] | None = None  # held meanwhile, to deliver then, in order

    def lost(self) -> None:
        """Kafka lost its data: cluster/copies.py is told of the messages delivered here whose
        records were not read back, so their copies written again (other bytes: mqtt.again)
        are skipped here. They stay held: a record written after Kafka restarted and before
        this node saw it is in the new log, the same bytes, and is skipped here as its own
        when read (else its subscribers here would get it twice); one that went with the old
        log is forgotten after LOCAL_KEEP."""
        for e in self.local.values():
            if not e.deferred:
                self.copies.lost_here(e.writer, e.n)

    def here(self, msg: Message, sender: str, signed: bytes, n: int) -> None:
        """A message accepted here, to this node's sessions now, as a single broker does
        (MQTT 5 4.6: a publisher's messages reach a subscriber in order, whatever their topics),
        and to the new subscriptions still starting (install()): they were made before it.
        Held (self.local) until its record is read back, which is then skipped (own): the
        sessions here have it, and a session that comes here before that takes it from there
        (held_for). $share groups get it through their own streams, as every message.

        While nobody here can want it, or cluster.max_held messages are held, it is not held:
        delivered here from its record, as on the other nodes ("spilled"). Until this node has
        read every spilled record (spilling), the next messages are held but delivered only
        then, in order (a message delivered at once would pass one of its topic)."""
        if self.spill is not None and self.spilling():
            if self.deferred is not None or len(self.local) < self.cfg.max_held and \
                    (self.broker.has_plain_subscribers() or self.waiting_subs()):
                e = self.hold(msg, sender, signed, n)
                e.deferred = True
                if self.deferred is None:
                    self.deferred = []
                self.deferred.append(e)
                return
        elif len(self.local) < self.cfg.max_held and \
                (self.broker.has_plain_subscribers() or self.waiting_subs()):
            self.deliver_here(self.hold(msg, sender, signed, n))
            return
        self.spill = (self.producer().handed, None)  # delivered here when read back

    def hold(self, msg: Message, sender: str, signed: bytes, n: int) -> Local:
        e = Local(signed, msg, sender, self.writer(), n, time.monotonic())
        self.local[signed[-MAC_BYTES:]] = e
        return e

    def deliver_here(self, e: Local) -> None:
        msg, broker = e.msg, self.broker
        starting = [sub for sub, _ in self.waiting_subs()
                    if matches(sub.topic_filter, msg.topic)] if self.waiting_subs() else None
        self.placing = e
        try:
            got = broker.deliver_with(msg, e.sender, starting) if starting else \
                broker.deliver(msg, e.sender)
            if got:
                self.counters["delivered"] += 1
        finally:
            self.placing = None

    def spilling(self) -> bool:
        """Whether records of messages spilled (here) may still be unread here: not all of
        them were answered by Kafka, or this node has not read up to where Kafka acknowledged
        them. Once they are all read, the messages held meanwhile are delivered, in order."""
        mark, need = self.spill  # type: ignore[misc]
        if need is None:
            producer = self.producer()
            if producer.answered < mark:
                return True
            messages = self.topic
            need = {p: off for (t, p), off in list(producer.acked_upto.items()) if t == messages}
            self.spill = (mark, need)
        upto = self.read_upto()
        if not all(upto.get(p, 0) >= off for p, off in need.items()):
            return True
        self.spill = None
        deferred, self.deferred = self.deferred, None
        for e in deferred or ():
            e.deferred = False
            self.deliver_here(e)
        return False

    def own(self, rec: Scanned, p: int, i: int) -> bool:
        """Whether record i is one this node delivered here as it accepted it (deliver_here):
        the same bytes as it wrote. Its stored copies learn their place in the log; the writer's
        last message id moves past it (a copy of it read later is a replay: cluster/copies.py)."""
        key = rec.tail(i, MAC_BYTES)
        e = self.local.get(key)
        if e is None or rec.body(i) != e.body:
            return False
        del self.local[key]
        pos = (p, rec.offsets[i])
        e.msg.store_id = pos
        for h in e.handles:
            if h.pos is None:
                h.pos = pos
        self.copies.read_own(self.topic, p, e.writer, e.n)
        return True

    def held_for(self, cid: str, subs: list) -> list:
        """(message, qos, retain, sub_ids, Local) of the messages accepted here whose records are
        not read back yet, for a session rebuilt here now: it was elsewhere when they were
        delivered here, and their records will be skipped (own), past its rebuild's scan."""
        out, now = [], self.broker.clock()
        for e in self.local.values():
            if e.deferred:
                continue  # delivered here later, to this session too
            got = match(subs, e.msg, e.sender, cid, -1, 0)
            if got is not None and (e.msg.expires_at is None or e.msg.expires_at > now):
                out.append((e.msg, *got, e))
        return out

    def forget(self, now: float) -> None:
        """Drop the held messages whose records never came back (LOCAL_KEEP)."""
        local = self.local
        while local:
            key = next(iter(local))
            if now - local[key].at < LOCAL_KEEP:
                return
            del local[key]
