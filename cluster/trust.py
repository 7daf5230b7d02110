"""Which Kafka records are the cluster's own: every record a node writes (messages, retained
messages, control records) is signed with the cluster's key, as the sink's forwarder signs its
records (kafka_client/headers.py H_SIG, kafka_client/record.py sign_body): a last header
``mqtt.sig`` = key id + HMAC-SHA256 over the Kafka topic, the timestamp and the record, keyed by
settings.secrets.derive(cluster key, CLUSTER_RECORDS). A node reading a record without a valid
signature (written by another producer, signed with another cluster's key, or altered) ignores
it and counts it, and so does a record whose content is malformed (cluster/records.py): a
process that can reach Kafka but has no key cannot publish past the ACL, take a client id or
declare a node gone.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from kafka_client.headers import signature_mac
from kafka_client.record import FORGED, OTHER_KEY, UNSIGNED, sign_body, signature_verdict, vlen
from settings import secrets

log = logging.getLogger(__name__)

MALFORMED = "malformed"
REPLAYED = "replayed"
REASONS = (UNSIGNED, OTHER_KEY, FORGED, MALFORMED, REPLAYED)
_WHY = {UNSIGNED: "without a signature (written by another producer than a cluster node)",
        OTHER_KEY: "signed with another cluster key (every node needs the same "
                   "cluster.key_file or $MQTT_CLUSTER_KEY)",
        FORGED: "with a signature that does not match (altered or forged)",
        MALFORMED: "malformed (not a record a cluster node writes)",
        REPLAYED: "written again (a signed record copied, or a retried write)"}
LOG_EVERY = 10.0  # seconds between two log lines about ignored records


class Trust:
    """Signs what this node writes and checks what it reads; counts what it ignores."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.monotonic) -> None:
        self.keyed = signature_mac(secrets.derive(key, secrets.CLUSTER_RECORDS))
        self.kid = secrets.key_id(key)
        self.clock = clock
        self.ignored = dict.fromkeys(REASONS, 0)
        self._unlogged = dict.fromkeys(REASONS, 0)
        self._first: dict[str, str] = {}
        self._logged_at: float | None = None
        self._topics: dict[str, bytes] = {}

    def _tb(self, topic: str) -> bytes:
        tb = self._topics.get(topic)
        if tb is None:
            tb = self._topics[topic] = topic.encode()
        return tb

    def sign(self, topic: str, body: bytes, ts_ms: int) -> bytes:
        """A record body (kafka_client.record.encode_body) with the cluster's signature."""
        return sign_body(body, self._tb(topic), ts_ms, self.keyed, self.kid)

    def check(self, topic: str, body: bytes | memoryview, ts_ms: int) -> str | None:
        """None when the record body (from its keyLength varint) is signed with the cluster's
        key, else why not (UNSIGNED, OTHER_KEY, FORGED)."""
        return signature_verdict(body, self._tb(topic), ts_ms, self.keyed, self.kid)

    def check_fields(self, topic: str, key: bytes | None, value: bytes | None,
                     headers: list, ts_ms: int) -> str | None:
        """check() of a record decoded by another client (kafka-python's ConsumerRecord)."""
        return self.check(topic, body_of(key, value, headers), ts_ms)

    def ignore(self, reason: str, where: str, detail: str = "") -> None:
        """Count an ignored record; a log line at most every LOG_EVERY seconds says how many
        were ignored since the last one, and why."""
        self.ignored[reason] += 1
        self._unlogged[reason] += 1
        self._first.setdefault(reason, f"{where}{': ' + detail[:200] if detail else ''}")
        now = self.clock()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY:
            return
        self._logged_at = now
        parts = [f"{n} {_WHY[r]} (first: {self._first[r]})"
                 for r, n in self._unlogged.items() if n]
        log.warning("cluster: ignored Kafka records: %s", "; ".join(parts))
        self._unlogged = dict.fromkeys(REASONS, 0)
        self._first.clear()


def body_of(key: bytes | None, value: bytes | None, headers: list) -> bytes:
    """The Kafka v2 record body (from keyLength on) of decoded fields: the bytes the writer
    signed when it encoded them (kafka_client.record.encode_body writes the shortest varints)."""
    parts = [vlen(-1) if key is None else vlen(len(key)) + key,
             vlen(-1) if value is None else vlen(len(value)) + value, vlen(len(headers))]
    for name, val in headers:
        nb = name.encode()
        parts.append(vlen(len(nb)) + nb)
        parts.append(vlen(-1) if val is None else vlen(len(val)) + val)
    return b"".join(parts)
