"""MQTT 5.0 section 3.3 PUBLISH through real sockets: one test (or case) per normative statement of 3.3.

Every test names the conformance statement it checks. Tests that make the broker
close a connection also check that another client is still served.
"""
from __future__ import annotations

import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode_publish
from broker.protocol.properties import encode_utf8, encode_vbi

from .helpers import (P, PR, ack, assert_served, bye, cid, connect, expect_disconnect, props,
                      publish_ok, raw_publish, recv_publish, uniq)

pytestmark = pytest.mark.timeout(30)


def forge(topic: bytes, payload: bytes = b"x", qos: int = 0, pid: int | None = None,
          block: bytes = b"\x00", first: int | None = None) -> bytes:
    """A PUBLISH built from raw parts (topic bytes, encoded property block)."""
    data = bytearray(encode_publish(topic, payload, qos, False, False, pid, block, P.MQTT_5))
    if first is not None:
        data[0] = first
    return bytes(data)


def block(*items: bytes) -> bytes:
    body = b"".join(items)
    return encode_vbi(len(body)) + body


class AliasView:
    """Client side of outbound topic aliases: resolves what the broker sends."""

    def __init__(self, maximum: int):
        self.maximum = maximum
        self.map: dict[int, str] = {}

    def resolve(self, m: P.Publish) -> str:
        alias = props(m).get(PR.TOPIC_ALIAS)
        if alias is None:
            assert m.topic, f"empty topic without a Topic Alias: {m!r}"
            return m.topic
        assert 1 <= alias <= self.maximum, f"alias {alias} outside 1..{self.maximum}"  # [MQTT-3.3.2-11]
        if m.topic:
            self.map[alias] = m.topic
            return m.topic
        assert alias in self.map, f"alias {alias} used before the broker mapped it: {m!r}"
        return self.map[alias]


# ---------------------------------------------------------------- 3.3.1.1 DUP

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


def test_dup_zero_for_qos0_MQTT_3_3_1_2(broker):
    """[MQTT-3.3.1-2] QoS 0 messages from the broker have DUP=0, even when published with DUP=1
    at QoS 1 and downgraded; a client's QoS 0 PUBLISH with DUP=1 is malformed (0x81)."""
    topic = uniq("dup0")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=0)
    pub = connect(broker.port)
    pub.publish(topic, b"a", qos=0)
    pub.publish(topic, b"b", qos=1, pid=3, dup=True)
    assert pub.recv_type(P.PUBACK).packet_id == 3
    for payload in (b"a", b"b"):
        m = recv_publish(sub)
        assert (m.payload, m.qos, m.dup) == (payload, 0, False)
    pub.send(raw_publish(topic, b"bad", first=0x38))  # QoS 0, DUP 1
    expect_disconnect(pub, rc.MALFORMED_PACKET)
    assert sub.nothing(0.5), "the malformed PUBLISH was delivered"
    bye(sub)
    assert_served(broker.port)


@pytest.mark.parametrize("qos", [1, 2])
def test_dup_not_propagated_MQTT_3_3_1_3(broker, qos):
    """[MQTT-3.3.1-3] The incoming DUP flag is not propagated: the first send to a subscriber has DUP=0."""
    topic = uniq("dupprop")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"d", qos=qos, pid=9, dup=True, expect_code=0)
    m = recv_publish(sub)
    assert (m.payload, m.qos, m.dup) == (b"d", qos, False)
    ack(sub, m)
    bye(sub, pub)


# ---------------------------------------------------------------- 3.3.1.2 QoS

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


def test_qos_above_maximum_qos_disconnect_0x9B(make_broker):
    """3.3.1.2: a PUBLISH above the Maximum QoS in CONNACK gets DISCONNECT 0x9B [MQTT-3.2.2-11]."""
    b = make_broker({"mqtt.maximum_qos": 1})
    c = connect(b.port)
    assert props(c.connack).get(PR.MAXIMUM_QOS) == 1
    publish_ok(c, uniq("mq"), b"ok", qos=1)
    c.publish(uniq("mq"), b"no", qos=2, pid=2)
    expect_disconnect(c, rc.QOS_NOT_SUPPORTED)
    assert_served(b.port)


# ---------------------------------------------------------------- 3.3.1.3 RETAIN

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


def test_retain_qos0_stored(broker):
    """3.3.1.3: a QoS 0 retained message is stored (SHOULD) and sent at QoS 0 with RETAIN=1."""
    topic = uniq("ret0")
    pub = connect(broker.port)
    pub.publish(topic, b"q0", qos=0, retain=True)
    time.sleep(0.2)
    got = _retained(broker.port, topic)
    assert [(m.payload, m.retain, m.qos) for m in got] == [(b"q0", True, 0)]
    bye(pub)


def test_retain_empty_payload_deletes_MQTT_3_3_1_6(broker):
    """[MQTT-3.3.1-6] An empty retained payload is delivered normally but removes the retained message."""
    topic = uniq("retdel")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"keep", qos=1, retain=True)
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    m = recv_publish(sub)
    assert m.payload == b"keep" and m.retain
    ack(sub, m)
    publish_ok(pub, topic, b"", qos=1, retain=True, expect_code=0)
    m = recv_publish(sub)  # processed normally: existing subscribers get it
    assert m.payload == b"" and m.topic == topic
    ack(sub, m)
    assert _retained(broker.port, topic) == []
    bye(sub, pub)


