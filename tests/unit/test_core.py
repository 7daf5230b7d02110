"""The session state machine without sockets: bytes in, bytes out, a fake clock."""
from broker.core.retain import RetainedStore
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import encode
from mqtt_topics import TopicTrie, matches, parse_shared, valid_topic_filter
from tests.sansio import Client, Clock, make  # noqa: F401 (Clock: imported from here by other tests)


def test_publish_subscribe_qos_downgrade():
    b, _ = make()
    sub, pub = Client(b), Client(b)
    sub.connect("s")
    pub.connect("p")
    sub.send(P.Subscribe(1, [("a/+", P.SubscriptionOptions(1))]))
    assert sub.received()[0].reason_codes == [1]
    pub.send(P.Publish("a/b", b"x", 2, packet_id=5))
    (rec,) = pub.received()
    assert rec.type == P.PUBREC and rec.reason_code == 0
    (msg,) = sub.received()
    assert msg.qos == 1 and msg.topic == "a/b" and not msg.dup


def test_qos2_repeat_before_pubrel_not_delivered_twice():
    b, _ = make()
    sub, pub = Client(b), Client(b)
    sub.connect("s")
    pub.connect("p")
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(2))]))
    sub.received()
    pub.send(P.Publish("t", b"once", 2, packet_id=9))
    pub.send(P.Publish("t", b"once", 2, dup=True, packet_id=9))
    assert [p.type for p in pub.received()] == [P.PUBREC, P.PUBREC]
    assert len(sub.received()) == 1
    pub.send(P.Ack(P.PUBREL, 9))
    pub.send(P.Ack(P.PUBREL, 9))
    comps = pub.received()
    assert [(c.type, c.reason_code) for c in comps] == [(P.PUBCOMP, 0), (P.PUBCOMP, 0x92)]


def test_receive_maximum_towards_client_and_resume_with_dup():
    b, clock = make()
    sub, pub = Client(b), Client(b)
    sub.connect("s", clean=True, props={PR.RECEIVE_MAXIMUM: 2, PR.SESSION_EXPIRY_INTERVAL: 100})
    pub.connect("p")
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(1))]))
    sub.received()
    for i in range(5):
        pub.send(P.Publish("t", b"%d" % i, 1, packet_id=i + 1))
    got = sub.received()
    assert [p.payload for p in got] == [b"0", b"1"]  # window of 2
    sub.send(P.PingReq())
    assert sub.received()[0].type == P.PINGRESP  # other packets still flow
    sub.send(P.Ack(P.PUBACK, got[0].packet_id))
    (third,) = sub.received()
    assert third.payload == b"2"
    # connection drops with 2 unacknowledged; resume resends them with DUP=1, in order
    sub.conn.connection_lost()
    sub2 = Client(b)
    ack = sub2.connect("s", clean=False, props={PR.RECEIVE_MAXIMUM: 10})
    assert ack.session_present
    again = sub2.received()
    assert [(p.payload, p.dup) for p in again] == [(b"1", True), (b"2", True), (b"3", False),
                                                   (b"4", False)]


def test_topic_alias_inbound_and_outbound():
    b, _ = make(topic_alias_maximum=5)
    sub, pub = Client(b), Client(b)
    sub.connect("s", props={PR.TOPIC_ALIAS_MAXIMUM: 1})
    pub.connect("p")
    sub.send(P.Subscribe(1, [("#", P.SubscriptionOptions(0))]))
    sub.received()
    pub.send(P.Publish("x/y", b"1", properties={PR.TOPIC_ALIAS: 3}))
    pub.send(P.Publish("", b"2", properties={PR.TOPIC_ALIAS: 3}))
    pub.send(P.Publish("x/z", b"3"))
    m1, m2, m3 = sub.received()
    assert (m1.topic, m1.properties) == ("x/y", {PR.TOPIC_ALIAS: 1})
    assert (m2.topic, m2.properties) == ("", {PR.TOPIC_ALIAS: 1})  # alias saves the topic bytes
    assert m3.topic == "x/z" and not m3.properties  # client maximum 1: no second alias
    pub.send(P.Publish("", b"4", properties={PR.TOPIC_ALIAS: 6}))  # above the maximum
    (d,) = pub.received()
    assert d.type == P.DISCONNECT and d.reason_code == 0x94


