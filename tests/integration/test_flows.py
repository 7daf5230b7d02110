"""QoS 2 flows and resend on session resume through real sockets: a smoke set showing the socket
path gives the same packets as the core (the second one over a lost TCP connection). The rules
(QoS 1 / QoS 2 flows, Receive Maximum, Maximum Packet Size, offline queues, resend on resume;
MQTT 5.0 sections 4.3, 4.4, 4.9, 3.1.2.11, 3.3) are tested through the sans-I/O core in
tests/unit/test_core_session_flows.py."""
from __future__ import annotations

import time

import pytest

from .helpers import PR, P, ack, bye, cid, connect, publish_ok, recv_publish, uniq

pytestmark = pytest.mark.timeout(30)

PERSIST = {PR.SESSION_EXPIRY_INTERVAL: 300}


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
