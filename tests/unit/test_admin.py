"""The operator's side without sockets: the read-only BrokerView, the core's commands (kick,
publish), per-topic counts fed by the accepted-message hook, the ban list at CONNECT, operators'
accounts, login sessions, throttling and the bounded login check pool."""
from __future__ import annotations

import asyncio
import os
import stat
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.admin.accounts import Accounts, parse_accounts, read_accounts, set_account
from broker.admin.bans import BanList, peer_address
from broker.admin.service import AdminError, AdminService
from broker.auth.acl import AuthFileError
from broker.core.hooks import Hook
from broker.core.message import Message
from broker.core.view import BrokerView
from broker.dashboard.live import TopicCounter
from broker.dashboard.login import Busy, LoginChecks, Sessions, Throttle
from broker.protocol import packets as P
from tests.sansio import Client, expect_disconnect, make, publish_ok, recv_publish, subscribe


def connected(b, cid, level=5, **kw):
    c = Client(b, level)
    ack = c.connect(cid, **kw)
    assert ack.reason_code == 0
    c.conn.peer = "192.0.2.7:5555"
    return c


# ---- the read-only view -----------------------------------------------------------------------

def test_view_lists_clients_sessions_subscriptions_and_retained_as_plain_records():
    b, clock = make()
    a = connected(b, "b-client", props={0x11: 600})
    subscribe(a, "x/+", qos=1)
    c = connected(b, "a-client", level=4)
    publish_ok(c, "r/1", b"one", qos=1, retain=True)
    publish_ok(c, "$internal", b"sys", qos=0, retain=True)
    v = BrokerView(b)
    recs, matched = v.clients()
    assert matched == 2 and [r.client_id for r in recs] == ["a-client", "b-client"]
    assert recs[0].protocol == "3.1.1" and recs[1].subscriptions[0].filter == "x/+"
    assert recs[1].subscription_count == 1 and recs[1].address == "192.0.2.7:5555"
    assert v.clients("B-CL")[1] == 1 and v.client("nobody") is None
    subs, n = v.subscriptions()
    assert n == 1 and (subs[0].client_id, subs[0].filter, subs[0].qos) == ("b-client", "x/+", 1)
    sess, n = v.sessions()
    assert n == 2 and all(s.connected for s in sess)
    r, n = v.retained("#")
    assert [(m.topic, m.payload) for m in r] == [("r/1", b"one")]  # '#' skips $ topics
    st_ = v.stats()
    assert st_["retained"] + st_["retained_sys"] == 2 and st_["subscriptions"] == 1
    # records are copies: changing the broker later does not change them
    a.conn.connection_lost()
    assert recs[1].client_id == "b-client" and v.sessions(connected=False)[1] == 1
    assert v.sessions(connected=False)[0][0].expires_in == 600


def test_sys_retained_messages_are_counted_apart():
    b, _ = make()
    b.publish_local(Message("$SYS/broker/uptime", b"1", 0, True, None, None, None, 0.0))
    b.publish_local(Message("$SYS/broker/x/y", b"1", 0, True, None, None, None, 0.0))
    c = connected(b, "p")
    publish_ok(c, "a/b", b"v", qos=1, retain=True)
    s = BrokerView(b).stats()
    assert (s["retained"], s["retained_sys"]) == (1, 2)


def test_per_topic_counts_come_from_the_accepted_message_hook_not_the_router():
    b, _ = make()
    assert not hasattr(b, "topic_counts")
    tc = TopicCounter(max_topics=10)
    b.add_hook(tc)
    c = connected(b, "pub")
    for i in range(25):
        publish_ok(c, f"t/{i}", b"x", qos=1, pid=i + 1)
    assert len(tc.counts) == 10
    tc.sample(1.0)                      # every counted topic was active: all kept
    assert len(tc.counts) == 10 and tc.rates
    publish_ok(c, "t/0", b"x", qos=1, pid=99)
    tc.sample(2.0)                      # nine idle topics dropped: room for new ones
    assert set(tc.counts) == {"t/0"}
    b.route(Message("routed/only", b"x", 0, False, None, None, "c", 0.0), None)
    assert "routed/only" not in tc.counts  # routing alone counts nothing
    b.remove_hook(tc)
    publish_ok(c, "after", b"x", qos=1, pid=100)
    assert "after" not in tc.counts and b.accepting == ()


# ---- commands ---------------------------------------------------------------------------------

