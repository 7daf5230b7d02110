"""CONNECT / CONNACK / DISCONNECT / AUTH rules, sessions, keep alive and wills (MQTT 5.0 3.1, 3.2,
3.14, 3.15, 4.1 and the 3.1.1 counterparts) through real sockets."""
from __future__ import annotations

import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from broker.protocol.properties import encode_utf8

from .helpers import (P, PR, RawClient, ack, assert_served, bye, cid, connect, expect_disconnect,
                      props, publish_ok, raw_connect_bytes, read_until_closed, recv_publish, uniq)

pytestmark = pytest.mark.timeout(30)


def connect_bytes(name: str = "MQTT", level: int = 5, flags: int = 0x02, client_id: str = "x",
                  keep_alive: int = 60) -> bytes:
    body = encode_utf8(name) + bytes((level, flags)) + keep_alive.to_bytes(2, "big")
    if level == 5:
        body += b"\x00"
    body += encode_utf8(client_id)
    return bytes((0x10, len(body))) + body


def watcher(port: int, topic: str, qos: int = 1) -> RawClient:
    w = connect(port)
    w.subscribe(topic, qos=qos)
    return w


# ---------------------------------------------------------------- protocol name / level / flags

@pytest.mark.parametrize("name,level", [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTT", 0)])
def test_unsupported_protocol_level(broker, name, level):
    """[MQTT-3.1.2-2]: an unsupported protocol level gets CONNACK 0x84 (v5) or the 3.1.1 return code
    1 (unacceptable protocol version), then the connection is closed."""
    got = raw_connect_bytes(broker.port, connect_bytes(name, level, client_id=cid()))
    assert got in (b"\x20\x02\x00\x01", b"\x20\x03\x00\x84\x00"), got
    assert_served(broker.port)


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "MQIsdpX", ""])
def test_wrong_protocol_name_closed(broker, name):
    """[MQTT-3.1.2-1]: an incorrect protocol name: the connection is closed without acceptance."""
    got = raw_connect_bytes(broker.port, connect_bytes(name, 5, client_id=cid()))
    assert not got.startswith(b"\x20\x03\x00\x00") and not got.startswith(b"\x20\x02\x00\x00"), got
    assert_served(broker.port)


@pytest.mark.parametrize("level", [5, 4, 3])
def test_reserved_connect_flag_closes(broker, level):
    """[MQTT-3.1.2-3]: the reserved CONNECT flag set: malformed, the connection is closed (a v5
    client may get CONNACK 0x81 first); never accepted."""
    got = raw_connect_bytes(broker.port, connect_bytes("MQIsdp" if level == 3 else "MQTT", level,
                                                       flags=0x03, client_id=cid()))
    if level == 5:
        assert got == b"" or (got[0] == 0x20 and got[3] == rc.MALFORMED_PACKET), got
    else:
        assert got == b"", got
    assert_served(broker.port)


def test_first_packet_not_connect_closes(broker):
    """[MQTT-3.1.0-1]: the first packet must be CONNECT; otherwise the connection is closed."""
    got = raw_connect_bytes(broker.port, b"\xc0\x00")  # PINGREQ
    assert b"\xd0\x00" not in got
    assert_served(broker.port)


def test_second_connect_protocol_error(broker):
    """[MQTT-3.1.0-2]: a second CONNECT is a Protocol Error: DISCONNECT 0x82."""
    c = connect(broker.port)
    c.send(P.Connect(cid()))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


@pytest.mark.parametrize("level", [5, 4])
def test_second_connect_with_unknown_level(broker, level):
    """[MQTT-3.1.0-2]: a second CONNECT whose protocol level is unknown is still a Protocol Error:
    DISCONNECT 0x82 (v5), not the CONNACK-only 0x84 (fuzzer finding); 3.1.1: closed without a
    DISCONNECT."""
    c = connect(broker.port, level=level)
    c.send(connect_bytes("MQTT", 7, client_id=cid()))
    if level == 5:
        expect_disconnect(c, rc.PROTOCOL_ERROR)
    else:
        assert read_until_closed(c) == []
    assert_served(broker.port)