def test_retain_empty_payload_not_stored_MQTT_3_3_1_7(broker):
    """[MQTT-3.3.1-7] A zero-byte retained message is never stored (also on a topic with none)."""
    topic = uniq("retempty")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"", qos=1, retain=True)
    publish_ok(pub, topic + "/x", b"", qos=0, retain=True)
    time.sleep(0.2)
    assert _retained(broker.port, topic) == []
    assert _retained(broker.port, topic + "/#") == []
    bye(pub)


def test_retain_zero_leaves_retained_alone_MQTT_3_3_1_8(broker):
    """[MQTT-3.3.1-8] RETAIN=0 neither stores nor removes/replaces a retained message."""
    topic, other = uniq("retkeep"), uniq("retnone")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"orig", qos=1, retain=True)
    publish_ok(pub, topic, b"not-retained", qos=1, retain=False)
    publish_ok(pub, topic, b"", qos=1, retain=False)
    publish_ok(pub, other, b"plain", qos=1, retain=False)
    assert [m.payload for m in _retained(broker.port, topic)] == [b"orig"]
    assert _retained(broker.port, other) == []
    bye(pub)


def test_retain_handling_0_sends_MQTT_3_3_1_9(broker):
    """[MQTT-3.3.1-9] Retain Handling 0: retained messages sent on every SUBSCRIBE, RETAIN=1."""
    base = uniq("rh0")
    pub = connect(broker.port)
    publish_ok(pub, base + "/a", b"A", qos=1, retain=True)
    publish_ok(pub, base + "/b", b"B", qos=1, retain=True)
    c = connect(broker.port)
    for _ in range(2):  # a repeated SUBSCRIBE sends them again
        c.subscribe(base + "/+", qos=1, retain_handling=0)
        got = []
        for _ in range(2):
            m = recv_publish(c)
            got.append((m.topic, m.payload, m.retain))
            ack(c, m)
        assert sorted(got) == [(base + "/a", b"A", True), (base + "/b", b"B", True)]
        assert c.nothing(0.4)
    bye(c, pub)


def test_retain_handling_1_only_new_MQTT_3_3_1_10(broker):
    """[MQTT-3.3.1-10] Retain Handling 1: sent when the subscription is new, not when it existed."""
    topic = uniq("rh1")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"R", qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1, retain_handling=1)
    m = recv_publish(c)
    assert (m.payload, m.retain) == (b"R", True)
    ack(c, m)
    c.subscribe(topic, qos=1, retain_handling=1)  # exists now
    assert c.nothing(0.6), "retained message sent again for an existing subscription"
    bye(c, pub)


def test_retain_handling_2_never_MQTT_3_3_1_11(broker):
    """[MQTT-3.3.1-11] Retain Handling 2: retained messages are not sent; live messages are."""
    topic = uniq("rh2")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"R", qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1, retain_handling=2)
    assert c.nothing(0.6)
    publish_ok(pub, topic, b"live", qos=1)
    m = recv_publish(c)
    assert (m.payload, m.retain) == (b"live", False)
    ack(c, m)
    bye(c, pub)


def test_retain_as_published_0_clears_flag_MQTT_3_3_1_12(broker):
    """[MQTT-3.3.1-12] Retain As Published 0: forwarded messages have RETAIN=0."""
    topic = uniq("rap0")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1, retain_as_published=False)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"r", qos=1, retain=True)
    m = recv_publish(sub)
    assert (m.payload, m.retain) == (b"r", False)
    ack(sub, m)
    bye(sub, pub)


def test_retain_as_published_1_keeps_flag_MQTT_3_3_1_13(broker):
    """[MQTT-3.3.1-13] Retain As Published 1: RETAIN equals the flag of the received PUBLISH."""
    topic = uniq("rap1")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1, retain_as_published=True)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"r1", qos=1, retain=True)
    publish_ok(pub, topic, b"r0", qos=1, retain=False)
    got = []
    for _ in range(2):
        m = recv_publish(sub)
        got.append((m.payload, m.retain))
        ack(sub, m)
    assert got == [(b"r1", True), (b"r0", False)]
    bye(sub, pub)


def test_retain_not_available_0x9A(make_broker):
    """3.3.1.3: Retain Available 0 in CONNACK; a RETAIN=1 PUBLISH gets DISCONNECT 0x9A."""
    b = make_broker({"mqtt.retain_available": False})
    c = connect(b.port)
    assert props(c.connack).get(PR.RETAIN_AVAILABLE) == 0
    topic = uniq("noret")
    c.publish(topic, b"r", qos=1, pid=1, retain=True)
    expect_disconnect(c, rc.RETAIN_NOT_SUPPORTED)
    assert _retained(b.port, topic) == []
    assert_served(b.port)


# ---------------------------------------------------------------- 3.3.2.1 Topic Name

@pytest.mark.parametrize("topic", [b"bad/\xff\xfe", b"a/\xc0\xaf", b"nul/\x00/x", b"\xed\xa0\x80"],
                         ids=["invalid-bytes", "overlong", "U+0000", "surrogate"])
