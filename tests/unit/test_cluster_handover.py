"""A persistent session that moves to another node after the cluster's Kafka lost its data keeps
what its old node owed it (cluster/handover.py): the messages queued for it and in flight to it
before the loss, which the new log no longer holds, go to the new node with the session (on
sans-I/O brokers sharing an in-memory log, tests/clusterfake.py)."""
from __future__ import annotations

import pytest

import cluster.recovery as recovery_module
from broker.protocol import packets as P
from broker.protocol import properties as PR
from tests.clusterfake import ClusterClient, FakeCluster
from tests.sansio import bye, recv_type

EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 300}
WHY = "mqtt.cluster.control-0 ends at offset 0, below the 12 already read"


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setattr(recovery_module, "ensure_topics", lambda *a: {a[1].messages: 1})
    return FakeCluster()


def restart_kafka(cluster: FakeCluster) -> None:
    """The in-memory Kafka restarted empty and every node saw it."""
    cluster.logs.clear()
    for n in cluster.nodes:
        for topic in (n.topics.control, n.topics.retained, n.topics.messages):
            cluster.read[(n.node, topic)] = 0
        n._kafka_lost(WHY)
    cluster.pump()


def beat(cluster: FakeCluster, *nodes) -> None:
    for n in nodes:
        n._beat()
    cluster.pump()


def publish(cluster: FakeCluster, pub: ClusterClient, items: list[tuple[bytes, int]], pid: int) -> None:
    """Each PUBLISH acknowledged to its publisher (PUBACK / PUBREC) once Kafka took it."""
    for i, (payload, qos) in enumerate(items):
        pub.send(P.Publish("t/x", payload, qos, packet_id=pid + i))
    cluster.pump()
    acks = [p for p in pub.received() if p.type in (P.PUBACK, P.PUBREC)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(pid + i, 0) for i in range(len(items))]
    for a in acks:
        if a.type == P.PUBREC:
            pub.send(P.Ack(P.PUBREL, a.packet_id))
    cluster.pump()


def delivered(c: ClusterClient) -> list[bytes]:
    """The payloads sent to `c`, each acknowledged (QoS 2 through PUBCOMP)."""
    out = []
    while True:
        pkts = c.received()
        if not pkts:
            return out
        for p in pkts:
            if p.type == P.PUBLISH:
                out.append(p.payload)
                if p.qos:
                    c.send(P.Ack(P.PUBACK if p.qos == 1 else P.PUBREC, p.packet_id))
            elif p.type == P.PUBREL:
                c.send(P.Ack(P.PUBCOMP, p.packet_id))


def test_messages_queued_and_in_flight_before_a_kafka_loss_follow_a_session_to_another_node(cluster):
    """[MQTT-4.3.2-2] / [MQTT-4.3.3-2]: what the broker acknowledged it delivers; [MQTT-4.4.0-1]
    in-flight messages are sent again on the session's next connection, with their packet ids.
    A persistent subscriber on n1 has m0 in flight released (PUBREC sent, PUBCOMP not yet), m1
    in flight unacknowledged, and m2..m9 (QoS 1 and 2) queued while offline, all read by n1
    and let go by n2 (every node read them) when Kafka restarts empty. The client comes back
    on n2: it gets the PUBREL of m0, m1 again (DUP, same id), then m2..m9 in order, each
    QoS 2 message once. A subscriber of the same topics connected to n2 meanwhile gets none
    of the handed-over messages (they are the session's alone)."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    sub = ClusterClient(n1)
    sub.connect("sub", clean=False, props=EXPIRY, cluster=cluster)
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(2))]))
    cluster.pump()
    assert recv_type(sub, P.SUBACK).reason_codes == [2]
    pub = ClusterClient(n2)
    pub.connect("pub", cluster=cluster)
    other = ClusterClient(n2)
    other.connect("other", cluster=cluster)
    other.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(1))]))
    cluster.pump()
    assert recv_type(other, P.SUBACK).reason_codes == [1]

    publish(cluster, pub, [(b"m0", 2), (b"m1", 2)], 1)
    m0, m1 = [p for p in sub.received() if p.type == P.PUBLISH]
    assert (m0.payload, m1.payload) == (b"m0", b"m1")
    sub.send(P.Ack(P.PUBREC, m0.packet_id))
    cluster.pump()  # (the PUBREL waits for the checkpoint that says PUBREC came)
    assert recv_type(sub, P.PUBREL).packet_id == m0.packet_id
    bye(sub)
    cluster.pump()
    later = [(f"m{i}".encode(), 1 + i % 2) for i in range(2, 10)]
    publish(cluster, pub, later, 3)
    beat(cluster, n1, n2)
    beat(cluster, n2)
    assert len(n2.keep.entries) == 0  # every node had read them: nothing to write again
    assert len(delivered(other)) == 10

    restart_kafka(cluster)
    back = ClusterClient(n2)
    assert back.connect("sub", clean=False, props=EXPIRY, cluster=cluster).session_present
    cluster.pump()
    got = []
    pubrels = []
    for _ in range(5):
        for p in back.received():
            if p.type == P.PUBREL:
                pubrels.append(p.packet_id)
                back.send(P.Ack(P.PUBCOMP, p.packet_id))
            elif p.type == P.PUBLISH:
                got.append((p.payload, p.dup, p.packet_id))
                back.send(P.Ack(P.PUBACK if p.qos == 1 else P.PUBREC, p.packet_id))
        cluster.pump()
    assert pubrels.count(m0.packet_id) == 1
    assert got[0] == (b"m1", True, m1.packet_id)
    assert [g[0] for g in got] == [b"m1"] + [m for m, _ in later]
    assert n2.broker.session_of("sub") is not None and not n2.broker.session_of("sub").queue
    assert delivered(other) == []


def test_a_session_moving_between_live_nodes_without_a_loss_is_rebuilt_from_the_log_alone(cluster):
    """Without a Kafka loss every message a session is owed has its place in the log: a move
    writes no message again (no record addressed to the session), and the session gets its
    queue on the new node [MQTT-4.3.2-2]."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    sub = ClusterClient(n1)
    sub.connect("sub", clean=False, props=EXPIRY, cluster=cluster)
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(2))]))
    cluster.pump()
    bye(sub)
    pub = ClusterClient(n2)
    pub.connect("pub", cluster=cluster)
    publish(cluster, pub, [(b"a", 1), (b"b", 2)], 1)
    back = ClusterClient(n2)
    assert back.connect("sub", clean=False, props=EXPIRY, cluster=cluster).session_present
    cluster.pump()
    assert delivered(back) == [b"a", b"b"]
    assert not any(b"mqtt.to" in body for _, body in cluster.logs[n1.topics.messages])


