"""What a client chooses, checked before it reaches the log or the session (sans-I/O: bytes in,
bytes out, a fake clock): control characters in client ids and user names ([MQTT-1.5.4-2]),
the escaping, shortening and rate limit of log lines about clients, anonymous clients from other
machines, a will's Response Topic ([MQTT-3.3.2-14]), MQTT 3.1's CONNACK, zero-length topic
filters ([MQTT-4.7.3-1])."""
from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import clientlog
from broker.core.clientlog import SHOWN_CHARS, ClientLog, shown
from broker.core.connection import Connection, is_loopback, loopback_host
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from tests.sansio import (
    Client,
    assert_served,
    drain,
    exchange,
    expect_disconnect,
    feed,
    make,
    subscribe,
    until_closed,
)

V3, V4, V5 = P.MQTT_31, P.MQTT_311, P.MQTT_5
CONTROL = ["\n", "\r", "\x01", "\x1b[31m", "\x7f", "\x85", "\x9f", "a\tb"]


def refused(b, level: int, client_id: str, **kw) -> P.Connack:
    """The CONNACK a CONNECT gets; asserts it refused and closed, and no session was made."""
    c = Client(b, level)
    ack = c.connect(client_id, **kw)
    assert ack.reason_code != 0 and c.conn.close_requested, ack
    assert client_id not in b.sessions
    return ack


# ---------------------------------------------------------------- control characters

@pytest.mark.parametrize("ctl", CONTROL)
@pytest.mark.parametrize("level", [V5, V4, V3])
def test_client_id_with_control_characters_refused_0x85_MQTT_1_5_4_2(level, ctl):
    """[MQTT-1.5.4-2] lets a receiver refuse control characters (U+0001-U+001F, U+007F-U+009F) in
    strings; as Mosquitto, a client id with one gets CONNACK 0x85 Client Identifier not valid
    (3.1.x: return code 2, identifier rejected) [MQTT-3.1.3-8], and no session."""
    b, _ = make()
    ack = refused(b, level, f"dev{ctl}1")
    assert ack.reason_code == (rc.CLIENT_IDENTIFIER_NOT_VALID if level == V5
                               else rc.V4_IDENTIFIER_REJECTED)
    assert_served(b)


@pytest.mark.parametrize("ctl", CONTROL)
@pytest.mark.parametrize("level", [V5, V4])
def test_user_name_with_control_characters_refused_0x86(level, ctl):
    """A user name with a control character gets CONNACK 0x86 Bad User Name or Password ("the
    data in the user name or password is malformed", 3.2.2.2; 3.1.x: return code 4) before any
    password check."""
    b, _ = make()
    ack = refused(b, level, "dev", username=f"alice{ctl}", password=b"pw")
    assert ack.reason_code == (rc.BAD_USER_NAME_OR_PASSWORD if level == V5
                               else rc.V4_BAD_USERNAME_OR_PASSWORD)


@pytest.mark.parametrize("name", ["dev-1", "é/ü 東京", "\u2028x", "a" * 300, "x\xa0y", "\U0001F600"])
def test_printable_and_non_control_characters_are_accepted(name):
    """Only C0, DEL and C1 are refused: other Unicode, spaces and long ids connect (U+2028 and
    U+00A0 are not control characters, they are escaped in log lines instead)."""
    b, _ = make()
    c = Client(b)
    assert c.connect(name, username=name).reason_code == 0 and name in b.sessions


# ---------------------------------------------------------------- log lines about clients

def test_shown_escapes_and_cuts():
    assert shown("plain id") == "plain id"
    assert shown("a\nINFO forged line") == "a\\x0aINFO forged line"
    assert shown("\x1b[2J\x85\u2028\U000e0001") == "\\x1b[2J\\x85\\u2028\\U000e0001"
    long = shown("x" * 65000)
    assert long == "x" * SHOWN_CHARS + f"...(+{65000 - SHOWN_CHARS:,} chars)"
    assert shown(None) == "None" and shown(ValueError("bad\ntopic")) == "bad\\x0atopic"


