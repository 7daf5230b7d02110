"""A cluster whose Kafka lost its data (an in-memory Kafka restarted empty, a Kafka replaced):
the reader sees it (kafka_client/fetch.py: a log that ends below what was read from it, offsets
out of range above the log's end, a new cluster id) and reads every partition again from the
new log's start; each node then writes again what the cluster's state needs from it
(cluster/node.py, ClusterNode._recover), on sans-I/O brokers sharing an in-memory log
(tests/clusterfake.py: a Kafka restart is clearing its logs)."""
from __future__ import annotations

import logging
from types import SimpleNamespace as NS
from typing import Any

import pytest

import cluster.recovery as recovery_module
from broker.admin.bans import BanList
from broker.protocol import packets as P
from broker.protocol import properties as PR
from kafka_client.fetch import Fetcher
from kafka_client.gaps import Gaps
from tests.clusterfake import ClusterClient, FakeCluster
from tests.sansio import recv_publish, recv_type

C, M = ("mqtt.cluster.control", 0), ("mqtt.cluster.messages", 0)


class _Cluster:
    def __init__(self, cluster_id: str = "c1") -> None:
        self.cluster_id = cluster_id


def fetcher(positions: dict, answers: list[dict], cluster_id: str = "c1",
            bounds: dict | None = None) -> Fetcher:
    """A Fetcher without sockets: each fetch is answered by the next of `answers`
    ({(topic, partition): (error code, high watermark)}, no records); `bounds` gives the
    (earliest, latest) offsets ListOffsets answers."""
    f = Fetcher.__new__(Fetcher)
    f.wait_ms, f.decoder = 5, None
    f.positions, f.high, f.told = dict(positions), {}, set()
    f.lost, f.cluster_id = None, None
    f.gaps = Gaps()
    f.stuck_since, f.stuck = {}, 0
    f.cluster = _Cluster(cluster_id)  # type: ignore[assignment]
    f._by_leader = lambda tps: {0: list(tps)} if tps else {}  # type: ignore[method-assign]

    def ask(node: int, req: Any, timeout_ms: int = 0) -> Any:
        got = answers.pop(0)
        return NS(responses=[NS(topic=t, partitions=[NS(partition_index=p, error_code=err,
                                                        high_watermark=hw, records=None)])
                             for (t, p), (err, hw) in got.items()])
    f._ask = ask  # type: ignore[method-assign]
    f.offsets = lambda tps, which: {tp: (bounds or {})[tp][0 if which == "earliest" else 1]  # type: ignore[method-assign]
                                    for tp in tps}
    return f


def test_a_log_that_ends_below_what_was_read_from_it_is_read_again_from_its_start():
    """An in-memory Kafka restarted empty answers a fetch above its logs' ends with no error and
    a high watermark below the position: every followed partition (not only that one) is read
    again from offset 0, once, and take_lost() says why."""
    f = fetcher({C: 120, M: 40}, [{C: (0, 3), M: (0, 50)}, {C: (0, 3), M: (0, 50)}])
    assert f.fetch() == []
    assert f.positions == {C: 0, M: 0} and f.high == {}
    why = f.take_lost()
    assert why is not None and "mqtt.cluster.control-0 ends at offset 3" in why and "120" in why
    assert f.take_lost() is None
    f.fetch()  # the new log, from its start: nothing more to say
    assert f.positions == {C: 0, M: 0} and f.take_lost() is None and f.high == {C: 3, M: 50}


def test_an_offset_out_of_range_above_the_logs_end_means_kafka_lost_data():
    f = fetcher({C: 120, M: 40}, [{C: (1, -1), M: (0, 40)}], bounds={C: (0, 7)})
    f.fetch()
    assert f.positions == {C: 0, M: 0} and "ends at offset 7" in (f.take_lost() or "")


def test_an_offset_out_of_range_below_the_logs_start_only_moves_that_partition():
    """Records deleted by retention: not a loss of Kafka's data, that partition goes on from
    its log's start."""
    f = fetcher({C: 2, M: 40}, [{C: (1, -1), M: (0, 40)}], bounds={C: (5, 9)})
    f.fetch()
    assert f.positions == {C: 5, M: 40} and f.take_lost() is None


def test_a_new_cluster_id_means_another_kafka():
    f = fetcher({C: 120, M: 40}, [{C: (0, 120), M: (0, 40)}, {C: (0, 0), M: (0, 0)}])
    f.fetch()
    assert f.take_lost() is None
    f.cluster.cluster_id = "c2"
    f.fetch()
    assert f.positions == {C: 0, M: 0}
    assert "cluster id changed from c1 to c2" in (f.take_lost() or "")


