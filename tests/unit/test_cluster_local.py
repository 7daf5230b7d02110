"""A message for a session on the node that accepted it is delivered at once, as by a single
broker, while its acknowledgement still waits for Kafka (cluster/node.py, ClusterNode.route):
the node skips its own record when it reads it back, the other nodes deliver it from the log;
a session that comes to the node before that read-back still gets it. On sans-I/O brokers
sharing an in-memory log (tests/clusterfake.py): what a node writes reaches the log, and is
acknowledged, only at `pump()`."""
from __future__ import annotations

import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from tests.clusterfake import ClusterClient, FakeCluster
from tests.sansio import lose, nothing, recv_publish, recv_type

EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 300}


@pytest.fixture
def cluster():
    return FakeCluster()


def subscribe(c: ClusterClient, cluster: FakeCluster, filt: str, qos: int = 1) -> None:
    c.send(P.Subscribe(1, [(filt, P.SubscriptionOptions(qos))]))
    cluster.pump()
    assert recv_type(c, P.SUBACK).reason_codes == [qos]


def client(cluster: FakeCluster, node, cid: str, *filters: str, **kw) -> ClusterClient:
    c = ClusterClient(node)
    c.connect(cid, cluster=cluster, **kw)
    for f in filters:
        subscribe(c, cluster, f)
    return c


def payloads(c: ClusterClient) -> list[bytes]:
    """The payloads of the PUBLISHes `c` got (each QoS 1 one acknowledged)."""
    out = []
    for p in c.received():
        if p.type == P.PUBLISH:
            out.append(p.payload)
            if p.qos == 1:
                c.send(P.Ack(P.PUBACK, p.packet_id))
    return out


def test_a_subscriber_on_the_accepting_node_gets_the_message_before_kafka_acknowledged_it(cluster):
    """Delivered here at once; the PUBACK only once Kafka acknowledged the record
    [MQTT-4.3.2-4] (the broker owns the message then); the record read back is not delivered
    a second time here, and a subscriber on another node gets it from the log, once."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    here = client(cluster, n1, "here", "t/#")
    there = client(cluster, n2, "there", "t/#")
    pub = client(cluster, n1, "pub")
    pub.send(P.Publish("t/1", b"m1", 1, packet_id=7))
    msg = recv_publish(here)  # no pump: Kafka has not seen it yet
    assert (msg.topic, msg.payload, msg.qos) == ("t/1", b"m1", 1)
    assert nothing(pub) and nothing(there)
    here.send(P.Ack(P.PUBACK, msg.packet_id))
    cluster.pump()
    ack = recv_type(pub, P.PUBACK)
    assert (ack.packet_id, ack.reason_code) == (7, 0)
    assert payloads(there) == [b"m1"]
    cluster.pump()
    assert nothing(here) and nothing(there)
    assert n1.held.local == {}  # read back: nothing held any more


def test_a_publishers_messages_reach_a_subscriber_on_its_node_in_order_across_topics(cluster):
    """MQTT 5 section 4.6: a subscriber on the publisher's node gets its messages in the order
    published, whatever their topics and QoS, and whatever was read back meanwhile."""
    n1, _ = cluster.node("n1")
    sub = client(cluster, n1, "sub", "a/#", "b/#")
    pub = client(cluster, n1, "pub")
    sent = []
    for i in range(12):
        topic = ("a/x", "b/y", "a/z")[i % 3]
        qos = i % 2
        pub.send(P.Publish(topic, b"%d" % i, qos, packet_id=i + 1 if qos else None))
        sent.append(b"%d" % i)
        if i % 5 == 4:
            cluster.pump()
    cluster.pump()
    assert payloads(sub) == sent
    assert len([p for p in pub.received() if p.type == P.PUBACK]) == 6


def test_no_local_and_retain_as_published_apply_to_the_delivery_here(cluster):
    """[MQTT-3.8.3-3] not sent back to its publisher; [MQTT-3.3.1-12] RETAIN 0 unless Retain As
    Published; the retained message is kept cluster-wide: a later subscriber on either node gets
    it with RETAIN 1 [MQTT-3.3.1-9]."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    me = client(cluster, n1, "me")
    me.send(P.Subscribe(1, [("r", P.SubscriptionOptions(1, no_local=True))]))
    cluster.pump()
    recv_type(me, P.SUBACK)
    sub = client(cluster, n1, "sub", "r")
    me.send(P.Publish("r", b"kept", 1, retain=True, packet_id=1))
    msg = recv_publish(sub)
    assert (msg.payload, msg.retain) == (b"kept", False)
    sub.send(P.Ack(P.PUBACK, msg.packet_id))
    cluster.pump()
    assert [p.type for p in me.received()] == [P.PUBACK]
    assert nothing(sub)
    for node in (n1, n2):
        late = ClusterClient(node)
        late.connect(f"late-{node.node}", cluster=cluster)
        late.send(P.Subscribe(1, [("r", P.SubscriptionOptions(1))]))
        cluster.pump()
        got = [p for p in late.received() if p.type == P.PUBLISH]
        assert [(p.payload, p.retain) for p in got] == [(b"kept", True)]


