"""MQTT 5.0 section 3.3 PUBLISH at the sans-I/O level: DUP, QoS, RETAIN, Topic Name and the
PUBLISH actions of 3.3.4 (tests/integration/test_publish.py keeps a socket smoke set). Client
packets in, broker packets out, a fake clock; every test names the conformance statement it
checks. Tests that make the broker close a connection also check that another client is still
served. Properties (3.3.2.3: aliases, expiry, forwarding) are in
test_core_publish_properties.py."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.core.hooks import Hook
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import RAW_QOS12_MAX, encode
from tests.sansio import make
from tests.sansio_pubsub import (
    AliasView,
    ack,
    assert_served,
    bye,
    connected,
    expect_disconnect,
    forge,
    props,
    publish,
    publish_ok,
    publishes,
    raw_publish,
    retained,
    subscribe,
    take,
)

# ---------------------------------------------------------------- 3.3.1.1 DUP

def test_dup_set_on_redelivery_MQTT_3_3_1_1():
    """[MQTT-3.3.1-1] A PUBLISH re-delivered on session resume has DUP=1 (first send DUP=0)."""
    b, _ = make()
    sub = connected(b, "dupsub", props={PR.SESSION_EXPIRY_INTERVAL: 300})
    subscribe(sub, "dup", qos=1)
    pub = connected(b)
    publish_ok(pub, "dup", b"m1", qos=1, expect_code=0)
    (first,) = publishes(sub)
    assert first.dup is False and first.qos == 1
    sub.conn.connection_lost()  # no PUBACK: the message stays unacknowledged
    sub = connected(b, "dupsub", clean=False, expect_present=True,
                    props={PR.SESSION_EXPIRY_INTERVAL: 0})
    (again,) = publishes(sub)
    assert again.dup is True
    assert (again.packet_id, again.payload, again.topic) == (first.packet_id, b"m1", "dup")
    ack(sub, again)
    assert sub.received() == []
    bye(sub, pub)


def test_dup_zero_for_qos0_MQTT_3_3_1_2():
    """[MQTT-3.3.1-2] QoS 0 messages from the broker have DUP=0, even when published with DUP=1
    at QoS 1 and downgraded; a client's QoS 0 PUBLISH with DUP=1 is malformed (0x81)."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "dup0", qos=0)
    pub = connected(b)
    publish(pub, "dup0", b"a", qos=0)
    publish(pub, "dup0", b"b", qos=1, pid=3, dup=True)
    assert take(pub, P.PUBACK).packet_id == 3
    assert [(m.payload, m.qos, m.dup) for m in publishes(sub)] == [(b"a", 0, False), (b"b", 0, False)]
    pub.send_bytes(raw_publish("dup0", b"bad", first=0x38))  # QoS 0, DUP 1
    expect_disconnect(pub, rc.MALFORMED_PACKET)
    assert sub.received() == [], "the malformed PUBLISH was delivered"
    bye(sub)
    assert_served(b)


