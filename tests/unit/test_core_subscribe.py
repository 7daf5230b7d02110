"""SUBSCRIBE / SUBACK / UNSUBSCRIBE / UNSUBACK, topic matching, $-topics, shared subscriptions and
No Local (MQTT 5.0 sections 3.8-3.11, 4.7, 4.8) through the sans-I/O core: packets into
Connections, packets out, no sockets (moved from tests/integration/test_subscribe.py, which
keeps a socket smoke set)."""
from __future__ import annotations

from collections import Counter

import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from tests.sansio import Client, make, publish_ok
from tests.sansio_pubsub import take

V3, V4, V5 = P.MQTT_31, P.MQTT_311, P.MQTT_5
O = P.SubscriptionOptions


# ---------------------------------------------------------------- peers

def connected(b, cid: str, level: int = V5, clean: bool = True, props=None,
              expect_present: bool | None = None) -> Client:
    """A connected Client; asserts the CONNACK accepted it."""
    c = Client(b, level)
    ack = c.connect(cid, clean=clean, props=props)
    assert ack.reason_code == 0, ack
    if expect_present is not None:
        assert ack.session_present is expect_present, ack
    return c


def subscribe(c: Client, *filters, qos: int = 0, pid: int = 1, props=None, **opts) -> P.Suback:
    """SUBSCRIBE; returns the SUBACK (what follows it, e.g. retained messages, stays pending)."""
    c.send(P.Subscribe(pid, [(f, O(qos, **opts)) for f in filters], props))
    return take(c, P.SUBACK)


def drain(c: Client) -> list:
    """Everything the broker sent, completing each outbound flow (PUBACK, PUBREC -> PUBREL ->
    PUBCOMP) the way a client does; the PUBRELs are not returned."""
    out = []
    while True:
        pkts = c.received()
        if not pkts:
            return out
        for m in pkts:
            if m.type == P.PUBLISH and m.qos == 1:
                c.send(P.Ack(P.PUBACK, m.packet_id))
            elif m.type == P.PUBLISH and m.qos == 2:
                c.send(P.Ack(P.PUBREC, m.packet_id))
            elif m.type == P.PUBREL:
                c.send(P.Ack(P.PUBCOMP, m.packet_id))
                continue
            out.append(m)


def bye(*clients: Client) -> None:
    """Normal DISCONNECT (0x00), then the socket closes (what the server does after it)."""
    for c in clients:
        c.send(P.Disconnect())
        c.conn.connection_lost()


def props(pkt) -> dict:
    return pkt.properties or {}


def assert_served(b) -> None:
    """The broker still serves other clients: a fresh subscriber gets a fresh publisher's message."""
    sub = connected(b, "alive-sub")
    assert subscribe(sub, "alive", qos=1).reason_codes == [1]
    pub = connected(b, "alive-pub")
    publish_ok(pub, "alive", b"still-alive", qos=1, expect_code=0)
    (m,) = drain(sub)
    assert (m.topic, m.payload, m.qos) == ("alive", b"still-alive", 1)
    bye(sub, pub)


# ---------------------------------------------------------------- SUBACK

def test_suback_granted_qos_in_order_MQTT_3_8_4_1():
    """[MQTT-3.8.4-1], [MQTT-3.9.3-1]: one SUBACK, one reason code per filter in order, the granted QoS."""
    b, _ = make()
    c = connected(b, "c")
    c.send(P.Subscribe(42, [("s/0", O(0)), ("s/2", O(2)), ("s/1", O(1))]))
    (s,) = c.received()
    assert s.type == P.SUBACK and (s.packet_id, s.reason_codes) == (42, [0, 2, 1])


def test_suback_downgraded_by_maximum_qos_MQTT_3_2_2_10():
    """[MQTT-3.2.2-10], 3.9.3: the granted QoS is at most the broker's Maximum QoS; delivery uses it."""
    b, _ = make(maximum_qos=1)
    c = connected(b, "c")
    assert subscribe(c, "t", qos=2).reason_codes == [1]
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"x", qos=1)
    (m,) = drain(c)
    assert m.qos == 1


# ("" is a malformed SUBSCRIBE, as in Mosquitto: test_zero_length_filter_is_malformed_MQTT_4_7_3_1)
BAD_FILTERS = ["a/#/b", "a+", "#a", "a/b#", "a/+b/c", "$share/g", "$share//a", "$share/g+/a",
               "$share/g#/a"]


