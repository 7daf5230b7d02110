"""Publish/subscribe peers on the sans-I/O harness (tests/sansio.py): the sans-I/O forms of the
socket helpers of tests/integration/helpers.py (connect, publish_ok, ack, expect_disconnect,
assert_served, the retained-message probe), for the PUBLISH tests (tests/unit/test_core_publish*.py)."""
from __future__ import annotations

import itertools

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import encode, encode_publish
from broker.protocol.properties import encode_vbi
from tests.sansio import Client, ack, closed, publish_ok  # noqa: F401 (shared helpers, re-exported)

_ids = itertools.count(1)


def props(pkt) -> dict:
    return pkt.properties or {}


def connected(b, client_id: str | None = None, level: int = P.MQTT_5, clean: bool = True,
              expect_present: bool | None = None, props: dict | None = None, **kw) -> Client:
    """A connected Client; asserts the CONNACK accepted it (kept as `.connack`)."""
    c = Client(b, level)
    ack = c.connect(client_id or f"c{next(_ids)}", clean=clean, props=props, **kw)
    assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
    if expect_present is not None:
        assert ack.session_present is expect_present, ack
    c.connack = ack
    return c


def take(c: Client, ptype: int):
    """The first packet of `ptype` the client has; the others stay pending, in order."""
    pkts = c.received()
    for i, p in enumerate(pkts):
        if p.type == ptype:
            c.pending = pkts[:i] + pkts[i + 1:]
            return p
    raise AssertionError(f"no {P.TYPE_NAMES[ptype]}; got {pkts!r}")


def publishes(c: Client) -> list:
    """Every PUBLISH the client has now (nothing else may have come)."""
    pkts = c.received()
    assert all(p.type == P.PUBLISH for p in pkts), pkts
    return pkts


def subscribe(c: Client, *filters: str, qos: int = 0, pid: int = 1, properties=None, **opts) -> list:
    """SUBSCRIBE; returns the SUBACK's reason codes (retained messages stay pending)."""
    o = P.SubscriptionOptions(qos, **opts)
    c.send(P.Subscribe(pid, [(f, o) for f in filters], properties))
    ack = take(c, P.SUBACK)
    assert ack.packet_id == pid
    return ack.reason_codes


def publish(c: Client, topic: str, payload: bytes = b"x", qos: int = 0, pid: int = 1,
            retain: bool = False, dup: bool = False, properties: dict | None = None) -> None:
    c.send(P.Publish(topic, payload, qos, retain, dup, pid if qos else None, properties))


def bye(*clients: Client) -> None:
    """Normal DISCONNECT (0x00)."""
    for c in clients:
        if not closed(c.conn):
            c.send(P.Disconnect())


def expect_disconnect(c: Client, code: int) -> list:
    """The broker sends DISCONNECT `code` as its last packet and closes the connection."""
    seen = c.received()
    discs = [p for p in seen if p.type == P.DISCONNECT]
    assert discs, f"no DISCONNECT; saw {seen!r}"
    assert discs[-1].reason_code == code, \
        f"DISCONNECT reason 0x{discs[-1].reason_code:02X}, expected 0x{code:02X}: {discs[-1]!r}"
    assert seen[-1] is discs[-1], f"packets after DISCONNECT: {seen!r}"
    assert closed(c.conn), "DISCONNECT sent but the connection is not closed"
    return seen


def assert_served(b) -> None:
    """The broker still serves other clients: a fresh subscriber gets a fresh publisher's message."""
    topic = f"alive/{next(_ids)}"
    sub = connected(b)
    assert subscribe(sub, topic, qos=1) == [1]
    pub = connected(b)
    publish_ok(pub, topic, b"still-alive", qos=1, expect_code=0)
    (m,) = publishes(sub)
    assert (m.topic, m.payload, m.qos) == (topic, b"still-alive", 1)
    ack(sub, m)
    bye(sub, pub)


def retained(b, filt: str, **opts) -> list:
    """Subscribe with a fresh client; return the retained messages it gets (all of them: a
    replay may come in several bursts, one per drain)."""
    c = connected(b)
    subscribe(c, filt, qos=1, **opts)
    got = []
    while True:
        ms = publishes(c)
        if not ms:
            break
        for m in ms:
            got.append(m)
            ack(c, m)
    bye(c)
    return got


def raw_publish(topic: str, payload: bytes = b"", qos: int = 0, pid: int | None = None,
                properties: dict | None = None, first: int | None = None,
                level: int = P.MQTT_5) -> bytes:
    """Encoded PUBLISH; `first` overrides the fixed-header byte (to forge flags)."""
    data = bytearray(encode(P.Publish(topic, payload, qos, False, False, pid if qos else None,
                                      properties), level))
    if first is not None:
        data[0] = first
    return bytes(data)


def forge(topic: bytes, payload: bytes = b"x", qos: int = 0, pid: int | None = None,
          block: bytes = b"\x00", first: int | None = None) -> bytes:
    """A v5 PUBLISH built from raw parts (topic bytes, encoded property block)."""
    data = bytearray(encode_publish(topic, payload, qos, False, False, pid, block, P.MQTT_5))
    if first is not None:
        data[0] = first
    return bytes(data)


def block(*items: bytes) -> bytes:
    """A property block: Property Length, then the encoded properties."""
    body = b"".join(items)
    return encode_vbi(len(body)) + body


class AliasView:
    """Client side of outbound topic aliases: resolves what the broker sends."""

    def __init__(self, maximum: int):
        self.maximum = maximum
        self.map: dict[int, str] = {}

    def resolve(self, m: P.Publish) -> str:
        alias = props(m).get(PR.TOPIC_ALIAS)
        if alias is None:
            assert m.topic, f"empty topic without a Topic Alias: {m!r}"
            return m.topic
        assert 1 <= alias <= self.maximum, f"alias {alias} outside 1..{self.maximum}"  # [MQTT-3.3.2-11]
        if m.topic:
            self.map[alias] = m.topic
            return m.topic
        assert alias in self.map, f"alias {alias} used before the broker mapped it: {m!r}"
        return self.map[alias]
