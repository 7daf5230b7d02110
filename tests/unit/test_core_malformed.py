"""Malformed packets and protocol errors (MQTT 5.0 sections 1.5, 2.1-2.2, 4.13) through the
sans-I/O core: the broker ends only the offending connection (DISCONNECT 0x81 / 0x82 / ... for
v5, a plain close for 3.1.x), never delivers the bad message, and keeps serving everyone else.

The byte fixtures are tests/vectors.py's MALFORMED table (the decoder's errors; the DISCONNECT
/ CONNACK each gets is checked in tests/unit/test_core_flows.py) plus, here, CORE_CASES: packets
that decode but break a rule the Connection checks. Moved from tests/integration/test_malformed.py,
which keeps a socket set (the same DISCONNECT on the wire, split reads, early refusal of an
oversized packet, bursts of garbage connections, the real-time connect timeout)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder
from tests import vectors as V
from tests.sansio import Client, exchange, make

h = V.h
V3, V4, V5 = V.V3, V.V4, V.V5
MAL, PROTO = rc.MALFORMED_PACKET, rc.PROTOCOL_ERROR


# Packets that decode but that a client must not send: (name, level, bytes, DISCONNECT reason).
CORE_CASES = [
    ("connack_from_client", V5, h("20 03 00 00 00"), PROTO),
    ("suback_from_client", V5, h("90 04 00 01 00 00"), PROTO),
    ("pingresp_from_client", V5, h("d0 00"), PROTO),
    ("connack_from_client_v311", V4, h("20 02 00 00"), PROTO),
    ("suback_from_client_v311", V4, h("90 03 00 01 00"), PROTO),
    ("pingresp_from_client_v311", V4, h("d0 00"), PROTO),
    # [MQTT-3.3.4-6]: a PUBLISH from a client must not carry a Subscription Identifier
    ("publish_subscription_identifier", V5, h("32 0b 00 03 6d 2f 78 00 01 02 0b 05 78"), PROTO),
    # [MQTT-3.1.0-2]: a second CONNECT (3.1.1 and 3.1: closed)
    ("second_connect", V5, h("10 0f 00 04 4d 51 54 54 05 02 00 3c 00 00 02 63 32"), PROTO),
    ("second_connect_v311", V4, h("10 0e 00 04 4d 51 54 54 04 02 00 3c 00 02 63 32"), PROTO),
]
_AFTER_CONNECT = [(x.name, x.level, x.data, x.reason) for x in V.MALFORMED
                  if x.data[0] >> 4 != P.CONNECT]
ALL_CASES = _AFTER_CONNECT + CORE_CASES
_ids = [c[0] for c in ALL_CASES]


def connected(b, cid: str, level: int = V5) -> Client:
    c = Client(b, level)
    assert c.connect(cid).reason_code == 0
    assert c.received() == []
    return c


def subscriber(b, cid: str, filt: str = "#", level: int = V5) -> Client:
    c = connected(b, cid, level)
    c.send(P.Subscribe(1, [(filt, P.SubscriptionOptions(1))]))
    (ack,) = c.received()
    assert ack.reason_codes == [1]
    return c


def assert_ended(c: Client, out: bytes, level: int, reason: int) -> None:
    """v5: DISCONNECT with `reason` [MQTT-4.13.1-1] and nothing after it; 3.1.x: nothing sent,
    closed (3.1.1 4.8); either way the connection is gone from the broker."""
    assert c.conn.close_requested
    if level == V5:
        (d,), err = Decoder(V5).feed(out)
        assert err is None and d.type == P.DISCONNECT and d.reason_code == reason, d
    else:
        assert out == b""
    c.conn.connection_lost()  # the server closes the socket after writing
    assert c.conn not in c.conn.broker.connections


def assert_served(b) -> None:
    """The broker still serves other clients: a fresh subscriber gets a fresh publisher's message."""
    sub = subscriber(b, "alive-sub", "alive")
    pub = connected(b, "alive-pub")
    pub.send(P.Publish("alive", b"still-alive", 1, packet_id=1))
    (a,) = pub.received()
    assert a.type == P.PUBACK and a.reason_code == 0
    (m,) = sub.received()
    assert (m.topic, m.payload, m.qos) == ("alive", b"still-alive", 1)


# ---------------------------------------------------------------- one bad packet

@pytest.mark.parametrize("name,level,data,reason", ALL_CASES, ids=_ids)
def test_malformed_ends_only_that_connection_MQTT_4_13_1_1(name, level, data, reason):
    """4.13: a connection sending a malformed packet / protocol error gets DISCONNECT with the
    reason code (v5) or is closed (3.1.1) and is closed; nothing is delivered; other clients are
    still served."""
    b, _ = make()
    sub = subscriber(b, "sub")
    c = connected(b, "bad", level)
    assert_ended(c, exchange(c.conn, data), level, reason)
    assert sub.received() == [], "something was delivered from the bad connection"
    assert not sub.conn.close_requested
    assert_served(b)


_V4_CASES = [c for c in ALL_CASES if c[1] == V4]


@pytest.mark.parametrize("name,level,data,reason", _V4_CASES, ids=[c[0] for c in _V4_CASES])
def test_malformed_v31_closed(name, level, data, reason):
    """MQTT 3.1 (level 3, "MQIsdp") is checked like 3.1.1: the connection is closed, nothing sent."""
    b, _ = make()
    sub = subscriber(b, "sub")
    c = connected(b, "bad", V3)
    assert_ended(c, exchange(c.conn, data), V3, reason)
    assert sub.received() == []
    assert_served(b)