# ---------------------------------------------------------------- client identifiers

def test_empty_client_id_assigned_v5(broker):
    """[MQTT-3.1.3-6], [MQTT-3.2.2-16]: an empty client id in v5 gets an Assigned Client Identifier
    that is unique and usable."""
    c1, c2 = connect(broker.port, ""), connect(broker.port, "")
    a1 = props(c1.connack).get(PR.ASSIGNED_CLIENT_IDENTIFIER)
    a2 = props(c2.connack).get(PR.ASSIGNED_CLIENT_IDENTIFIER)
    assert a1 and a2 and a1 != a2
    topic = uniq("assigned")
    c1.subscribe(topic, qos=1)
    publish_ok(c2, topic, b"hi", qos=1, expect_code=0)
    assert recv_publish(c1).payload == b"hi"
    c1.send(P.PingReq())
    c1.recv_type(P.PINGRESP)  # both still connected: no takeover between them
    bye(c1, c2)


def test_given_client_id_not_assigned(broker):
    """3.2.2.3.7: no Assigned Client Identifier when the client chose one."""
    c = connect(broker.port, cid())
    assert PR.ASSIGNED_CLIENT_IDENTIFIER not in props(c.connack)
    bye(c)


def test_empty_client_id_v311_clean_session(broker):
    """3.1.1 [MQTT-3.1.3-6]: an empty client id with clean session 1 is accepted."""
    c = RawClient(broker.port, level=P.MQTT_311)
    ack_ = c.connect("", clean_start=True)
    assert (ack_.reason_code, ack_.session_present) == (0, False)
    bye(c)


def test_empty_client_id_v311_persistent_rejected(broker):
    """3.1.1 [MQTT-3.1.3-8]: an empty client id with clean session 0 -> return code 2 and close."""
    c = RawClient(broker.port, level=P.MQTT_311)
    ack_ = c.connect("", clean_start=False)
    assert ack_.reason_code == rc.V4_IDENTIFIER_REJECTED
    read_until_closed(c)
    assert_served(broker.port)


def test_empty_client_id_v31_rejected(broker):
    """MQTT 3.1 (MQIsdp): a client id is required -> return code 2 (identifier rejected)."""
    c = RawClient(broker.port, level=P.MQTT_31)
    ack_ = c.connect("", clean_start=True)
    assert ack_.reason_code == rc.V4_IDENTIFIER_REJECTED
    read_until_closed(c)


# ---------------------------------------------------------------- sessions

def test_session_present_flag(broker):
    """[MQTT-3.2.2-2], [MQTT-3.2.2-3]: Session Present 0 for a new session and for Clean Start, 1
    when resuming a stored session."""
    me = cid("sp")
    bye(connect(broker.port, me, clean_start=False, expect_present=False,
                properties={PR.SESSION_EXPIRY_INTERVAL: 60}))
    bye(connect(broker.port, me, clean_start=False, expect_present=True,
                properties={PR.SESSION_EXPIRY_INTERVAL: 60}))
    bye(connect(broker.port, me, clean_start=True, expect_present=False))
    # the last connection had Session Expiry 0: the session ended with it
    bye(connect(broker.port, me, clean_start=False, expect_present=False))


def test_session_present_v311(broker):
    """3.1.1: clean session 0 resumes (session present 1); clean session 1 never has one."""
    me = cid("sp4")
    for clean, present in ((False, False), (False, True), (True, False)):
        c = RawClient(broker.port, level=P.MQTT_311)
        a = c.connect(me, clean_start=clean)
        assert (a.reason_code, a.session_present) == (0, present)
        bye(c)
        time.sleep(0.1)