def test_message_expiry_remaining_interval_and_drop():
    b, clock = make()
    sub, pub = Client(b), Client(b)
    sub.connect("s", clean=True, props={PR.SESSION_EXPIRY_INTERVAL: 1000})
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(1))]))
    sub.received()
    sub.conn.connection_lost()
    pub.connect("p")
    pub.send(P.Publish("t", b"short", 1, packet_id=1, properties={PR.MESSAGE_EXPIRY_INTERVAL: 5}))
    pub.send(P.Publish("t", b"long", 1, packet_id=2, properties={PR.MESSAGE_EXPIRY_INTERVAL: 60}))
    clock.t += 10
    sub2 = Client(b)
    sub2.connect("s", clean=False)
    (m,) = sub2.received()
    assert m.payload == b"long"
    assert m.properties[PR.MESSAGE_EXPIRY_INTERVAL] == 50  # [MQTT-3.3.2-6]


def test_retained_store_replace_delete():
    b, _ = make()
    pub = Client(b)
    pub.connect("p")
    pub.send(P.Publish("r/1", b"a", retain=True))
    pub.send(P.Publish("r/1", b"b", retain=True))
    pub.send(P.Publish("r/2", b"c", retain=True))
    pub.send(P.Publish("r/2", b"", retain=True))
    pub.send(P.Publish("r/3", b"", retain=True))
    pub.send(P.Publish("r/1", b"not retained"))
    assert b.retained.count == 1
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("r/#", P.SubscriptionOptions(0))]))
    suback, m = sub.received()
    assert (m.topic, m.payload, m.retain) == ("r/1", b"b", True)


def test_will_delay_and_takeover():
    b, clock = make()
    watcher = Client(b)
    watcher.connect("w")
    watcher.send(P.Subscribe(1, [("will/#", P.SubscriptionOptions(0))]))
    watcher.received()
    dev = Client(b)
    dev.connect("d", props={PR.SESSION_EXPIRY_INTERVAL: 100},
                will=P.Will("will/d", b"gone", 0, False, {PR.WILL_DELAY_INTERVAL: 5}))
    dev.conn.connection_lost()
    b.tick(clock.t + 1)
    assert watcher.received() == []
    b.tick(clock.t + 6)
    (w,) = watcher.received()
    assert w.payload == b"gone"
    # takeover: the old connection gets DISCONNECT 0x8E
    one = Client(b)
    one.connect("dup")
    two = Client(b)
    two.connect("dup")
    (d,) = one.received()
    assert d.type == P.DISCONNECT and d.reason_code == 0x8E and one.conn.close_requested


def test_v311_and_v5_interoperate():
    b, _ = make()
    old, new = Client(b, level=4), Client(b)
    old.connect("old")
    new.connect("new")
    old.send(P.Subscribe(1, [("t", P.SubscriptionOptions(1))]))
    new.send(P.Subscribe(1, [("t", P.SubscriptionOptions(1))]))
    old.received(), new.received()
    new.send(P.Publish("t", b"from5", 1, packet_id=1, properties={PR.USER_PROPERTY: [("a", "b")]}))
    got_old = [p for p in old.received() if p.type == P.PUBLISH]
    assert got_old[0].payload == b"from5" and got_old[0].properties is None
    old.send(P.Publish("t", b"from4", 1, packet_id=1))
    got_new = [p for p in new.received() if p.type == P.PUBLISH]
    assert [p.payload for p in got_new] == [b"from5", b"from4"]


