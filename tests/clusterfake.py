"""A cluster without Kafka or sockets: ClusterNodes (cluster/node.py) on sans-I/O brokers
(tests/sansio.py) sharing one in-memory log per topic.

What a node writes waits in its FakeProducer until `pump()`: then it enters the shared log in
the order written (Kafka's order), is acknowledged, and every node reads what it has not read
yet through its real read path (ClusterNode._apply on record batches, as fetched). Between
pumps, nodes have not seen each other's writes: the lag of a real log, under the test's control.
"""
from __future__ import annotations

import struct
import threading
from typing import Any

from broker.core.events import AcksHeld, AdmitRequested
from cluster import control as C
from cluster.node import ClusterNode
from kafka_client.record import build_batch
from kafka_client.recordscan import Scanned
from settings import ClusterConfig
from tests.sansio import Client, make


class FakeProducer:
    def __init__(self, cluster: FakeCluster, sign: Any = None) -> None:
        self.cluster = cluster
        self.sign = sign
        self.pending: list[tuple[str, int, bytes, Any]] = []
        self.backlog = 0
        self.handed = 0     # records sent, and answered (as cluster/produce.py's Producer)
        self.answered = 0
        self.acked_upto: dict[tuple[str, int], int] = {}

    def send(self, topic: str, key: bytes, value: bytes | None, headers: Any, ts: int, tag: Any) -> None:
        from cluster.produce import _tombstone
        from kafka_client.record import encode_body
        self.send_body(topic, encode_body(key, value, headers or []) if value is not None
                       else _tombstone(key), ts, tag)

    def send_body(self, topic: str, body: bytes, ts: int, tag: Any) -> bytes:
        if self.sign is not None:  # as cluster/produce.py's Producer: the node's signature
            body = self.sign(topic, body, ts)
        self.pending.append((topic, ts, body, tag))
        self.backlog += 1
        self.handed += 1
        return body

    def send_again(self, topic: str, items: list) -> None:
        sign = self.sign
        self.pending[:0] = [(topic, ts, sign(topic, body, ts) if sign is not None else body, tag)
                            for body, ts, tag in items]
        self.backlog += len(items)

    def kick(self) -> None:
        pass

    def take_went_back(self) -> str | None:
        return None

    def flush(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


class _Loop:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.cluster.calls.append((fn, args))

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        return None


class FakeFetcher:
    def __init__(self) -> None:
        self.high: dict = {}
        self.stuck = 0   # (partitions answered empty below their end: never here)

    def close(self) -> None:
        pass


class FakeCluster:
    """Nodes sharing a log; `pump()` delivers what they wrote to every node."""

    def __init__(self) -> None:
        self.logs: dict[str, list[tuple[int, bytes]]] = {}
        self.nodes: list[ClusterNode] = []
        self.down: set[str] = set()   # nodes that read and write nothing any more (killed)
        self.read: dict[tuple[str, str], int] = {}  # (node, topic) -> next offset to read
        self.calls: list = []  # what other threads asked the loop to run (call_soon_threadsafe)
        self.key = b"k" * 32   # the cluster key every node shares (records signed with it)

    def node(self, node_id: str, bans: Any = None, **mqtt: Any) -> tuple[ClusterNode, Any]:
        """A node that joined the cluster: (ClusterNode, the sans-I/O broker's clock); `bans`:
        the server's ban list (a BanList), shared through the cluster from the start."""
        broker, clock = make(**mqtt)
        n = ClusterNode(ClusterConfig(enabled=True, node_id=node_id, partitions=1), "fake:1",
                        wall=clock, key=self.key)
        broker.add_hook(n)
        n.state = C.ControlState(node_id, n.inc, clock)
        n.producer = FakeProducer(self, n.trust.sign)  # type: ignore[assignment]
        n.fetcher = FakeFetcher()  # type: ignore[assignment]
        n.loop = _Loop(self)  # type: ignore[assignment]
        n.rebuilds.scan = lambda ranges, filters, publisher=None, n=n: self._scan(  # type: ignore[method-assign]
            n, ranges, filters, publisher)
        n.routed_upto = {0: len(self.logs.get(n.topics.messages, ()))}
        for topic in (n.topics.control, n.topics.retained):
            self.read[(node_id, topic)] = 0
        self.read[(node_id, n.topics.messages)] = n.routed_upto[0]
        if bans is not None:
            n.share_bans(bans)
        self.nodes.append(n)
        n._write_control(f"n:{node_id}", C.node_record("join", node_id, n.inc, at=clock()))
        self.pump()
        assert n.state.me_alive()
        n.ready = True
        return n, clock

    def kill(self, n: ClusterNode) -> None:
        """SIGKILL: the node writes nothing more (what it had not handed over is lost)."""
        self.down.add(n.node)
        n.producer.pending.clear()  # type: ignore[attr-defined]

    def pump(self, rounds: int = 5) -> None:
        """Turn ends on every node, its records into the log, then every node reads them; again
        until nothing more is written (at most `rounds` times)."""
        for _ in range(rounds):
            wrote = False
            for n in self.nodes:
                if n.node in self.down:
                    continue
                n.on_turn_end()
                p: FakeProducer = n.producer  # type: ignore[assignment]
                sent, p.pending = p.pending, []
                for topic, ts, body, _tag in sent:
                    log = self.logs.setdefault(topic, [])
                    log.append((ts, body))
                    p.acked_upto[(topic, 0)] = len(log)
                    wrote = True
                p.backlog -= len(sent)
                p.answered += len(sent)
                n._completed([(tag, None) for *_, tag in sent])
            for n in self.nodes:
                if n.node not in self.down:
                    self._read(n)
            for t in threading.enumerate():  # a session rebuilt from the log (cluster/rebuild.py)
                if t.name.startswith("cluster-rebuild-"):
                    t.join(5)
            calls, self.calls = self.calls, []
            for fn, args in calls:
                fn(*args)
            if not wrote and not calls:
                return

    def _scan(self, n: ClusterNode, ranges: dict, filters: list, publisher: str | None = None) -> list:
        """Rebuild.scan (cluster/rebuild.py) over the shared messages log."""
        from cluster.rebuild import qos2_of
        from mqtt_topics import matches
        log = self.logs.get(n.topics.messages, [])
        lo, hi = ranges[0]
        if lo >= hi:
            return []
        raw = bytearray(build_batch(log[lo:hi]))
        struct.pack_into(">q", raw, 0, lo)
        rec = Scanned(bytes(raw))
        out = []
        for i in rec.indexes():
            off, key, value, headers, ts = rec.record(i)
            if any(matches(f, (key or b"").decode()) for f in filters) or \
                    publisher is not None and qos2_of(headers, publisher):
                out.append((0, off, key, value, headers, ts))
        return out

    def _read(self, n: ClusterNode) -> None:
        batches = []
        for topic in (n.topics.control, n.topics.retained, n.topics.messages):
            log = self.logs.get(topic, [])
            start = self.read[(n.node, topic)]
            if start >= len(log):
                continue
            raw = bytearray(build_batch(log[start:]))
            struct.pack_into(">q", raw, 0, start)  # the base offset, as Kafka sets it
            batches.append((topic, 0, Scanned(bytes(raw)), start))
            self.read[(n.node, topic)] = len(log)
        if batches:
            n._apply(batches)


class ClusterClient(Client):
    """A sans-I/O client of a cluster node: what the server does with the core's events (the
    admission and the acks that wait for Kafka), without asyncio."""

    def __init__(self, node: ClusterNode, level: int = 5) -> None:
        super().__init__(node.broker, level)
        self.node = node

    def send(self, pkt: Any) -> None:
        from broker.protocol.codec import encode
        self.handle(self.conn.data_received(encode(pkt, self.level)))

    def send_bytes(self, data: bytes) -> None:
        self.handle(self.conn.data_received(data))

    def handle(self, events: Any) -> None:
        for ev in events or ():
            if type(ev) is AdmitRequested:
                ev.token.add_done_callback(  # type: ignore[attr-defined]
                    lambda tok, ev=ev: self.handle(self.conn.admit_done(
                        ev.connect, ev.client_id, ev.assigned, tok.failure)))
            elif type(ev) is AcksHeld:
                token = self.node.barrier()
                acks, subacks = ev.acks, ev.subacks
                if token is None:
                    self.conn.acks_done(acks, None, subacks)
                else:
                    token.add_done_callback(lambda t, a=acks, s=subacks: self.conn.acks_done(a, t.failure, s))

    def connect(self, cid: str, clean: bool = True, props: Any = None, cluster: FakeCluster | None = None,
                **kw: Any) -> Any:
        """CONNECT, the claim through the log (`cluster.pump()`), then the CONNACK."""
        from broker.protocol import packets as P
        self.send(P.Connect(cid, self.level, clean_start=clean, properties=props, **kw))
        assert cluster is not None, "connect() needs the cluster to pump the claim through"
        cluster.pump()
        ack, *self.pending = self.received()
        assert ack.type == P.CONNACK
        return ack
