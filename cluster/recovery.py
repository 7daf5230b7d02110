"""What a cluster node does when Kafka lost its data (an in-memory Kafka restarted empty, a Kafka
replaced or its topics recreated; kafka_client/fetch.py sees it): its topics created again
(topics_again, on the reader's thread), then, on the loop (cluster/node.py ClusterNode._recover,
which tells each part of the node), what the new logs need from it written again: the messages
it wrote that not every node had read (resend_kept, cluster/keep.py) and, by one live node, the
retained messages (rewrite_retained) and the bans.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from . import records as R
from .keep import BODY, TS, with_again
from .link import Topics, ensure_topics

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from settings import ClusterConfig

    from .keep import Keep
    from .produce import Producer

log = logging.getLogger(__name__)


def topics_again(bootstrap: str, topics: Topics, cfg: ClusterConfig, partitions: int,
                 positions: Callable[[], dict], stopping: Callable[[], bool]) -> int:
    """On the reader's thread: the cluster's topics created again if missing (retried until
    done or the node stops); the messages topic's partition count, the fetcher's `positions()`
    (the thread's own) following a new count. Returns the count."""
    was = partitions
    while not stopping():
        try:
            partitions = ensure_topics(bootstrap, topics, cfg.partitions, cfg.replication_factor,
                                       cfg.kafka)[topics.messages]
            break
        except Exception as exc:  # kafka-python's errors are not OSError / RuntimeError
            log.warning("cluster: could not create the topics again in Kafka at %s (%s); "
                        "retrying", bootstrap, exc)
            time.sleep(1)
    if partitions != was:
        # the messages topic was created again with another partition count (by a write
        # before ensure_topics): every partition it has is read (per-topic order holds)
        log.warning("cluster: the messages topic %s now has %d partitions (was %d)",
                    topics.messages, partitions, was)
        at = positions()
        for p in range(max(partitions, was)):
            if p < partitions:
                at.setdefault((topics.messages, p), 0)
            else:
                at.pop((topics.messages, p), None)
    return partitions


def resend_kept(keep: Keep, producer: Producer, messages: str) -> int:
    """Every message kept that Kafka had acknowledged (in the lost log) is written again, before
    anything else this node writes, the records on their way included (they come after: newer).
    Returns how many."""
    again = keep.again()
    producer.send_again(messages, [(with_again(c[BODY]), c[TS], c) for _, c in again])
    return len(again)


def rewrite_retained(broker: HookHost, producer: Producer, topic: str, batch: Any, node: str,
                     inc: str, next_id: Callable[[], int]) -> int:
    """The retained messages of this node's store, written to the new retained topic (in
    `batch`); $SYS and the like are each node's own. Returns how many."""
    rewritten, now = 0, broker.clock()
    for msg in broker.every_retained():
        if msg.topic.startswith("$") or (
                msg.expires_at is not None and msg.expires_at <= now):
            continue
        body = R.message_body(msg, msg.sender or "", None, 5, node,
                              f"{node}-{inc}-{next_id()}", now)
        batch.count += 1
        producer.send_body(topic, body, int(msg.accepted_at * 1000), batch)
        rewritten += 1
    return rewritten
