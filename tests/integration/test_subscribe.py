"""SUBSCRIBE / SUBACK / UNSUBSCRIBE / UNSUBACK, topic matching, $-topics, shared subscriptions and
No Local (MQTT 5.0 sections 3.8-3.11, 4.7, 4.8) through real sockets."""
from __future__ import annotations

from collections import Counter

import pytest

from broker.protocol import reason_codes as rc

from .helpers import (P, PR, RawClient, ack, assert_served, bye, cid, connect, expect_disconnect,
                      props, publish_ok, recv_publish, uniq)

pytestmark = pytest.mark.timeout(30)


def drain(c: RawClient, wait: float = 0.5) -> list:
    out = []
    while not c.nothing(wait):
        m = c.recv()
        if m.type == P.PUBLISH:
            ack(c, m)
        out.append(m)
    return out


def test_suback_granted_qos_in_order(broker):
    """[MQTT-3.8.4-1], [MQTT-3.9.3-1]: one SUBACK, one reason code per filter in order, the granted QoS."""
    base = uniq("suback")
    c = connect(broker.port)
    c.send(P.Subscribe(42, [(base + "/0", P.SubscriptionOptions(0)),
                            (base + "/2", P.SubscriptionOptions(2)),
                            (base + "/1", P.SubscriptionOptions(1))]))
    s = c.recv_type(P.SUBACK)
    assert (s.packet_id, s.reason_codes) == (42, [0, 2, 1])
    bye(c)


def test_suback_downgraded_by_maximum_qos(make_broker):
    """3.9.3: the granted QoS is at most the broker's Maximum QoS; delivery uses it."""
    b = make_broker({"mqtt.maximum_qos": 1})
    topic = uniq("subqos")
    c = connect(b.port)
    assert c.subscribe(topic, qos=2).reason_codes == [1]
    pub = connect(b.port)
    publish_ok(pub, topic, b"x", qos=1)
    assert recv_publish(c).qos == 1
    bye(c, pub)


BAD_FILTERS = ["a/#/b", "a+", "#a", "a/b#", "a/+b/c", "", "$share/g", "$share//a", "$share/g+/a",
               "$share/g#/a"]


@pytest.mark.parametrize("filt", BAD_FILTERS)
def test_invalid_filter_0x8F(broker, filt):
    """[MQTT-4.7.1-1], [MQTT-4.7.1-2], [MQTT-4.8.2-1], [MQTT-4.8.2-2]: an invalid Topic Filter
    gets 0x8F; the other filters of the same SUBSCRIBE are still granted and work."""
    good = uniq("goodfilter")
    c = connect(broker.port)
    c.send(P.Subscribe(3, [(filt, P.SubscriptionOptions(1)), (good, P.SubscriptionOptions(1))]))
    s = c.recv_type(P.SUBACK)
    assert s.reason_codes == [rc.TOPIC_FILTER_INVALID, 1]
    pub = connect(broker.port)
    publish_ok(pub, good, b"ok", qos=1, expect_code=0)
    assert recv_publish(c).payload == b"ok"
    bye(c, pub)


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
def test_invalid_filter_v311_0x80(broker, level):
    """3.1.1 [MQTT-3.9.3-2]: a refused subscription has return code 0x80."""
    c = RawClient(broker.port, level=level)
    c.connect(cid())
    s = c.subscribe("a/#/b", qos=1)
    assert s.reason_codes == [0x80]
    assert c.subscribe(uniq("v4ok"), qos=2).reason_codes == [2]
    bye(c)


@pytest.mark.parametrize("setting,filt,code,props_", [
    ("mqtt.wildcard_subscription_available", "w/+", rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, None),
    ("mqtt.wildcard_subscription_available", "w/#", rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, None),
    ("mqtt.shared_subscription_available", "$share/g/w", rc.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, None),
    ("mqtt.subscription_identifiers_available", "w", rc.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
     {PR.SUBSCRIPTION_IDENTIFIER: [3]}),
])
def test_unavailable_features_refused(make_broker, setting, filt, code, props_):
    """3.9.3: wildcard / shared / subscription identifier not available -> 0xA2 / 0x9E / 0xA1."""
    b = make_broker({setting: False})
    c = connect(b.port)
    assert c.subscribe(filt, qos=1, properties=props_).reason_codes == [code]
    assert c.subscribe("plain/topic", qos=1, pid=2).reason_codes == [1]
    bye(c)