class Recorder(Hook):
    provides = frozenset({"on_message_accepted", "on_retain"})

    def __init__(self, accept=True):
        self.accepted, self.retained, self.accept = [], [], accept

    def on_message_accepted(self, msg, client_id, username, protocol):
        self.accepted.append((msg.topic, client_id, username))
        return self.accept

    def on_retain(self, topic, msg):
        self.retained.append((topic, msg and msg.payload))


def test_admin_publish_goes_to_the_sink_hooks_is_retained_and_routed():
    b, _ = make()
    rec = Recorder()
    b.add_hook(rec)
    sub = connected(b, "sub")
    subscribe(sub, "cmd/#", qos=1)
    admin = AdminService(b)
    assert admin.publish("cmd/a", b"go", qos=1, retain=True, content_type="text/plain",
                         user_properties=[("k", "v")], username="root") == 1
    got = recv_publish(sub)
    assert (got.topic, got.payload, got.qos) == ("cmd/a", b"go", 1)
    assert rec.accepted == [("cmd/a", "$admin", "root")] and rec.retained == [("cmd/a", b"go")]
    assert admin.delete_retained("cmd/a") is True and rec.retained[-1] == ("cmd/a", None)
    assert admin.delete_retained("cmd/a") is False
    rec.accept = False    # the sink refuses (spool full): nothing retained or routed
    from broker.admin.service import Refused
    with pytest.raises(Refused):
        admin.publish("cmd/b", b"x", retain=True)
    assert BrokerView(b).retained("#")[1] == 0
    for bad in (dict(topic="a/#"), dict(topic="$SYS/a"), dict(topic="a", qos=5),
                dict(topic="a", message_expiry=0), dict(topic="a", utf8=True, payload=b"\xff")):
        kw = {"payload": b"x", **bad}
        with pytest.raises(AdminError):
            admin.publish(kw.pop("topic"), kw.pop("payload"), **kw)


@pytest.mark.parametrize("topic, payload, kw, says", [
    ("a\x00b", b"x", {}, "[MQTT-4.7.3-2]"),
    ("t/" + "x" * 70_000, b"x", {"retain": True}, "[MQTT-4.7.3-3]"),
    ("a/\ud800", b"x", {}, "[MQTT-1.5.4-1]"),
    ("", b"x", {}, "[MQTT-4.7.3-1]"),
    ("a/+", b"x", {}, "[MQTT-3.3.2-2]"),
    ("a", b"x", {"response_topic": "r\x00"}, "Response Topic"),
    ("a", b"x", {"content_type": "\ud800"}, "Content Type"),
    ("a", b"x", {"user_properties": [("k", "v\x00")]}, "User Property"),
    ("a", bytes(2000), {}, "mqtt.maximum_packet_size"),
])
def test_admin_publish_refuses_what_a_publish_could_not_carry(topic, payload, kw, says):
    """The operator's publish is held to a client PUBLISH's checks: topic name [MQTT-4.7.3-1],
    [MQTT-4.7.3-2], [MQTT-3.3.2-2], strings [MQTT-1.5.4-1], [MQTT-1.5.4-2], the maximum packet
    size; nothing is retained or routed, and the reason names the rule."""
    b, _ = make(maximum_packet_size=1000)
    sub = connected(b, "sub")
    subscribe(sub, "#", qos=0)
    admin = AdminService(b)
    with pytest.raises(AdminError) as err:
        admin.publish(topic, payload, **kw)
    assert says in str(err.value)
    assert BrokerView(b).retained("#")[1] == 0 and sub.received() == []


def test_admin_deletes_any_stored_retained_topic():
    """What is stored can be deleted, even under a topic that should never have got in."""
    b, _ = make()
    bad = "t/" + "x" * 70_000
    b.retained.set(bad, Message(bad, b"x", 0, True, None, None, "c", 1.0))
    admin = AdminService(b)
    assert admin.delete_retained(bad) is True and BrokerView(b).retained("#")[1] == 0
    with pytest.raises(AdminError):
        admin.delete_retained("a/#")


def test_kick_sends_administrative_action():
    b, _ = make()
    c = connected(b, "k")
    assert b.kick("k") is True
    expect_disconnect(c, 0x98)
    assert b.kick("k") is False


