"""The cluster's Kafka reads: its topics, the consumer thread (writes: cluster/produce.py).

The consumer reads the control, retained and
messages topics (assigned partitions, no consumer group: every node reads everything) on its own
thread and hands the loop one batch at a time, waiting until the loop applied it (backpressure:
a slow loop slows the reading, never grows a queue).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from kafka_client.gaps import ConsumerHoles

if TYPE_CHECKING:
    import asyncio

    from kafka_client.fetch import Fetcher

log = logging.getLogger(__name__)

class Topics:
    def __init__(self, prefix: str) -> None:
        self.messages = f"{prefix}.messages"
        self.retained = f"{prefix}.retained"
        self.control = f"{prefix}.control"


def ensure_topics(bootstrap: str, topics: Topics, partitions: int, replication: int,
                  kafka: dict) -> dict[str, int]:
    """Create the cluster's topics if missing; returns {topic: partition count}."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="mqtt-cluster-admin",
                             **_admin_options(kafka))
    try:
        existing = set(admin.list_topics())
        want = [
            NewTopic(topics.messages, partitions, replication,
                     topic_configs={"cleanup.policy": "delete"}),
            # last record per key wins: retained by MQTT topic, control by client / node id;
            # a long compaction lag leaves time for an owner to re-assert a record (control.py)
            # one partition: retained updates are few, and every node fetches this topic as
            # often as the messages (Tansu's cost per fetch grows with its partitions)
            NewTopic(topics.retained, 1, replication,
                     topic_configs={"cleanup.policy": "compact"}),
            NewTopic(topics.control, 1, replication,
                     topic_configs={"cleanup.policy": "compact",
                                    "min.compaction.lag.ms": str(24 * 3600 * 1000)}),
        ]
        missing = [t for t in want if t.name not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another node created it meanwhile
        counts = {}
        deadline = time.monotonic() + 30
        for t in want:
            while True:
                desc = admin.describe_topics([t.name])
                parts = desc[0].get("partitions") if desc else None
                if parts:
                    counts[t.name] = len(parts)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kafka topic {t.name} was not created within 30 s")
                time.sleep(0.1)
        return counts
    finally:
        admin.close()


def _admin_options(kafka: dict) -> dict:
    keep = ("security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
            "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "request_timeout_ms")
    return {k: v for k, v in kafka.items() if k in keep}


def _consumer_options(kafka: dict) -> dict:
    skip = ("acks", "linger_ms", "batch_size", "enable_idempotence", "retries", "compression_type",
            "max_in_flight_requests_per_connection", "delivery_timeout_ms", "max_block_ms",
            "buffer_memory", "partitioner", "transactional_id")
    return {k: v for k, v in kafka.items() if k not in skip}


def make_consumer(bootstrap: str, kafka: dict, fetch_wait_ms: int) -> Any:  # a kafka.KafkaConsumer
    from kafka import KafkaConsumer
    opts = {"enable_auto_commit": False, "fetch_max_wait_ms": fetch_wait_ms,
            "max_poll_records": 2000, "client_id": "mqtt-cluster-reader",
            # Tansu answers with whole record batches beyond a fetch's size limits
            "max_partition_fetch_bytes": 1 << 20, "receive_message_max_bytes": 256 << 20}
    opts.update(_consumer_options(kafka))
    opts["group_id"] = None  # every node reads every partition: no consumer group here
    # never a topic made by Kafka with its default partition count (ensure_topics makes them)
    opts["allow_auto_create_topics"] = False
    return KafkaConsumer(bootstrap_servers=bootstrap, **opts)


class _Feeder(threading.Thread):
    """A reading thread that hands the loop one batch at a time and waits until the loop has
    applied it (apply(batch) -> None): a slow loop slows the reading, never grows a queue."""
    IDLE_AFTER = 0.2
    IDLE_WAIT_MS = 50

    def __init__(self, loop: asyncio.AbstractEventLoop, apply: Callable[[Any], None],
                 name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.loop = loop
        self.apply = apply
        self.stopping = False
        self.last_records = time.monotonic()
        self._done = threading.Event()

    def _on_loop(self, batch: Any) -> None:
        try:
            self.apply(batch)
        finally:
            self._done.set()

    def hand_over(self, batch: Any) -> bool:
        """Apply `batch` on the loop and wait for it; False when this thread should end."""
        self.last_records = time.monotonic()
        self._done.clear()
        try:
            self.loop.call_soon_threadsafe(self._on_loop, batch)
        except RuntimeError:
            return False  # the loop closed
        while not self._done.wait(0.5):
            if self.stopping:
                return False
        return True

    def stop(self) -> None:
        self.stopping = True


class Reader(_Feeder):
    """Polls the consumer and applies each batch on the loop (apply(batch) -> None), one at a
    time: the next poll waits until the loop applied the previous batch."""

    # Tansu answers a fetch only when its wait ends, even if records arrive meanwhile, so the
    # fetch wait (cluster.fetch_wait_ms, 20) bounds the latency; but 200 fetches a second cost
    # ~16% of a core through kafka-python on an idle node. After IDLE_AFTER seconds without a
    # record the fetch wait becomes IDLE_WAIT_MS (~10x fewer fetches); the first record after a
    # quiet spell may wait up to that much, the following ones do not.

    def __init__(self, consumer: Any, loop: asyncio.AbstractEventLoop, apply: Callable[[dict], None],
                 name: str = "cluster-reader", between: Callable[[], None] | None = None,
                 holes: ConsumerHoles | None = None) -> None:
        super().__init__(loop, apply, name)
        self.consumer = consumer
        self.between = between  # called on this thread after each poll (the consumer's thread)
        # offsets Kafka's answers skipped: asked for again, not read past (kafka_client/gaps.py)
        self.holes = holes if holes is not None else ConsumerHoles()
        self.error: Exception | None = None

    def run(self) -> None:
        fetcher_config: Any = getattr(getattr(self.consumer, "_fetcher", None), "config", None)
        busy_wait = fetcher_config.get("fetch_max_wait_ms") if fetcher_config else None
        while not self.stopping:
            if busy_wait is not None:  # kafka-python reads it for each fetch request it makes
                idle = time.monotonic() - self.last_records > self.IDLE_AFTER
                fetcher_config["fetch_max_wait_ms"] = max(busy_wait, self.IDLE_WAIT_MS) \
                    if idle else busy_wait
            try:
                recs = self.consumer.poll(timeout_ms=200)
            except Exception as exc:  # Kafka unreachable: kafka-python retries inside poll
                if not self.stopping:
                    log.warning("cluster: reading Kafka failed (%s); retrying", exc)
                    time.sleep(1)
                continue
            if recs:
                recs = self.holes.cut(self.consumer, recs)
            if self.between is not None:
                self.between()
            if not recs or self.stopping:
                continue
            if not self.hand_over(recs):
                return


class FetchReader(_Feeder):
    """The node's own stream (kafka_client/fetch.py): fetches every followed partition, hands the
    loop one response at a time and waits until the loop applied it (backpressure).

    Tansu answers a fetch only when its wait ends, even if records arrive meanwhile, so the
    fetch wait (cluster.fetch_wait_ms, 20) bounds the latency; an idle node (no record for
    IDLE_AFTER seconds) waits IDLE_WAIT_MS instead: ~10x fewer fetches, and the first record
    after a quiet spell may wait up to that much."""

    # while the gated topics are left out, how often their ends are asked for (a ListOffsets
    # request, no records): a new subscription starts where the log ended at its SUBSCRIBE, as
    # this node knew it (ClusterNode.install), so this bounds how far before it that may be
    SAMPLE_EVERY = 0.1

    def __init__(self, fetcher: Fetcher, loop: asyncio.AbstractEventLoop, apply: Callable[[list], None],
                 name: str = "cluster-reader", lost: Callable[[str], None] | None = None,
                 lost_elsewhere: Callable[[], str | None] | None = None,
                 gated: frozenset = frozenset(), follow: Callable[[], bool] | None = None) -> None:
        """lost(why): called on this thread when Kafka lost data (the fetcher reads every
        partition again from its new start), before the next records are handed over;
        lost_elsewhere(): why Kafka lost data as seen by another client (the offsets the
        producer's records were given went back), or None, asked before each fetch;
        follow(): whether the next fetch includes the topics `gated` (cluster/interest.py),
        asked before each fetch (they keep their positions while left out)."""
        super().__init__(loop, apply, name)
        self.fetcher = fetcher
        self.lost = lost
        self.lost_elsewhere = lost_elsewhere
        self.gated = gated
        self.follow = follow
        self.next_sample = 0.0
        # where the gated partitions ended (as last known) when they were last read: a read of
        # them goes on to there before the node sleeps again. One fetch per SKIM_EVERY does not
        # always reach it: in bench/cluster_faults.py an asleep node fell 150 records (3 s)
        # behind a partition within 10 s, and a session moved to it got again, as new, what its
        # last node had delivered (cluster/rebuild.py now also waits for the reading)
        self.read_to: dict[tuple[str, int], int] = {}

    def behind(self) -> bool:
        """Whether a gated partition has not been read to where it ended when its reading
        began (nor to where it ends now, for a log that went back: Kafka lost data)."""
        f = self.fetcher
        return any(f.positions.get(tp, 0) < min(end, f.high.get(tp, 0))
                   for tp, end in self.read_to.items())

    def run(self) -> None:
        f = self.fetcher
        busy_wait = f.wait_ms
        while not self.stopping:
            idle = time.monotonic() - self.last_records > self.IDLE_AFTER
            f.wait_ms = max(busy_wait, self.IDLE_WAIT_MS) if idle else busy_wait
            why = self.lost_elsewhere() if self.lost_elsewhere is not None else None
            if why is not None:
                f.lost_data(why)
            asleep = self.follow is not None and not self.follow()
            if not asleep:
                self.read_to = {tp: f.high.get(tp, 0) for tp in f.positions if tp[0] in self.gated}
            elif self.behind():
                asleep = False  # (reading on to where the gated partitions ended)
            f.skip = self.gated if asleep else frozenset()
            try:
                batches = f.fetch()
            except Exception as exc:  # Kafka unreachable or restarting: again shortly
                if not self.stopping:
                    log.warning("cluster: reading Kafka failed (%s); retrying", exc)
                    time.sleep(1)
                continue
            if asleep and (batches or time.monotonic() >= self.next_sample):
                # where the logs left out end now (a new subscription starts there), asked
                # before the records just read are applied too: a retained message read here
                # was written with its message record, which is then below that end (so a
                # subscription that gets the retained message is not also given its record)
                self.next_sample = time.monotonic() + self.SAMPLE_EVERY
                try:
                    f.sample_ends(self.gated)
                except Exception as exc:  # (the fetch's records are still handed over)
                    log.warning("cluster: asking Kafka where %s ends failed (%s)",
                                ", ".join(sorted(self.gated)), exc)
            why = f.take_lost()
            if why is not None and self.lost is not None and not self.stopping:
                self.lost(why)
            if not batches or self.stopping:
                continue
            if not self.hand_over(batches):
                return