def test_dollar_topics_not_matched_by_leading_wildcards(make_broker):
    """[MQTT-4.7.2-1]: '#' and '+' as the first level do not match topics starting with '$', live or
    retained; an explicit '$' filter does."""
    b = make_broker()
    pub = connect(b.port)
    publish_ok(pub, "$app/x", b"ret", qos=1, retain=True)
    hash_, plus, dollar = connect(b.port), connect(b.port), connect(b.port)
    hash_.subscribe("#", qos=1)
    plus.subscribe("+/x", qos=1)
    dollar.subscribe("$app/#", qos=1)
    m = recv_publish(dollar)
    assert (m.topic, m.payload, m.retain) == ("$app/x", b"ret", True)
    ack(dollar, m)
    publish_ok(pub, "$app/x", b"live", qos=1, expect_code=0)
    publish_ok(pub, "app/x", b"normal", qos=1, pid=2, expect_code=0)
    assert recv_publish(dollar).payload == b"live"
    for c in (hash_, plus):
        got = [m.topic for m in drain(c)]
        assert got == ["app/x"], got
    assert drain(dollar, 0.3) == []
    bye(pub, hash_, plus, dollar)


def test_shared_subscription_one_member_each(broker):
    """4.8.2: each message of a shared subscription goes to exactly one member of the
    group; different groups and non-shared subscribers each get every message."""
    topic = uniq("shared")
    members = [connect(broker.port) for _ in range(3)]
    for m in members:
        assert m.subscribe("$share/g1/" + topic, qos=1).reason_codes == [1]
    other_group = connect(broker.port)
    other_group.subscribe("$share/g2/" + topic, qos=1)
    plain = connect(broker.port)
    plain.subscribe(topic, qos=1)
    pub = connect(broker.port)
    n = 30
    for i in range(n):
        publish_ok(pub, topic, b"%d" % i, qos=1, pid=i + 1, expect_code=0)
    per_member = [[x.payload for x in drain(m)] for m in members]
    everything = Counter(p for got in per_member for p in got)
    assert everything == Counter(b"%d" % i for i in range(n)), "a message went to 0 or 2+ members"
    assert all(per_member), f"a member got nothing: {[len(g) for g in per_member]}"
    assert [x.payload for x in drain(other_group)] == [b"%d" % i for i in range(n)]
    assert [x.payload for x in drain(plain)] == [b"%d" % i for i in range(n)]
    bye(pub, plain, other_group, *members)


def test_shared_subscription_member_leaves(broker):
    """4.8.2: when a member disconnects (session ends) the remaining members get every message."""
    topic = uniq("sharedleave")
    a, b = connect(broker.port), connect(broker.port)
    a.subscribe("$share/g/" + topic, qos=1)
    b.subscribe("$share/g/" + topic, qos=1)
    bye(b)
    pub = connect(broker.port)
    for i in range(5):
        publish_ok(pub, topic, b"%d" % i, qos=1, pid=i + 1)
    assert [x.payload for x in drain(a)] == [b"%d" % i for i in range(5)]
    bye(a, pub)


def test_shared_subscription_no_retained(broker):
    """3.3.1.3: retained messages are not sent for a new shared subscription."""
    topic = uniq("sharedret")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"r", qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe("$share/g/" + topic, qos=1)
    assert c.nothing(0.5)
    publish_ok(pub, topic, b"", qos=1, retain=True)
    bye(c, pub)


def test_shared_subscription_no_local_protocol_error(broker):
    """[MQTT-3.8.3-4]: No Local on a shared subscription is a Protocol Error: DISCONNECT 0x82."""
    c = connect(broker.port)
    c.send(P.Subscribe(1, [("$share/g/" + uniq("nl"), P.SubscriptionOptions(1, no_local=True))]))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


def test_no_local(broker):
    """[MQTT-3.8.3-3]: No Local 1: the client's own messages are not sent back to it; others are.
    Without No Local they are."""
    topic = uniq("nolocal")
    nl, loc = connect(broker.port), connect(broker.port)
    nl.subscribe(topic, qos=1, no_local=True)
    loc.subscribe(topic, qos=1)
    publish_ok(nl, topic, b"from-nl", qos=1, expect_code=0)
    publish_ok(loc, topic, b"from-loc", qos=1, expect_code=0)
    assert [x.payload for x in drain(nl)] == [b"from-loc"]
    assert [x.payload for x in drain(loc)] == [b"from-nl", b"from-loc"]
    bye(nl, loc)


def test_no_local_with_overlapping_subscriptions(broker):
    """[MQTT-3.8.3-3] with [MQTT-3.3.4-2]: a matching subscription without No Local still delivers
    the client's own message, at that subscription's QoS."""
    base = uniq("nlover")
    c = connect(broker.port)
    c.subscribe(base + "/#", qos=2, pid=1, no_local=True)
    c.subscribe(base + "/a", qos=1, pid=2)
    publish_ok(c, base + "/a", b"own", qos=2)
    got = drain(c)
    assert [(x.payload, x.qos) for x in got] == [(b"own", 1)]
    publish_ok(c, base + "/b", b"own-b", qos=2, pid=2, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert drain(c, 0.3) == []
    bye(c)


def test_subscribe_replaces_existing(broker):
    """[MQTT-3.8.4-3]: a SUBSCRIBE with an existing filter replaces it (new QoS), one copy only."""
    topic = uniq("replace")
    c = connect(broker.port)
    c.subscribe(topic, qos=0)
    c.subscribe(topic, qos=2, pid=2)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"x", qos=2)
    got = drain(c)
    assert [(x.payload, x.qos) for x in got] == [(b"x", 2)]
    bye(c, pub)


