"""Hostile clients, sans-I/O: what a client can make the broker hold is bounded: inbound topic
aliases (in bytes too), session expiry (capped), the number of sessions. Bytes in, bytes out, a
fake clock (tests/unit/test_core.py's Client and make)."""
import logging
import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.broker import Broker
from broker.core.hooks import AllowAll
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.store.sqlite import Store
from settings import MQTTConfig
from tests.unit.test_core import Client, Clock, make


class DenySecret(AllowAll):
    def allow_publish(self, client_id, username, topic):
        return not topic.startswith("secret/")


def test_default_topic_alias_maximum_is_10_and_advertised():
    assert MQTTConfig().topic_alias_maximum == 10
    b, _ = make()
    ack = Client(b).connect("c")
    assert ack.properties[PR.TOPIC_ALIAS_MAXIMUM] == 10
    c = Client(b)
    c.connect("d")
    c.send(P.Publish("a", b"x", properties={PR.TOPIC_ALIAS: 11}))  # [MQTT-3.3.2-9]
    (d,) = c.received()
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.TOPIC_ALIAS_INVALID)


def _acl_broker(**cfg):
    b, clock = make(**cfg)
    b.auth = DenySecret()
    sub, pub = Client(b), Client(b)
    sub.connect("s")
    pub.connect("p")
    sub.send(P.Subscribe(1, [("#", P.SubscriptionOptions(0))]))
    sub.received()
    return b, sub, pub


def test_alias_of_a_publish_refused_by_acl_is_not_stored():
    """A Topic Name refused by the ACL maps no alias: 1000 refused PUBLISHes leave nothing behind
    and the alias used alone afterwards is a Protocol Error (it maps nothing)."""
    b, sub, pub = _acl_broker(topic_alias_maximum=1000)
    for a in range(1, 1001):
        pub.send(P.Publish(f"secret/{a}", b"x", 1, packet_id=a, properties={PR.TOPIC_ALIAS: a}))
    acks = pub.received()
    assert [x.reason_code for x in acks] == [rc.NOT_AUTHORIZED] * 1000
    assert pub.conn.in_aliases == {} and pub.conn.in_alias_bytes == 0
    assert sub.received() == []
    pub.send(P.Publish("", b"y", properties={PR.TOPIC_ALIAS: 5}))
    (d,) = pub.received()
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.PROTOCOL_ERROR)


def test_refused_remap_forgets_the_earlier_topic():
    """Alias 1 maps ok/a; a PUBLISH remapping it to a forbidden topic is refused: later
    PUBLISHes using alias 1 alone must not land on ok/a."""
    b, sub, pub = _acl_broker()
    pub.send(P.Publish("ok/a", b"1", properties={PR.TOPIC_ALIAS: 1}))
    assert [m.payload for m in sub.received()] == [b"1"]
    pub.send(P.Publish("secret/x", b"2", 1, packet_id=1, properties={PR.TOPIC_ALIAS: 1}))
    (a,) = pub.received()
    assert a.reason_code == rc.NOT_AUTHORIZED
    pub.send(P.Publish("", b"3", properties={PR.TOPIC_ALIAS: 1}))
    (d,) = pub.received()
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.PROTOCOL_ERROR)
    assert sub.received() == []


def test_alias_of_a_topic_over_the_limits_is_not_stored():
    b, sub, pub = _acl_broker(max_topic_length=20, max_topic_levels=3)
    pub.send(P.Publish("x" * 21, b"x", 1, packet_id=1, properties={PR.TOPIC_ALIAS: 1}))
    pub.send(P.Publish("a/b/c/d", b"x", 1, packet_id=2, properties={PR.TOPIC_ALIAS: 2}))
    assert [x.reason_code for x in pub.received()] == [rc.TOPIC_NAME_INVALID] * 2
    assert pub.conn.in_aliases == {}
    pub.send(P.Publish("$SYS/x", b"x", 1, packet_id=3, properties={PR.TOPIC_ALIAS: 3}))
    assert [x.reason_code for x in pub.received()] == [rc.NOT_AUTHORIZED]
    assert pub.conn.in_aliases == {}


