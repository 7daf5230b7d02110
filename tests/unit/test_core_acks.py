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


def assert_protocol_error(c, level):
    out = c.received()
    if level == P.MQTT_5:
        assert [(p.type, p.reason_code) for p in out] == [(P.DISCONNECT, rc.PROTOCOL_ERROR)]
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
