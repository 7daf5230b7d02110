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

import hmac
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .headers import (  # noqa: F401
    H_CLIENT_ID,
    H_CONTENT_TYPE,
    H_CORRELATION_DATA,
    H_MESSAGE_EXPIRY,
    H_MESSAGE_ID,
    H_PAYLOAD_FORMAT,
    H_PROTOCOL,
    H_QOS,
    H_RESPONSE_TOPIC,
    H_RETAIN,
    H_SIG,
    H_USER_PREFIX,
    H_USERNAME,
    SIG_LEN,
)

_QOS = (b"0", b"1", b"2")
_RETAIN = (b"0", b"1")
_PROTO = {3: b"3", 4: b"4", 5: b"5"}

Buffer = bytes | bytearray | memoryview
T = TypeVar("T")


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


# MQTT 5 property identifiers (section 2.2.2.2) of the properties a record carries as headers
PAYLOAD_FORMAT, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION_DATA, USER_PROPERTY = 0x01, 0x03, 0x08, 0x09, 0x26


def sink_record(topic: str, payload: bytes, qos: int, retain: bool, client_id: str,
                username: str | None, protocol: int, accepted_at_ms: int,
                props: dict[int, Any] | None, message_expiry: int | None) -> SinkRecord:
    """The record of an accepted MQTT message: `props` its MQTT 5 properties by identifier,
    `message_expiry` the seconds of its Message Expiry Interval left (None: none)."""
    rec = SinkRecord(topic, payload, qos, retain, client_id, username, protocol, accepted_at_ms,
                     message_expiry=message_expiry)
    if props:
        rec.payload_format = props.get(PAYLOAD_FORMAT)
        rec.content_type = props.get(CONTENT_TYPE)
        rec.response_topic = props.get(RESPONSE_TOPIC)
        rec.correlation_data = props.get(CORRELATION_DATA)
        rec.user_properties = props.get(USER_PROPERTY)
    return rec


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


def from_kafka(key: bytes, value: bytes, headers: Iterable[tuple[str, bytes | None]] | None,
               timestamp_ms: int) -> SinkRecord:
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
# Spool entry: what the spool stores per record = the Kafka v2 record body, encoded once in the
# broker (target Kafka topic already resolved by the rules), so the forwarder only wraps bodies
# into a RecordBatch. Little-endian head, then Kafka's own encoding:
#   u8 version(=2) | i64 timestamp_ms | u16 len(kafka_topic) | u32 len(body) | kafka_topic | body
#   body = varint keyLength | key | varint valueLength | value | varint headerCount |
#          headerCount x (varint nameLength | name | varint valueLength | value)
# (varint = Kafka's zigzag varint). A record in a RecordBatch is then
#   varint length | i8 attributes | varlong timestampDelta | varint offsetDelta | body.
# Version 1 entries (fixed-width lengths, written by older brokers) are still read.
# Framing (length + CRC + sequence number) is added by sink/forward/spool.py.
# ---------------------------------------------------------------------------
ENTRY_VERSION = 2
_ENTRY_HEAD = struct.Struct("<BqHI")
_ENTRY_HEAD_V1 = struct.Struct("<BqHIIH")
_HDR_HEAD_V1 = struct.Struct("<HI")


def zz_varint(n: int) -> bytes:
    """Kafka's zigzag varint/varlong of a signed integer."""
    u = (n << 1) ^ (n >> 63)
    u &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while u > 0x7F:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


_VT = tuple(zz_varint(n) for n in range(8192))   # lengths/deltas below 8192: one lookup


def vlen(n: int) -> bytes:
    return _VT[n] if 0 <= n < 8192 else zz_varint(n)


def read_zz_varint(buf: Buffer, o: int) -> tuple[int, int]:
    """-> (value, next offset). Raises ValueError when truncated or too long."""
    u = shift = 0
    n = len(buf)
    while True:
        if o >= n or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[o]
        o += 1
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return (u >> 1) ^ -(u & 1), o
        shift += 7


def _hname(name: str) -> bytes:
    b = name.encode()
    return vlen(len(b)) + b


