"""Bounds on what one client can make the broker hold or compute (sans-I/O, fake clock): User
Properties per packet (count and bytes), the retained store (count, bytes, one message's size),
offline queues in bytes (per session and all together), the default maximum packet size."""
from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.view import BrokerView
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from broker.protocol.errors import ProtocolError
from broker.protocol.properties import Limits, decode_properties, encode_properties
from settings import MQTTConfig
from tests.sansio import (
    Client,
    ack,
    assert_served,
    drain,
    expect_disconnect,
    feed,
    lose,
    make,
    nothing,
    publish,
    publish_ok,
    recv_publish,
    subscribe,
    until_closed,
)

V4, V5 = P.MQTT_311, P.MQTT_5


def test_defaults_bound_packets_properties_retained_and_queues():
    """The defaults are finite (EMQX's 1 MB packet limit; the rest: README "MQTT behaviour")."""
    c = MQTTConfig()
    assert c.maximum_packet_size == 1048576
    assert (c.max_user_properties, c.max_user_property_bytes) == (128, 65536)
    assert (c.max_retained_messages, c.max_retained_bytes, c.max_retained_message_size) == \
        (100000, 256 << 20, 1 << 20)
    assert (c.max_queued_bytes, c.max_queued_bytes_total) == (64 << 20, 512 << 20)


# ---------------------------------------------------------------- User Properties

def user_props(n: int, size: int = 0) -> dict:
    return {PR.USER_PROPERTY: [("k" * size, "") for _ in range(n)]}


def test_codec_counts_user_properties_and_stops_at_the_limit():
    block = encode_properties(user_props(5))
    assert decode_properties(block, 0, "PUBLISH", Limits(0, 5))[0] == user_props(5)
    with pytest.raises(ProtocolError) as e:
        decode_properties(block, 0, "PUBLISH", Limits(0, 4))
    assert e.value.reason_code == rc.QUOTA_EXCEEDED and "max_user_properties" in str(e.value)
    big = encode_properties(user_props(3, 100))  # 3 x (2 + 100 + 2) = 312 bytes of pairs
    assert decode_properties(big, 0, "PUBLISH", Limits(0, 0, 312))[0]
    with pytest.raises(ProtocolError, match="max_user_property_bytes"):
        decode_properties(big, 0, "PUBLISH", Limits(0, 0, 311))
    assert decode_properties(big, 0, "PUBLISH")[0] == user_props(3, 100)  # no limits given


@pytest.mark.parametrize("n,refused", [(128, False), (129, True)])
def test_publish_with_too_many_user_properties_disconnect_0x97(n, refused):
    """mqtt.max_user_properties (128): a PUBLISH with more gets DISCONNECT 0x97 Quota exceeded
    and is not delivered; the limit itself passes."""
    b, _ = make()
    sub = Client(b)
    sub.connect("s")
    subscribe(sub, "p")
    pub = Client(b)
    pub.connect("p")
    publish(pub, "p", b"x", properties=user_props(n))
    if refused:
        (d,) = until_closed(pub)
        assert (d.type, d.reason_code) == (P.DISCONNECT, rc.QUOTA_EXCEEDED)
        assert nothing(sub)
    else:
        assert len(props_of(recv_publish(sub))[PR.USER_PROPERTY]) == n


def props_of(pkt):
    return pkt.properties or {}


def test_four_million_empty_user_properties_stop_at_the_limit():
    """The hostile PUBLISH (19 MiB: 4,000,000 empty User Properties) within the packet limit it
    now has: refused after decoding 129 of them, whether it arrives whole or in pieces."""
    n = 200_000  # 1 MB of empty pairs: the most the default maximum packet size lets in
    pkt = encode(P.Publish("flood", b"", properties=user_props(n)))
    assert len(pkt) <= MQTTConfig().maximum_packet_size
    b, _ = make()
    c = Client(b)
    c.connect("flooder")
    for i in range(0, len(pkt), 65536):
        feed(c.conn, pkt[i:i + 65536])
    expect_disconnect(c, rc.QUOTA_EXCEEDED)
    assert_served(b)