def test_topic_name_must_be_utf8_MQTT_3_3_2_1(broker, topic):
    """[MQTT-3.3.2-1] A Topic Name that is not a valid UTF-8 Encoded String: DISCONNECT 0x81."""
    sub = connect(broker.port)
    sub.subscribe("#", qos=0)
    while not sub.nothing(0.2):  # drain retained messages from other tests
        sub.recv()
    c = connect(broker.port)
    c.send(forge(topic, b"utf8?", qos=1, pid=1))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    while not sub.nothing(0.3):
        assert sub.recv().payload != b"utf8?", "the invalid PUBLISH was delivered"
    bye(sub)
    assert_served(broker.port)


@pytest.mark.parametrize("topic", ["a/+/c", "a/#", "+", "#", "a+b"])
def test_topic_name_without_wildcards_MQTT_3_3_2_2(broker, topic):
    """[MQTT-3.3.2-2] A Topic Name with a wildcard is refused: DISCONNECT 0x90 (Topic Name invalid),
    nothing delivered."""
    sub = connect(broker.port)
    sub.subscribe("a/#", "+", "#", "a+b", qos=1)
    while not sub.nothing(0.2):
        ack(sub, recv_publish(sub))
    c = connect(broker.port)
    c.publish(topic, b"wild", qos=1, pid=1)
    seen = expect_disconnect(c, rc.TOPIC_NAME_INVALID)
    assert not [p for p in seen if p.type == P.PUBACK and p.reason_code < 0x80]
    while not sub.nothing(0.3):
        m = recv_publish(sub)
        assert m.payload != b"wild"
        ack(sub, m)
    bye(sub)
    assert_served(broker.port)


def test_topic_name_empty_without_alias_is_protocol_error(broker):
    """3.3.2.1: a zero-length Topic Name without a Topic Alias is a Protocol Error (0x82)."""
    c = connect(broker.port)
    c.publish("", b"x", qos=1, pid=1)
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


def test_topic_name_matches_filter_MQTT_3_3_2_3(broker):
    """[MQTT-3.3.2-3] The Topic Name sent to a subscriber matches its Topic Filter."""
    base = uniq("match")
    sub = connect(broker.port)
    sub.subscribe(base + "/+/z", base + "/deep/#", qos=0)
    pub = connect(broker.port)
    sent = ["/y/z", "/y/w", "/y/z/q", "/deep", "/deep/a/b", "/q/z", "/deeper/x"]
    for s in sent:
        pub.publish(base + s, s.encode(), qos=0)
    got = []
    while not sub.nothing(0.5):
        m = recv_publish(sub)
        assert m.payload == m.topic[len(base):].encode()
        got.append(m.topic[len(base):])
    assert sorted(got) == sorted(["/y/z", "/deep", "/deep/a/b", "/q/z"])
    bye(sub, pub)


# ---------------------------------------------------------------- 3.3.2.3 properties