@pytest.fixture
def cluster(monkeypatch):
    made: list = []
    monkeypatch.setattr(recovery_module, "ensure_topics", lambda *a: made.append(a[1]) or {a[1].messages: 1})
    c = FakeCluster()
    c.topics_made = made  # type: ignore[attr-defined]
    return c


def restart_kafka(cluster: FakeCluster) -> None:
    """The in-memory Kafka restarted empty; each node's reader sees it (its fetcher reads every
    partition from the new start) and tells the node (ClusterNode._kafka_lost)."""
    cluster.logs.clear()
    for n in cluster.nodes:
        for topic in (n.topics.control, n.topics.retained, n.topics.messages):
            cluster.read[(n.node, topic)] = 0
        n._kafka_lost("mqtt.cluster.control-0 ends at offset 0, below the 12 already read")
    cluster.pump()


EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 300}


def test_after_kafka_lost_its_data_connects_messages_and_the_cluster_state_work_again(cluster, caplog):
    """The topics are created again, one ERROR line per node says what happened and what it
    does; then a CONNECT is accepted, a QoS 1 message published on n2 reaches n1's subscriber,
    and a node that joins afterwards knows the members, who holds each session and the retained
    messages and bans (written again by the nodes into the new log)."""
    n1, clock = cluster.node("n1", bans=BanList(None, lambda: 1000.0))
    n2, _ = cluster.node("n2", bans=BanList(None, lambda: 1000.0))
    n1.bans.add("clientid", "bad", "abuse")  # type: ignore[union-attr]
    cluster.pump()
    sub = ClusterClient(n1)
    sub.connect("sub", clean=False, props=EXPIRY, cluster=cluster)
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(1))]))
    cluster.pump()
    assert recv_type(sub, P.SUBACK).reason_codes == [1]
    pub = ClusterClient(n2)
    pub.connect("pub", cluster=cluster)
    pub.send(P.Publish("r/1", b"kept", 1, retain=True, packet_id=1))
    cluster.pump()
    assert recv_type(pub, P.PUBACK)

    with caplog.at_level(logging.ERROR, logger="cluster"):
        restart_kafka(cluster)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("lost its data" in e and "reads its new logs from their start"
                                    in e for e in errors)
    assert len(cluster.topics_made) == 2  # type: ignore[attr-defined]

    late = ClusterClient(n1)
    assert late.connect("late", cluster=cluster).reason_code == 0
    pub.send(P.Publish("t/1", b"after", 1, packet_id=2))
    cluster.pump()
    assert recv_type(pub, P.PUBACK)
    msg = recv_publish(sub)
    assert msg.payload == b"after"

    n3, _ = cluster.node("n3", bans=BanList(None, lambda: 1000.0))
    assert n3.state.alive() == ["n1", "n2", "n3"]
    assert [b["value"] for b in n3.bans.list()] == ["bad"]  # type: ignore[union-attr]
    assert n3.owner_of("sub") == "n1" and n3.owner_of("pub") == "n2"
    assert n3.broker.retained_count() == 1


def test_a_write_kafka_answers_with_an_unknown_error_is_sent_again_not_failed():
    """Tansu answers -1 (unknown error) when two writers race for one offset, as two nodes do
    when it has just restarted: nothing was written, so the records are sent again (a copy,
    had one been written, is dropped by the readers) instead of failing the PUBLISHes."""
    from kafka import errors as Errors

    from cluster.produce import Producer

    class Answer:
        def __init__(self, exc: Exception | None) -> None:
            self.exception, self.value, self.counts = exc, {("c", 0): 7}, {("c", 0): 1}

        def poll(self) -> bool:
            return True

    class Sender:
        def __init__(self) -> None:
            self.answers = [Errors.UnknownError(""), None]

        def send(self, groups: dict) -> Answer:
            return Answer(self.answers.pop(0))

        def request_update(self) -> None:
            pass

        def poll(self, timeout_ms: int = 0) -> None:
            pass

    outcomes: list = []
    p = Producer.__new__(Producer)
    p.sender, p.acked_upto, p.delivery_timeout = Sender(), {}, 30.0  # type: ignore[assignment]
    p.front, p.went_back = [], None
    p.loop = NS(call_soon_threadsafe=lambda fn, out: outcomes.extend(out))  # type: ignore[assignment]
    p._send([("c", 1, b"body", "tag")])
    assert outcomes == [("tag", None)] and p.acked_upto == {("c", 0): 8}