_HN_MESSAGE_ID, _HN_CLIENT_ID, _HN_USERNAME = _hname(H_MESSAGE_ID), _hname(H_CLIENT_ID), _hname(H_USERNAME)
_HN_PAYLOAD_FORMAT, _HN_CONTENT_TYPE = _hname(H_PAYLOAD_FORMAT), _hname(H_CONTENT_TYPE)
_HN_RESPONSE_TOPIC, _HN_CORRELATION_DATA = _hname(H_RESPONSE_TOPIC), _hname(H_CORRELATION_DATA)
_HN_MESSAGE_EXPIRY = _hname(H_MESSAGE_EXPIRY)
# qos, retain, protocol: the common values as one ready-made run of three headers
_FLAGS = {(q, r, p): b"".join((_hname(H_QOS), vlen(1), _QOS[q], _hname(H_RETAIN), vlen(1), _RETAIN[r],
                               _hname(H_PROTOCOL), vlen(1), _PROTO[p]))
          for q in range(3) for r in range(2) for p in (3, 4, 5)}


def encode_body(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> bytes:
    """The Kafka v2 record fields from keyLength on (see above)."""
    parts = [vlen(len(key)), key, vlen(len(value)), value, vlen(len(headers))]
    for name, val in headers:
        nb = name.encode()
        parts += (vlen(len(nb)), nb, vlen(len(val)), val)
    return b"".join(parts)


def encode_entry(kafka_topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]],
                 timestamp_ms: int) -> bytes:
    kt = kafka_topic.encode()
    body = encode_body(key, value, headers)
    return b"".join((_ENTRY_HEAD.pack(ENTRY_VERSION, timestamp_ms, len(kt), len(body)), kt, body))


def encode_record(rec: SinkRecord, kafka_topic: str) -> bytes:
    """Same bytes as encode_entry(kafka_topic, *to_kafka(rec)), built with less Python work (the
    broker calls this once per accepted message)."""
    extra = None
    if rec.payload_format is not None or rec.content_type is not None or rec.response_topic is not None \
            or rec.correlation_data is not None or rec.message_expiry is not None or rec.user_properties:
        headers = to_kafka(rec)[2]
        extra = headers[6 if rec.username is not None else 5:]
    return encode_message(kafka_topic, rec.topic, rec.payload, rec.qos, rec.retain, rec.client_id, rec.username,
                          rec.protocol, int(rec.accepted_at_ms), rec.message_id or "", extra)


def encode_message(kafka_topic: str, topic: str, payload: Buffer, qos: int, retain: bool, client_id: str,
                   username: str | None, protocol: int, ts_ms: int, message_id: str,
                   extra: list[tuple[str, bytes]] | None = None) -> bytes:
    """The spool entry of one message (headers after mqtt.protocol in `extra`), without building a
    SinkRecord: the broker's common case (no MQTT 5 properties) costs a few list items."""
    body = encode_message_body(topic, payload, qos, retain, client_id, username, protocol,
                               message_id, extra)
    kt = kafka_topic.encode()
    return _ENTRY_HEAD.pack(ENTRY_VERSION, ts_ms, len(kt), len(body)) + kt + body


def encode_message_body(topic: str, payload: Buffer, qos: int, retain: bool, client_id: str,
                        username: str | None, protocol: int, message_id: str,
                        extra: list[tuple[str, bytes]] | None = None) -> bytes:
    """The Kafka record body (encode_body's bytes) of the record contract for one message, the
    headers after mqtt.protocol in `extra`: the same bytes as encode_body(*to_kafka(rec)[:3])
    (tests/unit/test_record_wire.py), with fewer Python steps (the broker's hot paths)."""
    vt = _VT
    key = topic.encode()
    value = payload if type(payload) is bytes else bytes(payload)
    mid = message_id.encode()
    cid = client_id.encode()
    lk, lv, lc = len(key), len(value), len(cid)
    parts = [b"", vt[lk] if lk < 8192 else zz_varint(lk), key, vt[lv] if lv < 8192 else zz_varint(lv), value,
             b"", _HN_MESSAGE_ID, vlen(len(mid)), mid, _HN_CLIENT_ID, vt[lc] if lc < 8192 else zz_varint(lc), cid]
    nh = 5
    if username is not None:
        u = username.encode()
        parts += (_HN_USERNAME, vlen(len(u)), u)
        nh += 1
    f = _FLAGS.get((qos, 1 if retain else 0, protocol))
    if f is None:
        f = b"".join(_hname(n) + vlen(len(v)) + v for n, v in
                     ((H_QOS, str(qos).encode()), (H_RETAIN, _RETAIN[1 if retain else 0]),
                      (H_PROTOCOL, _PROTO.get(protocol) or str(protocol).encode())))
    parts.append(f)
    if extra:
        nh += len(extra)
        for name, val in extra:
            nb = name.encode()
            parts += (vlen(len(nb)), nb, vlen(len(val)), val)
    parts[5] = vlen(nh)
    return b"".join(parts)