@settings(max_examples=100, deadline=None)
@given(case=st.sampled_from(ALL_CASES), data=st.data())
def test_malformed_split_anywhere_same_answer(case, data):
    """2.1, 4.13: however the bytes are cut into reads, the answer is the same DISCONNECT (v5) or
    close (3.1.1), sent once the packet's bytes are there (the asyncio side may hand the core any
    segmentation)."""
    name, level, raw, reason = case
    b, _ = make()
    c = connected(b, "bad", level)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=6))))
    out = b""
    for a, z in zip([0, *cuts], [*cuts, len(raw)]):
        out += exchange(c.conn, raw[a:z])
    assert_ended(c, out, level, reason)


def test_malformed_after_valid_in_same_read_MQTT_4_13_1_1():
    """4.13: packets before the malformed one in the same read are processed; the rest is not."""
    b, _ = make()
    sub = subscriber(b, "sub", "seg")
    c = connected(b, "bad")
    good = h("32 0c 00 03 73 65 67 00 01 00 67 6f 6f 64")  # QoS 1 "good", id 1
    bad = h("36 0b 00 03 73 65 67 00 02 00 62 61 64")  # QoS 3 "bad", id 2 [MQTT-3.3.1-4]
    after = h("30 0b 00 03 73 65 67 00 61 66 74 65 72")  # QoS 0 "after"
    pkts, err = Decoder(V5).feed(exchange(c.conn, good + bad + after))
    assert err is None and [p.type for p in pkts] == [P.PUBACK, P.DISCONNECT]
    assert pkts[1].reason_code == MAL and c.conn.close_requested
    assert [m.payload for m in sub.received()] == [b"good"]
    assert sub.received() == []


# ---------------------------------------------------------------- CONNECT and the first bytes

def test_pipelined_connect_subscribe_publish_in_order():
    """3.1.4: CONNECT followed at once by SUBSCRIBE and PUBLISH in one read is processed in
    order (CONNACK first)."""
    b, _ = make()
    c = Client(b)
    connect = h("10 0f 00 04 4d 51 54 54 05 02 00 3c 00 00 02 63 31")
    sub = h("82 0a 00 01 00 00 04 70 69 70 65 01")  # "pipe", QoS 1
    pub = h("32 0d 00 04 70 69 70 65 00 02 00 73 65 6c 66")  # QoS 1 "self", id 2
    pkts, err = Decoder(V5).feed(exchange(c.conn, connect + sub + pub))
    kinds = [p.type for p in pkts]
    assert err is None and kinds[0] == P.CONNACK and kinds[1] == P.SUBACK
    assert sorted(kinds[2:]) == sorted([P.PUBLISH, P.PUBACK])


def test_non_mqtt_first_bytes_closed_at_once_MQTT_3_1_0_1():
    """[MQTT-3.1.0-1]: a connection whose first packet is not CONNECT is closed at once
    (an HTTP request here), without waiting for the connect timeout or the rest of the bytes."""
    b, _ = make()
    c = Client(b)
    assert exchange(c.conn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""
    assert c.conn.close_requested and c.conn not in b.connections


def test_connect_timeout_closes_silent_connection():
    """A connection that never sends CONNECT is closed after mqtt.connect_timeout, and not before."""
    b, clock = make(connect_timeout=1.0)
    c = Client(b)
    b.tick(clock.t + 0.9)
    assert not c.conn.close_requested
    b.tick(clock.t + 1.1)
    assert c.conn.close_requested and exchange(c.conn) == b""


# ---------------------------------------------------------------- Maximum Packet Size

def _header(remaining: int) -> bytes:
    """The fixed header of a QoS 0 PUBLISH announcing `remaining` bytes (1.5.5 Variable Byte Integer)."""
    out = bytearray(b"\x30")
    while True:
        remaining, d = divmod(remaining, 128)
        out.append(d | (0x80 if remaining else 0))
        if not remaining:
            return bytes(out)


def test_oversize_announced_is_refused_before_body_MQTT_3_2_2_15():
    """4.13 / [MQTT-3.2.2-15]: a packet whose Remaining Length exceeds the Maximum Packet Size is
    refused (0x95) as soon as its header arrives, without waiting for the body."""
    b, _ = make(maximum_packet_size=1024)
    c = connected(b, "c")
    assert_ended(c, exchange(c.conn, _header(1_000_000) + h("00 03 6d 2f 78")), V5,
                 rc.PACKET_TOO_LARGE)
    assert_served(b)


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(16, 20000), delta=st.integers(-3, 3))
def test_packet_size_limit_boundary_MQTT_3_2_2_15(limit, delta):
    """[MQTT-3.2.2-15], 4.13: the Maximum Packet Size counts the whole packet (fixed header
    included): a header announcing more is refused with 0x95 at once; up to the limit the
    broker waits for the body and then accepts the packet."""
    b, _ = make(maximum_packet_size=limit)
    c = connected(b, "c")
    total = limit + delta
    remaining = total - 2
    while len(_header(remaining)) + remaining > total:  # a longer Variable Byte Integer
        remaining -= 1
    head = _header(remaining)
    total = len(head) + remaining
    out = exchange(c.conn, head)
    if total > limit:
        assert_ended(c, out, V5, rc.PACKET_TOO_LARGE)
        return
    assert out == b"" and not c.conn.close_requested  # waiting for the body
    body = h("00 01 74 00") + b"x" * (remaining - 4)
    assert exchange(c.conn, body) == b"" and not c.conn.close_requested
    assert exchange(c.conn, h("c0 00")) == h("d0 00")
