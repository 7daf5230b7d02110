"""Protocol flows through the sans-I/O core, driven by the byte fixtures of tests/vectors.py:
fixture bytes go into a Connection (tests/sansio.py: exchange() is bytes in, bytes out) and the
broker's answer is compared byte for byte. Each test names the rule it checks."""
import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import Decoder, encode
from tests import vectors as V
from tests.sansio import Client, exchange, make

h, v = V.h, V.v
V4, V5 = V.V4, V.V5
# a broker whose CONNACK carries no capability properties (so it is exactly "20 03 00 00 00")
PLAIN = dict(receive_maximum=65535, topic_alias_maximum=0, maximum_packet_size=268435455)


def connected(b, level, cid="c"):
    c = Client(b, level)
    c.connect(cid)
    assert c.received() == []
    return c


def subscriber(b, level, filt, qos, cid="sub"):
    c = connected(b, level, cid)
    c.send(P.Subscribe(1, [(filt, P.SubscriptionOptions(qos))]))
    (ack,) = c.received()
    assert ack.reason_codes == [qos]
    return c


# ---------------------------------------------------------------- CONNECT -> CONNACK

def test_connect_v5_connack_success_MQTT_3_2_2_2():
    """[MQTT-3.1.4-5], [MQTT-3.2.2-2]: CONNACK 0x00, Session Present 0 for Clean Start 1."""
    b, _ = make(**PLAIN)
    assert exchange(Client(b).conn, v("connect_v5_minimal").data) == v("connack_v5_success").data


def test_connect_v5_connack_advertises_limits():
    """3.2.2.3.3, 3.2.2.3.6, 3.2.2.3.8: the default broker advertises Receive Maximum 1024,
    Maximum Packet Size 1 MiB and Topic Alias Maximum 10 (the properties a client must then
    respect, [MQTT-3.3.4-7], [MQTT-3.2.2-15], [MQTT-3.2.2-17])."""
    b, _ = make()
    assert exchange(Client(b).conn, v("connect_v5_minimal").data) == \
        h("20 0e 00 00 0b 21 04 00 27 00 10 00 00 22 00 0a")


def test_connect_v5_empty_client_id_assigned_MQTT_3_2_2_16():
    """[MQTT-3.1.3-6], [MQTT-3.1.3-7], [MQTT-3.2.2-16]: an empty client id gets a new one,
    returned as Assigned Client Identifier."""
    b, clock = make(**PLAIN)
    assigned = f"auto-{int(clock() * 1000):x}-1"  # (Broker.new_client_id: the wall clock in ms)
    assert exchange(Client(b).conn, v("connect_v5_empty_client_id").data) == \
        encode(P.Connack(False, 0, {PR.ASSIGNED_CLIENT_IDENTIFIER: assigned}), P.MQTT_5)
    assert assigned in b.sessions


def test_connect_v311_connack_and_session_present_MQTT_3_2_2_3():
    """3.1.1: CONNACK return code 0; [MQTT-3.2.2-3]: Session Present 1 when a clean session 0
    client comes back to its session (3.1.1 [MQTT-3.2.2-2])."""
    b, _ = make()
    first = Client(b, V4)
    assert exchange(first.conn, v("connect_v311").data) == h("20 02 00 00")
    first.conn.connection_lost()
    again = Client(b, V4)
    keep = h("10 0e 00 04 4d 51 54 54 04 00 00 3c 00 02 63 31")  # clean session 0
    assert exchange(again.conn, keep) == h("20 02 00 00")  # the first had clean session 1
    again.conn.connection_lost()
    assert exchange(Client(b, V4).conn, keep) == v("connack_v311_session_present").data


def test_connect_v311_empty_client_id_MQTT_3_1_3_6():
    """3.1.1 [MQTT-3.1.3-6]: an empty client id with clean session 1 is accepted (no
    Assigned Client Identifier in 3.1.1)."""
    b, _ = make()
    assert exchange(Client(b, V4).conn, h("10 0c 00 04 4d 51 54 54 04 02 00 3c 00 00")) == \
        h("20 02 00 00")


def test_connect_v31_MQIsdp():
    """MQTT 3.1 ("MQIsdp", level 3) is accepted like 3.1.1: CONNACK 0 ([MQTT-3.1.4-5])."""
    b, _ = make()
    assert exchange(Client(b, V4).conn, v("connect_v31_mqisdp").data) == h("20 02 00 00")


# ---------------------------------------------------------------- SUBSCRIBE / UNSUBSCRIBE