def test_payload_format_indicator_forwarded_MQTT_3_3_2_4(broker):
    """[MQTT-3.3.2-4] The Payload Format Indicator is sent unaltered (0 and 1)."""
    topic = uniq("pfi")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, "héllo".encode(), qos=1, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    publish_ok(pub, topic, b"\xff\x00", qos=1, properties={PR.PAYLOAD_FORMAT_INDICATOR: 0})
    m1, m2 = recv_publish(sub), recv_publish(sub)
    assert props(m1).get(PR.PAYLOAD_FORMAT_INDICATOR) == 1 and m1.payload == "héllo".encode()
    assert props(m2).get(PR.PAYLOAD_FORMAT_INDICATOR) == 0 and m2.payload == b"\xff\x00"
    ack(sub, m1)
    ack(sub, m2)
    bye(sub, pub)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_payload_format_invalid_0x99(broker, qos):
    """3.3.2.3.2: PFI=1 with a non-UTF-8 payload: PUBACK/PUBREC 0x99 (DISCONNECT 0x99 at QoS 0);
    the message is not delivered."""
    topic = uniq("pfibad")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=2)
    pub = connect(broker.port)
    pub.publish(topic, b"\xc3\x28", qos=qos, pid=4, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    if qos == 0:
        expect_disconnect(pub, rc.PAYLOAD_FORMAT_INVALID)
        assert_served(broker.port)
    else:
        a = pub.recv_type(P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (4, rc.PAYLOAD_FORMAT_INVALID)
        publish_ok(pub, topic, b"fine", qos=1, pid=5, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
        m = recv_publish(sub)
        assert m.payload == b"fine"
        ack(sub, m)
        bye(pub)
    assert sub.nothing(0.4)
    bye(sub)


def test_payload_format_validation_off(make_broker):
    """validate_payload_format=false: a PFI=1 non-UTF-8 payload is forwarded unaltered."""
    b = make_broker({"mqtt.validate_payload_format": False})
    topic = uniq("pfioff")
    sub = connect(b.port)
    sub.subscribe(topic, qos=1)
    pub = connect(b.port)
    publish_ok(pub, topic, b"\xc3\x28", qos=1, expect_code=0,
               properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    m = recv_publish(sub)
    assert m.payload == b"\xc3\x28" and props(m).get(PR.PAYLOAD_FORMAT_INDICATOR) == 1
    bye(sub, pub)


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


def test_message_expiry_remaining_interval_MQTT_3_3_2_6(broker):
    """[MQTT-3.3.2-6] The forwarded Message Expiry Interval is the received value minus the time
    waited: at most the original for an online subscriber, lower after waiting in a queue."""
    topic, me = uniq("expleft"), cid("explsub")
    online = connect(broker.port)
    online.subscribe(topic, qos=1)
    sub = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe(topic, qos=1)
    bye(sub)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"e", qos=1, properties={PR.MESSAGE_EXPIRY_INTERVAL: 30})
    m = recv_publish(online)
    assert 28 <= props(m)[PR.MESSAGE_EXPIRY_INTERVAL] <= 30
    ack(online, m)
    time.sleep(2.2)
    sub = connect(broker.port, me, clean_start=False, expect_present=True)
    m = recv_publish(sub)
    assert m.payload == b"e"
    assert 20 <= props(m)[PR.MESSAGE_EXPIRY_INTERVAL] <= 28
    ack(sub, m)
    # a retained message too carries the remaining interval
    publish_ok(pub, topic + "/r", b"r", qos=1, retain=True, properties={PR.MESSAGE_EXPIRY_INTERVAL: 30})
    time.sleep(2.2)
    got = _retained(broker.port, topic + "/r")
    assert len(got) == 1 and 20 <= props(got[0])[PR.MESSAGE_EXPIRY_INTERVAL] <= 28
    publish_ok(pub, topic + "/r", b"", qos=1, retain=True)
    bye(sub, pub, online)


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


def test_topic_alias_zero_invalid_MQTT_3_3_2_8(broker):
    """[MQTT-3.3.2-8] Topic Alias 0 is not permitted: DISCONNECT 0x94."""
    c = connect(broker.port)
    c.publish(uniq("alias0"), b"x", qos=1, pid=1, properties={PR.TOPIC_ALIAS: 0})
    expect_disconnect(c, rc.TOPIC_ALIAS_INVALID)
    assert_served(broker.port)


@pytest.mark.parametrize("maximum,alias", [(5, 6), (5, 65535), (0, 1)])
def test_topic_alias_above_maximum_MQTT_3_3_2_9(make_broker, maximum, alias):
    """[MQTT-3.3.2-9] A Topic Alias above the Topic Alias Maximum of CONNACK: DISCONNECT 0x94."""
    b = make_broker({"mqtt.topic_alias_maximum": maximum})
    c = connect(b.port)
    assert props(c.connack).get(PR.TOPIC_ALIAS_MAXIMUM, 0) == maximum
    c.publish(uniq("aliasmax"), b"x", qos=1, pid=1, properties={PR.TOPIC_ALIAS: alias})
    expect_disconnect(c, rc.TOPIC_ALIAS_INVALID)
    assert_served(b.port)


def test_outbound_aliases_within_client_range_MQTT_3_3_2_10(broker):
    """[MQTT-3.3.2-10] (client side) A client must accept aliases 1..its maximum: the broker uses
    exactly that range and each alias is defined (topic sent) before it is used alone."""
    base = uniq("alias10")
    c = connect(broker.port, properties={PR.TOPIC_ALIAS_MAXIMUM: 3})
    c.subscribe(base + "/#", qos=0)
    pub = connect(broker.port)
    topics = [f"{base}/{i}" for i in range(5)]
    for rnd in range(2):
        for t in topics:
            pub.publish(t, t.encode(), qos=0)
    view = AliasView(3)
    got = []
    for _ in range(10):
        m = recv_publish(c)
        t = view.resolve(m)
        assert m.payload == t.encode()
        got.append(t)
    assert got == topics * 2
    assert sorted(view.map) == [1, 2, 3]
    bye(c, pub)


def test_outbound_alias_never_above_client_maximum_MQTT_3_3_2_11(broker):
    """[MQTT-3.3.2-11] Outbound aliases never exceed the client's Topic Alias Maximum; a second
    message on an aliased topic has an empty Topic Name; no aliases without a maximum."""
    base = uniq("alias11")
    c = connect(broker.port, properties={PR.TOPIC_ALIAS_MAXIMUM: 1})
    plain = connect(broker.port)  # no Topic Alias Maximum: no aliases at all
    for s in (c, plain):
        s.subscribe(base + "/#", qos=1)
    pub = connect(broker.port)
    seq = ["a", "a", "b", "b", "a"]
    for i, s in enumerate(seq, 1):
        publish_ok(pub, f"{base}/{s}", s.encode(), qos=1, pid=i)
    view = AliasView(1)
    ms = [recv_publish(c) for _ in seq]
    for m in ms:
        ack(c, m)
    assert [view.resolve(m) for m in ms] == [f"{base}/{s}" for s in seq]
    assert (ms[0].topic, props(ms[0]).get(PR.TOPIC_ALIAS)) == (f"{base}/a", 1)
    assert (ms[1].topic, props(ms[1]).get(PR.TOPIC_ALIAS)) == ("", 1)
    assert ms[2].topic == f"{base}/b" and props(ms[2]).get(PR.TOPIC_ALIAS) in (None, 1)
    for _ in seq:
        m = recv_publish(plain)
        assert m.topic.startswith(base) and PR.TOPIC_ALIAS not in props(m)
        ack(plain, m)
    bye(c, plain, pub)


def test_outbound_alias_not_consumed_by_dropped_oversize_message(broker):
    """[MQTT-3.3.2-11] with [MQTT-3.1.2-25]: a message too large for the client is not sent, so it
    must not define an alias the client never saw; the next message on that topic names it."""
    topic = uniq("aliasbig")
    c = connect(broker.port, properties={PR.TOPIC_ALIAS_MAXIMUM: 5, PR.MAXIMUM_PACKET_SIZE: 200})
    c.subscribe(topic, qos=0)
    pub = connect(broker.port)
    pub.publish(topic, b"B" * 500, qos=0)
    pub.publish(topic, b"small", qos=0)
    m = recv_publish(c)
    assert m.payload == b"small"
    assert AliasView(5).resolve(m) == topic
    bye(c, pub)


def test_inbound_alias_full_range_and_remap_MQTT_3_3_2_12(make_broker):
    """[MQTT-3.3.2-12] The broker accepts every alias 1..its Topic Alias Maximum; a new Topic Name
    with a mapped alias replaces the mapping."""
    b = make_broker({"mqtt.topic_alias_maximum": 10})
    t1, t2, t3 = uniq("al12"), uniq("al12"), uniq("al12")
    sub = connect(b.port)
    sub.subscribe(t1, t2, t3, qos=1)
    c = connect(b.port)
    assert props(c.connack)[PR.TOPIC_ALIAS_MAXIMUM] == 10
    steps = [(t1, 1), ("", 1), (t2, 10), ("", 10), (t3, 1), ("", 1), ("", 10)]
    for i, (t, a) in enumerate(steps, 1):
        publish_ok(c, t, f"m{i}".encode(), qos=1, pid=i, expect_code=0, properties={PR.TOPIC_ALIAS: a})
    got = []
    for _ in steps:
        m = recv_publish(sub)
        got.append((m.topic, m.payload))
        ack(sub, m)
    assert got == [(t1, b"m1"), (t1, b"m2"), (t2, b"m3"), (t2, b"m4"), (t3, b"m5"), (t3, b"m6"),
                   (t2, b"m7")]
    bye(sub, c)


def test_inbound_alias_unknown_with_empty_topic_0x82(broker):
    """3.3.4 Topic Alias rule 3a: an unmapped alias with an empty Topic Name is a Protocol Error."""
    c = connect(broker.port)
    c.publish("", b"x", qos=0, properties={PR.TOPIC_ALIAS: 7})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


def test_response_topic_must_be_utf8_MQTT_3_3_2_13(broker):
    """[MQTT-3.3.2-13] A Response Topic that is not valid UTF-8: DISCONNECT 0x81."""
    c = connect(broker.port)
    bad = b"\x08" + b"\x00\x03r/\xff"
    c.send(forge(uniq("rt").encode(), b"x", qos=1, pid=1, block=block(bad)))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    assert_served(broker.port)


@pytest.mark.parametrize("rt", ["reply/+", "reply/#", "#"])
def test_response_topic_without_wildcards_MQTT_3_3_2_14(broker, rt):
    """[MQTT-3.3.2-14] A Response Topic with wildcards: DISCONNECT 0x82."""
    topic = uniq("rtw")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    c = connect(broker.port)
    c.publish(topic, b"req", qos=1, pid=1, properties={PR.RESPONSE_TOPIC: rt})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.nothing(0.4)
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


def test_response_topic_forwarded_MQTT_3_3_2_15(forwarded):
    """[MQTT-3.3.2-15] The Response Topic is sent unaltered to all subscribers."""
    assert [props(m).get(PR.RESPONSE_TOPIC) for m in forwarded] == ["reply/to/me"] * 9


def test_correlation_data_forwarded_MQTT_3_3_2_16(forwarded):
    """[MQTT-3.3.2-16] The Correlation Data is sent unaltered to all subscribers."""
    assert [props(m).get(PR.CORRELATION_DATA) for m in forwarded] == [b"\x00\xff\x10corr"] * 9


def test_user_properties_forwarded_MQTT_3_3_2_17(forwarded):
    """[MQTT-3.3.2-17] All User Properties are sent unaltered, duplicates included."""
    for m in forwarded:
        assert sorted(props(m).get(PR.USER_PROPERTY)) == sorted(FULL_PROPS[PR.USER_PROPERTY])


def test_user_properties_order_MQTT_3_3_2_18(forwarded):
    """[MQTT-3.3.2-18] The order of User Properties is maintained."""
    for m in forwarded:
        assert props(m).get(PR.USER_PROPERTY) == FULL_PROPS[PR.USER_PROPERTY]


def test_all_properties_forwarded_exactly(forwarded):
    """3.3.2.3: the forwarded property set is exactly what was published (nothing added/lost)."""
    for m in forwarded:
        assert props(m) == FULL_PROPS
        assert m.payload == b'{"k": 1}'


def test_content_type_must_be_utf8_MQTT_3_3_2_19(broker):
    """[MQTT-3.3.2-19] A Content Type that is not valid UTF-8: DISCONNECT 0x81."""
    c = connect(broker.port)
    bad = b"\x03" + b"\x00\x02\xc3\x28"
    c.send(forge(uniq("ct").encode(), b"x", qos=0, block=block(bad)))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    assert_served(broker.port)


def test_content_type_forwarded_MQTT_3_3_2_20(forwarded):
    """[MQTT-3.3.2-20] The Content Type is sent unaltered to all subscribers."""
    assert {props(m).get(PR.CONTENT_TYPE) for m in forwarded} == {"application/json; charset=utf-8"}


@pytest.mark.parametrize("pid,blk", [
    (PR.RESPONSE_TOPIC, b"\x08" + encode_utf8("r1") + b"\x08" + encode_utf8("r2")),
    (PR.CORRELATION_DATA, b"\x09\x00\x01a\x09\x00\x01b"),
    (PR.CONTENT_TYPE, b"\x03" + encode_utf8("a") + b"\x03" + encode_utf8("b")),
    (PR.TOPIC_ALIAS, b"\x23\x00\x01\x23\x00\x02"),
], ids=["response-topic", "correlation-data", "content-type", "topic-alias"])
def test_property_more_than_once_protocol_error(broker, pid, blk):
    """3.3.2.3: including Response Topic / Correlation Data / Content Type / Topic Alias more than
    once is a Protocol Error: DISCONNECT 0x82."""
    c = connect(broker.port)
    c.send(forge(uniq("dupprop").encode(), b"x", qos=1, pid=1, block=block(blk)))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


# ---------------------------------------------------------------- 3.3.4 PUBLISH actions

@pytest.mark.parametrize("qos", [0, 1, 2])
def test_response_by_qos_MQTT_3_3_4_1(broker, qos):
    """[MQTT-3.3.4-1] QoS 0: no response; QoS 1: PUBACK; QoS 2: PUBREC. Reason 0x00 when there
    are subscribers, 0x10 (No matching subscribers) when there are none."""
    topic = uniq("resp")
    c = connect(broker.port)
    c.publish(topic, b"none", qos=qos, pid=10)
    if qos == 0:
        assert c.nothing(0.5)
    else:
        a = c.recv_type(P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (10, rc.NO_MATCHING_SUBSCRIBERS)
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


def test_overlapping_subscriptions_max_qos_MQTT_3_3_4_2(broker):
    """[MQTT-3.3.4-2] Overlapping subscriptions: the message is delivered respecting the maximum QoS
    of all matching subscriptions (one copy here)."""
    base = uniq("over")
    c = connect(broker.port)
    c.subscribe(base + "/#", qos=0, pid=1)
    c.subscribe(base + "/+/c", qos=2, pid=2)
    c.subscribe(base + "/b/c", qos=1, pid=3)
    pub = connect(broker.port)
    publish_ok(pub, base + "/b/c", b"o", qos=2)
    m = recv_publish(c)
    assert (m.payload, m.qos) == (b"o", 2)
    ack(c, m)
    assert c.nothing(0.5), "more than one copy"
    bye(c, pub)


def test_subscription_identifiers_sent_MQTT_3_3_4_3(broker):
    """[MQTT-3.3.4-3] The Subscription Identifier of the matching subscription is sent; none when
    the subscription had none."""
    base = uniq("sid")
    c = connect(broker.port)
    c.subscribe(base + "/with", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [12345]})
    c.subscribe(base + "/without", qos=1, pid=2)
    pub = connect(broker.port)
    publish_ok(pub, base + "/with", b"1", qos=1)
    publish_ok(pub, base + "/without", b"2", qos=1)
    m1, m2 = recv_publish(c), recv_publish(c)
    assert props(m1).get(PR.SUBSCRIPTION_IDENTIFIER) == [12345]
    assert PR.SUBSCRIPTION_IDENTIFIER not in props(m2)
    bye(c, pub)


def test_single_copy_has_all_subscription_ids_MQTT_3_3_4_4(broker):
    """[MQTT-3.3.4-4] A single copy for overlapping subscriptions carries the Subscription
    Identifiers of all matching subscriptions that have one (also identical ones)."""
    base = uniq("sids")
    c = connect(broker.port)
    c.subscribe(base + "/#", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [7]})
    c.subscribe(base + "/+/c", qos=0, pid=2, properties={PR.SUBSCRIPTION_IDENTIFIER: [268435455]})
    c.subscribe(base + "/b/+", qos=0, pid=3, properties={PR.SUBSCRIPTION_IDENTIFIER: [7]})
    c.subscribe(base + "/b/c", qos=0, pid=4)
    pub = connect(broker.port)
    publish_ok(pub, base + "/b/c", b"x", qos=1)
    m = recv_publish(c)
    assert m.qos == 1
    assert sorted(props(m)[PR.SUBSCRIPTION_IDENTIFIER]) == [7, 7, 268435455]
    ack(c, m)
    assert c.nothing(0.5)
    bye(c, pub)


def test_each_copy_has_its_subscription_id_MQTT_3_3_4_5(broker):
    """[MQTT-3.3.4-5] Every PUBLISH the broker sends carries the identifier of each matching
    subscription (this broker sends one copy per client; each is checked per topic)."""
    base = uniq("sidc")
    c = connect(broker.port)
    c.subscribe(base + "/a/+", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [1]})
    c.subscribe(base + "/+/b", qos=1, pid=2, properties={PR.SUBSCRIPTION_IDENTIFIER: [2]})
    pub = connect(broker.port)
    expected = {"/a/x": [1], "/x/b": [2], "/a/b": [1, 2]}
    for t in expected:
        publish_ok(pub, base + t, t.encode(), qos=1)
    got = {}
    while not c.nothing(0.5):
        m = recv_publish(c)
        assert m.topic[len(base):] not in got, "several copies"
        got[m.topic[len(base):]] = sorted(props(m)[PR.SUBSCRIPTION_IDENTIFIER])
        ack(c, m)
    assert got == expected
    bye(c, pub)


def test_client_publish_with_subscription_id_MQTT_3_3_4_6(broker):
    """[MQTT-3.3.4-6] A client PUBLISH must not contain a Subscription Identifier: DISCONNECT 0x82."""
    topic = uniq("sidpub")
    sub = connect(broker.port)
    sub.subscribe(topic, qos=1)
    c = connect(broker.port)
    c.publish(topic, b"x", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [5]})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.nothing(0.4)
    bye(sub)
    assert_served(broker.port)


