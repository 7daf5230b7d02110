"""A session's messages handed over with it when it moves to another node and the log no longer
holds them (the cluster's Kafka lost its data).

A moved session is rebuilt from the log: its last node's final state names the positions in the
messages topic below which everything was delivered and acknowledged, and the new node reads the
session's messages from there (cluster/rebuild.py). A message its node read from a log Kafka
has since lost (or a retained message delivered on subscribe, never in the log) has no such
position. When the session a node gives up holds one, queued or in flight, the node writes what
it owes the session (in flight first, with packet ids and PUBREC state, then the queue, in
order) to the messages topic as records addressed to the session (header `mqtt.to`: the client
id, the handover's id, the QoS, retain flag, subscription ids, packet id and whether PUBREC
came), waits for Kafka to acknowledge them, and only then writes the final state. Its checkpoint
then starts where the node had read (everything below was delivered, or is carried), has no
in-flight positions, and names the handover (`carried`: its id, how many records, and the
offsets they are below). The new node reads from those positions to where it has read, and the
handover's records up to the offsets named; what was carried goes first (in flight with its
packet ids: a QoS 2 message is not delivered twice), then the messages of the log. A node that
dies before it wrote its final state loses what it owed (it was in its memory only).

Addressed records are never delivered by a node's reading of the log (cluster/reading.py Reading.message,
cluster/shares.py): only a rebuild takes them; a rebuild from a checkpoint whose positions
are below one of them (the session moved on before it had everything) takes it as any record of
its range, with the QoS it was carried with.
"""
from __future__ import annotations

import json
import logging
from typing import AbstractSet, Any, Iterable

from broker.core.durability import Pending
from kafka_client.record import read_zz_varint, vlen

from . import records as R

log = logging.getLogger(__name__)

H_TO = "mqtt.to"


class _Carry:
    """The records of one handover: its token resolves when Kafka acknowledged them all (the
    shape ClusterNode._completed expects of a batch)."""
    __slots__ = ("count", "token", "failure")

    def __init__(self) -> None:
        self.count = 0
        self.token: Pending | None = Pending()
        self.failure: str | None = None


def _unplaced(handle: Any, coming: AbstractSet[int]) -> bool:
    """No position in the log, and none coming: `coming` holds the ids of the handles of
    messages this node delivered as it accepted them, whose records it has not read back yet
    (ClusterNode.local): their records are in the log, above where the node has read, so the
    next node reads them from there."""
    return getattr(handle, "pos", None) is None and id(handle) not in coming


def needed(s: Any, coming: AbstractSet[int] = frozenset()) -> bool:
    """Whether session `s` holds a message that has no position in the log."""
    return any(_unplaced(e.handle, coming) for e in s.inflight_out.values()) or \
        any(_unplaced(e[4], coming) for e in s.queue)


def owed(s: Any, coming: AbstractSet[int] = frozenset()) -> list[tuple[Any, int, bool, Any, int, bool]]:
    """(message, qos, retain, sub_ids, packet id or 0, released) of what `s` has in flight, in
    the order sent, then of its queue, in order; not those whose records are coming (above)."""
    out = [(e.msg, e.qos, e.retain, e.sub_ids, pid, e.released)
           for pid, e in s.inflight_out.items() if id(e.handle) not in coming]
    out += [(m, q, r, ids, 0, False) for m, q, r, ids, h in s.queue if id(h) not in coming]
    return out


