"""Who owns a client id in a cluster (the claims of cluster/control.py as acted on by
cluster/node.py), on sans-I/O brokers sharing an in-memory log (tests/clusterfake.py): a client
that reconnects to the node it was on is served exactly as by one broker; one that moves to
another node keeps its session; a CONNECT that is refused takes nothing from anybody."""
from __future__ import annotations

import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from tests.clusterfake import ClusterClient, FakeCluster
from tests.sansio import lose, nothing, recv_publish, recv_type

EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 300}
TAKEN_OVER = 0x8E


@pytest.fixture
def cluster():
    return FakeCluster()


def disconnects(c: ClusterClient) -> list[int]:
    """Reason codes of the DISCONNECTs the broker sent `c` (the other packets stay pending)."""
    pkts = c.received()
    c.pending = [p for p in pkts if p.type != P.DISCONNECT]
    return [p.reason_code for p in pkts if p.type == P.DISCONNECT]


def subscribe(c: ClusterClient, filt: str, qos: int = 1, cluster: FakeCluster | None = None) -> None:
    """SUBSCRIBE; a persistent session's SUBACK waits for its record in the log (pump)."""
    c.send(P.Subscribe(1, [(filt, P.SubscriptionOptions(qos))]))
    assert cluster is not None
    cluster.pump()
    assert recv_type(c, P.SUBACK).reason_codes == [qos]


def publish_from(cluster, node, topic: str, payload: bytes, qos: int = 1) -> None:
    pub = ClusterClient(node)
    pub.connect(f"pub-{payload.decode()}", cluster=cluster)
    pub.send(P.Publish(topic, payload, qos, packet_id=1 if qos else None))
    cluster.pump()
    if qos:
        assert [p.type for p in pub.received()] == [P.PUBACK if qos == 1 else P.PUBREC]
    pub.send(P.Disconnect())
    cluster.pump()


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("how", ["disconnect", "dropped"])
def test_a_persistent_session_resumes_on_the_node_it_was_on(cluster, level, how):
    """[MQTT-3.1.2-5], [MQTT-3.2.2-2]: a client that reconnects with Clean Start 0 to the node its
    session is on gets it back (session present), with the QoS 1 message queued meanwhile, and
    keeps its connection: its own earlier claim is not a rival (no 0x8E)."""
    n1, _ = cluster.node("n1")
    c = ClusterClient(n1, level)
    props = EXPIRY if level == 5 else None
    assert not c.connect("dev", clean=False, props=props, cluster=cluster).session_present
    subscribe(c, "t/#", cluster=cluster)
    if how == "disconnect":
        c.send(P.Disconnect())
    lose(c)
    cluster.pump()
    publish_from(cluster, n1, "t/1", b"m1")

    c2 = ClusterClient(n1, level)
    ack = c2.connect("dev", clean=False, props=props, cluster=cluster)
    assert ack.session_present and ack.reason_code == 0
    msg = recv_publish(c2)
    assert (msg.topic, msg.payload, msg.qos) == ("t/1", b"m1", 1)
    cluster.pump()
    assert disconnects(c2) == []
    assert not c2.conn.close_requested
    assert n1.broker.sessions["dev"].connection is c2.conn
    publish_from(cluster, n1, "t/2", b"m2")  # still subscribed, still delivered
    assert recv_publish(c2).payload == b"m2"


@pytest.mark.parametrize("how", ["disconnect", "dropped"])
def test_a_clean_session_reconnects_to_the_same_node_and_stays_connected(cluster, how):
    """[MQTT-3.1.2-4]: Clean Start 1 again on the same node: a new session, session present 0
    [MQTT-3.2.2-2], and the connection is kept (the previous connection's end is not a rival
    claim, even when its end is not yet in the log)."""
    n1, _ = cluster.node("n1")
    c = ClusterClient(n1)
    c.connect("dev", cluster=cluster)
    if how == "disconnect":
        c.send(P.Disconnect())
    lose(c)  # no pump: the reconnect comes in the same moment
    c2 = ClusterClient(n1)
    ack = c2.connect("dev", cluster=cluster)
    assert ack.reason_code == 0 and not ack.session_present
    cluster.pump()
    assert disconnects(c2) == []
    assert not c2.conn.close_requested
    subscribe(c2, "t", cluster=cluster)
    publish_from(cluster, n1, "t", b"x")
    assert recv_publish(c2).payload == b"x"


