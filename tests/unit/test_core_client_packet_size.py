"""The client's Maximum Packet Size bounds every packet the broker sends [MQTT-3.1.2-24]
(sans-I/O): a CONNACK that does not fit is not sent (Mosquitto's 12-max-packet-connect test);
Reason Strings and User Properties are left out of CONNACK, SUBACK, UNSUBACK, DISCONNECT and
acks when they would not fit; a packet that does not fit without them closes the connection;
PUBLISH too large is dropped as before [MQTT-3.1.2-25]."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.hooks import AllowAll
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from tests.sansio import Client, assert_served, drain, exchange, feed, make, publish, until_closed

V4, V5 = P.MQTT_311, P.MQTT_5
OPT = P.SubscriptionOptions
# a broker whose CONNACK carries no limits: 5 bytes, so small client maximums can connect
BARE = dict(maximum_packet_size=268435455, receive_maximum=65535, topic_alias_maximum=0)


def limited(size: int) -> dict:
    return {PR.MAXIMUM_PACKET_SIZE: size}


def test_connack_larger_than_the_clients_maximum_is_not_sent_MQTT_3_1_2_24():
    """A CONNECT with Maximum Packet Size 2 (smaller than any CONNACK): nothing is sent, the
    connection is closed, no session is made (before: an 11-byte CONNACK)."""
    b, _ = make()
    c = Client(b)
    assert exchange(c.conn, encode(P.Connect("tiny", V5, properties=limited(2)))) == b""
    assert c.conn.close_requested and "tiny" not in b.sessions
    assert_served(b)


def test_connack_that_fits_exactly_is_sent():
    """The default CONNACK carries the broker's limits: 16 bytes. A client allowing 16 gets it; 15
    gets nothing (a successful CONNACK has no Reason String or User Property to leave out)."""
    b, _ = make()
    size = len(exchange(Client(b).conn, encode(P.Connect("probe", V5))))
    assert size == 16
    ok = Client(b)
    assert len(exchange(ok.conn, encode(P.Connect("fits", V5, properties=limited(size))))) == size
    assert not ok.conn.close_requested and "fits" in b.sessions
    short = Client(b)
    assert exchange(short.conn, encode(P.Connect("short", V5, properties=limited(size - 1)))) == b""
    assert short.conn.close_requested and "short" not in b.sessions


def test_takeover_is_not_done_for_a_connack_that_cannot_be_sent():
    """A CONNECT refused for its Maximum Packet Size changes nothing: the client connected with
    that id stays connected (the size is checked before the takeover)."""
    b, _ = make()
    first = Client(b)
    first.connect("same")
    second = Client(b)
    assert exchange(second.conn, encode(P.Connect("same", V5, properties=limited(3)))) == b""
    assert not first.conn.close_requested and b.sessions["same"].connection is first.conn


def test_refusal_connack_leaves_out_its_reason_string_MQTT_3_2_2_19():
    """[MQTT-3.2.2-19]: a CONNACK refusing the connection drops its Reason String when it would
    exceed the client's maximum: the code alone (5 bytes) still goes out."""
    b, _ = make(max_client_id_length=5)
    c = Client(b)
    out = exchange(c.conn, encode(P.Connect("much-too-long", V5, properties=limited(8))))
    assert out == bytes((0x20, 3, 0, rc.CLIENT_IDENTIFIER_NOT_VALID, 0)) and c.conn.close_requested
    roomy = Client(b)
    (ack,) = Decoder(V5).feed(exchange(roomy.conn, encode(P.Connect("much-too-long", V5)))
                              )[0]
    assert ack.properties[PR.REASON_STRING] == "client id too long"


def test_suback_that_does_not_fit_closes_before_subscribing():
    """A SUBSCRIBE whose SUBACK (one code per filter, [MQTT-3.8.4-6]) would exceed the client's
    maximum is not processed: the connection closes, nothing subscribed."""
    b, _ = make(**BARE)
    c = Client(b)
    c.connect("subs", props=limited(20))
    c.send(P.Subscribe(1, [(f"t/{i}", OPT(0)) for i in range(16)]))  # SUBACK: 5 + 16 bytes
    assert until_closed(c) == []
    assert b.router.count == 0
    ok = Client(b)
    ok.connect("subs2", props=limited(20))
    ok.send(P.Subscribe(1, [(f"t/{i}", OPT(0)) for i in range(15)]))  # 20 bytes: fits
    (s,) = ok.received()
    assert s.reason_codes == [0] * 15 and len(encode(s, V5)) == 20


