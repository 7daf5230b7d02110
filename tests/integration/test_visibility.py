"""Who may see what, through real sockets: session ownership, client id patterns, ACL deny
rules checked per message, %c/%u that fail closed, $SYS reserved to the broker."""
from __future__ import annotations

import time

import pytest

from broker.auth import AccessControl
from broker.protocol import properties as PR
from tests.conftest import BrokerProcess
from tests.integration.helpers import (
    P,
    RawClient,
    bye,
    cid,
    expect_disconnect,
    publish_ok,
    recv_publish,
    uniq,
)
from tests.integration.test_auth import InProcessBroker, write_auth_files

pytestmark = pytest.mark.timeout(120)

USERS = {"alice": "wonderland", "bob": "builder", "carol": "c4rol", "dev": "d3v", "admin": "root"}
ACL = """\
user alice
topic readwrite alice/#
topic readwrite shared/#

user bob
topic readwrite bob/#
topic readwrite shared/#
pattern readwrite inbox/%c/#

user carol
topic readwrite #
topic deny test/nosubscribe
topic deny secret/#

user dev
topic readwrite #

user admin
topic readwrite #

pattern deny blocked/%c
"""
HOUR = {PR.SESSION_EXPIRY_INTERVAL: 3600}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_auth_files(tmp_path_factory.mktemp("vis"), USERS, ACL)


@pytest.fixture(scope="module")
def port(files):
    pw, acl = files
    b = InProcessBroker(AccessControl(password_file=str(pw), acl_file=str(acl))).start()
    yield b.port
    b.stop()


def attempt(port, user, client_id, level=P.MQTT_5, clean_start=False, properties=None):
    """(client, CONNACK) for a CONNECT as `user` (password right)."""
    c = RawClient(port, level=level)
    props = properties if properties is not None else \
        (HOUR if level == P.MQTT_5 and not clean_start else None)
    ack = c.connect(client_id, clean_start=clean_start, properties=props, username=user,
                    password=USERS[user].encode())
    return c, ack


def login(port, user, client_id=None, level=P.MQTT_5, clean_start=False):
    c, ack = attempt(port, user, client_id or cid(user), level, clean_start)
    assert ack.reason_code == 0, ack
    c.connack = ack
    return c


def assert_refused(c, ack, code):
    assert (ack.reason_code, ack.session_present) == (code, False), ack
    assert c.expect_closed() == []
    c.close()


def still_served(c, topic):
    """The connection still works: a message to its own subscription comes back."""
    publish_ok(c, topic, b"alive", qos=1, pid=77, expect_code=0)
    m = recv_publish(c)
    assert (m.topic, m.payload) == (topic, b"alive")
    c.send(P.Ack(P.PUBACK, m.packet_id))


# ------------------------------------------------------------------ session ownership
def test_other_user_cannot_resume_an_offline_session_nor_read_its_queue(port):
    cid_ = cid("alice")
    alice = login(port, "alice", cid_)
    assert alice.subscribe("shared/q", qos=1).reason_codes == [1]
    bye(alice)
    admin = login(port, "admin")
    publish_ok(admin, "shared/q", b"for alice", qos=1, expect_code=0)   # queued for alice
    for level, code in ((P.MQTT_5, 0x87), (P.MQTT_311, 5)):
        for clean in (False, True):   # Clean Start 1 would discard alice's session: refused too
            assert_refused(*attempt(port, "bob", cid_, level, clean), code)
    alice = login(port, "alice", cid_)
    assert alice.connack.session_present is True               # her session is intact
    m = recv_publish(alice)
    assert (m.topic, m.payload) == ("shared/q", b"for alice")  # and so is her queue
    alice.send(P.Ack(P.PUBACK, m.packet_id))
    bye(alice, admin)


def test_other_user_cannot_take_over_a_connected_session(port):
    cid_ = cid("alice")
    alice = login(port, "alice", cid_)
    assert alice.subscribe("alice/own", qos=1).reason_codes == [1]
    for level, code in ((P.MQTT_5, 0x87), (P.MQTT_311, 5)):
        assert_refused(*attempt(port, "bob", cid_, level), code)
    assert alice.nothing(0.3)                  # no DISCONNECT 0x8E: alice stays connected
    still_served(alice, "alice/own")
    bye(alice)


