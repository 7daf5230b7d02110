"""Hostile clients (issue 8), sans-I/O: inbound topic aliases, session expiry caps, the number
of sessions. Bytes in, bytes out, a fake clock (tests/unit/test_core.py's Client and make)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import MQTTConfig
from broker.core.broker import AllowAll
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from tests.unit.test_core import Client, make


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