def test_subscribe_suback_v5_MQTT_3_8_4_1():
    """[MQTT-3.8.4-1], [MQTT-3.8.4-2], [MQTT-3.8.4-6], [MQTT-3.9.3-1]: one SUBACK with the
    SUBSCRIBE's packet id and one granted QoS per filter, in order."""
    b, _ = make()
    c = connected(b, V5)
    assert exchange(c.conn, v("subscribe_v5_options_and_identifier").data) == \
        h("90 05 00 01 00 01 00")


def test_subscribe_suback_v311_MQTT_3_8_4_1():
    """3.1.1 [MQTT-3.8.4-1]: SUBSCRIBE -> SUBACK with the granted QoS."""
    b, _ = make()
    c = connected(b, V4)
    assert exchange(c.conn, v("subscribe_v311").data) == h("90 03 00 01 01")


def test_subscribe_downgraded_to_maximum_qos_MQTT_3_2_2_10():
    """[MQTT-3.2.2-10]: a broker with Maximum QoS 1 still accepts a SUBSCRIBE for QoS 2 and
    grants 1."""
    b, _ = make(maximum_qos=1)
    c = connected(b, V4)
    assert exchange(c.conn, h("82 08 00 01 00 03 61 2f 62 02")) == h("90 03 00 01 01")


@pytest.mark.parametrize("level", [V5, V4])
def test_unsubscribe_unsuback_MQTT_3_10_4_4(level):
    """[MQTT-3.10.4-4], [MQTT-3.10.4-5], [MQTT-3.11.3-1]: UNSUBACK with the packet id, 0x00 for
    the subscription deleted and 0x11 for none (v5; 3.1.1 has no payload); [MQTT-3.10.4-2]:
    nothing is delivered for the deleted filter afterwards."""
    b, _ = make()
    sub = subscriber(b, level, "a", 0)
    unsub = v("unsubscribe_v5" if level == V5 else "unsubscribe_v311")
    assert exchange(sub.conn, unsub.data) == v("unsuback_v5" if level == V5 else "unsuback_v311").data
    pub = connected(b, V5, "pub")
    assert exchange(pub.conn, h("30 05 00 01 61 00 78")) == b""
    assert exchange(sub.conn) == b""


# ---------------------------------------------------------------- PUBLISH flows

def _same_but_property_order(got: bytes, vec) -> None:
    """`got` is `vec` re-encoded: same packet, same length (properties may come in another
    order, 2.2.2: only User Properties keep theirs)."""
    (pkt,), err = Decoder(vec.level).feed(got)
    assert err is None and pkt == vec.packet and len(got) == len(vec.data)


def test_publish_qos0_forwarded_MQTT_3_3_2_15():
    """QoS 0 (4.3.1): no answer to the publisher; the subscriber gets the captured packet:
    Message Expiry Interval 300 (nothing waited, [MQTT-3.3.2-6]) and Response Topic unaltered
    [MQTT-3.3.2-15]."""
    b, _ = make()
    sub = subscriber(b, V5, "request", 0)
    pub = connected(b, V5, "pub")
    seed = v("seed_publish_qos0_expiry_response_topic")
    assert exchange(pub.conn, seed.data) == b""
    _same_but_property_order(exchange(sub.conn), seed)


def test_publish_qos0_without_expiry_forwarded_byte_exact():
    """Nothing to adjust: the subscriber gets the publisher's bytes as they came (user
    properties in order, [MQTT-3.3.2-17], [MQTT-3.3.2-18])."""
    b, _ = make()
    sub = subscriber(b, V5, "t", 0)
    pub = connected(b, V5, "pub")
    vec = v("publish_v5_user_properties_in_order")
    assert exchange(pub.conn, vec.data) == b""
    assert exchange(sub.conn) == vec.data


def test_publish_qos0_v5_to_v311_subscriber_drops_properties():
    """[MQTT-4.5.0-1]: a v5 PUBLISH reaches a 3.1.1 subscriber: the same message without
    properties (3.1.1 has none)."""
    b, _ = make()
    sub = subscriber(b, V4, "request", 0)
    pub = connected(b, V5, "pub")
    exchange(pub.conn, v("seed_publish_qos0_expiry_response_topic").data)
    assert exchange(sub.conn) == h("30 20 00 07 72 65 71 75 65 73 74") + b"This is a QoS 0 message"


