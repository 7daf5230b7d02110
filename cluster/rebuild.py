"""A session that lived on another node, rebuilt on this one (cluster/node.py ClusterNode
admits it, cluster/claims.py says when).

From its last checkpoint (cluster/checkpoints.py): its subscriptions, its inbound QoS 2 ids; then
what the messages topic holds for it from the checkpoint's positions on, read by a consumer of
its own on a thread of its own (scan): queued, and in flight with their packet ids
[MQTT-4.4.0-1]; with what its last node handed over (cluster/handover.py) and what this node
accepted and delivered here before the session came (held_for).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from broker.core.session import Session
from kafka_client.gaps import ConsumerHoles
from kafka_client.headers import H_CLIENT_ID, H_MESSAGE_ID
from mqtt_topics import matches

from . import handover
from . import records as R
from .claims import UNAVAILABLE
from .link import make_consumer

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from broker.core.message import Message
    from broker.core.session import Subscription
    from settings import ClusterConfig

    from .checkpoints import Checkpoints
    from .claims import Claim
    from .trust import Trust

log = logging.getLogger(__name__)

PUBLISHER_SCAN = 5000  # records per partition a moved session without subscriptions reads back
CATCH_UP_SECONDS = 3.0  # how long a rebuild waits for this node's reading to reach its checkpoint


class Rebuild:
    """`topic`: the messages topic; `checkpoints`: where the rebuilt session is bound; `read_upto`:
    per messages partition, the next offset this node delivers (from there the live stream
    delivers to it); `held_for`: the messages accepted here not read back yet that the session's
    subscriptions take; `stored`: the node's on_message_stored (a stored message's handle);
    `decode`: (Message, publisher) of a record, or None (counted); `loop`: the node's loop;
    `log_end`: per messages partition, where the log ends as this node last knew it;
    `current`: whether a claim is still the client's current one, held by this node."""

    def __init__(self, cfg: ClusterConfig, bootstrap: str, topic: str, wall: Callable[[], float],
                 trust: Trust, checkpoints: Checkpoints, counters: dict[str, int],
                 read_upto: Callable[[], dict[int, int]], held_for: Callable[[str, list], list],
                 stored: Callable[..., Any], decode: Callable[..., tuple[Message, str] | None],
                 loop: Callable[[], asyncio.AbstractEventLoop],
                 log_end: Callable[[], dict[int, int]], current: Callable[[Claim], bool]) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.topic = topic
        self.wall = wall
        self.trust = trust
        self.checkpoints = checkpoints
        self.counters = counters
        self.read_upto = read_upto
        self.held_for = held_for
        self.stored = stored
        self.decode = decode
        self.loop = loop
        self.log_end = log_end
        self.current = current
        self.catching_up = 0  # rebuilds waiting for this node's reading (it reads meanwhile)
        self.broker: HookHost = None  # type: ignore[assignment]  # ClusterNode.attach()

    def rebuild(self, claim: Claim) -> None:
        """Bring a session that lived on another node here, once this node has read the
        messages topic as far as its last node had when it wrote the session's checkpoint.

        The live stream delivers to the session from this node's reading position on, and the
        rebuild scans the log below it from the checkpoint's positions: a node whose reading
        was behind the checkpoint (asleep, cluster/interest.py, or only slower than the last
        owner) would give the session again, as new messages, what its last node had already
        delivered [MQTT-4.3.3-3]. (Those offsets were read by the last node: they are in the
        log.) Waits at most CATCH_UP_SECONDS (then as it is, said)."""
        target = checkpoint_upto(claim.client.session or {})
        if self._reached(target):
            self._rebuild(claim)
            return
        self.catching_up += 1
        loop = self.loop()
        deadline = loop.time() + CATCH_UP_SECONDS

        def again() -> None:
            reached = self._reached(target)
            if not claim.token.done and not reached and loop.time() < deadline:
                loop.call_later(0.005, again)
                return
            self.catching_up -= 1
            if claim.token.done:  # failed meanwhile (this node fenced)
                return
            if not reached:
                self.counters["rebuild_behind"] += 1
                log.warning("cluster: rebuilding the session of %r before this node read the "
                            "messages topic as far as its checkpoint (%s, read to %s after "
                            "%.0f s): messages its last node delivered may come again",
                            claim.cid[:100], target, dict(self.read_upto()), CATCH_UP_SECONDS)
            if not self.current(claim):
                claim.token.resolve(UNAVAILABLE)  # claimed again elsewhere meanwhile
                return
            self._rebuild(claim)

        loop.call_later(0.005, again)

    def _reached(self, target: dict[int, int]) -> bool:
        """This node's reading is at `target` in every partition (or at where the log ends now,
        for a log that went back: Kafka lost data)."""
        upto, end = self.read_upto(), self.log_end()
        return all(upto.get(p, 0) >= min(o, end.get(p, 0)) for p, o in target.items())

    def _rebuild(self, claim: Claim) -> None:
        """The rebuild itself: its subscriptions from its last checkpoint, then what the
        messages topic holds for it from the checkpoint's positions on (queued, and in flight
        with their packet ids [MQTT-4.4.0-1])."""
        c = claim.client
        ck = c.session or {}
        broker = self.broker
        cid = c.cid
        s = broker.restore_session(cid, int(ck.get("expiry") or c.expiry), None,
                                   ck.get("user"), None, int(ck.get("next_pid") or 1))
        if s is None:  # expired under the current caps
            claim.token.resolve()
            return
        self.checkpoints.bound[cid] = c.epoch
        subs = []
        for row in ck.get("subs", ()):
            filt, qos, nl, rap, rh, sub_id = row[:6]
            try:
                sub = broker.restore_subscription(cid, filt, qos, bool(nl), bool(rap), rh, sub_id)
            except ValueError:
                continue
            if sub is None:
                continue
            since = {int(k): v for k, v in (row[6] if len(row) > 6 and row[6] else {}).items()}
            self.checkpoints.since[(cid, filt)] = since
            if sub.group is None:
                subs.append((sub, since))
        for pid in ck.get("qos2", ()):
            # as of the checkpoint: the client may have released and reused them since
            broker.restore_qos2(cid, pid, unsure=True)
        self.counters["rebuilt_sessions"] += 1
        start = {int(k): v for k, v in (ck.get("pos") or {}).items()}
        stop = dict(self.read_upto())  # from here on the live stream delivers to it
        carried = handover.upto(ck)  # and the records its last node handed over, to their end
        end = {p: max(o, carried.get(p, 0)) for p, o in stop.items()}
        ranges = {p: (start.get(p, stop[p]), end[p]) for p in stop if start.get(p, stop[p]) < end[p]}
        wrote = ck.get("wrote")
        if wrote and not subs and not carried:
            # only its own QoS 2 PUBLISHes written after the checkpoint are looked for: the
            # dead node wrote them in its last moments (each is followed by a checkpoint), so
            # the newest records of each partition, not everything since an idle client's
            # last checkpoint (a resend of an older one would be routed again)
            ranges = {p: (max(lo, hi - PUBLISHER_SCAN), hi) for p, (lo, hi) in ranges.items()}
        # past `stop`: what this node accepted and delivered here before the session came
        held = self.held_for(cid, subs) if subs else []
        if not (subs or wrote or carried) or not ranges and not held:
            claim.token.resolve()
            return
        inflight = {(p, off): (pid, rel) for p, off, pid, rel in ck.get("inflight", ())}
        # below these, what is not in flight was delivered and acknowledged (cluster/checkpoints.py)
        handed = {int(k): v for k, v in (ck.get("next") or {}).items()}
        if not ranges:
            self.rebuilt(claim, s, subs, inflight, handed, wrote, [], None, held)
            return
        filters = [sub.topic_filter for sub, _ in subs] + (["#"] if carried else [])

        def scan() -> None:
            try:
                found = handover.arrange(self.scan(ranges, filters, cid if wrote else None),
                                         cid, ck, stop, inflight)
                err = None
            except Exception as exc:  # Kafka unreachable: the CONNECT fails, nothing half-done
                found, err = [], exc
            self.loop().call_soon_threadsafe(self.rebuilt, claim, s, subs, inflight, handed,
                                           wrote, found, err, held)

        threading.Thread(target=scan, name=f"cluster-rebuild-{cid}", daemon=True).start()

    def scan(self, ranges: dict, filters: list, publisher: str | None = None) -> list:
        """(partition, offset, key, value, headers, timestamp) of the records in `ranges` whose
        MQTT topic matches one of `filters`, or (`publisher`) that client id's QoS 2 PUBLISHes
        of a persistent session (H_QOS2_ID) (another consumer, on this thread)."""
        from kafka import TopicPartition
        consumer = make_consumer(self.bootstrap, self.cfg.kafka, self.cfg.fetch_wait_ms)
        try:
            tps = {TopicPartition(self.topic, p): r for p, r in ranges.items()}
            consumer.assign(list(tps))
            holes = ConsumerHoles()  # offsets Kafka's answers skipped: again (kafka_client/gaps.py)
            for tp, (lo, _) in tps.items():
                consumer.seek(tp, lo)
                holes.expected[tp] = lo
            left = set(tps)
            out = []
            deadline = time.monotonic() + self.cfg.connect_timeout
            while left:
                if time.monotonic() > deadline:
                    raise TimeoutError("reading the session's messages took too long")
                recs = holes.cut(consumer, consumer.poll(timeout_ms=200))
                for tp, rs in recs.items():
                    hi = tps[tp][1]
                    for r in rs:
                        if r.offset >= hi:
                            break
                        topic = (r.key or b"").decode(errors="replace")
                        if any(matches(f, topic) for f in filters) or \
                                publisher is not None and qos2_of(r.headers, publisher):
                            out.append((tp.partition, r.offset, r.key, r.value, r.headers,
                                        r.timestamp))
                for tp in list(left):
                    if consumer.position(tp) >= tps[tp][1]:
                        left.discard(tp)
                        consumer.pause(tp)
            return out
        finally:
            consumer.close()

    def rebuilt(self, claim: Claim, s: Session, subs: list[tuple[Subscription, dict[int, int]]], inflight: dict,
                 handed: dict[int, int], wrote: str | None, found: list, err: Exception | None,
                 here: list | None = None) -> None:
        broker = self.broker
        cid = claim.cid
        if err is not None:
            log.warning("cluster: could not rebuild the session of %r: %s", cid[:100], err)
            claim.token.resolve(UNAVAILABLE)
            return
        if broker.session_of(cid) is not s:
            claim.token.resolve(UNAVAILABLE)  # taken over again meanwhile
            return
        clock_now, wall_now = broker.clock(), self.wall()
        queued = []
        messages = self.topic
        for p, off, key, value, headers, ts in found:
            why = self.trust.check_fields(messages, key, value, headers, ts)
            if why is not None:
                self.trust.ignore(why, f"{messages} offset {off}")
                continue
            if wrote is not None:
                pid = qos2_after(headers, cid, wrote)
                if pid is not None:
                    # written after the checkpoint, by the node that died: a DUP resend of it
                    # is acknowledged, not routed again [MQTT-4.3.3-9]
                    broker.restore_qos2(cid, pid, unsure=True)
            decoded = self.decode(messages, off, key, value, headers, ts, clock_now, wall_now)
            if decoded is None:
                continue
            msg, sender = decoded
            msg.store_id = (p, off)  # (partition, offset), as in _apply
            to = handover.addressed(headers)  # (handed over by its last node: as it was carried)
            got = match(subs, msg, sender, cid, p, off) if to is None else handover.delivery(to)
            if got is None:
                continue
            qos, retain, sub_ids = got
            if msg.expires_at is not None and msg.expires_at <= clock_now:
                continue  # [MQTT-3.3.2-5]
            held = inflight.get((p, off))
            if held is not None and qos:
                pid, released = held
                h = self.stored(cid, msg, qos, retain, sub_ids, pid)
                if released:
                    h.released = True
                broker.restore_outbound(cid, msg, qos, retain, sub_ids, pid, bool(released), h)
            elif to is None and off < handed.get(p, 0):
                continue  # delivered and acknowledged before the checkpoint: not again as new
            elif qos or s.queue_qos0:
                queued.append((msg, qos, retain, sub_ids))
        local = {}  # newer than the scan's: accepted here, their records not read back then
        for m, q, r, ids, e in here or ():
            if q or s.queue_qos0:
                queued.append((m, q, r, ids))
                local[id(m)] = e
        room = max(0, s.max_queued - len(s.queue))
        if len(queued) > room:  # the oldest are kept, as the newest are dropped when full
            broker.count_dropped("queue_full", len(queued) - room)
            queued = queued[:room]
        entries = [(m, q, r, ids, self.stored(cid, m, q, r, ids)) for m, q, r, ids in queued]
        for m, *_, h in entries if local else ():
            e = local.get(id(m))
            if e is not None and h.pos is None:
                e.handles.append(h)  # its place in the log once read back (cluster/held.py)
        # older than what the live stream queued meanwhile: in front, each counted in the bounds
        broker.restore_queued(cid, entries, front=True)
        self.counters["rebuilt_messages"] += len(entries) + len(s.inflight_out)
        claim.token.resolve()


