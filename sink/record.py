"""The record the broker hands to the sink, and its Kafka / spool encodings.

Kafka record contract (keep stable, Spark reads it; see README "Analytics sink"):

* topic: ``mqtt.messages`` unless mapped by ``[sink] rules``
* key: MQTT topic name (UTF-8)
* value: MQTT payload bytes, unchanged
* timestamp: broker accept time (ms since epoch)
* headers, in this order (values UTF-8 text unless noted):
  ``mqtt.message_id``, ``mqtt.client_id``, ``mqtt.username`` (absent if none),
  ``mqtt.qos``, ``mqtt.retain`` (``0``/``1``), ``mqtt.protocol`` (``3``/``4``/``5``),
  then when present ``mqtt.payload_format``, ``mqtt.content_type``,
  ``mqtt.response_topic``, ``mqtt.correlation_data`` (raw bytes),
  ``mqtt.message_expiry`` (seconds), and one ``mqtt.user.<name>`` header per
  MQTT 5 User Property, in order (repeats allowed).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

H_MESSAGE_ID = "mqtt.message_id"
H_CLIENT_ID = "mqtt.client_id"
H_USERNAME = "mqtt.username"
H_QOS = "mqtt.qos"
H_RETAIN = "mqtt.retain"
H_PROTOCOL = "mqtt.protocol"
H_PAYLOAD_FORMAT = "mqtt.payload_format"
H_CONTENT_TYPE = "mqtt.content_type"
H_RESPONSE_TOPIC = "mqtt.response_topic"
H_CORRELATION_DATA = "mqtt.correlation_data"
H_MESSAGE_EXPIRY = "mqtt.message_expiry"
H_USER_PREFIX = "mqtt.user."

_QOS = (b"0", b"1", b"2")
_RETAIN = (b"0", b"1")
_PROTO = {3: b"3", 4: b"4", 5: b"5"}


@dataclass(slots=True)
class SinkRecord:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    client_id: str
    username: str | None
    protocol: int            # 3, 4 or 5
    accepted_at_ms: int
    payload_format: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    message_expiry: int | None = None
    user_properties: list[tuple[str, str]] | None = None
    message_id: str | None = None     # assigned by Sink.submit when None: unique, stable across retries


def to_kafka(rec: SinkRecord) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
    """-> (key, value, headers, timestamp_ms) following the record contract."""
    headers: list[tuple[str, bytes]] = [
        (H_MESSAGE_ID, (rec.message_id or "").encode()),
        (H_CLIENT_ID, rec.client_id.encode()),
    ]
    if rec.username is not None:
        headers.append((H_USERNAME, rec.username.encode()))
    headers.append((H_QOS, _QOS[rec.qos] if 0 <= rec.qos <= 2 else str(rec.qos).encode()))
    headers.append((H_RETAIN, _RETAIN[1 if rec.retain else 0]))
    headers.append((H_PROTOCOL, _PROTO.get(rec.protocol) or str(rec.protocol).encode()))
    if rec.payload_format is not None:
        headers.append((H_PAYLOAD_FORMAT, str(rec.payload_format).encode()))
    if rec.content_type is not None:
        headers.append((H_CONTENT_TYPE, rec.content_type.encode()))
    if rec.response_topic is not None:
        headers.append((H_RESPONSE_TOPIC, rec.response_topic.encode()))
    if rec.correlation_data is not None:
        headers.append((H_CORRELATION_DATA, bytes(rec.correlation_data)))
    if rec.message_expiry is not None:
        headers.append((H_MESSAGE_EXPIRY, str(rec.message_expiry).encode()))
    if rec.user_properties:
        for name, value in rec.user_properties:
            headers.append((H_USER_PREFIX + name, value.encode()))
    return rec.topic.encode(), bytes(rec.payload), headers, int(rec.accepted_at_ms)


def from_kafka(key: bytes, value: bytes, headers, timestamp_ms: int) -> SinkRecord:
    """Inverse of :func:`to_kafka` (headers: iterable of (name, bytes))."""
    rec = SinkRecord(topic=(key or b"").decode(), payload=bytes(value or b""), qos=0, retain=False,
                     client_id="", username=None, protocol=0, accepted_at_ms=int(timestamp_ms))
    ups: list[tuple[str, str]] = []
    for name, val in headers or ():
        val = val if val is not None else b""
        if name.startswith(H_USER_PREFIX):
            ups.append((name[len(H_USER_PREFIX):], val.decode()))
        elif name == H_MESSAGE_ID:
            rec.message_id = val.decode()
        elif name == H_CLIENT_ID:
            rec.client_id = val.decode()
        elif name == H_USERNAME:
            rec.username = val.decode()
        elif name == H_QOS:
            rec.qos = int(val)
        elif name == H_RETAIN:
            rec.retain = val == b"1"
        elif name == H_PROTOCOL:
            rec.protocol = int(val)
        elif name == H_PAYLOAD_FORMAT:
            rec.payload_format = int(val)
        elif name == H_CONTENT_TYPE:
            rec.content_type = val.decode()
        elif name == H_RESPONSE_TOPIC:
            rec.response_topic = val.decode()
        elif name == H_CORRELATION_DATA:
            rec.correlation_data = bytes(val)
        elif name == H_MESSAGE_EXPIRY:
            rec.message_expiry = int(val)
    if ups:
        rec.user_properties = ups
    return rec


# ---------------------------------------------------------------------------
# Spool entry: what the spool stores per record = the ready-to-send Kafka record
# (target Kafka topic already resolved by the rules). Little-endian:
#   u8 version(=1) | i64 timestamp_ms | u16 len(kafka_topic) | u32 len(key) |
#   u32 len(value) | u16 n_headers | kafka_topic | key | value |
#   n_headers x (u16 len(name) | u32 len(value) | name | value)
# Framing (length + CRC + sequence number) is added by sink/spool.py.
# ---------------------------------------------------------------------------
ENTRY_VERSION = 1
_ENTRY_HEAD = struct.Struct("<BqHIIH")
_HDR_HEAD = struct.Struct("<HI")


def encode_entry(kafka_topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]],
                 timestamp_ms: int) -> bytes:
    kt = kafka_topic.encode()
    parts = [b"", kt, key, value]
    pack = _HDR_HEAD.pack
    for name, val in headers:
        nb = name.encode()
        parts.append(pack(len(nb), len(val)))
        parts.append(nb)
        parts.append(val)
    parts[0] = _ENTRY_HEAD.pack(ENTRY_VERSION, timestamp_ms, len(kt), len(key), len(value), len(headers))
    return b"".join(parts)


def decode_entry(buf) -> tuple[str, bytes, bytes, list[tuple[str, bytes]], int]:
    """-> (kafka_topic, key, value, headers, timestamp_ms). Raises ValueError if malformed."""
    mv = memoryview(buf)
    try:
        ver, ts, ktl, kl, vl, nh = _ENTRY_HEAD.unpack_from(mv, 0)
    except struct.error as exc:
        raise ValueError(f"short spool entry: {exc}") from None
    if ver != ENTRY_VERSION:
        raise ValueError(f"unknown spool entry version {ver}")
    o = _ENTRY_HEAD.size
    end = o + ktl + kl + vl
    if end > len(mv):
        raise ValueError("truncated spool entry")
    kt = str(mv[o:o + ktl], "utf-8")
    o += ktl
    key = bytes(mv[o:o + kl])
    o += kl
    value = bytes(mv[o:o + vl])
    o += vl
    headers = []
    unpack = _HDR_HEAD.unpack_from
    for _ in range(nh):
        try:
            nl, hv = unpack(mv, o)
        except struct.error:
            raise ValueError("truncated spool entry header") from None
        o += _HDR_HEAD.size
        if o + nl + hv > len(mv):
            raise ValueError("truncated spool entry header")
        headers.append((str(mv[o:o + nl], "utf-8"), bytes(mv[o + nl:o + nl + hv])))
        o += nl + hv
    return kt, key, value, headers, ts


def entry_timestamp(buf) -> int:
    """Timestamp of an encoded entry without decoding the rest."""
    return _ENTRY_HEAD.unpack_from(buf, 0)[1]


def entry_shard(buf, shards: int) -> int:
    """Which of `shards` forwarders sends this entry: crc32 of its key (the MQTT topic), read
    without decoding the rest, so every record of a topic goes through the same forwarder."""
    _, ts, ktl, kl, _, _ = _ENTRY_HEAD.unpack_from(buf, 0)
    o = _ENTRY_HEAD.size + ktl
    return zlib.crc32(bytes(buf[o:o + kl])) % shards


def encode_record(rec: SinkRecord, kafka_topic: str) -> bytes:
    key, value, headers, ts = to_kafka(rec)
    return encode_entry(kafka_topic, key, value, headers, ts)