@given(st.text(max_size=500))
@settings(max_examples=300, deadline=None)
def test_shown_is_one_printable_bounded_line(s):
    out = shown(s)
    assert out.isprintable() and "\n" not in out and "\r" not in out
    assert len(out) <= SHOWN_CHARS * 10 + 40  # each kept character escapes to at most 10


def test_log_lines_for_a_refused_long_id_are_short(caplog):
    """A client id with a newline cannot forge a log line, and 65,000 characters of it do not
    reach the log: its refusal is one line, the id escaped and cut at SHOWN_CHARS."""
    b, _ = make()
    caplog.set_level(logging.INFO)
    refused(b, V5, "a\n2024-01-01 00:00:00 INFO broker: forged " + "y" * 65000)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and len(line) < 1000 and "a\\x0a2024-01-01" in line, line
    assert "the client id contains control characters" in line


def test_malformed_publish_after_long_id_logs_one_short_line(caplog):
    """300 connections with 65,000-character ids, each closed for a bad PUBLISH: 300 short lines
    at most (before: 65 KB each, 18.6 MiB in all); no line holds a raw newline."""
    b, clock = make(client_log_lines_per_second=0)  # the per-line bound alone here
    caplog.set_level(logging.INFO)
    for i in range(300):
        c = Client(b)
        assert c.connect(f"{i:03d}" + "z" * 64997).reason_code == 0
        drain(c.conn)
        feed(c.conn, b"\x30\x02\x00\x05")  # topic length runs past the packet: malformed
        assert c.conn.close_requested
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert len(caplog.records) == 300 and len(text) < 300 * 700, len(text)


def test_per_connection_log_lines_are_rate_limited_and_summarized(caplog):
    """One connection logs at most PER_CONNECTION_BURST lines, then one per
    PER_CONNECTION_INTERVAL seconds; what is left out is counted in one WARNING (Broker.tick)."""
    b, clock = make()
    caplog.set_level(logging.INFO)
    c = Client(b)
    c.connect("noisy")
    for _ in range(50):
        c.conn.note(logging.INFO, "event about %s", "noisy")
    mine = [r for r in caplog.records if "event about" in r.getMessage()]
    assert len(mine) == clientlog.PER_CONNECTION_BURST
    clock.t += clientlog.PER_CONNECTION_INTERVAL
    assert c.conn.note(logging.INFO, "event about %s", "noisy")
    assert not c.conn.note(logging.INFO, "event about %s", "noisy")
    other = Client(b)
    other.connect("quiet")
    assert other.conn.note(logging.INFO, "event about %s", "quiet")  # another connection's share
    clock.t += clientlog.SUMMARY_INTERVAL
    b.tick()
    summary = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert summary and summary[0].startswith(f"{50 - clientlog.PER_CONNECTION_BURST + 1} log lines")


class Conn:
    """What ClientLog needs of a connection."""
    log_at = 0.0


def client_log(lines_per_second: float):
    """(a ClientLog on a fake clock, that clock: a one-item list, a logger at INFO)."""
    clock = [1000.0]
    logger = logging.getLogger("test.clients")
    logger.setLevel(logging.INFO)
    return ClientLog(lambda: clock[0], lines_per_second), clock, logger


def test_all_clients_together_are_rate_limited():
    """Many connections cannot flood the log: all together at most lines_per_second on average
    (bursts of BURST_SECONDS of it)."""
    log, clock, logger = client_log(5)
    written = sum(log.line(logger, logging.INFO, Conn(), "x %s", i) for i in range(1000))
    assert written == 5 * clientlog.BURST_SECONDS
    clock[0] += 10
    written = sum(log.line(logger, logging.INFO, Conn(), "x %s", i) for i in range(1000))
    assert written == 50 and log.suppressed == 2 * 1000 - 50 - written


