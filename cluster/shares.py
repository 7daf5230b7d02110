"""Shared subscriptions across nodes (`$share/{group}/{filter}`, MQTT 5 section 4.8.2).

Each message goes to one member of a group, whatever node the members are on: every node with
members of a group runs one Kafka consumer-group member for it (group id from the share group and
its filter) on the messages topic. Kafka gives each partition to one of those nodes at a time, and
that node gives each of its records that matches the filter to one of its own members (round
robin, connected members first). When a node's last member leaves, or the node dies, Kafka moves
its partitions to the other nodes of the group (a rebalance).

Offsets are committed below the oldest record still owed to a member (in flight, or queued in an
offline persistent member's session), so a record a member never acknowledged is delivered again
after a rebalance or a node's death (duplicates are possible, losses are not). A member session
that ends with unacknowledged records gives them to another member here (4.8.2: the
standard says SHOULD), or, with none left here, to the other nodes through the group.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from kafka_client.gaps import ConsumerHoles
from mqtt_topics import matches

from . import handover
from .link import Reader, Topics

if TYPE_CHECKING:
    import asyncio

    from broker.core.hookhost import HookHost
    from broker.core.message import Message
    from broker.core.session import Session
    from settings import ClusterConfig

log = logging.getLogger(__name__)


def group_id(prefix: str, group: str, topic_filter: str) -> str:
    h = hashlib.blake2b(topic_filter.encode(), digest_size=8).hexdigest()
    return f"{prefix}.share.{group}.{h}"


class ShareHost(Protocol):
    """What the share streams use of their node (cluster/node.py ClusterNode): its settings,
    its Kafka, its broker and loop, where it has read the messages topic to, and the check and
    decoding of a record it reads."""

    @property
    def cfg(self) -> ClusterConfig: ...  # topic_prefix, kafka, node_timeout, fetch_wait_ms
    @property
    def bootstrap(self) -> str: ...
    @property
    def node(self) -> str: ...  # this node's id (the consumers' client id)
    @property
    def broker(self) -> HookHost: ...  # deliver_shared, session_of, shared_groups, clock
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def share_start(self) -> dict[int, int]:
        """Per messages partition, the next offset this node reads: where a new group starts."""
        ...

    def share_message(self, topic: str, offset: int, key: bytes | None, value: bytes | None,
                      headers: list, ts: int) -> Message | None:
        """The message of a record read by a share stream: signed by the cluster and well
        formed, else None (counted by the node)."""
        ...


class ShareStream:
    """This node's member of one share group's consumer group, and what it owes its members."""

    def __init__(self, node: ShareHost, key: tuple) -> None:
        self.node = node
        self.topic = Topics(node.cfg.topic_prefix).messages
        self.key = key                    # (group, topic filter): Router's group key
        self.group, self.filter = key
        self.outstanding: dict = {}       # (partition, offset) -> (Message, member Session)
        self.consumed: dict[int, int] = {}  # partition -> next offset read
        self.assigned: set[int] = set()
        self.commit_to: dict = {}         # partition -> offset: what the reader thread commits
        self.lock = threading.Lock()
        self.reader: Reader | None = None
        self.consumer: Any = None  # a kafka.KafkaConsumer
        self.closing = False

    # ------------------------------------------------------------ on the reader thread
    def start(self) -> None:
        from kafka import TopicPartition
        from kafka.consumer.subscription_state import ConsumerRebalanceListener
        cfg = self.node.cfg
        gid = group_id(cfg.topic_prefix, self.group, self.filter)
        topic = self.topic
        opts = dict(cfg.kafka)
        opts.update(group_id=gid, auto_offset_reset="latest",
                    session_timeout_ms=int(max(cfg.node_timeout, 1.0) * 1000),
                    heartbeat_interval_ms=int(max(cfg.node_timeout, 1.0) * 1000 / 4),
                    max_poll_interval_ms=300000)
        self._seed_offsets(gid, topic, TopicPartition)
        from kafka import KafkaConsumer
        c = self.consumer = KafkaConsumer(bootstrap_servers=self.node.bootstrap,
                                          enable_auto_commit=False,
                                          fetch_max_wait_ms=cfg.fetch_wait_ms,
                                          client_id=f"mqtt-cluster-share-{self.node.node}", **opts)
        stream = self
        holes = ConsumerHoles()  # offsets Kafka's answers skipped (kafka_client/gaps.py)

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
                stream._commit_now()      # what was delivered here is not delivered again
                holes.forget(revoked)     # (read from its committed offset when it comes back)
                with stream.lock:
                    for tp in revoked:
                        stream.assigned.discard(tp.partition)

            def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
                holes.forget(assigned)
                with stream.lock:
                    stream.assigned |= {tp.partition for tp in assigned}
                log.info("cluster: $share/%s/%s: partitions %s of the messages topic are this "
                         "node's", stream.group, stream.filter[:100],
                         sorted(stream.assigned) or "none")

        c.subscribe([topic], listener=Listener())
        self.reader = Reader(c, self.node.loop, self._apply, name=f"cluster-share-{self.group}",
                             between=self._commit_now, holes=holes)
        self.reader.start()

    def _seed_offsets(self, gid: str, topic: str, TopicPartition: Any) -> None:
        """A group nobody has consumed for yet starts where the log is now, so what was published
        after its first SUBACK reaches it even while the consumer group is still forming."""
        from kafka import KafkaConsumer
        from kafka.structs import OffsetAndMetadata
        c = KafkaConsumer(bootstrap_servers=self.node.bootstrap, group_id=gid,
                          enable_auto_commit=False, **self.node.cfg.kafka)
        try:
            upto = self.node.share_start()
            tps = [TopicPartition(topic, p) for p in upto]
            if any(c.committed(tp) is not None for tp in tps):
                return
            c.commit({tp: OffsetAndMetadata(upto.get(tp.partition, 0), "", -1) for tp in tps})
        except Exception as exc:  # the group exists and is rebalancing: it has offsets then
            log.debug("cluster: seeding offsets of share group %s: %s", gid, exc)
        finally:
            c.close()

    def _commit_now(self) -> None:
        with self.lock:
            todo, self.commit_to = self.commit_to, {}
        if not todo or self.consumer is None:
            return
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata
        topic = self.topic
        try:
            self.consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                                  for p, o in todo.items()})
        except Exception as exc:  # a rebalance is under way: the next owner redelivers
            log.debug("cluster: commit of share group %s failed: %s", self.group, exc)

    # ------------------------------------------------------------ on the loop
    def _apply(self, recs: dict) -> None:
        node = self.node
        broker = node.broker
        for tp, rs in recs.items():
            p = tp.partition
            for r in rs:
                topic = (r.key or b"").decode(errors="replace")
                if matches(self.filter, topic) and not handover.to_one(r.headers):
                    msg = node.share_message(tp.topic, r.offset, r.key, r.value, r.headers,
                                             r.timestamp)
                    if msg is None:
                        continue
                    msg.store_id = (p, r.offset)  # (partition, offset), as cluster.node
                    member = broker.deliver_shared(msg, self.key)
                    if member is not None and msg.qos:
                        self.outstanding[(p, r.offset)] = (msg, member)
            self.consumed[p] = rs[-1].offset + 1

    def settle(self) -> None:
        """About once a second: what members acknowledged is settled; what a member that ended
        still owed goes to another member; offsets to commit below what is still owed."""
        broker = self.node.broker
        owed: dict = {}
        for (p, off), (msg, s) in list(self.outstanding.items()):
            alive = broker.session_of(s.client_id) is s
            if alive and _holds(s, msg):
                owed.setdefault(p, off)
                owed[p] = min(owed[p], off)
                continue
            del self.outstanding[(p, off)]
            if not alive and _holds(s, msg):
                # [4.8.2] the member's session ended before it acknowledged: another member
                member = broker.deliver_shared(msg, self.key)
                if member is not None:
                    self.outstanding[(p, off)] = (msg, member)
                    owed[p] = min(owed.get(p, off), off)
                else:
                    owed[p] = min(owed.get(p, off), off)  # not committed: another node has it
        commit = {}
        for p, nxt in self.consumed.items():
            commit[p] = min(nxt, owed.get(p, nxt))
        with self.lock:
            self.commit_to = commit

    def stop(self) -> None:
        self.closing = True
        if self.reader is not None:
            self.reader.stop()
            self.reader.join(3)
        if self.consumer is not None:
            try:
                self._commit_now()
                self.consumer.close()  # leaves the group: its partitions move at once
            except Exception:
                pass


def _holds(s: Session, msg: Message) -> bool:
    """Whether a member session still owes an acknowledgement for msg (in flight or queued)."""
    for e in s.inflight_out.values():
        if e.msg is msg:
            return True
    for q in s.queue:
        if q[0] is msg:
            return True
    return False


class Shares:
    """The share streams this node runs: one per group with members here."""

    def __init__(self, node: ShareHost) -> None:
        self.node = node
        self.streams: dict[tuple, ShareStream] = {}
        self.seen_version = -1
        self.last_settle = 0.0

    def reconcile(self) -> None:
        version, groups = self.node.broker.shared_groups()
        if version == self.seen_version:
            return
        self.seen_version = version
        want = set(groups)
        for key in want - set(self.streams):
            s = self.streams[key] = ShareStream(self.node, key)
            threading.Thread(target=s.start, name="cluster-share-start", daemon=True).start()
        for key in set(self.streams) - want:
            s = self.streams.pop(key)
            s.settle()
            threading.Thread(target=s.stop, name="cluster-share-stop", daemon=True).start()

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last_settle >= 1.0:
            self.last_settle = now
            for s in self.streams.values():
                s.settle()

    def stop(self) -> None:
        for s in self.streams.values():
            s.settle()
            s.stop()
        self.streams.clear()