@pytest.mark.parametrize("qos", [1, 2])
def test_dup_not_propagated_MQTT_3_3_1_3(qos):
    """[MQTT-3.3.1-3] The incoming DUP flag is not propagated: the first send to a subscriber has DUP=0."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "dupprop", qos=2)
    pub = connected(b)
    publish_ok(pub, "dupprop", b"d", qos=qos, pid=9, dup=True, expect_code=0)
    (m,) = publishes(sub)
    assert (m.payload, m.qos, m.dup) == (b"d", qos, False)
    ack(sub, m)
    bye(sub, pub)


class Accepted(Hook):
    """Keeps the messages the broker accepted."""
    provides = frozenset({"on_message_accepted"})

    def __init__(self):
        self.msgs = []

    def on_message_accepted(self, msg, client_id, username, protocol):
        self.msgs.append(msg)
        return True


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
@pytest.mark.parametrize("qos", [1, 2])
@pytest.mark.parametrize("payload_len", [0, 60, 200, 4000, 20000])  # Remaining Length 1, 2, 3 bytes
@pytest.mark.parametrize("dup", [False, True])
def test_forwarded_as_received_with_its_packet_id_MQTT_3_3_1_3(level, qos, payload_len, dup):
    """A QoS 1/2 PUBLISH that needs no change goes to a subscriber of its level and QoS as the
    bytes received with the subscriber's packet id (never re-encoded), DUP 0 [MQTT-3.3.1-3]: the
    same bytes an encode gives. One received with DUP=1, or larger than RAW_QOS12_MAX (its bytes
    are not kept), or retained (the retained store would hold them), is encoded afresh: the
    message's forms (one per outgoing shape) hold the received bytes only when forwarded as is."""
    b, _ = make()
    accepted = Accepted()
    b.add_hook(accepted)
    sub = connected(b, level=level)
    subscribe(sub, "as/received", qos=2)
    sub.conn.session.next_pid = 700  # the subscriber's ids differ from the publisher's
    pub = connected(b, level=level)
    payload = bytes(range(256)) * (payload_len // 256) + bytes(payload_len % 256)
    received = encode(P.Publish("as/received", payload, qos, False, dup, 300), level)
    pub.send_bytes(received)
    data = b"".join(bytes(x) for x in sub.conn.take_output())
    assert data == encode(P.Publish("as/received", payload, qos, False, False, 700), level)
    forms = [form for form, _ in accepted.msgs[-1].forms.values()]
    assert len(forms) == 1
    assert (received in forms) == (not dup and len(received) <= RAW_QOS12_MAX)
    received = encode(P.Publish("as/received", payload + b"!", qos, True, dup, 301), level)
    pub.send_bytes(received)
    data = b"".join(bytes(x) for x in sub.conn.take_output())
    assert data == encode(P.Publish("as/received", payload + b"!", qos, False, False, 701), level)
    forms = [form for form, _ in accepted.msgs[-1].forms.values()]
    assert len(forms) == 1 and received not in forms
    ((_, kept),) = b.retained_matching("as/received")
    assert kept is accepted.msgs[-1]
    bye(sub, pub)


# ---------------------------------------------------------------- 3.3.1.2 QoS

def test_qos3_is_malformed_MQTT_3_3_1_4():
    """[MQTT-3.3.1-4] Both QoS bits set: malformed, DISCONNECT 0x81; not delivered."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "qos3", qos=2)
    pub = connected(b)
    pub.send_bytes(raw_publish("qos3", b"q3", qos=1, pid=1, first=0x36))
    expect_disconnect(pub, rc.MALFORMED_PACKET)
    assert sub.received() == []
    bye(sub)
    assert_served(b)


def test_qos_above_maximum_qos_disconnect_0x9B():
    """3.3.1.2: a PUBLISH above the Maximum QoS in CONNACK gets DISCONNECT 0x9B [MQTT-3.2.2-11]."""
    b, _ = make(maximum_qos=1)
    c = connected(b)
    assert props(c.connack).get(PR.MAXIMUM_QOS) == 1
    publish_ok(c, "mq", b"ok", qos=1)
    publish(c, "mq", b"no", qos=2, pid=2)
    expect_disconnect(c, rc.QOS_NOT_SUPPORTED)
    assert_served(b)


# ---------------------------------------------------------------- 3.3.1.3 RETAIN

def test_retain_store_and_replace_MQTT_3_3_1_5():
    """[MQTT-3.3.1-5] RETAIN=1 stores the message, replacing the existing retained message."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "ret", b"v1", qos=1, retain=True)
    assert [(m.payload, m.retain) for m in retained(b, "ret")] == [(b"v1", True)]
    publish_ok(pub, "ret", b"v2", qos=1, retain=True)
    assert [(m.payload, m.retain) for m in retained(b, "ret")] == [(b"v2", True)]
    bye(pub)


def test_retain_qos0_stored():
    """3.3.1.3: a QoS 0 retained message is stored (SHOULD) and sent at QoS 0 with RETAIN=1."""
    b, _ = make()
    pub = connected(b)
    publish(pub, "ret0", b"q0", qos=0, retain=True)
    assert [(m.payload, m.retain, m.qos) for m in retained(b, "ret0")] == [(b"q0", True, 0)]
    bye(pub)


def test_retain_empty_payload_deletes_MQTT_3_3_1_6():
    """[MQTT-3.3.1-6] An empty retained payload is delivered normally but removes the retained message."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "retdel", b"keep", qos=1, retain=True)
    sub = connected(b)
    subscribe(sub, "retdel", qos=1)
    (m,) = publishes(sub)
    assert m.payload == b"keep" and m.retain
    ack(sub, m)
    publish_ok(pub, "retdel", b"", qos=1, retain=True, expect_code=0)
    (m,) = publishes(sub)  # processed normally: existing subscribers get it
    assert m.payload == b"" and m.topic == "retdel"
    ack(sub, m)
    assert retained(b, "retdel") == []
    bye(sub, pub)


def test_retain_empty_payload_not_stored_MQTT_3_3_1_7():
    """[MQTT-3.3.1-7] A zero-byte retained message is never stored (also on a topic with none)."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "retempty", b"", qos=1, retain=True)
    publish_ok(pub, "retempty/x", b"", qos=0, retain=True)
    assert retained(b, "retempty") == []
    assert retained(b, "retempty/#") == []
    assert list(b.retained.all()) == []
    bye(pub)


def test_retain_zero_leaves_retained_alone_MQTT_3_3_1_8():
    """[MQTT-3.3.1-8] RETAIN=0 neither stores nor removes/replaces a retained message."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "retkeep", b"orig", qos=1, retain=True)
    publish_ok(pub, "retkeep", b"not-retained", qos=1, retain=False)
    publish_ok(pub, "retkeep", b"", qos=1, retain=False)
    publish_ok(pub, "retnone", b"plain", qos=1, retain=False)
    assert [m.payload for m in retained(b, "retkeep")] == [b"orig"]
    assert retained(b, "retnone") == []
    bye(pub)


def test_retain_handling_0_sends_MQTT_3_3_1_9():
    """[MQTT-3.3.1-9] Retain Handling 0: retained messages sent on every SUBSCRIBE, RETAIN=1."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "rh0/a", b"A", qos=1, retain=True)
    publish_ok(pub, "rh0/b", b"B", qos=1, retain=True)
    c = connected(b)
    for _ in range(2):  # a repeated SUBSCRIBE sends them again
        subscribe(c, "rh0/+", qos=1, retain_handling=0)
        got = []
        for m in publishes(c):
            got.append((m.topic, m.payload, m.retain))
            ack(c, m)
        assert sorted(got) == [("rh0/a", b"A", True), ("rh0/b", b"B", True)]
        assert c.received() == []
    bye(c, pub)


def test_retain_handling_1_only_new_MQTT_3_3_1_10():
    """[MQTT-3.3.1-10] Retain Handling 1: sent when the subscription is new, not when it existed."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "rh1", b"R", qos=1, retain=True)
    c = connected(b)
    subscribe(c, "rh1", qos=1, retain_handling=1)
    (m,) = publishes(c)
    assert (m.payload, m.retain) == (b"R", True)
    ack(c, m)
    subscribe(c, "rh1", qos=1, retain_handling=1)  # exists now
    assert c.received() == [], "retained message sent again for an existing subscription"
    bye(c, pub)


def test_retain_handling_1_after_unsubscribe_MQTT_3_3_1_10():
    """[MQTT-3.3.1-10] Retain Handling 1: after UNSUBSCRIBE the subscription is new again."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "rh1u", b"R", qos=1, retain=True)
    c = connected(b)
    subscribe(c, "rh1u", qos=1, retain_handling=1)
    (m,) = publishes(c)
    ack(c, m)
    c.send(P.Unsubscribe(9, ["rh1u"]))
    take(c, P.UNSUBACK)
    subscribe(c, "rh1u", qos=1, retain_handling=1)
    (m,) = publishes(c)
    assert (m.payload, m.retain) == (b"R", True)
    ack(c, m)
    bye(c, pub)


def test_retain_handling_2_never_MQTT_3_3_1_11():
    """[MQTT-3.3.1-11] Retain Handling 2: retained messages are not sent; live messages are."""
    b, _ = make()
    pub = connected(b)
    publish_ok(pub, "rh2", b"R", qos=1, retain=True)
    c = connected(b)
    subscribe(c, "rh2", qos=1, retain_handling=2)
    assert c.received() == []
    publish_ok(pub, "rh2", b"live", qos=1)
    (m,) = publishes(c)
    assert (m.payload, m.retain) == (b"live", False)
    ack(c, m)
    bye(c, pub)


def test_retain_as_published_0_clears_flag_MQTT_3_3_1_12():
    """[MQTT-3.3.1-12] Retain As Published 0: forwarded messages have RETAIN=0."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "rap0", qos=1, retain_as_published=False)
    pub = connected(b)
    publish_ok(pub, "rap0", b"r", qos=1, retain=True)
    (m,) = publishes(sub)
    assert (m.payload, m.retain) == (b"r", False)
    ack(sub, m)
    bye(sub, pub)


def test_retain_as_published_1_keeps_flag_MQTT_3_3_1_13():
    """[MQTT-3.3.1-13] Retain As Published 1: RETAIN equals the flag of the received PUBLISH."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "rap1", qos=1, retain_as_published=True)
    pub = connected(b)
    publish_ok(pub, "rap1", b"r1", qos=1, retain=True)
    publish_ok(pub, "rap1", b"r0", qos=1, retain=False)
    got = []
    for m in publishes(sub):
        got.append((m.payload, m.retain))
        ack(sub, m)
    assert got == [(b"r1", True), (b"r0", False)]
    bye(sub, pub)


def test_retain_not_available_0x9A():
    """3.3.1.3: Retain Available 0 in CONNACK; a RETAIN=1 PUBLISH gets DISCONNECT 0x9A."""
    b, _ = make(retain_available=False)
    c = connected(b)
    assert props(c.connack).get(PR.RETAIN_AVAILABLE) == 0
    publish(c, "noret", b"r", qos=1, pid=1, retain=True)
    expect_disconnect(c, rc.RETAIN_NOT_SUPPORTED)
    assert retained(b, "noret") == []
    assert_served(b)


def test_retained_publish_with_topic_alias_MQTT_3_3_1_5():
    """[MQTT-3.3.1-5] with 3.3.2.3.4: a retained PUBLISH naming its topic only by alias is stored
    under the alias's topic."""
    b, _ = make()
    c = connected(b)
    publish_ok(c, "retalias", b"v1", qos=1, properties={PR.TOPIC_ALIAS: 2})
    publish_ok(c, "", b"v2", qos=1, pid=2, retain=True, properties={PR.TOPIC_ALIAS: 2})
    assert [(m.topic, m.payload) for m in retained(b, "retalias")] == [("retalias", b"v2")]
    bye(c)


# ---------------------------------------------------------------- 3.3.2.1 Topic Name

@pytest.mark.parametrize("topic", [b"bad/\xff\xfe", b"a/\xc0\xaf", b"nul/\x00/x", b"\xed\xa0\x80"],
                         ids=["invalid-bytes", "overlong", "U+0000", "surrogate"])
def test_topic_name_must_be_utf8_MQTT_3_3_2_1(topic):
    """[MQTT-3.3.2-1] A Topic Name that is not a valid UTF-8 Encoded String: DISCONNECT 0x81."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "#", qos=0)
    c = connected(b)
    c.send_bytes(forge(topic, b"utf8?", qos=1, pid=1))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    assert sub.received() == [], "the invalid PUBLISH was delivered"
    bye(sub)
    assert_served(b)


@pytest.mark.parametrize("topic", ["a/+/c", "a/#", "+", "#", "a+b"])
def test_topic_name_without_wildcards_MQTT_3_3_2_2(topic):
    """[MQTT-3.3.2-2] A Topic Name with a wildcard is refused: DISCONNECT 0x90 (Topic Name invalid),
    nothing delivered."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "a/#", "+", "#", "a+b", qos=1)
    c = connected(b)
    publish(c, topic, b"wild", qos=1, pid=1)
    seen = expect_disconnect(c, rc.TOPIC_NAME_INVALID)
    assert not [p for p in seen if p.type == P.PUBACK and p.reason_code < 0x80]
    assert sub.received() == []
    bye(sub)
    assert_served(b)


def test_topic_name_empty_without_alias_is_protocol_error():
    """3.3.2.1: a zero-length Topic Name without a Topic Alias is a Protocol Error (0x82)."""
    b, _ = make()
    c = connected(b)
    publish(c, "", b"x", qos=1, pid=1)
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(b)


def test_topic_name_matches_filter_MQTT_3_3_2_3():
    """[MQTT-3.3.2-3] The Topic Name sent to a subscriber matches its Topic Filter."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "m/+/z", "m/deep/#", qos=0)
    pub = connected(b)
    for s in ["/y/z", "/y/w", "/y/z/q", "/deep", "/deep/a/b", "/q/z", "/deeper/x"]:
        publish(pub, "m" + s, s.encode(), qos=0)
    got = []
    for m in publishes(sub):
        assert m.payload == m.topic[1:].encode()
        got.append(m.topic[1:])
    assert got == ["/y/z", "/deep", "/deep/a/b", "/q/z"]
    bye(sub, pub)


def test_topic_limits_refuse_deep_or_long_topic_names():
    """Configured limits (abuse protection): a topic name deeper than mqtt.max_topic_levels
    or longer than mqtt.max_topic_length gets PUBACK 0x90 and is not delivered; filters get 0x8F."""
    b, _ = make(max_topic_levels=4, max_topic_length=32)
    c = connected(b, "limits")
    assert subscribe(c, "#", "a/b/c/d/e", "x" * 40, qos=1) == [1, 0x8F, 0x8F]
    publish(c, "a/b/c/d/e", b"deep", qos=1, pid=1)
    assert take(c, P.PUBACK).reason_code == 0x90
    publish(c, "y" * 33, b"long", qos=1, pid=2)
    assert take(c, P.PUBACK).reason_code == 0x90
    publish(c, "a/b/c/d", b"ok", qos=1, pid=3)
    pkts = c.received()
    assert sorted(p.type for p in pkts) == [P.PUBLISH, P.PUBACK]
    assert [p.payload for p in pkts if p.type == P.PUBLISH] == [b"ok"]


# ---------------------------------------------------------------- 3.3.4 PUBLISH actions

@pytest.mark.parametrize("qos", [0, 1, 2])
def test_response_by_qos_MQTT_3_3_4_1(qos):
    """[MQTT-3.3.4-1] QoS 0: no response; QoS 1: PUBACK; QoS 2: PUBREC. Reason 0x00 when there
    are subscribers, 0x10 (No matching subscribers) when there are none."""
    b, _ = make()
    c = connected(b)
    publish(c, "resp", b"none", qos=qos, pid=10)
    if qos == 0:
        assert c.received() == []
    else:
        a = take(c, P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (10, rc.NO_MATCHING_SUBSCRIBERS)
        if qos == 2:
            c.send(P.Ack(P.PUBREL, 10))
            assert take(c, P.PUBCOMP).packet_id == 10
    sub = connected(b)
    subscribe(sub, "resp", qos=0)
    publish(c, "resp", b"some", qos=qos, pid=11)
    if qos:
        a = take(c, P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (11, rc.SUCCESS)
        if qos == 2:
            c.send(P.Ack(P.PUBREL, 11))
            assert take(c, P.PUBCOMP).reason_code == 0
    assert [m.payload for m in publishes(sub)] == [b"some"]
    assert c.received() == []
    bye(c, sub)


def test_overlapping_subscriptions_max_qos_MQTT_3_3_4_2():
    """[MQTT-3.3.4-2] Overlapping subscriptions: the message is delivered respecting the maximum QoS
    of all matching subscriptions (one copy here)."""
    b, _ = make()
    c = connected(b)
    subscribe(c, "o/#", qos=0, pid=1)
    subscribe(c, "o/+/c", qos=2, pid=2)
    subscribe(c, "o/b/c", qos=1, pid=3)
    pub = connected(b)
    publish_ok(pub, "o/b/c", b"o", qos=2)
    ms = publishes(c)
    assert [(m.payload, m.qos) for m in ms] == [(b"o", 2)], "not exactly one copy at QoS 2"
    ack(c, ms[0])
    assert c.received() == []
    bye(c, pub)


@given(granted=st.lists(st.integers(0, 2), min_size=1, max_size=4), qos=st.integers(0, 2))
@settings(max_examples=40, deadline=None)
def test_overlapping_subscriptions_any_qos_MQTT_3_3_4_2(granted, qos):
    """[MQTT-3.3.4-2] For any overlapping subscriptions of one client and any published QoS: one
    copy, at the highest QoS granted to the matching subscriptions but not above the QoS of the
    PUBLISH ([MQTT-3.8.4-8])."""
    b, _ = make()
    c = connected(b)
    filters = ["o/#", "o/+/c", "o/b/+", "o/b/c"][:len(granted)]
    for i, (f, g) in enumerate(zip(filters, granted), 1):
        assert subscribe(c, f, qos=g, pid=i) == [g]
    pub = connected(b)
    publish_ok(pub, "o/b/c", b"o", qos=qos)
    assert [(m.payload, m.qos) for m in publishes(c)] == [(b"o", min(qos, max(granted)))]


def test_subscription_identifiers_sent_MQTT_3_3_4_3():
    """[MQTT-3.3.4-3] The Subscription Identifier of the matching subscription is sent; none when
    the subscription had none."""
    b, _ = make()
    c = connected(b)
    subscribe(c, "sid/with", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [12345]})
    subscribe(c, "sid/without", qos=1, pid=2)
    pub = connected(b)
    publish_ok(pub, "sid/with", b"1", qos=1)
    publish_ok(pub, "sid/without", b"2", qos=1)
    m1, m2 = publishes(c)
    assert props(m1).get(PR.SUBSCRIPTION_IDENTIFIER) == [12345]
    assert PR.SUBSCRIPTION_IDENTIFIER not in props(m2)
    bye(c, pub)


def test_single_copy_has_all_subscription_ids_MQTT_3_3_4_4():
    """[MQTT-3.3.4-4] A single copy for overlapping subscriptions carries the Subscription
    Identifiers of all matching subscriptions that have one (also identical ones)."""
    b, _ = make()
    c = connected(b)
    subscribe(c, "s/#", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [7]})
    subscribe(c, "s/+/c", qos=0, pid=2, properties={PR.SUBSCRIPTION_IDENTIFIER: [268435455]})
    subscribe(c, "s/b/+", qos=0, pid=3, properties={PR.SUBSCRIPTION_IDENTIFIER: [7]})
    subscribe(c, "s/b/c", qos=0, pid=4)
    pub = connected(b)
    publish_ok(pub, "s/b/c", b"x", qos=1)
    (m,) = publishes(c)
    assert m.qos == 1
    assert sorted(props(m)[PR.SUBSCRIPTION_IDENTIFIER]) == [7, 7, 268435455]
    ack(c, m)
    assert c.received() == []
    bye(c, pub)


def test_each_copy_has_its_subscription_id_MQTT_3_3_4_5():
    """[MQTT-3.3.4-5] Every PUBLISH the broker sends carries the identifier of each matching
    subscription (this broker sends one copy per client; each is checked per topic)."""
    b, _ = make()
    c = connected(b)
    subscribe(c, "e/a/+", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [1]})
    subscribe(c, "e/+/b", qos=1, pid=2, properties={PR.SUBSCRIPTION_IDENTIFIER: [2]})
    pub = connected(b)
    expected = {"e/a/x": [1], "e/x/b": [2], "e/a/b": [1, 2]}
    for t in expected:
        publish_ok(pub, t, t.encode(), qos=1)
    got = {}
    for m in publishes(c):
        assert m.topic not in got, "several copies"
        got[m.topic] = sorted(props(m)[PR.SUBSCRIPTION_IDENTIFIER])
        ack(c, m)
    assert got == expected
    bye(c, pub)


def test_client_publish_with_subscription_id_MQTT_3_3_4_6():
    """[MQTT-3.3.4-6] A client PUBLISH must not contain a Subscription Identifier: DISCONNECT 0x82."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "sidpub", qos=1)
    c = connected(b)
    publish(c, "sidpub", b"x", qos=1, pid=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [5]})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.received() == []
    bye(sub)
    assert_served(b)