def test_alias_bytes_bound_disconnects_0x97():
    b, sub, pub = _acl_broker(topic_alias_maximum=100, max_topic_alias_bytes=1000)
    for a in range(1, 5):  # 4 x 250 = 1000: exactly at the bound
        pub.send(P.Publish(f"{a}/" + "t" * 248, b"x", properties={PR.TOPIC_ALIAS: a}))
    assert pub.conn.in_alias_bytes == 1000 and pub.received() == []
    pub.send(P.Publish("4/" + "u" * 248, b"x", properties={PR.TOPIC_ALIAS: 4}))  # replace: same size
    pub.send(P.Publish("", b"y", properties={PR.TOPIC_ALIAS: 4}))
    assert pub.received() == [] and pub.conn.in_alias_bytes == 1000
    assert [m.topic for m in sub.received()][-2:] == ["4/" + "u" * 248] * 2
    pub.send(P.Publish("5/t", b"x", properties={PR.TOPIC_ALIAS: 5}))
    (d,) = pub.received()
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.QUOTA_EXCEEDED)
    assert "max_topic_alias_bytes" in d.properties[PR.REASON_STRING]
    assert sub.received() == []  # the message that would exceed the bound is not delivered


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 300), st.booleans()), max_size=40),
       st.integers(0, 1500))
def test_alias_bytes_accounting_property(ops, limit):
    """Whatever the sequence of mappings (replacements, refused topics): the bytes counted are the
    total length of the mapped topics, never above the bound; exceeding it is DISCONNECT 0x97."""
    b, _ = make(topic_alias_maximum=8, max_topic_alias_bytes=limit)
    b.auth = DenySecret()
    pub = Client(b)
    pub.connect("p")
    model: dict = {}
    for alias, n, secret in ops:
        topic = ("secret/" if secret else "ok/") + "t" * n
        pub.send(P.Publish(topic, b"x", properties={PR.TOPIC_ALIAS: alias}))
        out = pub.received()
        if secret:
            model.pop(alias, None)
        else:
            after = {**model, alias: topic}
            if limit and sum(map(len, after.values())) > limit:
                assert [(x.type, x.reason_code) for x in out] == [(P.DISCONNECT, rc.QUOTA_EXCEEDED)]
                return
            model = after
        assert out == []
        assert pub.conn.in_aliases == model
        assert pub.conn.in_alias_bytes == sum(map(len, model.values()))
        assert not limit or pub.conn.in_alias_bytes <= limit


# ---------------------------------------------------------------- session expiry caps
NEVER = 0xFFFFFFFF


def _offline(b, cid, level=5, props=None, disconnect=None):
    """A client with a persistent session and one subscription that goes away (a DISCONNECT
    with `disconnect` properties when given, else the connection is lost)."""
    c = Client(b, level)
    c.connect(cid, clean=False, props=props)
    c.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(1))]))
    c.received()
    if disconnect is not None:
        c.send(P.Disconnect(0, disconnect))
    else:
        c.conn.connection_lost()
    return c


def _held_for(b, clock, cid, seconds) -> None:
    """The offline session `cid` is there `seconds` - 1 from now, gone at `seconds`."""
    if seconds:
        clock.t += seconds - 1
        b.tick()
        assert cid in b.sessions
        clock.t += 1
    b.tick()
    assert cid not in b.sessions


def _present(b, cid, level=5, props=None) -> bool:
    return Client(b, level).connect(cid, clean=False, props=props).session_present


def test_default_caps_are_finite():
    """Safe defaults: offline sessions are kept at most 7 days, whatever the client asks."""
    cfg = MQTTConfig()
    assert cfg.session_expiry_maximum == 604800
    assert cfg.persistent_client_expiration == 604800
    assert cfg.max_sessions == 100000


def test_disconnect_expiry_is_capped_by_session_expiry_maximum():
    """A v5 client connecting with a small interval and raising it to 'never' on DISCONNECT
    used to keep its session forever: the DISCONNECT's interval is capped like the CONNECT's."""
    b, clock = make(session_expiry_maximum=100)
    _offline(b, "c", props={PR.SESSION_EXPIRY_INTERVAL: 10},
             disconnect={PR.SESSION_EXPIRY_INTERVAL: NEVER})
    assert b.sessions["c"].expiry_interval == 100
    _held_for(b, clock, "c", 100)
    assert b.router.count == 0
    assert not _present(b, "c")


