"""Acknowledgements of the broker's outbound QoS 1/2 deliveries must fit the delivery's flow
(4.3.2, 4.3.3): PUBACK for QoS 1, PUBREC then PUBCOMP for QoS 2. Anything else is a Protocol
Error (v5: DISCONNECT 0x82; 3.1.1: the connection is closed), as in Mosquitto; an ack for an
unknown packet id is ignored."""
import pytest

from broker.protocol import packets as P
from broker.protocol import reason_codes as rc
from tests.sansio import Client, make


def delivery(level, qos):
    """(broker, subscriber, the PUBLISH it got) for one message at `qos`."""
    b, _ = make()
    sub, pub = Client(b, level), Client(b, level)
    sub.connect("sub")
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(qos))]))
    assert sub.received()[0].type == P.SUBACK
    pub.connect("pub")
    pub.send(P.Publish("t", b"m", qos=qos, packet_id=9))
    pub.received()
    (d,) = sub.received()
    assert d.type == P.PUBLISH and d.qos == qos
    return b, sub, d


def assert_protocol_error(c, level, code=rc.PROTOCOL_ERROR):
    out = c.received()
    if level == P.MQTT_5:
        assert [(p.type, p.reason_code) for p in out] == [(P.DISCONNECT, code)]
    else:
        assert out == []
    assert c.conn.close_requested


LEVELS = [P.MQTT_5, P.MQTT_311]


@pytest.mark.parametrize("level", LEVELS)
def test_puback_for_a_qos2_delivery_is_a_protocol_error(level):
    """[MQTT-4.3.3-3]: a QoS 2 PUBLISH waits for PUBREC; a PUBACK does not end it."""
    _, sub, d = delivery(level, 2)
    sub.send(P.Ack(P.PUBACK, d.packet_id))
    assert_protocol_error(sub, level)
    assert d.packet_id in sub.conn.session.inflight_out  # still unacknowledged


@pytest.mark.parametrize("level", LEVELS)
def test_pubcomp_before_pubrec_is_a_protocol_error(level):
    """[MQTT-4.3.3-5]: PUBCOMP answers our PUBREL, which is sent only after PUBREC."""
    _, sub, d = delivery(level, 2)
    sub.send(P.Ack(P.PUBCOMP, d.packet_id))
    assert_protocol_error(sub, level)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ack", [P.PUBREC, P.PUBCOMP])
def test_qos2_acks_for_a_qos1_delivery_are_protocol_errors(level, ack):
    """[MQTT-4.3.2-3]: a QoS 1 PUBLISH waits for PUBACK."""
    _, sub, d = delivery(level, 1)
    sub.send(P.Ack(ack, d.packet_id))
    assert_protocol_error(sub, level)


@pytest.mark.parametrize("level", LEVELS)
def test_right_acks_complete_both_flows(level):
    """PUBACK ends QoS 1; PUBREC -> PUBREL, PUBCOMP ends QoS 2; the slots are freed."""
    b, sub, d = delivery(level, 1)
    sub.send(P.Ack(P.PUBACK, d.packet_id))
    assert sub.received() == [] and not sub.conn.close_requested
    assert sub.conn.session.inflight_out == {}
    b, sub, d = delivery(level, 2)
    sub.send(P.Ack(P.PUBREC, d.packet_id))
    (rel,) = sub.received()
    assert (rel.type, rel.packet_id) == (P.PUBREL, d.packet_id)
    sub.send(P.Ack(P.PUBCOMP, d.packet_id))
    assert sub.received() == [] and not sub.conn.close_requested
    assert sub.conn.session.inflight_out == {}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ack", [P.PUBACK, P.PUBCOMP])
def test_acks_for_unknown_packet_ids_are_ignored(level, ack):
    """An ack for an id with nothing in flight (e.g. one already acknowledged) changes nothing
    and keeps the connection."""
    _, sub, d = delivery(level, 1)
    sub.send(P.Ack(ack, d.packet_id + 1))
    assert sub.received() == [] and not sub.conn.close_requested
    assert d.packet_id in sub.conn.session.inflight_out


def deliveries(level, qoses):
    """(subscriber, the PUBLISHes it got) for one message per QoS in `qoses`, in order."""
    b, _ = make()
    sub, pub = Client(b, level), Client(b, level)
    sub.connect("sub")
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(2))]))
    assert sub.received()[0].type == P.SUBACK
    pub.connect("pub")
    for i, qos in enumerate(qoses):
        pub.send(P.Publish("t", b"m%d" % i, qos=qos, packet_id=i + 1))
    pub.received()
    got = sub.received()
    assert [d.qos for d in got] == list(qoses)
    return sub, got


def pubacks(*pids: int) -> bytes:
    return b"".join(b"\x40\x02" + pid.to_bytes(2, "big") for pid in pids)


@pytest.mark.parametrize("level", LEVELS)
def test_pubacks_in_one_read_each_end_their_flow_MQTT_4_3_2_3(level):
    """[MQTT-4.3.2-3]: several PUBACKs in one read end each QoS 1 flow they name, in order; one
    for an unknown packet id is ignored; one for a QoS 2 delivery [MQTT-4.3.3-3] is a Protocol
    Error after the PUBACKs before it took effect, and the ones after it are not applied."""
    sub, got = deliveries(level, (1, 1, 1, 1))
    ids = [d.packet_id for d in got]
    sub.send_bytes(pubacks(ids[2], 999, ids[0]))
    assert sub.received() == [] and not sub.conn.close_requested
    assert list(sub.conn.session.inflight_out) == [ids[1], ids[3]]
    sub, got = deliveries(level, (1, 2, 1))
    ids = [d.packet_id for d in got]
    sub.send_bytes(pubacks(ids[0], ids[1], ids[2]))
    assert_protocol_error(sub, level)
    assert list(sub.conn.session.inflight_out) == [ids[1], ids[2]]


@pytest.mark.parametrize("level", LEVELS)
def test_puback_with_packet_id_0_among_others_is_malformed_MQTT_2_2_1_3(level):
    """[MQTT-2.2.1-3]: a PUBACK with packet identifier 0 in a read of PUBACKs is a malformed
    packet (v5: DISCONNECT 0x81), the PUBACKs before it applied."""
    sub, got = deliveries(level, (1, 1))
    ids = [d.packet_id for d in got]
    sub.send_bytes(pubacks(ids[0], 0, ids[1]))
    assert_protocol_error(sub, level, rc.MALFORMED_PACKET)
    assert list(sub.conn.session.inflight_out) == [ids[1]]


@pytest.mark.parametrize("level", LEVELS)
def test_pubacks_split_across_reads_end_their_flows_MQTT_4_3_2_3(level):
    """[MQTT-4.3.2-3]: PUBACKs whose bytes arrive split across reads, or behind another packet,
    end their flows as whole ones do."""
    sub, got = deliveries(level, (1, 1, 1))
    ids = [d.packet_id for d in got]
    data = pubacks(*ids)
    sub.send_bytes(data[:5])
    assert list(sub.conn.session.inflight_out) == ids[1:]
    sub.send_bytes(data[5:])
    assert sub.conn.session.inflight_out == {}
    sub, got = deliveries(level, (1, 1))
    sub.send_bytes(b"\xc0\x00" + pubacks(*(d.packet_id for d in got)))  # PINGREQ first
    assert [p.type for p in sub.received()] == [P.PINGRESP]
    assert sub.conn.session.inflight_out == {}
