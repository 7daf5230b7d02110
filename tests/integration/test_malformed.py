"""Malformed packets and protocol errors (MQTT 5.0 sections 1.5, 2.1-2.2, 4.13) through real
sockets: the wire path sends the DISCONNECT the core decides and closes (a representative set),
split and coalesced reads, an oversized packet refused from its header, bursts of garbage
connections, the real-time connect timeout. Each rule is tested sans-I/O:
tests/unit/test_core_malformed.py and the MALFORMED fixtures of tests/vectors.py (run by
tests/unit/test_core_flows.py and tests/unit/test_codec.py)."""
from __future__ import annotations

import socket
import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from broker.protocol.properties import encode_utf8, encode_vbi

from .helpers import (
    P,
    RawClient,
    assert_served,
    bye,
    cid,
    connect,
    expect_disconnect,
    raw_connect_bytes,
    read_until_closed,
    recv_publish,
    uniq,
)

pytestmark = pytest.mark.timeout(30)

MAL, PROTO = rc.MALFORMED_PACKET, rc.PROTOCOL_ERROR


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_vbi(len(body)) + body


def props_block(body: bytes) -> bytes:
    return encode_vbi(len(body)) + body


# A representative set: a decoder error and a protocol error the decoder finds, one the
# Connection finds (a server-only packet), for v5; a malformed packet for 3.1.1 and for 3.1.
# Every case's rule is checked sans-I/O (tests/unit/test_core_malformed.py, the MALFORMED
# fixtures of tests/vectors.py through tests/unit/test_core_flows.py).
WIRE_CASES = [
    ("v5-publish-qos3", P.MQTT_5, b"\x36" + encode(P.Publish("m/x", b"x", 1, packet_id=1))[1:], MAL),
    ("v5-subscribe-no-filters", P.MQTT_5, frame(0x82, b"\x00\x01\x00"), PROTO),
    ("v5-connack-from-client", P.MQTT_5, b"\x20\x03\x00\x00\x00", PROTO),
    ("v311-publish-qos3", P.MQTT_311,
     b"\x36" + encode(P.Publish("m/x", b"x", 1, packet_id=1), P.MQTT_311)[1:], None),
    ("v31-auth-packet", P.MQTT_31, b"\xf0\x00", None),
]


@pytest.mark.parametrize("level,data,code", [c[1:] for c in WIRE_CASES], ids=[c[0] for c in WIRE_CASES])
def test_malformed_on_the_wire(broker, level, data, code):
    """4.13 through a socket: a v5 connection sending a malformed packet / protocol error gets
    DISCONNECT with the reason code and is closed; a 3.1.x one is closed with nothing sent
    (3.1.1 4.8); nothing is delivered; other clients are still served."""
    sub = connect(broker.port)
    sub.subscribe("m/#", qos=1)
    c = RawClient(broker.port, level=level)
    assert c.connect(cid()).reason_code == 0
    c.send(data)
    if code is None:
        assert read_until_closed(c) == []
    else:
        expect_disconnect(c, code)
    assert sub.nothing(0.3), "something was delivered from the bad connection"
    bye(sub)
    assert_served(broker.port)


@pytest.mark.parametrize("data,want", [
    (frame(0x10, encode_utf8("MQTT") + b"\x05\x02\x00\x3c" + props_block(b"\x7f\x00") + encode_utf8("x")),
     b"\x20"),
    (b"\x10\xff\xff\xff\xff\x7f", b""),
], ids=["v5-unknown-property", "bad-remaining-length"])
def test_malformed_connect_refused(broker, data, want):
    """[MQTT-3.1.4-1], 4.13: a malformed CONNECT is never accepted; the connection is closed (a v5
    client first gets a CONNACK with a reason code >= 0x80: 0x81 here)."""
    got = raw_connect_bytes(broker.port, data)
    assert got[:1] == want, got
    if want:
        assert got[2:4] == bytes((0, MAL)), got
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
    """A socket that never sends CONNECT is closed after connect_timeout. The kernel hands it to
    the broker after about DEFER_ACCEPT_SECONDS (TCP_DEFER_ACCEPT: it waits for a first byte),
    then connect_timeout runs, checked on the broker's one-second tick."""
    from broker.transport.sockets import DEFER_ACCEPT_SECONDS
    b = make_broker({"mqtt.connect_timeout": 1.0})
    s = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    t0 = time.monotonic()
    assert s.recv(10) == b""
    assert time.monotonic() - t0 < DEFER_ACCEPT_SECONDS + 1.0 + 3
    s.close()
    assert_served(b.port)