def test_topics():
    assert valid_topic_filter("a/+/#") and valid_topic_filter("+") and valid_topic_filter("#")
    assert not valid_topic_filter("a/#/b") and not valid_topic_filter("a+") and not valid_topic_filter("")
    assert parse_shared("$share/g/a/#") == ("g", "a/#")
    assert parse_shared("a/b") is None
    assert matches("sport/#", "sport") and matches("+/+", "/finance") and not matches("#", "$SYS/x")
    t = TopicTrie()
    for f in ("a/b", "a/+", "#", "+/b", "a/#", "$SYS/#", "+/+/c"):
        t.add(f, f, f)
    found = sorted(v for d in t.match("a/b") for v in d.values())
    assert found == sorted(["a/b", "a/+", "#", "+/b", "a/#"])
    assert sorted(v for d in t.match("$SYS/x") for v in d.values()) == ["$SYS/#"]
    assert sorted(v for d in t.match("a") for v in d.values()) == ["#", "a/#"]
    assert t.remove("a/+", "a/+") and not t.remove("a/+", "a/+")


def test_retained_match():
    r = RetainedStore()
    for topic in ("a", "a/b", "a/b/c", "$SYS/x", "b/b"):
        r.set(topic, topic)
    assert sorted(r.match("a/#")) == ["a", "a/b", "a/b/c"]
    assert sorted(r.match("+/b")) == ["a/b", "b/b"]
    assert "$SYS/x" not in r.match("#") and r.match("$SYS/+") == ["$SYS/x"]
    r.set("a/b", None)
    assert sorted(r.match("#")) == ["a", "a/b/c", "b/b"] and r.count == 4


def test_config_precedence_file_env_flags(tmp_path):
    """defaults < file < MQTT_BROKER_* environment < command-line flags."""
    import settings
    from broker.__main__ import build_config, parse_args
    f = tmp_path / "b.toml"
    f.write_text('[broker]\nport = 1000\n[mqtt]\nreceive_maximum = 10\nmaximum_qos = 1\n'
                 '[sink]\ntopic = "from-file"\n')
    env = {"MQTT_BROKER_PORT": "2000", "MQTT_BROKER_MQTT__RECEIVE_MAXIMUM": "20",
           "MQTT_BROKER_SINK__TOPIC": "from-env", "MQTT_BROKER_AUTH__ALLOW_ANONYMOUS": "false",
           "MQTT_BROKER_METRICS__ENABLED": "true"}
    cfg = settings.load(str(f), env=env)
    assert (cfg.port, cfg.mqtt.receive_maximum, cfg.mqtt.maximum_qos) == (2000, 20, 1)
    assert cfg.sink.topic == "from-env" and cfg.metrics.enabled is True
    assert cfg.auth.allow_anonymous is False
    import os
    old = dict(os.environ)
    os.environ.update(env)
    try:
        cfg = build_config(parse_args(["--config", str(f), "--port", "3000",
                                       "--set", "mqtt.receive_maximum=30"]))
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert (cfg.port, cfg.mqtt.receive_maximum) == (3000, 30)
    import pytest
    with pytest.raises(ValueError, match="unknown setting"):
        settings.load(None, env={"MQTT_BROKER_MQTT__NO_SUCH_KEY": "1"})


def test_match_cache_bounded_by_entries_and_bytes():
    """3000 distinct 60 KB topics (misses, then hits of a '#' subscriber) used to keep
    ~180 MB of topics in the match cache; now its total topic length stays bounded."""
    b, _ = make(match_cache_bytes=4 << 20, match_cache_entries=1000)
    pub = Client(b)
    pub.connect("p")
    long = "x" * 60000
    for i in range(3000):
        pub.send(P.Publish(f"miss/{i}/{long}", b"v"))
    assert sum(len(t) for t in b.router.cache) == b.router.cache_size == 0  # long misses: not cached
    for i in range(200):
        pub.send(P.Publish(f"short/{i}", b"v"))
    assert len(b.router.cache) == 200  # short misses are
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("#", P.SubscriptionOptions(0))]))
    sub.received()
    for i in range(3000):
        pub.send(P.Publish(f"hit/{i}/{long}", b"v"))
        assert sum(len(t) for t in b.router.cache) <= 4 << 20
    assert len(sub.received()) == 3000
    for i in range(3000):
        pub.send(P.Publish(f"h/{i}", b"v"))
        assert len(b.router.cache) <= 1000
    assert len(sub.received()) == 3000