def test_disconnect_expiry_after_zero_at_connect_is_still_a_protocol_error():
    b, _ = make(session_expiry_maximum=100)
    c = Client(b)
    c.connect("z")
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 5}))  # 3.14.2.2.2: non-zero after 0 at CONNECT
    (d,) = c.received()
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.PROTOCOL_ERROR)


def test_disconnect_expiry_when_the_broker_granted_zero():
    """CONNECT asked 100, the broker granted 0 (session_expiry_maximum 0, said in CONNACK): the
    CONNECT was not 0, so a DISCONNECT interval is no Protocol Error; it is capped to 0."""
    b, _ = make(session_expiry_maximum=0)
    c = Client(b)
    ack = c.connect("g", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100})
    assert ack.properties[PR.SESSION_EXPIRY_INTERVAL] == 0
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 60}))
    assert c.received() == [] and c.conn.close_requested
    assert "g" not in b.sessions


@settings(max_examples=200, deadline=None)
@given(st.integers(1, NEVER), st.integers(0, NEVER), st.integers(0, NEVER))
def test_disconnect_expiry_property(at_connect, at_disconnect, maximum):
    """Whatever the intervals: the session lives min(DISCONNECT's, maximum) seconds offline."""
    b, clock = make(session_expiry_maximum=maximum)
    _offline(b, "c", props={PR.SESSION_EXPIRY_INTERVAL: at_connect},
             disconnect={PR.SESSION_EXPIRY_INTERVAL: at_disconnect})
    life = min(at_disconnect, maximum)
    if life == NEVER:
        clock.t += 10 * NEVER
        b.tick()
        assert "c" in b.sessions
        return
    _held_for(b, clock, "c", life)


def test_311_persistent_session_expires_after_persistent_client_expiration():
    """3.1.1 clean session 0 used to be kept forever: now mqtt.persistent_client_expiration."""
    b, clock = make(persistent_client_expiration=300)
    _offline(b, "old", level=4)
    assert b.sessions["old"].expiry_interval == 300
    clock.t += 299
    b.tick()
    assert "old" in b.sessions
    again = Client(b, 4)
    assert again.connect("old", clean=False).session_present  # resumed in time
    again.conn.connection_lost()  # offline again: another 300 s from now
    clock.t += 300
    b.tick()
    assert "old" not in b.sessions and b.router.count == 0
    assert not _present(b, "old", level=4)


def test_311_default_expiry_is_7_days_and_capped_by_the_maximum():
    b, clock = make()
    _offline(b, "week", level=4)
    _held_for(b, clock, "week", 604800)
    b, clock = make(persistent_client_expiration=1000, session_expiry_maximum=50)
    _offline(b, "capped", level=4)
    assert b.sessions["capped"].expiry_interval == 50
    b, clock = make(persistent_client_expiration=0)  # 0: ended when the connection ends
    _offline(b, "zero", level=4)
    assert "zero" not in b.sessions


def test_311_clean_session_0_never_expires_only_if_both_caps_say_so():
    b, clock = make(persistent_client_expiration=NEVER, session_expiry_maximum=NEVER)
    _offline(b, "forever", level=4)
    clock.t += 10 * NEVER
    b.tick()
    assert "forever" in b.sessions


# ---------------------------------------------------------------- sessions restored from the store
def _stored(path, clock, level, props=None, **cfg):
    """A broker with a SQLite store under `cfg` (the config of an earlier run): client `s`
    makes a persistent session, goes offline; the store is committed and closed."""
    store = Store(str(path), clock=clock, wall=clock)
    b = Broker(MQTTConfig(**cfg), clock=clock, wall=clock, store=store)
    _offline(b, "s", level=level, props=props)
    assert store.commit() >= 0
    store.close()