def test_a_retained_message_in_flight_follows_its_session_to_another_node(cluster):
    """[MQTT-4.4.0-1]: a retained message sent on subscribing was never in the messages log;
    in flight unacknowledged when the client reconnects on another node (taking the session
    over from its live node), it is sent again there, DUP, with its packet id."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    pub = ClusterClient(n2)
    pub.connect("pub", cluster=cluster)
    pub.send(P.Publish("r/1", b"kept", 1, retain=True, packet_id=1))
    cluster.pump()
    assert recv_type(pub, P.PUBACK).reason_code == 0
    sub = ClusterClient(n1)
    sub.connect("sub", clean=False, props=EXPIRY, cluster=cluster)
    sub.send(P.Subscribe(1, [("r/#", P.SubscriptionOptions(1))]))
    cluster.pump()
    first = [p for p in sub.received() if p.type == P.PUBLISH]
    assert [(p.payload, p.retain) for p in first] == [(b"kept", True)]
    back = ClusterClient(n2)
    assert back.connect("sub", clean=False, props=EXPIRY, cluster=cluster).session_present
    cluster.pump()
    again = [p for p in back.received() if p.type == P.PUBLISH]
    assert [(p.payload, p.dup, p.packet_id) for p in again] == [(b"kept", True, first[0].packet_id)]


def test_messages_queued_on_their_accepting_node_move_with_the_session_once(cluster):
    """[MQTT-4.3.3-3] / [MQTT-4.3.2-2]: messages published on the node holding an offline
    session are queued for it there at once, before that node reads their records back; the
    client then comes back on the other node. Their records are in the log (above where the
    first node had read), so the move carries none of them: the new node reads each from the
    log, and the client gets each message once, in order."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    sub = ClusterClient(n1)
    sub.connect("sub", clean=False, props=EXPIRY, cluster=cluster)
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(2))]))
    cluster.pump()
    bye(sub)
    cluster.pump()
    pub = ClusterClient(n1)
    pub.connect("pub", cluster=cluster)
    apply = n1._apply
    # n1 has not read its own records back yet (its reader lags): it skips the messages topic
    n1._apply = lambda batches: apply([b for b in batches if b[0] != n1.topics.messages])
    publish(cluster, pub, [(b"m%d" % i, 1 + i % 2) for i in range(6)], 1)
    assert len(n1.held.local) == 6
    back = ClusterClient(n2)
    assert back.connect("sub", clean=False, props=EXPIRY, cluster=cluster).session_present
    cluster.pump()
    assert delivered(back) == [b"m%d" % i for i in range(6)]
    cluster.pump()
    assert delivered(back) == []
    assert not any(b"mqtt.to" in body for _, body in cluster.logs[n1.topics.messages])