@pytest.mark.parametrize("filt", BAD_FILTERS)
def test_invalid_filter_0x8F_MQTT_4_7_1_1(filt):
    """[MQTT-4.7.1-1], [MQTT-4.7.1-2], [MQTT-4.8.2-1], [MQTT-4.8.2-2]: an invalid Topic Filter
    gets 0x8F; the other filters of the same SUBSCRIBE are still granted and work."""
    b, _ = make()
    c = connected(b, "c")
    c.send(P.Subscribe(3, [(filt, O(1)), ("good", O(1))]))
    (s,) = c.received()
    assert (s.packet_id, s.reason_codes) == (3, [rc.TOPIC_FILTER_INVALID, 1])
    pub = connected(b, "pub")
    publish_ok(pub, "good", b"ok", qos=1, expect_code=0)
    assert [m.payload for m in drain(c)] == [b"ok"]


@pytest.mark.parametrize("level", [V4, V3])
def test_invalid_filter_v311_0x80_MQTT_3_9_3_2(level):
    """3.1.1 [MQTT-3.9.3-2]: a refused subscription has return code 0x80."""
    b, _ = make()
    c = connected(b, "c", level)
    assert subscribe(c, "a/#/b", qos=1).reason_codes == [0x80]
    assert subscribe(c, "v4ok", qos=2, pid=2).reason_codes == [2]


@pytest.mark.parametrize("setting,filt,code,props_", [
    ("wildcard_subscription_available", "w/+", rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, None),
    ("wildcard_subscription_available", "w/#", rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, None),
    ("shared_subscription_available", "$share/g/w", rc.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, None),
    ("subscription_identifiers_available", "w", rc.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
     {PR.SUBSCRIPTION_IDENTIFIER: [3]}),
])
def test_unavailable_features_refused(setting, filt, code, props_):
    """3.9.3: wildcard / shared / subscription identifier not available -> 0xA2 / 0x9E / 0xA1."""
    b, _ = make(**{setting: False})
    c = connected(b, "c")
    assert subscribe(c, filt, qos=1, props=props_).reason_codes == [code]
    assert subscribe(c, "plain/topic", qos=1, pid=2).reason_codes == [1]


# ---------------------------------------------------------------- matching

def test_dollar_topics_not_matched_by_leading_wildcards_MQTT_4_7_2_1():
    """[MQTT-4.7.2-1]: '#' and '+' as the first level do not match topics starting with '$', live or
    retained; an explicit '$' filter does."""
    b, _ = make()
    pub = connected(b, "pub")
    publish_ok(pub, "$app/x", b"ret", qos=1, retain=True)
    hash_, plus, dollar = connected(b, "hash"), connected(b, "plus"), connected(b, "dollar")
    subscribe(hash_, "#", qos=1)
    subscribe(plus, "+/x", qos=1)
    subscribe(dollar, "$app/#", qos=1)
    (m,) = drain(dollar)
    assert (m.topic, m.payload, m.retain) == ("$app/x", b"ret", True)
    publish_ok(pub, "$app/x", b"live", qos=1, expect_code=0)
    publish_ok(pub, "app/x", b"normal", qos=1, pid=2, expect_code=0)
    assert [m.payload for m in drain(dollar)] == [b"live"]
    for c in (hash_, plus):
        got = [m.topic for m in drain(c)]
        assert got == ["app/x"], got
    assert drain(dollar) == []


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


@pytest.mark.parametrize("filt,topic,match", MATCHING, ids=[f"{f}|{t}" for f, t, _ in MATCHING])
def test_topic_filter_matching(filt, topic, match):
    """4.7.1-4.7.2 (examples of the standard): a filter matches exactly the topics it should, for
    live and for retained messages; '$' rules apply at the first level."""
    b, _ = make()
    pub = connected(b, "pub")
    publish_ok(pub, topic, b"retained", qos=1, retain=True)
    c = connected(b, "c")
    subscribe(c, filt, qos=1)
    got = [(x.topic, x.payload) for x in drain(c)]
    publish_ok(pub, topic, b"live", qos=1, pid=2)
    got += [(x.topic, x.payload) for x in drain(c)]
    want = [(topic, b"retained"), (topic, b"live")] if match else []
    assert got == want


# ---------------------------------------------------------------- shared subscriptions

def test_shared_subscription_one_member_each():
    """4.8.2: each message of a shared subscription goes to exactly one member of the
    group; different groups and non-shared subscribers each get every message."""
    b, _ = make()
    members = [connected(b, f"m{i}") for i in range(3)]
    for m in members:
        assert subscribe(m, "$share/g1/sh", qos=1).reason_codes == [1]
    other_group = connected(b, "other")
    subscribe(other_group, "$share/g2/sh", qos=1)
    plain = connected(b, "plain")
    subscribe(plain, "sh", qos=1)
    pub = connected(b, "pub")
    n = 30
    for i in range(n):
        publish_ok(pub, "sh", b"%d" % i, qos=1, pid=i + 1, expect_code=0)
    per_member = [[x.payload for x in drain(m)] for m in members]
    everything = Counter(p for got in per_member for p in got)
    assert everything == Counter(b"%d" % i for i in range(n)), "a message went to 0 or 2+ members"
    assert all(per_member), f"a member got nothing: {[len(g) for g in per_member]}"
    assert [x.payload for x in drain(other_group)] == [b"%d" % i for i in range(n)]
    assert [x.payload for x in drain(plain)] == [b"%d" % i for i in range(n)]