def test_a_shared_subscription_on_the_accepting_node_is_not_served_by_the_delivery_here(
        cluster, monkeypatch):
    """MQTT 5 section 4.8.2: one member of a group in the whole cluster gets each message, through
    the group's stream (cluster/shares.py, not run here): the delivery here gives the $share
    member nothing, the plain subscriber its copy."""
    n1, _ = cluster.node("n1")
    monkeypatch.setattr(n1.shares, "reconcile", lambda: None)  # no Kafka consumer groups here
    member = client(cluster, n1, "member", "$share/g/t")
    plain = client(cluster, n1, "plain", "t")
    pub = client(cluster, n1, "pub")
    pub.send(P.Publish("t", b"m", 1, packet_id=1))
    cluster.pump()
    assert payloads(plain) == [b"m"]
    assert nothing(member)


def test_a_session_that_comes_to_the_node_before_the_read_back_still_gets_the_message(cluster):
    """[MQTT-3.1.2-5]: a persistent session rebuilt on the accepting node after the message was
    delivered there and before its record was read back (the claim is applied first) gets it
    once: not from the scan of the log up to where the node had read, not skipped as already
    delivered here."""
    n1, clock1 = cluster.node("n1")
    n2, _ = cluster.node("n2")
    c = ClusterClient(n2)
    c.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    subscribe(c, cluster, "t/#")
    c.send(P.Disconnect())
    lose(c)
    cluster.pump()
    cluster.kill(n2)
    clock1.t += n1.cfg.node_timeout + 1
    n1._beat()
    cluster.pump()
    assert not n1.state.members["n2"].alive
    client(cluster, n1, "other", "elsewhere")  # someone here: the message is delivered here
    pub = client(cluster, n1, "pub")
    pub.send(P.Publish("t/1", b"m1", 1, packet_id=1))
    c2 = ClusterClient(n1)
    c2.send(P.Connect("dev", 5, clean_start=False, properties=EXPIRY))
    assert n1.held.local  # delivered here (to nobody), its record not read back
    cluster.pump()
    assert recv_type(c2, P.CONNACK).session_present
    got = [p for p in c2.received() if p.type == P.PUBLISH]
    assert [(p.topic, p.payload) for p in got] == [("t/1", b"m1")]
    cluster.pump()
    assert nothing(c2) and n1.held.local == {}


