"""Session state (4.1): subscriptions, in-flight windows, the offline queue.

Plain data plus the outbound delivery rules; no sockets. While a client is
connected `connection` is its Connection. What a session uses of it, all of it (the connection's
internals are its own: a session changes them only through these methods):

    read:    level, receive_max, max_packet_size, alias_max, paused (the client's limits and
             flow control, set by the connection)
    methods: write(data), outbound_alias(topic), outbound_alias_unsent(topic),
             outbound_aliases_reset(), wake(), note(level, fmt, *args), write_durable()
"""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from mqtt_topics import wildcard_shape

from ..protocol import packets as P
from ..protocol.codec import encode_ack
from .empties import NO_ENTRIES, NO_IDS, NOTHING

if TYPE_CHECKING:
    from .connection import Connection
    from .message import Message

NEVER = 0xFFFFFFFF  # Session Expiry Interval meaning "does not expire"
# a queued message: (message, qos, retain, subscription ids, its handle in the store or None)
QueueEntry = tuple["Message", int, bool, Any, Any]
RETAINED_BURST = 1 << 20  # bytes of retained messages written per pump: the rest waits for the next turn
RETAINED_STEPS = 1000     # retained messages looked at per pump (sent, skipped or over the budget)
RETAINED_LEFT_STEPS = 2 * RETAINED_STEPS  # looked at when the connection ends before all went (to the queue)


class RetainedBudget:
    """What the retained deliveries of one SUBSCRIBE may send together (mqtt.max_retained_replay):
    `left` more messages; beyond it they are counted (`dropped`) and, when the last of its
    deliveries ends (`open` 0), logged once."""
    __slots__ = ("left", "dropped", "open", "limit")

    def __init__(self, limit: int) -> None:
        self.left = self.limit = limit
        self.dropped = 0
        self.open = 0


class RetainedDelivery:
    """The retained messages one new subscription still has to be sent [MQTT-3.3.1-9]: a lazy
    walk of the retained store (RetainedStore.walk), so a SUBSCRIBE costs nothing up front
    however many messages match; `held` is one taken from the walk and waiting for the client's
    Receive Maximum; `check`: the ACL read check applies to each (docs/security.md "Access control")."""
    __slots__ = ("walk", "qos", "sub_ids", "check", "budget", "held")

    def __init__(self, walk: Iterator[tuple[Any, Message]], qos: int, sub_ids: Any, check: bool,
                 budget: RetainedBudget) -> None:
        self.walk = walk
        self.qos = qos
        self.sub_ids = sub_ids
        self.check = check
        self.budget = budget
        self.held: tuple[Any, Message] | None = None
        budget.open += 1


UNBOUNDED = 1 << 62  # the byte allowance of a queue without a bound


class Queues:
    """What the queues of every session of a broker share: the byte bounds (mqtt.max_queued_bytes
    per session, mqtt.max_queued_bytes_total for all; 0: none), the room left in all queues, and
    the ACL generation: Broker.flag_read_checks() raises it when the ACL changes, and a session
    whose `acl_gen` is older checks its queued messages against `allow_read` again before sending
    any (one comparison per pump on the common path). The bounds are kept as room left (one
    comparison and one subtraction per queued message)."""
    __slots__ = ("per_session", "total", "room", "acl_gen", "allow_read")

    def __init__(self, max_bytes: int = 0, max_total: int = 0) -> None:
        self.per_session = max_bytes or UNBOUNDED
        self.total = max_total or UNBOUNDED
        self.room = self.total      # bytes all queues may still take
        self.acl_gen = 0
        # the auth hook's allow_read, None when everything is allowed
        self.allow_read: Callable[[str, str | None, str], bool] | None = None

    @property
    def used(self) -> int:
        """Payload + topic bytes of every queued entry."""
        return self.total - self.room


def entry_size(msg: Message) -> int:
    """What one queued entry counts towards the byte bounds: payload and topic bytes (a message
    queued for several sessions counts in each, as in Mosquitto's max_queued_bytes)."""
    return len(msg.payload) + len(msg.topic_bytes)


