"""CONNECT / CONNACK / DISCONNECT / AUTH rules, sessions, keep alive and wills (MQTT 5.0 3.1, 3.2,
3.14, 3.15, 4.1 and the 3.1.1 counterparts) through the sans-I/O core: client bytes in, broker
bytes out, time from the fake clock (Broker.tick() once a second, as the server calls it).
Moved from tests/integration/test_connect.py, which keeps the cases whose point is the socket."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from tests.sansio import (
    Client,
    ack,
    assert_served,
    bye,
    connect_bytes,
    exchange,
    expect_disconnect,
    lose,
    make,
    nothing,
    props,
    publish,
    publish_ok,
    recv_publish,
    recv_type,
    run_for,
    subscribe,
    until_closed,
)


def connect(b, client_id="c", level=P.MQTT_5, expect_present=None, clean_start=True,
            properties=None, **kw) -> Client:
    """A connected Client; asserts the CONNACK accepted the connection."""
    c = Client(b, level)
    a = c.connect(client_id, clean=clean_start, props=properties, **kw)
    assert a.reason_code == 0, f"CONNACK refused: {a!r}"
    if expect_present is not None:
        assert a.session_present is expect_present, a
    c.connack = a
    return c


def watcher(b, topic: str, qos: int = 1) -> Client:
    w = connect(b, "watcher")
    subscribe(w, topic, qos=qos)
    return w


# ---------------------------------------------------------------- protocol name / level / flags

@pytest.mark.parametrize("name,level", [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTT", 0)])
def test_unsupported_protocol_level(name, level):
    """[MQTT-3.1.2-2]: an unsupported protocol level gets CONNACK 0x84 (v5) or the 3.1.1 return code
    1 (unacceptable protocol version), then the connection is closed."""
    b, _ = make()
    c = Client(b)
    got = exchange(c.conn, connect_bytes(name, level, client_id="x"))
    assert got in (b"\x20\x02\x00\x01", b"\x20\x03\x00\x84\x00"), got
    assert c.conn.close_requested and not b.sessions
    assert_served(b)


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "MQIsdpX", ""])
def test_wrong_protocol_name_closed(name):
    """[MQTT-3.1.2-1]: an incorrect protocol name: the connection is closed without acceptance."""
    b, _ = make()
    c = Client(b)
    got = exchange(c.conn, connect_bytes(name, 5, client_id="x"))
    assert not got.startswith(b"\x20\x03\x00\x00") and not got.startswith(b"\x20\x02\x00\x00"), got
    assert c.conn.close_requested and not b.sessions
    assert_served(b)


@pytest.mark.parametrize("level", [5, 4, 3])
def test_reserved_connect_flag_closes(level):
    """[MQTT-3.1.2-3]: the reserved CONNECT flag set: malformed, the connection is closed (a v5
    client may get CONNACK 0x81 first); never accepted."""
    b, _ = make()
    c = Client(b, level)
    got = exchange(c.conn, connect_bytes("MQIsdp" if level == 3 else "MQTT", level, flags=0x03,
                                         client_id="x"))
    if level == 5:
        assert got == b"" or (got[0] == 0x20 and got[3] == rc.MALFORMED_PACKET), got
    else:
        assert got == b"", got
    assert c.conn.close_requested and not b.sessions
    assert_served(b)


# [MQTT-3.1.0-1] (first packet not CONNECT) and [MQTT-3.1.0-2] (second CONNECT: 0x82) are in
# tests/unit/test_core_flows.py: test_first_packet_not_connect_closes_MQTT_3_1_0_1,
# test_second_connect_is_a_protocol_error_MQTT_3_1_0_2.

@pytest.mark.parametrize("level", [5, 4])
def test_second_connect_with_unknown_level(level):
    """[MQTT-3.1.0-2]: a second CONNECT whose protocol level is unknown is still a Protocol Error:
    DISCONNECT 0x82 (v5), not the CONNACK-only 0x84 (an input the fuzzer once failed on); 3.1.1:
    closed without a DISCONNECT."""
    b, _ = make()
    c = connect(b, level=level)
    c.send_bytes(connect_bytes("MQTT", 7, client_id="y"))
    if level == 5:
        expect_disconnect(c, rc.PROTOCOL_ERROR)
    else:
        assert until_closed(c) == []
    assert_served(b)


# ---------------------------------------------------------------- client identifiers

def test_empty_client_id_assigned_v5():
    """[MQTT-3.1.3-6], [MQTT-3.2.2-16]: an empty client id in v5 gets an Assigned Client Identifier
    that is unique and usable."""
    b, _ = make()
    c1, c2 = connect(b, ""), connect(b, "")
    a1 = props(c1.connack).get(PR.ASSIGNED_CLIENT_IDENTIFIER)
    a2 = props(c2.connack).get(PR.ASSIGNED_CLIENT_IDENTIFIER)
    assert a1 and a2 and a1 != a2
    subscribe(c1, "assigned", qos=1)
    publish_ok(c2, "assigned", b"hi", qos=1, expect_code=0)
    assert recv_publish(c1).payload == b"hi"
    c1.send(P.PingReq())
    recv_type(c1, P.PINGRESP)  # both still connected: no takeover between them
    assert not c1.conn.close_requested and not c2.conn.close_requested


def test_given_client_id_not_assigned():
    """3.2.2.3.7: no Assigned Client Identifier when the client chose one."""
    b, _ = make()
    assert PR.ASSIGNED_CLIENT_IDENTIFIER not in props(connect(b, "mine").connack)


# 3.1.1 [MQTT-3.1.3-6] (empty client id, clean session 1: accepted) is in test_core_flows.py:
# test_connect_v311_empty_client_id_MQTT_3_1_3_6.

def test_empty_client_id_v311_persistent_rejected():
    """3.1.1 [MQTT-3.1.3-8]: an empty client id with clean session 0 -> return code 2 and close."""
    b, _ = make()
    c = Client(b, P.MQTT_311)
    assert c.connect("", clean=False).reason_code == rc.V4_IDENTIFIER_REJECTED
    until_closed(c)
    assert_served(b)


def test_empty_client_id_v31_rejected():
    """MQTT 3.1 (MQIsdp): a client id is required -> return code 2 (identifier rejected)."""
    b, _ = make()
    c = Client(b, P.MQTT_31)
    assert c.connect("", clean=True).reason_code == rc.V4_IDENTIFIER_REJECTED
    until_closed(c)


def test_client_id_too_long_0x85():
    """[MQTT-3.1.3-8]: a client id the broker does not accept: CONNACK 0x85 (3.1.1: return code 2)."""
    b, _ = make(max_client_id_length=10)
    c = Client(b)
    assert c.connect("x" * 11).reason_code == rc.CLIENT_IDENTIFIER_NOT_VALID
    until_closed(c)
    c = Client(b, P.MQTT_311)
    assert c.connect("y" * 11).reason_code == rc.V4_IDENTIFIER_REJECTED
    until_closed(c)
    bye(connect(b, "z" * 10))


# ---------------------------------------------------------------- sessions

def test_session_present_flag():
    """[MQTT-3.2.2-2], [MQTT-3.2.2-3]: Session Present 0 for a new session and for Clean Start, 1
    when resuming a stored session."""
    b, _ = make()
    bye(connect(b, "me", clean_start=False, expect_present=False,
                properties={PR.SESSION_EXPIRY_INTERVAL: 60}))
    bye(connect(b, "me", clean_start=False, expect_present=True,
                properties={PR.SESSION_EXPIRY_INTERVAL: 60}))
    bye(connect(b, "me", clean_start=True, expect_present=False))
    # the last connection had Session Expiry 0: the session ended with it
    bye(connect(b, "me", clean_start=False, expect_present=False))


def test_session_present_v311():
    """3.1.1: clean session 0 resumes (session present 1); clean session 1 never has one."""
    b, _ = make()
    for clean, present in ((False, False), (False, True), (True, False)):
        c = Client(b, P.MQTT_311)
        a = c.connect("me", clean=clean)
        assert (a.reason_code, a.session_present) == (0, present)
        bye(c)


def test_clean_start_discards_session():
    """[MQTT-3.1.2-4]: Clean Start discards the existing session: its subscriptions and the messages
    queued for it."""
    b, _ = make()
    c = connect(b, "me", properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    subscribe(c, "clean", qos=1)
    bye(c)
    pub = connect(b, "pub")
    publish_ok(pub, "clean", b"queued", qos=1, expect_code=0)
    c = connect(b, "me", clean_start=True, expect_present=False,
                properties={PR.SESSION_EXPIRY_INTERVAL: 300})
    assert nothing(c), "the discarded session's queue was delivered"
    publish_ok(pub, "clean", b"after", qos=1, pid=2, expect_code=rc.NO_MATCHING_SUBSCRIBERS)
    assert nothing(c), "the discarded session's subscription still matched"


def test_session_expiry_interval_elapses():
    """3.1.2.11.2: a session is kept for its Session Expiry Interval after disconnection, not longer."""
    b, clock = make()
    bye(connect(b, "me", properties={PR.SESSION_EXPIRY_INTERVAL: 2}))
    run_for(b, clock, 1.9)
    assert "me" in b.sessions  # kept for its interval...
    run_for(b, clock, 0.1)
    bye(connect(b, "me", clean_start=False, expect_present=False))  # ...not longer


def test_session_expiry_on_disconnect_after_zero_is_protocol_error():
    """3.14.2.2.2: Session Expiry set non-zero on DISCONNECT after 0 at CONNECT: 0x82."""
    b, _ = make()
    c = connect(b)
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 60}))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(b)


def test_disconnect_session_expiry_zero_ends_session():
    """3.14.2.2.2 / 3.1.2.11.2: DISCONNECT with Session Expiry 0 ends a session that was to last."""
    b, _ = make()
    c = connect(b, "me", properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 0}))
    until_closed(c)
    bye(connect(b, "me", clean_start=False, expect_present=False))


def test_disconnect_session_expiry_extends_session():
    """3.14.2.2.2: DISCONNECT may change a non-zero Session Expiry (here 1 -> 60): the session stays."""
    b, clock = make()
    c = connect(b, "me", properties={PR.SESSION_EXPIRY_INTERVAL: 1})
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 60}))
    until_closed(c)
    run_for(b, clock, 2.3)
    bye(connect(b, "me", clean_start=False, expect_present=True))


def test_session_takeover_0x8E():
    """[MQTT-3.1.4-3]: a second connection with the same client id takes over: the old one gets
    DISCONNECT 0x8E and is closed; the new one works and keeps the session's subscriptions."""
    b, _ = make()
    old = connect(b, "me", properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    subscribe(old, "take", qos=1)
    new = connect(b, "me", clean_start=False, expect_present=True)
    expect_disconnect(old, rc.SESSION_TAKEN_OVER)
    pub = connect(b, "pub")
    publish_ok(pub, "take", b"to-new", qos=1, expect_code=0)
    assert recv_publish(new).payload == b"to-new"


def test_session_takeover_v311_closes_old():
    """3.1.1 [MQTT-3.1.4-2]: the old connection is closed (no DISCONNECT in 3.1.1)."""
    b, _ = make()
    old = Client(b, P.MQTT_311)
    old.connect("me")
    new = Client(b, P.MQTT_311)
    assert new.connect("me").reason_code == 0
    assert until_closed(old) == []
    new.send(P.PingReq())
    recv_type(new, P.PINGRESP)


# ---------------------------------------------------------------- keep alive

def test_keep_alive_timeout_0x8D():
    """[MQTT-3.1.2-22]: no packet within 1.5 x Keep Alive: DISCONNECT 0x8D and close; the will
    is published (abnormal end)."""
    b, clock = make()
    w = watcher(b, "kawill")
    c = connect(b, keep_alive=1, will=P.Will("kawill", b"ka-will", 1))
    run_for(b, clock, 1.5)
    assert nothing(c) and not c.conn.close_requested  # 1.5 x Keep Alive: not yet
    run_for(b, clock, 0.1)
    expect_disconnect(c, rc.KEEP_ALIVE_TIMEOUT)
    assert recv_publish(w).payload == b"ka-will"


def test_keep_alive_kept_by_pingreq():
    """3.1.2.10: PINGREQs within the Keep Alive keep the connection open."""
    b, clock = make()
    c = connect(b, keep_alive=1)
    for _ in range(8):
        run_for(b, clock, 0.5)
        c.send(P.PingReq())
        recv_type(c, P.PINGRESP)
    assert not c.conn.close_requested


def test_keep_alive_v311_closes():
    """3.1.1 [MQTT-3.1.2-24]: the connection is closed (no DISCONNECT) after 1.5 x Keep Alive."""
    b, clock = make()
    c = Client(b, P.MQTT_311)
    c.connect("c", keep_alive=1)
    run_for(b, clock, 1.4)
    assert not c.conn.close_requested
    run_for(b, clock, 0.2)
    assert until_closed(c) == []


def test_server_keep_alive():
    """[MQTT-3.2.2-21]: with Server Keep Alive in CONNACK the client must use it; the broker
    enforces it."""
    b, clock = make(server_keep_alive=1)
    c = connect(b, keep_alive=60)
    assert props(c.connack)[PR.SERVER_KEEP_ALIVE] == 1
    run_for(b, clock, 2)
    expect_disconnect(c, rc.KEEP_ALIVE_TIMEOUT)


def test_keep_alive_above_maximum_gets_server_keep_alive():
    """[MQTT-3.2.2-21]: a Keep Alive above the broker's maximum is replaced by Server Keep Alive."""
    b, _ = make(max_keep_alive=5)
    c = connect(b, keep_alive=60)
    assert props(c.connack).get(PR.SERVER_KEEP_ALIVE) == 5
    bye(c)
    c = connect(b, keep_alive=3)
    assert PR.SERVER_KEEP_ALIVE not in props(c.connack)


# ---------------------------------------------------------------- wills

def test_will_published_on_abnormal_close():
    """[MQTT-3.1.2-8]: the will is published when the connection closes without DISCONNECT, with its
    properties (delay interval excluded)."""
    b, _ = make()
    w = watcher(b, "will")
    wprops = {PR.CONTENT_TYPE: "text/plain", PR.USER_PROPERTY: [("k", "v"), ("k", "w")],
              PR.RESPONSE_TOPIC: "will/reply", PR.CORRELATION_DATA: b"\x01"}
    c = connect(b, will=P.Will("will", b"gone", 1, False, wprops))
    lose(c)
    m = recv_publish(w)
    assert (m.topic, m.payload, m.qos) == ("will", b"gone", 1)
    assert props(m) == wprops
    ack(w, m)
    assert nothing(w)


def test_will_not_published_on_normal_disconnect():
    """[MQTT-3.1.2-10]: DISCONNECT 0x00 deletes the will."""
    b, clock = make()
    w = watcher(b, "nowill")
    c = connect(b, will=P.Will("nowill", b"gone", 1))
    c.send(P.Disconnect(0))
    until_closed(c)
    run_for(b, clock, 1.0)
    assert nothing(w)


def test_will_published_on_disconnect_0x04():
    """3.14.2.1: DISCONNECT 0x04 (Disconnect with Will Message) publishes the will."""
    b, _ = make()
    w = watcher(b, "will04")
    c = connect(b, will=P.Will("will04", b"asked", 0))
    c.send(P.Disconnect(rc.DISCONNECT_WITH_WILL))
    until_closed(c)
    assert recv_publish(w).payload == b"asked"


def test_will_published_on_protocol_error():
    """[MQTT-3.1.2-8], 4.13: a connection closed by the broker for a protocol error publishes the will."""
    b, _ = make()
    w = watcher(b, "willerr")
    c = connect(b, will=P.Will("willerr", b"err", 1))
    c.send(P.Auth(0x19))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert recv_publish(w).payload == b"err"


def test_will_retained():
    """3.1.2.7: a will with Will Retain 1 is published as a retained message."""
    b, _ = make()
    c = connect(b, will=P.Will("willret", b"ret-will", 1, True))
    lose(c)
    s = connect(b, "s")
    subscribe(s, "willret", qos=1)
    m = recv_publish(s)
    assert (m.payload, m.retain) == (b"ret-will", True)


def test_will_delay_interval():
    """3.1.3.2.2 [MQTT-3.1.3-9]: the will is published after the Will Delay Interval, not before."""
    b, clock = make()
    w = watcher(b, "willdelay")
    c = connect(b, "wd", properties={PR.SESSION_EXPIRY_INTERVAL: 60},
                will=P.Will("willdelay", b"late", 1, False, {PR.WILL_DELAY_INTERVAL: 2}))
    lose(c)
    run_for(b, clock, 1.9)
    assert nothing(w), "will published before its delay"
    run_for(b, clock, 0.1)
    m = recv_publish(w)
    assert m.payload == b"late" and PR.WILL_DELAY_INTERVAL not in props(m)


def test_will_delay_cancelled_by_reconnect():
    """3.1.3.2.2: reconnecting before the Will Delay Interval elapses cancels the will."""
    b, clock = make()
    w = watcher(b, "willcancel")
    c = connect(b, "wc", properties={PR.SESSION_EXPIRY_INTERVAL: 60},
                will=P.Will("willcancel", b"never", 1, False, {PR.WILL_DELAY_INTERVAL: 2}))
    lose(c)
    run_for(b, clock, 0.5)
    connect(b, "wc", clean_start=False, expect_present=True,
            properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    run_for(b, clock, 3.0)
    assert nothing(w), "will published although the client came back in time"


def test_will_published_when_session_ends_before_delay():
    """[MQTT-3.1.2-8]: the will is published when the session ends, if that is before the delay."""
    b, clock = make()
    w = watcher(b, "willsess")
    c = connect(b, "ws", properties={PR.SESSION_EXPIRY_INTERVAL: 1},
                will=P.Will("willsess", b"session-end", 1, False, {PR.WILL_DELAY_INTERVAL: 30}))
    lose(c)
    run_for(b, clock, 0.9)
    assert nothing(w)
    run_for(b, clock, 0.1)  # the session's 1 s, not the will's 30 s
    assert recv_publish(w).payload == b"session-end"


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
def test_will_v311(level):
    """3.1.1 [MQTT-3.1.2-8]: a 3.1.x client's will is published to v5 subscribers on abnormal close
    and discarded on DISCONNECT."""
    b, clock = make()
    w = watcher(b, "will4")
    c = Client(b, level)
    c.connect("gone", will=P.Will("will4", b"v4-gone", 1))
    lose(c)
    assert recv_publish(w).payload == b"v4-gone"
    c = Client(b, level)
    c.connect("never", will=P.Will("will4", b"v4-never", 1))
    bye(c)
    run_for(b, clock, 1.0)
    assert nothing(w)


def test_will_qos_above_maximum_refused():
    """[MQTT-3.2.2-12]: a Will QoS above the Maximum QoS: CONNACK 0x9B."""
    b, _ = make(maximum_qos=0)
    c = Client(b)
    assert c.connect("c", will=P.Will("w/t", b"x", 1)).reason_code == rc.QOS_NOT_SUPPORTED
    until_closed(c)


def test_will_retain_without_retain_available_refused():
    """[MQTT-3.2.2-13]: Will Retain 1 when retain is not available: CONNACK 0x9A."""
    b, _ = make(retain_available=False)
    c = Client(b)
    assert c.connect("c", will=P.Will("w/t", b"x", 0, True)).reason_code == rc.RETAIN_NOT_SUPPORTED
    until_closed(c)


@pytest.mark.parametrize("wtopic", ["w/+", "w/#", ""])
def test_will_topic_invalid_closed(wtopic):
    """[MQTT-3.1.3-11]: a will topic must be a valid topic name; the connection is not accepted."""
    b, _ = make()
    c = Client(b)
    c.send(P.Connect("c", will=P.Will(wtopic, b"x", 0)))
    seen = until_closed(c)
    assert all(p.type == P.CONNACK and p.reason_code >= 0x80 for p in seen), seen
    assert not b.sessions
    assert_served(b)


# ---------------------------------------------------------------- AUTH

def test_enhanced_auth_method_refused_0x8C():
    """4.12 [MQTT-4.12.0-1]: an Authentication Method the broker does not support: CONNACK 0x8C."""
    b, _ = make()
    c = Client(b)
    a = c.connect("c", props={PR.AUTHENTICATION_METHOD: "SCRAM-SHA-1",
                              PR.AUTHENTICATION_DATA: b"client-first"})
    assert (a.reason_code, a.session_present) == (rc.BAD_AUTHENTICATION_METHOD, False)
    until_closed(c)
    assert_served(b)


def test_auth_packet_without_method_0x82():
    """[MQTT-4.12.0-7]: AUTH on a connection without an authentication method: DISCONNECT 0x82."""
    b, _ = make()
    c = connect(b)
    c.send(P.Auth(0x18, {PR.AUTHENTICATION_METHOD: "X"}))
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert_served(b)


# ---------------------------------------------------------------- CONNACK / problem information

def test_connack_capabilities():
    """3.2.2.3: CONNACK advertises the configured limits."""
    b, _ = make(receive_maximum=10, maximum_qos=1, topic_alias_maximum=4, maximum_packet_size=5000,
                wildcard_subscription_available=False, shared_subscription_available=False,
                subscription_identifiers_available=False)
    p = props(connect(b).connack)
    assert p[PR.RECEIVE_MAXIMUM] == 10 and p[PR.MAXIMUM_QOS] == 1
    assert p[PR.TOPIC_ALIAS_MAXIMUM] == 4 and p[PR.MAXIMUM_PACKET_SIZE] == 5000
    assert p[PR.WILDCARD_SUBSCRIPTION_AVAILABLE] == 0 and p[PR.SHARED_SUBSCRIPTION_AVAILABLE] == 0
    assert p[PR.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 0


def test_request_problem_information_0():
    """[MQTT-3.1.2-29]: Request Problem Information 0: no Reason String on a DISCONNECT."""
    b, _ = make()
    c = connect(b, "quiet", properties={PR.REQUEST_PROBLEM_INFORMATION: 0})
    publish(c, "", b"x")
    seen = expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert PR.REASON_STRING not in props(seen[-1])
    c = connect(b, "told")
    publish(c, "", b"x")
    seen = expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert PR.REASON_STRING in props(seen[-1])


def test_connect_raw_v5_encoding_roundtrip():
    """Sanity: the CONNECT forged by connect_bytes() is accepted (so the negative cases above fail
    only for the field they change)."""
    b, _ = make()
    c = Client(b)
    got = exchange(c.conn, connect_bytes(client_id="x") + encode(P.Disconnect()))
    assert got[0] == 0x20 and got[2:4] == b"\x00\x00", got
    assert c.conn.close_requested  # by the DISCONNECT


# ---------------------------------------------------------------- CONNACK properties (3.2.2.3)


def _expected_connack_props(cfg: dict, client_id: str, keep_alive: int, expiry: int | None) -> dict:
    """What 3.2.2.3 says the CONNACK carries, written out independently of the broker's code."""
    want = {}
    if not client_id:
        want[PR.ASSIGNED_CLIENT_IDENTIFIER] = ...  # any value [MQTT-3.2.2-16]
    if cfg["receive_maximum"] != 65535:
        want[PR.RECEIVE_MAXIMUM] = cfg["receive_maximum"]
    if cfg["maximum_qos"] < 2:
        want[PR.MAXIMUM_QOS] = cfg["maximum_qos"]
    if not cfg["retain_available"]:
        want[PR.RETAIN_AVAILABLE] = 0
    if cfg["maximum_packet_size"] < 268435455:
        want[PR.MAXIMUM_PACKET_SIZE] = cfg["maximum_packet_size"]
    if cfg["topic_alias_maximum"]:
        want[PR.TOPIC_ALIAS_MAXIMUM] = cfg["topic_alias_maximum"]
    if cfg["server_keep_alive"]:  # [MQTT-3.2.2-21]
        want[PR.SERVER_KEEP_ALIVE] = cfg["server_keep_alive"]
    elif keep_alive > cfg["max_keep_alive"] or (keep_alive == 0 and cfg["max_keep_alive"] < 65535):
        want[PR.SERVER_KEEP_ALIVE] = cfg["max_keep_alive"]
    if expiry is not None and min(expiry, cfg["session_expiry_maximum"]) != expiry:
        want[PR.SESSION_EXPIRY_INTERVAL] = cfg["session_expiry_maximum"]
    return want


@settings(max_examples=150, deadline=None)
@given(cfg=st.fixed_dictionaries({
           "receive_maximum": st.sampled_from([1, 10, 65535]),
           "maximum_qos": st.integers(0, 2), "retain_available": st.booleans(),
           "maximum_packet_size": st.sampled_from([200, 268435455]),
           "topic_alias_maximum": st.sampled_from([0, 10]),
           "server_keep_alive": st.sampled_from([0, 30]), "max_keep_alive": st.sampled_from([60, 65535]),
           "session_expiry_maximum": st.sampled_from([0, 100, 604800])}),
       clients=st.lists(st.tuples(st.sampled_from(["", "dev"]), st.sampled_from([0, 30, 60, 120]),
                                  st.sampled_from([None, 0, 50, 1000])), min_size=1, max_size=4))
def test_connack_properties_follow_the_configuration_and_the_connect(cfg, clients):
    """Every CONNACK (also the ones the broker encodes once and reuses for connections that get the
    same one) carries exactly the properties 3.2.2.3 asks for this configuration and CONNECT."""
    b, _ = make(**cfg)
    for i, (cid, keep_alive, expiry) in enumerate(clients):
        c = Client(b)
        a = c.connect(cid and f"{cid}{i}", keep_alive=keep_alive,
                      props=None if expiry is None else {PR.SESSION_EXPIRY_INTERVAL: expiry})
        assert a.reason_code == 0 and a.session_present is False
        want = _expected_connack_props(cfg, cid, keep_alive, expiry)
        got = dict(a.properties or {})
        if PR.ASSIGNED_CLIENT_IDENTIFIER in want:
            assert got.pop(PR.ASSIGNED_CLIENT_IDENTIFIER) in b.sessions
            del want[PR.ASSIGNED_CLIENT_IDENTIFIER]
        assert got == want, (cfg, cid, keep_alive, expiry)
        bye(c)


# ---------------------------------------------------------------- the per-connection decoder

@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_decoder_is_made_only_for_reads_that_are_not_one_small_packet(level):
    """Reads of one whole packet of at most 129 bytes need no per-connection Decoder (an idle
    client never gets one). A split packet gets one: before CONNACK it keeps the smaller
    max_connect_packet_size [MQTT-3.2.2-15] (0x95), after CONNACK the connection's limit."""
    b, _ = make(max_connect_packet_size=200)
    c = connect(b, "small", level)
    c.send(P.PingReq())
    c.send(P.Publish("t", b"x" * 50, 1, False, False, 1))
    assert [p.type for p in c.received()] == [P.PINGRESP, P.PUBACK] and c.conn.decoder is None
    big = encode(P.Publish("t", b"y" * 1000, 1, False, False, 2), level)  # > 200, in two reads
    c.send_bytes(big[:300])
    c.send_bytes(big[300:])
    assert [(p.type, p.packet_id) for p in c.received()] == [(P.PUBACK, 2)]
    assert c.conn.decoder is not None and c.conn.buffered() == 0 and not c.conn.close_requested
    # before CONNACK: a CONNECT over max_connect_packet_size, split, is refused from its header
    d = Client(b, level)
    wire = encode(P.Connect("big", level, will=P.Will("w", b"z" * 300, 0, False)), level)
    d.send_bytes(wire[:100])
    got = d.received()
    assert d.conn.close_requested and d.conn.buffered() == 0 and "big" not in b.sessions
    if level == P.MQTT_5:
        assert [(p.type, p.reason_code) for p in got] == [(P.CONNACK, rc.PACKET_TOO_LARGE)]