def test_publish_qos1_puback_no_matching_subscribers_MQTT_4_3_2_4():
    """[MQTT-3.3.4-1], [MQTT-4.3.2-4]: a QoS 1 PUBLISH nobody subscribed to gets exactly the
    captured PUBACK (seeds/003): its packet id and 0x10 No matching subscribers."""
    b, _ = make()
    pub = connected(b, V5, "pub")
    assert exchange(pub.conn, v("seed_publish_qos1").data) == v("seed_puback_no_matching_subscribers").data


def test_publish_qos1_to_subscriber_MQTT_4_3_2_4():
    """[MQTT-4.3.2-4]: PUBACK 0x00 (short form) to the publisher; the subscriber gets QoS 1 with
    a packet id the broker chose [MQTT-2.2.1-4] and DUP 0 [MQTT-3.3.1-3]; its PUBACK ends the
    flow."""
    b, _ = make()
    sub = subscriber(b, V5, "request", 1)
    pub = connected(b, V5, "pub")
    assert exchange(pub.conn, v("seed_publish_qos1").data) == h("40 02 64 4a")
    fwd = exchange(sub.conn)
    assert fwd[:13] == v("seed_publish_qos1").data[:11] + h("00 01")
    (pkt,), _ = Decoder(V5).feed(fwd)
    assert (pkt.packet_id, pkt.qos, pkt.dup) == (1, 1, False) and len(fwd) == 0x35
    assert pkt.properties == v("seed_publish_qos1").packet.properties
    assert exchange(sub.conn, h("40 02 00 01")) == b""
    assert not sub.conn.session.inflight_out


def test_publish_qos2_exactly_the_captured_exchange_MQTT_4_3_3_8():
    """[MQTT-4.3.3-8], [MQTT-4.3.3-11]: the seeds/003 QoS 2 exchange: PUBREC 0x10 (no
    subscribers) exactly as captured, then PUBREL -> PUBCOMP (short form of the captured
    success PUBCOMP)."""
    b, _ = make()
    pub = connected(b, V5, "pub")
    assert exchange(pub.conn, v("seed_publish_qos2").data) == v("seed_pubrec_no_matching_subscribers").data
    assert exchange(pub.conn, v("seed_pubrel").data) == h("70 02 11 c2")
    # [MQTT-4.3.3-12]: after PUBCOMP the packet id names a new message
    assert exchange(pub.conn, v("seed_publish_qos2").data) == v("seed_pubrec_no_matching_subscribers").data


def test_publish_qos2_to_subscriber_MQTT_4_3_3_4():
    """Inbound QoS 2 delivered once [MQTT-4.3.3-10] even when repeated with DUP before PUBREL;
    outbound: PUBLISH QoS 2 -> PUBREC -> PUBREL [MQTT-4.3.3-4] (flags 0010, [MQTT-3.6.1-1]) ->
    PUBCOMP ends it."""
    b, _ = make()
    sub = subscriber(b, V4, "t", 2)
    pub = connected(b, V4, "pub")
    qos2 = h("34 07 00 01 74 00 05 68 69")
    assert exchange(pub.conn, qos2) == h("50 02 00 05")
    assert exchange(pub.conn, h("3c 07 00 01 74 00 05 68 69")) == h("50 02 00 05")  # DUP repeat
    assert exchange(sub.conn) == h("34 07 00 01 74 00 01 68 69")  # once
    assert exchange(sub.conn, h("50 02 00 01")) == h("62 02 00 01")
    assert exchange(sub.conn, h("70 02 00 01")) == b""
    assert exchange(pub.conn, h("62 02 00 05")) == h("70 02 00 05")
    assert exchange(sub.conn) == b""


def test_publish_delivered_at_granted_qos_MQTT_3_8_4_8():
    """[MQTT-3.8.4-8]: QoS 2 published, QoS 0 granted: delivered at QoS 0, no packet id."""
    b, _ = make()
    sub = subscriber(b, V5, "a/b", 0)
    pub = connected(b, V5, "pub")
    exchange(pub.conn, h("34 0a 00 03 61 2f 62 00 07 00 68 69"))
    assert exchange(sub.conn) == h("30 08 00 03 61 2f 62 00 68 69")


# ---------------------------------------------------------------- retained messages

