"""How a cluster node reads the messages topic (cluster/reading.py, Reading.apply): each record
is looked at by its key (the MQTT topic) first; only the records some session on the node wants
are decoded and delivered, with every property; a fetch nobody on the node can want is not even
scanned; $share groups take theirs from their own streams; a new subscription takes the records
from its start position on while it starts."""
from __future__ import annotations

import itertools
import struct

import pytest

from broker.core.message import Message
from broker.protocol import packets as P
from broker.protocol import properties as PR
from cluster import records as R
from cluster.node import ClusterNode
from cluster.trust import Trust
from kafka_client.record import build_batch
from kafka_client.recordscan import Scanned
from settings import ClusterConfig
from tests.sansio import Client, make, nothing, recv_publish, subscribe

PROPS = {PR.PAYLOAD_FORMAT_INDICATOR: 1, PR.CONTENT_TYPE: "text/plain", PR.RESPONSE_TOPIC: "re/1",
         PR.CORRELATION_DATA: b"\x00c", PR.USER_PROPERTY: [("a", "1"), ("b", "2"), ("a", "3")]}


IDS = itertools.count(1)  # a node numbers the messages it writes (mqtt.message_id)


def body(topic: str, payload: bytes = b"x", qos: int = 1, props: dict | None = None,
         expiry: int | None = None) -> bytes:
    msg = Message(topic, payload, qos, False, props, None if expiry is None else 1000.0 + expiry,
                  "pub-1", 1000.0)
    return R.message_body(msg, "pub-1", None, 5, "n1", f"n1-i1-{next(IDS)}", 1000.0)


KEY = b"k" * 32  # the cluster's key (cluster/trust.py): the nodes sign every record with it
TS = 1_700_000_000_000


def fetched(bodies: list[bytes], base: int = 0, topic: str = "mqtt.cluster.messages",
            key: bytes | None = KEY) -> Scanned:
    """A fetch of these record bodies, signed by a node with `key` (None: not signed)."""
    if key is not None:
        bodies = [Trust(key).sign(topic, b, TS) for b in bodies]
    raw = bytearray(build_batch([(TS, b) for b in bodies]))
    struct.pack_into(">q", raw, 0, base)  # the base offset, set by Kafka
    return Scanned(bytes(raw))


@pytest.fixture
def node():
    broker, _ = make()
    n = ClusterNode(ClusterConfig(enabled=True, node_id="n2"), "127.0.0.1:1", wall=lambda: 1000.0,
                    key=KEY)
    n.attach(broker)
    n.routed_upto = {0: 0}
    return n


@pytest.fixture
def decoded(monkeypatch):
    """The offsets of the records whose value and headers were read."""
    seen: list[int] = []
    real = Scanned.record

    def record(self, i):
        seen.append(self.offsets[i])
        return real(self, i)
    monkeypatch.setattr(Scanned, "record", record)
    return seen


def client(node, cid: str, *filters: str, sub_id: int | None = None) -> Client:
    c = Client(node.broker)
    c.connect(cid)
    if sub_id is None:
        subscribe(c, *filters, qos=1)
    else:
        c.send(P.Subscribe(1, [(f, P.SubscriptionOptions(1)) for f in filters],
                           {PR.SUBSCRIPTION_IDENTIFIER: sub_id}))
        c.received()
    return c


def test_a_record_for_nobody_here_is_skipped_undecoded_and_a_wanted_one_has_every_property(
        node, decoded):
    """[MQTT-3.3.2-17] [MQTT-3.3.2-18] [MQTT-3.3.2-20] the forwarded PUBLISH keeps the
    publisher's properties; records on other topics are never decoded."""
    sub = client(node, "sub", "here/#", sub_id=7)
    rec = fetched([body("elsewhere/1"), body("here/1", b"hello", 1, PROPS, 60),
                   body("elsewhere/2")], base=10)
    node._apply([(node.topics.messages, 0, rec, 10)])
    assert decoded == [11]
    pub = recv_publish(sub)
    assert (pub.topic, pub.payload, pub.qos) == ("here/1", b"hello", 1)
    p = pub.properties
    assert p[PR.PAYLOAD_FORMAT_INDICATOR] == 1 and p[PR.CONTENT_TYPE] == "text/plain"
    assert p[PR.RESPONSE_TOPIC] == "re/1" and p[PR.CORRELATION_DATA] == b"\x00c"
    assert p[PR.USER_PROPERTY] == [("a", "1"), ("b", "2"), ("a", "3")]
    assert p[PR.MESSAGE_EXPIRY_INTERVAL] == 60 and p[PR.SUBSCRIPTION_IDENTIFIER] == [7]
    assert nothing(sub)
    assert node.routed_upto[0] == 13
    assert node.counters["read"] == 3 and node.counters["delivered"] == 1