def test_client_exceeding_receive_maximum_MQTT_3_3_4_7(make_broker):
    """[MQTT-3.3.4-7] The broker advertises Receive Maximum; a client with more unacknowledged
    QoS 2 PUBLISHes than that gets DISCONNECT 0x93."""
    b = make_broker({"mqtt.receive_maximum": 2})
    c = connect(b.port)
    assert props(c.connack)[PR.RECEIVE_MAXIMUM] == 2
    topic = uniq("rmax")
    for pid in (1, 2):
        c.publish(topic, b"x", qos=2, pid=pid)
        assert c.recv_type(P.PUBREC).packet_id == pid
    c.send(P.Ack(P.PUBREL, 1))  # frees one slot
    assert c.recv_type(P.PUBCOMP).packet_id == 1
    c.publish(topic, b"x", qos=2, pid=3)
    assert c.recv_type(P.PUBREC).packet_id == 3
    c.publish(topic, b"x", qos=2, pid=4)  # third unacknowledged
    expect_disconnect(c, rc.RECEIVE_MAXIMUM_EXCEEDED)
    assert_served(b.port)


def test_broker_handles_other_packets_when_client_window_full_MQTT_3_3_4_8(make_broker):
    """[MQTT-3.3.4-8] (client side) Other packets are not delayed by a full Receive Maximum window:
    the broker processes PINGREQ, SUBSCRIBE, UNSUBSCRIBE, QoS 0 PUBLISH and PUBREL meanwhile."""
    b = make_broker({"mqtt.receive_maximum": 2})
    c = connect(b.port)
    topic = uniq("rmax8")
    for pid in (1, 2):
        c.publish(topic, b"x", qos=2, pid=pid)
        c.recv_type(P.PUBREC)
    c.send(P.PingReq())
    c.recv_type(P.PINGRESP)
    assert c.subscribe(topic, qos=0, pid=20).reason_codes == [0]
    c.publish(topic, b"q0", qos=0)
    assert recv_publish(c).payload == b"q0"
    c.send(P.Unsubscribe(21, [topic]))
    assert c.recv_type(P.UNSUBACK).reason_codes == [0]
    for pid in (1, 2):
        c.send(P.Ack(P.PUBREL, pid))
        assert c.recv_type(P.PUBCOMP).packet_id == pid
    bye(c)