def test_client_exceeding_receive_maximum_MQTT_3_3_4_7():
    """[MQTT-3.3.4-7] The broker advertises Receive Maximum; a client with more unacknowledged
    QoS 2 PUBLISHes than that gets DISCONNECT 0x93."""
    b, _ = make(receive_maximum=2)
    c = connected(b)
    assert props(c.connack)[PR.RECEIVE_MAXIMUM] == 2
    for pid in (1, 2):
        publish(c, "rmax", b"x", qos=2, pid=pid)
        assert take(c, P.PUBREC).packet_id == pid
    c.send(P.Ack(P.PUBREL, 1))  # frees one slot
    assert take(c, P.PUBCOMP).packet_id == 1
    publish(c, "rmax", b"x", qos=2, pid=3)
    assert take(c, P.PUBREC).packet_id == 3
    publish(c, "rmax", b"x", qos=2, pid=4)  # third unacknowledged
    expect_disconnect(c, rc.RECEIVE_MAXIMUM_EXCEEDED)
    assert_served(b)


@given(maximum=st.integers(1, 40), extra=st.integers(0, 3))
@settings(max_examples=40, deadline=None)
def test_client_receive_maximum_boundary_MQTT_3_3_4_7(maximum, extra):
    """[MQTT-3.3.4-7] For any Receive Maximum: exactly that many unacknowledged QoS 2 PUBLISHes
    are accepted (PUBREC each); one more is DISCONNECT 0x93; PUBREL frees slots."""
    b, _ = make(receive_maximum=maximum)
    c = connected(b)
    assert props(c.connack).get(PR.RECEIVE_MAXIMUM, 65535) == maximum
    for pid in range(1, maximum + 1):
        publish(c, "rm", b"x", qos=2, pid=pid)
    assert [p.packet_id for p in c.received()] == list(range(1, maximum + 1))
    for pid in range(1, min(extra, maximum) + 1):  # free `extra` slots, fill them again
        c.send(P.Ack(P.PUBREL, pid))
        publish(c, "rm", b"x", qos=2, pid=pid)
    assert [p.type for p in c.received()] == [P.PUBCOMP, P.PUBREC] * min(extra, maximum)
    publish(c, "rm", b"x", qos=2, pid=maximum + 1)
    expect_disconnect(c, rc.RECEIVE_MAXIMUM_EXCEEDED)