def test_offsets_that_go_back_under_the_producers_records_are_seen_as_a_loss():
    """A Kafka restarted empty may take more records than a node had read before the node's
    next fetch (its high watermark then says nothing): the offsets its own records are given
    going back say it, once, and the reader reads every partition again from the start."""
    from cluster.link import FetchReader
    from cluster.produce import Producer

    class Answer:
        def __init__(self, base: int) -> None:
            self.exception, self.value, self.counts = None, {("c", 0): base}, {("c", 0): 1}

        def poll(self) -> bool:
            return True

    bases = [40, 41, 2, 3]
    p = Producer.__new__(Producer)
    p.sender = NS(send=lambda groups: Answer(bases.pop(0)))  # type: ignore[assignment]
    p.acked_upto, p.delivery_timeout, p.went_back, p.front = {}, 30.0, None, []
    p.loop = NS(call_soon_threadsafe=lambda fn, out: None)  # type: ignore[assignment]
    for _ in range(2):
        p._send([("c", 1, b"body", None)])
    assert p.take_went_back() is None
    p._send([("c", 1, b"body", None)])
    p._send([("c", 1, b"body", None)])
    assert "offset 2, below the 42" in (p.take_went_back() or "")
    assert p.take_went_back() is None and p.acked_upto == {("c", 0): 4}

    f = fetcher({C: 5, M: 40}, [{C: (0, 9), M: (0, 45)}] * 3)
    told: list = []
    r = FetchReader(f, None, lambda b: None,  # type: ignore[arg-type]
                    lost=told.append,
                    lost_elsewhere=lambda: None if told else "c-0 took records at offset 2")
    real_fetch = f.fetch
    fetches: list = []

    def counted() -> list:
        fetches.append(dict(f.positions))
        r.stopping = len(fetches) >= 2
        return real_fetch()
    f.fetch = counted  # type: ignore[method-assign]
    r.run()
    assert told == ["c-0 took records at offset 2"]  # once
    assert fetches[0] == {C: 0, M: 0}  # the first fetch after it: from the new logs' start


# ------------------------------------------------------------------ acknowledged messages kept
WHY = "mqtt.cluster.control-0 ends at offset 0, below the 12 already read"