# ---- bans -------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, code", [(5, 0x8A), (4, 5)])
def test_banned_connects_are_refused_before_any_password_check(tmp_path, level, code):
    b, _ = make()
    bans = BanList(str(tmp_path / "bans.json"))
    b.bans = bans.check
    bans.add("clientid", "evil")
    c = Client(b, level)
    assert c.connect("evil").reason_code == code
    bans.add("address", "192.0.2.0/24")
    c = Client(b, level)
    c.conn.peer = "192.0.2.9:1234"
    assert c.connect("fine").reason_code == code
    c = Client(b, level)
    c.conn.peer = "198.51.100.1:1234"
    assert c.connect("fine").reason_code == 0
    # read back from the file, private
    again = BanList(str(tmp_path / "bans.json"))
    assert {(x["kind"], x["value"]) for x in again.list()} == \
        {("clientid", "evil"), ("address", "192.0.2.0/24")}
    assert stat.S_IMODE(os.stat(tmp_path / "bans.json").st_mode) == 0o600


def test_bans_end_at_their_time():
    now = [1000.0]
    bans = BanList(None, clock=lambda: now[0])
    bans.add("username", "u", until=1010.0)
    assert bans.check("c", "u", "1.2.3.4:1") is not None
    now[0] = 1011.0
    assert bans.check("c", "u", "1.2.3.4:1") is None and bans.list() == []


@given(st.ip_addresses(), st.integers(min_value=0, max_value=65535))
@settings(max_examples=200)
def test_peer_address_is_the_host_of_any_peer_string(ip, port):
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    for peer in (f"{host}:{port}", f"ws:{host}:{port}"):
        assert peer_address(peer) == str(ip)
    if ip.version == 6:   # asyncio's peername, unbracketed
        assert peer_address(f"{ip}:{port}") == str(ip)


# ---- accounts ---------------------------------------------------------------------------------

def test_accounts_file_problems_name_their_line(tmp_path):
    good = "$scrypt$16$1$1$c2FsdHNhbHRzYWx0$" + "A" * 44
    text = (f"# ops\nroot:admin:{good}\nbad line\nann:boss:{good}\nroot:viewer:{good}\n"
            "bob:viewer:plaintext\n")
    with pytest.raises(AuthFileError) as e:
        parse_accounts(text, "ops")
    assert [x.split(":")[1] for x in e.value.errors] == ["3", "4", "5", "6"]
    assert "role 'boss'" in e.value.errors[1] and "appears twice" in e.value.errors[2]


def test_accounts_check_roles_and_first_admin(tmp_path):
    path = str(tmp_path / "ops")
    acc = Accounts(path)
    where = acc.ensure_first_admin("admin", "", str(tmp_path))
    secret = open(where).read().strip()
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o600
    assert acc.check("admin", secret.encode()) == "admin"
    assert acc.check("admin", b"wrong") is None and acc.check("nobody", secret.encode()) is None
    assert acc.ensure_first_admin("admin", "", str(tmp_path)) is None  # only the first time
    set_account(path, "viewer1", "viewer", "pw")
    assert acc.reload() and acc.role("viewer1") == "viewer"
    assert set(read_accounts(path)) == {"admin", "viewer1"}


# ---- logins -----------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_sessions_are_bounded_and_expire():
    clock = Clock()
    s = Sessions(lifetime=60, max_sessions=3, clock=clock)
    opened = [s.open(f"u{i}", "viewer", "a") for i in range(5)]
    assert len(s) == 3 and s.get(opened[0].token) is None and s.get(opened[4].token)
    key = s.basic_key("u9", b"pw")
    s9 = s.open("u9", "admin", "a", basic=key)
    assert s.for_basic(key) is s9 and s.for_basic(s.basic_key("u9", b"other")) is None
    clock.t += 61
    assert s.get(s9.token) is None and s.for_basic(key) is None
    s.expire(clock())   # the dashboard's sampler does this every few seconds
    assert len(s) == 0 and not s._basic