def test_unsubscribe_codes(broker):
    """[MQTT-3.10.4-4], [MQTT-3.11.3-1]: UNSUBACK 0x00 for an existing subscription, 0x11 for none,
    in order; after it no more messages."""
    topic = uniq("unsub")
    c = connect(broker.port)
    c.subscribe(topic, qos=1)
    c.send(P.Unsubscribe(8, [topic, topic + "/none", topic]))
    u = c.recv_type(P.UNSUBACK)
    assert (u.packet_id, u.reason_codes) == (8, [rc.SUCCESS, rc.NO_SUBSCRIPTION_EXISTED,
                                                 rc.NO_SUBSCRIPTION_EXISTED])
    pub = connect(broker.port)
    publish_ok(pub, topic, b"x", qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert c.nothing(0.4)
    bye(c, pub)


def test_unsubscribe_v311(broker):
    """3.1.1: UNSUBACK (no reason codes) and the subscription is gone."""
    topic = uniq("unsub4")
    c = RawClient(broker.port, level=P.MQTT_311)
    c.connect(cid())
    c.subscribe(topic, qos=1)
    c.send(P.Unsubscribe(9, [topic]))
    assert c.recv_type(P.UNSUBACK).packet_id == 9
    pub = connect(broker.port)
    publish_ok(pub, topic, b"x", qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert c.nothing(0.4)
    bye(c, pub)


def test_unsubscribe_shared(broker):
    """3.10.4: a shared subscription is removed by its full '$share/...' filter."""
    topic = uniq("unsubshare")
    c = connect(broker.port)
    c.subscribe("$share/g/" + topic, qos=1)
    c.send(P.Unsubscribe(2, ["$share/g/" + topic]))
    assert c.recv_type(P.UNSUBACK).reason_codes == [0]
    pub = connect(broker.port)
    publish_ok(pub, topic, b"x", qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    bye(c, pub)


def test_subscription_identifier_survives_resume(broker):
    """3.8.2.1.2: a subscription's identifier is part of the session and still sent after resume."""
    topic, me = uniq("sidres"), cid("sidres")
    c = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    c.subscribe(topic, qos=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [99]})
    bye(c)
    c = connect(broker.port, me, clean_start=False, expect_present=True)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"x", qos=1, expect_code=0)
    m = recv_publish(c)
    assert props(m)[PR.SUBSCRIPTION_IDENTIFIER] == [99]
    bye(c, pub)


def test_retained_sent_with_subscription_identifier(broker):
    """[MQTT-3.3.4-3] for retained messages sent on SUBSCRIBE."""
    topic = uniq("sidret")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"r", qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [5]})
    m = recv_publish(c)
    assert m.retain and props(m)[PR.SUBSCRIPTION_IDENTIFIER] == [5]
    publish_ok(pub, topic, b"", qos=1, retain=True)
    bye(c, pub)


MATCHING = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/x", True),
    ("sport/tennis/#", "sport/tennis", True),
    ("sport/tennis/#", "sport/tennisx", False),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "finance", True),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("a/b", "a/b/", False),
    ("A/b", "a/b", False),
    ("+/+/#", "a/b", True),
    ("+/#", "a", True),
    ("/#", "/", True),
    ("$tst/#", "$tst/x", True),
    ("$tst/+", "$tst/x", True),
    ("+/x", "$tst/x", False),
    ("#", "$tst", False),
    ("a/ü/+", "a/ü/ß", True),
]


@pytest.fixture(scope="module")
def matching_broker(tmp_path_factory):
    """A broker of its own: the '$' cases subscribe to '#' and publish at the root."""
    from tests.conftest import BrokerProcess
    b = BrokerProcess(tmp_path_factory.mktemp("matching")).start()
    yield b
    b.stop()


@pytest.mark.parametrize("filt,topic,match", MATCHING, ids=[f"{f}|{t}" for f, t, _ in MATCHING])
def test_topic_filter_matching(matching_broker, filt, topic, match):
    """4.7.1-4.7.2 (examples of the standard): a filter matches exactly the topics it should, for
    live and for retained messages; '$' rules apply at the first level."""
    port = matching_broker.port
    base = "" if "$" in filt + topic else uniq("m") + "/"
    pub = connect(port)
    publish_ok(pub, base + topic, b"retained", qos=1, retain=True)
    c = connect(port)
    c.subscribe(base + filt, qos=1)
    got = [(x.topic, x.payload) for x in drain(c, 0.3)]
    publish_ok(pub, base + topic, b"live", qos=1)
    got += [(x.topic, x.payload) for x in drain(c, 0.3)]
    want = [(base + topic, b"retained"), (base + topic, b"live")] if match else []
    assert got == want
    publish_ok(pub, base + topic, b"", qos=1, retain=True)
    bye(c, pub)