def test_shared_groups_name_the_groups_with_a_member_here_and_change_version_with_them():
    """4.8.2: what a routing hook (the cluster) reads to run one stream per $share group with
    members on this node: a group appears with its first member and stays while one is left;
    the version changes with every member that comes or goes, and only then."""
    b, _ = make()
    v0, groups = b.shared_groups()
    assert groups == []
    a, c = connected(b, "a"), connected(b, "c")
    subscribe(a, "$share/g/sh", qos=1)
    v1, groups = b.shared_groups()
    assert v1 != v0 and groups == [("g", "sh")]
    subscribe(c, "sh", qos=1)                      # not a $share subscription: nothing changes
    assert b.shared_groups() == (v1, [("g", "sh")])
    subscribe(c, "$share/g/sh", qos=1)
    v2, groups = b.shared_groups()
    assert v2 != v1 and groups == [("g", "sh")]
    bye(a)
    v3, groups = b.shared_groups()
    assert v3 != v2 and groups == [("g", "sh")]     # one member left
    bye(c)
    v4, groups = b.shared_groups()
    assert v4 != v3 and groups == []


def test_shared_subscription_member_leaves():
    """4.8.2: when a member disconnects (session ends) the remaining members get every message."""
    b, _ = make()
    a, other = connected(b, "a"), connected(b, "b")
    subscribe(a, "$share/g/sh", qos=1)
    subscribe(other, "$share/g/sh", qos=1)
    bye(other)
    pub = connected(b, "pub")
    for i in range(5):
        publish_ok(pub, "sh", b"%d" % i, qos=1, pid=i + 1)
    assert [x.payload for x in drain(a)] == [b"%d" % i for i in range(5)]


def test_shared_subscription_no_retained():
    """3.3.1.3: retained messages are not sent for a new shared subscription."""
    b, _ = make()
    pub = connected(b, "pub")
    publish_ok(pub, "sh", b"r", qos=1, retain=True)
    c = connected(b, "c")
    subscribe(c, "$share/g/sh", qos=1)
    assert drain(c) == []
    assert b.retained.count == 1  # it was retained: a plain subscription gets it
    plain = connected(b, "plain")
    subscribe(plain, "sh", qos=1)
    assert [(m.payload, m.retain) for m in drain(plain)] == [(b"r", True)]


def test_shared_subscription_no_local_protocol_error_MQTT_3_8_3_4():
    """[MQTT-3.8.3-4]: No Local on a shared subscription is a Protocol Error: DISCONNECT 0x82."""
    b, _ = make()
    c = connected(b, "c")
    c.send(P.Subscribe(1, [("$share/g/nl", O(1, no_local=True))]))
    (d,) = c.received()
    assert d.type == P.DISCONNECT and d.reason_code == rc.PROTOCOL_ERROR
    assert c.conn.close_requested
    c.conn.connection_lost()
    assert_served(b)


# ---------------------------------------------------------------- No Local, replacing

def test_no_local_MQTT_3_8_3_3():
    """[MQTT-3.8.3-3]: No Local 1: the client's own messages are not sent back to it; others are.
    Without No Local they are."""
    b, _ = make()
    nl, loc = connected(b, "nl"), connected(b, "loc")
    subscribe(nl, "t", qos=1, no_local=True)
    subscribe(loc, "t", qos=1)
    publish_ok(nl, "t", b"from-nl", qos=1, expect_code=0)
    publish_ok(loc, "t", b"from-loc", qos=1, expect_code=0)
    assert [x.payload for x in drain(nl)] == [b"from-loc"]
    assert [x.payload for x in drain(loc)] == [b"from-nl", b"from-loc"]


def test_no_local_with_overlapping_subscriptions_MQTT_3_3_4_2():
    """[MQTT-3.8.3-3] with [MQTT-3.3.4-2]: a matching subscription without No Local still delivers
    the client's own message, at that subscription's QoS."""
    b, _ = make()
    c = connected(b, "c")
    subscribe(c, "o/#", qos=2, pid=1, no_local=True)
    subscribe(c, "o/a", qos=1, pid=2)
    publish_ok(c, "o/a", b"own", qos=2)
    assert [(x.payload, x.qos) for x in drain(c)] == [(b"own", 1)]
    publish_ok(c, "o/b", b"own-b", qos=2, pid=2, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert drain(c) == []


def test_subscribe_replaces_existing_MQTT_3_8_4_3():
    """[MQTT-3.8.4-3]: a SUBSCRIBE with an existing filter replaces it (new QoS), one copy only."""
    b, _ = make()
    c = connected(b, "c")
    subscribe(c, "t", qos=0)
    subscribe(c, "t", qos=2, pid=2)
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"x", qos=2)
    assert [(x.payload, x.qos) for x in drain(c)] == [(b"x", 2)]