def _restart(path, clock, **cfg):
    store = Store(str(path), clock=clock, wall=clock)
    b = Broker(MQTTConfig(**cfg), clock=clock, wall=clock, store=store)
    store.load(b)
    return b, store


def _stored_rows(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] + \
            db.execute("SELECT COUNT(*) FROM subscriptions").fetchone()[0]


def test_stored_never_expiring_311_session_is_capped_on_restart(tmp_path):
    """A 3.1.1 clean session 0 stored as 'never expires' (an older version, or an earlier config)
    is capped by the current persistent_client_expiration when restored."""
    path, clock = tmp_path / "state.db", Clock()
    _stored(path, clock, 4, persistent_client_expiration=NEVER, session_expiry_maximum=NEVER)
    clock.t += 1000  # the broker was down
    b, store = _restart(path, clock, persistent_client_expiration=300)
    assert b.sessions["s"].expiry_interval == 300 and b.router.count == 1
    _held_for(b, clock, "s", 300)
    assert store.commit() >= 0
    assert _stored_rows(path) == 0


def test_stored_v5_session_is_capped_from_when_it_went_offline(tmp_path):
    """A v5 session stored with 10^6 s, offline since T: under session_expiry_maximum 1000 it ends
    at T + 1000, so 400 s after a restart at T + 600; restored with the capped interval on disk."""
    path, clock = tmp_path / "state.db", Clock()
    _stored(path, clock, 5, props={PR.SESSION_EXPIRY_INTERVAL: 10 ** 6})
    clock.t += 600
    b, store = _restart(path, clock, session_expiry_maximum=1000)
    assert b.sessions["s"].expiry_interval == 1000
    assert store.commit() >= 0
    store.close()
    b, store = _restart(path, clock)  # what the first restart wrote back: the capped interval
    assert b.sessions["s"].expiry_interval == 1000
    _held_for(b, clock, "s", 400)


def test_stored_session_already_past_the_cap_is_not_restored_and_deleted(tmp_path):
    path, clock = tmp_path / "state.db", Clock()
    _stored(path, clock, 5, props={PR.SESSION_EXPIRY_INTERVAL: 10 ** 6})
    clock.t += 2000
    b, store = _restart(path, clock, session_expiry_maximum=1000)
    assert "s" not in b.sessions and b.router.count == 0
    assert store.commit() >= 0
    assert _stored_rows(path) == 0
    assert not Client(b).connect("s", clean=False).session_present


# ---------------------------------------------------------------- mqtt.max_sessions
def test_max_sessions_refuses_a_new_session_v5_and_311(caplog):
    b, _ = make(max_sessions=3)
    _offline(b, "p", props={PR.SESSION_EXPIRY_INTERVAL: 300})  # offline sessions count too
    Client(b).connect("c1")
    Client(b, 4).connect("c2")
    assert len(b.sessions) == 3
    with caplog.at_level(logging.WARNING, logger="broker"):
        ack = Client(b).connect("new5")
        assert ack.reason_code == rc.QUOTA_EXCEEDED  # 0x97, 3.2.2.2
        assert "try again later" in ack.properties[PR.REASON_STRING]
        assert Client(b, 4).connect("new4").reason_code == 3  # 3.1.1: Server unavailable
        assert Client(b, 3).connect("new3").reason_code == 3
    assert len(b.sessions) == 3 and not {"new5", "new4", "new3"} & set(b.sessions)
    assert b.stats["refused_max_sessions"] == 3
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1 and "mqtt.max_sessions" in warn[0], warn  # once a minute, not per CONNECT


def test_max_sessions_does_not_refuse_resume_takeover_or_clean_start():
    b, clock = make(max_sessions=2)
    _offline(b, "p", props={PR.SESSION_EXPIRY_INTERVAL: 300})
    c1 = Client(b)
    c1.connect("c1")
    p = Client(b)
    ack = p.connect("p", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 300})
    assert (ack.reason_code, ack.session_present) == (0, True)  # resume
    again = Client(b)
    assert again.connect("c1").reason_code == 0  # takeover of a connected session
    assert [(x.type, x.reason_code) for x in c1.received()] == [(P.DISCONNECT, rc.SESSION_TAKEN_OVER)]
    assert Client(b).connect("p", clean=True).reason_code == 0  # Clean Start: replaces it
    assert len(b.sessions) == 2
    assert Client(b).connect("x").reason_code == rc.QUOTA_EXCEEDED
    again.send(P.Disconnect())  # a clean session ends: room for one more
    assert Client(b).connect("x").reason_code == 0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.sampled_from("abcdef"), st.booleans(),
                                             st.sampled_from([3, 4, 5]), st.booleans()), max_size=30))