def test_broker_respects_client_receive_maximum_MQTT_3_3_4_9(broker):
    """[MQTT-3.3.4-9] The broker never has more unacknowledged QoS 1/2 PUBLISHes towards a client
    than its Receive Maximum; the rest are queued and sent in order as slots free."""
    topic = uniq("crmax")
    c = connect(broker.port, properties={PR.RECEIVE_MAXIMUM: 2})
    c.subscribe(topic, qos=2)
    pub = connect(broker.port)
    for i in range(6):
        publish_ok(pub, topic, b"%d" % i, qos=1 + i % 2, pid=i + 1)
    first = [recv_publish(c), recv_publish(c)]
    assert [m.payload for m in first] == [b"0", b"1"]
    assert c.nothing(0.5), "more than Receive Maximum unacknowledged PUBLISHes"
    got = [m.payload for m in first]
    outstanding = list(first)
    while len(got) < 6:
        ack(c, outstanding.pop(0))
        m = recv_publish(c)
        got.append(m.payload)
        outstanding.append(m)
        assert c.nothing(0.3)
    assert got == [b"%d" % i for i in range(6)]
    for m in outstanding:
        ack(c, m)
    bye(c, pub)


def test_broker_not_delaying_other_packets_MQTT_3_3_4_10(broker):
    """[MQTT-3.3.4-10] With the client's window full the broker still answers PINGREQ, SUBACK,
    UNSUBACK and sends QoS 0 PUBLISHes."""
    topic, q0 = uniq("crmax10"), uniq("crmax10q0")
    c = connect(broker.port, properties={PR.RECEIVE_MAXIMUM: 1})
    c.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"a", qos=1, pid=1)
    publish_ok(pub, topic, b"b", qos=1, pid=2)
    m = recv_publish(c)
    assert m.payload == b"a"
    assert c.nothing(0.4)
    c.send(P.PingReq())
    c.recv_type(P.PINGRESP)
    assert c.subscribe(q0, qos=0, pid=5).reason_codes == [0]
    pub.publish(q0, b"zero", qos=0)
    z = recv_publish(c)
    assert (z.payload, z.qos) == (b"zero", 0)
    c.send(P.Unsubscribe(6, [q0]))
    assert c.recv_type(P.UNSUBACK).reason_codes == [0]
    ack(c, m)
    m = recv_publish(c)
    assert m.payload == b"b"
    ack(c, m)
    bye(c, pub)