def test_retained_replay_on_subscribe_MQTT_3_3_1_9():
    """[MQTT-3.3.1-5]: RETAIN 1 stores the message; [MQTT-3.3.1-9]: a new subscription gets it
    after the SUBACK with RETAIN 1; [MQTT-3.3.1-6], [MQTT-3.3.1-7]: an empty retained payload
    deletes it (and is not stored)."""
    b, _ = make()
    pub = connected(b, V4, "pub")
    assert exchange(pub.conn, v("publish_v311_qos0_retain").data) == b""
    sub = connected(b, V5, "sub")
    assert exchange(sub.conn, h("82 07 00 01 00 00 01 74 00")) == \
        h("90 04 00 01 00 00") + h("31 06 00 01 74 00 6f 6b")
    assert exchange(pub.conn, h("31 03 00 01 74")) == b""
    assert exchange(sub.conn) == h("30 04 00 01 74 00")  # delivered live, RETAIN 0 [MQTT-3.3.1-12]
    late = connected(b, V5, "late")
    assert exchange(late.conn, h("82 07 00 01 00 00 01 74 00")) == h("90 04 00 01 00 00")
    assert b.retained.count == 0


def test_retain_handling_2_sends_no_retained_MQTT_3_3_1_11():
    """[MQTT-3.3.1-11]: Retain Handling 2: the SUBACK only."""
    b, _ = make()
    exchange(connected(b, V4, "pub").conn, v("publish_v311_qos0_retain").data)
    sub = connected(b, V5, "sub")
    assert exchange(sub.conn, h("82 07 00 01 00 00 01 74 20")) == h("90 04 00 01 00 00")


# ---------------------------------------------------------------- PINGREQ, DISCONNECT, will

@pytest.mark.parametrize("level", [V5, V4])
def test_pingreq_pingresp_MQTT_3_12_4_1(level):
    """[MQTT-3.12.4-1]: PINGREQ -> PINGRESP."""
    b, _ = make()
    c = connected(b, level)
    ping, pong = ("pingreq_v5", "pingresp_v5") if level == V5 else ("pingreq_v311", "pingresp_v311")
    assert exchange(c.conn, v(ping).data) == v(pong).data


def _will_client(b, clock):
    """The fixture CONNECT with a will (w/t, "bye", QoS 1, retain, Will Delay 5 s, Content Type)."""
    dev = Client(b)
    out = exchange(dev.conn, v("connect_v5_will_user_password_properties").data)
    assert out[:2] == h("20 0e") and out[3] == 0  # accepted
    return dev


WILL_QOS1 = h("32 12 00 03 77 2f 74 00 01 07 03 00 04 74 65 78 74 62 79 65")


def test_disconnect_with_will_publishes_after_delay_MQTT_3_1_2_8():
    """DISCONNECT 0x04 (3.14.2.1) keeps the will: [MQTT-3.1.2-8] published once the Will Delay
    Interval has passed (3.1.3.2.2), not before; RETAIN 0 towards the subscriber
    [MQTT-3.3.1-12], stored as retained [MQTT-3.1.2-15]; Content Type unaltered [MQTT-3.3.2-20]."""
    b, clock = make()
    watcher = subscriber(b, V5, "w/#", 1, "watcher")
    dev = _will_client(b, clock)
    assert exchange(dev.conn, v("disconnect_v5_with_will").data) == b""
    assert dev.conn.close_requested
    b.tick(clock.t + 4)
    assert exchange(watcher.conn) == b""
    b.tick(clock.t + 6)
    assert exchange(watcher.conn) == WILL_QOS1
    late = connected(b, V5, "late")
    exchange(late.conn, h("82 09 00 01 00 00 03 77 2f 74 00"))
    assert b.retained.count == 1


def test_normal_disconnect_discards_the_will_MQTT_3_14_4_3():
    """[MQTT-3.14.4-3], [MQTT-3.1.2-10]: DISCONNECT 0x00 deletes the will."""
    b, clock = make()
    watcher = subscriber(b, V5, "w/#", 1, "watcher")
    dev = _will_client(b, clock)
    assert exchange(dev.conn, v("disconnect_v5_normal").data) == b""
    b.tick(clock.t + 10)
    assert exchange(watcher.conn) == b"" and b.retained.count == 0


def test_disconnect_with_an_error_code_keeps_the_will_MQTT_3_1_2_8():
    """[MQTT-3.1.2-8]: only DISCONNECT 0x00 deletes the will ([MQTT-3.14.4-3]); a client that
    disconnects with an error (0x80 Unspecified error) still has its will published."""
    b, clock = make()
    watcher = subscriber(b, V5, "w/#", 1, "watcher")
    dev = _will_client(b, clock)
    assert exchange(dev.conn, h("e0 01 80")) == b""
    assert dev.conn.close_requested
    b.tick(clock.t + 6)
    assert exchange(watcher.conn) == WILL_QOS1


