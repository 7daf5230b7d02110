"""Who may see what, without sockets: %c/%u fail closed, client_id_pattern, deny rules checked
per message (flagged subscriptions only, cached), re-flagged when the ACL is reloaded."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.auth import ACL, AccessControl, from_config
from broker.core.broker import Broker
from broker.protocol import packets as P
from broker.protocol import properties as PR
from settings import MQTTConfig
from sink.forward.hook import SinkHook
from tests.unit.test_auth import FakeClock, bump
from tests.unit.test_core import Client, Clock

DENY_ACL = ACL.parse("""\
user u
topic readwrite #
pattern deny blocked/%c
pattern deny %c/private/#
pattern deny zone/%u/off
pattern readwrite inbox/%c/#
""")

names = st.text(alphabet="ab/+#", min_size=1, max_size=8)
safe = st.text(alphabet="ab-", min_size=1, max_size=8)
levels = st.lists(st.text(alphabet="abx", min_size=0, max_size=3), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(cid=names, rest=levels)
def test_deny_pattern_never_fails_open(cid, rest):
    """Whatever the client id, the topics a deny pattern could mean for it stay denied."""
    topic = "/".join(rest)
    if any(ch in cid for ch in "/+#"):
        # blocked/%c and %c/private/#: a client id with '/', '+' or '#' cannot be placed in the
        # filter, so everything the pattern could mean is denied
        assert not DENY_ACL.can_write(cid, "u", f"blocked/{topic}")
        assert not DENY_ACL.can_write(cid, "u", f"{topic}/private/x")
        assert not DENY_ACL.can_subscribe(cid, "u", "blocked/#")
    literal = f"blocked/{cid}"
    if "+" not in cid and "#" not in cid:
        assert not DENY_ACL.can_write(cid, "u", literal)   # the literal substitution
        assert not DENY_ACL.can_read(cid, "u", literal)


@settings(max_examples=300, deadline=None)
@given(cid=safe, rest=levels)
def test_deny_pattern_with_a_safe_id_is_exact(cid, rest):
    topic = "/".join(rest)
    assert not DENY_ACL.can_write(cid, "u", f"blocked/{cid}")
    assert DENY_ACL.can_write(cid, "u", f"blocked/{cid}x") is True
    assert DENY_ACL.can_write(cid, "u", f"open/{topic}") is True


@settings(max_examples=300, deadline=None)
@given(cid=names, user=names)
def test_allow_pattern_never_widens(cid, user):
    """inbox/%c/# gives a client with a wildcard id nothing (not inbox/+/#)."""
    acl = ACL.parse("pattern readwrite inbox/%c/#\npattern read home/%u\n")
    bad_c = any(ch in cid for ch in "/+#")
    bad_u = any(ch in user for ch in "/+#")
    if bad_c:
        assert not acl.can_write(cid, user, "inbox/a/b")
        assert not acl.can_subscribe(cid, user, "inbox/+/#")
    if bad_u:
        assert not acl.can_read(cid, user, "home/a")
        assert not acl.can_subscribe(cid, user, "home/+")


def test_user_name_deny_pattern_fails_closed():
    assert not DENY_ACL.can_write("c", "u", "zone/u/off")
    assert DENY_ACL.can_write("c", "u", "zone/v/off")
    acl = ACL.parse("user a/b\ntopic readwrite #\npattern deny zone/%u/off\n")
    assert not acl.can_write("c", "a/b", "zone/a/b/off")
    assert not acl.can_write("c", "a/b", "zone/anything")
    assert acl.can_write("c", "a/b", "other/x")
    # a deny pattern whose placeholder is the first level denies that client everything
    acl = ACL.parse("topic readwrite #\npattern deny %c/#\n")
    assert not acl.can_write("a/b", None, "x/y") and not acl.can_subscribe("a/b", None, "x/#")
    assert not acl.can_write("a/b", None, "$x/y")
    assert acl.can_write("ab", None, "x/y") and not acl.can_write("ab", None, "ab/y")