def test_broker_handles_other_packets_when_client_window_full_MQTT_3_3_4_8():
    """[MQTT-3.3.4-8] (client side) Other packets are not delayed by a full Receive Maximum window:
    the broker processes PINGREQ, SUBSCRIBE, UNSUBSCRIBE, QoS 0 PUBLISH and PUBREL meanwhile."""
    b, _ = make(receive_maximum=2)
    c = connected(b)
    for pid in (1, 2):
        publish(c, "rmax8", b"x", qos=2, pid=pid)
        take(c, P.PUBREC)
    c.send(P.PingReq())
    take(c, P.PINGRESP)
    assert subscribe(c, "rmax8", qos=0, pid=20) == [0]
    publish(c, "rmax8", b"q0", qos=0)
    assert [m.payload for m in publishes(c)] == [b"q0"]
    c.send(P.Unsubscribe(21, ["rmax8"]))
    assert take(c, P.UNSUBACK).reason_codes == [0]
    for pid in (1, 2):
        c.send(P.Ack(P.PUBREL, pid))
        assert take(c, P.PUBCOMP).packet_id == pid
    bye(c)


def test_broker_respects_client_receive_maximum_MQTT_3_3_4_9():
    """[MQTT-3.3.4-9] The broker never has more unacknowledged QoS 1/2 PUBLISHes towards a client
    than its Receive Maximum; the rest are queued and sent in order as slots free."""
    b, _ = make()
    c = connected(b, props={PR.RECEIVE_MAXIMUM: 2})
    subscribe(c, "crmax", qos=2)
    pub = connected(b)
    for i in range(6):
        publish_ok(pub, "crmax", b"%d" % i, qos=1 + i % 2, pid=i + 1)
    first = publishes(c)
    assert [m.payload for m in first] == [b"0", b"1"], "more than Receive Maximum unacknowledged"
    got = [m.payload for m in first]
    outstanding = list(first)
    while len(got) < 6:
        ack(c, outstanding.pop(0))
        (m,) = publishes(c)
        got.append(m.payload)
        outstanding.append(m)
    assert got == [b"%d" % i for i in range(6)]
    for m in outstanding:
        ack(c, m)
    assert c.received() == []
    bye(c, pub)


