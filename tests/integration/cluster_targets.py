"""The brokers a module's socket tests run against: one broker, a node of a two-node cluster, and
the two nodes behind HAProxy (round robin, so a test's consecutive connections alternate nodes).

A module gets them with `broker, two_nodes, make_target = cluster_targets.broker_fixtures()`: its
tests that take `broker` run on each of the three, those that take `make_target` on each of the
three started with the settings they give; the cluster (one embedded Kafka, Tansu, and two nodes)
is started once per module and shared by the two cluster parameters. Where a test may see a
difference the specification allows across nodes, it asks `on_cluster(broker)` and says the
clause.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.conftest import free_port

from .helpers import connect

TARGETS = ["broker", pytest.param("cluster-node", marks=pytest.mark.kafka),
           pytest.param("balancer", marks=pytest.mark.kafka)]


class ClusterNode:
    """What the tests use of a broker (its port), for a node of a two-node cluster; `ports`: the
    same node's and the other node's."""

    nodes = 2

    def __init__(self, ports: dict):
        self.port = ports["n1"]
        self.ports = {"same-node": ports["n1"], "other-node": ports["n2"]}


class Balancer:
    """HAProxy in front of the two nodes, `balance roundrobin`: each new connection goes to the
    node the previous one did not, so a client's reconnection, a publisher and its subscriber
    are spread over both nodes as a load balancer in production spreads them."""

    nodes = 2

    def __init__(self, ports: dict, tmp) -> None:
        exe = shutil.which("haproxy") or (
            "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
        if exe is None:
            reason = "haproxy is not installed (scripts/setup.sh installs it as root)"
            print("SKIP:", reason)
            pytest.skip(reason)
        self.port = free_port()
        cfg = tmp / "haproxy.cfg"
        servers = "".join(f"    server {n} 127.0.0.1:{p}\n" for n, p in sorted(ports.items()))
        # no health checks: the nodes do not die here, and a check would not move the rotation
        # but would make the logs noisy; maxconn well above what a module's tests open
        cfg.write_text(
            "global\n    maxconn 2000\n"
            "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 1h\n"
            "    timeout server 1h\n"
            f"frontend mqtt\n    bind 127.0.0.1:{self.port}\n    default_backend nodes\n"
            f"backend nodes\n    balance roundrobin\n{servers}")
        self.log = open(tmp / "haproxy.log", "ab")
        self.proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30  # generous: a loaded machine's nodes answer slowly
        while True:  # served through it (an MQTT CONNACK): both nodes in turn
            try:
                for _ in ports:
                    connect(self.port).close()
                break
            except (OSError, AssertionError) as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"HAProxy did not serve MQTT within 30 s ({e!r}): see "
                                       f"{tmp / 'haproxy.log'}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def on_cluster(broker) -> bool:
    """The test runs on a cluster (one of its nodes, or the balancer over two)."""
    return getattr(broker, "nodes", 1) > 1


def broker_fixtures():
    """(broker, two_nodes, make_target): fixtures for a test module's namespace."""

    @pytest.fixture(scope="module")
    def two_nodes(tmp_path_factory):
        """Two nodes, n1 and n2, of one cluster on an embedded Kafka (Tansu): its `Cluster`."""
        from kafka_client.embedded import EmbeddedKafka

        from .test_cluster import Cluster
        tmp = tmp_path_factory.mktemp("cluster")
        kafka = EmbeddedKafka(log_file=str(tmp / "tansu.log")).start()
        c = Cluster(kafka, tmp, 2)
        try:
            yield c
        finally:
            c.stop()
            kafka.stop()

    @pytest.fixture(scope="module", params=TARGETS)
    def broker(request, broker):
        """Every test here runs on one broker, on a node of a cluster (two nodes on the embedded
        Kafka, Tansu) and through HAProxy spreading its connections over the two nodes: a client
        must see no difference but those the specification allows across nodes."""
        if request.param == "broker":
            yield broker
            return
        c = request.getfixturevalue("two_nodes")
        ports = {n: c.port(n) for n in ("n1", "n2")}
        if request.param == "cluster-node":
            yield ClusterNode(ports)
            return
        lb = Balancer(ports, c.tmp)
        try:
            yield lb
        finally:
            lb.stop()

    @pytest.fixture(params=TARGETS)
    def make_target(request, tmp_path):
        """make_target(settings): a broker started with these settings, or two cluster nodes
        with them (on the module's Kafka) as a node or behind HAProxy."""
        made: list = []

        def make(settings: dict):
            if request.param == "broker":
                return request.getfixturevalue("make_broker")(settings)
            from .test_cluster import Cluster
            c = Cluster(request.getfixturevalue("two_nodes").kafka, tmp_path, 2, settings)
            made.append(c)
            ports = {n: c.port(n) for n in ("n1", "n2")}
            if request.param == "cluster-node":
                return ClusterNode(ports)
            lb = Balancer(ports, tmp_path)
            made.append(lb)
            return lb

        yield make
        for m in reversed(made):
            m.stop()

    return broker, two_nodes, make_target