def test_connect_with_too_many_user_properties_connack_0x97():
    b, _ = make()
    c = Client(b)
    c.send(P.Connect("cp", V5, properties=user_props(129)))
    (a,) = until_closed(c)
    assert (a.type, a.reason_code) == (P.CONNACK, rc.QUOTA_EXCEEDED) and "cp" not in b.sessions
    w = Client(b)
    w.send(P.Connect("wp", V5, will=P.Will("w", b"x", 0, False, user_props(129))))
    (a,) = until_closed(w)
    assert a.reason_code == rc.QUOTA_EXCEEDED


def test_unsubscribe_filters_are_bounded_like_subscribe():
    """An UNSUBSCRIBE may carry at most mqtt.max_filters_per_subscribe filters (before: any
    number, 300,000 one-character filters in 1 MB); more: DISCONNECT 0x97."""
    b, _ = make(max_filters_per_subscribe=100)
    c = Client(b)
    c.connect("u")
    c.send(P.Unsubscribe(1, ["a"] * 100))
    (ua,) = c.received()
    assert len(ua.reason_codes) == 100
    c.send(P.Unsubscribe(2, ["a"] * 101))
    expect_disconnect(c, rc.QUOTA_EXCEEDED)
    assert Decoder(V5).feed(encode(P.Unsubscribe(2, ["a"] * 101)))[0]  # no limits: decodes


def test_default_maximum_packet_size_refuses_larger_packets_0x95():
    b, _ = make()
    c = Client(b)
    c.connect("big")
    publish(c, "big", b"x" * (1 << 20))
    expect_disconnect(c, rc.PACKET_TOO_LARGE)


# ---------------------------------------------------------------- retained store

def retained_count(b):
    return b.retained.count


@pytest.mark.parametrize("qos", [1, 2])
def test_retained_count_cap_refuses_v5_qos12_with_0x97(qos):
    """mqtt.max_retained_messages: one more retained message on a new topic gets PUBACK/PUBREC
    0x97 Quota exceeded and is neither stored nor delivered; replacing or deleting an existing
    one is still allowed at the cap."""
    b, _ = make(max_retained_messages=3)
    sub = Client(b)
    sub.connect("s")
    subscribe(sub, "r/#", qos=1)
    pub = Client(b)
    pub.connect("p")
    for i in range(3):
        publish_ok(pub, f"r/{i}", b"v", qos=qos, pid=i + 1, retain=True, expect_code=0)
        ack(sub, recv_publish(sub))
    publish(pub, "r/new", b"v", qos, 9, retain=True)
    (a,) = pub.received()  # PUBACK / PUBREC >= 0x80: the flow ends there [MQTT-4.3.3-9]
    assert (a.type, a.packet_id, a.reason_code) == (P.PUBACK if qos == 1 else P.PUBREC, 9,
                                                    rc.QUOTA_EXCEEDED)
    assert nothing(sub) and retained_count(b) == 3 and b.retained.get("r/new") is None
    assert b.stats["dropped_retained_quota"] == 1
    publish_ok(pub, "r/1", b"replaced", qos=qos, pid=10, retain=True, expect_code=0)
    assert b.retained.get("r/1").payload == b"replaced"
    ack(sub, recv_publish(sub))
    publish_ok(pub, "r/2", b"", qos=qos, pid=11, retain=True, expect_code=0)  # deletes
    ack(sub, recv_publish(sub))
    publish_ok(pub, "r/new", b"v", qos=qos, pid=12, retain=True, expect_code=0)
    assert retained_count(b) == 3