@given(window=st.integers(1, 8), qos=st.lists(st.integers(1, 2), min_size=1, max_size=20),
       acks=st.randoms(use_true_random=False))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_client_receive_maximum_never_exceeded_MQTT_3_3_4_9(window, qos, acks):
    """[MQTT-3.3.4-9] For any Receive Maximum and any order of acknowledgements: never more
    unacknowledged QoS 1/2 PUBLISHes towards the client than its Receive Maximum, all arrive,
    in order."""
    b, _ = make()
    c = connected(b, props={PR.RECEIVE_MAXIMUM: window})
    subscribe(c, "w", qos=2)
    pub = connected(b)
    for i, q in enumerate(qos):
        publish_ok(pub, "w", b"%d" % i, qos=q, pid=i + 1)
    got, outstanding = [], []
    while True:
        new = publishes(c)
        got += [m.payload for m in new]
        outstanding += new
        assert len(outstanding) <= window
        if not outstanding:
            break
        ack(c, outstanding.pop(acks.randrange(len(outstanding))))
    assert got == [b"%d" % i for i in range(len(qos))]


def test_broker_not_delaying_other_packets_MQTT_3_3_4_10():
    """[MQTT-3.3.4-10] With the client's window full the broker still answers PINGREQ, SUBACK,
    UNSUBACK and sends QoS 0 PUBLISHes."""
    b, _ = make()
    c = connected(b, props={PR.RECEIVE_MAXIMUM: 1})
    subscribe(c, "crmax10", qos=1)
    pub = connected(b)
    publish_ok(pub, "crmax10", b"a", qos=1, pid=1)
    publish_ok(pub, "crmax10", b"b", qos=1, pid=2)
    (m,) = publishes(c)
    assert m.payload == b"a"
    c.send(P.PingReq())
    take(c, P.PINGRESP)
    assert subscribe(c, "q0", qos=0, pid=5) == [0]
    publish(pub, "q0", b"zero", qos=0)
    (z,) = publishes(c)
    assert (z.payload, z.qos) == (b"zero", 0)
    c.send(P.Unsubscribe(6, ["q0"]))
    assert take(c, P.UNSUBACK).reason_codes == [0]
    ack(c, m)
    (m,) = publishes(c)
    assert m.payload == b"b"
    ack(c, m)
    bye(c, pub)