def test_match_cache_default_bound():
    b, _ = make()
    pub = Client(b)
    pub.connect("p")
    long = "y" * 60000
    for i in range(3000):
        pub.send(P.Publish(f"t/{i}/{long}", b"v"))
    assert sum(len(t) for t in b.router.cache) <= 16 << 20


# ---------------------------------------------------------------- SUBSCRIBE de-dup, retained replay

def _retained(b, n, size=10, qos=0, prefix="r"):
    pub = Client(b)
    pub.connect(f"pub-{prefix}")
    for i in range(n):
        pub.send(P.Publish(f"{prefix}/{i}", bytes([i % 256]) * size, qos, True, False, i + 1 if qos else None))
    pub.received()
    return pub


def test_repeated_filter_replays_retained_once_with_last_options():
    """[MQTT-3.8.4-3]: each repeat replaces the previous; the SUBACK has one code per filter
    but the retained messages are sent once per distinct filter, at the last options."""
    b, _ = make()
    _retained(b, 3, qos=1)
    sub = Client(b)
    sub.connect("s")
    topics = [("r/#", P.SubscriptionOptions(0))] * 998 + [("r/#", P.SubscriptionOptions(1)),
                                                           ("r/1", P.SubscriptionOptions(0))]
    sub.send(P.Subscribe(1, topics))
    suback, *pubs = sub.received()
    assert suback.reason_codes == [0] * 998 + [1, 0]
    assert sorted((p.topic, p.qos, p.retain) for p in pubs) == \
        [("r/0", 1, True), ("r/1", 0, True), ("r/1", 1, True), ("r/2", 1, True)]
    assert len(sub.conn.session.subscriptions) == 2 and b.router.count == 2
    # Retain Handling of the last occurrence wins: 0 then 2 -> nothing; 2 then 0 -> sent
    sub.send(P.Subscribe(2, [("r/0", P.SubscriptionOptions(0, retain_handling=0)),
                             ("r/0", P.SubscriptionOptions(0, retain_handling=2))]))
    assert [p.type for p in sub.received()] == [P.SUBACK]
    sub.send(P.Subscribe(3, [("r/2", P.SubscriptionOptions(0, retain_handling=2)),
                             ("r/2", P.SubscriptionOptions(0, retain_handling=0))]))
    assert [(p.type, getattr(p, "topic", None)) for p in sub.received()] == [(P.SUBACK, None), (P.PUBLISH, "r/2")]
    # Retain Handling 1 repeated for a new filter: sent once (new before this SUBSCRIBE)
    sub.send(P.Subscribe(4, [("r/+", P.SubscriptionOptions(0, retain_handling=1))] * 5))
    suback, *pubs = sub.received()
    assert suback.reason_codes == [0] * 5 and sorted(p.topic for p in pubs) == ["r/0", "r/1", "r/2"]
    sub.send(P.Subscribe(5, [("r/+", P.SubscriptionOptions(0, retain_handling=1))] * 2))
    assert [p.type for p in sub.received()] == [P.SUBACK]


def test_max_subscriptions_per_client_quota_exceeded():
    b, _ = make(max_subscriptions_per_client=3)
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("a", P.SubscriptionOptions(0)), ("b", P.SubscriptionOptions(1)),
                             ("a", P.SubscriptionOptions(1)), ("c", P.SubscriptionOptions(0)),
                             ("d", P.SubscriptionOptions(0)), ("e", P.SubscriptionOptions(0))]))
    assert sub.received()[0].reason_codes == [0, 1, 1, 0, 0x97, 0x97]
    sub.send(P.Subscribe(2, [("c", P.SubscriptionOptions(1))]))  # replacing one is not a new one
    assert sub.received()[0].reason_codes == [1]
    v4 = Client(b, level=4)
    v4.connect("v4")
    v4.send(P.Subscribe(1, [("a", P.SubscriptionOptions(0))] + [(f"x{i}", P.SubscriptionOptions(0)) for i in range(3)]))
    assert v4.received()[0].reason_codes == [0, 0, 0, 0x80]