@pytest.mark.parametrize("clean", [True, False])
def test_a_takeover_on_the_same_node_disconnects_only_the_old_connection(cluster, clean):
    """[MQTT-3.1.4-3]: a second connection with a client id connected on the same node: the old
    one gets DISCONNECT 0x8E Session taken over, the new one is served."""
    n1, _ = cluster.node("n1")
    old = ClusterClient(n1)
    old.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    subscribe(old, "t", cluster=cluster)
    new = ClusterClient(n1)
    ack = new.connect("dev", clean=clean, props=EXPIRY, cluster=cluster)
    assert ack.reason_code == 0 and ack.session_present == (not clean)
    cluster.pump()
    assert disconnects(old) == [TAKEN_OVER]
    assert disconnects(new) == []
    assert not new.conn.close_requested
    assert n1.broker.sessions["dev"].connection is new.conn
    if clean:
        subscribe(new, "t", cluster=cluster)
    publish_from(cluster, n1, "t", b"x")
    assert recv_publish(new).payload == b"x"


def test_a_persistent_session_moves_to_another_node_with_its_queued_messages(cluster):
    """[MQTT-3.1.2-5]: Clean Start 0 on another node: the session is rebuilt there, session
    present [MQTT-3.2.2-2], the QoS 1 messages queued while offline are delivered; the client
    then moves back to the first node, which serves it again."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    c = ClusterClient(n1)
    c.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    subscribe(c, "t/#", cluster=cluster)
    c.send(P.Disconnect())
    lose(c)
    cluster.pump()
    publish_from(cluster, n1, "t/1", b"m1")

    c2 = ClusterClient(n2)
    ack = c2.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    assert ack.session_present
    msg = recv_publish(c2)
    assert msg.payload == b"m1"
    c2.send(P.Ack(P.PUBACK, msg.packet_id))
    cluster.pump()
    assert disconnects(c2) == [] and "dev" not in n1.broker.sessions
    c2.send(P.Disconnect())
    lose(c2)
    cluster.pump()
    publish_from(cluster, n2, "t/2", b"m2")

    c3 = ClusterClient(n1)
    assert c3.connect("dev", clean=False, props=EXPIRY, cluster=cluster).session_present
    assert recv_publish(c3).payload == b"m2"
    cluster.pump()
    assert disconnects(c3) == [] and nothing(c3)


def test_a_dropped_connection_of_a_clean_session_has_its_end_written_in_that_turn(cluster):
    """The end of a clean session whose TCP connection dropped reaches the log at the end of
    that event-loop turn (the server's flush), not with whatever the node writes next: other
    nodes see the client gone at once."""
    n1, _ = cluster.node("n1")
    flushes: list[int] = []
    n1.broker.schedule_flush = lambda: flushes.append(1)
    c = ClusterClient(n1)
    c.connect("dev", cluster=cluster)
    flushes.clear()
    lose(c)
    assert flushes, "no turn end scheduled: the session's end waits for the next CONNECT"
    cluster.pump()
    assert "dev" not in n1.state.clients


@pytest.mark.parametrize("connected", [True, False])
def test_another_users_client_id_is_refused_on_another_node_without_touching_the_owner(cluster, connected):
    """A CONNECT with a client id whose session (connected, or offline) another user made is
    refused with 0x87 Not authorized on any node, as on the owner's node (mqtt.
    session_owner_check), and decided before any claim: the owner keeps its connection (no
    0x8E) and its session; a CONNECT of the owner elsewhere still moves it."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    owner = ClusterClient(n1)
    owner.connect("dev", clean=False, props=EXPIRY, username="alice", cluster=cluster)
    subscribe(owner, "t", cluster=cluster)
    if not connected:
        owner.send(P.Disconnect())
        lose(owner)
        cluster.pump()
    claims_before = n1.counters["claims"] + n2.counters["claims"]
    for level, code in ((5, 0x87), (4, 5)):
        other = ClusterClient(n2, level)
        ack = other.connect("dev", clean=False, props=EXPIRY if level == 5 else None,
                            username="bob", cluster=cluster)
        assert ack.reason_code == code
        assert other.conn.close_requested
    cluster.pump()
    assert n1.counters["claims"] + n2.counters["claims"] == claims_before  # nothing claimed
    assert n1.state.clients["dev"].node == "n1" and "dev" in n1.broker.sessions
    if connected:
        assert disconnects(owner) == [] and not owner.conn.close_requested
        publish_from(cluster, n2, "t", b"x")
        assert recv_publish(owner).payload == b"x"
    else:
        back = ClusterClient(n2)
        assert back.connect("dev", clean=False, props=EXPIRY, username="alice",
                            cluster=cluster).session_present


