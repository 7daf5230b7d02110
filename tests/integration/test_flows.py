"""QoS 1 / QoS 2 flows in both directions, Receive Maximum, Maximum Packet Size, offline queues
and resend on session resume (MQTT 5.0 sections 4.3, 4.4, 4.9, 3.1.2.11, 3.3)."""
from __future__ import annotations

import time

import pytest

from broker.protocol import reason_codes as rc

from .helpers import (P, PR, ack, assert_served, bye, cid, connect, expect_disconnect, props,
                      publish_ok, recv_publish, uniq)

pytestmark = pytest.mark.timeout(30)

PERSIST = {PR.SESSION_EXPIRY_INTERVAL: 300}


def test_qos1_both_directions(broker):
    """4.3.2: PUBLISH QoS 1 -> PUBACK from the broker; the broker's QoS 1 PUBLISH carries a packet
    identifier, and after the client's PUBACK nothing is resent on the connection."""
    topic = uniq("q1")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    pub = connect(broker.port)
    a = publish_ok(pub, topic, b"one", qos=1, pid=77)
    assert (a.type, a.reason_code) == (P.PUBACK, 0)
    m = recv_publish(sub)
    assert (m.qos, m.dup, m.payload) == (1, False, b"one") and m.packet_id
    sub.send(P.Ack(P.PUBACK, m.packet_id))
    assert sub.nothing(0.5)
    # the packet identifier can be reused once acknowledged (2.2.1)
    publish_ok(pub, topic, b"two", qos=1, pid=77, expect_code=0)
    m2 = recv_publish(sub)
    assert m2.payload == b"two"
    ack(sub, m2)
    bye(sub, pub)


def test_qos2_both_directions(broker):
    """4.3.3: PUBLISH -> PUBREC -> PUBREL -> PUBCOMP inbound; PUBLISH -> PUBREC -> PUBREL ->
    PUBCOMP outbound, with the broker's PUBREL for the same packet identifier."""
    topic = uniq("q2")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port)
    pub.publish(topic, b"exactly", qos=2, pid=300)
    rec = pub.recv_type(P.PUBREC)
    assert (rec.packet_id, rec.reason_code) == (300, 0)
    m = recv_publish(sub)
    assert (m.qos, m.payload, m.dup) == (2, b"exactly", False)
    pub.send(P.Ack(P.PUBREL, 300))
    comp = pub.recv_type(P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (300, 0)
    sub.send(P.Ack(P.PUBREC, m.packet_id))
    rel = sub.recv_type(P.PUBREL)
    assert (rel.packet_id, rel.reason_code) == (m.packet_id, 0)
    sub.send(P.Ack(P.PUBCOMP, m.packet_id))
    assert sub.nothing(0.4) and pub.nothing(0.2)
    bye(sub, pub)


def test_qos2_exactly_once_repeat_before_pubrel(broker):
    """[MQTT-4.3.3-10]: a QoS 2 PUBLISH repeated (DUP=1) before PUBREL is acknowledged again but not
    delivered twice; after PUBCOMP the same packet identifier is a new message."""
    topic = uniq("q2once")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port)
    pub.publish(topic, b"m", qos=2, pid=5)
    assert pub.recv_type(P.PUBREC).packet_id == 5
    for _ in range(2):
        pub.publish(topic, b"m", qos=2, pid=5, dup=True)
        rec = pub.recv_type(P.PUBREC)
        assert (rec.packet_id, rec.reason_code) == (5, 0)
    m = recv_publish(sub)
    assert m.payload == b"m"
    ack(sub, m)
    assert sub.nothing(0.6), "QoS 2 message delivered twice"
    pub.send(P.Ack(P.PUBREL, 5))
    assert pub.recv_type(P.PUBCOMP).reason_code == 0
    publish_ok(pub, topic, b"m2", qos=2, pid=5)
    m = recv_publish(sub)
    assert m.payload == b"m2"
    ack(sub, m)
    bye(sub, pub)