def test_retained_replay_is_paced_and_waits_while_paused():
    """Many large retained messages: written a burst per turn (take_output), nothing while the
    transport is paused, every one exactly once in the end."""
    from broker.core.session import RETAINED_BURST
    b, _ = make()
    _retained(b, 40, size=100_000)
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("r/#", P.SubscriptionOptions(0))]))
    first = b"".join(bytes(x) for x in sub.conn.out)
    assert RETAINED_BURST <= len(first) < RETAINED_BURST + 200_000  # one burst, not 4 MB
    sub.conn.paused = True
    seen = sub.received()  # takes the first burst; paused: no refill
    assert not sub.conn.out and sub.conn.session.feeds  # the rest waits
    sub.conn.resume_writing()
    while sub.conn.out:
        seen += sub.received()
    assert seen[0].type == P.SUBACK
    assert sorted(p.topic for p in seen[1:]) == sorted(f"r/{i}" for i in range(40))
    assert all(p.retain and len(p.payload) == 100_000 for p in seen[1:])
    assert not sub.conn.session.feeds


def test_retained_replay_qos1_respects_receive_maximum_and_skips_replaced():
    b, _ = make()
    pub = _retained(b, 20, qos=1)
    sub = Client(b)
    sub.connect("s", props={PR.RECEIVE_MAXIMUM: 5})
    sub.send(P.Subscribe(1, [("r/#", P.SubscriptionOptions(1))]))
    suback, *pubs = sub.received()
    assert len(pubs) == 5  # [MQTT-3.3.4-9]
    # a retained message replaced meanwhile: the new one is routed live, the old one not replayed
    pub.send(P.Publish("r/19", b"new", 1, True, False, 99))
    pub.received()
    pending = sub.conn.session.queue  # the live one waits for the window like any QoS 1
    got = list(pubs)
    while len(got) < 40:
        for p in pubs:
            sub.send(P.Ack(P.PUBACK, p.packet_id))
        pubs = sub.received()
        if not pubs:
            break
        got += pubs
    r19 = [p.payload for p in got if p.topic == "r/19"]
    assert r19 == [b"new"], r19
    assert sorted(p.topic for p in got) == sorted(f"r/{i}" for i in range(20))
    assert not pending


def test_retained_replay_left_on_disconnect_goes_to_the_queue():
    b, _ = make()
    _retained(b, 10, qos=1)
    sub = Client(b)
    sub.connect("s", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100, PR.RECEIVE_MAXIMUM: 2})
    sub.send(P.Subscribe(1, [("r/#", P.SubscriptionOptions(1))]))
    suback, *pubs = sub.received()
    assert len(pubs) == 2
    sub.conn.connection_lost()
    s = b.sessions["s"]
    assert not s.feeds and len(s.queue) == 8
    again = Client(b)
    ack = again.connect("s", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100})
    assert ack.session_present
    got = again.received()
    assert sorted(p.topic for p in got) == sorted(f"r/{i}" for i in range(10))


def test_max_filters_per_subscribe_disconnects_0x97():
    b, _ = make(max_filters_per_subscribe=100)
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("a", P.SubscriptionOptions(0))] * 100))
    assert len(sub.received()[0].reason_codes) == 100
    sub.send(P.Subscribe(2, [("a", P.SubscriptionOptions(0))] * 101))
    (d,) = sub.received()
    assert d.type == P.DISCONNECT and d.reason_code == 0x97
    assert sub.conn.close_requested