def give(node: Any, s: Any, rec: dict) -> bool:
    """Node `node` (a ClusterNode) gives up session `s`, whose final state record is `rec`:
    when `s` holds messages the log no longer has, write what it owes as records addressed
    to it, then `rec` (carrying them) once Kafka has them. False when nothing needs carrying:
    the caller writes `rec` as it is."""
    ck = rec.get("session")
    coming = {id(h) for e in node.held.local.values() for h in e.handles}
    if ck is None or not needed(s, coming):
        return False
    cid = s.client_id
    items = owed(s, coming)
    hid = f"{node.node}-{node.inc}-{next(node.ids)}"
    now = node.broker.clock()
    ts = int(node.wall() * 1000)  # the remaining expiry is counted from now
    topic = node.topics.messages
    full = dict(ck, pos={str(p): o for p, o in node.routed_upto.items()}, inflight=[])
    batch = _Carry()
    for msg, qos, retain, sub_ids, pid, released in items:
        body = R.message_body(msg, msg.sender or "", None, 5, node.node,
                              f"{node.node}-{node.inc}-{next(node.ids)}", now)
        to = json.dumps({"c": cid, "h": hid, "q": qos, "r": int(retain),
                         "i": list(sub_ids or ()), "p": pid or 0, "l": int(released)},
                        separators=(",", ":")).encode()
        batch.count += 1
        node.producer.send_body(topic, with_header(body, H_TO, to), ts, batch)

    def written(token: Pending) -> None:
        if token.failure is None:
            acked = node.producer.acked_upto
            full["carried"] = {"h": hid, "n": len(items), "upto": {
                str(p): o for (t, p), o in acked.items() if t == topic}}
            rec["session"] = full
        else:
            log.warning("cluster: could not hand over the %d messages session %r was owed (%s): "
                        "its new node rebuilds it from the log alone", len(items), cid[:100],
                        token.failure)
        node._write_control(f"c:{cid}", rec)
        node.producer.kick()

    assert batch.token is not None
    batch.token.add_done_callback(written)
    node.producer.kick()
    return True


def upto(ck: dict) -> dict[int, int]:
    """Per messages partition, the offset the records a checkpoint carries are below ({} when
    it carries none)."""
    carried = ck.get("carried")
    if not carried:
        return {}
    return {int(p): o for p, o in carried["upto"].items()}


def arrange(found: list, cid: str, ck: dict, stop: dict[int, int],
            inflight: dict[tuple[int, int], tuple[int, int]]) -> list:
    """The records a rebuild scanned (partition, offset, key, value, headers, timestamp), as
    it takes them: those the checkpoint's handover carried first, in order, then the others
    below `stop` (past it, the live stream delivers them) not addressed to another session.
    Those carried in flight are added to `inflight` ((partition, offset) -> (packet id,
    released), the checkpoint's in-flight messages)."""
    hid = (ck.get("carried") or {}).get("h")
    first, rest = [], []
    for r in found:
        to = addressed(r[4])
        if to is None:
            if r[1] < stop.get(r[0], 0):
                rest.append(r)
        elif to["c"] == cid:
            if hid is not None and to["h"] == hid:
                first.append(r)
                if to["p"]:
                    inflight[(r[0], r[1])] = (to["p"], to["l"])
            elif r[1] < stop.get(r[0], 0):
                rest.append(r)
    if hid is not None and len(first) != ck["carried"]["n"]:
        log.warning("cluster: session %r was handed over with %d messages, %d found in Kafka",
                    cid[:100], ck["carried"]["n"], len(first))
    return first + rest


def addressed(headers: Iterable[tuple[str, Any]]) -> dict | None:
    """The `mqtt.to` header of a record, read (None when it has none; a malformed one is an
    address to nobody)."""
    for name, val in headers:
        if name == H_TO:
            try:
                to = json.loads(bytes(val))
                ok = type(to) is dict and type(to.get("c")) is str and type(to.get("h")) is str \
                    and to.get("q") in (0, 1, 2) and to.get("r") in (0, 1) and \
                    to.get("l") in (0, 1) and type(to.get("p")) is int and \
                    0 <= to["p"] <= 0xFFFF and type(to.get("i")) is list and \
                    all(type(i) is int and 0 < i <= 268435455 for i in to["i"])
            except (ValueError, TypeError):
                ok = False
            return to if ok else {"c": None, "h": None}
    return None


def to_one(headers: Iterable[tuple[str, Any]]) -> bool:
    """Whether a record is addressed to one session (not delivered by reading the log)."""
    for name, _ in headers:
        if name == H_TO:
            return True
    return False


def delivery(to: dict) -> tuple[int, bool, tuple[int, ...] | None]:
    """(qos, retain, sub_ids) an addressed record was carried with."""
    return to["q"], bool(to["r"]), tuple(to["i"]) or None


def with_header(body: bytes, name: str, value: bytes) -> bytes:
    """A record body (kafka_client.record.encode_body, unsigned) with one more header, after
    its others."""
    kl, o = read_zz_varint(body, 0)
    o += max(kl, 0)
    vl, o = read_zz_varint(body, o)
    o += max(vl, 0)
    nh, after = read_zz_varint(body, o)
    raw = name.encode()
    return b"".join((body[:o], vlen(nh + 1), body[after:], vlen(len(raw)), raw,
                     vlen(len(value)), value))