def sub_and_pub(cluster: FakeCluster, qos: int = 2) -> tuple[Any, Any, ClusterClient, ClusterClient]:
    """n1 with a persistent subscriber of t/# (QoS `qos`), n2 with a publisher."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    sub = ClusterClient(n1)
    sub.connect("sub", clean=False, props=EXPIRY, cluster=cluster)
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(qos))]))
    cluster.pump()
    assert recv_type(sub, P.SUBACK).reason_codes == [qos]
    pub = ClusterClient(n2)
    pub.connect("pub", cluster=cluster)
    return n1, n2, sub, pub


def publish_acked(cluster: FakeCluster, pub: ClusterClient, payloads: list[bytes], qos: int,
                  first_pid: int = 1) -> None:
    """Each PUBLISH acknowledged to its publisher (PUBACK, or PUBREC: the message is the
    broker's from then on [MQTT-4.3.3-2]) once Kafka took its record."""
    for i, payload in enumerate(payloads):
        pub.send(P.Publish("t/x", payload, qos, packet_id=first_pid + i))
    cluster.pump()
    acks = [p for p in pub.received() if p.type in (P.PUBACK, P.PUBREC)]
    assert [a.packet_id for a in acks] == list(range(first_pid, first_pid + len(payloads)))
    assert all(a.reason_code == 0 for a in acks)


def delivered(sub: ClusterClient) -> list[bytes]:
    """The payloads sent to `sub`, each PUBLISH acknowledged (QoS 2 through PUBCOMP)."""
    out = []
    while True:
        pkts = sub.received()
        pubs = [p for p in pkts if p.type == P.PUBLISH]
        if not pubs:
            return out
        for p in pubs:
            out.append(p.payload)
            if p.qos == 1:
                sub.send(P.Ack(P.PUBACK, p.packet_id))
            elif p.qos == 2:
                sub.send(P.Ack(P.PUBREC, p.packet_id))
        for p in sub.received():
            if p.type == P.PUBREL:
                sub.send(P.Ack(P.PUBCOMP, p.packet_id))


def lose_logs(cluster: FakeCluster) -> None:
    """The in-memory Kafka restarted empty: every node's reader starts again at offset 0 (each
    node is told of the loss by the test, at the moment it wants)."""
    cluster.logs.clear()
    for n in cluster.nodes:
        for topic in (n.topics.control, n.topics.retained, n.topics.messages):
            cluster.read[(n.node, topic)] = 0


def tell_lost(cluster: FakeCluster, *nodes: Any) -> None:
    """Each node's reader saw the loss: the node recovers (ClusterNode._recover, on its loop)
    before its reader hands over anything of the new log, then everything written is read."""
    for n in nodes:
        n._kafka_lost(WHY)
    calls, cluster.calls = cluster.calls, []
    for fn, args in calls:
        fn(*args)
    cluster.pump()


@pytest.mark.parametrize("qos", [1, 2])
def test_acknowledged_messages_a_stalled_node_had_not_read_reach_its_subscriber_after_kafka_lost_them(
        cluster, qos):
    """[MQTT-4.3.2-2] / [MQTT-4.3.3-2]: a PUBLISH acknowledged by the broker is its to deliver.
    n2 acknowledged 6 messages once Kafka had them; n1, whose persistent subscriber wants them,
    had not read them when Kafka restarted empty. n2 kept them and writes them again into the
    new log: the subscriber gets each one, once, in order."""
    n1, n2, sub, pub = sub_and_pub(cluster, qos)
    cluster.down.add("n1")  # stalled: reads nothing
    payloads = [f"m{i}".encode() for i in range(6)]
    publish_acked(cluster, pub, payloads, qos)
    lose_logs(cluster)
    cluster.down.discard("n1")
    tell_lost(cluster, n1, n2)
    assert delivered(sub) == payloads
    assert n2.counters["resent"] == 6 and n1.counters["delivered"] == 6


def test_a_copy_written_again_is_not_delivered_where_its_original_was(cluster):
    """[MQTT-4.3.3-3] exactly once for QoS 2 across the loss: the subscriber had received m0..m3
    before it; m4..m7 were acknowledged but unread by its node; m8 was written to the new log
    before its node (n2) saw the loss, and read there as any message. n2 then writes m0..m8
    again: only m4..m7 are new to n1, the other copies are skipped, counted."""
    n1, n2, sub, pub = sub_and_pub(cluster)
    publish_acked(cluster, pub, [b"m0", b"m1", b"m2", b"m3"], 2)
    assert delivered(sub) == [b"m0", b"m1", b"m2", b"m3"]
    cluster.down.add("n1")
    publish_acked(cluster, pub, [b"m4", b"m5", b"m6", b"m7"], 2, first_pid=5)
    lose_logs(cluster)
    cluster.down.discard("n1")
    tell_lost(cluster, n1)
    publish_acked(cluster, pub, [b"m8"], 2, first_pid=9)  # n2 has not seen the loss yet
    assert delivered(sub) == [b"m8"]
    tell_lost(cluster, n2)
    assert delivered(sub) == [b"m4", b"m5", b"m6", b"m7"]
    assert n2.counters["resent"] == 9 and n1.counters["resent_skipped"] == 5
    cluster.pump()
    assert delivered(sub) == []


def beat(cluster: FakeCluster, *nodes: Any) -> None:
    """A heartbeat of each node (it says how far it has read), read by all."""
    for n in nodes:
        n._beat()
    cluster.pump()


def test_kept_messages_are_let_go_once_every_live_node_has_read_them(cluster):
    """n2 keeps what it wrote while n1 has said nothing of how far it read, or that it has not
    read that far, and lets it go once n1's heartbeat says it has."""
    n1, n2, sub, pub = sub_and_pub(cluster)
    publish_acked(cluster, pub, [b"a", b"b"], 1)
    beat(cluster, n2)
    assert len(n2.keep.entries) == 2  # n1 never said how far it read
    beat(cluster, n1)  # n1 has read them: let go
    beat(cluster, n2)
    assert len(n2.keep.entries) == 0 and n2.stats()["cluster"]["kept_bytes"] == 0
    cluster.down.add("n1")  # stalled, its last heartbeat before the next ones
    publish_acked(cluster, pub, [b"c", b"d"], 1, first_pid=3)
    beat(cluster, n2)
    assert len(n2.keep.entries) == 2 and n2.state.members["n1"].read == {0: 2}
    cluster.down.discard("n1")
    cluster.pump()  # n1 reads them
    beat(cluster, n1)
    beat(cluster, n2)
    assert len(n2.keep.entries) == 0 and n2.keep.bytes == 0 and n2.keep.dropped == 0
    assert delivered(sub) == [b"a", b"b", b"c", b"d"]


def test_after_the_loss_heartbeats_naming_the_old_logs_offsets_let_nothing_go(cluster):
    """The read positions refer to the new log after the loss: a heartbeat n1 wrote into the
    new log before n1 saw the loss names offsets of the old one, which n2 does not trust; once
    n1 has joined again and read the copies, they are let go."""
    n1, n2, sub, pub = sub_and_pub(cluster)
    publish_acked(cluster, pub, [f"m{i}".encode() for i in range(30)], 1)
    assert len(delivered(sub)) == 30
    lose_logs(cluster)
    tell_lost(cluster, n2)  # n2 wrote the 30 again; n1 read them as it has not seen the loss
    n1._beat()  # positions of the old log, high enough to cover the copies
    cluster.pump()
    n2._beat()
    assert len(n2.keep.entries) == 30 and n2.state.members["n1"].read is None
    assert delivered(sub) == []  # n1 had delivered them all: not again
    for topic in (n1.topics.control, n1.topics.retained, n1.topics.messages):
        cluster.read[("n1", topic)] = 0  # n1's reader starts the new log again from its start
    tell_lost(cluster, n1)
    beat(cluster, n1)
    beat(cluster, n2)
    assert len(n2.keep.entries) == 0
    assert delivered(sub) == []  # n1 had delivered them all: not again


def test_past_keep_bytes_the_oldest_kept_messages_are_dropped_counted_and_logged(cluster, caplog):
    from cluster.keep import OVERHEAD
    n1, n2, sub, pub = sub_and_pub(cluster)
    cluster.down.add("n1")
    publish_acked(cluster, pub, [b"m0"], 1)
    size = len(n2.keep.entries[0][0]) + OVERHEAD
    n2.keep.max_bytes = 3 * size
    with caplog.at_level(logging.WARNING, logger="cluster"):
        publish_acked(cluster, pub, [f"m{i}".encode() for i in range(1, 6)], 1, first_pid=2)
    assert len(n2.keep.entries) == 3 and n2.keep.bytes == 3 * size
    assert n2.stats()["cluster"]["kept_dropped"] == 3
    lines = [r.getMessage() for r in caplog.records if "kept messages" in r.getMessage()]
    assert len(lines) == 1 and "cluster.keep_bytes" in lines[0] and str(3 * size) in lines[0]
    lose_logs(cluster)
    cluster.down.discard("n1")
    tell_lost(cluster, n1, n2)
    assert delivered(sub) == [b"m3", b"m4", b"m5"]  # the newest three were kept


def test_kept_messages_older_than_keep_seconds_are_dropped_counted_and_logged(cluster, caplog):
    n1, n2, sub, pub = sub_and_pub(cluster)
    now = [0.0]
    n2.keep.clock = lambda: now[0]
    cluster.down.add("n1")
    publish_acked(cluster, pub, [b"old"], 1)
    now[0] = 300.0
    publish_acked(cluster, pub, [b"new"], 1, first_pid=2)
    now[0] = 601.0
    with caplog.at_level(logging.WARNING, logger="cluster"):
        n2._beat()
    assert len(n2.keep.entries) == 1
    assert n2.keep.dropped == 1
    assert any("cluster.keep_seconds = 600" in r.getMessage() for r in caplog.records)


def test_qos0_messages_and_refused_writes_are_not_kept(cluster):
    """Only what a publisher was told is the broker's (QoS 1/2, acknowledged) is written again."""
    n1, n2, sub, pub = sub_and_pub(cluster)
    pub.send(P.Publish("t/x", b"zero", 0))
    cluster.pump()
    assert len(n2.keep.entries) == 0
    pub.send(P.Publish("t/x", b"one", 1, packet_id=1))
    e = n2.keep.entries[0]
    n2._completed([(e, "the cluster's Kafka refused the records: test")])
    assert n2.keep.again() == []


def test_a_record_written_again_carries_its_original_id_and_the_again_header():
    from cluster.keep import H_AGAIN, with_again
    from cluster.trust import body_of
    from kafka_client.record import encode_body
    body = encode_body(b"t/x", b"payload", [("mqtt.message_id", b"n2-abc-7"), ("mqtt.qos", b"1")])
    again = with_again(body)
    assert again == body_of(b"t/x", b"payload", [("mqtt.message_id", b"n2-abc-7"),
                                                 ("mqtt.qos", b"1"), (H_AGAIN, b"1")])


def test_a_kept_record_is_let_go_only_once_acknowledged_and_read_by_every_node():
    """Kept in order: a record Kafka has not acknowledged yet stays (and so does every later
    one), whatever the nodes have read; one Kafka refused goes (never written again)."""
    from cluster.keep import Keep
    k = Keep(1 << 20, 600.0, lambda: 0.0)
    a, b, c = (k.add(b"body", 0, None) for _ in range(3))
    Keep.answered(a, None, {0: 5, 1: 2})  # type: ignore[arg-type]
    assert k.trim({0: 10, 1: 1}) == 3  # partition 1 not read that far
    assert k.trim(None) == 3           # some node's position unknown
    assert k.trim({0: 5, 1: 2}) == 2
    Keep.answered(c, None, {0: 6, 1: 2})  # type: ignore[arg-type]
    assert k.trim({0: 10, 1: 10}) == 2  # b, not acknowledged yet, holds c
    Keep.answered(b, "refused", {0: 6, 1: 2})  # type: ignore[arg-type]
    (kept, copy), = k.again()
    assert kept is c and list(k.entries) == [copy] and copy[3] is None and copy[4] is None
    assert k.trim({0: 10, 1: 10}) == 1  # the copy, not acknowledged yet
    Keep.answered(copy, None, {0: 1})  # in the new log
    assert k.trim({0: 1}) == 0 and k.bytes == 0


def test_a_full_keep_first_lets_go_what_every_node_has_read_then_drops_the_oldest():
    from cluster.keep import OVERHEAD, Keep
    read = {0: 0}
    k = Keep(3 * (4 + OVERHEAD), 600.0, lambda: 0.0, floor=lambda: read)
    first = [k.add(b"body", 0, None) for _ in range(3)]
    for e in first:
        Keep.answered(e, None, {0: 3})  # type: ignore[arg-type]
    read[0] = 3  # every node has read them: let go, not dropped
    k.add(b"body", 0, None)
    assert len(k.entries) == 1 and k.dropped == 0
    for _ in range(3):  # unacknowledged: the oldest dropped, counted
        k.add(b"body", 0, None)
    assert len(k.entries) == 3 and k.dropped == 1


def test_a_heartbeat_says_how_far_its_node_has_read_and_a_malformed_one_is_refused():
    from cluster import records as R
    from cluster.control import node_record
    ok = node_record("beat", "n1", "i1", seq=3, read={"0": 12, "1": 0})
    assert R.decode_control(b"n:n1", R.dumps(ok))[1] == ok
    for read in ({"x": 1}, {"0": -1}, {"0": "12"}, [12]):
        with pytest.raises(R.Malformed):
            R.decode_control(b"n:n1", R.dumps({**ok, "read": read}))


def test_a_publish_waiting_for_kafka_when_the_loss_is_seen_is_acknowledged_and_delivered_once(
        cluster):
    """[MQTT-4.3.3-2]: a QoS 2 PUBLISH whose record was still waiting to be sent when its node
    saw the loss gets its PUBREC once that record is in the new log (written as it is, after
    the copies of what the lost log had: none here), and the subscriber gets the message once."""
    n1, n2, sub, pub = sub_and_pub(cluster)
    pub.send(P.Publish("t/x", b"late", 2, packet_id=7))  # handed over, not yet answered
    lose_logs(cluster)
    tell_lost(cluster, n1, n2)
    rec = [p for p in pub.received() if p.type == P.PUBREC]
    assert [(r.packet_id, r.reason_code) for r in rec] == [(7, 0)]
    assert delivered(sub) == [b"late"]
    assert len(cluster.logs[n2.topics.messages]) == 1 and n2.counters["resent"] == 0


def test_a_loss_seen_twice_by_a_reader_does_not_make_it_skip_copies_it_never_had(cluster):
    """[MQTT-4.3.3-2]: n1 hears of the same loss twice (its reader, then its producer's
    offsets), after it read m8 in the new log and before n2's copies: m4..m7, which it never
    had, still reach the subscriber, each once."""
    n1, n2, sub, pub = sub_and_pub(cluster)
    publish_acked(cluster, pub, [b"m0", b"m1", b"m2", b"m3"], 2)
    assert delivered(sub) == [b"m0", b"m1", b"m2", b"m3"]
    cluster.down.add("n1")
    publish_acked(cluster, pub, [b"m4", b"m5", b"m6", b"m7"], 2, first_pid=5)
    lose_logs(cluster)
    cluster.down.discard("n1")
    tell_lost(cluster, n1)
    publish_acked(cluster, pub, [b"m8"], 2, first_pid=9)
    assert delivered(sub) == [b"m8"]
    for topic in (n1.topics.control, n1.topics.retained, n1.topics.messages):
        cluster.read[("n1", topic)] = 0  # read again from the start, as its reader does
    tell_lost(cluster, n1)
    tell_lost(cluster, n2)
    assert delivered(sub) == [b"m4", b"m5", b"m6", b"m7"]
    cluster.pump()
    assert delivered(sub) == []


def here_there_and_pub(cluster: FakeCluster, qos: int) -> tuple[Any, Any, ClusterClient,
                                                                ClusterClient, ClusterClient]:
    """n1 and n2, each with a persistent subscriber of t/# at `qos` ("here" on n1, "there" on
    n2), and a publisher on n1."""
    n1, _ = cluster.node("n1")
    n2, _ = cluster.node("n2")
    here = ClusterClient(n1)
    here.connect("here", clean=False, props=EXPIRY, cluster=cluster)
    there = ClusterClient(n2)
    there.connect("there", clean=False, props=EXPIRY, cluster=cluster)
    for c in (here, there):
        c.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(qos))]))
    cluster.pump()
    pub = ClusterClient(n1)
    pub.connect("pub", cluster=cluster)
    return n1, n2, here, there, pub


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_delivered_on_its_accepting_node_is_not_delivered_there_again_from_its_copy(
        cluster, qos):
    """[MQTT-4.3.3-3] exactly once for QoS 2 (and no duplicate at QoS 1) across the loss: a
    subscriber on the publisher's node got the message as it was accepted, before its node read
    the record back; Kafka then lost it, and the node writes it again: the copy is not delivered
    again there (the other node, which never read it, gets it from the copy)."""
    n1, n2, here, there, pub = here_there_and_pub(cluster, qos)
    read = cluster._read
    cluster._read = lambda n: None   # written and acknowledged; no node reads it back yet
    publish_acked(cluster, pub, [b"m0", b"m1"], qos)
    assert delivered(here) == [b"m0", b"m1"]  # at once, on the accepting node
    assert delivered(there) == []
    lose_logs(cluster)
    cluster._read = read
    tell_lost(cluster, n1, n2)
    cluster.pump()
    assert delivered(here) == []
    assert delivered(there) == [b"m0", b"m1"]
    assert n1.counters["resent"] == 2


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_accepted_after_kafka_restarted_empty_is_not_delivered_again_on_its_node(
        cluster, qos):
    """[MQTT-4.3.3-3] exactly once for QoS 2 (and no duplicate at QoS 1) across the loss:
    Kafka restarted empty and, before n1 saw it, messages published on n1 went into the new log
    and reached n1's subscriber at once. n1 then reads the new log from its start and writes
    its kept messages again: neither those records nor their copies reach that subscriber
    again; n2's subscriber, which never had them, gets each once."""
    n1, n2, here, there, pub = here_there_and_pub(cluster, qos)
    lose_logs(cluster)
    read = cluster._read
    cluster._read = lambda n: None  # each reader is above the new log's end until it sees the loss
    publish_acked(cluster, pub, [b"m0", b"m1"], qos)
    assert delivered(here) == [b"m0", b"m1"]  # at once, on the accepting node
    cluster._read = read
    tell_lost(cluster, n1, n2)
    cluster.pump()
    assert delivered(here) == []
    assert delivered(there) == [b"m0", b"m1"]