class MessageEncoder:
    """encode_message() for the broker's hot path, with what repeats from message to message
    cached: per MQTT topic its key field, per Kafka topic its name, per sender (client id, user
    name) its header run. The same bytes as encode_message() (a hypothesis test checks); each
    cache holds at most `max_entries` (then it starts over), so no client can grow it."""
    __slots__ = ("max_entries", "_keys", "_senders", "_kts")

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._keys: dict[str, bytes] = {}
        self._senders: dict[tuple, tuple[bytes, bytes]] = {}
        self._kts: dict[str, bytes] = {}

    def _cache(self, d: dict[Any, Any], k: Any, v: T) -> T:
        if len(d) >= self.max_entries:
            d.clear()
        d[k] = v
        return v

    def encode(self, kafka_topic: str, topic: str, payload: Buffer, qos: int, retain: bool, client_id: str,
               username: str | None, protocol: int, ts_ms: int, message_id: bytes) -> bytes:
        f = _FLAGS.get((qos, 1 if retain else 0, protocol))
        if f is None:  # values outside the contract's common ones
            return encode_message(kafka_topic, topic, payload, qos, retain, client_id, username,
                                  protocol, ts_ms, message_id.decode())
        key = self._keys.get(topic)
        if key is None:
            k = topic.encode()
            key = self._cache(self._keys, topic, vlen(len(k)) + k)
        sender = self._senders.get((client_id, username))
        if sender is None:  # (header count: id, sender, 3 flags; the sender's headers)
            c = client_id.encode()
            run = _HN_CLIENT_ID + vlen(len(c)) + c
            if username is not None:
                u = username.encode()
                run += _HN_USERNAME + vlen(len(u)) + u
            sender = self._cache(self._senders, (client_id, username),
                                 (_VT[5 if username is None else 6], run))
        kt = self._kts.get(kafka_topic)
        if kt is None:
            kt = self._cache(self._kts, kafka_topic, kafka_topic.encode())
        value = payload if type(payload) is bytes else bytes(payload)
        lv = len(value)
        body = b"".join((key, _VT[lv] if lv < 8192 else zz_varint(lv), value, sender[0],
                         _HN_MESSAGE_ID, vlen(len(message_id)), message_id, sender[1], f))
        return _ENTRY_HEAD.pack(ENTRY_VERSION, ts_ms, len(kt), len(body)) + kt + body


_SIG_HEAD = _hname(H_SIG) + vlen(SIG_LEN)
_SIG_PREFIX = struct.Struct(">H")
_SIG_TS = struct.Struct(">q")


def sign_body(body: Buffer, kafka_topic: bytes, ts_ms: int, keyed: hmac.HMAC, kid: bytes) -> bytes:
    """The record body with the broker's signature as one more, last, header (kafka_client/headers.py
    H_SIG): two varints and a header count read, one HMAC from ``keyed``
    (kafka_client.headers.signature_mac of the records key); runs in the forwarder."""
    b = body[0]                            # one-byte varints (lengths < 64): no call
    kl, o = ((b >> 1) ^ -(b & 1), 1) if b < 0x80 else read_zz_varint(body, 0)
    o += max(kl, 0)
    b = body[o]
    vl, o = ((b >> 1) ^ -(b & 1), o + 1) if b < 0x80 else read_zz_varint(body, o)
    o += max(vl, 0)
    b = body[o]
    nh, after = ((b >> 1) ^ -(b & 1), o + 1) if b < 0x80 else read_zz_varint(body, o)
    signed = b"".join((body[:o], vlen(nh + 1), body[after:]))
    h = keyed.copy()
    h.update(b"".join((_SIG_PREFIX.pack(len(kafka_topic)), kafka_topic, _SIG_TS.pack(ts_ms), signed)))
    mac = h.digest()
    return b"".join((signed, _SIG_HEAD, kid, mac[:SIG_LEN - len(kid)]))