# ---------------------------------------------------------------- sizes: Remaining Length, Maximum Packet Size

def _size(topic: str, payload_len: int, qos: int = 0, properties=None) -> int:
    return len(encode(P.Publish(topic, b"p" * payload_len, qos, packet_id=1 if qos else None,
                                properties=properties), P.MQTT_5))


# Remaining Length values where its encoding grows by a byte (2.1.4), and their neighbours
RL_EDGES = [126, 127, 128, 129, 16382, 16383, 16384, 16385, 2097151, 2097152]


@given(rl=st.sampled_from(RL_EDGES) | st.integers(30, 300), qos=st.integers(0, 2),
       delta=st.integers(-2, 2))
@settings(max_examples=60, deadline=None)
def test_inbound_maximum_packet_size_boundary_0x95(rl, qos, delta):
    """3.3 with 3.2.2.3.6: a PUBLISH of exactly the broker's Maximum Packet Size
    (advertised in CONNACK) is accepted and forwarded intact, whatever the size of its Remaining
    Length; one byte more is DISCONNECT 0x95 (Packet too large) and is not delivered."""
    fixed = _size("t", 0, qos)
    n = max(rl - (fixed - 2), 0)  # payload giving this Remaining Length (2: header + 1-byte RL)
    size = _size("t", n, qos)
    limit = size + delta
    b, _ = make(maximum_packet_size=limit)
    sub = connected(b)
    subscribe(sub, "t", qos=2)
    c = connected(b)
    assert props(c.connack)[PR.MAXIMUM_PACKET_SIZE] == limit
    payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
    publish(c, "t", payload, qos=qos, pid=1)
    if delta >= 0:
        assert [p.type for p in c.received()] == ([P.PUBACK, P.PUBREC][qos - 1:qos] if qos else [])
        (m,) = publishes(sub)
        assert m.payload == payload and m.qos == qos
    else:
        expect_disconnect(c, rc.PACKET_TOO_LARGE)
        assert sub.received() == []


