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

import cluster.node as node_module
from broker.admin.bans import BanList
from broker.protocol import packets as P
from broker.protocol import properties as PR
from kafka_client.fetch import Fetcher
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
    monkeypatch.setattr(node_module, "ensure_topics", lambda *a: made.append(a[1]) or {a[1].messages: 1})
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
    p.acked_upto, p.delivery_timeout, p.went_back = {}, 30.0, None
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