UNSIGNED, OTHER_KEY, FORGED = "unsigned", "other_key", "forged"


def signature_verdict(body: Buffer, kafka_topic: bytes, ts_ms: int, keyed: hmac.HMAC,
                      kid: bytes) -> str | None:
    """The check of sign_body's signature on a record body as read back (from its keyLength
    varint to its end): None when valid, else UNSIGNED (no signature header last), OTHER_KEY
    (signed with a key whose id is not ``kid``) or FORGED (the HMAC does not match)."""
    n = len(body) - SIG_LEN
    if n < len(_SIG_HEAD) or body[n - len(_SIG_HEAD):n] != _SIG_HEAD:
        return UNSIGNED
    klen = len(kid)
    if body[n:n + klen] != kid:
        return OTHER_KEY
    h = keyed.copy()
    h.update(b"".join((_SIG_PREFIX.pack(len(kafka_topic)), kafka_topic, _SIG_TS.pack(ts_ms),
                       body[:n - len(_SIG_HEAD)])))
    if not hmac.compare_digest(h.digest()[:SIG_LEN - klen], bytes(body[n + klen:])):
        return FORGED
    return None


def entry_fields(buf: bytes) -> tuple[bytes, int, bytes]:
    """entry_parts() for the forwarder's loop: (kafka topic as UTF-8 bytes, timestamp, body),
    slicing the bytes it was given. Raises ValueError if malformed."""
    if buf[:1] != b"\x02":
        kt, ts, body = entry_parts(buf)
        return kt.encode(), ts, bytes(body)
    try:
        _, ts, ktl, bl = _ENTRY_HEAD.unpack_from(buf, 0)
    except struct.error as exc:
        raise ValueError(f"short spool entry: {exc}") from None
    o = 15 + ktl                           # _ENTRY_HEAD.size == 15
    if o + bl != len(buf):
        raise ValueError("truncated spool entry")
    return buf[15:o], ts, buf[o:]


def entry_parts(buf: Buffer) -> tuple[str, int, memoryview]:
    """-> (kafka_topic, timestamp_ms, body) of a version 2 entry, without decoding the body;
    a version 1 entry is re-encoded. Raises ValueError if malformed."""
    mv = memoryview(buf)
    if len(mv) and mv[0] == 1:
        kt, key, value, headers, ts = decode_entry(mv)
        return kt, ts, memoryview(encode_body(key, value, headers))
    try:
        ver, ts, ktl, bl = _ENTRY_HEAD.unpack_from(mv, 0)
    except struct.error as exc:
        raise ValueError(f"short spool entry: {exc}") from None
    if ver != ENTRY_VERSION:
        raise ValueError(f"unknown spool entry version {ver}")
    o = _ENTRY_HEAD.size
    if o + ktl + bl != len(mv):
        raise ValueError("truncated spool entry")
    return str(mv[o:o + ktl], "utf-8"), ts, mv[o + ktl:]


def body_key(body: Buffer) -> bytes:
    """The key (MQTT topic) of a record body."""
    kl, o = read_zz_varint(body, 0)
    if kl < 0 or o + kl > len(body):
        raise ValueError("bad key length in spool entry")
    return bytes(body[o:o + kl])


def decode_body(body: Buffer) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """-> (key, value, headers) of a record body. Raises ValueError if malformed."""
    mv = memoryview(body)
    n = len(mv)

    def field(o: int) -> tuple[bytes, int]:
        ln, o = read_zz_varint(mv, o)
        if ln < -1 or o + max(ln, 0) > n:
            raise ValueError("truncated spool entry")
        return (b"" if ln < 0 else bytes(mv[o:o + ln])), o + max(ln, 0)

    key, o = field(0)
    value, o = field(o)
    nh, o = read_zz_varint(mv, o)
    if nh < 0:
        raise ValueError("bad header count in spool entry")
    headers = []
    for _ in range(nh):
        name, o = field(o)
        val, o = field(o)
        headers.append((name.decode(), val))
    if o != n:
        raise ValueError("trailing bytes in spool entry")
    return key, value, headers