def wills_received(c: ClusterClient) -> list[bytes]:
    pkts = c.received()
    c.pending = [p for p in pkts if p.type != P.PUBLISH]
    return [p.payload for p in pkts if p.type == P.PUBLISH and p.topic == "will"]


@pytest.mark.parametrize("how", ["noticed", "half-open", "node-killed", "node-gone"])
@pytest.mark.parametrize("clean", [False, True])
def test_a_will_without_delay_is_published_once_when_its_client_comes_back_on_another_node(
        cluster, how, clean):
    """[MQTT-3.1.2-8], [MQTT-3.1.3-9]: a will with Will Delay 0 is published when its connection
    ends abnormally, whether the client then reconnects elsewhere or not: when the first node
    saw the connection drop, when it had not yet (the takeover ends it), and when the first node
    died and the client reconnected to another node before the cluster declared it gone (the
    will goes out once that is known), or after, before the will's timer ran. Exactly once:
    the first node dying later sends no second copy."""
    n1, clock = cluster.node("n1")
    n2, clock2 = cluster.node("n2")
    watcher = ClusterClient(n2)
    watcher.connect("watcher", cluster=cluster)
    subscribe(watcher, "will", cluster=cluster)
    c = ClusterClient(n1)
    c.connect("dev", clean=False, props=EXPIRY, will=P.Will("will", b"gone"), cluster=cluster)
    cluster.pump()
    if how == "noticed":
        lose(c)
        cluster.pump()
    elif how == "node-killed":
        cluster.kill(n1)
    elif how == "node-gone":  # declared gone, the will due; the reconnect comes before the
        cluster.kill(n1)      # executor's next heartbeat fires it
        clock2.t += n2.cfg.node_timeout + 1
        n2._beat()
        cluster.pump()
        assert not n2.state.members["n1"].alive and wills_received(watcher) == []
    c2 = ClusterClient(n2)
    c2.send(P.Connect("dev", 5, clean_start=clean, properties=EXPIRY))
    cluster.pump()
    for claim in n2.claims.handoffs.values():  # a dead node's last word never comes: do not wait
        claim.deadline = 0
    n2.on_tick()
    cluster.pump()
    ack = c2.received()[0]
    assert ack.type == P.CONNACK and ack.reason_code == 0
    wills = wills_received(watcher)
    if how in ("noticed", "half-open"):
        assert wills == [b"gone"]  # published by n1 as the connection ended
        cluster.kill(n1)
    clock2.t += n2.cfg.node_timeout + 1
    for _ in range(3):
        n2._beat()  # declares n1 gone, then runs the timers that are n2's
        cluster.pump()
    assert not n2.state.members["n1"].alive
    assert wills + wills_received(watcher) == [b"gone"]


def publish_qos2(c: ClusterClient, cluster: FakeCluster, pid: int, payload: bytes, dup: bool = False,
                 release: bool = True) -> None:
    c.send(P.Publish("q2", payload, 2, dup=dup, packet_id=pid))
    cluster.pump()
    rec = recv_type(c, P.PUBREC)
    assert (rec.packet_id, rec.reason_code) == (pid, 0)
    if release:
        c.send(P.Ack(P.PUBREL, pid))
        cluster.pump()
        comp = recv_type(c, P.PUBCOMP)
        assert (comp.packet_id, comp.reason_code) == (pid, 0)