def test_max_sessions_property(limit, ops):
    """Connects (persistent or clean, any level) and disconnects in any order: a CONNECT is refused
    exactly when its client id has no session and `limit` sessions exist; never more are held."""
    b, _ = make(max_sessions=limit)
    live: dict = {}
    for cid, persistent, level, leave in ops:
        c = Client(b, level)
        had = cid in b.sessions
        full = len(b.sessions) >= limit
        ack = c.connect(cid, clean=not persistent,
                        props={PR.SESSION_EXPIRY_INTERVAL: 60} if persistent and level == 5 else None)
        refused = ack.reason_code != 0
        assert refused == (not had and full)
        if refused:
            assert ack.reason_code == (rc.QUOTA_EXCEEDED if level == 5 else 3)
        else:
            live[cid] = c
            if leave:
                c.conn.connection_lost()
        assert len(b.sessions) <= limit


def test_restoring_as_many_sessions_as_max_sessions_warns(tmp_path, caplog):
    """Sessions restored at start are all kept (they were accepted), but a store holding
    max_sessions of them means new client ids are refused: one WARNING says so at start."""
    path, clock = tmp_path / "state.db", Clock()
    _stored(path, clock, 5, props={PR.SESSION_EXPIRY_INTERVAL: 100})
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        b, _ = _restart(path, clock, max_sessions=1)
    assert "s" in b.sessions
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1 and "mqtt.max_sessions is 1" in warn[0], warn
    assert Client(b).connect("other").reason_code == rc.QUOTA_EXCEEDED
    assert Client(b).connect("s", clean=False).session_present


# ---------------------------------------------------------------- subscriptions restored from the store
def test_restored_subscriptions_respect_the_byte_and_wildcard_bounds(tmp_path, caplog):
    """Subscriptions stored under larger bounds (an earlier config: three offline sessions of
    1,000 60 KB filters took 390 MiB, all read back at restart) are restored only within the
    current mqtt.max_subscription_bytes (per session and in total) and max_wildcard_levels:
    the rest is dropped, from the store too, with one WARNING saying which bounds and how to
    keep them."""
    path, clock = tmp_path / "state.db", Clock()
    store = Store(str(path), clock=clock, wall=clock)
    b = Broker(MQTTConfig(), clock=clock, wall=clock, store=store)
    for cid in ("s1", "s2"):
        c = Client(b)
        c.connect(cid, clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 1000})
        c.send(P.Subscribe(1, [(f"{cid}/{i}/" + "x" * 90, P.SubscriptionOptions(1))
                               for i in range(10)] + [("+/+/+", P.SubscriptionOptions(0))]))
        c.received()  # (the SUBACK waits for the store's commit)
        assert len(b.sessions[cid].subscriptions) == 11
        c.conn.connection_lost()
    assert store.commit() >= 0
    store.close()
    with caplog.at_level(logging.WARNING):
        b, store = _restart(path, clock, max_subscription_bytes=500,
                            max_subscription_bytes_total=700, max_wildcard_levels=2)
    held = {cid: b.sessions[cid].filter_bytes for cid in ("s1", "s2")}
    assert all(n <= 500 for n in held.values()) and sum(held.values()) <= 700
    assert b.router.filter_bytes == sum(held.values()) and b.router.count == \
        sum(len(b.sessions[cid].subscriptions) for cid in held)
    assert not any("+/+/+" in b.sessions[cid].subscriptions for cid in held)
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("mqtt.max_subscription_bytes" in w and "mqtt.max_wildcard_levels" in w
               for w in warn), warn
    assert store.commit() >= 0
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM subscriptions").fetchone()[0] == b.router.count