def test_clean_start_discards_session(broker):
    """[MQTT-3.1.2-4]: Clean Start discards the existing session: its subscriptions and the messages
    queued for it."""
    topic, me = uniq("clean"), cid("clean")
    c = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    c.subscribe(topic, qos=1)
    bye(c)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"queued", qos=1, expect_code=0)
    c = connect(broker.port, me, clean_start=True, expect_present=False,
                properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    assert c.nothing(0.5), "the discarded session's queue was delivered"
    publish_ok(pub, topic, b"after", qos=1, pid=2, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert c.nothing(0.4), "the discarded session's subscription still matched"
    bye(c, pub)


def test_session_expiry_interval_elapses(broker):
    """3.1.2.11.2: a session is kept for its Session Expiry Interval after disconnection, not longer."""
    me = cid("sei")
    bye(connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 1}))
    time.sleep(2.6)
    bye(connect(broker.port, me, clean_start=False, expect_present=False))


def test_session_expiry_on_disconnect_after_zero_is_protocol_error(broker):
    """3.14.2.2.2: Session Expiry set non-zero on DISCONNECT after 0 at CONNECT: 0x82."""
    c = connect(broker.port)
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 60}))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


def test_session_takeover_0x8E(broker):
    """[MQTT-3.1.4-3]: a second connection with the same client id takes over: the old one gets
    DISCONNECT 0x8E and is closed; the new one works and keeps the session's subscriptions."""
    me, topic = cid("take"), uniq("take")
    old = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    old.subscribe(topic, qos=1)
    new = connect(broker.port, me, clean_start=False, expect_present=True)
    expect_disconnect(old, rc.SESSION_TAKEN_OVER)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"to-new", qos=1, expect_code=0)
    assert recv_publish(new).payload == b"to-new"
    bye(new, pub)


def test_session_takeover_v311_closes_old(broker):
    """3.1.1 [MQTT-3.1.4-2]: the old connection is closed (no DISCONNECT in 3.1.1)."""
    me = cid("take4")
    old = RawClient(broker.port, level=P.MQTT_311)
    old.connect(me)
    new = RawClient(broker.port, level=P.MQTT_311)
    assert new.connect(me).reason_code == 0
    assert read_until_closed(old) == []
    new.send(P.PingReq())
    new.recv_type(P.PINGRESP)
    bye(new)


# ---------------------------------------------------------------- keep alive

@pytest.mark.timeout(15)
def test_keep_alive_timeout_0x8D(broker):
    """[MQTT-3.1.2-22]: no packet within 1.5 x Keep Alive: DISCONNECT 0x8D and close; the will
    is published (abnormal end)."""
    topic = uniq("kawill")
    w = watcher(broker.port, topic)
    c = connect(broker.port, keep_alive=1, will=P.Will(topic, b"ka-will", 1))
    t0 = time.monotonic()
    expect_disconnect(c, rc.KEEP_ALIVE_TIMEOUT, timeout=6)
    elapsed = time.monotonic() - t0
    assert 1.4 <= elapsed <= 4.0, elapsed
    assert recv_publish(w).payload == b"ka-will"
    bye(w)


@pytest.mark.timeout(15)
def test_keep_alive_kept_by_pingreq(broker):
    """3.1.2.10: PINGREQs within the Keep Alive keep the connection open."""
    c = connect(broker.port, keep_alive=1)
    for _ in range(8):
        time.sleep(0.5)
        c.send(P.PingReq())
        c.recv_type(P.PINGRESP)
    bye(c)


@pytest.mark.timeout(15)
def test_keep_alive_v311_closes(broker):
    """3.1.1 [MQTT-3.1.2-24]: the connection is closed (no DISCONNECT) after 1.5 x Keep Alive."""
    c = RawClient(broker.port, level=P.MQTT_311)
    c.connect(cid(), keep_alive=1)
    t0 = time.monotonic()
    assert read_until_closed(c, timeout=6) == []
    assert time.monotonic() - t0 >= 1.4


@pytest.mark.timeout(15)
def test_server_keep_alive(make_broker):
    """[MQTT-3.2.2-21]: with Server Keep Alive in CONNACK the client must use it; the broker
    enforces it."""
    b = make_broker({"mqtt.server_keep_alive": 1})
    c = connect(b.port, keep_alive=60)
    assert props(c.connack)[PR.SERVER_KEEP_ALIVE] == 1
    expect_disconnect(c, rc.KEEP_ALIVE_TIMEOUT, timeout=6)