# ------------------------------------------------------------------ client_id_pattern
def test_client_id_pattern():
    ac = AccessControl(client_id_pattern="%u-*")
    assert ac.check_client_id("alice-1", "alice") == 0
    assert ac.check_client_id("alice-", "alice") == 0
    assert ac.check_client_id("alice", "alice") == 0x85
    assert ac.check_client_id("bob-1", "alice") == 0x85
    assert ac.check_client_id("x-1", None) == 0x85          # anonymous never fits %u
    assert AccessControl(client_id_pattern="a.b*").check_client_id("aXb1", None) == 0x85
    assert AccessControl(client_id_pattern="dev-*-%u").check_client_id("dev-7-u", "u") == 0
    assert AccessControl(client_id_pattern="%u").check_client_id("u", "u") == 0
    assert AccessControl().check_client_id("anything", "u") == 0
    ac = from_config({"client_id_pattern": "%u-*"})
    assert ac is not None and ac.check_client_id("bob-1", "alice") == 0x85
    with pytest.raises(ValueError, match="client_id_pattern"):
        from_config({"client_id_pattern": 5})


# ------------------------------------------------------------------ delivery checks (core)
ACL_TEXT = "user u\ntopic readwrite #\ntopic deny a/secret\nuser p\ntopic readwrite #\n"


def core(tmp_path: Path, text: str = ACL_TEXT):
    acl = tmp_path / "acl"
    acl.write_text(text)
    clock = FakeClock()
    ac = AccessControl(acl_file=str(acl), clock=clock, reload_interval=1.0)
    b = Broker(MQTTConfig(), auth=ac, clock=Clock(), wall=Clock())
    return b, ac, clock, acl


def sub(b, cid, *filters, user="u"):
    c = Client(b)
    assert c.connect(cid, username=user).reason_code == 0
    c.send(P.Subscribe(1, [(f, P.SubscriptionOptions(0)) for f in filters]))
    (ack,) = c.received()
    return c, ack.reason_codes


def topics(c):
    return [p.topic for p in c.received() if p.type == P.PUBLISH]


def test_only_flagged_subscriptions_are_checked_and_decisions_cached(tmp_path):
    b, ac, _, _ = core(tmp_path)
    wide, codes = sub(b, "wide", "a/#", "b/#")
    assert codes == [0, 0]
    flags = {f: s.read_check for f, s in b.sessions["wide"].subscriptions.items()}
    assert flags == {"a/#": True, "b/#": False}       # b/# cannot meet a deny rule
    calls = []
    real = ac.acl.can_read
    ac.acl.can_read = lambda *a: calls.append(a) or real(*a)
    pub = Client(b)
    pub.connect("pub", username="p")
    for t in ["a/secret", "a/ok", "b/x"] * 50:
        pub.send(P.Publish(t, b"m", 0))
    assert topics(wide) == ["a/ok", "b/x"] * 50
    assert sorted({c[2] for c in calls}) == ["a/ok", "a/secret"]   # never for b/x
    assert len(calls) == 2                                           # cached after the first


def test_overlapping_and_shared_subscriptions(tmp_path):
    b, _, _, _ = core(tmp_path)
    both, codes = sub(b, "both", "a/+", "+/secret")     # two matches, both flagged
    assert codes == [0, 0]
    grp, codes = sub(b, "grp", "$share/g/a/#")
    assert codes == [0]
    assert b.sessions["grp"].subscriptions["$share/g/a/#"].read_check
    pub = Client(b)
    pub.connect("pub", username="p")
    for t in ("a/secret", "a/x"):
        pub.send(P.Publish(t, b"m", 0))
    assert topics(both) == ["a/x"]
    assert topics(grp) == ["a/x"]