@pytest.mark.parametrize("level,qos", [(V5, 0), (V4, 0), (V4, 1)])
def test_retained_over_the_cap_without_failure_code_is_delivered_not_retained(level, qos):
    """QoS 0 (any version) and MQTT 3.1.x have no failure code: the message is delivered (and
    acknowledged normally), only its retained part is dropped and counted."""
    b, _ = make(max_retained_messages=1)
    sub = Client(b)
    sub.connect("s")
    subscribe(sub, "r/#", qos=1)
    pub = Client(b, level)
    pub.connect("p")
    publish_ok(pub, "r/a", b"1", qos=qos, retain=True)
    recv_publish(sub) if qos == 0 else ack(sub, recv_publish(sub))
    publish_ok(pub, "r/b", b"2", qos=qos, retain=True, expect_code=0 if qos else None)
    m = recv_publish(sub)
    assert m.payload == b"2"
    assert b.retained.get("r/b") is None and b.stats["dropped_retained_quota"] == 1


def test_retained_bytes_and_message_size_caps():
    """mqtt.max_retained_bytes bounds payload + topic bytes of all retained messages;
    mqtt.max_retained_message_size one message's payload."""
    b, _ = make(max_retained_bytes=100, max_retained_message_size=50)
    pub = Client(b)
    pub.connect("p")
    publish_ok(pub, "a", b"x" * 50, qos=1, retain=True, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    publish_ok(pub, "b", b"x" * 51, qos=1, pid=2, retain=True, expect_code=rc.QUOTA_EXCEEDED)
    assert b.retained.bytes == 51
    publish_ok(pub, "c", b"x" * 48, qos=1, pid=3, retain=True, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert b.retained.bytes == 100
    publish_ok(pub, "d", b"x", qos=1, pid=4, retain=True, expect_code=rc.QUOTA_EXCEEDED)
    publish_ok(pub, "a", b"x" * 40, qos=1, pid=5, retain=True, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert b.retained.bytes == 90  # a replacement counts the difference
    publish_ok(pub, "c", b"", qos=1, pid=6, retain=True)
    assert b.retained.bytes == 41 and b.retained.count == 1


def test_retained_refusals_are_logged_rate_limited_and_escaped(caplog):
    b, clock = make(max_retained_messages=1)
    caplog.set_level(logging.WARNING)
    pub = Client(b)
    pub.connect("p")
    publish_ok(pub, "ok", b"v", retain=True)
    for i in range(100):
        publish_ok(pub, f"line\u2028{i}\n", b"v", retain=True)
    lines = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert 1 <= len(lines) <= 10 and b.stats["dropped_retained_quota"] == 100
    assert "line\\u20280\\x0a" in lines[0] and "mqtt.max_retained_messages 1" in lines[0]


def test_retained_will_over_the_cap_is_published_not_retained():
    b, _ = make(max_retained_messages=0, max_retained_bytes=5)
    sub = Client(b)
    sub.connect("s")
    subscribe(sub, "w/#")
    dev = Client(b)
    dev.connect("dev", will=P.Will("w/dev", b"offline", 0, True))
    lose(dev)
    assert recv_publish(sub).payload == b"offline"
    assert b.retained.get("w/dev") is None and b.stats["dropped_retained_quota"] == 1


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40)), max_size=80),
       st.integers(1, 5), st.integers(10, 200))
@settings(max_examples=200, deadline=None)
def test_retained_accounting_property(ops, max_count, max_bytes):
    """Any sequence of retained publishes and deletes: the store never holds more than its
    bounds, and its count and bytes are what it holds."""
    b, _ = make(max_retained_messages=max_count, max_retained_bytes=max_bytes)
    pub = Client(b)
    pub.connect("p")
    for topic, size in ops:
        publish(pub, f"t/{topic}", b"v" * size, retain=True)
    held = b.retained.all()
    assert len(held) == b.retained.count <= max_count
    assert sum(len(m.payload) + len(m.topic_bytes) for m in held) == b.retained.bytes <= max_bytes


# ---------------------------------------------------------------- queues in bytes

