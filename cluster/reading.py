"""What a cluster node reads of its Kafka topics, on its loop (cluster/node.py hands it each
fetch): control records to the replicated state (cluster/control.py), retained ones to the
retained store, messages to this node's matching sessions, and the new subscriptions started
from where the log was at their SUBSCRIBE (waiting_subs). Every record must be signed by the
cluster (cluster/trust.py), not a copy of one read before (cluster/copies.py) and well formed
(cluster/records.py); what is not is ignored and counted.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from kafka_client.recordbatch import CorruptBatchError
from mqtt_topics import matches

from . import handover
from . import records as R
from .trust import MALFORMED

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from broker.core.message import Message
    from kafka_client.recordscan import Scanned

    from .copies import Copies
    from .held import Held
    from .link import Topics
    from .trust import Trust

log = logging.getLogger(__name__)


class Reading:
    """`control`: a control record to apply (offset, name, body, time); `read_upto`: per
    messages partition, the next offset to deliver (moved here as records are read); `held`:
    the messages this node delivered as it accepted them (skipped when read back)."""

    def __init__(self, topics: Topics, trust: Trust, copies: Copies, held: Held,
                 counters: dict[str, int], wall: Callable[[], float],
                 read_upto: Callable[[], dict[int, int]],
                 control: Callable[[int, str, dict | None, float], None]) -> None:
        self.topics = topics
        self.trust = trust
        self.copies = copies
        self.held = held
        self.counters = counters
        self.wall = wall
        self.read_upto = read_upto
        self.control = control
        self.broker: HookHost = None  # type: ignore[assignment]  # ClusterNode.attach()
        self.waiting_subs: list = []  # (sub, positions): new subscriptions not started

    def start(self, sub: object, since: dict[int, int]) -> None:
        """A new subscription, routed once this node has read up to `since` everywhere."""
        self.waiting_subs.append((sub, since))
        self.start_waiting_subs()

    def apply(self, batches: list) -> None:
        """A fetch's records, on the loop: control records to the replicated state, retained
        ones to the retained store, messages to this node's matching sessions. A message is
        looked at by its key (the MQTT topic) first: its value and headers are read only when
        someone here wants it, and a fetch is not even scanned when nobody here can want it
        (no plain subscription on this node and none starting: $share groups read their own
        streams)."""
        topics = self.topics
        broker = self.broker
        clock_now, wall_now = broker.clock(), self.wall()
        for topic, _p, rec, start in batches:
            if topic == topics.control:
                if not self.since(topic, rec, start):
                    continue
                for i in rec.indexes():
                    r = self.verified(topic, rec, i)
                    if r is None:
                        continue
                    off, key, value, _, ts = r
                    try:
                        name, body = R.decode_control(key, value)
                    except R.Malformed as exc:
                        self.trust.ignore(MALFORMED, f"{topic} offset {off}", str(exc))
                        continue
                    try:
                        self.control(off, name, body, ts / 1000.0)
                    except Exception:  # a bug, not the record's shape: never stops the node
                        log.exception("cluster: applying the control record at offset %d failed",
                                      off)
                        self.trust.ignore(MALFORMED, f"{topic} offset {off}", "could not apply")
            elif topic == topics.retained:
                if not self.since(topic, rec, start):
                    continue
                for i in rec.indexes():
                    r = self.verified(topic, rec, i)
                    if r is None:
                        continue
                    off, key, value, headers, ts = r
                    if not self.copies.fresh(topic, _p, off, headers):
                        continue
                    if value is None and key:
                        broker.set_retained(key.decode(errors="replace"), None)
                        continue
                    got = self.decode(topic, off, key, value, headers, ts, clock_now, wall_now)
                    if got is None:
                        continue
                    msg, name = got[0], got[0].topic
                    if msg.expires_at is not None and msg.expires_at <= clock_now:
                        broker.set_retained(name, None)  # expired meanwhile
                    else:
                        msg.retain = True
                        broker.set_retained(name, msg)
        anyone = broker.has_plain_subscribers()
        for topic, p, rec, start in batches:
            if topic != topics.messages:
                continue
            starting = self.starting(p)
            if starting:
                n = self.route_starting(rec, p, starting, clock_now, wall_now) \
                    if self.since(topic, rec, start) else 0
            elif not anyone and not self.held.local:
                n = 0  # nobody here to deliver to: not even the keys are read
            else:
                deliver = broker.deliver
                subscribers_of = broker.subscribers_of  # cached per topic
                own = self.held.own if self.held.local else None
                n = 0
                for i in rec.indexes() if self.since(topic, rec, start) else ():
                    if own is not None and own(rec, p, i):
                        continue  # delivered here as it was accepted
                    topic_name = rec.topic(i)
                    if topic_name is None or not subscribers_of(topic_name):
                        continue  # no subscriber here: not decoded (shared groups: their streams)
                    got = self.message(topic, p, rec, i, clock_now, wall_now)
                    if got is None:
                        continue
                    msg, sender = got
                    msg.store_id = (p, rec.offsets[i])  # its place in the log
                    try:
                        deliver(msg, sender)
                    except Exception:  # a bug: the fetch's other records still go out
                        self.failed(p, rec.offsets[i])
                        continue
                    n += 1
            self.read_upto()[p] = rec.end
            self.counters["delivered"] += n
            self.counters["read"] += len(rec) if rec.scanned else rec.end - start
        if self.waiting_subs:
            self.start_waiting_subs()
        if self.held.deferred is not None:
            self.held.spilling()  # delivers the held messages once the spilled ones are read

    def since(self, topic: str, rec: Scanned, start: int) -> bool:
        """rec.since(start); False, counted, when its batches are not what they say they are
        (the fetch's records are skipped, the position moves past them)."""
        try:
            rec.since(start)
        except CorruptBatchError as exc:
            self.trust.ignore(MALFORMED, f"{topic} from offset {start}", str(exc))
            return False
        return True

    def verified(self, topic: str, rec: Scanned, i: int) -> tuple | None:
        """(offset, key, value, headers, timestamp) of record i when a node of this cluster
        wrote it (signed with the cluster's key); else None, counted."""
        try:
            r = rec.record(i)
            why = self.trust.check(topic, rec.body(i), r[4])
        except CorruptBatchError as exc:
            self.trust.ignore(MALFORMED, f"{topic} offset {rec.offsets[i]}", str(exc))
            return None
        if why is not None:
            self.trust.ignore(why, f"{topic} offset {r[0]}")
            return None
        return r

    def message(self, topic: str, p: int, rec: Scanned, i: int, clock_now: float,
                 wall_now: float) -> tuple[Message, str] | None:
        """verified() then decode() of record i."""
        r = self.verified(topic, rec, i)
        if r is None or not self.copies.fresh(topic, p, r[0], r[3]) or handover.to_one(r[3]):
            return None  # (addressed to one session: only its rebuild takes it, cluster/handover.py)
        return self.decode(topic, r[0], r[1], r[2], r[3], r[4], clock_now, wall_now)

    def decode(self, topic: str, off: int, key: bytes | None, value: bytes | None,
                headers: list, ts: int, clock_now: float,
                wall_now: float) -> tuple[Message, str] | None:
        """(Message, publisher) of a messages or retained record, checked as a PUBLISH is
        (records.decode_message with this broker's limits); None, counted, if it is not one."""
        try:
            msg, sender, _ = R.decode_message(key, value, headers, ts, clock_now, wall_now,
                                              self.broker.cfg)
        except R.Malformed as exc:
            self.trust.ignore(MALFORMED, f"{topic} offset {off}", str(exc))
            return None
        return msg, sender

    def starting(self, p: int) -> list:
        """(subscription, first offset) of the new subscriptions that take partition p's
        records from a known position but are not routed yet."""
        return [(sub, since[p]) for sub, since in self.waiting_subs if p in since]

    def route_starting(self, rec: Scanned, p: int, starting: list, clock_now: float,
                        wall_now: float) -> int:
        """The slow path while new subscriptions start: record by record, each also goes to the
        new subscriptions it matches at or after their first offset (so none misses a record of
        a batch that crosses its start, whatever the other partitions have reached)."""
        broker, subscribers_of, n = self.broker, self.broker.subscribers_of, 0
        for i in rec.indexes():
            if self.held.local and self.held.own(rec, p, i):
                continue  # delivered here as it was accepted, to the starting ones too
            topic = rec.topic(i)
            if topic is None:
                continue
            off = rec.offsets[i]
            new = [sub for sub, first in starting
                   if off >= first and matches(sub.topic_filter, topic)]
            if not new and not subscribers_of(topic):
                continue
            got = self.message(self.topics.messages, p, rec, i, clock_now, wall_now)
            if got is None:
                continue
            msg, sender = got
            msg.store_id = (p, off)
            try:
                if new:
                    broker.deliver_with(msg, sender, new)
                else:
                    broker.deliver(msg, sender)
            except Exception:  # a bug: the fetch's other records still go out
                self.failed(p, off)
                continue
            n += 1
        return n

    def failed(self, p: int, off: int) -> None:
        """Delivering a record raised (a bug, not the record's shape): said with its traceback
        and counted; the node goes on with the fetch's other records, which a raise out of
        apply() would skip for every session here (the read position is already past them)."""
        log.exception("cluster: delivering the message at %s-%d offset %d failed",
                      self.topics.messages, p, off)
        self.counters["deliver_failed"] += 1

    def start_waiting_subs(self) -> None:
        """Route the new subscriptions the reader has caught up with in every partition (until
        then route_starting() gives them their records)."""
        still, broker = [], self.broker
        for w in self.waiting_subs:
            sub, since = w
            s = sub.session
            if s.subscriptions.get(sub.filter) is not sub or broker.session_of(s.client_id) is not s:
                continue  # unsubscribed, replaced or ended meanwhile
            upto = self.read_upto()
            if all(upto[p] >= off for p, off in since.items()):
                broker.route_from_now(sub)
            else:
                still.append(w)
        self.waiting_subs = still