def checkpoint_upto(ck: dict) -> dict[int, int]:
    """Per messages partition, how far the node that wrote a session's checkpoint had read: its
    positions, where its next message was, where its subscriptions started and what it handed
    over."""
    out: dict[int, int] = {}
    rows = [ck.get("pos"), ck.get("next"), handover.upto(ck)]
    rows += [row[6] for row in ck.get("subs", ()) if len(row) > 6 and row[6]]
    for row in rows:
        for p, o in (row or {}).items():
            out[int(p)] = max(out.get(int(p), 0), int(o))
    return out


def qos2_of(headers: Iterable[tuple[str, bytes]], client_id: str) -> bool:
    """A record of a persistent session's QoS 2 PUBLISH from `client_id` (H_QOS2_ID)."""
    cid = client_id.encode()
    found = mine = False
    for name, val in headers or ():
        if name == R.H_QOS2_ID:
            found = True
        elif name == H_CLIENT_ID:
            mine = bytes(val or b"") == cid
    return found and mine


def qos2_after(headers: Iterable[tuple[str, bytes]], client_id: str, wrote: str) -> int | None:
    """The packet id of `client_id`'s QoS 2 PUBLISH whose record its node wrote after the
    message id `wrote` (node-incarnation-number), else None."""
    if not qos2_of(headers, client_id):
        return None
    writer, _, last = wrote.rpartition("-")
    pid = mid = None
    for name, val in headers:
        if name == R.H_QOS2_ID:
            pid = bytes(val or b"")
        elif name == H_MESSAGE_ID:
            mid = bytes(val or b"").decode(errors="replace")
    if pid is None or mid is None or not pid.isdigit() or not last.isdigit():
        return None
    w, _, n = mid.rpartition("-")
    if w != writer or not n.isdigit() or int(n) <= int(last) or not 0 < int(pid) <= 0xFFFF:
        return None
    return int(pid)


def match(subs: Iterable[tuple[Subscription, dict[int, int] | None]], msg: Message, sender: str, cid: str, p: int,
           off: int) -> tuple[int, bool, tuple[int, ...] | None] | None:
    """(qos, retain, sub_ids) of a message for a session's subscriptions (as Broker.route), or
    None. A subscription made after the message was in the log does not take it."""
    qos, retain, ids = -1, False, []
    for sub, since in subs:
        if not matches(sub.topic_filter, msg.topic):
            continue
        if sub.no_local and sender == cid:  # [MQTT-3.8.3-3]
            continue
        if since and off < since.get(p, 0):
            continue
        if sub.qos > qos:
            qos = sub.qos
        retain = retain or (msg.retain and sub.retain_as_published)
        if sub.sub_id:
            ids.append(sub.sub_id)
    if qos < 0:
        return None
    return min(qos, msg.qos), retain, tuple(ids) or None