# ---------------------------------------------------------------- wills

def test_will_published_on_abnormal_close(broker):
    """[MQTT-3.1.2-8]: the will is published when the connection closes without DISCONNECT, with its
    properties (delay interval excluded)."""
    topic = uniq("will")
    w = watcher(broker.port, topic)
    wprops = {PR.CONTENT_TYPE: "text/plain", PR.USER_PROPERTY: [("k", "v"), ("k", "w")],
              PR.RESPONSE_TOPIC: "will/reply", PR.CORRELATION_DATA: b"\x01"}
    c = connect(broker.port, will=P.Will(topic, b"gone", 1, False, wprops))
    c.close()
    m = recv_publish(w)
    assert (m.topic, m.payload, m.qos) == (topic, b"gone", 1)
    assert props(m) == wprops
    ack(w, m)
    bye(w)


def test_will_not_published_on_normal_disconnect(broker):
    """[MQTT-3.1.2-10]: DISCONNECT 0x00 deletes the will."""
    topic = uniq("nowill")
    w = watcher(broker.port, topic)
    c = connect(broker.port, will=P.Will(topic, b"gone", 1))
    c.send(P.Disconnect(0))
    read_until_closed(c)
    assert w.nothing(1.0)
    bye(w)


def test_will_published_on_disconnect_0x04(broker):
    """3.14.2.1: DISCONNECT 0x04 (Disconnect with Will Message) publishes the will."""
    topic = uniq("will04")
    w = watcher(broker.port, topic)
    c = connect(broker.port, will=P.Will(topic, b"asked", 0))
    c.send(P.Disconnect(rc.DISCONNECT_WITH_WILL))
    read_until_closed(c)
    assert recv_publish(w).payload == b"asked"
    bye(w)


def test_will_published_on_protocol_error(broker):
    """[MQTT-3.1.2-8], 4.13: a connection closed by the broker for a protocol error publishes the will."""
    topic = uniq("willerr")
    w = watcher(broker.port, topic)
    c = connect(broker.port, will=P.Will(topic, b"err", 1))
    c.send(P.Auth(0x19))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert recv_publish(w).payload == b"err"
    bye(w)


def test_will_retained(broker):
    """3.1.2.7: a will with Will Retain 1 is published as a retained message."""
    topic = uniq("willret")
    c = connect(broker.port, will=P.Will(topic, b"ret-will", 1, True))
    c.close()
    time.sleep(0.3)
    s = connect(broker.port)
    s.subscribe(topic, qos=1)
    m = recv_publish(s)
    assert (m.payload, m.retain) == (b"ret-will", True)
    ack(s, m)
    bye(s)
    cleaner = connect(broker.port)
    publish_ok(cleaner, topic, b"", qos=1, retain=True)
    bye(cleaner)


@pytest.mark.timeout(20)
def test_will_delay_interval(broker):
    """3.1.3.2.2 [MQTT-3.1.3-9]: the will is published after the Will Delay Interval, not before."""
    topic = uniq("willdelay")
    w = watcher(broker.port, topic)
    c = connect(broker.port, cid("wd"), properties={PR.SESSION_EXPIRY_INTERVAL: 60},
                will=P.Will(topic, b"late", 1, False, {PR.WILL_DELAY_INTERVAL: 2}))
    c.close()
    t0 = time.monotonic()
    assert w.nothing(1.3), "will published before its delay"
    m = recv_publish(w, timeout=5)
    assert m.payload == b"late" and PR.WILL_DELAY_INTERVAL not in props(m)
    assert time.monotonic() - t0 >= 1.8
    bye(w)