def test_pubrel_unknown_packet_id_0x92(broker):
    """4.3.3 / 3.7.2.1: PUBREL for a packet identifier not in use -> PUBCOMP 0x92; a second PUBREL
    after a completed flow too."""
    c = connect(broker.port)
    c.send(P.Ack(P.PUBREL, 4242))
    comp = c.recv_type(P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (4242, rc.PACKET_IDENTIFIER_NOT_FOUND)
    publish_ok(c, uniq("rel"), b"x", qos=2, pid=9)
    c.send(P.Ack(P.PUBREL, 9))
    comp = c.recv_type(P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (9, rc.PACKET_IDENTIFIER_NOT_FOUND)
    bye(c)


def test_pubrec_unknown_packet_id_gets_pubrel_0x92(broker):
    """3.6.2.1: PUBREC for a packet identifier the broker did not send -> PUBREL 0x92."""
    c = connect(broker.port)
    c.send(P.Ack(P.PUBREC, 999))
    rel = c.recv_type(P.PUBREL)
    assert (rel.packet_id, rel.reason_code) == (999, rc.PACKET_IDENTIFIER_NOT_FOUND)
    c.send(P.PingReq())
    c.recv_type(P.PINGRESP)
    bye(c)


def test_pubrec_error_ends_flow_and_frees_slot(broker):
    """4.3.3 / [MQTT-3.3.4-9]: a PUBREC with a reason code >= 0x80 ends the QoS 2 flow (no PUBREL)
    and frees the Receive Maximum slot."""
    topic = uniq("recerr")
    c = connect(broker.port, properties={PR.RECEIVE_MAXIMUM: 1})
    c.subscribe(topic, qos=2)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"a", qos=2, pid=1)
    publish_ok(pub, topic, b"b", qos=2, pid=2)
    m = recv_publish(c)
    assert m.payload == b"a"
    c.send(P.Ack(P.PUBREC, m.packet_id, rc.UNSPECIFIED_ERROR))
    m2 = recv_publish(c)  # no PUBREL for the refused one; the next message comes
    assert m2.payload == b"b"
    ack(c, m2)
    assert c.nothing(0.4)
    bye(c, pub)


@pytest.mark.parametrize("pub_qos,sub_qos", [(2, 1), (2, 0), (1, 0), (0, 2), (1, 2)])
def test_qos_downgrade_to_subscription(broker, pub_qos, sub_qos):
    """[MQTT-3.8.4-8]: delivered at the minimum of the published QoS and the granted QoS."""
    topic = uniq("down")
    sub = connect(broker.port)
    assert sub.subscribe(topic, qos=sub_qos).reason_codes == [sub_qos]
    pub = connect(broker.port)
    publish_ok(pub, topic, b"d", qos=pub_qos)
    m = recv_publish(sub)
    assert m.qos == min(pub_qos, sub_qos)
    assert (m.packet_id is None) == (m.qos == 0)
    ack(sub, m)
    bye(sub, pub)


def test_resend_unacknowledged_on_resume_with_dup(broker):
    """[MQTT-4.4.0-1], [MQTT-3.3.1-1]: on resume the broker resends unacknowledged QoS 1 and QoS 2
    PUBLISHes with DUP=1 and the same packet identifiers, PUBREL for PUBREC'd ones, in the
    original order, then the queued messages."""
    topic, me = uniq("resume"), cid("resume")
    sub = connect(broker.port, me, properties=PERSIST)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"q1", qos=1, pid=1)
    publish_ok(pub, topic, b"q2-norec", qos=2, pid=2)
    publish_ok(pub, topic, b"q2-rec", qos=2, pid=3)
    first = [recv_publish(sub) for _ in range(3)]
    assert [(m.payload, m.dup) for m in first] == [(b"q1", False), (b"q2-norec", False), (b"q2-rec", False)]
    sub.send(P.Ack(P.PUBREC, first[2].packet_id))
    assert sub.recv_type(P.PUBREL).packet_id == first[2].packet_id
    sub.close()  # lose the connection with all three unfinished
    time.sleep(0.3)
    publish_ok(pub, topic, b"queued", qos=1, pid=4)
    sub = connect(broker.port, me, clean_start=False, expect_present=True, properties=PERSIST)
    again = [sub.recv() for _ in range(4)]
    assert [(p.type, getattr(p, "packet_id", None)) for p in again[:3]] == [
        (P.PUBLISH, first[0].packet_id), (P.PUBLISH, first[1].packet_id),
        (P.PUBREL, first[2].packet_id)]
    assert [(m.payload, m.dup, m.qos) for m in again[:2]] == [(b"q1", True, 1), (b"q2-norec", True, 2)]
    assert again[3].type == P.PUBLISH and (again[3].payload, again[3].dup) == (b"queued", False)
    ack(sub, again[0])
    ack(sub, again[1])
    sub.send(P.Ack(P.PUBCOMP, again[2].packet_id))
    ack(sub, again[3])
    assert sub.nothing(0.5)
    bye(sub)
    # everything acknowledged: nothing is resent on the next resume
    sub = connect(broker.port, me, clean_start=False, expect_present=True)
    assert sub.nothing(0.6)
    bye(sub, pub)


