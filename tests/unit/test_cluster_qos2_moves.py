"""QoS 2 deliveries to a persistent session whose node is killed (SIGKILL: it writes nothing
more), continued on the node the client reconnects to, on sans-I/O brokers sharing an
in-memory log (tests/clusterfake.py). Exactly once (MQTT 5 section 4.3.3): a message whose PUBREL was
sent is never sent again as a PUBLISH, one in flight is resent with its packet id and DUP 1
[MQTT-4.4.0-1], and what the client acknowledged is not delivered again."""
from __future__ import annotations

import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from tests.clusterfake import ClusterClient, FakeCluster
from tests.sansio import nothing, recv_type

EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 300}


@pytest.fixture
def cluster():
    return FakeCluster()


def setup(cluster: FakeCluster, receive_max: int | None = None):
    """n1 serves a persistent QoS 2 subscriber; n2 a publisher. (n1, n2, sub, pub)"""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    sub = ClusterClient(n1)
    props = dict(EXPIRY)
    if receive_max:
        props[PR.RECEIVE_MAXIMUM] = receive_max
    sub.connect("sub", clean=False, props=props, cluster=cluster)
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(2))]))
    cluster.pump()
    assert recv_type(sub, P.SUBACK).reason_codes == [2]
    pub = ClusterClient(n2)
    pub.connect("pub", cluster=cluster)
    return n1, n2, sub, pub


def publish(cluster: FakeCluster, pub: ClusterClient, *payloads: bytes) -> None:
    """QoS 2 PUBLISHes, each flow completed."""
    pids = []
    for payload in payloads:
        pid = pub.next_pid = getattr(pub, "next_pid", 0) + 1
        pids.append(pid)
        pub.send(P.Publish("t/x", payload, 2, packet_id=pid))
    cluster.pump()
    assert [(p.type, p.packet_id) for p in pub.received()] == [(P.PUBREC, pid) for pid in pids]
    for pid in pids:
        pub.send(P.Ack(P.PUBREL, pid))
    assert [p.type for p in pub.received()] == [P.PUBCOMP] * len(pids)


def publishes(c: ClusterClient) -> list[P.Publish]:
    pkts = c.received()
    assert all(p.type == P.PUBLISH for p in pkts), pkts
    return pkts


def move(cluster: FakeCluster, to, cid: str = "sub", props: dict | None = None) -> ClusterClient:
    """The client reconnects to node `to` after its node was killed (the handoff waits for
    the dead node's final state until it times out: resumed from the last checkpoint)."""
    c = ClusterClient(to)
    c.send(P.Connect(cid, 5, clean_start=False, properties=props or EXPIRY))
    cluster.pump()
    for claim in to.claims.handoffs.values():
        claim.deadline = 0
    to.on_tick()
    cluster.pump()
    assert recv_type(c, P.CONNACK).session_present
    return c


def test_completed_qos2_deliveries_are_not_delivered_again_after_the_node_dies(cluster):
    """[MQTT-4.3.3-6]: messages the client received, released and completed before its node
    was killed (no periodic checkpoint since) are not sent again as new PUBLISHes by the node
    it moves to; at most the PUBREL of the last ones comes again."""
    n1, n2, sub, pub = setup(cluster)
    publish(cluster, pub, b"m1", b"m2", b"m3")
    got = publishes(sub)
    assert [p.payload for p in got] == [b"m1", b"m2", b"m3"]
    for p in got:
        sub.send(P.Ack(P.PUBREC, p.packet_id))
    cluster.pump()
    assert [(p.type, p.packet_id) for p in sub.received()] == \
        [(P.PUBREL, p.packet_id) for p in got]
    for p in got:
        sub.send(P.Ack(P.PUBCOMP, p.packet_id))
    cluster.pump()
    cluster.kill(n1)

    c = move(cluster, n2)
    again = c.received()
    assert [p for p in again if p.type == P.PUBLISH] == []
    assert all(p.type == P.PUBREL for p in again)
    for p in again:
        c.send(P.Ack(P.PUBCOMP, p.packet_id))
    publish(cluster, pub, b"m4")
    assert [p.payload for p in publishes(c)] == [b"m4"]


def test_a_released_qos2_delivery_is_continued_with_pubrel_after_the_node_dies(cluster):
    """[MQTT-4.3.3-6] [MQTT-4.4.0-1]: PUBREC came for m1 (PUBREL sent), m2 was completed
    before m1 (acknowledgements out of order); the next node sends PUBREL for m1 with its
    packet id, and neither message again as a PUBLISH."""
    n1, n2, sub, pub = setup(cluster)
    publish(cluster, pub, b"m1", b"m2")
    m1, m2 = publishes(sub)
    sub.send(P.Ack(P.PUBREC, m2.packet_id))
    cluster.pump()
    assert recv_type(sub, P.PUBREL).packet_id == m2.packet_id
    sub.send(P.Ack(P.PUBCOMP, m2.packet_id))
    sub.send(P.Ack(P.PUBREC, m1.packet_id))
    cluster.pump()
    assert recv_type(sub, P.PUBREL).packet_id == m1.packet_id
    cluster.kill(n1)

    c = move(cluster, n2)
    assert [(p.type, p.packet_id) for p in c.received()] == [(P.PUBREL, m1.packet_id)]
    c.send(P.Ack(P.PUBCOMP, m1.packet_id))
    cluster.pump()
    assert nothing(c)


