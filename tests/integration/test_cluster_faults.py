"""Faults injected into a running cluster (real broker processes, an embedded Tansu Kafka):
persistent QoS 1 and QoS 2 publishers and subscribers on different nodes while the
subscribers' node, then the publishers' node, is killed with SIGKILL (tests/faultload.py;
bench/cluster_faults.py is the longer run, with figures)."""
from __future__ import annotations

import time
import uuid

import pytest

from kafka_client.embedded import EmbeddedKafka
from tests.faultload import Publisher, Subscriber, account
from tests.integration.test_cluster import Cluster

pytestmark = pytest.mark.kafka


@pytest.fixture
def kafka(tmp_path_factory):
    k = EmbeddedKafka(log_file=str(tmp_path_factory.mktemp("tansu") / "tansu.log")).start()
    yield k
    k.stop()


def stop_publishers(pubs: list[Publisher], wait: float) -> None:
    """The publishers stop (each finishes the exchange it is in, at most `wait` seconds), none
    having failed."""
    for p in pubs:
        p.stopping = True
    for p in pubs:
        p.join(wait)
    assert all(d.error is None for d in pubs), [d.error for d in pubs]


def settle_and_count(pubs: list[Publisher], subs: list[Subscriber], wait: float) -> dict:
    """Once every subscriber has every message acknowledged to a publisher of its QoS (at most
    `wait` seconds) and a while more (anything delivered twice comes then), the subscribers
    stop; tests/faultload.py's counts per message."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        got = [{(pub, i) for pub, i, _ in s.got} for s in subs]
        if all((p.cid, i) in g for g, s in zip(got, subs) for p in pubs if p.qos == s.qos
               for i in p.acked):
            break
        time.sleep(0.2)
    time.sleep(2.0)
    for s in subs:
        s.stopping = True
    for s in subs:
        s.join(10)
    assert all(d.error is None for d in subs), [d.error for d in subs]
    a = account(pubs, subs)
    a.pop("latencies")
    return a


def test_qos2_is_exactly_once_and_nothing_acknowledged_is_lost_when_nodes_are_killed(kafka, tmp_path):
    """[MQTT-4.3.3-6] [MQTT-4.4.0-1] [MQTT-4.3.3-9]: publishers on n1, subscribers on n2
    (QoS 1 and QoS 2, persistent sessions); n2 is killed (SIGKILL), its subscribers move to n3;
    then n1 is killed, its publishers move to n3. Counted per message at every subscriber:
    every acknowledged message is delivered, no QoS 2 message is delivered twice (a PUBLISH of a
    packet id the subscriber does not hold), the order per publisher is kept; QoS 1 may repeat."""
    c = Cluster(kafka, tmp_path, 3)
    try:
        tag = uuid.uuid4().hex[:6]
        topic = f"faults/{tag}"

        def ports(*order):
            return lambda: [c.port(n) for n in order if c.nodes[n].alive()]

        subs = [Subscriber(f"s{q}-{tag}", q, ports("n2", "n3"), topic) for q in (1, 2)]
        for s in subs:
            s.start()
        time.sleep(1.0)
        pubs = [Publisher(f"p{q}-{tag}", q, ports("n1", "n3"), topic, rate=40) for q in (1, 2)]
        for p in pubs:
            p.start()
        time.sleep(3.0)
        c.nodes["n2"].kill()
        time.sleep(5.0)
        c.nodes["n1"].kill()
        time.sleep(5.0)
        stop_publishers(pubs, 30)
        assert all(d.reconnects for d in pubs + subs), "every client moved"
        a = settle_and_count(pubs, subs, 20)
        assert sum(len(p.acked) for p in pubs) > 100, a
        assert (a["lost"], a["qos2_twice"], a["out_of_order"], a["sessions_lost"]) == (0, 0, 0, 0), a
    finally:
        c.stop()


def test_a_session_moved_to_a_node_that_was_not_reading_for_it_gets_nothing_again(kafka, tmp_path):
    """[MQTT-4.3.3-3] [MQTT-4.4.0-1]: persistent QoS 1 and QoS 2 subscribers on n2 move to n3,
    then back to n2, then to n3 again (their connections dropped, every node alive: handed over),
    while publishers on n1 go on. Each time the node they move to had no session that wanted
    the messages, so it read them only now and then (cluster/interest.py) and its reading was
    behind where the last node had delivered. Counted per message: no QoS 2 message delivered
    twice, every acknowledged one delivered, the order per publisher kept."""
    c = Cluster(kafka, tmp_path, 3)
    try:
        tag = uuid.uuid4().hex[:6]
        topic = f"moves/{tag}"
        at = ["n2"]
        subs = [Subscriber(f"s{q}-{tag}", q, lambda: [c.port(at[0])], topic) for q in (1, 2)]
        for s in subs:
            s.start()
        time.sleep(1.0)
        pubs = [Publisher(f"p{q}-{tag}", q, lambda: [c.port("n1")], topic, rate=50) for q in (1, 2)]
        for p in pubs:
            p.start()
        time.sleep(2.0)
        for node in ("n3", "n2", "n3"):
            at[0] = node
            for s in subs:
                s.drop()
            time.sleep(3.0)
        stop_publishers(pubs, 30)
        a = settle_and_count(pubs, subs, 20)
        assert all(len(s.reconnects) == 3 for s in subs), [s.reconnects for s in subs]
        assert sum(len(p.acked) for p in pubs) > 500, a
        assert (a["lost"], a["qos2_twice"], a["out_of_order"], a["sessions_lost"]) == (0, 0, 0, 0), a
    finally:
        c.stop()


def test_qos2_is_exactly_once_and_nothing_acknowledged_is_lost_when_kafka_restarts_empty(
        kafka, tmp_path):
    """[MQTT-4.3.3-6] [MQTT-4.3.2-2] [MQTT-4.3.3-2]: publishers on n1, persistent QoS 1 and
    QoS 2 subscribers on n1 and on n2, while the in-memory Kafka is killed and started again
    empty. Counted per message at every subscriber: every acknowledged message is delivered,
    none twice (QoS 1 included), in its publisher's order [MQTT-4.6.0-5]; no session is lost."""
    c = Cluster(kafka, tmp_path, 2)
    try:
        tag = uuid.uuid4().hex[:6]
        topic = f"kafkaloss/{tag}"

        def ports(*order):
            return lambda: [c.port(n) for n in order if c.nodes[n].alive()]

        subs = [Subscriber(f"s{q}{n}-{tag}", q, ports(n), topic) for q in (1, 2) for n in ("n1", "n2")]
        for s in subs:
            s.start()
        time.sleep(1.0)
        pubs = [Publisher(f"p{q}-{tag}", q, ports("n1"), topic, rate=40) for q in (1, 2)]
        for p in pubs:
            p.start()
        time.sleep(4.0)
        kafka.restart(kill=True)
        time.sleep(6.0)
        stop_publishers(pubs, 60)
        a = settle_and_count(pubs, subs, 30)
        assert sum(len(p.acked) for p in pubs) > 200, a
        assert (a["lost"], a["qos2_twice"], a["qos1_dups"], a["out_of_order"],
                a["sessions_lost"]) == (0, 0, 0, 0, 0), a
    finally:
        c.stop()