@given(st.lists(st.tuples(st.integers(0, 9), st.floats(0, 30)), max_size=200))
@settings(max_examples=100, deadline=None)
def test_log_budget_property(events):
    """Whatever the order: no connection gets more than its burst plus one line per interval of
    elapsed time, and nothing is both written and counted as left out."""
    log, clock, logger = client_log(0)
    conns = [Conn() for _ in range(10)]
    written = [0] * 10
    start = clock[0]
    for who, dt in events:
        clock[0] += dt
        written[who] += log.line(logger, logging.INFO, conns[who], "e")
    elapsed = clock[0] - start
    for n in written:
        assert n <= clientlog.PER_CONNECTION_BURST + elapsed / clientlog.PER_CONNECTION_INTERVAL + 1
    assert sum(written) + log.suppressed == len(events)


# ---------------------------------------------------------------- anonymous clients, by address

@pytest.mark.parametrize("peer,local", [
    ("127.0.0.1:5000", True), ("127.8.9.10:1", True), ("::1:5000", True), ("[::1]:5000", True),
    ("ws:127.0.0.1:7", True), ("::ffff:127.0.0.1:9", True), ("10.0.0.1:5000", False),
    ("192.0.2.2:1883", False), ("fd00::2:4000", False), ("ws:10.1.1.1:8", False), ("?", False)])
def test_is_loopback(peer, local):
    assert is_loopback(peer) is local