def test_the_pubrel_waits_until_the_release_is_in_the_log(cluster):
    """[MQTT-4.3.3-6]: the PUBREL for a persistent session's QoS 2 delivery is sent once the
    session's checkpoint naming the release is written (a node that takes the session over
    then knows it), not before."""
    n1, n2, sub, pub = setup(cluster)
    publish(cluster, pub, b"m1")
    (m1,) = publishes(sub)
    sub.send(P.Ack(P.PUBREC, m1.packet_id))
    assert nothing(sub)
    cluster.pump()
    assert recv_type(sub, P.PUBREL).packet_id == m1.packet_id


def test_an_unacknowledged_qos2_delivery_is_resent_with_its_packet_id_and_dup_after_the_node_dies(cluster):
    """[MQTT-4.4.0-1] [MQTT-3.3.1-1]: a QoS 2 PUBLISH the client has not acknowledged when its
    node is killed is resent by the next node with the same packet id and DUP 1 (the client
    that received it recognises it: not delivered twice); the messages that were still queued
    behind it (Receive Maximum 1) follow as new PUBLISHes, once each."""
    n1, n2, sub, pub = setup(cluster, receive_max=1)
    publish(cluster, pub, b"m0")
    (m0,) = publishes(sub)  # completed, so that m1's id is not the session's first
    sub.send(P.Ack(P.PUBREC, m0.packet_id))
    cluster.pump()
    sub.send(P.Ack(P.PUBCOMP, recv_type(sub, P.PUBREL).packet_id))
    cluster.pump()
    publish(cluster, pub, b"m1", b"m2", b"m3")
    (m1,) = publishes(sub)
    assert not m1.dup
    cluster.kill(n1)

    c = move(cluster, n2, props={**EXPIRY, PR.RECEIVE_MAXIMUM: 1})
    (again,) = publishes(c)
    assert (again.payload, again.packet_id, again.dup) == (b"m1", m1.packet_id, True)
    got = []
    for _ in range(3):
        c.send(P.Ack(P.PUBREC, again.packet_id))
        cluster.pump()
        c.send(P.Ack(P.PUBCOMP, recv_type(c, P.PUBREL).packet_id))
        cluster.pump()
        nxt = publishes(c)
        if not nxt:
            break
        (again,) = nxt
        assert not again.dup
        got.append(again.payload)
    assert got == [b"m2", b"m3"]


def test_a_qos2_publish_resent_with_dup_after_its_node_died_is_routed_once(cluster):
    """[MQTT-4.3.3-9] [MQTT-3.3.1-1]: a persistent session's QoS 2 PUBLISH that its node
    acknowledged (PUBREC) before it was killed, resent with DUP 1 to the next node (the PUBREC
    was lost), is acknowledged there, not routed again; one whose record never reached the
    log is routed by the next node, once."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    watcher = ClusterClient(n2)
    watcher.connect("watcher", cluster=cluster)
    watcher.send(P.Subscribe(1, [("q/#", P.SubscriptionOptions(2))]))
    cluster.pump()
    recv_type(watcher, P.SUBACK)
    c = ClusterClient(n1)
    c.connect("qp", clean=False, props=EXPIRY, cluster=cluster)
    c.send(P.Publish("q/a", b"in-log", 2, packet_id=5))
    cluster.pump()
    assert (recv_type(c, P.PUBREC).packet_id) == 5
    c.send(P.Publish("q/a", b"not-in-log", 2, packet_id=6))  # killed before its write
    cluster.kill(n1)

    c2 = move(cluster, n2, "qp")
    for pid, payload in ((5, b"in-log"), (6, b"not-in-log")):
        c2.send(P.Publish("q/a", payload, 2, dup=True, packet_id=pid))
        cluster.pump()
        assert (recv_type(c2, P.PUBREC).packet_id) == pid
        c2.send(P.Ack(P.PUBREL, pid))
        cluster.pump()
        assert recv_type(c2, P.PUBCOMP).reason_code == 0
    cluster.pump()
    got = [p.payload for p in watcher.received() if p.type == P.PUBLISH]
    assert got == [b"in-log", b"not-in-log"]


def test_a_qos2_publish_whose_record_is_in_the_log_but_not_its_checkpoint_is_routed_once(cluster):
    """[MQTT-4.3.3-9]: the node wrote a QoS 2 PUBLISH's record, then died before the checkpoint
    naming its packet id was written (no PUBREC sent): the next node finds the id in the
    record (mqtt.qos2_id) and does not route the DUP resend again."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    watcher = ClusterClient(n2)
    watcher.connect("watcher", cluster=cluster)
    watcher.send(P.Subscribe(1, [("q/#", P.SubscriptionOptions(2))]))
    cluster.pump()
    recv_type(watcher, P.SUBACK)
    c = ClusterClient(n1)
    c.connect("qp", clean=False, props=EXPIRY, cluster=cluster)
    c.send(P.Publish("q/a", b"once", 2, packet_id=7))
    cluster.pump(rounds=1)  # the record is written; the checkpoint after it is not yet
    assert nothing(c)
    cluster.kill(n1)

    c2 = move(cluster, n2, "qp")
    c2.send(P.Publish("q/a", b"once", 2, dup=True, packet_id=7))
    cluster.pump()
    assert (recv_type(c2, P.PUBREC).packet_id) == 7
    c2.send(P.Ack(P.PUBREL, 7))
    cluster.pump()
    assert recv_type(c2, P.PUBCOMP).reason_code == 0
    got = [p.payload for p in watcher.received() if p.type == P.PUBLISH]
    assert got == [b"once"]
