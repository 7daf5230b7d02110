"""MQTT 5.0 section 3.3.2.3 PUBLISH properties at the sans-I/O level: Payload Format Indicator,
Message Expiry Interval (fake clock), Topic Alias both ways, Response Topic, Correlation Data,
User Properties, Content Type. Every test names the conformance statement it checks; tests that
make the broker close a connection also check that another client is still served."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.properties import encode_utf8
from tests.sansio import advance, make
from tests.sansio_pubsub import (
    AliasView,
    ack,
    assert_served,
    block,
    bye,
    connected,
    expect_disconnect,
    forge,
    props,
    publish,
    publish_ok,
    publishes,
    retained,
    subscribe,
    take,
)

# ---------------------------------------------------------------- Payload Format Indicator

def test_payload_format_indicator_forwarded_MQTT_3_3_2_4():
    """[MQTT-3.3.2-4] The Payload Format Indicator is sent unaltered (0 and 1)."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "pfi", qos=1)
    pub = connected(b)
    publish_ok(pub, "pfi", "héllo".encode(), qos=1, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    publish_ok(pub, "pfi", b"\xff\x00", qos=1, properties={PR.PAYLOAD_FORMAT_INDICATOR: 0})
    m1, m2 = publishes(sub)
    assert props(m1).get(PR.PAYLOAD_FORMAT_INDICATOR) == 1 and m1.payload == "héllo".encode()
    assert props(m2).get(PR.PAYLOAD_FORMAT_INDICATOR) == 0 and m2.payload == b"\xff\x00"
    ack(sub, m1)
    ack(sub, m2)
    bye(sub, pub)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_payload_format_invalid_0x99(qos):
    """3.3.2.3.2: PFI=1 with a non-UTF-8 payload: PUBACK/PUBREC 0x99 (DISCONNECT 0x99 at QoS 0);
    the message is not delivered."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "pfibad", qos=2)
    pub = connected(b)
    publish(pub, "pfibad", b"\xc3\x28", qos=qos, pid=4, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    if qos == 0:
        expect_disconnect(pub, rc.PAYLOAD_FORMAT_INVALID)
        assert sub.received() == []
        assert_served(b)
    else:
        a = take(pub, P.PUBACK if qos == 1 else P.PUBREC)
        assert (a.packet_id, a.reason_code) == (4, rc.PAYLOAD_FORMAT_INVALID)
        assert sub.received() == []
        publish_ok(pub, "pfibad", b"fine", qos=1, pid=5, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
        (m,) = publishes(sub)
        assert m.payload == b"fine"
        ack(sub, m)
        bye(pub)
    assert sub.received() == []
    bye(sub)


@given(payload=st.binary(max_size=64))
@settings(max_examples=80, deadline=None)
def test_payload_format_checked_as_utf8(payload):
    """3.3.2.3.2: with PFI=1 a payload is forwarded exactly when it is valid UTF-8 (PUBACK 0x00),
    otherwise PUBACK 0x99 and nothing is delivered."""
    try:
        payload.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "pf", qos=1)
    pub = connected(b)
    publish(pub, "pf", payload, qos=1, pid=1, properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    assert take(pub, P.PUBACK).reason_code == (0 if valid else rc.PAYLOAD_FORMAT_INVALID)
    assert [m.payload for m in publishes(sub)] == ([payload] if valid else [])


def test_payload_format_validation_off():
    """validate_payload_format=false: a PFI=1 non-UTF-8 payload is forwarded unaltered."""
    b, _ = make(validate_payload_format=False)
    sub = connected(b)
    subscribe(sub, "pfioff", qos=1)
    pub = connected(b)
    publish_ok(pub, "pfioff", b"\xc3\x28", qos=1, expect_code=0,
               properties={PR.PAYLOAD_FORMAT_INDICATOR: 1})
    (m,) = publishes(sub)
    assert m.payload == b"\xc3\x28" and props(m).get(PR.PAYLOAD_FORMAT_INDICATOR) == 1
    bye(sub, pub)


# ---------------------------------------------------------------- Message Expiry Interval

def test_message_expiry_deletes_copy_MQTT_3_3_2_5():
    """[MQTT-3.3.2-5] A message whose expiry passed before onward delivery started is deleted:
    a queued copy for an offline subscriber, and an expired retained message."""
    b, clock = make()
    sub = connected(b, "expsub", props={PR.SESSION_EXPIRY_INTERVAL: 300})
    subscribe(sub, "exp", qos=1)
    bye(sub)
    pub = connected(b)
    publish_ok(pub, "exp", b"short", qos=1, properties={PR.MESSAGE_EXPIRY_INTERVAL: 1})
    publish_ok(pub, "exp", b"forever", qos=1)
    publish_ok(pub, "exp/r", b"ret-short", qos=1, retain=True,
               properties={PR.MESSAGE_EXPIRY_INTERVAL: 1})
    advance(b, clock, 2.5)
    sub = connected(b, "expsub", clean=False, expect_present=True)
    (m,) = publishes(sub)
    assert m.payload == b"forever", "an expired message was delivered"
    ack(sub, m)
    assert sub.received() == []
    assert retained(b, "exp/r") == [], "an expired retained message was sent"
    bye(sub, pub)


def test_message_expiry_while_waiting_for_window_MQTT_3_3_2_5():
    """[MQTT-3.3.2-5] A message queued behind a full Receive Maximum window (client online) that
    expires before it can be sent is deleted; later messages still come."""
    b, clock = make()
    c = connected(b, props={PR.RECEIVE_MAXIMUM: 1})
    subscribe(c, "expwin", qos=1)
    pub = connected(b)
    publish_ok(pub, "expwin", b"first", qos=1, pid=1)
    publish_ok(pub, "expwin", b"short", qos=1, pid=2, properties={PR.MESSAGE_EXPIRY_INTERVAL: 1})
    publish_ok(pub, "expwin", b"last", qos=1, pid=3)
    (m,) = publishes(c)
    assert m.payload == b"first"
    advance(b, clock, 2.2)
    ack(c, m)
    (m,) = publishes(c)
    assert m.payload == b"last", "an expired message was sent"
    ack(c, m)
    bye(c, pub)


def test_message_expiry_remaining_interval_MQTT_3_3_2_6():
    """[MQTT-3.3.2-6] The forwarded Message Expiry Interval is the received value minus the time
    waited: the original for an online subscriber, lower after waiting in a queue."""
    b, clock = make()
    online = connected(b)
    subscribe(online, "expleft", qos=1)
    sub = connected(b, "explsub", props={PR.SESSION_EXPIRY_INTERVAL: 300})
    subscribe(sub, "expleft", qos=1)
    bye(sub)
    pub = connected(b)
    publish_ok(pub, "expleft", b"e", qos=1, properties={PR.MESSAGE_EXPIRY_INTERVAL: 30})
    (m,) = publishes(online)
    assert props(m)[PR.MESSAGE_EXPIRY_INTERVAL] == 30
    ack(online, m)
    advance(b, clock, 2.2)
    sub = connected(b, "explsub", clean=False, expect_present=True)
    (m,) = publishes(sub)
    assert m.payload == b"e"
    assert props(m)[PR.MESSAGE_EXPIRY_INTERVAL] == 28  # 27.8 s left, rounded up
    ack(sub, m)
    # a retained message too carries the remaining interval
    publish_ok(pub, "expleft/r", b"r", qos=1, retain=True, properties={PR.MESSAGE_EXPIRY_INTERVAL: 30})
    advance(b, clock, 2.2)
    got = retained(b, "expleft/r")
    assert len(got) == 1 and props(got[0])[PR.MESSAGE_EXPIRY_INTERVAL] == 28
    bye(sub, pub, online)


@given(interval=st.integers(1, 4000), waited=st.integers(0, 4100), fraction=st.sampled_from([0, 0.25, 0.5]))
@settings(max_examples=80, deadline=None)
def test_message_expiry_after_any_wait_MQTT_3_3_2_5_6(interval, waited, fraction):
    """[MQTT-3.3.2-5], [MQTT-3.3.2-6] For any interval and time spent queued: the message is
    delivered only while its interval has not passed, with the interval minus the time waited
    (whole seconds, rounded up); otherwise it is deleted."""
    b, clock = make()
    sub = connected(b, "q", props={PR.SESSION_EXPIRY_INTERVAL: 10000})
    subscribe(sub, "x", qos=1)
    bye(sub)
    pub = connected(b)
    publish_ok(pub, "x", b"e", qos=1, properties={PR.MESSAGE_EXPIRY_INTERVAL: interval})
    advance(b, clock, waited + fraction)
    sub = connected(b, "q", clean=False, expect_present=True)
    left = interval - (waited + fraction)
    got = [props(m)[PR.MESSAGE_EXPIRY_INTERVAL] for m in publishes(sub)]
    assert got == ([math.ceil(left)] if left > 0 else [])


# ---------------------------------------------------------------- Topic Alias (inbound)

def test_topic_alias_not_carried_over_MQTT_3_3_2_7():
    """[MQTT-3.3.2-7] Topic Alias mappings do not outlive the Network Connection: an alias
    mapped on an earlier connection is unknown (DISCONNECT 0x82)."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "alias7", qos=1)
    c = connected(b, "al7", props={PR.SESSION_EXPIRY_INTERVAL: 60})
    publish_ok(c, "alias7", b"set", qos=1, properties={PR.TOPIC_ALIAS: 3})
    publish_ok(c, "", b"use", qos=1, pid=2, properties={PR.TOPIC_ALIAS: 3})
    assert [m.payload for m in publishes(sub)] == [b"set", b"use"]
    bye(c)
    c = connected(b, "al7", clean=False, expect_present=True)
    publish(c, "", b"stale", qos=1, pid=3, properties={PR.TOPIC_ALIAS: 3})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.received() == []
    bye(sub)
    assert_served(b)


def test_topic_alias_zero_invalid_MQTT_3_3_2_8():
    """[MQTT-3.3.2-8] Topic Alias 0 is not permitted: DISCONNECT 0x94."""
    b, _ = make()
    c = connected(b)
    publish(c, "alias0", b"x", qos=1, pid=1, properties={PR.TOPIC_ALIAS: 0})
    expect_disconnect(c, rc.TOPIC_ALIAS_INVALID)
    assert_served(b)


@pytest.mark.parametrize("maximum,alias", [(5, 6), (5, 65535), (0, 1)])
def test_topic_alias_above_maximum_MQTT_3_3_2_9(maximum, alias):
    """[MQTT-3.3.2-9] A Topic Alias above the Topic Alias Maximum of CONNACK: DISCONNECT 0x94."""
    b, _ = make(topic_alias_maximum=maximum)
    c = connected(b)
    assert props(c.connack).get(PR.TOPIC_ALIAS_MAXIMUM, 0) == maximum
    publish(c, "aliasmax", b"x", qos=1, pid=1, properties={PR.TOPIC_ALIAS: alias})
    expect_disconnect(c, rc.TOPIC_ALIAS_INVALID)
    assert_served(b)


@given(maximum=st.integers(0, 65535), offset=st.integers(-2, 1) | st.none(), anywhere=st.integers(0, 65535))
@settings(max_examples=80, deadline=None)
def test_topic_alias_range_MQTT_3_3_2_8_9(maximum, offset, anywhere):
    """[MQTT-3.3.2-8], [MQTT-3.3.2-9], [MQTT-3.3.2-12] For any Topic Alias Maximum: aliases
    1..maximum are accepted, 0 and anything above is DISCONNECT 0x94 (tried at the edges of the
    range and anywhere in 0..65535)."""
    alias = anywhere if offset is None else min(max(maximum + offset, 0), 65535)
    b, _ = make(topic_alias_maximum=maximum)
    c = connected(b)
    assert props(c.connack).get(PR.TOPIC_ALIAS_MAXIMUM, 0) == maximum
    publish(c, "a", b"x", qos=1, pid=1, properties={PR.TOPIC_ALIAS: alias})
    if 1 <= alias <= maximum:
        assert take(c, P.PUBACK).reason_code == rc.NO_MATCHING_SUBSCRIBERS
    else:
        expect_disconnect(c, rc.TOPIC_ALIAS_INVALID)


def test_inbound_alias_full_range_and_remap_MQTT_3_3_2_12():
    """[MQTT-3.3.2-12] The broker accepts every alias 1..its Topic Alias Maximum; a new Topic Name
    with a mapped alias replaces the mapping."""
    b, _ = make(topic_alias_maximum=10)
    sub = connected(b)
    subscribe(sub, "t1", "t2", "t3", qos=1)
    c = connected(b)
    assert props(c.connack)[PR.TOPIC_ALIAS_MAXIMUM] == 10
    steps = [("t1", 1), ("", 1), ("t2", 10), ("", 10), ("t3", 1), ("", 1), ("", 10)]
    for i, (t, a) in enumerate(steps, 1):
        publish_ok(c, t, f"m{i}".encode(), qos=1, pid=i, expect_code=0, properties={PR.TOPIC_ALIAS: a})
    got = []
    for m in publishes(sub):
        got.append((m.topic, m.payload))
        ack(sub, m)
    assert got == [("t1", b"m1"), ("t1", b"m2"), ("t2", b"m3"), ("t2", b"m4"), ("t3", b"m5"),
                   ("t3", b"m6"), ("t2", b"m7")]
    bye(sub, c)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_inbound_alias_any_sequence_MQTT_3_3_2_12(data):
    """[MQTT-3.3.2-12] Any sequence of PUBLISHes setting, replacing and using aliases 1..maximum:
    each is delivered under the topic its alias maps at that moment."""
    maximum = data.draw(st.integers(1, 8), label="maximum")
    b, _ = make(topic_alias_maximum=maximum)
    sub = connected(b)
    subscribe(sub, "#", qos=0)
    c = connected(b)
    mapping: dict[int, str] = {}
    expected = []
    for i in range(data.draw(st.integers(1, 25), label="steps")):
        alias = data.draw(st.integers(1, maximum), label="alias")
        if alias not in mapping or data.draw(st.booleans(), label="name the topic"):
            mapping[alias] = data.draw(st.sampled_from(["a", "b/c", "d/e/f", "g"]), label="topic")
            topic = mapping[alias]
        else:
            topic = ""
        publish(c, topic, b"%d" % i, qos=0, properties={PR.TOPIC_ALIAS: alias})
        expected.append((mapping[alias], b"%d" % i))
    assert c.received() == []
    assert [(m.topic, m.payload) for m in publishes(sub)] == expected


def test_inbound_alias_unknown_with_empty_topic_0x82():
    """3.3.4 Topic Alias rule 3a: an unmapped alias with an empty Topic Name is a Protocol Error."""
    b, _ = make()
    c = connected(b)
    publish(c, "", b"x", qos=0, properties={PR.TOPIC_ALIAS: 7})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(b)


# ---------------------------------------------------------------- Topic Alias (outbound)

def test_outbound_aliases_within_client_range_MQTT_3_3_2_10():
    """[MQTT-3.3.2-10] (client side) A client must accept aliases 1..its maximum: the broker uses
    exactly that range and each alias is defined (topic sent) before it is used alone."""
    b, _ = make()
    c = connected(b, props={PR.TOPIC_ALIAS_MAXIMUM: 3})
    subscribe(c, "al10/#", qos=0)
    pub = connected(b)
    topics = [f"al10/{i}" for i in range(5)]
    for _ in range(2):
        for t in topics:
            publish(pub, t, t.encode(), qos=0)
    view = AliasView(3)
    got = []
    for m in publishes(c):
        t = view.resolve(m)
        assert m.payload == t.encode()
        got.append(t)
    assert got == topics * 2
    assert sorted(view.map) == [1, 2, 3]
    bye(c, pub)


def test_outbound_alias_never_above_client_maximum_MQTT_3_3_2_11():
    """[MQTT-3.3.2-11] Outbound aliases never exceed the client's Topic Alias Maximum; a second
    message on an aliased topic has an empty Topic Name; no aliases without a maximum."""
    b, _ = make()
    c = connected(b, props={PR.TOPIC_ALIAS_MAXIMUM: 1})
    plain = connected(b)  # no Topic Alias Maximum: no aliases at all
    for s in (c, plain):
        subscribe(s, "al11/#", qos=1)
    pub = connected(b)
    seq = ["a", "a", "b", "b", "a"]
    for i, s in enumerate(seq, 1):
        publish_ok(pub, f"al11/{s}", s.encode(), qos=1, pid=i)
    view = AliasView(1)
    ms = publishes(c)
    for m in ms:
        ack(c, m)
    assert [view.resolve(m) for m in ms] == [f"al11/{s}" for s in seq]
    assert (ms[0].topic, props(ms[0]).get(PR.TOPIC_ALIAS)) == ("al11/a", 1)
    assert (ms[1].topic, props(ms[1]).get(PR.TOPIC_ALIAS)) == ("", 1)
    assert ms[2].topic == "al11/b" and props(ms[2]).get(PR.TOPIC_ALIAS) in (None, 1)
    ms = publishes(plain)
    assert len(ms) == len(seq)
    for m in ms:
        assert m.topic.startswith("al11/") and PR.TOPIC_ALIAS not in props(m)
        ack(plain, m)
    bye(c, plain, pub)


@given(maximum=st.integers(0, 6), seq=st.lists(st.integers(0, 9), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_outbound_aliases_any_traffic_MQTT_3_3_2_10_11(maximum, seq):
    """[MQTT-3.3.2-10], [MQTT-3.3.2-11] For any client Topic Alias Maximum and any traffic: every
    alias the broker sends is within 1..maximum and defined before it is used alone, and each
    message resolves to its topic."""
    b, _ = make()
    c = connected(b, props={PR.TOPIC_ALIAS_MAXIMUM: maximum} if maximum else None)
    subscribe(c, "o/#", qos=0)
    pub = connected(b)
    for i in seq:
        publish(pub, f"o/{i}", b"%d" % i, qos=0)
    view = AliasView(maximum)
    assert [view.resolve(m) for m in publishes(c)] == [f"o/{i}" for i in seq]


def test_outbound_aliases_reset_on_new_connection_MQTT_3_3_2_7():
    """[MQTT-3.3.2-7] (broker as sender) After a reconnection the broker does not use aliases from
    the earlier connection: the first message on a topic names it again."""
    b, _ = make()
    c = connected(b, "al7o", props={PR.TOPIC_ALIAS_MAXIMUM: 5, PR.SESSION_EXPIRY_INTERVAL: 60})
    subscribe(c, "al7out", qos=1)
    pub = connected(b)
    publish_ok(pub, "al7out", b"1", qos=1)
    (m,) = publishes(c)
    assert (m.topic, props(m).get(PR.TOPIC_ALIAS)) == ("al7out", 1)
    ack(c, m)
    bye(c)
    c = connected(b, "al7o", clean=False, expect_present=True, props={PR.TOPIC_ALIAS_MAXIMUM: 5})
    publish_ok(pub, "al7out", b"2", qos=1)
    (m,) = publishes(c)
    assert AliasView(5).resolve(m) == "al7out" and m.payload == b"2"
    ack(c, m)
    bye(c, pub)


# ---------------------------------------------------------------- Response Topic, Correlation Data,
#                                                                  User Property, Content Type

def test_response_topic_must_be_utf8_MQTT_3_3_2_13():
    """[MQTT-3.3.2-13] A Response Topic that is not valid UTF-8: DISCONNECT 0x81."""
    b, _ = make()
    c = connected(b)
    bad = b"\x08" + b"\x00\x03r/\xff"
    c.send_bytes(forge(b"rt", b"x", qos=1, pid=1, block=block(bad)))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    assert_served(b)


@pytest.mark.parametrize("rt", ["reply/+", "reply/#", "#"])
def test_response_topic_without_wildcards_MQTT_3_3_2_14(rt):
    """[MQTT-3.3.2-14] A Response Topic with wildcards: DISCONNECT 0x82."""
    b, _ = make()
    sub = connected(b)
    subscribe(sub, "rtw", qos=1)
    c = connected(b)
    publish(c, "rtw", b"req", qos=1, pid=1, properties={PR.RESPONSE_TOPIC: rt})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.received() == []
    bye(sub)
    assert_served(b)


def test_content_type_must_be_utf8_MQTT_3_3_2_19():
    """[MQTT-3.3.2-19] A Content Type that is not valid UTF-8: DISCONNECT 0x81."""
    b, _ = make()
    c = connected(b)
    bad = b"\x03" + b"\x00\x02\xc3\x28"
    c.send_bytes(forge(b"ct", b"x", qos=0, block=block(bad)))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    assert_served(b)


@pytest.mark.parametrize("pid,blk", [
    (PR.RESPONSE_TOPIC, b"\x08" + encode_utf8("r1") + b"\x08" + encode_utf8("r2")),
    (PR.CORRELATION_DATA, b"\x09\x00\x01a\x09\x00\x01b"),
    (PR.CONTENT_TYPE, b"\x03" + encode_utf8("a") + b"\x03" + encode_utf8("b")),
    (PR.TOPIC_ALIAS, b"\x23\x00\x01\x23\x00\x02"),
], ids=["response-topic", "correlation-data", "content-type", "topic-alias"])
def test_property_more_than_once_protocol_error(pid, blk):
    """3.3.2.3: including Response Topic / Correlation Data / Content Type / Topic Alias more than
    once is a Protocol Error: DISCONNECT 0x82."""
    b, _ = make()
    c = connected(b)
    c.send_bytes(forge(b"dupprop", b"x", qos=1, pid=1, block=block(blk)))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(b)


FULL_PROPS = {
    PR.PAYLOAD_FORMAT_INDICATOR: 1,
    PR.RESPONSE_TOPIC: "reply/to/me",
    PR.CORRELATION_DATA: b"\x00\xff\x10corr",
    PR.USER_PROPERTY: [("b", "2"), ("a", "1"), ("b", "2"), ("a", "3"), ("ü", "")],
    PR.CONTENT_TYPE: "application/json; charset=utf-8",
}


def forward(properties: dict, payload: bytes = b'{"k": 1}') -> list:
    """Publish with `properties` at QoS 0/1/2 to subscribers at QoS 0/1/2; what they receive."""
    b, _ = make()
    subs = []
    for q in (0, 1, 2):
        s = connected(b)
        subscribe(s, "props", qos=q)
        subs.append(s)
    pub = connected(b)
    got = []
    for q in (0, 1, 2):
        publish_ok(pub, "props", payload, qos=q, pid=q + 1, properties=dict(properties))
        for s in subs:
            (m,) = publishes(s)
            got.append(m)
            ack(s, m)
    bye(pub, *subs)
    return got


@pytest.fixture
def forwarded():
    return forward(FULL_PROPS)


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


def test_content_type_forwarded_MQTT_3_3_2_20(forwarded):
    """[MQTT-3.3.2-20] The Content Type is sent unaltered to all subscribers."""
    assert {props(m).get(PR.CONTENT_TYPE) for m in forwarded} == {"application/json; charset=utf-8"}


def test_all_properties_forwarded_exactly(forwarded):
    """3.3.2.3: the forwarded property set is exactly what was published (nothing added/lost),
    at every QoS and subscription QoS."""
    assert [(m.qos, m.payload) for m in forwarded] == \
        [(min(p, s), b'{"k": 1}') for p in (0, 1, 2) for s in (0, 1, 2)]
    for m in forwarded:
        assert props(m) == FULL_PROPS


# UTF-8 Encoded Strings (1.5.4): no U+0000, no surrogates; control characters avoided (SHOULD NOT)
utf8 = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)


@given(response=utf8.filter(lambda s: s and "+" not in s and "#" not in s) | st.none(),
       correlation=st.binary(max_size=300) | st.sampled_from([b"", b"\x00" * 65535]) | st.none(),
       user=st.lists(st.tuples(utf8, utf8), max_size=12),
       content=utf8 | st.just("c" * 65535) | st.none(),
       pfi=st.sampled_from([0, 1, None]))
@settings(max_examples=40, deadline=None)
def test_properties_of_any_length_forwarded_unaltered_MQTT_3_3_2_15_to_20(
        response, correlation, user, content, pfi):
    """[MQTT-3.3.2-4], [MQTT-3.3.2-15] - [MQTT-3.3.2-18], [MQTT-3.3.2-20] Properties of any length
    (empty up to the 65535-byte maximum of their two-byte length) and User Properties of any
    number, duplicates included, reach every subscriber unaltered and in order, at every QoS."""
    sent = {k: v for k, v in {PR.PAYLOAD_FORMAT_INDICATOR: pfi, PR.RESPONSE_TOPIC: response,
                              PR.CORRELATION_DATA: correlation, PR.USER_PROPERTY: user or None,
                              PR.CONTENT_TYPE: content}.items() if v is not None}
    for m in forward(sent, b"payload"):
        assert props(m) == sent