@pytest.mark.parametrize("host,local", [
    ("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("0:0:0:0:0:0:0:1", True),
    ("192.0.2.2", False), ("fe80::1%eth0", False), ("::ffff:10.0.0.1", False), ("", False),
    (None, False)])
def test_loopback_host(host, local):
    """What the transport's peer address says (MQTTProtocol.peer_is_loopback)."""
    assert loopback_host(host) is local


@pytest.mark.parametrize("level", [V5, V4])
def test_anonymous_client_from_another_machine_refused_0x87(level):
    """Secure default (auth.allow_anonymous unset, as Mosquitto 2's local-only default): a client
    without a user name from a non-loopback address gets CONNACK 0x87 Not authorized (3.1.x:
    return code 5); from this machine it connects; with a user name it goes on to the checks."""
    b, _ = make()
    b.anonymous_remote = False
    far = Client(b, level)
    far.conn.peer = "192.0.2.7:40000"
    ack = far.connect("far")
    assert ack.reason_code == (rc.NOT_AUTHORIZED if level == V5 else rc.V4_NOT_AUTHORIZED)
    assert far.conn.close_requested and "far" not in b.sessions
    if level == V5:
        assert "auth.allow_anonymous" in ack.properties[PR.REASON_STRING]
    near = Client(b, level)
    near.conn.peer = "127.0.0.1:40001"
    assert near.connect("near").reason_code == 0
    named = Client(b, level)
    named.conn.peer = "192.0.2.7:40002"
    assert named.connect("named", username="u", password=b"p").reason_code == 0  # no auth hook
    b.anonymous_remote = True  # auth.allow_anonymous = true
    again = Client(b, level)
    again.conn.peer = "192.0.2.7:40003"
    assert again.connect("far").reason_code == 0


def test_server_lets_anonymous_remote_clients_in_only_when_allowed_explicitly():
    from broker.server import Server
    from settings import Config
    assert Server(Config()).broker.anonymous_remote is False
    cfg = Config()
    cfg.auth.allow_anonymous = True
    assert Server(cfg).broker.anonymous_remote is True


def test_startup_line_says_who_may_connect():
    from broker.server import who_may_connect
    from settings import Config, ListenerConfig
    cfg = Config()
    local = who_may_connect(ListenerConfig(host="127.0.0.1", port=1), cfg)
    assert local == "this machine only; no users (no auth.password_file); anonymous clients"
    wide = who_may_connect(ListenerConfig(host="0.0.0.0", port=1), cfg)
    assert wide.startswith("reachable from other machines") and \
        "anonymous clients from this machine only" in wide and "python -m broker.auth passwd" in wide
    cfg.auth.password_file = "/etc/broker/passwd"
    assert who_may_connect(ListenerConfig(host="0.0.0.0", port=1), cfg) == \
        "reachable from other machines; user names and passwords from /etc/broker/passwd; " \
        "no anonymous clients"
    cfg.auth.allow_anonymous = True
    assert "anonymous clients from anywhere" in who_may_connect(ListenerConfig(host="::", port=1), cfg)


def test_default_listener_is_this_machine_only():
    from settings import Config
    assert Config().host == "127.0.0.1" and Config().auth.allow_anonymous is None


# ---------------------------------------------------------------- will Response Topic

@pytest.mark.parametrize("rt", ["reply/+", "reply/#", "#", "+", ""])
def test_will_response_topic_with_wildcard_refused_0x82_MQTT_3_3_2_14(rt):
    """[MQTT-3.3.2-14]: a Response Topic is a Topic Name, without wildcards; in a will (3.1.3.2)
    as in a PUBLISH: CONNACK 0x82 Protocol Error, the connection closed, no session."""
    b, _ = make()
    will = P.Will("w/t", b"bye", 0, False, {PR.RESPONSE_TOPIC: rt})
    c = Client(b)
    c.send(P.Connect("willer", V5, will=will))
    (ack,) = until_closed(c)
    assert (ack.type, ack.reason_code) == (P.CONNACK, rc.PROTOCOL_ERROR)
    assert "willer" not in b.sessions
    good = Client(b)
    assert good.connect("ok", will=P.Will("w/t", b"bye", 0, False,
                                          {PR.RESPONSE_TOPIC: "reply/ok"})).reason_code == 0


# ---------------------------------------------------------------- MQTT 3.1 CONNACK

def test_mqtt31_connack_has_no_session_present_flag():
    """MQTT 3.1 (protocol level 3) has no session present flag: the first byte of its CONNACK is
    reserved, so a client reconnecting with clean session 0 gets 20 02 00 00 (3.1.1: 20 02 01 00,
    [MQTT-3.2.2-2]), and still finds its session."""
    b, _ = make()
    for level, second in ((V3, "20020000"), (V4, "20020100")):
        cid = f"persist{level}"
        c = Client(b, level)
        assert exchange(c.conn, encode(P.Connect(cid, level, clean_start=False), level)).hex() \
            == "20020000"
        subscribe(c, f"keep/{level}", qos=1)
        c.conn.connection_lost()
        again = Client(b, level)
        got = exchange(again.conn, encode(P.Connect(cid, level, clean_start=False), level))
        assert got.hex() == second
        assert f"keep/{level}" in b.sessions[cid].subscriptions


# ---------------------------------------------------------------- zero-length topic filters

def _unsubscribe_bytes(level, filters, pid=7):
    return encode(P.Unsubscribe(pid, filters), level)


@pytest.mark.parametrize("filters", [[""], ["ok", ""], ["", "ok"]])
def test_unsubscribe_zero_length_filter_is_malformed_MQTT_4_7_3_1(filters):
    """[MQTT-4.7.3-1]: a Topic Filter is at least one character: an UNSUBSCRIBE with a
    zero-length one is malformed: DISCONNECT 0x81 (v5; before: UNSUBACK 0x11), the connection
    closed (3.1.1: closed without a packet), as Mosquitto's 02-unsubscribe tests expect."""
    b, _ = make()
    c = Client(b)
    c.connect("u5")
    feed(c.conn, _unsubscribe_bytes(V5, filters))
    expect_disconnect(c, rc.MALFORMED_PACKET)
    old = Client(b, V4)
    old.connect("u4")
    feed(old.conn, _unsubscribe_bytes(V4, filters))
    assert until_closed(old) == []
    assert_served(b)


@pytest.mark.parametrize("level", [V5, V4])
def test_subscribe_zero_length_filter_is_malformed_MQTT_4_7_3_1(level):
    """The same for SUBSCRIBE (Mosquitto: "Empty subscription string ..., disconnecting")."""
    b, _ = make()
    c = Client(b, level)
    c.connect("s")
    c.send(P.Subscribe(3, [("ok", P.SubscriptionOptions(0)), ("", P.SubscriptionOptions(0))]))
    if level == V5:
        expect_disconnect(c, rc.MALFORMED_PACKET)
    else:
        assert until_closed(c) == []
    assert b.router.count == 0  # the whole packet refused: "ok" was not subscribed either
    assert_served(b)


def test_connection_default_peer_is_not_loopback():
    b, _ = make()
    assert not is_loopback(Connection(b).peer)
