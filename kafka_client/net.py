"""What the project sets on kafka-python's network client beyond its constructor's options."""
from __future__ import annotations

from typing import Any


def no_topic_creation(client: Any) -> None:
    """The metadata requests of `client` (a kafka.net.compat.KafkaNetClient) ask Kafka not to
    create a missing topic. A broker that auto-creates topics (Tansu always does) would otherwise
    make one it was asked about with its own default partition count: the cluster's messages
    topic, asked about by a node's producer or reader right after an in-memory Kafka restarted
    empty, came back with 4 partitions instead of cluster.partitions, so a topic's records moved
    to another partition and the copies written again were taken for new messages (cluster/copies.py
    counts per partition). The cluster creates its topics itself (cluster/link.py ensure_topics).
    kafka-python's client builds its ClusterMetadata without passing this option through, so it
    is set on the instance; ClusterMetadata reads it for every request it builds."""
    client.cluster.config["allow_auto_create_topics"] = False