def test_huge_packet_before_connect_is_refused_from_its_header():
    """A CONNECT announcing 20 MiB: MQTT 5 gets CONNACK 0x95, 3.1.1 is just closed; nothing
    is buffered. Pipelined packets after an accepted CONNECT may use the normal maximum."""
    from broker.protocol.properties import encode_vbi
    b, _ = make(max_connect_packet_size=1000)
    for level in (5, 4):
        c = Client(b, level)
        body = encode(P.Connect("huge", level), level)[2:]
        c.conn.data_received(b"\x10" + encode_vbi(20 << 20) + body + b"\x00" * 60000)
        out = c.received()
        assert c.conn.close_requested and c.conn.buffered() == 0
        if level == 5:
            assert [(p.type, p.reason_code) for p in out] == [(P.CONNACK, 0x95)]
        else:
            assert out == []
    ok = Client(b)
    ok.conn.data_received(encode(P.Connect("ok", 5)) + encode(P.Subscribe(1, [("t", P.SubscriptionOptions(0))]))
                          + encode(P.Publish("t", b"z" * 5000)))
    ack, suback, m = ok.received()
    assert ack.reason_code == 0 and len(m.payload) == 5000


def test_max_retained_replay_bounds_the_backlog(caplog):
    """One SUBSCRIBE's filters replay at most mqtt.max_retained_replay messages together; the
    rest are counted as the walk meets them and logged once, when its replays end. Nothing is
    matched up front: the SUBSCRIBE of a paused client holds only the walks."""
    import logging
    b, _ = make(max_retained_replay=25)
    _retained(b, 20)
    sub = Client(b)
    sub.connect("s")
    sub.conn.paused = True  # nothing leaves: everything waits
    caplog.set_level(logging.WARNING)
    sub.send(P.Subscribe(1, [("r/#", P.SubscriptionOptions(0)), ("r/+", P.SubscriptionOptions(0)),
                             ("#", P.SubscriptionOptions(0))]))
    s = sub.conn.session
    assert len(s.feeds) == 3 and b.stats["dropped_retained_replay"] == 0
    sub.conn.resume_writing()
    got = []
    while True:
        pkts = sub.received()
        if not pkts:
            break
        got += pkts
    assert len([p for p in got if p.type == P.PUBLISH]) == 25
    assert b.stats["dropped_retained_replay"] == 60 - 25 and not s.feeds
    (line,) = [r.getMessage() for r in caplog.records if "max_retained_replay" in r.getMessage()]
    assert "35 retained messages not sent" in line


def test_retained_replay_of_a_large_store_is_taken_a_few_at_a_time():
    """SUBSCRIBE '#' on 5,000 retained messages: the SUBACK's turn sends at most RETAINED_STEPS of
    them (before: the whole store was matched at once, 100 ms for 100,000); each later turn the
    next ones, until all are sent exactly once."""
    from broker.core.session import RETAINED_STEPS
    b, _ = make()
    _retained(b, 5000)
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("#", P.SubscriptionOptions(0))]))
    first = sub.received()
    assert first[0].type == P.SUBACK and len(first) - 1 == RETAINED_STEPS
    got = first[1:]
    turns = 1
    while sub.conn.is_dirty or sub.conn.out:
        got += sub.received()
        turns += 1
    assert sorted(p.topic for p in got) == sorted(f"r/{i}" for i in range(5000))
    assert turns >= 5000 // RETAINED_STEPS


def test_connect_limit_lasts_until_the_connect_is_accepted():
    b, _ = make(max_connect_packet_size=1000)
    big = encode(P.Publish("t", b"z" * 5000, 1, False, False, 1))
    # accepted at once: a large packet split across reads right behind the CONNECT is fine
    ok = Client(b)
    ok.conn.data_received(encode(P.Connect("ok", 5)) + big[:100])
    ok.conn.data_received(big[100:])
    assert [p.type for p in ok.received()] == [P.CONNACK, P.PUBACK]
    # a password check still running: the small limit applies to what follows
    b.defer_auth = True
    slow = Client(b)
    (ev,) = slow.conn.data_received(encode(P.Connect("slow", 5, username="u", password=b"pw")) + big[:100])
    assert ev.client_id == "slow"  # AuthRequested
    slow.conn.data_received(big[100:2000])
    assert slow.conn.close_requested and slow.conn.buffered() == 0