def test_same_user_still_takes_over_its_own_session(port):
    cid_ = cid("alice")
    first = login(port, "alice", cid_)
    assert first.subscribe("alice/t", qos=1).reason_codes == [1]
    second = login(port, "alice", cid_)
    assert second.connack.session_present is True
    expect_disconnect(first, 0x8E)             # [MQTT-3.1.4-3]: session taken over
    still_served(second, "alice/t")
    bye(second)


def test_session_owner_survives_a_restart(tmp_path):
    """The owner is stored with the session: after a restart another user is still refused."""
    b = BrokerProcess(tmp_path).start()   # no password file: user names are claimed, not verified
    try:
        c = RawClient(b.port)
        assert c.connect("meter-1", clean_start=False, properties=HOUR,
                         username="alice").reason_code == 0
        assert c.subscribe("m/#", qos=1).reason_codes == [1]
        bye(c)
        time.sleep(0.3)
        b.stop()
        b.start()
        c = RawClient(b.port)
        ack = c.connect("meter-1", clean_start=False, properties=HOUR, username="bob")
        assert_refused(c, ack, 0x87)
        c = RawClient(b.port)
        ack = c.connect("meter-1", clean_start=False, properties=HOUR, username="alice")
        assert (ack.reason_code, ack.session_present) == (0, True)
        bye(c)
    finally:
        b.stop()


def test_session_owner_check_can_be_switched_off(tmp_path):
    b = BrokerProcess(tmp_path, {"mqtt.session_owner_check": False}).start()
    try:
        a = RawClient(b.port)
        assert a.connect("shared-id", clean_start=False, properties=HOUR,
                         username="alice").reason_code == 0
        c = RawClient(b.port)
        ack = c.connect("shared-id", clean_start=False, properties=HOUR, username="bob")
        assert (ack.reason_code, ack.session_present) == (0, True)   # the old behaviour
        expect_disconnect(a, 0x8E)
        bye(c)
    finally:
        b.stop()


def test_client_id_pattern(files):
    pw, acl = files
    b = InProcessBroker(AccessControl(password_file=str(pw), acl_file=str(acl),
                                      client_id_pattern="%u-*")).start()
    try:
        bye(login(b.port, "alice", "alice-phone"))
        assert_refused(*attempt(b.port, "alice", "bob-phone"), 0x85)
        assert_refused(*attempt(b.port, "alice", "bob-phone", P.MQTT_311), 2)  # identifier rejected
        assert_refused(*attempt(b.port, "alice", "alice"), 0x85)
        # a client id assigned by the broker is not the client's choice: accepted
        c = RawClient(b.port)
        ack = c.connect("", username="alice", password=USERS["alice"].encode())
        assert ack.reason_code == 0 and ack.properties[PR.ASSIGNED_CLIENT_IDENTIFIER]
        bye(c)
    finally:
        b.stop()


# ------------------------------------------------------------------ ACL deny per message
def test_subscribe_hash_granted_and_denied_topics_filtered(port):
    carol = login(port, "carol", clean_start=True)
    assert carol.subscribe("#", qos=1).reason_codes == [1]     # refused whole before
    admin = login(port, "admin", clean_start=True)
    for topic, payload in (("test/nosubscribe", b"denied"), ("secret/a/b", b"denied too"),
                           ("test/ok", b"allowed")):
        admin.publish(topic, payload, qos=1, pid=1)
        admin.recv_type(P.PUBACK)
    got = []
    while True:
        try:
            m = carol.recv(1.0)
        except TimeoutError:
            break
        if m.type == P.PUBLISH:
            got.append((m.topic, m.payload))
            if m.qos:
                carol.send(P.Ack(P.PUBACK, m.packet_id))
    assert ("test/ok", b"allowed") in got
    assert [t for t, _ in got if t == "test/nosubscribe" or t.startswith("secret/")] == []
    bye(carol, admin)


def test_denied_retained_messages_are_not_replayed(port):
    admin = login(port, "admin", clean_start=True)
    tag = uniq("rt").replace("/", "-")
    publish_ok(admin, f"secret/{tag}", b"hidden", qos=1, retain=True)
    publish_ok(admin, f"open/{tag}", b"visible", qos=1, retain=True)
    carol = login(port, "carol", clean_start=True)
    assert carol.subscribe(f"+/{tag}", qos=1).reason_codes == [1]
    m = recv_publish(carol)
    assert (m.topic, m.payload, m.retain) == (f"open/{tag}", b"visible", True)
    carol.send(P.Ack(P.PUBACK, m.packet_id))
    assert carol.nothing(0.5)
    bye(carol, admin)