def test_qos2_ids_released_after_the_last_checkpoint_are_new_messages_on_the_next_node(cluster):
    """[MQTT-4.3.3-11]: a QoS 2 publisher whose node died moves to another node, which knows its
    awaiting-PUBREL packet ids only from the last checkpoint. Ids the client has released since
    and reuses in new PUBLISHes (DUP 0) are new messages, delivered; an id awaited at the
    checkpoint and resent with DUP 1 is not delivered again [MQTT-4.3.3-9], its PUBREL
    completes; and such ids do not count against Receive Maximum
    [MQTT-3.3.4-7]."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2", receive_maximum=3)
    sub = ClusterClient(n2)
    sub.connect("sub", cluster=cluster)
    subscribe(sub, "q2", qos=2, cluster=cluster)
    c = ClusterClient(n1)
    c.connect("qp", clean=False, props=EXPIRY, cluster=cluster)
    for pid in (1, 2, 3):
        publish_qos2(c, cluster, pid, b"old%d" % pid, release=False)
    n1.on_tick()  # the checkpoint: 1, 2, 3 await their PUBREL
    cluster.pump()
    for pid in (1, 2):
        c.send(P.Ack(P.PUBREL, pid))
        cluster.pump()  # (the PUBCOMP waits for the release in the log)
        assert recv_type(c, P.PUBCOMP).reason_code == 0
    cluster.kill(n1)  # before the next checkpoint

    c2 = ClusterClient(n2)
    c2.send(P.Connect("qp", 5, clean_start=False, properties=EXPIRY))
    cluster.pump()
    for claim in n2.claims.handoffs.values():
        claim.deadline = 0
    n2.on_tick()
    cluster.pump()
    assert recv_type(c2, P.CONNACK).session_present
    publish_qos2(c2, cluster, 3, b"old3", dup=True, release=False)  # a resend: not again
    c2.send(P.Ack(P.PUBREL, 3))  # still awaited at the checkpoint: completed
    cluster.pump()
    comp = recv_type(c2, P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (3, 0)
    for pid in (4, 5, 6):  # Receive Maximum 3: the stale ids take none of it
        publish_qos2(c2, cluster, pid, b"more%d" % pid, release=False)
    assert not c2.conn.close_requested
    for pid in (4, 5, 6):
        c2.send(P.Ack(P.PUBREL, pid))
        cluster.pump()
        assert recv_type(c2, P.PUBCOMP).reason_code == 0
    for pid in (1, 2):  # released after the checkpoint, reused: new messages
        publish_qos2(c2, cluster, pid, b"new%d" % pid)
    assert not c2.conn.close_requested
    got = []
    for p in sub.received():
        if p.type == P.PUBLISH:
            got.append(p.payload)
            sub.send(P.Ack(P.PUBREC, p.packet_id))
            sub.send(P.Ack(P.PUBCOMP, p.packet_id))
    cluster.pump()
    for p in sub.received():
        if p.type == P.PUBLISH:
            got.append(p.payload)
    assert got == [b"old1", b"old2", b"old3", b"more4", b"more5", b"more6", b"new1", b"new2"]


def test_a_reconnect_to_the_same_node_that_goes_away_before_its_claim_leaves_a_consistent_state(cluster):
    """A CONNECT whose connection closes while its claim is on its way: the session stays on
    its node, recorded under the new claim as not connected (no endless rewriting of a state
    the log says is stale), and the client can come back to it."""
    n1, _ = cluster.node("n1")
    c = ClusterClient(n1)
    c.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    subscribe(c, "t", cluster=cluster)
    c.send(P.Disconnect())
    lose(c)
    cluster.pump()
    gone = ClusterClient(n1)
    gone.send(P.Connect("dev", 5, clean_start=False, properties=EXPIRY))
    lose(gone)  # before the claim is read back
    cluster.pump(rounds=50)
    n1.on_tick()
    cluster.pump(rounds=50)
    log = cluster.logs[n1.topics.control]
    size = len(log)
    cluster.pump(rounds=50)
    assert len(log) == size, "records written again and again"
    st = n1.state.clients["dev"]
    assert (st.node, st.connected) == ("n1", False) and n1.checkpoints.bound["dev"] == st.epoch
    back = ClusterClient(n1)
    assert back.connect("dev", clean=False, props=EXPIRY, cluster=cluster).session_present
    cluster.pump()
    assert disconnects(back) == [] and n1.state.clients["dev"].connected


@pytest.mark.parametrize("clean", [False, True])
def test_a_takeover_on_the_same_node_publishes_the_old_connections_will_once(cluster, clean):
    """[MQTT-3.1.4-3], [MQTT-3.1.2-8]: the old connection's will (Will Delay 0) is published
    when a new connection on the same node takes over, once, as on one broker."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    watcher = ClusterClient(n2)
    watcher.connect("watcher", cluster=cluster)
    subscribe(watcher, "will", cluster=cluster)
    old = ClusterClient(n1)
    old.connect("dev", clean=False, props=EXPIRY, will=P.Will("will", b"gone"), cluster=cluster)
    new = ClusterClient(n1)
    assert new.connect("dev", clean=clean, props=EXPIRY, cluster=cluster).reason_code == 0
    cluster.pump()
    assert disconnects(old) == [TAKEN_OVER] and disconnects(new) == []
    assert wills_received(watcher) == [b"gone"]