def test_offline_queue_delivered_in_order(broker):
    """4.1: a persistent session queues QoS 1/2 messages while offline (not QoS 0 by default) and
    delivers them in order on reconnection."""
    topic, me = uniq("queue"), cid("queue")
    sub = connect(broker.port, me, properties=PERSIST)
    sub.subscribe(topic, qos=2)
    bye(sub)
    pub = connect(broker.port)
    for i in range(5):
        publish_ok(pub, topic, b"m%d" % i, qos=(1, 2, 0, 1, 2)[i], pid=i + 1)
    sub = connect(broker.port, me, clean_start=False, expect_present=True)
    got = []
    while not sub.nothing(0.6):
        m = recv_publish(sub)
        got.append((m.payload, m.qos, m.dup))
        ack(sub, m)
    assert got == [(b"m0", 1, False), (b"m1", 2, False), (b"m3", 1, False), (b"m4", 2, False)]
    bye(sub, pub)


def test_offline_queue_qos0_when_configured(make_broker):
    """queue_qos0_messages=true: QoS 0 messages are queued for offline persistent sessions too."""
    b = make_broker({"mqtt.queue_qos0_messages": True})
    topic, me = uniq("queue0"), cid("queue0")
    sub = connect(b.port, me, properties=PERSIST)
    sub.subscribe(topic, qos=0)
    bye(sub)
    pub = connect(b.port)
    pub.publish(topic, b"zero", qos=0)
    publish_ok(pub, topic, b"one", qos=1)
    sub = connect(b.port, me, clean_start=False, expect_present=True)
    assert [(m.payload, m.qos) for m in (recv_publish(sub), recv_publish(sub))] == [(b"zero", 0), (b"one", 0)]
    bye(sub, pub)


def test_offline_queue_limit_drops_newest(make_broker):
    """max_queued_messages: when the queue is full the newest messages are dropped."""
    b = make_broker({"mqtt.max_queued_messages": 3})
    topic, me = uniq("qlim"), cid("qlim")
    sub = connect(b.port, me, properties=PERSIST)
    sub.subscribe(topic, qos=1)
    bye(sub)
    pub = connect(b.port)
    for i in range(6):
        publish_ok(pub, topic, b"%d" % i, qos=1, pid=i + 1)
    sub = connect(b.port, me, clean_start=False, expect_present=True)
    got = []
    while not sub.nothing(0.6):
        m = recv_publish(sub)
        got.append(m.payload)
        ack(sub, m)
    assert got == [b"0", b"1", b"2"]
    bye(sub, pub)


def test_resume_respects_new_receive_maximum(broker):
    """[MQTT-3.3.4-9]: the Receive Maximum of the new connection limits the queued messages sent
    on resume; the rest follow in order as they are acknowledged."""
    topic, me = uniq("qrm"), cid("qrm")
    sub = connect(broker.port, me, properties=PERSIST)
    sub.subscribe(topic, qos=1)
    bye(sub)
    pub = connect(broker.port)
    for i in range(4):
        publish_ok(pub, topic, b"%d" % i, qos=1, pid=i + 1)
    sub = connect(broker.port, me, clean_start=False, expect_present=True,
                  properties={PR.RECEIVE_MAXIMUM: 1, **PERSIST})
    got = []
    for _ in range(4):
        m = recv_publish(sub)
        assert sub.nothing(0.3), "more than Receive Maximum in flight"
        got.append(m.payload)
        ack(sub, m)
    assert got == [b"0", b"1", b"2", b"3"]
    bye(sub, pub)


def test_inbound_maximum_packet_size_0x95(make_broker):
    """[MQTT-3.2.2-15] / 4.13: the broker advertises Maximum Packet Size; a larger PUBLISH gets
    DISCONNECT 0x95 and is not delivered; a PUBLISH at the limit is accepted."""
    b = make_broker({"mqtt.maximum_packet_size": 200})
    c = connect(b.port)
    assert props(c.connack)[PR.MAXIMUM_PACKET_SIZE] == 200
    topic = "mps/" + "t" * 10
    sub = connect(b.port)
    sub.subscribe(topic, qos=1)
    # total size = 1 + 2 (remaining length) + 2 + len(topic) + 2 (pid) + 1 (props) + payload
    fits = 200 - (1 + 2 + 2 + len(topic) + 2 + 1)
    publish_ok(c, topic, b"f" * fits, qos=1, expect_code=0)
    assert recv_publish(sub).payload == b"f" * fits
    c.publish(topic, b"f" * (fits + 1), qos=1, pid=2)
    expect_disconnect(c, rc.PACKET_TOO_LARGE)
    assert sub.nothing(0.4)
    bye(sub)
    assert_served(b.port)