def test_a_message_delivered_here_before_the_read_back_is_checkpointed_with_its_place_in_the_log(
        cluster):
    """[MQTT-4.4.0-1]: a persistent session's unacknowledged message, delivered as it was
    accepted, is recorded in flight at its log position once read back; the session moved to
    another node gets it again with its packet id and DUP 1."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    c = ClusterClient(n1)
    c.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    subscribe(c, cluster, "t/#")
    pub = client(cluster, n1, "pub")
    pub.send(P.Publish("t/1", b"m1", 1, packet_id=1))
    first = recv_publish(c)  # not acknowledged
    assert n1.checkpoints.checkpoint(n1.broker.sessions["dev"])["inflight"] == []  # its place: not known
    cluster.pump()
    off = len(cluster.logs[n1.topics.messages]) - 1
    assert n1.checkpoints.checkpoint(n1.broker.sessions["dev"])["inflight"] == [[0, off, first.packet_id, 0]]
    n1.on_tick()
    cluster.pump()
    c2 = ClusterClient(n2)
    assert c2.connect("dev", clean=False, props=EXPIRY, cluster=cluster).session_present
    cluster.pump()
    again = [p for p in c2.received() if p.type == P.PUBLISH]
    assert [(p.payload, p.packet_id, p.dup) for p in again] == [(b"m1", first.packet_id, True)]


def test_a_message_kafka_never_acknowledged_is_failed_to_its_publisher(cluster):
    """[MQTT-4.3.2-4]: delivered here at once, but never acknowledged as a success when Kafka
    refused it (v5: PUBACK 0x80); the held copy is dropped after LOCAL_KEEP seconds."""
    import time as _time

    from cluster import held as H
    n1, _ = cluster.node("n1")
    sub = client(cluster, n1, "sub", "t")
    pub = client(cluster, n1, "pub")
    pub.send(P.Publish("t", b"m", 1, packet_id=3))
    assert recv_publish(sub).payload == b"m"
    p = n1.producer
    sent, p.pending = p.pending, []  # type: ignore[attr-defined]
    n1._completed([(tag, "refused") for *_, tag in sent])
    ack = recv_type(pub, P.PUBACK)
    assert (ack.packet_id, ack.reason_code) == (3, 0x80)
    assert len(n1.held.local) == 1
    n1.held.forget(_time.monotonic() + H.LOCAL_KEEP + 1)
    assert n1.held.local == {}


def test_a_subscriber_that_comes_while_a_message_is_on_its_way_gets_the_topic_in_order(cluster):
    """[MQTT-4.6.0-5]: published while nobody on the node wanted it, a message goes through the
    log; a subscriber made before its record was read gets it from there, and the next message
    of that topic after it, not before (held until then, not delivered at once)."""
    n1, _ = cluster.node("n1")
    pub = client(cluster, n1, "pub")
    sub = client(cluster, n1, "sub")
    pub.send(P.Publish("t", b"m1", 1, packet_id=1))
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(1))]))
    pub.send(P.Publish("t", b"m2", 1, packet_id=2))
    assert payloads(sub) == []
    cluster.pump()
    assert payloads(sub) == [b"m1", b"m2"]
    pub.send(P.Publish("t", b"m3", 1, packet_id=3))
    assert payloads(sub) == [b"m3"]  # all read: at once again
    cluster.pump()
    assert nothing(sub) and n1.held.local == {} and n1.held.spill is None


@pytest.mark.parametrize("max_held", [0, 2])
def test_beyond_max_held_messages_are_delivered_from_the_log_each_once_in_order(cluster, max_held):
    """cluster.max_held bounds the messages delivered at once whose records are not read back
    (each held until then); beyond, they are delivered as read, once each, in the order
    published on each topic [MQTT-4.6.0-5]; 0: never at once."""
    n1, _ = cluster.node("n1")
    n1.cfg.max_held = max_held
    sub = client(cluster, n1, "sub", "t/#")
    pub = client(cluster, n1, "pub")
    for i in range(6):
        pub.send(P.Publish(f"t/{i % 2}", b"%d" % i, 1, packet_id=i + 1))
    assert payloads(sub) == [b"0", b"1"][:max_held]
    assert len(n1.held.local) == max_held
    cluster.pump()
    got = [b"0", b"1"][:max_held] + payloads(sub)
    for t in (0, 1):
        assert [g for g in got if int(g) % 2 == t] == [b"%d" % i for i in range(t, 6, 2)]
    assert n1.held.local == {}


def test_a_subscription_still_starting_gets_a_message_accepted_after_its_subscribe_at_once(cluster):
    """A subscription the node is still starting from its place in the log (install(): the
    log's records before it are still being read) takes a message published here after its
    SUBSCRIBE at once, as on one broker, and not again from the log."""
    n1, _ = cluster.node("n1")
    client(cluster, n1, "other", "elsewhere")
    messages = n1.topics.messages
    n1.fetcher.high[(messages, 0)] = len(cluster.logs.get(messages, ())) + 100  # not read yet
    sub = client(cluster, n1, "sub", "t")
    assert [w[0].filter for w in n1.reading.waiting_subs] == ["t"]
    pub = client(cluster, n1, "pub")
    pub.send(P.Publish("t", b"m", 1, packet_id=1))
    assert payloads(sub) == [b"m"]
    cluster.pump()
    assert nothing(sub) and n1.held.local == {}