def test_retain_handling_1_after_unsubscribe_MQTT_3_3_1_10(broker):
    """[MQTT-3.3.1-10] Retain Handling 1: after UNSUBSCRIBE the subscription is new again."""
    topic = uniq("rh1u")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"R", qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1, retain_handling=1)
    ack(c, recv_publish(c))
    c.send(P.Unsubscribe(9, [topic]))
    c.recv_type(P.UNSUBACK)
    c.subscribe(topic, qos=1, retain_handling=1)
    m = recv_publish(c)
    assert (m.payload, m.retain) == (b"R", True)
    ack(c, m)
    publish_ok(pub, topic, b"", qos=1, retain=True)
    bye(c, pub)


def test_outbound_aliases_reset_on_new_connection_MQTT_3_3_2_7(broker):
    """[MQTT-3.3.2-7] (broker as sender) After a reconnection the broker does not use aliases from
    the earlier connection: the first message on a topic names it again."""
    topic, me = uniq("alias7out"), cid("al7o")
    c = connect(broker.port, me, properties={PR.TOPIC_ALIAS_MAXIMUM: 5, PR.SESSION_EXPIRY_INTERVAL: 60})
    c.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"1", qos=1)
    m = recv_publish(c)
    assert (m.topic, props(m).get(PR.TOPIC_ALIAS)) == (topic, 1)
    ack(c, m)
    bye(c)
    c = connect(broker.port, me, clean_start=False, expect_present=True,
                properties={PR.TOPIC_ALIAS_MAXIMUM: 5})
    publish_ok(pub, topic, b"2", qos=1)
    m = recv_publish(c)
    assert AliasView(5).resolve(m) == topic and m.payload == b"2"
    ack(c, m)
    bye(c, pub)