class Subscriber(Protocol):
    """What the router delivers a subscription's messages to: a Session, or a history replay's
    live tap (sink/replay/feed.py HistoryFeed), which stands in for its session."""
    client_id: str
    username: str | None
    connection: Connection | None  # (a tap: None; the router prefers connected $share group members)

    def deliver(self, msg: Message, qos: int, retain: bool, sub_ids: Any, now: float) -> None: ...


class Subscription:
    __slots__ = ("filter", "topic_filter", "group", "qos", "no_local", "retain_as_published",
                 "retain_handling", "sub_id", "session", "read_check")

    def __init__(self, filt: str, topic_filter: str, group: str | None, qos: int, no_local: bool,
                 retain_as_published: bool, retain_handling: int, sub_id: int | None,
                 session: Subscriber) -> None:
        self.filter = filt                # as subscribed, including any $share/{group}/ prefix
        self.topic_filter = topic_filter  # the filter that matches topics
        self.group = group
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling
        self.sub_id = sub_id
        self.session = session
        self.read_check = False  # the ACL denies some topics it matches: check each message


class Inflight:
    """An outbound QoS 1/2 PUBLISH awaiting its acknowledgement (session.inflight_out[pid]):
    the message, as sent (qos, retain, sub_ids), whether PUBREC came (released: the next
    packet is PUBREL), and its handle in the persistent store (None when not stored)."""
    __slots__ = ("msg", "qos", "retain", "sub_ids", "released", "handle")

    def __init__(self, msg: Message, qos: int, retain: bool, sub_ids: Any, handle: Any) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.released = False
        self.handle = handle

    def __repr__(self) -> str:
        return (f"Inflight({self.msg.topic!r}, qos={self.qos}, retain={self.retain}, "
                f"sub_ids={self.sub_ids}, released={self.released}, handle={self.handle})")