def offline_subscriber(b, cid="q", qos=1):
    s = Client(b)
    s.connect(cid, clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 3600})
    subscribe(s, "q/#", qos=qos)
    lose(s)
    return b.sessions[cid]


def test_offline_queue_is_bounded_in_bytes_per_session():
    """mqtt.max_queued_bytes: a session's queue holds at most that many payload + topic bytes;
    the newest message beyond it is dropped and counted (dropped_queue_full), as for the count."""
    b, _ = make(max_queued_bytes=1000)
    s = offline_subscriber(b)
    pub = Client(b)
    pub.connect("p")
    for i in range(5):
        publish_ok(pub, "q/1", b"x" * 297, qos=1, pid=i + 1)  # 300 bytes each with the topic
    assert len(s.queue) == 3 and s.queue_bytes == 900 and b.stats["dropped_queue_full"] == 2
    assert b.queues.used == 900


def test_all_queues_together_are_bounded():
    """mqtt.max_queued_bytes_total bounds every session's queue together (dropped_queues_total)."""
    b, _ = make(max_queued_bytes_total=1000)
    a, c = offline_subscriber(b, "a"), offline_subscriber(b, "c")
    pub = Client(b)
    pub.connect("p")
    for i in range(3):
        publish_ok(pub, "q/1", b"x" * 297, qos=1, pid=i + 1)
    # 3 messages x 2 sessions = 1,800 bytes wanted: 3 entries fit
    assert len(a.queue) + len(c.queue) == 3 and b.queues.used == 900
    assert b.stats["dropped_queues_total"] == 3


def test_queue_bytes_are_freed_when_sent_expired_or_the_session_ends():
    b, clock = make(max_queued_bytes_total=10_000)
    offline_subscriber(b, "a")
    pub = Client(b)
    pub.connect("p")
    publish_ok(pub, "q/1", b"x" * 97, qos=1, pid=1)
    publish_ok(pub, "q/1", b"y" * 97, qos=1, pid=2, properties={PR.MESSAGE_EXPIRY_INTERVAL: 5})
    assert b.queues.used == 200
    clock.t += 10
    b.tick()
    assert b.queues.used == 100  # the expired one
    back = Client(b)
    back.connect("a", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 3600})
    ack(back, recv_publish(back))
    assert b.queues.used == 0 and b.sessions["a"].queue_bytes == 0
    lose(back)
    publish_ok(pub, "q/1", b"z" * 97, qos=1, pid=3)
    assert b.queues.used == 100
    gone = Client(b)
    gone.connect("a", clean=True)  # Clean Start discards the session and its queue
    assert b.queues.used == 0


@given(st.lists(st.sampled_from(["pub", "pub_big", "connect", "lose", "ack", "expire"]),
                max_size=60))
@settings(max_examples=150, deadline=None)
def test_queue_bytes_accounting_property(ops):
    """Whatever happens, the bytes counted for all queues are the bytes the queues hold, within
    both bounds."""
    b, clock = make(max_queued_bytes=700, max_queued_bytes_total=1000, receive_maximum=65535)
    sessions = [offline_subscriber(b, f"s{i}") for i in range(2)]
    pub = Client(b)
    pub.connect("p")
    links = {}
    pid = 0
    for op in ops:
        pid = pid % 60000 + 1
        if op in ("pub", "pub_big"):
            publish(pub, "q/x", b"v" * (97 if op == "pub" else 297), qos=1, pid=pid,
                    properties={PR.MESSAGE_EXPIRY_INTERVAL: 3})
            drain(pub.conn)
        elif op == "connect" and len(links) < 2:
            cid = f"s{len(links)}"
            c = Client(b)
            c.connect(cid, clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 3600})
            links[cid] = c
        elif op == "lose" and links:
            lose(links.pop(next(iter(links))))
        elif op == "ack":
            for c in links.values():
                for m in c.received():
                    if m.type == P.PUBLISH:
                        ack(c, m)
        elif op == "expire":
            clock.t += 4
            b.tick()
        held = sum(len(m.payload) + len(m.topic_bytes)
                   for s in b.sessions.values() for (m, *_rest) in s.queue)
        assert b.queues.used == held <= 1000
        for s in sessions:
            assert s.queue_bytes <= 700