# ---------------------------------------------------------------- UNSUBSCRIBE

def test_unsubscribe_codes_MQTT_3_10_4_4():
    """[MQTT-3.10.4-4], [MQTT-3.11.3-1]: UNSUBACK 0x00 for an existing subscription, 0x11 for none,
    in order; after it no more messages."""
    b, _ = make()
    c = connected(b, "c")
    subscribe(c, "t", qos=1)
    c.send(P.Unsubscribe(8, ["t", "t/none", "t"]))
    (u,) = c.received()
    assert u.type == P.UNSUBACK
    assert (u.packet_id, u.reason_codes) == (8, [rc.SUCCESS, rc.NO_SUBSCRIPTION_EXISTED,
                                                 rc.NO_SUBSCRIPTION_EXISTED])
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"x", qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert drain(c) == []


def test_unsubscribe_of_a_filter_no_subscribe_could_make_is_0x8F_MQTT_4_7_1_1():
    """UNSUBSCRIBE of an ill-formed filter ("#/test/topic" [MQTT-4.7.1-1], "a/b+" [MQTT-4.7.1-2],
    "$share/g" [MQTT-4.8.2-1]): UNSUBACK 0x8F Topic Filter invalid, as its SUBACK would say, not
    0x11; a well-formed one that was never subscribed stays 0x11, and the connection stays up."""
    b, _ = make()
    c = connected(b, "c")
    subscribe(c, "t", qos=1)
    c.send(P.Unsubscribe(3, ["#/test/topic", "a/b+", "$share/g", "never/subscribed", "t"]))
    (u,) = c.received()
    assert u.type == P.UNSUBACK
    assert u.reason_codes == [rc.TOPIC_FILTER_INVALID] * 3 + [rc.NO_SUBSCRIPTION_EXISTED,
                                                             rc.SUCCESS]
    c.send(P.PingReq())
    assert [p.type for p in c.received()] == [P.PINGRESP]


@pytest.mark.parametrize("level", [V4, V3])
def test_unsubscribe_v311_MQTT_3_10_4_4(level):
    """3.1.1: UNSUBACK (no reason codes) and the subscription is gone."""
    b, _ = make()
    c = connected(b, "c", level)
    subscribe(c, "t", qos=1)
    c.send(P.Unsubscribe(9, ["t"]))
    (u,) = c.received()
    assert u.type == P.UNSUBACK and u.packet_id == 9
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"x", qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert drain(c) == []


def test_unsubscribe_shared_MQTT_3_10_4_1():
    """3.10.4: a shared subscription is removed by its full '$share/...' filter."""
    b, _ = make()
    c = connected(b, "c")
    subscribe(c, "$share/g/t", qos=1)
    c.send(P.Unsubscribe(2, ["$share/g/t"]))
    (u,) = c.received()
    assert u.type == P.UNSUBACK and u.reason_codes == [0]
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"x", qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert drain(c) == []


# ---------------------------------------------------------------- Subscription Identifier

def test_subscription_identifier_survives_resume():
    """3.8.2.1.2: a subscription's identifier is part of the session and still sent after resume."""
    b, _ = make()
    c = connected(b, "me", props={PR.SESSION_EXPIRY_INTERVAL: 60})
    subscribe(c, "t", qos=1, props={PR.SUBSCRIPTION_IDENTIFIER: [99]})
    bye(c)
    c = connected(b, "me", clean=False, expect_present=True)
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"x", qos=1, expect_code=0)
    (m,) = drain(c)
    assert props(m)[PR.SUBSCRIPTION_IDENTIFIER] == [99]


def test_retained_sent_with_subscription_identifier_MQTT_3_3_4_3():
    """[MQTT-3.3.4-3] for retained messages sent on SUBSCRIBE."""
    b, _ = make()
    pub = connected(b, "pub")
    publish_ok(pub, "t", b"r", qos=1, retain=True)
    c = connected(b, "c")
    subscribe(c, "t", qos=1, props={PR.SUBSCRIPTION_IDENTIFIER: [5]})
    (m,) = drain(c)
    assert m.retain and props(m)[PR.SUBSCRIPTION_IDENTIFIER] == [5]
