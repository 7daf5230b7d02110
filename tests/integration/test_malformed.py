"""Malformed packets and protocol errors (MQTT 5.0 sections 1.5, 2.1-2.2, 4.13): the broker ends
only the offending connection (DISCONNECT 0x81 / 0x82 / ... for v5, a plain close for 3.1.1), never
delivers the bad message, and keeps serving everyone else."""
from __future__ import annotations

import socket
import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode, encode_publish
from broker.protocol.properties import encode_utf8, encode_vbi

from .helpers import (P, RawClient, assert_served, bye, cid, connect, expect_disconnect,
                      raw_connect_bytes, read_until_closed, recv_publish, uniq)

pytestmark = pytest.mark.timeout(30)

MAL, PROTO = rc.MALFORMED_PACKET, rc.PROTOCOL_ERROR


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_vbi(len(body)) + body


def pub(topic: bytes, payload: bytes = b"x", qos: int = 1, pid: int | None = 1,
        props: bytes = b"\x00") -> bytes:
    return encode_publish(topic, payload, qos, False, False, pid if qos else None, props, P.MQTT_5)


def props_block(body: bytes) -> bytes:
    return encode_vbi(len(body)) + body


SUB_OPTS = lambda o: frame(0x82, b"\x00\x01\x00" + encode_utf8("m/x") + bytes((o,)))  # noqa: E731

CASES = [
    # fixed header
    ("packet-type-0", b"\x00\x00", MAL),
    ("remaining-length-5-bytes", b"\xc0\xff\xff\xff\xff\x01", MAL),
    ("subscribe-flags-0", frame(0x80, b"\x00\x01\x00" + encode_utf8("m/x") + b"\x01"), MAL),
    ("pubrel-flags-0", frame(0x60, b"\x00\x01"), MAL),
    ("pingreq-flags", b"\xc1\x00", MAL),
    ("pingreq-with-payload", b"\xc0\x01\x00", MAL),
    ("unsubscribe-flags-0", frame(0xA0, b"\x00\x01\x00" + encode_utf8("m/x")), MAL),
    # PUBLISH
    ("publish-qos3", b"\x36" + pub(b"m/x")[1:], MAL),
    ("publish-qos0-dup", b"\x38" + pub(b"m/x", qos=0)[1:], MAL),
    ("publish-topic-past-end", frame(0x30, b"\x00\x10m/x"), MAL),
    ("publish-no-packet-id", frame(0x32, b"\x00\x03m/x"), MAL),
    ("publish-packet-id-0", pub(b"m/x", pid=0), MAL),
    ("publish-unknown-property", pub(b"m/x", props=props_block(b"\x7f\x01")), MAL),
    ("publish-property-not-allowed", pub(b"m/x", props=props_block(b"\x11\x00\x00\x00\x01")), MAL),
    ("publish-property-length-past-end", pub(b"m/x", payload=b"", props=b"\x09\x01\x01"), MAL),
    ("publish-property-runs-past-block", pub(b"m/x", props=b"\x02\x02\x00"), MAL),
    ("publish-user-property-bad-utf8", pub(b"m/x", props=props_block(b"\x26\x00\x01\xff\x00\x00")), MAL),
    ("publish-subscription-identifier", pub(b"m/x", props=props_block(b"\x0b\x05")), PROTO),
    ("publish-message-expiry-twice",
     pub(b"m/x", props=props_block(b"\x02\x00\x00\x00\x05\x02\x00\x00\x00\x06")), PROTO),
    ("publish-pfi-twice", pub(b"m/x", props=props_block(b"\x01\x00\x01\x00")), PROTO),
    # SUBSCRIBE / UNSUBSCRIBE
    ("subscribe-no-filters", frame(0x82, b"\x00\x01\x00"), PROTO),
    ("subscribe-reserved-option-bits", SUB_OPTS(0xC1), MAL),
    ("subscribe-qos3", SUB_OPTS(0x03), PROTO),  # 3.8.3.1: a Protocol Error (v5)
    ("subscribe-retain-handling-3", SUB_OPTS(0x31), PROTO),
    ("subscribe-filter-without-options", frame(0x82, b"\x00\x01\x00" + encode_utf8("m/x")), MAL),
    ("subscribe-filter-bad-utf8", frame(0x82, b"\x00\x01\x00\x00\x02\xc3\x28\x01"), MAL),
    ("subscribe-packet-id-0", frame(0x82, b"\x00\x00\x00" + encode_utf8("m/x") + b"\x01"), MAL),
    ("subscribe-subscription-id-0", frame(0x82, b"\x00\x01\x02\x0b\x00" + encode_utf8("m/x") + b"\x01"), PROTO),
    ("unsubscribe-no-filters", frame(0xA2, b"\x00\x01\x00"), PROTO),
    # acks
    ("puback-packet-id-0", b"\x40\x02\x00\x00", MAL),
    ("puback-truncated", b"\x40\x01\x00", MAL),
    # packets only servers send
    ("connack-from-client", b"\x20\x03\x00\x00\x00", PROTO),
    ("suback-from-client", frame(0x90, b"\x00\x01\x00\x00"), PROTO),
    ("pingresp-from-client", b"\xd0\x00", PROTO),
    # DISCONNECT
    ("disconnect-bad-property", frame(0xE0, b"\x00" + props_block(b"\x01\x01")), MAL),
]