def test_reload_flags_existing_subscriptions(tmp_path):
    b, ac, clock, acl = core(tmp_path, "user u\ntopic readwrite #\nuser p\ntopic readwrite #\n")
    c, codes = sub(b, "c", "#")
    assert codes == [0] and not b.sessions["c"].subscriptions["#"].read_check
    acl.write_text(ACL_TEXT)
    bump(acl)
    clock.t += 1.0
    pub = Client(b)
    pub.connect("pub", username="p")          # the reload happens on the next ACL decision
    pub.send(P.Publish("a/secret", b"m", 0))
    pub.send(P.Publish("a/ok", b"m", 0))
    assert b.sessions["c"].subscriptions["#"].read_check
    assert topics(c) == ["a/ok"]


def test_no_acl_means_no_flag(tmp_path):
    b = Broker(MQTTConfig(), clock=Clock(), wall=Clock())
    c, codes = sub(b, "c", "#")
    assert codes == [0] and not b.sessions["c"].subscriptions["#"].read_check


def test_session_owner_in_core():
    b = Broker(MQTTConfig(), clock=Clock(), wall=Clock())
    a = Client(b)
    hour = {PR.SESSION_EXPIRY_INTERVAL: 3600}
    assert a.connect("id", clean=False, props=hour, username="alice").reason_code == 0
    m = Client(b)
    assert m.connect("id", clean=False, props=hour, username="mallory").reason_code == 0x87
    assert m.conn.close_requested and not a.conn.close_requested
    assert b.sessions["id"].connection is a.conn and b.sessions["id"].username == "alice"
    anon = Client(b)
    assert anon.connect("id", clean=True).reason_code == 0x87   # anonymous is not alice either
    again = Client(b)
    assert again.connect("id", clean=False, props=hour, username="alice").session_present
    assert a.conn.close_requested                                # its own takeover: 0x8E


def test_will_to_sys_is_not_published():
    b = Broker(MQTTConfig(), clock=Clock(), wall=Clock())
    watcher = Client(b)
    watcher.connect("watch")
    watcher.send(P.Subscribe(1, [("$SYS/#", P.SubscriptionOptions(0)),
                                 ("w/#", P.SubscriptionOptions(0))]))
    watcher.received()
    for topic in ("$SYS/broker/version", "w/ok"):
        c = Client(b)
        assert c.connect(f"dies-{topic}", will=P.Will(topic, b"will", 0, True)).reason_code == 0
        c.conn.connection_lost()           # no DISCONNECT: the will is due
    assert topics(watcher) == ["w/ok"]
    assert all(m.payload != b"will" for m in b.retained.match("$SYS/#"))  # not retained either


@pytest.mark.parametrize("spec", [{"type": "tcp"}, {"type": "ws"},
                                  {"type": "tls", "certfile": "x.pem"}])
def test_identity_as_username_needs_verified_certificates(spec):
    """On a listener that cannot verify client certificates nobody could connect: say so."""
    from broker.server import Server
    from settings import Config
    cfg = Config(listeners=[{**spec, "port": 1, "use_identity_as_username": True}])
    with pytest.raises(ValueError, match="use_identity_as_username = true: needs type tls or wss and a cafile"):
        Server(cfg).listener_specs()


def test_sys_publish_never_reaches_sink_retained_or_subscribers():
    class Sink:
        durable = False

        def __init__(self):
            self.records = []

        def submit(self, rec):
            self.records.append(rec.topic)
            return True

    sink = Sink()
    b = Broker(MQTTConfig(), sink=SinkHook(sink), clock=Clock(), wall=Clock())
    watcher = Client(b)
    watcher.connect("watch")
    watcher.send(P.Subscribe(1, [("$SYS/#", P.SubscriptionOptions(1))]))
    watcher.received()
    c = Client(b)
    c.connect("spoofer")
    c.send(P.Publish("$SYS/broker/version", b"spoofed", 1, True, packet_id=1))
    c.send(P.Publish("$SYS/x", b"spoofed", 0, True))
    c.send(P.Publish("ok/x", b"fine", 1, packet_id=2))
    acks = [(p.packet_id, p.reason_code) for p in c.received()]
    assert acks == [(1, 0x87), (2, 0x10)]
    assert sink.records == ["ok/x"]
    assert b.retained.match("$SYS/#") == [] and topics(watcher) == []
    assert b.stats["dropped_not_authorized"] == 2