@given(payload_len=st.integers(0, 400) | st.sampled_from([r - 13 for r in RL_EDGES[:8]]),
       delta=st.integers(-2, 2), qos=st.integers(0, 1))
@example(payload_len=2, delta=-1, qos=1)  # the limit once fell below the follow-up message
@settings(max_examples=60, deadline=None)
def test_outbound_maximum_packet_size_boundary_MQTT_3_1_2_25(payload_len, delta, qos):
    """[MQTT-3.1.2-25] A PUBLISH larger than the client's Maximum Packet Size is not sent to it
    (one of exactly that size is); [MQTT-3.3.2-11]: a dropped message defines no Topic Alias,
    so the next message on its topic names it."""
    topic = "big/topic"
    alias = {PR.TOPIC_ALIAS: 1}  # the broker's first send on a topic defines an alias
    size = _size(topic, payload_len, qos, alias)
    # the limit never drops below the follow-up message, which must always get through
    limit = max(size + delta, _size(topic, len(b"small"), 0, alias))
    b, _ = make()
    c = connected(b, props={PR.TOPIC_ALIAS_MAXIMUM: 5, PR.MAXIMUM_PACKET_SIZE: limit})
    subscribe(c, topic, qos=1)
    pub = connected(b)
    publish(pub, topic, b"B" * payload_len, qos=qos, pid=1)
    publish(pub, topic, b"small", qos=0)
    ms = [m for m in c.received() if m.type == P.PUBLISH]
    view = AliasView(5)
    assert [view.resolve(m) for m in ms] == [topic] * len(ms)
    if size <= limit:
        assert [m.payload for m in ms] == [b"B" * payload_len, b"small"]
        assert ms[0].topic == topic and ms[1].topic == ""
    else:
        assert [m.payload for m in ms] == [b"small"]
        assert ms[0].topic == topic
    for m in ms:
        assert len(encode(m, P.MQTT_5)) <= limit


def test_outbound_alias_not_consumed_by_dropped_oversize_message():
    """[MQTT-3.3.2-11] with [MQTT-3.1.2-25]: a message too large for the client is not sent, so it
    must not define an alias the client never saw; the next message on that topic names it."""
    b, _ = make()
    c = connected(b, props={PR.TOPIC_ALIAS_MAXIMUM: 5, PR.MAXIMUM_PACKET_SIZE: 200})
    subscribe(c, "aliasbig", qos=0)
    pub = connected(b)
    publish(pub, "aliasbig", b"B" * 500, qos=0)
    publish(pub, "aliasbig", b"small", qos=0)
    (m,) = publishes(c)
    assert m.payload == b"small"
    assert AliasView(5).resolve(m) == "aliasbig"
    bye(c, pub)