@pytest.mark.parametrize("start", [100.0, 1e6])   # the monotonic clock of a machine up for days
def test_throttle_spaces_an_account_and_address_checks_after_the_free_failures(start):
    """After `free` wrong passwords for one account from one address, that pair's checks take
    turns one second apart (each attempt waits for its turn, then is checked: a right password
    gets in); turns further than max_wait away are refused; other pairs are not affected."""
    clock = Clock()
    clock.t = start
    t = Throttle(free=3, max_wait=4, clock=clock, max_keys=2)
    key = ("root", "a")
    for _ in range(3):
        assert t.turn(key) == 0
        t.failed(key)
    waits = [t.turn(key) for _ in range(7)]   # attempts arriving together (a poller's burst)
    assert waits == [0, 1, 2, 3, 4, None, None] and t.refused == 2
    assert t.retry_after(key) >= 1
    assert t.turn(("other", "a")) == 0 and t.turn(("root", "b")) == 0  # per account and address
    clock.t += 10                              # the queue drained: a turn at once again
    assert t.turn(key) == 0 and t.turn(key) == 1
    t.succeeded(key)                           # the owner got in: the pair starts over
    assert t.turn(key) == 0 and t.turn(key) == 0
    for _ in range(3):
        t.failed(key)
    clock.t += 3601       # an hour without a failure: counted from scratch
    assert t.turn(key) == 0 and t.turn(key) == 0
    for addr in ("b", "c", "d"):
        t.failed(("root", addr))
    assert len(t.state) == 2   # bounded


async def test_login_checks_are_bounded_and_answer_busy_at_once():
    release = threading.Event()

    class Slow:
        def login(self, user, password):
            release.wait(10)
            return "admin" if password == b"ok" else None
    checks = LoginChecks(Slow(), threads=1, max_pending=2)
    first = asyncio.ensure_future(checks.check("a", "u", b"ok"))
    second = asyncio.ensure_future(checks.check("b", "u", b"no"))
    await asyncio.sleep(0.05)
    with pytest.raises(Busy):
        await checks.check("c", "u", b"ok")
    assert checks.refused == 1
    release.set()
    assert await first == "admin" and await second is None
    checks.close()


def test_cli_lists_are_aligned_columns_under_a_header_and_none_when_empty():
    """`python -m broker.admin ... list` prints aligned columns with a header (as `emqx ctl`
    does), "-" for a missing value, "(none)" for an empty list; --json is for scripts."""
    from broker.admin.__main__ import table
    rows = [{"kind": "clientid", "value": "dev-1", "reason": None},
            {"kind": "ip", "value": "10.0.0.0/8", "reason": "a long\nreason"}]
    assert table(rows, ("kind", "value", "reason")).splitlines() == [
        "KIND      VALUE       REASON",
        "clientid  dev-1       -",
        "ip        10.0.0.0/8  a long reason"]
    assert table([], ("kind",)) == "(none)"


def test_an_audit_line_stays_one_line_whatever_the_client_sent(caplog):
    """Line breaks and other control characters in any part (the path a client chose, a topic, a
    user name, an error message) are escaped: one command, one line."""
    import logging

    from broker.admin.service import audit
    forged = "\naudit: user='root' from='127.0.0.1' action=ban -> ok"
    with caplog.at_level(logging.INFO, logger="broker.audit"):
        audit("viewer\r\n", "127.0.0.1", "DELETE /api/v1/retained" + forged,
              "refused 400: " + forged, **{"topic": "a" + forged, "k\n": "v"})
    (rec,) = caplog.records
    line = rec.getMessage()
    assert "\n" not in line and "\r" not in line and line.count("audit:") == 4
    assert line.startswith("audit: user='viewer\\r\\n' from='127.0.0.1' action=DELETE ")
    assert "\\x0aaudit: user='root'" in line


@pytest.mark.parametrize("topic", ["a", "a/b/c", "a/+", "#", "a\x00b", "", "x" * 11, "a/b/c/d",
                                   "\u00e9" * 5, "\u00e9" * 6, "$x/y", " "])
def test_the_shared_message_check_agrees_with_a_client_publish(topic):
    """publish_problem (what the admin API, a replay and a restore apply) refuses exactly the
    topics a client's PUBLISH is refused for, under the same [mqtt] limits [MQTT-4.7.3-1],
    [MQTT-4.7.3-2], [MQTT-3.3.2-2], mqtt.max_topic_length and max_topic_levels."""
    from broker.core.message import check_new_message
    b, _ = make(max_topic_length=10, max_topic_levels=3)
    c = connected(b, "pub")
    c.send_bytes(b"\x32" + bytes([2 + len(topic.encode()) + 2 + 1 + 1]) +
                 len(topic.encode()).to_bytes(2, "big") + topic.encode() + b"\x00\x01\x00x")
    pkts = c.received()
    refused = bool(c.conn.close_requested) or any(
        p.type == P.PUBACK and p.reason_code >= 0x80 for p in pkts)
    assert refused == (check_new_message(topic, b"x", None, b.cfg) is not None), pkts