# ------------------------------------------------------------------ metadata after a failure
class _Future:
    def __init__(self) -> None:
        self.is_done = False


class _Meta:
    """kafka-python's ClusterMetadata as the reader and the producer see it: each
    request_update() gives a future the test answers by setting `topics` ({topic: id})."""

    def __init__(self, topics: dict[str, str]) -> None:
        self._topic_ids = dict(topics)
        self.asked: list[_Future] = []
        self.cluster_id = "c1"

    def request_update(self) -> _Future:
        self.asked.append(_Future())
        return self.asked[-1]

    def answer(self, topics: dict[str, str]) -> None:
        self._topic_ids = dict(topics)
        for fut in self.asked:
            fut.is_done = True

    def partitions_for_topic(self, topic: str) -> set | None:
        return {0} if topic in self._topic_ids else None


def metadata_fetcher(meta: _Meta, fail_first: bool = True) -> tuple[Fetcher, list]:
    """A Fetcher that makes no topic (as the cluster's), on `meta`; its second Fetch request
    fails as one to a Kafka that just died does; it records the requests it sends."""
    f = fetcher({C: 12, M: 40}, [{C: (0, 12), M: (0, 40)}] * 10)
    f.create_topics, f.topic_ids, f.missing, f.cluster = False, {}, {}, meta  # type: ignore[assignment]
    f.client = NS(poll=lambda **kw: None)  # type: ignore[assignment]
    sent: list = []
    answer = f._ask

    def ask(node: int, req: Any, timeout_ms: int = 0) -> Any:
        sent.append(req)
        if fail_first and len(sent) == 2:
            raise ConnectionError("socket disconnected")
        return answer(node, req, timeout_ms)
    f._ask = ask  # type: ignore[method-assign]
    return f, sent


