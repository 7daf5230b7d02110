"""One replay subscription inside the broker: what the session is sent, in which order. Sans-I/O.

A HistoryFeed plays two parts:

* the session's **feed** (it sits in ``Session.feeds``, broker/core/session.py): ``pump()`` sends
  the replayed messages as the client's window allows - nothing while the transport is paused,
  QoS 1/2 within its Receive Maximum and after the session's own queue, at most a burst per
  event-loop turn - and asks its source for more (``control.want()``) when it runs low, so a
  history is never loaded whole: the worker process (sink/replay/worker.py) streams it;
* the router's **tap** for the live messages of the filter: its Subscription is in the router
  from the SUBSCRIBE on (its "session" is this feed, under a key of its own), so nothing
  accepted meanwhile is missed.

The switch to live without a gap or a duplicate. The tap is *armed* at the SUBSCRIBE: it keeps
the live messages (bounded: ``limits.live_messages`` / ``live_bytes``) and the sequence number
the sink's next record will have (``control.arm()``). Once Kafka holds every record before that
one (the forwarder's acknowledgements, ``poll_sync``) the worker is asked to ``sync``: it answers
with a ``synced`` marker in its stream after every record Kafka had then. When the session
reaches that marker it has been sent everything accepted before the tap was armed, and the tap
holds everything after: the held live messages follow, minus those the stream carried too (the
sink's message id on the live message, ``Message.sink_id``, against ``mqtt.message_id``), and
the subscription is live. Per topic the order holds: Kafka keeps a topic's records in the order
they were accepted, so what the stream carried of the held ones is their beginning.

A client that reads slower than its filter's messages arrive fills the held messages: they are
dropped (*disarmed*: the stream carries them, from Kafka) and the tap is armed again when the
stream reports that it reached Kafka's end (a ``head`` marker). Messages the sink does not keep
(its excluded topics: no id) are sent at once; they are never in the history.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from broker.core.session import Subscription

if TYPE_CHECKING:
    from broker.core.connection import Connection
    from broker.core.hookhost import HookHost
    from broker.core.message import Message
    from broker.core.session import Session

    from .hook import WorkerControl
    from .spec import ReplaySpec

log = logging.getLogger(__name__)

REPLAYING, SWITCHING, LIVE, DONE = "replaying", "switching", "live", "done"
BURST_MESSAGES = 1000     # messages sent per pump (an event-loop turn), as the retained replay
BURST_BYTES = 1 << 20
LOW_WATER = 256           # fewer prepared messages than this: ask the source for more


class Limits:
    """What one replay may hold in the broker (settings [replay])."""
    __slots__ = ("live_messages", "live_bytes")

    def __init__(self, live_messages: int = 10_000, live_bytes: int = 16 << 20):
        self.live_messages = live_messages
        self.live_bytes = live_bytes


class HistoryFeed:
    """See the module's docstring. ``control``: the source's side (hook.py WorkerControl, or a
    test's fake): want(), arm() -> sequence number, sync(generation), close()."""

    def __init__(self, broker: HookHost, session: Session, book: Subscription, spec: ReplaySpec, qos: int,
                 no_local: bool, retain_as_published: bool, sub_id: int | None, control: WorkerControl,
                 limits: Limits,
                 on_end: Callable[[HistoryFeed], None] | None = None) -> None:
        self.broker = broker
        self.session = session
        self.book = book                      # in session.subscriptions, under the $replay/ filter
        self.filter = book.filter
        self.spec = spec
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.sub_ids = (sub_id,) if sub_id else None
        self.control = control
        self.limits = limits
        self.on_end = on_end                  # called once when it ends (the hook forgets it)
        # the router's key for the tap (Router.add): its own, so a plain subscription of this
        # client to the same filter is another entry
        self.client_id = f"{session.client_id}\x00{book.filter}"
        self.username = session.username      # (broker.core.session.Subscriber, with client_id)
        self.connection: Connection | None = None   # (a $share group member's: the tap is never one)
        self.tap = Subscription(book.filter, spec.filter, None, qos, no_local, retain_as_published,
                                0, sub_id, self)  # (the feed stands in for
        # the session: the router hands the live tap's messages to its deliver())
        self.check = True                     # (Session.recheck_read sets it: each is checked)
        self.state = REPLAYING
        # prepared items, in order: (Message, qos, retain, message id) or a marker (None, kind,
        # value, None)
        self.ready: deque = deque()
        self.requested = False
        self.progress_at = broker.clock()     # since when the client took nothing waiting for it
        self.stash: deque | None = None       # the stream after the synced marker, while switching
        # the tap's held live messages (armed): (Message, qos, retain, message id)
        self.live: deque = deque()
        self.live_ids: dict = {}              # their ids
        self.live_bytes = 0
        self.dups: set = set()                # ids of held messages the stream carried too
        self.skip: set = set()                # ids sent live before a switch was abandoned
        self.generation = 0
        self.armed = 0                        # the generation armed, 0 when not
        self.arm_seq = 0
        self.sync_sent = False
        self.in_table = True                  # the stream is still in the table's part
        self.counts = {"table": 0, "kafka": 0, "live": 0, "dropped_live": 0, "expired": 0,
                       "disarmed": 0, "invalid": 0}
        self.why = ""

    # ------------------------------------------------------------ start
    def start(self) -> None:
        """The tap into the router, armed; the first records asked for."""
        self.broker.route_from_now(self.tap)
        self._arm()
        self._want()

    def _arm(self) -> None:
        self.generation += 1
        self.armed = self.generation
        self.arm_seq = self.control.arm()
        self.sync_sent = False

    def _disarm(self) -> None:
        self.armed = 0
        self.live.clear()
        self.live_ids.clear()
        self.live_bytes = 0
        self.dups.clear()
        self.counts["disarmed"] += 1

    def poll_sync(self, forwarded_seq: int) -> None:
        """Kafka holds every record below ``forwarded_seq``: once that covers the arming point,
        the worker is asked for its synced marker."""
        if self.armed and not self.sync_sent and self.state is REPLAYING \
                and forwarded_seq >= self.arm_seq:
            self.sync_sent = True
            self.control.sync(self.armed)

    # ------------------------------------------------------------ the source's records
    def add(self, items: list) -> None:
        """A chunk of the worker's stream (sink/replay/worker.py): records
        (id, topic, payload, qos, retain, accepted ms, properties, expiry s, client id) and
        markers (kind, value)."""
        self.requested = False
        if self.state is DONE:
            return
        # (SWITCHING: the stash is set)
        out: deque = self.stash if self.state is SWITCHING else self.ready  # type: ignore[assignment]
        b = self.broker
        if not self.ready:
            self.progress_at = b.clock()  # nothing was waiting for the client until now
        wall, clock = b.wall(), b.clock()
        cid = self.session.client_id
        skip = self.skip
        from broker.core.message import Message, publish_problem
        for it in items:
            if it[0].__class__ is str:
                if it[0] == "error":  # the stream cannot go on: said now, not after the rest
                    self.fail(str(it[1]))
                    return
                if it[0] == "table":
                    self.in_table = False
                out.append((None, it[0], it[1] if len(it) > 1 else None, None))
                continue
            rid, topic, payload, qos, retain, at_ms, props, expiry, sender = it
            if skip and rid in skip:
                continue
            if self.no_local and sender == cid:  # [MQTT-3.8.3-3], for the history too
                continue
            # a record in Kafka or the table may come from elsewhere: held to a PUBLISH's checks
            # (the protocol's limits), so the subscriber never gets a packet it cannot read
            problem = publish_problem(topic, payload, props)
            if problem is not None:
                self.counts["invalid"] += 1
                if self.counts["invalid"] <= 3:
                    self.session_note(logging.WARNING, "%s: replay of %s: record %r skipped: %s",
                                      cid, self.spec.filter, rid, problem)
                continue
            expires_at = None
            if expiry is not None:
                left = at_ms / 1000 + expiry - wall
                if left <= 0:  # [MQTT-3.3.2-5]: its Message Expiry Interval has passed
                    self.counts["expired"] += 1
                    continue
                expires_at = clock + left
            msg = Message(topic, payload, qos, retain, props, expires_at, sender, at_ms / 1000)
            self.counts["table" if self.in_table else "kafka"] += 1
            out.append((msg, qos if qos < self.qos else self.qos,
                        retain and self.retain_as_published, rid))
        link = self.session.connection
        if link is not None:
            link.wake()  # pumped at the end of this turn

    def _want(self) -> None:
        if not self.requested and self.state is REPLAYING:
            self.requested = True
            self.control.want()

    # ------------------------------------------------------------ the session's feed
    def pump(self, session: Session, link: Connection, now: float) -> bool:
        """Send what the window allows; True once there is nothing more to replay (the session
        drops it from its replays: the tap delivers from then on, or the replay ended)."""
        if self.state is DONE:
            return True
        if session.subscriptions.get(self.filter) is not self.book:
            self.end("unsubscribed")
            return True
        ready = self.ready
        inflight = session.inflight_out
        limit = link.receive_max
        allow = session.queues.allow_read
        steps, budget = BURST_MESSAGES, BURST_BYTES
        while ready:
            msg, qos, retain, rid = ready[0]
            if msg is None:
                ready.popleft()
                self._marker(qos, retain)
                if self.state is DONE:
                    return True
                ready = self.ready  # (a switch replaces it)
                continue
            if link.paused or (qos and (session.queue or len(inflight) >= limit)):
                if steps < BURST_MESSAGES:
                    self.progress_at = now
                return False  # [MQTT-3.3.4-9]; resume_writing / an ack pumps again
            if steps <= 0 or budget <= 0:
                self.progress_at = now
                link.wake()  # the rest next turn
                return False
            ready.popleft()
            if self.state is SWITCHING:
                self.live_bytes -= len(msg.payload) + len(msg.topic_bytes)
                if rid is not None:
                    self.skip.add(rid)  # sent live: dropped from the stream if the switch fails
                self.counts["live"] += 1
            elif rid in self.live_ids:
                self.dups.add(rid)  # the stream carried a held live message: not sent twice
            if allow is not None and not allow(session.client_id, session.username, msg.topic):
                continue  # the ACL's read rules, per message (docs/security.md "Access control")
            session.deliver(msg, qos, retain, self.sub_ids, now)
            steps -= 1
            budget -= len(msg.payload) + len(msg.topic_bytes) + 16
        if steps < BURST_MESSAGES:
            self.progress_at = now
        if self.state is SWITCHING:
            self._live()
            return True
        if len(ready) < LOW_WATER:
            self._want()
        return False

    def _marker(self, kind: str, value: Any) -> None:
        if kind == "head":  # the stream reached Kafka's end: hold live messages again
            if not self.armed and self.state is REPLAYING:
                self._arm()
        elif kind == "synced":
            if value == self.armed and self.state is REPLAYING:
                self._switch()

    def _switch(self) -> None:
        """Everything accepted before the tap was armed has been sent: the held live messages
        follow (minus those the stream carried), then the tap delivers directly."""
        self.stash, self.ready = self.ready, deque()
        dups = self.dups
        for e in self.live:
            if e[3] not in dups:
                self.ready.append(e)
            else:
                self.live_bytes -= len(e[0].payload) + len(e[0].topic_bytes)
        self.live.clear()
        self.live_ids.clear()
        self.dups = set()
        self.state = SWITCHING

    def _live(self) -> None:
        self.state = LIVE
        self.stash = None
        self.skip = set()
        self.control.close()
        c = self.counts
        self.session_note(logging.INFO, "%s: replay of %s: %d messages from the history table, %d "
                          "from Kafka, %d held live; live from now on", self.session.client_id,
                          self.spec.filter, c["table"], c["kafka"], c["live"])
        if self.live_until_passed(self.broker.wall()):
            self.end("its time range ended")

    def _abandon_switch(self) -> None:
        """Live messages arrive faster than the client takes them while switching: back to the
        stream (what was sent live is skipped there), armed again at its end."""
        self.counts["disarmed"] += 1
        skip = self.skip
        self.ready = deque(e for e in self.stash if e[3] is None or e[3] not in skip)  # type: ignore[union-attr]
        self.stash = None
        self.live_bytes = 0
        self.state = REPLAYING
        self.armed = 0
        self._want()

    # ------------------------------------------------------------ the router's tap
    def deliver(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...] | None, now: float) -> None:
        """A live message matching the filter (Broker.route calls it as for a session)."""
        s = self.session
        if self.state is DONE:
            return
        if s.subscriptions.get(self.filter) is not self.book:
            self.end("unsubscribed")
            return
        if self.no_local and msg.sender == s.client_id:  # [MQTT-3.8.3-3]
            return
        at = msg.accepted_at * 1000
        spec = self.spec
        if at < spec.since_ms:
            return
        if spec.until_ms is not None and at >= spec.until_ms:
            if self.state is LIVE:
                self.end("its time range ended")
            return
        state = self.state
        rid = getattr(msg, "sink_id", None)
        if state is LIVE or rid is None:  # live; or never in the history (sink's excluded topics)
            allow = s.queues.allow_read
            if allow is None or allow(s.client_id, s.username, msg.topic):
                s.deliver(msg, qos, retain, sub_ids, now)
            return
        size = len(msg.payload) + len(msg.topic_bytes)
        lim = self.limits
        if state is SWITCHING:
            if len(self.ready) >= lim.live_messages or self.live_bytes + size > lim.live_bytes:
                self._abandon_switch()
                return
            self.ready.append((msg, qos, retain, rid))
            self.live_bytes += size
            return
        if not self.armed:
            return  # the stream brings it, from Kafka
        if len(self.live) >= lim.live_messages or self.live_bytes + size > lim.live_bytes:
            self._disarm()  # held no more: the stream brings them, from Kafka
            return
        self.live.append((msg, qos, retain, rid))
        self.live_ids[rid] = None
        self.live_bytes += size

    # ------------------------------------------------------------ the end
    def idle_for(self, now: float) -> float:
        """How long messages have waited for a client that takes none of them (0: none wait,
        or it is live)."""
        if self.state is LIVE or self.state is DONE or not self.ready:
            return 0.0
        return now - self.progress_at

    def live_until_passed(self, wall: float) -> bool:
        until = self.spec.until_ms
        return until is not None and self.state is LIVE and wall * 1000 >= until

    def end(self, why: str) -> None:
        """No more of this replay: the tap leaves the router, the source stops. (The SUBSCRIBE's
        subscription stays until the client unsubscribes.)"""
        if self.state is DONE:
            return
        was_live = self.state is LIVE
        self.state = DONE
        self.why = why
        self.broker.remove_subscription(self.tap)
        self.control.close()
        self.ready = deque()
        self.stash = None
        self.live.clear()
        self.live_ids.clear()
        if not was_live:
            self.session_note(logging.INFO, "%s: replay of %s ended (%s) after %d messages from "
                              "the history table and %d from Kafka", self.session.client_id,
                              self.spec.filter, why, self.counts["table"], self.counts["kafka"])
        if self.on_end is not None:
            self.on_end(self)

    def fail(self, why: str) -> None:
        """The replay cannot go on: the client is told (DISCONNECT 0x83 with why; 3.1.x: the
        connection is closed), rather than left waiting for messages that will not come."""
        link = self.session.connection
        self.session_note(logging.WARNING, "%s: replay of %s failed: %s", self.session.client_id,
                          self.spec.filter, why)
        self.end(f"failed: {why}")
        if link is not None:
            link.server_disconnect(0x83, f"replay of {self.spec.filter} failed: {why}; subscribe "
                                   "again from the time of the last message received",
                                   publish_will=True)

    def session_note(self, level: int, fmt: str, *args: object) -> None:
        link = self.session.connection
        if link is not None:
            link.note(level, fmt, *args)
        else:
            log.log(level, fmt, *args)