def _v311_will_client(b):
    """A 3.1.1 client with a will (w/t, "bye", QoS 0), connected."""
    dev = Client(b, V4)
    will = h("10 18 00 04 4d 51 54 54 04 06 00 3c 00 02 63 31 00 03 77 2f 74 00 03 62 79 65")
    assert exchange(dev.conn, will) == h("20 02 00 00")
    return dev


def test_v311_disconnect_discards_the_will_MQTT_3_14_4_3():
    """3.1.1 [MQTT-3.14.4-3]: DISCONNECT discards the will."""
    b, clock = make()
    watcher = subscriber(b, V4, "w/#", 0, "watcher")
    dev = _v311_will_client(b)
    assert exchange(dev.conn, h("e0 00")) == b""
    dev.conn.connection_lost()
    b.tick(clock.t + 1)
    assert exchange(watcher.conn) == b""


def test_v311_will_on_close_without_disconnect_MQTT_3_1_2_8():
    """3.1.1 [MQTT-3.1.2-8]: the will of a connection lost without DISCONNECT is published."""
    b, clock = make()
    watcher = subscriber(b, V4, "w/#", 0, "watcher")
    dev = _v311_will_client(b)
    dev.conn.connection_lost()
    b.tick(clock.t + 1)
    assert exchange(watcher.conn) == h("30 08 00 03 77 2f 74 62 79 65")


# ---------------------------------------------------------------- malformed -> DISCONNECT / close

_AFTER_CONNECT = [x for x in V.MALFORMED if x.data[0] >> 4 != P.CONNECT]


@pytest.mark.parametrize("vec", _AFTER_CONNECT, ids=repr)
def test_malformed_packet_disconnects_MQTT_4_13_1_1(vec):
    """[MQTT-4.13.1-1], 4.13.2: a malformed packet or protocol error gets DISCONNECT with the
    fixture's reason code (v5; [MQTT-3.14.0-1]: only after a CONNACK) or just the close
    (3.1.1), and ends only that connection."""
    b, _ = make()
    other = connected(b, vec.level, "other")
    c = connected(b, vec.level)
    out = exchange(c.conn, vec.data)
    assert c.conn.close_requested
    if vec.level == V5:
        (d,), err = Decoder(V5).feed(out)
        assert err is None and d.type == P.DISCONNECT and d.reason_code == vec.reason
        assert out[0] == 0xE0 and out[2] == vec.reason
    else:
        assert out == b""
    assert exchange(other.conn, h("c0 00")) == h("d0 00") and not other.conn.close_requested


@pytest.mark.parametrize("vec", [x for x in V.MALFORMED if x.data[0] >> 4 == P.CONNECT], ids=repr)
def test_malformed_connect_refused_MQTT_3_1_4_1(vec):
    """[MQTT-3.1.4-1]: a malformed CONNECT is not accepted: v5 gets a CONNACK with the reason
    code ([MQTT-3.2.2-6] Session Present 0, [MQTT-3.2.2-7] then close); an unsupported
    protocol level gets the 3.1.1 CONNACK return code 1 [MQTT-3.1.2-2]; 3.1.1 is just closed."""
    b, _ = make()
    c = Client(b, vec.level)
    out = exchange(c.conn, vec.data)
    assert c.conn.close_requested and not b.sessions
    if vec.reason == 0x84:
        assert out == h("20 02 00 01")
    elif vec.level == V5:
        (ack,), err = Decoder(V5).feed(out)
        assert err is None and ack.type == P.CONNACK and out[2:4] == bytes((0, vec.reason))
    else:
        assert out == b""


@pytest.mark.parametrize("level", [V5, V4])
def test_first_packet_not_connect_closes_MQTT_3_1_0_1(level):
    """[MQTT-3.1.0-1]: anything but CONNECT first: closed, nothing sent."""
    b, _ = make()
    c = Client(b, level)
    assert exchange(c.conn, h("c0 00")) == b"" and c.conn.close_requested


def test_second_connect_is_a_protocol_error_MQTT_3_1_0_2():
    """[MQTT-3.1.0-2]: a second CONNECT: DISCONNECT 0x82."""
    b, _ = make()
    c = connected(b, V5)
    out = exchange(c.conn, v("connect_v5_minimal").data)
    assert out[0] == 0xE0 and out[2] == 0x82 and c.conn.close_requested