def test_message_expiry_while_waiting_for_window_MQTT_3_3_2_5(broker):
    """[MQTT-3.3.2-5] A message queued behind a full Receive Maximum window (client online) that
    expires before it can be sent is deleted; later messages still come."""
    topic = uniq("expwin")
    c = connect(broker.port, properties={PR.RECEIVE_MAXIMUM: 1})
    c.subscribe(topic, qos=1)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"first", qos=1, pid=1)
    publish_ok(pub, topic, b"short", qos=1, pid=2, properties={PR.MESSAGE_EXPIRY_INTERVAL: 1})
    publish_ok(pub, topic, b"last", qos=1, pid=3)
    m = recv_publish(c)
    assert m.payload == b"first"
    time.sleep(2.2)
    ack(c, m)
    m = recv_publish(c)
    assert m.payload == b"last", "an expired message was sent"
    ack(c, m)
    bye(c, pub)


def test_retained_publish_with_topic_alias_MQTT_3_3_1_5(broker):
    """[MQTT-3.3.1-5] with 3.3.2.3.4: a retained PUBLISH naming its topic only by alias is stored
    under the alias's topic."""
    topic = uniq("retalias")
    c = connect(broker.port)
    publish_ok(c, topic, b"v1", qos=1, properties={PR.TOPIC_ALIAS: 2})
    publish_ok(c, "", b"v2", qos=1, pid=2, retain=True, properties={PR.TOPIC_ALIAS: 2})
    got = _retained(broker.port, topic)
    assert [(m.topic, m.payload) for m in got] == [(topic, b"v2")]
    publish_ok(c, topic, b"", qos=1, pid=3, retain=True)
    bye(c)


def test_topic_limits_refuse_deep_or_long_topic_names(make_broker):
    """Configured limits (abuse protection): a topic name deeper than mqtt.max_topic_levels
    or longer than mqtt.max_topic_length gets PUBACK 0x90 and is not delivered; filters get 0x8F."""
    from broker.protocol import packets as P
    from tests.mqtt_raw import RawClient
    b = make_broker({"mqtt.max_topic_levels": 4, "mqtt.max_topic_length": 32})
    c = RawClient(b.port)
    c.connect("limits")
    assert c.subscribe("#", "a/b/c/d/e", "x" * 40, qos=1).reason_codes == [1, 0x8F, 0x8F]
    c.publish("a/b/c/d/e", b"deep", qos=1, pid=1)
    assert c.recv_type(P.PUBACK).reason_code == 0x90
    c.publish("y" * 33, b"long", qos=1, pid=2)
    assert c.recv_type(P.PUBACK).reason_code == 0x90
    c.publish("a/b/c/d", b"ok", qos=1, pid=3)
    pkts = [c.recv(), c.recv()]
    assert sorted(p.type for p in pkts) == [P.PUBLISH, P.PUBACK]
    assert [p.payload for p in pkts if p.type == P.PUBLISH] == [b"ok"]