@pytest.mark.parametrize("qos", [0, 1])
def test_outbound_maximum_packet_size_not_sent(broker, qos):
    """[MQTT-3.1.2-24]: a message larger than the client's Maximum Packet Size is not sent to it
    (other subscribers get it); the following smaller message is delivered."""
    topic = uniq("cmps")
    small = connect(broker.port, properties={PR.MAXIMUM_PACKET_SIZE: 100})
    big = connect(broker.port)
    small.subscribe(topic, qos=1)
    big.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"L" * 150, qos=qos, pid=1)
    publish_ok(pub, topic, b"s", qos=qos, pid=2)
    m = recv_publish(small)
    assert m.payload == b"s"
    ack(small, m)
    assert small.nothing(0.4)
    assert [recv_publish(big).payload for _ in range(2)] == [b"L" * 150, b"s"]
    bye(small, big, pub)


def test_qos2_exactly_once_across_reconnect(broker):
    """[MQTT-4.3.3-10], 4.4: a QoS 2 PUBLISH resent (DUP=1) after reconnecting, before PUBREL, is not
    delivered again; the PUBREL on the new connection completes the flow."""
    topic, me = uniq("q2re"), cid("q2re")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port, me, properties=PERSIST)
    pub.publish(topic, b"once", qos=2, pid=7)
    assert pub.recv_type(P.PUBREC).packet_id == 7
    pub.close()
    time.sleep(0.2)
    pub = connect(broker.port, me, clean_start=False, expect_present=True, properties=PERSIST)
    pub.publish(topic, b"once", qos=2, pid=7, dup=True)
    assert pub.recv_type(P.PUBREC).packet_id == 7
    pub.send(P.Ack(P.PUBREL, 7))
    comp = pub.recv_type(P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (7, 0)
    m = recv_publish(sub)
    assert m.payload == b"once"
    ack(sub, m)
    assert sub.nothing(0.6), "delivered twice"
    bye(sub, pub)


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
def test_resend_on_resume_v311(broker, level):
    """3.1.1 [MQTT-4.4.0-1]: a clean-session-0 client gets unacknowledged messages again with DUP=1."""
    from .helpers import RawClient
    topic, me = uniq("resume4"), cid("r4")
    sub = RawClient(broker.port, level=level)
    sub.connect(me, clean_start=False)
    sub.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"again", qos=1)
    first = recv_publish(sub)
    assert first.dup is False
    sub.close()
    time.sleep(0.2)
    sub = RawClient(broker.port, level=level)
    assert sub.connect(me, clean_start=False).session_present is True
    m = recv_publish(sub)
    assert (m.payload, m.dup, m.packet_id) == (b"again", True, first.packet_id)
    ack(sub, m)
    bye(sub)
    sub = RawClient(broker.port, level=level)
    sub.connect(me, clean_start=True)  # discard the session
    bye(sub, pub)



@pytest.mark.timeout(30)
def test_resume_resends_within_smaller_receive_maximum_MQTT_3_3_4_9(broker):
    """[MQTT-3.3.4-9]: on resume, unacknowledged messages are resent no faster than the
    client's (new) Receive Maximum allows; each acknowledgement releases the next one."""
    from tests.mqtt_raw import RawClient
    from broker.protocol import packets as P
    from broker.protocol import properties as PR
    cid = "resume-rm-small"
    sub = RawClient(broker.port)
    sub.connect(cid, clean_start=True, properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe("rm/small", qos=1)
    pub = RawClient(broker.port)
    pub.connect(cid + "-pub")
    for i in range(3):
        pub.publish("rm/small", b"%d" % i, qos=1, pid=i + 1)
        pub.recv_type(P.PUBACK)
    first = [sub.recv_type(P.PUBLISH) for _ in range(3)]
    sub.close()
    again = RawClient(broker.port)
    assert again.connect(cid, clean_start=False, properties={
        PR.SESSION_EXPIRY_INTERVAL: 300, PR.RECEIVE_MAXIMUM: 1}).session_present
    got = []
    for expected in first:
        p = again.recv_type(P.PUBLISH)
        assert (p.packet_id, p.payload, p.dup) == (expected.packet_id, expected.payload, True)
        assert again.nothing(0.3)  # nothing more until this one is acknowledged
        again.send(P.Ack(P.PUBACK, p.packet_id))
        got.append(p.payload)
    assert got == [b"0", b"1", b"2"]