def decode_entry(buf: Buffer) -> tuple[str, bytes, bytes, list[tuple[str, bytes]], int]:
    """-> (kafka_topic, key, value, headers, timestamp_ms). Raises ValueError if malformed."""
    mv = memoryview(buf)
    if len(mv) and mv[0] == 1:
        return _decode_entry_v1(mv)
    kt, ts, body = entry_parts(mv)
    try:
        key, value, headers = decode_body(body)
    except UnicodeDecodeError as exc:
        raise ValueError(f"bad header name in spool entry: {exc}") from None
    return kt, key, value, headers, ts


def _decode_entry_v1(mv: memoryview) -> tuple[str, bytes, bytes, list[tuple[str, bytes]], int]:
    try:
        ver, ts, ktl, kl, vl, nh = _ENTRY_HEAD_V1.unpack_from(mv, 0)
    except struct.error as exc:
        raise ValueError(f"short spool entry: {exc}") from None
    o = _ENTRY_HEAD_V1.size
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
    unpack = _HDR_HEAD_V1.unpack_from
    for _ in range(nh):
        try:
            nl, hv = unpack(mv, o)
        except struct.error:
            raise ValueError("truncated spool entry header") from None
        o += _HDR_HEAD_V1.size
        if o + nl + hv > len(mv):
            raise ValueError("truncated spool entry header")
        headers.append((str(mv[o:o + nl], "utf-8"), bytes(mv[o + nl:o + nl + hv])))
        o += nl + hv
    return kt, key, value, headers, ts


def entry_timestamp(buf: Buffer) -> int:
    """Timestamp of an encoded entry (either version) without decoding the rest."""
    return _ENTRY_HEAD.unpack_from(buf, 0)[1]


def entry_shard(buf: Buffer, shards: int) -> int:
    """Which of `shards` forwarders sends this entry: crc32 of its key (the MQTT topic), read
    without decoding the rest, so every record of a topic goes through the same forwarder."""
    if buf[0] == 1:
        _, ts, ktl, kl, _, _ = _ENTRY_HEAD_V1.unpack_from(buf, 0)
        o = _ENTRY_HEAD_V1.size + ktl
        return zlib.crc32(bytes(buf[o:o + kl])) % shards
    return zlib.crc32(body_key(entry_parts(buf)[2])) % shards


# ---------------------------------------------------------------------------
# Kafka v2 RecordBatch (magic 2) from record bodies: the forwarder's only per-record work is
# two small varints. CRC32C (Castagnoli, in C) over attributes..end.
# ---------------------------------------------------------------------------
_BATCH_HEAD = struct.Struct(">qiiBI")          # baseOffset, batchLength, leaderEpoch, magic, crc
_BATCH_REST = struct.Struct(">hiqqqhii")       # attributes .. recordCount
_NO_COMPRESSION = b"\x00"


def build_batch(records: Sequence[tuple[int, Buffer]]) -> bytes:
    """records: non-empty sequence of (timestamp_ms, body). -> one uncompressed RecordBatch."""
    from crc32c import crc32c
    base_ts = records[0][0]
    max_ts = base_ts
    parts: list[Buffer] = [b""]
    append = parts.append
    vt = _VT
    for i, (ts, body) in enumerate(records):
        d = ts - base_ts
        tsd = vt[d] if 0 <= d < 8192 else zz_varint(d)
        if ts > max_ts:
            max_ts = ts
        od = vt[i] if i < 8192 else zz_varint(i)
        ln = 1 + len(tsd) + len(od) + len(body)
        append(vt[ln] if ln < 8192 else zz_varint(ln))
        append(_NO_COMPRESSION)
        append(tsd)
        append(od)
        append(body)
    n = len(records)
    parts[0] = _BATCH_REST.pack(0, n - 1, base_ts, max_ts, -1, -1, -1, n)
    rest = b"".join(parts)
    return _BATCH_HEAD.pack(0, len(rest) + 9, -1, 2, crc32c(rest)) + rest
