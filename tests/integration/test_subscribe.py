"""SUBSCRIBE / SUBACK, shared subscriptions and retained replay through real sockets: a smoke set
proving the wire path gives what the core decides (SUBACK codes for v5, 3.1.1 and 3.1, a shared
group's fan-out over several sockets, a retained message replayed through the server's flush).
The rules themselves (sections 3.8-3.11, 4.7, 4.8: filters, matching, $-topics, No Local,
UNSUBSCRIBE, Subscription Identifiers) are tested sans-I/O in tests/unit/test_core_subscribe.py."""
from __future__ import annotations

from collections import Counter

import pytest

from .helpers import PR, P, RawClient, ack, bye, cid, connect, props, publish_ok, recv_publish, uniq

pytestmark = pytest.mark.timeout(30)


def drain(c: RawClient, wait: float = 0.5) -> list:
    out = []
    while not c.nothing(wait):
        m = c.recv()
        if m.type == P.PUBLISH:
            ack(c, m)
        out.append(m)
    return out


def test_suback_granted_qos_in_order(broker):
    """[MQTT-3.8.4-1], [MQTT-3.9.3-1]: one SUBACK, one reason code per filter in order, the granted QoS."""
    base = uniq("suback")
    c = connect(broker.port)
    c.send(P.Subscribe(42, [(base + "/0", P.SubscriptionOptions(0)),
                            (base + "/2", P.SubscriptionOptions(2)),
                            (base + "/1", P.SubscriptionOptions(1))]))
    s = c.recv_type(P.SUBACK)
    assert (s.packet_id, s.reason_codes) == (42, [0, 2, 1])
    bye(c)


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
def test_invalid_filter_v311_0x80(broker, level):
    """3.1.1 [MQTT-3.9.3-2]: a refused subscription has return code 0x80."""
    c = RawClient(broker.port, level=level)
    c.connect(cid())
    s = c.subscribe("a/#/b", qos=1)
    assert s.reason_codes == [0x80]
    assert c.subscribe(uniq("v4ok"), qos=2).reason_codes == [2]
    bye(c)


def test_shared_subscription_one_member_each(broker):
    """4.8.2: each message of a shared subscription goes to exactly one member of the
    group; different groups and non-shared subscribers each get every message."""
    topic = uniq("shared")
    members = [connect(broker.port) for _ in range(3)]
    for m in members:
        assert m.subscribe("$share/g1/" + topic, qos=1).reason_codes == [1]
    other_group = connect(broker.port)
    other_group.subscribe("$share/g2/" + topic, qos=1)
    plain = connect(broker.port)
    plain.subscribe(topic, qos=1)
    pub = connect(broker.port)
    n = 30
    for i in range(n):
        publish_ok(pub, topic, b"%d" % i, qos=1, pid=i + 1, expect_code=0)
    per_member = [[x.payload for x in drain(m)] for m in members]
    everything = Counter(p for got in per_member for p in got)
    assert everything == Counter(b"%d" % i for i in range(n)), "a message went to 0 or 2+ members"
    assert all(per_member), f"a member got nothing: {[len(g) for g in per_member]}"
    assert [x.payload for x in drain(other_group)] == [b"%d" % i for i in range(n)]
    assert [x.payload for x in drain(plain)] == [b"%d" % i for i in range(n)]
    bye(pub, plain, other_group, *members)


def test_retained_sent_with_subscription_identifier(broker):
    """[MQTT-3.3.4-3] for retained messages sent on SUBSCRIBE."""
    topic = uniq("sidret")
    pub = connect(broker.port)
    publish_ok(pub, topic, b"r", qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1, properties={PR.SUBSCRIPTION_IDENTIFIER: [5]})
    m = recv_publish(c)
    assert m.retain and props(m)[PR.SUBSCRIPTION_IDENTIFIER] == [5]
    publish_ok(pub, topic, b"", qos=1, retain=True)
    bye(c, pub)