def test_a_claim_of_a_node_on_its_own_client_id_supersedes_nothing_there():
    """The replicated state alone: a node's claim on a client id it owns (connected or not) is
    no takeover for it (its broker core handles its own connections); another node's claim is."""
    from cluster import control as C
    st = C.ControlState("a", "a1", lambda: 0.0)
    log = [("n:a", C.node_record("join", "a", "a1")), ("n:b", C.node_record("join", "b", "b1")),
           ("c:dev", C.claim_record("a", "a1", "r1", False, 60, None, "u")),
           ("c:dev", C.claim_record("a", "a1", "r2", False, 60, None, "u")),
           ("c:dev", C.claim_record("a", "a1", "r3", True, 60, None, "u")),
           ("c:dev", C.claim_record("b", "b1", "r4", False, 60, None, "u"))]
    effects = []
    for off, (key, rec) in enumerate(log):
        effects.append(st.apply(off, key, rec, 0.0))
    for e in effects[3:5]:
        assert [type(x) for x in e] == [C.Claimed]
    assert [type(x) for x in effects[5]] == [C.Claimed, C.Superseded]
    assert effects[5][1].epoch == 4


def test_a_session_moved_with_queued_messages_frees_exactly_the_queue_bytes_it_took(cluster):
    """The messages a session queued while offline, rebuilt on the node it moves to, count
    towards mqtt.max_queued_bytes and mqtt.max_queued_bytes_total while queued there; once they
    are delivered and acknowledged, the session's queue room and the room of all queues are back
    to their initial values exactly (not above them: the bounds would loosen at each move)."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2", max_queued_bytes=10_000, max_queued_bytes_total=100_000)
    queues = n2.broker.queues
    c = ClusterClient(n1)
    c.connect("dev", clean=False, props=EXPIRY, cluster=cluster)
    subscribe(c, "t/#", cluster=cluster)
    c.send(P.Disconnect())
    lose(c)
    cluster.pump()
    for i in range(3):
        publish_from(cluster, n1, f"t/{i}", b"m%d" % i)

    c2 = ClusterClient(n2)
    assert c2.connect("dev", clean=False, props={**EXPIRY, PR.RECEIVE_MAXIMUM: 1},
                      cluster=cluster).session_present
    s = n2.broker.sessions["dev"]
    got = []
    for _ in range(3):
        msg = recv_publish(c2)
        got.append(msg.payload)
        if len(got) == 1:  # two still queued behind the client's Receive Maximum of 1
            assert queues.per_session - s.queue_room == queues.total - queues.room > 0
        c2.send(P.Ack(P.PUBACK, msg.packet_id))
        cluster.pump()
    assert got == [b"m0", b"m1", b"m2"] and not s.queue
    assert s.queue_room == queues.per_session
    assert queues.room == queues.total