class Session:
    __slots__ = ("client_id", "subscriptions", "inflight_out", "queue", "inflight_in",
                 "expiry_interval", "expires_at", "will", "will_at", "connection", "next_pid",
                 "max_queued", "queue_qos0", "stats", "username", "link_level", "sent",
                 "store", "resend_pending", "feeds", "queues", "queue_room", "acl_gen",
                 "qos2_unsure", "filter_bytes", "shapes", "wildcard_levels")

    def __init__(self, client_id: str, max_queued: int = 1000, queue_qos0: bool = False,
                 stats: dict[str, int] | None = None, sent: list[int] | None = None,
                 queues: Queues | None = None) -> None:
        self.client_id = client_id
        self.username: str | None = None
        self.link_level = 5  # protocol level of the last connection (for the sink record)
        # filter -> Subscription (NO_ENTRIES until the first: add_subscription())
        self.subscriptions: dict[str, Subscription] = NO_ENTRIES
        # what the subscriptions cost, kept by add_subscription() / drop_subscription() for the
        # bounds a SUBSCRIBE is checked against (docs/conformance.md "Subscription limits"): the filters'
        # length (mqtt.max_subscription_bytes); the wildcard shapes (mqtt_topics.wildcard_shape)
        # -> how many of its filters have each (NO_ENTRIES until a filter with a '+'), and the
        # sum of their wildcard levels (mqtt.max_wildcard_levels)
        self.filter_bytes = 0
        self.shapes: dict[str, int] = NO_ENTRIES
        self.wildcard_levels = 0
        # packet id -> Inflight; insertion order = send order. NO_ENTRIES until QoS 1/2 messages
        # may come (the first QoS 1/2 subscription, a restored message): _send() writes unchecked
        self.inflight_out: dict[int, Inflight] = NO_ENTRIES
        # (message, qos, retain, sub_ids) waiting to be sent; NOTHING until the first one (an idle
        # connection holds no deques: 760 bytes each)
        self.queue: deque[QueueEntry] = NOTHING
        # QoS 2 packet ids received, PUBREL not yet seen (NO_IDS until the first: qos2_received())
        self.inflight_in: set[int] = NO_IDS
        # QoS 2 packet ids that were awaiting PUBREL in a state this session was rebuilt from,
        # which may be older than the client's (the cluster's checkpoint of a node that died):
        # the client may have released them since. A PUBLISH with DUP 0 and such an id is a new
        # message, a PUBREL for one completes it, and they count against no Receive Maximum
        # (NO_IDS until the first: qos2_restored_unsure())
        self.qos2_unsure: set[int] = NO_IDS
        self.expiry_interval = 0
        self.expires_at: float | None = None
        self.will: Any = None  # the Will Message (packets.Will), None when none
        self.will_at: float | None = None
        self.connection: Connection | None = None
        self.next_pid = 1
        self.max_queued = max_queued
        self.queue_qos0 = queue_qos0
        self.stats = stats if stats is not None else {}
        self.sent = sent if sent is not None else [0, 0, 0]  # PUBLISH sent, by QoS
        # while this session outlives its connection: the persistence events its changes are
        # reported to (core/hooks.py Persistence: the hooks providing them), else None
        # (hooks.Persistence: its methods are bound when the hooks change, so Any)
        self.store: Any = None
        self.resend_pending: deque[int] = NOTHING  # in-flight packet ids waiting to be resent
        # what pump() sends before the queue, in order, under backpressure ("feeds"): the retained
        # messages of new subscriptions, a RetainedDelivery (a lazy walk of the retained store)
        # each; and history replays ($replay/...: the replay hook's feed, whose pump(session,
        # link, now) sends what the window allows, True when done)
        self.feeds: deque[Any] = NOTHING
        self.queues = queues if queues is not None else Queues()
        self.queue_room = self.queues.per_session  # bytes its queue may still take (entry_size())
        self.acl_gen = self.queues.acl_gen  # the ACL its queue was checked against (pump)

    def add_subscription(self, sub: Subscription) -> None:
        """Add or replace the subscription for sub.filter."""
        subs = self.subscriptions
        if subs is NO_ENTRIES:
            subs = self.subscriptions = {}
        new = sub.filter not in subs  # (a replacement has the same filter: the same costs)
        subs[sub.filter] = sub
        if new:
            self.filter_bytes += len(sub.filter)
            if "+" in sub.topic_filter:
                self._count_shape(sub.topic_filter, 1)
        if sub.qos:
            self.may_send_qos12()

    def drop_subscription(self, filt: str) -> Subscription | None:
        """Remove the subscription for filt (exactly that filter); it, or None when none."""
        sub = self.subscriptions.pop(filt, None) if self.subscriptions else None
        if sub is not None:
            self.filter_bytes -= len(filt)
            if "+" in sub.topic_filter:
                self._count_shape(sub.topic_filter, -1)
        return sub

    def drop_subscriptions(self) -> None:
        """Remove every subscription (the session ends)."""
        if self.subscriptions:
            self.subscriptions.clear()
        self.filter_bytes = self.wildcard_levels = 0
        self.shapes = NO_ENTRIES

    def wildcard_room(self, topic_filter: str, limit: int) -> bool:
        """Whether one more filter keeps the wildcard levels of this session's distinct shapes
        within limit (mqtt.max_wildcard_levels; 0: no bound)."""
        if not limit or "+" not in topic_filter:
            return True
        shape, levels = wildcard_shape(topic_filter)
        return shape in self.shapes or self.wildcard_levels + levels <= limit

    def _count_shape(self, topic_filter: str, delta: int) -> None:
        shape, levels = wildcard_shape(topic_filter)
        shapes = self.shapes
        if shapes is NO_ENTRIES:
            shapes = self.shapes = {}
        n = shapes.get(shape, 0) + delta
        if n > 0:
            shapes[shape] = n
            if n == delta:  # a shape new to this session
                self.wildcard_levels += levels
        else:
            shapes.pop(shape, None)
            self.wildcard_levels -= levels

    def may_send_qos12(self) -> None:
        """QoS 1/2 messages may be sent from now on: the in-flight table exists (every QoS 1/2
        message comes through a QoS 1/2 subscription, or is restored from the store)."""
        if self.inflight_out is NO_ENTRIES:
            self.inflight_out = {}

    def qos2_received(self, pid: int) -> None:
        """A QoS 2 PUBLISH with this packet id was accepted: its PUBREL is awaited."""
        ids = self.inflight_in
        if ids is NO_IDS:
            ids = self.inflight_in = set()
        ids.add(pid)

    def qos2_restored_unsure(self, pid: int) -> None:
        """An inbound QoS 2 packet id that may still await its PUBREL (qos2_unsure)."""
        ids = self.qos2_unsure
        if ids is NO_IDS:
            ids = self.qos2_unsure = set()
        ids.add(pid)

    # ------------------------------------------------------------ outbound
    def deliver(self, msg: Message, qos: int, retain: bool, sub_ids: Any, now: float) -> None:
        """Hand a matching message to this session: send now, or queue it."""
        link = self.connection
        if link is None:
            if qos or self.queue_qos0:
                self._enqueue(msg, qos, retain, sub_ids)
            return
        if link.paused:
            # the client reads slower than we write: QoS 0 is dropped, QoS 1/2 waits (bounded)
            if qos:
                self._enqueue(msg, qos, retain, sub_ids)
            else:
                self.stats["dropped_slow_consumer"] = self.stats.get("dropped_slow_consumer", 0) + 1
        elif qos == 0:
            self._send(msg, 0, retain, sub_ids, now)
        elif self.queue or len(self.inflight_out) >= link.receive_max:
            # [MQTT-3.3.4-9]: never more unacknowledged QoS>0 PUBLISHes than the client's Receive Maximum
            self._enqueue(msg, qos, retain, sub_ids)
        else:
            self._send(msg, qos, retain, sub_ids, now)

    @property
    def queue_bytes(self) -> int:
        """entry_size() of the messages in `queue`."""
        return self.queues.per_session - self.queue_room

    def _enqueue(self, msg: Message, qos: int, retain: bool, sub_ids: Any) -> None:
        size = len(msg.payload) + len(msg.topic_bytes)  # entry_size(msg), inline
        q = self.queues
        queue = self.queue
        if len(queue) >= self.max_queued or size > self.queue_room:
            # Overflow policy: the newest message is dropped (as Mosquitto does), counted.
            self.stats["dropped_queue_full"] = self.stats.get("dropped_queue_full", 0) + 1
            return
        if size > q.room:
            self.stats["dropped_queues_total"] = self.stats.get("dropped_queues_total", 0) + 1
            return
        seq = self.store.enqueue(self.client_id, msg, qos, retain, sub_ids) if self.store else None
        if queue is NOTHING:
            queue = self.queue = deque()
        queue.append((msg, qos, retain, sub_ids, seq))
        self.queue_room -= size
        q.room -= size

    def requeue(self, entry: QueueEntry, front: bool = False) -> None:
        """A queued entry read back from the store (or the cluster's log): counted like one
        queued now, never dropped (it was accepted before the broker stopped). `front`: before
        what is queued already (older than it)."""
        if front:
            self.queued().appendleft(entry)
        else:
            self.queued().append(entry)
        size = entry_size(entry[0])
        self.queue_room -= size
        self.queues.room -= size

    def drop_queue(self) -> None:
        """The session ends: what its queue held no longer counts (mqtt.max_queued_bytes_total)."""
        self.queues.room += self.queue_bytes
        self.queue_room = self.queues.per_session
        self.queue = NOTHING

    def queued(self) -> deque[QueueEntry]:
        """The queue, made at its first message."""
        q = self.queue
        if q is NOTHING:
            q = self.queue = deque()
        return q

    def _send(self, msg: Message, qos: int, retain: bool, sub_ids: Any, now: float,
              seq: Any = None) -> bool:
        """Send one PUBLISH; `seq` is its row in the store when it came from the queue."""
        link: Connection = self.connection  # type: ignore[assignment]  # (callers: only while linked)
        expiry = None
        if msg.expires_at is not None:
            expiry = msg.remaining_expiry(now)
            if expiry == 0:  # [MQTT-3.3.2-5]: expired before onward delivery started
                self.stats["dropped_expired"] = self.stats.get("dropped_expired", 0) + 1
                if seq is not None:
                    self.store.remove(seq)
                return False
        alias, send_topic = link.outbound_alias(msg.topic) if link.alias_max else (0, True)
        data: bytes | bytearray
        data, off = msg.encoded(link.level, qos, retain, sub_ids, expiry, alias, send_topic)
        if len(data) > link.max_packet_size:
            # [MQTT-3.1.2-25]: too large for this client; discard as if sent
            self.stats["dropped_too_large"] = self.stats.get("dropped_too_large", 0) + 1
            if alias and send_topic:  # the alias was never sent: undo it [MQTT-3.3.2-11], 3.3.4
                link.outbound_alias_unsent(msg.topic)
            if seq is not None:
                self.store.remove(seq)
            return False
        if qos:
            pid = self.next_pid
            inflight = self.inflight_out
            while pid in inflight:  # [MQTT-2.2.1-4] non-zero and not in use
                pid = pid + 1 if pid < 65535 else 1
            self.next_pid = pid + 1 if pid < 65535 else 1
            store = self.store
            if store is not None:
                if seq is None:
                    seq = store.enqueue(self.client_id, msg, qos, retain, sub_ids, pid)
                else:
                    store.set_pid(seq, pid)
                if qos == 2:
                    # [MQTT-4.4.0-1] a broker that takes this session over (restart, another
                    # cluster node) resends it with this id, never as a new message: it leaves
                    # once the store holds the id
                    link.write_durable()
            # [MQTT-4.3.2-3] [MQTT-4.3.3-3] unacknowledged until acked
            inflight[pid] = Inflight(msg, qos, retain, sub_ids, seq)
            b = bytearray(data)
            b[off] = pid >> 8
            b[off + 1] = pid & 0xFF
            data = b
        elif seq is not None:
            self.store.remove(seq)  # a queued QoS 0 message, now sent
        link.write(data)
        self.sent[qos] += 1
        return True

    def deliver_retained(self, walk: Iterator[tuple[Any, Message]], qos: int, sub_ids: Any,
                        check: bool, budget: RetainedBudget,
                        now: float) -> None:
        """Retained messages for a new subscription [MQTT-3.3.1-9] (`walk`: RetainedStore.walk()),
        sent with RETAIN=1 by pump() like any other traffic: a burst per event-loop turn (at most
        RETAINED_BURST bytes, RETAINED_STEPS messages), nothing while the transport is paused, QoS 1/2
        within the client's Receive Maximum; at most `budget.limit` for one SUBSCRIBE, the excess
        counted (dropped_retained_replay) and logged. Holds no list of messages."""
        self.add_feed(RetainedDelivery(walk, qos, sub_ids, check, budget))
        self.pump(now)

    def add_feed(self, feed: Any) -> None:
        """A RetainedDelivery, or a history replay's feed (sink/replay/feed.py), for pump() to
        send after those before it."""
        if self.feeds is NOTHING:
            self.feeds = deque()
        self.feeds.append(feed)

    def _next_retained(self, r: RetainedDelivery, now: float) -> tuple[Any, Message] | None:
        """The next retained message of a delivery that may be sent (held, or from the walk), or None at the
        end of the walk; skips what was replaced, deleted, expired, not readable or over budget."""
        allow = self.queues.allow_read
        while True:
            held = r.held
            if held is None:
                held = next(r.walk, None)
                if held is None:
                    return None
            r.held = None
            node, msg = held
            if node.message is not msg or (msg.expires_at is not None and msg.expires_at <= now):
                continue  # replaced or deleted since (the newer one went out live), or expired
            if r.check and allow is not None and not allow(self.client_id, self.username, msg.topic):
                continue
            if r.budget.left <= 0:
                r.budget.dropped += 1
                self.stats["dropped_retained_replay"] = self.stats.get("dropped_retained_replay", 0) + 1
                continue
            return held

    def _pump_feeds(self, link: Connection, now: float) -> None:
        feeds = self.feeds
        inflight = self.inflight_out
        limit = link.receive_max
        budget = RETAINED_BURST
        steps = RETAINED_STEPS
        while feeds and not link.paused and budget > 0:
            if steps <= 0:
                link.wake()  # more next turn, even if this one wrote nothing
                return
            r = feeds[0]
            if r.__class__ is not RetainedDelivery:  # a history replay (core/hooks.py REPLAY): sends
                if not r.pump(self, link, now):  # what it may now; True once it is done
                    return
                feeds.popleft()
                continue
            steps -= 1
            held = self._next_retained(r, now)
            if held is None:
                feeds.popleft()
                self._retained_done(r, link)
                continue
            msg = held[1]
            q = r.qos if r.qos < msg.qos else msg.qos
            if q and len(inflight) >= limit:  # [MQTT-3.3.4-9]
                r.held = held
                return
            r.budget.left -= 1
            if self._send(msg, q, True, r.sub_ids, now):
                budget -= len(msg.payload) + len(msg.topic_bytes) + 16
        if not feeds and self.feeds is feeds:
            self.feeds = NOTHING  # an empty deque holds 624 bytes: not kept by every session

    def _retained_done(self, r: RetainedDelivery, link: Connection | None) -> None:
        b = r.budget
        b.open -= 1
        if b.open == 0 and b.dropped and link is not None:
            link.note(logging.WARNING, "%s: %d retained messages not sent: its SUBSCRIBE matched "
                      "more than mqtt.max_retained_replay (%d)", self.client_id, b.dropped, b.limit)

    def feeds_to_queue(self) -> None:
        """The connection went away before its retained deliveries ended: what is left joins the queue like any message
        for an offline session (QoS 0 only with queue_qos0_messages), as far as the queue's
        bounds allow: the walk stops at the first message the queue refuses, or after
        RETAINED_LEFT_STEPS messages."""
        feeds, self.feeds = self.feeds, NOTHING
        steps = RETAINED_LEFT_STEPS
        now = -1.0  # (expiry is checked again when the queue is sent)
        for r in feeds:
            if r.__class__ is not RetainedDelivery:
                continue  # a history replay ends with its connection (its hook ends it)
            r.budget.open -= 1
            if not (r.qos or self.queue_qos0):
                continue
            while steps > 0:
                steps -= 1
                held = self._next_retained(r, now)
                if held is None:
                    break
                msg = held[1]
                q = r.qos if r.qos < msg.qos else msg.qos
                if not (q or self.queue_qos0):
                    continue
                r.budget.left -= 1
                before = len(self.queue)
                self._enqueue(msg, q, True, r.sub_ids)
                if len(self.queue) == before:
                    break  # the queue is full: the rest would be dropped too

    def pump(self, now: float) -> None:
        """Send pending feeds (retained deliveries, history replays), then queued messages,
        while the transport and the client's Receive Maximum allow."""
        link = self.connection
        if link is None:
            return
        queues = self.queues
        if self.acl_gen != queues.acl_gen:
            self.recheck_read()
        if self.feeds:
            self._pump_feeds(link, now)
        queue = self.queue
        limit = link.receive_max
        while queue and not link.paused:
            msg, qos, retain, sub_ids, seq = queue[0]
            if qos and len(self.inflight_out) >= limit:
                break
            queue.popleft()
            size = len(msg.payload) + len(msg.topic_bytes)  # entry_size(msg), inline
            self.queue_room += size
            queues.room += size
            self._send(msg, qos, retain, sub_ids, now, seq)
        if not queue and queue is not NOTHING and self.queue is queue:
            self.queue = NOTHING  # drained: an empty deque holds 624 bytes (one per session that queued)

    def recheck_read(self) -> int:
        """The ACL changed since this session's queue was last checked: drop the queued
        messages (and retained messages waiting to be delivered) its client may no longer read,
        before any is sent. Returns how many were dropped (counted as not_authorized)."""
        q = self.queues
        self.acl_gen = q.acl_gen
        allow = q.allow_read
        if allow is None:
            return 0
        cid, user = self.client_id, self.username
        dropped = 0
        if self.queue:
            keep: deque[QueueEntry] = deque()
            for e in self.queue:
                if allow(cid, user, e[0].topic):
                    keep.append(e)
                else:
                    dropped += 1
                    size = entry_size(e[0])
                    self.queue_room += size
                    q.room += size
                    if e[4] is not None:
                        self.store.remove(e[4])
            self.queue = keep
        for r in self.feeds:
            r.check = True  # retained messages still to be delivered: checked as they are sent
        if dropped:
            self.stats["dropped_not_authorized"] = self.stats.get("dropped_not_authorized", 0) + dropped
        return dropped

    def resume(self, now: float) -> None:
        """On reconnection: resend unacknowledged PUBLISH (DUP=1) and PUBREL, then the queue.

        [MQTT-4.4.0-1]: original packet identifiers, original order; [MQTT-3.3.1-1]: DUP=1.
        [MQTT-3.3.4-9]: at most the client's Receive Maximum at once; the rest are resent
        one by one as acknowledgements free the window.
        """
        link: Connection = self.connection  # type: ignore[assignment]  # (called once linked)
        link.outbound_aliases_reset()
        self.resend_pending = NOTHING
        budget = link.receive_max
        for pid in list(self.inflight_out):
            if budget > 0:
                budget -= self._resend(pid, now)
            else:
                if self.resend_pending is NOTHING:
                    self.resend_pending = deque()
                self.resend_pending.append(pid)
        self.pump(now)

    def _resend(self, pid: int, now: float) -> int:
        """Resend one in-flight message; returns 1 when something was sent."""
        link: Connection = self.connection  # type: ignore[assignment]  # (callers: only while linked)
        e = self.inflight_out[pid]
        if e.released:  # [MQTT-4.3.3-6] the PUBREL, never the PUBLISH again
            link.write(encode_ack(P.PUBREL, pid, 0, None, link.level))
            return 1
        msg = e.msg
        expiry = msg.remaining_expiry(now) if msg.expires_at is not None else None
        data, off = msg.encoded(link.level, e.qos, e.retain, e.sub_ids, expiry)
        if len(data) > link.max_packet_size:  # [MQTT-3.1.2-25]: discard as if completed
            del self.inflight_out[pid]
            if e.handle is not None:
                self.store.remove(e.handle)
            return 0
        b = bytearray(data)
        b[0] |= 0x08
        b[off] = pid >> 8
        b[off + 1] = pid & 0xFF
        link.write(b)
        return 1

    def _freed(self, now: float) -> None:
        """A window slot was freed: resend a held message first, else send from the queue."""
        held = self.resend_pending
        while held and self.connection is not None:
            pid = held.popleft()
            if pid in self.inflight_out and self._resend(pid, now):
                return
        if self.queue or self.feeds:
            self.pump(now)

    def acked(self, pid: int, qos: int, now: float) -> bool | None:
        """PUBACK (`qos` 1) or PUBCOMP (`qos` 2) for an outbound message: free its slot. None
        when no message has that id (ignored); False when the packet is not the one the message's
        flow waits for - a PUBACK for QoS 2, a PUBCOMP for QoS 1 or before PUBREC - which the
        caller treats as a Protocol Error, as Mosquitto does."""
        entry = self.inflight_out.get(pid)
        if entry is None:
            return None
        # [MQTT-4.3.2-3] a QoS 1 PUBLISH waits for PUBACK; [MQTT-4.3.3-5] a PUBREL for PUBCOMP
        if entry.qos != qos or (qos == 2 and not entry.released):
            return False
        del self.inflight_out[pid]
        if entry.handle is not None:
            self.store.remove(entry.handle)
        if self.resend_pending or self.queue or self.feeds:  # (else _freed() has nothing to do)
            self._freed(now)
        return True

    def received(self, pid: int, reason_code: int, now: float) -> int | None:
        """PUBREC: returns the reason code for our PUBREL (0x92 when unknown), None when the
        PUBREC reported a failure and the flow ends [MQTT-4.3.3-4] [MQTT-4.4.0-2], or -1 when the
        message is QoS 1 (a Protocol Error for the caller)."""
        entry = self.inflight_out.get(pid)
        if entry is None:
            return 0x92
        if entry.qos != 2:  # [MQTT-4.3.2-3] a QoS 1 PUBLISH waits for PUBACK, not PUBREC
            return -1
        if reason_code >= 0x80:
            del self.inflight_out[pid]
            if entry.handle is not None:
                self.store.remove(entry.handle)
            self._freed(now)
            return None
        entry.released = True  # [MQTT-4.3.3-5] PUBREL unacknowledged until PUBCOMP
        if entry.handle is not None:
            self.store.set_released(entry.handle)
        return 0

    def purge_expired(self, now: float) -> int:
        """Drop queued messages whose Message Expiry Interval has passed."""
        q = self.queue
        if not q:
            return 0
        keep: deque[QueueEntry] = deque()
        for e in q:
            msg, _, _, _, seq = e
            if msg.expires_at is None or msg.expires_at > now:
                keep.append(e)
                continue
            size = entry_size(msg)
            self.queue_room += size
            self.queues.room += size
            if seq is not None:
                self.store.remove(seq)
        dropped = len(q) - len(keep)
        if dropped:
            self.queue = keep
            self.stats["dropped_expired"] = self.stats.get("dropped_expired", 0) + dropped
        return dropped