@pytest.mark.parametrize("data,code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_v5(broker, data, code):
    """4.13: a v5 connection sending a malformed packet / protocol error gets DISCONNECT with the
    reason code and is closed; nothing is delivered; other clients are still served."""
    sub = connect(broker.port)
    sub.subscribe("m/#", qos=1)
    c = connect(broker.port)
    c.send(data)
    expect_disconnect(c, code)
    assert sub.nothing(0.3), "something was delivered from the bad connection"
    bye(sub)
    assert_served(broker.port)


V4_CASES = [
    ("publish-qos3", b"\x36" + encode(P.Publish("m/x", b"x", 1, packet_id=1), P.MQTT_311)[1:]),
    ("subscribe-flags-0", frame(0x80, b"\x00\x01" + encode_utf8("m/x") + b"\x01")),
    ("subscribe-reserved-bits", frame(0x82, b"\x00\x01" + encode_utf8("m/x") + b"\x05")),
    ("auth-packet", b"\xf0\x00"),
    ("publish-bad-utf8-topic", frame(0x30, b"\x00\x02\xc3\x28x")),
    ("second-connect", encode(P.Connect("again", P.MQTT_311), P.MQTT_311)),
]


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
@pytest.mark.parametrize("data", [c[1] for c in V4_CASES], ids=[c[0] for c in V4_CASES])
def test_malformed_v311_closed(broker, level, data):
    """3.1.1 4.8: a malformed packet or protocol violation closes the connection (no DISCONNECT)."""
    c = RawClient(broker.port, level=level)
    c.connect(cid())
    c.send(data)
    assert read_until_closed(c) == []
    assert_served(broker.port)


@pytest.mark.parametrize("data", [
    frame(0x10, encode_utf8("MQTT") + b"\x05\x02\x00\x3c" + props_block(b"\x7f\x00") + encode_utf8("x")),
    frame(0x10, encode_utf8("MQTT") + b"\x05\x02\x00\x3c\x00" + b"\x00\x02\xc3\x28"),
    frame(0x10, encode_utf8("MQTT") + b"\x05\x02\x00\x3c\x00" + encode_utf8("x") + b"junk"),
    frame(0x10, encode_utf8("MQTT") + b"\x05\x0a\x00\x3c\x00" + encode_utf8("x")),  # will QoS w/o flag
    frame(0x10, encode_utf8("MQTT") + b"\x05\x02\x00\x3c" + props_block(b"\x21\x00\x00") + encode_utf8("x")),
    frame(0x10, encode_utf8("MQTT") + b"\x04\x42\x00\x3c" + encode_utf8("x") + b"\x00\x01p"),  # pw w/o user
    b"\x10\xff\xff\xff\xff\x7f",
], ids=["unknown-property", "client-id-bad-utf8", "trailing-bytes", "will-qos-without-flag",
        "receive-maximum-0", "v311-password-without-user", "bad-remaining-length"])
def test_malformed_connect_refused(broker, data):
    """[MQTT-3.1.4-1], 4.13: a malformed CONNECT is never accepted; the connection is closed (a v5
    client may first get a CONNACK with a reason code >= 0x80)."""
    got = raw_connect_bytes(broker.port, data)
    if got:
        # a v5 CONNACK with a failure code, or a 3.1.1 CONNACK with a non-zero return code
        assert got[0] == 0x20 and (got[3] >= 0x80 or (got[1] == 2 and got[3] != 0)), got
    assert_served(broker.port)


def test_oversize_announced_is_refused_before_body(make_broker):
    """4.13 / [MQTT-3.2.2-15]: a packet whose Remaining Length exceeds the Maximum Packet Size is
    refused (0x95) as soon as its header arrives, without waiting for the body."""
    b = make_broker({"mqtt.maximum_packet_size": 1024})
    c = connect(b.port)
    c.send(b"\x30" + encode_vbi(1_000_000) + b"\x00\x03m/x")
    expect_disconnect(c, rc.PACKET_TOO_LARGE, timeout=3)
    assert_served(b.port)


def test_packets_split_and_coalesced(broker):
    """2.1: a valid byte stream is handled whatever the TCP segmentation: byte by byte, and several
    packets in one write."""
    topic = uniq("split")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = encode(P.Connect(cid())) + encode(P.Publish(topic, b"A" * 300, 1, packet_id=1))
    for i in range(len(data)):
        s.sendall(data[i:i + 1])
        if i % 50 == 0:
            time.sleep(0.005)
    s.sendall(encode(P.Publish(topic, b"B", 0)) + encode(P.Publish(topic, b"C", 1, packet_id=2)) +
              encode(P.PingReq()))
    assert [recv_publish(sub).payload for _ in range(3)] == [b"A" * 300, b"B", b"C"]
    s.sendall(encode(P.Disconnect()))
    s.close()
    bye(sub)


def test_malformed_after_valid_in_same_segment(broker):
    """4.13: packets before the malformed one in the same read are processed; the rest is not."""
    topic = uniq("seg")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    c = connect(broker.port)
    c.send(encode(P.Publish(topic, b"good", 1, packet_id=1)) + b"\x36" +
           encode(P.Publish(topic, b"bad", 1, packet_id=2))[1:] +
           encode(P.Publish(topic, b"after", 0)))
    seen = expect_disconnect(c, MAL)
    assert [p.type for p in seen] == [P.PUBACK, P.DISCONNECT]
    assert recv_publish(sub).payload == b"good"
    assert sub.nothing(0.4)
    bye(sub)
    assert_served(broker.port)


def test_publish_before_connack_processing_order(broker):
    """3.1.4: CONNECT followed at once by SUBSCRIBE and PUBLISH in one write is processed in
    order (CONNACK first)."""
    topic = uniq("pipeline")
    c = RawClient(broker.port)
    c.send(encode(P.Connect(cid())) + encode(P.Subscribe(1, [(topic, P.SubscriptionOptions(1))])) +
           encode(P.Publish(topic, b"self", 1, packet_id=2)))
    kinds = [c.recv().type for _ in range(4)]
    assert kinds[0] == P.CONNACK and kinds[1] == P.SUBACK
    assert sorted(kinds[2:]) == sorted([P.PUBLISH, P.PUBACK])
    bye(c)


def test_many_bad_connections_do_not_hurt(broker):
    """4.13: a burst of garbage connections leaves the broker serving normal clients."""
    for i in range(20):
        try:
            raw_connect_bytes(broker.port, bytes([0x10 + i, 0xff, 0xff, 0xff, 0xff, 0x7f]), timeout=3)
        except AssertionError:
            pass  # a connection left open is fine here; only the broker's health matters
    assert_served(broker.port)
    assert broker.alive()


def test_connect_timeout_closes_silent_socket(make_broker):
    """A socket that never sends CONNECT is closed after connect_timeout."""
    b = make_broker({"mqtt.connect_timeout": 1.0})
    s = socket.create_connection(("127.0.0.1", b.port), timeout=5)
    t0 = time.monotonic()
    assert s.recv(10) == b""
    assert time.monotonic() - t0 < 4
    s.close()
    assert_served(b.port)


def test_non_mqtt_first_bytes_closed_at_once_MQTT_3_1_0_1(broker):
    """[MQTT-3.1.0-1]: a connection whose first packet is not CONNECT is closed at once
    (an HTTP request here), without waiting for the connect timeout."""
    import socket
    import time as _time
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    t0 = _time.monotonic()
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(100) == b""
    assert _time.monotonic() - t0 < 2
    s.close()
