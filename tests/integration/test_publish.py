"""MQTT 5.0 section 3.3 PUBLISH through real sockets: a smoke set of what needs a socket.

The behaviour of every normative statement of 3.3 is tested at the sans-I/O level in
tests/unit/test_core_publish.py and tests/unit/test_core_publish_properties.py. These tests prove
the socket path gives the same packets where the asyncio layer or the process takes part: a
malformed PUBLISH and a refused QoS end the TCP connection (and only it), the session resumed
after a real TCP close, settings given on the command line, retained messages with the SQLite
store on, the encoded forms forwarded, the acks written by the server's flush, message expiry
driven by the server's timer (real time). Tests that make the broker close a connection also
check that another client is still served.
"""
from __future__ import annotations

import time

import pytest

from broker.protocol import reason_codes as rc

from . import cluster_targets
from .helpers import (
    PR,
    P,
    ack,
    assert_served,
    bye,
    cid,
    connect,
    expect_disconnect,
    props,
    publish_ok,
    raw_publish,
    recv_publish,
    uniq,
)

pytestmark = pytest.mark.timeout(30)

# each test taking `broker` runs on one broker, on a node of a two-node cluster and through
# HAProxy over the two nodes (tests/integration/cluster_targets.py)
broker, two_nodes, make_target = cluster_targets.broker_fixtures()


def test_dup_set_on_redelivery_MQTT_3_3_1_1(broker):
    """[MQTT-3.3.1-1] A PUBLISH re-delivered on session resume has DUP=1 (first send DUP=0)."""
    topic, me = uniq("dup"), cid("dupsub")
    sub = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"m1", qos=1, expect_code=0)
    first = recv_publish(sub)
    assert first.dup is False and first.qos == 1
    sub.close()  # no PUBACK: the message stays unacknowledged
    time.sleep(0.2)
    sub = connect(broker.port, me, clean_start=False, expect_present=True,
                  properties={PR.SESSION_EXPIRY_INTERVAL: 0})
    again = recv_publish(sub)
    assert again.dup is True
    assert (again.packet_id, again.payload, again.topic) == (first.packet_id, b"m1", topic)
    ack(sub, again)
    assert sub.nothing(0.5)
    bye(sub, pub)


def test_qos3_is_malformed_MQTT_3_3_1_4(broker):
    """[MQTT-3.3.1-4] Both QoS bits set: malformed, DISCONNECT 0x81; not delivered."""
    topic = uniq("qos3")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port)
    pub.send(raw_publish(topic, b"q3", qos=1, pid=1, first=0x36))
    expect_disconnect(pub, rc.MALFORMED_PACKET)
    assert sub.nothing(0.5)
    bye(sub)
    assert_served(broker.port)


def test_qos_above_maximum_qos_disconnect_0x9B(make_target):
    """3.3.1.2: a PUBLISH above the Maximum QoS in CONNACK gets DISCONNECT 0x9B [MQTT-3.2.2-11]."""
    b = make_target({"mqtt.maximum_qos": 1})
    c = connect(b.port)
    assert props(c.connack).get(PR.MAXIMUM_QOS) == 1
    publish_ok(c, uniq("mq"), b"ok", qos=1)
    c.publish(uniq("mq"), b"no", qos=2, pid=2)
    expect_disconnect(c, rc.QOS_NOT_SUPPORTED)
    assert_served(b.port)


def _retained(port, filt, timeout=0.6, **opts) -> list:
    """Subscribe with a fresh client; return the retained messages it gets."""
    c = connect(port)
    c.subscribe(filt, qos=1, **opts)
    got = []
    while not c.nothing(timeout):
        m = recv_publish(c)
        got.append(m)
        ack(c, m)
    bye(c)
    return got


def test_retain_store_and_replace_MQTT_3_3_1_5(broker):
    """[MQTT-3.3.1-5] RETAIN=1 stores the message, replacing the existing retained message."""
    topic = uniq("ret")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"v1", qos=1, retain=True)
    got = _retained(broker.port, topic)
    assert [(m.payload, m.retain) for m in got] == [(b"v1", True)]
    publish_ok(pub, topic, b"v2", qos=1, retain=True)
    got = _retained(broker.port, topic)
    assert [(m.payload, m.retain) for m in got] == [(b"v2", True)]
    bye(pub)


