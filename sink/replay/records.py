"""A replayed message as the worker streams it to the broker (sink/replay/worker.py -> feed.py),
made from a history row or a Kafka record, and the frames that carry them.

    (message id bytes, topic, payload, qos, retain, accepted at ms, properties or None,
     message expiry s or None, publisher's client id)

The properties are the PUBLISH's own (Payload Format Indicator, Content Type, Response Topic,
Correlation Data, User Properties in order), then the replay's marker: two User Properties,
``replay`` (the time the broker accepted the message, ISO 8601 UTC with milliseconds) and
``replay-id`` (its ``mqtt.message_id``). Markers between them are tuples starting with their
kind (a str): ``("table", n)``, ``("head",)``, ``("synced", n)``, ``("error", text)``.

A frame: 4 bytes big-endian length, then a pickled list of items (between the broker and its
own child process only).
"""
from __future__ import annotations

import datetime as dt
import pickle
import struct
from typing import Any, Iterable

from broker.protocol import properties as PR
from kafka_client.record import from_kafka

MARKER = "replay"
MARKER_ID = "replay-id"
FRAME_HEAD = struct.Struct(">I")
FRAME_ITEMS = 256             # items per frame at most...
FRAME_BYTES = 256 << 10       # ...and about this many payload bytes
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def iso_ms(ms: int) -> str:
    return (_EPOCH + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def make(mid: str, topic: str, payload: bytes, qos: int, retain: bool, at_ms: int,
         client_id: str, payload_format: int | None = None, content_type: str | None = None,
         response_topic: str | None = None, correlation_data: bytes | None = None,
         message_expiry: int | None = None, user_properties: Iterable[tuple[str, str]] | None = None) -> tuple:
    props: dict[int, Any] = {}
    if payload_format is not None:
        props[PR.PAYLOAD_FORMAT_INDICATOR] = int(payload_format)
    if content_type is not None:
        props[PR.CONTENT_TYPE] = content_type
    if response_topic is not None:
        props[PR.RESPONSE_TOPIC] = response_topic
    if correlation_data is not None:
        props[PR.CORRELATION_DATA] = bytes(correlation_data)
    props[PR.USER_PROPERTY] = [*(user_properties or ()), (MARKER, iso_ms(at_ms)), (MARKER_ID, mid)]
    return (mid.encode(), topic, bytes(payload or b""), int(qos), bool(retain), int(at_ms), props,
            None if message_expiry is None else int(message_expiry), client_id or "")


def from_kafka_record(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None,
                      ts_ms: int) -> tuple | None:
    """A Kafka record of the sink (the record contract, kafka_client/record.py); None without a
    message id (not written by the broker's sink)."""
    r = from_kafka(key or b"", value or b"", headers, ts_ms)
    if not r.message_id:
        return None
    return make(r.message_id, r.topic, r.payload, r.qos, r.retain, r.accepted_at_ms, r.client_id,
                r.payload_format, r.content_type, r.response_topic, r.correlation_data,
                r.message_expiry, r.user_properties)


TABLE_COLUMNS = ["message_id", "topic", "payload", "qos", "retain", "client_id", "accepted_at",
                 "payload_format", "content_type", "response_topic", "correlation_data",
                 "message_expiry", "user_properties"]


def from_rows(batch: Any) -> list:  # a pyarrow RecordBatch
    """The rows of a pyarrow RecordBatch of the history table (TABLE_COLUMNS)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    cols = {name: batch.column(name) for name in TABLE_COLUMNS}
    at = cols["accepted_at"]
    unit = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[at.type.unit]
    at_ms = pc.cast(at, pa.int64()).to_pylist()
    data = {k: v.to_pylist() for k, v in cols.items() if k != "accepted_at"}
    out = []
    for i in range(batch.num_rows):
        ups = data["user_properties"][i]
        out.append(make(data["message_id"][i], data["topic"][i], data["payload"][i],
                        data["qos"][i] or 0, data["retain"][i], round(at_ms[i] * unit),
                        data["client_id"][i], data["payload_format"][i], data["content_type"][i],
                        data["response_topic"][i], data["correlation_data"][i],
                        data["message_expiry"][i],
                        [(u["key"], u["value"]) for u in ups] if ups else None))
    return out


def frame(items: list) -> bytes:
    body = pickle.dumps(items, protocol=5)
    return FRAME_HEAD.pack(len(body)) + body


def item_size(item: tuple) -> int:
    """About what an item costs in a frame."""
    return len(item[2]) + len(item[1]) + 64 if item[0].__class__ is bytes else 16