def test_after_a_failed_fetch_the_reader_asks_for_metadata_before_it_fetches_again():
    """A Kafka that restarted empty answers fetches for partitions it no longer has (Tansu
    answers with what was written there since, which vanishes once the topic is made again):
    after a failed request the reader fetches nothing until fresh metadata came back."""
    meta = _Meta({C[0]: "id-c", M[0]: "id-m"})
    f, sent = metadata_fetcher(meta)
    assert f.fetch() == [] and f.topic_ids == {C[0]: "id-c", M[0]: "id-m"}
    with pytest.raises(ConnectionError):
        f.fetch()
    assert len(meta.asked) == 1
    assert f.fetch() == [] and len(sent) == 2  # the metadata is not back: no fetch
    meta.answer({C[0]: "id-c", M[0]: "id-m"})
    f.fetch()
    assert len(sent) == 3 and f.take_lost() is None and f.positions == {C: 12, M: 40}


@pytest.mark.parametrize("after,why", [
    ({C[0]: "id-c"}, "the topic mqtt.cluster.messages is no longer in Kafka"),
    ({C[0]: "id-c", M[0]: "id-m2"}, "the topic mqtt.cluster.messages was made again"),
])
def test_a_followed_topic_gone_or_made_again_is_a_loss_of_data(after, why):
    """The fresh metadata after a failed request says a topic read from is gone (Kafka
    restarted empty: the cluster makes it again itself, with its partition count) or has
    another id (made again): every position goes back to the new logs' start, and
    take_lost() says why."""
    meta = _Meta({C[0]: "id-c", M[0]: "id-m"})
    f, _ = metadata_fetcher(meta)
    f.fetch()
    with pytest.raises(ConnectionError):
        f.fetch()
    meta.answer(after)
    assert f.fetch() == []
    assert f.positions == {C: 0, M: 0}
    assert (f.take_lost() or "").startswith(why)