@pytest.mark.timeout(20)
def test_will_delay_cancelled_by_reconnect(broker):
    """3.1.3.2.2: reconnecting before the Will Delay Interval elapses cancels the will."""
    topic, me = uniq("willcancel"), cid("wc")
    w = watcher(broker.port, topic)
    c = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 60},
                will=P.Will(topic, b"never", 1, False, {PR.WILL_DELAY_INTERVAL: 2}))
    c.close()
    time.sleep(0.5)
    c = connect(broker.port, me, clean_start=False, expect_present=True,
                properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    assert w.nothing(3.0), "will published although the client came back in time"
    bye(c, w)


@pytest.mark.timeout(20)
def test_will_published_when_session_ends_before_delay(broker):
    """[MQTT-3.1.2-8]: the will is published when the session ends, if that is before the delay."""
    topic = uniq("willsess")
    w = watcher(broker.port, topic)
    c = connect(broker.port, cid("ws"), properties={PR.SESSION_EXPIRY_INTERVAL: 1},
                will=P.Will(topic, b"session-end", 1, False, {PR.WILL_DELAY_INTERVAL: 30}))
    c.close()
    m = recv_publish(w, timeout=5)
    assert m.payload == b"session-end"
    bye(w)


def test_will_qos_above_maximum_refused(make_broker):
    """[MQTT-3.2.2-12]: a Will QoS above the Maximum QoS: CONNACK 0x9B."""
    b = make_broker({"mqtt.maximum_qos": 0})
    c = RawClient(b.port)
    a = c.connect(cid(), will=P.Will("w/t", b"x", 1))
    assert a.reason_code == rc.QOS_NOT_SUPPORTED
    read_until_closed(c)


def test_will_retain_without_retain_available_refused(make_broker):
    """[MQTT-3.2.2-13]: Will Retain 1 when retain is not available: CONNACK 0x9A."""
    b = make_broker({"mqtt.retain_available": False})
    c = RawClient(b.port)
    a = c.connect(cid(), will=P.Will("w/t", b"x", 0, True))
    assert a.reason_code == rc.RETAIN_NOT_SUPPORTED
    read_until_closed(c)


@pytest.mark.parametrize("wtopic", ["w/+", "w/#", ""])
def test_will_topic_invalid_closed(broker, wtopic):
    """[MQTT-3.1.3-11]: a will topic must be a valid topic name; the connection is not accepted."""
    c = RawClient(broker.port)
    c.send(P.Connect(cid(), will=P.Will(wtopic, b"x", 0)))
    seen = read_until_closed(c)
    assert all(p.type == P.CONNACK and p.reason_code >= 0x80 for p in seen), seen
    assert_served(broker.port)


# ---------------------------------------------------------------- AUTH

def test_enhanced_auth_method_refused_0x8C(broker):
    """4.12 [MQTT-4.12.0-1]: an Authentication Method the broker does not support: CONNACK 0x8C."""
    c = RawClient(broker.port)
    a = c.connect(cid(), properties={PR.AUTHENTICATION_METHOD: "SCRAM-SHA-1",
                                     PR.AUTHENTICATION_DATA: b"client-first"})
    assert (a.reason_code, a.session_present) == (rc.BAD_AUTHENTICATION_METHOD, False)
    read_until_closed(c)
    assert_served(broker.port)


def test_auth_packet_without_method_0x82(broker):
    """[MQTT-4.12.0-7]: AUTH on a connection without an authentication method: DISCONNECT 0x82."""
    c = connect(broker.port)
    c.send(P.Auth(0x18, {PR.AUTHENTICATION_METHOD: "X"}))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(broker.port)


# ---------------------------------------------------------------- CONNACK / problem information

def test_connack_capabilities(make_broker):
    """3.2.2.3: CONNACK advertises the configured limits."""
    b = make_broker({"mqtt.receive_maximum": 10, "mqtt.maximum_qos": 1, "mqtt.topic_alias_maximum": 4,
                     "mqtt.maximum_packet_size": 5000, "mqtt.wildcard_subscription_available": False,
                     "mqtt.shared_subscription_available": False,
                     "mqtt.subscription_identifiers_available": False})
    c = connect(b.port)
    p = props(c.connack)
    assert p[PR.RECEIVE_MAXIMUM] == 10 and p[PR.MAXIMUM_QOS] == 1
    assert p[PR.TOPIC_ALIAS_MAXIMUM] == 4 and p[PR.MAXIMUM_PACKET_SIZE] == 5000
    assert p[PR.WILDCARD_SUBSCRIPTION_AVAILABLE] == 0 and p[PR.SHARED_SUBSCRIPTION_AVAILABLE] == 0
    assert p[PR.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 0
    bye(c)


def test_request_problem_information_0(broker):
    """[MQTT-3.1.2-29]: Request Problem Information 0: no Reason String on a DISCONNECT."""
    c = connect(broker.port, properties={PR.REQUEST_PROBLEM_INFORMATION: 0})
    c.publish("", b"x", qos=0)
    seen = expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert PR.REASON_STRING not in props(seen[-1])
    c = connect(broker.port)
    c.publish("", b"x", qos=0)
    seen = expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert PR.REASON_STRING in props(seen[-1])


def test_connect_raw_v5_encoding_roundtrip(broker):
    """Sanity: the CONNECT forged by connect_bytes() is accepted (so the negative cases above fail
    only for the field they change)."""
    got = raw_connect_bytes(broker.port, connect_bytes(client_id=cid()) + encode(P.Disconnect()))
    assert got[0] == 0x20 and got[2:4] == b"\x00\x00", got


def test_disconnect_session_expiry_zero_ends_session(broker):
    """3.14.2.2.2 / 3.1.2.11.2: DISCONNECT with Session Expiry 0 ends a session that was to last."""
    me = cid("sei0")
    c = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 0}))
    read_until_closed(c)
    bye(connect(broker.port, me, clean_start=False, expect_present=False))