def test_exactly_denied_filter_is_refused(port):
    carol = login(port, "carol", clean_start=True)
    assert carol.subscribe("test/nosubscribe", "secret/#", "secret/+/x", "test/+",
                           qos=1).reason_codes == [0x87, 0x87, 0x87, 1]
    bye(carol)
    carol = login(port, "carol", level=P.MQTT_311, clean_start=True)
    assert carol.subscribe("test/nosubscribe", "#", qos=1).reason_codes == [0x80, 1]
    bye(carol)


# ------------------------------------------------------------------ %c / %u fail closed
def test_client_id_with_slash_does_not_escape_a_deny_pattern(port):
    # pattern deny blocked/%c stops client dev1 on blocked/dev1 ...
    d1 = login(port, "dev", "dev1", clean_start=True)
    publish_ok(d1, "blocked/dev1", qos=1, expect_code=0x87)
    publish_ok(d1, "elsewhere/dev1", qos=1, expect_code=0x10)
    # ... and client dev/1 on blocked/dev/1 (and, failing closed, everything under blocked/)
    d2 = login(port, "dev", "dev/1", clean_start=True)
    publish_ok(d2, "blocked/dev/1", qos=1, expect_code=0x87)
    publish_ok(d2, "blocked/x", qos=1, expect_code=0x87)
    publish_ok(d2, "elsewhere/dev1", qos=1, expect_code=0x10)
    for bad in ("dev+", "dev#"):
        c = login(port, "dev", bad, clean_start=True)
        publish_ok(c, f"blocked/{bad[:3]}", qos=1, expect_code=0x87)
        bye(c)
    bye(d1, d2)


def test_client_id_with_wildcards_gets_no_allow_pattern(port):
    ok = login(port, "bob", "bob1", clean_start=True)
    assert ok.subscribe("inbox/bob1/#", qos=1).reason_codes == [1]
    bye(ok)
    for bad in ("+", "a/+", "#"):
        c = login(port, "bob", bad, clean_start=True)   # inbox/%c/# would become inbox/+/#
        assert c.subscribe("inbox/+/#", "inbox/x", "inbox/a/+/#", "inbox/a/b",
                           qos=1).reason_codes == [0x87] * 4
        bye(c)


# ------------------------------------------------------------------ $SYS
def test_clients_cannot_publish_to_sys(broker):
    spoof = b"mosquitto version 99 (spoofed)"
    sub = RawClient(broker.port)
    assert sub.connect(cid("sys")).reason_code == 0
    assert sub.subscribe("$SYS/broker/version", qos=1).reason_codes == [1]
    real = recv_publish(sub, timeout=30)             # the broker's own $SYS still works
    assert real.payload.startswith(b"mqtt-history-broker")
    c = RawClient(broker.port)
    assert c.connect(cid("spoof")).reason_code == 0
    publish_ok(c, "$SYS/broker/version", spoof, qos=1, retain=True, expect_code=0x87)
    c.publish("$SYS/broker/version", spoof, qos=2, pid=2, retain=True)
    rec = c.recv_type(P.PUBREC)                       # the flow ends at a failure PUBREC
    assert (rec.packet_id, rec.reason_code) == (2, 0x87)
    c.publish("$SYS/broker/version", spoof, retain=True)
    c.publish("$SYSx", spoof, retain=True)
    old = RawClient(broker.port, level=P.MQTT_311)
    assert old.connect(cid("spoof311")).reason_code == 0
    old.publish("$SYS/broker/version", spoof, qos=1, pid=3, retain=True)
    assert old.recv_type(P.PUBACK).packet_id == 3    # 3.1.1: acknowledged, dropped
    c.send(P.PingReq())
    c.recv_type(P.PINGRESP)
    late = RawClient(broker.port)
    assert late.connect(cid("late")).reason_code == 0
    assert late.subscribe("$SYS/broker/version", qos=1).reason_codes == [1]
    m = recv_publish(late)
    assert m.retain and m.payload != spoof            # the retained one is the broker's
    if m.qos:
        late.send(P.Ack(P.PUBACK, m.packet_id))
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:                # the live subscriber never sees a spoof
        try:
            p = sub.recv(0.3)
        except TimeoutError:
            continue
        if p.type == P.PUBLISH:
            assert p.payload != spoof, p
            if p.qos:
                sub.send(P.Ack(P.PUBACK, p.packet_id))
    bye(sub, c, old, late)