def test_message_expiry_deletes_copy_MQTT_3_3_2_5(broker):
    """[MQTT-3.3.2-5] A message whose expiry passed before onward delivery started is deleted:
    a queued copy for an offline subscriber, and an expired retained message."""
    topic, me = uniq("exp"), cid("expsub")
    sub = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe(topic, qos=1)
    bye(sub)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"short", qos=1, properties={PR.MESSAGE_EXPIRY_INTERVAL: 1})
    publish_ok(pub, topic, b"forever", qos=1)
    publish_ok(pub, topic + "/r", b"ret-short", qos=1, retain=True,
               properties={PR.MESSAGE_EXPIRY_INTERVAL: 1})
    time.sleep(2.5)
    sub = connect(broker.port, me, clean_start=False, expect_present=True)
    m = recv_publish(sub)
    assert m.payload == b"forever"
    ack(sub, m)
    assert sub.nothing(0.5), "an expired message was delivered"
    assert _retained(broker.port, topic + "/r") == [], "an expired retained message was sent"
    bye(sub, pub)


def test_topic_alias_not_carried_over_MQTT_3_3_2_7(broker):
    """[MQTT-3.3.2-7] Topic Alias mappings do not outlive the Network Connection: an alias
    mapped on an earlier connection is unknown (DISCONNECT 0x82)."""
    topic, me = uniq("alias7"), cid("al7")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    c = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    publish_ok(c, topic, b"set", qos=1, properties={PR.TOPIC_ALIAS: 3})
    publish_ok(c, "", b"use", qos=1, pid=2, properties={PR.TOPIC_ALIAS: 3})
    assert [recv_publish(sub).payload for _ in range(2)] == [b"set", b"use"]
    bye(c)
    c = connect(broker.port, me, clean_start=False, expect_present=True)
    c.publish("", b"stale", qos=1, pid=3, properties={PR.TOPIC_ALIAS: 3})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.nothing(0.4) or recv_publish(sub).payload != b"stale"
    bye(sub)
    assert_served(broker.port)


FULL_PROPS = {
    PR.PAYLOAD_FORMAT_INDICATOR: 1,
    PR.RESPONSE_TOPIC: "reply/to/me",
    PR.CORRELATION_DATA: b"\x00\xff\x10corr",
    PR.USER_PROPERTY: [("b", "2"), ("a", "1"), ("b", "2"), ("a", "3"), ("ü", "")],
    PR.CONTENT_TYPE: "application/json; charset=utf-8",
}


@pytest.fixture
def forwarded(broker):
    """Publish FULL_PROPS at QoS 0/1/2 to subscribers at QoS 0/1/2; return what they receive."""
    topic = uniq("props")
    subs = []
    for q in (0, 1, 2):
        s = connect(broker.port)
        s.subscribe(topic, qos=q)
        subs.append(s)
    pub = connect(broker.port)
    got = []
    for q in (0, 1, 2):
        publish_ok(pub, topic, b'{"k": 1}', qos=q, pid=q + 1, properties=dict(FULL_PROPS))
        for s in subs:
            m = recv_publish(s)
            got.append(m)
            ack(s, m)
    bye(pub, *subs)
    return got


def test_all_properties_forwarded_exactly(forwarded):
    """3.3.2.3: the forwarded property set is exactly what was published (nothing added/lost)."""
    for m in forwarded:
        assert props(m) == FULL_PROPS
        assert m.payload == b'{"k": 1}'


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_response_by_qos_MQTT_3_3_4_1(broker, qos):
    """[MQTT-3.3.4-1] QoS 0: no response; QoS 1: PUBACK; QoS 2: PUBREC. Reason 0x00 when there
    are subscribers, 0x10 (No matching subscribers) when there are none; on a cluster 0x00 then
    too: a node does not know the other nodes' subscribers, and 0x10 is a MAY (3.4.2.1 PUBACK
    and 3.5.2.1 PUBREC Reason Codes: "If the Server knows that there are no matching
    subscribers, it MAY use this Reason Code instead of 0x00")."""
    topic = uniq("resp")
    none = rc.SUCCESS if cluster_targets.on_cluster(broker) else rc.NO_MATCHING_SUBSCRIBERS
    c = connect(broker.port)
    c.publish(topic, b"none", qos=qos, pid=10)
    if qos == 0:
        assert c.nothing(0.5)
    else:
        a = c.recv_type(P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (10, none)
        if qos == 2:
            c.send(P.Ack(P.PUBREL, 10))
            assert c.recv_type(P.PUBCOMP).packet_id == 10
    sub = connect(broker.port)
    sub.subscribe(topic, qos=0)
    c.publish(topic, b"some", qos=qos, pid=11)
    if qos:
        a = c.recv_type(P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (11, rc.SUCCESS)
        if qos == 2:
            c.send(P.Ack(P.PUBREL, 11))
            assert c.recv_type(P.PUBCOMP).reason_code == 0
    assert recv_publish(sub).payload == b"some"
    assert c.nothing(0.3)
    bye(c, sub)