def test_stats_show_queued_and_retained_bytes():
    b, _ = make()
    offline_subscriber(b)
    pub = Client(b)
    pub.connect("p")
    publish_ok(pub, "q/1", b"abc", qos=1, retain=True)
    v = BrokerView(b).stats()
    assert v["queued_bytes"] == 6 and v["retained_bytes"] == 6
    assert v["dropped_queues_total"] == 0 and v["dropped_retained_quota"] == 0
    drain(pub.conn)


# ---------------------------------------------------------------- subscriptions: bytes and wildcard levels
def branching_filters(n: int = 1000, depth: int = 128) -> list[str]:
    """n filters of `depth` levels: their first 10 levels 'a' or '+' (each filter its own
    combination), '+' below, a last level no topic has: a PUBLISH on 'a/a/.../a/...' walks
    down every one of the n branches and matches none."""
    bits = max(1, (n - 1).bit_length())
    return ["/".join(["+" if i >> k & 1 else "a" for k in range(bits)]
                     + ["+"] * (depth - bits - 1) + ["end"]) for i in range(n)]


def count_trie_visits(monkeypatch) -> list[int]:
    """Counts the subscription trie's node visits (mqtt_topics' walk) into the list returned."""
    import mqtt_topics
    visits = [0]
    step = mqtt_topics._step

    def counted(*args):
        visits[0] += 1
        return step(*args)
    monkeypatch.setattr(mqtt_topics, "_step", counted)
    return visits


def test_a_publish_visits_a_bounded_number_of_trie_nodes_whatever_one_client_subscribes(monkeypatch):
    """A client's filters branching 1,000 ways into '+' levels (one SUBSCRIBE of 1,000 filters
    of 128 levels): before, all were stored and each PUBLISH on a new 128-level topic visited
    every branch (118,000 trie nodes, 40-90 ms: another client waited seconds for its PINGREQ).
    Now the filters beyond mqtt.max_wildcard_levels of distinct shapes get 0x97, and a PUBLISH
    visits at most max_wildcard_levels + max_topic_levels nodes."""
    cfg = MQTTConfig()
    b, _ = make(max_subscription_bytes=0)  # (the byte bound alone would refuse most of them)
    c = Client(b)
    c.connect("brancher")
    filters = branching_filters()
    codes = subscribe(c, *filters).reason_codes
    granted = codes.count(0)
    assert 0 < granted < 10 and codes == [0] * granted + [rc.QUOTA_EXCEEDED] * (1000 - granted)
    assert b.sessions["brancher"].wildcard_levels <= cfg.max_wildcard_levels
    visits = count_trie_visits(monkeypatch)
    other = Client(b)
    other.connect("other")
    for n in range(5):
        publish(c, "/".join(["a"] * 10 + [str(n)] + ["x"] * 117))
        assert nothing(c)
        other.send(P.PingReq())
        assert [p.type for p in other.received()] == [P.PINGRESP]
    assert 0 < visits[0] <= 5 * (cfg.max_wildcard_levels + cfg.max_topic_levels), visits[0]