def test_disconnect_session_expiry_extends_session(broker):
    """3.14.2.2.2: DISCONNECT may change a non-zero Session Expiry (here 1 -> 60): the session stays."""
    me = cid("sei60")
    c = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 1})
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 60}))
    read_until_closed(c)
    time.sleep(2.3)
    bye(connect(broker.port, me, clean_start=False, expect_present=True))


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
def test_will_v311(broker, level):
    """3.1.1 [MQTT-3.1.2-8]: a 3.1.x client's will is published to v5 subscribers on abnormal close
    and discarded on DISCONNECT."""
    topic = uniq("will4")
    w = watcher(broker.port, topic)
    c = RawClient(broker.port, level=level)
    c.connect(cid(), will=P.Will(topic, b"v4-gone", 1))
    c.close()
    assert recv_publish(w).payload == b"v4-gone"
    c = RawClient(broker.port, level=level)
    c.connect(cid(), will=P.Will(topic, b"v4-never", 1))
    bye(c)
    assert w.nothing(0.8)
    bye(w)


def test_keep_alive_above_maximum_gets_server_keep_alive(make_broker):
    """[MQTT-3.2.2-21]: a Keep Alive above the broker's maximum is replaced by Server Keep Alive."""
    b = make_broker({"mqtt.max_keep_alive": 5})
    c = connect(b.port, keep_alive=60)
    assert props(c.connack).get(PR.SERVER_KEEP_ALIVE) == 5
    bye(c)
    c = connect(b.port, keep_alive=3)
    assert PR.SERVER_KEEP_ALIVE not in props(c.connack)
    bye(c)


def test_client_id_too_long_0x85(make_broker):
    """[MQTT-3.1.3-8]: a client id the broker does not accept: CONNACK 0x85 (3.1.1: return code 2)."""
    b = make_broker({"mqtt.max_client_id_length": 10})
    c = RawClient(b.port)
    assert c.connect("x" * 11).reason_code == rc.CLIENT_IDENTIFIER_NOT_VALID
    read_until_closed(c)
    c = RawClient(b.port, level=P.MQTT_311)
    assert c.connect("y" * 11).reason_code == rc.V4_IDENTIFIER_REJECTED
    read_until_closed(c)
    bye(connect(b.port, "z" * 10))