def test_a_producer_that_makes_no_topic_sends_nothing_until_fresh_metadata_came_back():
    """The cluster's producer after a failed write (it asks for metadata then): its next
    records wait (NotReady, sent again shortly) until the metadata is back, so nothing is
    written to a restarted Kafka's topic that is not there."""
    from kafka_client.produce import BatchSender, NotReady
    meta = _Meta({M[0]: "id-m"})
    s = BatchSender.__new__(BatchSender)
    s.cluster, s.create_topics, s._refresh_at, s.sent_ids = meta, False, 0.0, {}
    s.request_update()
    with pytest.raises(NotReady, match="metadata"):
        s.send({M[0]: [(1, b"\x02k\x02v\x00")]})
    meta.answer({})
    with pytest.raises(NotReady, match="no metadata for topic"):  # gone: not made here
        s._parts, s.client, s.pinned = {}, None, {}
        s.partitions_for = lambda topic: None  # type: ignore[method-assign]
        s.send({M[0]: [(1, b"\x02k\x02v\x00")]})


def test_a_topic_missing_from_kafkas_metadata_for_a_moment_is_no_loss(monkeypatch):
    """Without a failed request, a topic missing from Kafka's metadata may be one Kafka has no
    leader for yet (a moment after it was made, or during a failover): that is not taken for a
    loss (which would read every log again from its start) until it stayed missing for
    GONE_AFTER seconds."""
    import kafka_client.fetch as fetch_module
    clock = [100.0]
    monkeypatch.setattr(fetch_module.time, "monotonic", lambda: clock[0])
    meta = _Meta({C[0]: "id-c", M[0]: "id-m"})
    f, _ = metadata_fetcher(meta, fail_first=False)
    f.fetch()
    meta.answer({C[0]: "id-c"})
    f.fetch()
    assert f.take_lost() is None and f.positions == {C: 12, M: 40}
    meta.answer({C[0]: "id-c", M[0]: "id-m"})  # back, the same topic
    f.fetch()
    assert f.take_lost() is None and f.missing == {}
    meta.answer({C[0]: "id-c"})
    f.fetch()
    clock[0] += fetch_module.GONE_AFTER
    f.fetch()
    assert (f.take_lost() or "").startswith("the topic mqtt.cluster.messages is no longer in Kafka")