def test_filters_differing_in_literal_levels_count_their_shape_once():
    """Wildcard levels count per distinct shape (literal levels alike): a gateway's 1,000 filters
    'site/<n>/+/cmd' are 2 levels, all granted under max_wildcard_levels 2 (998 of them: room for
    two more filters under max_subscriptions_per_client); another shape beyond
    it is refused, and room comes back when the filters of a shape are all unsubscribed."""
    b, _ = make(max_wildcard_levels=2)
    c = Client(b)
    c.connect("gw")
    sites = [f"site/{n}/+/cmd" for n in range(998)]
    assert subscribe(c, *sites).reason_codes == [0] * 998
    s = b.sessions["gw"]
    assert (s.wildcard_levels, s.shapes) == (2, {"//+/": 998})
    codes = subscribe(c, "+/x", "a/+/#", "a/b/#", "plain/topic", pid=2).reason_codes
    assert codes == [rc.QUOTA_EXCEEDED, rc.QUOTA_EXCEEDED, 0, 0]  # '#' alone adds no level
    c.send(P.Unsubscribe(3, sites[:997] + ["a/b/#"]))
    c.received()
    assert subscribe(c, "+/x", pid=4).reason_codes == [rc.QUOTA_EXCEEDED]
    c.send(P.Unsubscribe(5, sites[997:]))
    c.received()
    assert subscribe(c, "+/x", pid=6).reason_codes == [0] and s.wildcard_levels == 2


def test_wildcard_levels_of_all_sessions_are_bounded_and_shared_shapes_count_once():
    """mqtt.max_wildcard_levels_total bounds the distinct shapes of every session together: a
    second client with other shapes is refused beyond it, one with a shape already subscribed
    is not; the room comes back when a session ends."""
    b, _ = make(max_wildcard_levels=4, max_wildcard_levels_total=4)
    one, two = Client(b), Client(b)
    one.connect("one")
    two.connect("two")
    assert subscribe(one, "+/+/+/+").reason_codes == [0]
    assert b.router.wildcard_levels == 4
    assert subscribe(two, "x/+", "a/b/c/d", "$share/g/+/+/+/+").reason_codes == \
        [rc.QUOTA_EXCEEDED, 0, 0]
    one.send(P.Disconnect(0))  # a clean session: it ends, with its subscriptions
    assert b.router.wildcard_levels == 4  # two's $share subscription of the same shape
    two.send(P.Unsubscribe(2, ["$share/g/+/+/+/+"]))
    two.received()
    assert b.router.wildcard_levels == 0 and b.router.shapes == {}
    assert subscribe(two, "x/+", pid=3).reason_codes == [0]


def test_subscription_bytes_are_bounded_per_session_and_in_total():
    """mqtt.max_subscription_bytes: the filters a session holds, in bytes (before: only their
    number was bounded: 1,000 filters of 60 KB each held 60 MB); a filter beyond gets 0x97
    (0x80 for 3.1.1), replacing one it holds is not refused, unsubscribing makes room.
    mqtt.max_subscription_bytes_total bounds all sessions' together."""
    b, _ = make(max_subscription_bytes=100, max_subscription_bytes_total=150)
    c = Client(b)
    c.connect("c")
    f40 = ["a" * 39 + str(i) for i in range(3)]
    ack = subscribe(c, *f40)
    assert ack.reason_codes == [0, 0, rc.QUOTA_EXCEEDED]
    assert "mqtt.max_subscription_bytes reached" in ack.properties[PR.REASON_STRING]
    assert b.sessions["c"].filter_bytes == 80
    assert subscribe(c, f40[0], "b" * 20, "c", qos=1, pid=2).reason_codes == [1, 1, rc.QUOTA_EXCEEDED]
    c.send(P.Unsubscribe(3, [f40[1]]))
    c.received()
    assert subscribe(c, f40[2], pid=4).reason_codes == [0]
    assert (b.sessions["c"].filter_bytes, b.router.filter_bytes) == (100, 100)
    v4 = Client(b, level=4)
    v4.connect("v4")
    assert subscribe(v4, "d" * 50, "e").reason_codes == [0, 0x80]  # 150 in total
    c.send(P.Disconnect(0))
    assert b.router.filter_bytes == 50
    assert subscribe(v4, "e", pid=2).reason_codes == [0]


def test_subscription_bound_defaults_are_finite():
    c = MQTTConfig()
    assert (c.max_subscription_bytes, c.max_subscription_bytes_total) == (64 << 10, 64 << 20)
    assert (c.max_wildcard_levels, c.max_wildcard_levels_total) == (256, 2048)
