"""Produce pre-encoded records to Kafka: kafka-python's network client (connections, metadata,
API versions, TLS/SASL) driven from the forwarder's own loop, without KafkaProducer's
per-record accumulator. A chunk of spool entries becomes, per partition, one RecordBatch built
from the bodies the broker encoded (kafka_client.record.build_batch), and one ProduceRequest per
leader (acks=all).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from .net import no_topic_creation
from .record import body_key, build_batch

log = logging.getLogger(__name__)

# KafkaProducer settings that mean nothing to the network client (accepted and ignored)
_PRODUCER_ONLY = ("acks", "enable_idempotence", "linger_ms", "batch_size", "max_block_ms",
                  "delivery_timeout_ms", "compression_type", "retries", "partitioner",
                  "buffer_memory", "key_serializer", "value_serializer", "transactional_id")
PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION = 3, 9   # v3+: RecordBatch v2; v9: what KafkaProducer uses


class NotReady(Exception):
    """No leader known / connection not up yet: try the same records again shortly."""
    retriable = True


class TopicMoved(NotReady):
    """(create_topics False) A topic written to before has another id in Kafka now: it was made
    again (Kafka lost its data). Nothing is sent to it until forget_ids()."""


class ChunkFuture:
    """The outcome of one chunk (one ProduceRequest per leader)."""

    def __init__(self, futs: list[tuple[Any, list[tuple[str, int]]]], counts: dict[tuple[str, int], int]) -> None:
        self._futs = futs                  # [(future, [(topic, partition), ...])]
        self.counts = counts               # (topic, partition) -> records in the chunk
        self.exception: Exception | None = None
        self.value: dict[tuple[str, int], int] | None = None   # (topic, partition) -> base offset
        self.is_done = False

    def poll(self) -> bool:
        if self.is_done:
            return True
        if not all(f.is_done for f, _ in self._futs):
            return False
        from kafka import errors as Errors
        value = {}
        for f, _ in self._futs:
            if f.failed():
                self.exception = self.exception or f.exception
                continue
            for t in f.value.responses:
                for p in t.partition_responses:
                    if p.error_code:
                        exc = Errors.for_code(p.error_code)(p.error_message or "")
                        self.exception = self.exception or exc
                    else:
                        value[(t.name, p.index)] = p.base_offset
        if self.exception is None and set(value) != set(self.counts):
            self.exception = Errors.KafkaError(f"produce response without partitions "
                                               f"{sorted(set(self.counts) - set(value))}")
        self.value = value
        self.is_done = True
        return True


class BatchSender:
    create_topics = True
    _meta: Any = None

    def __init__(self, pcfg: dict, create_topics: bool = True) -> None:
        """create_topics False: a topic missing from Kafka is not created by this client's
        metadata requests (Kafka would make it with its default partition count); records
        for it wait (NotReady) until someone creates it (kafka_client.net.no_topic_creation)."""
        from kafka.net.compat import KafkaNetClient
        cfg = {k: v for k, v in pcfg.items() if k not in _PRODUCER_ONLY}
        cfg.setdefault("client_id", "mqtt-sink-forwarder")
        self.request_timeout_ms = int(pcfg.get("request_timeout_ms", 10000))
        self.metadata_max_age_ms = int(pcfg.get("metadata_max_age_ms", 5000))
        self.client = KafkaNetClient(metrics=None, metric_group_prefix="producer",
                                     wakeup_timeout_ms=pcfg.get("max_block_ms", 1000), **cfg)
        try:
            self.client._manager.bootstrap(int(pcfg.get("bootstrap_timeout_ms", 2000)))
        except Exception:
            self.client.close()
            raise
        if self.client._manager.broker_version_data is None:
            self.client.close()
            from kafka.errors import NoBrokersAvailable
            raise NoBrokersAvailable("no Kafka broker answered")
        self.cluster = self.client.cluster
        self.create_topics = create_topics
        # (create_topics False) the metadata update asked for last: nothing is sent before it
        # is answered, so a Kafka that restarted empty is not written to with what was known of
        # the old one (Tansu takes records for a partition of a topic it no longer has, and
        # they vanish when the topic is created again)
        self._meta: Any = None
        # (create_topics False) topic -> the id Kafka gave it when records were first sent to it
        self.sent_ids: dict[str, Any] = {}
        if not create_topics:
            no_topic_creation(self.client)
        self._parts: dict[str, tuple[int, list[int], dict]] = {}   # topic -> (n, partitions, key -> p)
        # topic -> the one partition all its records go to, whatever its partition count (a
        # topic read as one ordered log that a Kafka may have created with more partitions)
        self.pinned: dict[str, int] = {}
        self._refresh_at = 0.0

    def poll(self, timeout_ms: int = 0) -> None:
        self.client.poll(timeout_ms=timeout_ms)

    def forget_ids(self) -> None:
        """Records may go to the topics under the ids Kafka gives them now (TopicMoved)."""
        self.sent_ids.clear()

    def request_update(self) -> Any:
        self._refresh_at = time.monotonic()
        fut = self.cluster.request_update()
        if not self.create_topics:
            self._meta = fut
        return fut

    def maybe_refresh(self) -> None:
        """Metadata at least every metadata_max_age_ms (how a re-created topic is noticed)."""
        if time.monotonic() - self._refresh_at > self.metadata_max_age_ms / 1000:
            self.request_update()

    def partitions_for(self, topic: str, wait_ms: int = 0) -> set | None:
        parts = self.cluster.partitions_for_topic(topic)
        if parts is None:
            self.cluster.add_topic(topic)        # a Metadata request also makes Tansu create it
            fut = self.request_update()
            if wait_ms:
                self.client.poll(timeout_ms=wait_ms, future=fut)
                parts = self.cluster.partitions_for_topic(topic)
        return parts

    def _partitions(self, topic: str) -> tuple[int, list[int], dict]:
        """(count, sorted partitions, key -> partition cache) of a topic, looked up once per
        chunk (kafka-python's partitions_for_topic builds a new set at each call)."""
        parts = self.cluster.partitions_for_topic(topic)
        if not parts:
            self.partitions_for(topic)
            raise NotReady(f"no metadata for topic {topic} yet")
        ent = self._parts.get(topic)
        if ent is None or ent[0] != len(parts):
            ent = (len(parts), sorted(parts), {})
            self._parts[topic] = ent
        elif len(ent[2]) >= 100_000:
            ent[2].clear()
        return ent

    def send(self, groups: dict[str, list]) -> ChunkFuture:
        """groups: kafka topic -> [(timestamp_ms, body)] in spool order. Raises NotReady before
        anything is sent when a leader is unknown or its connection is not up."""
        from kafka.partitioner.default import murmur2
        from kafka.protocol.producer import ProduceRequest
        from kafka.structs import TopicPartition
        if self._meta is not None:
            if not self._meta.is_done:
                raise NotReady("waiting for Kafka's metadata")
            self._meta = None
        if not self.create_topics:
            ids = getattr(self.cluster, "_topic_ids", {})
            for topic in groups:
                now, was = ids.get(topic), self.sent_ids.get(topic)
                if was is None:
                    if now is not None:
                        self.sent_ids[topic] = now
                elif now is not None and now != was:
                    raise TopicMoved(f"the topic {topic} was made again in Kafka (its id changed)")
        by_tp: dict[tuple[str, int], list] = {}
        for topic, recs in groups.items():
            n, parts, cache = self._partitions(topic)
            pin = self.pinned.get(topic)
            if pin is not None:
                by_tp.setdefault((topic, pin), []).extend(recs)
                continue
            for ts, body in recs:
                key = body_key(body)
                p = cache.get(key)
                if p is None:   # same choice as kafka-python's DefaultPartitioner (murmur2 of the key)
                    p = cache[key] = parts[(murmur2(key) & 0x7FFFFFFF) % n]
                tp = (topic, p)
                lst = by_tp.get(tp)
                if lst is None:
                    by_tp[tp] = lst = []
                lst.append((ts, body))
        by_node: dict[int, dict] = {}
        for tp in by_tp:
            leader = self.cluster.leader_for_partition(TopicPartition(*tp))
            if leader is None or leader == -1:
                self.request_update()
                raise NotReady(f"no leader for {tp[0]}/{tp[1]}")
            by_node.setdefault(leader, {}).setdefault(tp[0], []).append(tp)
        for node in by_node:
            if not self.client.ready(node):
                raise NotReady(f"connection to node {node} not ready")
        Topic = ProduceRequest.TopicProduceData
        Part = Topic.PartitionProduceData
        futs = []
        for node, topics in by_node.items():
            req = ProduceRequest(
                transactional_id=None, acks=-1, timeout_ms=self.request_timeout_ms,
                topic_data=[Topic(name=t, partition_data=[Part(index=p, records=build_batch(by_tp[(t, p)]))
                                                          for _, p in tps])
                            for t, tps in topics.items()],
                min_version=PRODUCE_MIN_VERSION, max_version=PRODUCE_MAX_VERSION)
            futs.append((self.client.send(node, req), [tp for tps in topics.values() for tp in tps]))
        return ChunkFuture(futs, {tp: len(v) for tp, v in by_tp.items()})

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