def test_unsuback_that_does_not_fit_closes():
    b, _ = make(**BARE)
    c = Client(b)
    c.connect("unsubs", props=limited(10))
    c.send(P.Unsubscribe(1, [f"t/{i}" for i in range(6)]))  # UNSUBACK: 5 + 6 bytes
    assert until_closed(c) == []


def test_disconnect_leaves_out_its_reason_string_MQTT_3_14_2_3():
    """[MQTT-3.14.2-3]: a server DISCONNECT without the Reason String that would not fit."""
    b, _ = make(**BARE)
    c = Client(b)
    c.connect("d", props=limited(6))
    c.send(P.Publish("a/+", b"x"))  # wildcard in a topic name: Protocol Error 0x90
    out = drain(c.conn)
    assert out == bytes((0xE0, 1, rc.TOPIC_NAME_INVALID)) and c.conn.close_requested


class DenyAll(AllowAll):
    def allow_publish(self, client_id, username, topic):
        return False


def test_failure_ack_is_sent_without_properties_or_not_at_all():
    """A PUBACK with a failure code is 6 bytes: sent to a client allowing 6, the connection is
    closed for one allowing 5 (the 4-byte success form is no answer to a refused message)."""
    b, _ = make(**BARE)
    b.auth = DenyAll()
    c = Client(b)
    c.connect("p", props=limited(6))
    publish(c, "x", b"1", qos=1, pid=1)
    (a,) = c.received()
    assert (a.type, a.reason_code) == (P.PUBACK, rc.NOT_AUTHORIZED)
    b2, _ = make(**BARE)
    b2.auth = DenyAll()
    tiny = Client(b2)
    assert tiny.connect("q", props=limited(5)).reason_code == 0  # a bare 5-byte CONNACK
    publish(tiny, "x", b"1", qos=1, pid=1)
    assert until_closed(tiny) == []


def test_publish_too_large_is_dropped_not_closed_MQTT_3_1_2_25():
    """[MQTT-3.1.2-25] (unchanged): a PUBLISH larger than the client's maximum is discarded as
    if sent; the connection stays."""
    b, _ = make()
    sub = Client(b)
    sub.connect("s", props=limited(30))
    sub.send(P.Subscribe(1, [("big/#", OPT(0))]))
    sub.received()
    pub = Client(b)
    pub.connect("p")
    publish(pub, "big/1", b"x" * 40)
    publish(pub, "big/2", b"y")
    (m,) = sub.received()
    assert m.payload == b"y" and not sub.conn.close_requested
    assert b.stats["dropped_too_large"] == 1


@given(limit=st.integers(2, 64), filters=st.integers(1, 40), bad=st.sampled_from(
    ["wildcard", "qos", "none"]))
@settings(max_examples=200, deadline=None)
def test_no_packet_exceeds_the_clients_maximum(limit, filters, bad):
    """Whatever the client's Maximum Packet Size and what it does (subscribe, unsubscribe,
    publish, a protocol error), every packet the broker writes to it fits [MQTT-3.1.2-24]; what
    cannot fit closes the connection instead."""
    b, _ = make(maximum_qos=1, **BARE)
    b.auth = DenyAll()
    c = Client(b)
    feed(c.conn, encode(P.Connect("prop", V5, properties=limited(limit))))
    written = [drain(c.conn)]
    steps = [P.Subscribe(1, [(f"f/{i}", OPT(1)) for i in range(filters)]),
             P.Unsubscribe(2, [f"f/{i}" for i in range(filters)]),
             P.Publish("f/1", b"x" * 10, 1, packet_id=3)]
    if bad == "wildcard":
        steps.append(P.Publish("f/+", b"x"))
    elif bad == "qos":
        steps.append(P.Publish("f/q", b"x", 2, packet_id=4))  # above maximum_qos: 0x9B
    steps.append(P.PingReq())
    for pkt in steps:
        if c.conn.close_requested:
            break
        feed(c.conn, encode(pkt, V5))
        written.append(drain(c.conn))
    pkts, err = Decoder(V5).feed(b"".join(written))
    assert err is None
    for pkt in pkts:
        assert len(encode(pkt, V5)) <= limit, (pkt, limit)


@pytest.mark.parametrize("level", [V4])
def test_311_clients_have_no_maximum(level):
    """3.1.1 has no Maximum Packet Size: nothing changes for it."""
    b, _ = make()
    c = Client(b, level)
    assert c.connect("old").reason_code == 0
    c.send(P.Subscribe(1, [(f"t/{i}", OPT(0)) for i in range(200)]))
    (s,) = c.received()
    assert len(s.reason_codes) == 200