def test_a_fetch_starting_inside_a_batch_delivers_only_from_its_start(node, decoded):
    """A fetch from offset 11 returns the whole batch from 10: record 10 was routed before."""
    sub = client(node, "sub", "t")
    node._apply([(node.topics.messages, 0, fetched([body("t", b"old"), body("t", b"new")], 10), 11)])
    assert recv_publish(sub).payload == b"new"
    assert nothing(sub) and decoded == [11]


def test_a_node_with_only_shared_subscriptions_does_not_scan_its_stream(node, decoded):
    """$share groups (MQTT 5 section 4.8.2) get their records from their own streams (cluster/shares.py),
    one member in the cluster each: the node's stream delivers them nothing, and with no other
    subscription here it is not even scanned; the position moves on."""
    member = client(node, "member", "$share/g/t/#")
    rec = fetched([body("t/1"), body("t/2")], base=5)
    node._apply([(node.topics.messages, 0, rec, 5)])
    assert not rec.scanned and decoded == []
    assert nothing(member)
    assert node.routed_upto[0] == 7 and node.counters["read"] == 2
    client(node, "plain", "other")  # a plain subscription: the stream is scanned again
    rec = fetched([body("t/3")], base=7)
    node._apply([(node.topics.messages, 0, rec, 7)])
    assert rec.scanned and decoded == [] and nothing(member)


def test_a_starting_subscription_takes_the_records_from_its_start_on(node, decoded):
    """A new subscription (install()) takes the log's records from the position the node knew
    at the SUBSCRIBE, including on a node that had no subscription: the records before it are
    not its, not even decoded; once the stream reached that position it is routed as usual."""
    c = client(node, "new", "t/#")
    sub = c.conn.session.subscriptions["t/#"]
    node.broker.router.remove(sub)  # as install() leaves it: waiting, not routed yet
    node.reading.waiting_subs.append((sub, {0: 21}))
    rec = fetched([body("t/1", b"before"), body("t/2", b"after"), body("u/1", b"other")], base=20)
    node._apply([(node.topics.messages, 0, rec, 20)])
    assert recv_publish(c).payload == b"after"
    assert nothing(c) and decoded == [21]
    assert node.reading.waiting_subs == [] and node.broker.router.count == 1  # routed from now on
    node._apply([(node.topics.messages, 0, fetched([body("t/3", b"live")], base=23), 23)])
    assert recv_publish(c).payload == b"live"


def test_a_record_whose_delivery_raises_does_not_cost_the_fetchs_other_records(
        node, caplog):
    """A bug delivering one record (here: the broker raises for the first message) is logged
    with its place in the log and counted; the fetch's later records still reach the sessions
    here, since the node's read position is already past them (nothing acknowledged is lost)."""
    sub = client(node, "sub", "t/#")
    calls = []

    class Failing:  # the broker as the reading sees it, raising for the first message
        def __getattr__(self, name):
            return getattr(node.broker, name)

        def deliver(self, msg, sender, shared=False):
            calls.append(msg.payload)
            if len(calls) == 1:
                raise RuntimeError("a bug")
            return node.broker.deliver(msg, sender, shared)
    node.reading.broker = Failing()
    rec = fetched([body("t/1", b"first"), body("t/2", b"second"), body("t/3", b"third")], base=40)
    with caplog.at_level("ERROR", logger="cluster.reading"):
        node._apply([(node.topics.messages, 0, rec, 40)])
    assert [recv_publish(sub).payload for _ in range(2)] == [b"second", b"third"]
    assert nothing(sub)
    assert node.counters["deliver_failed"] == 1 and node.counters["delivered"] == 2
    assert node.routed_upto[0] == 43
    assert "offset 40 failed" in caplog.text
