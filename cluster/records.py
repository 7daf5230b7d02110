"""What the cluster writes to Kafka, and reads back.

* messages topic: one record per accepted message, in the analytics sink's record contract
  (README "Kafka record schema": key = MQTT topic, value = payload, timestamp = accept time,
  `mqtt.*` headers with the publisher and every MQTT 5 property), plus `mqtt.node` (the node that
  accepted it). The receiving node counts a Message Expiry Interval from the first acceptance.
* retained topic: the same record per retained message, keyed by MQTT topic; a null value
  deletes it (a tombstone: a compacting Kafka keeps only the last record per topic).
* control topic: JSON objects (cluster/control.py).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from broker.protocol.packets import Will

from broker.core.message import Message
from broker.protocol import properties as PR
from kafka_client.headers import (
    H_CLIENT_ID,
    H_CONTENT_TYPE,
    H_CORRELATION_DATA,
    H_MESSAGE_EXPIRY,
    H_PAYLOAD_FORMAT,
    H_QOS,
    H_RESPONSE_TOPIC,
    H_RETAIN,
    H_USER_PREFIX,
)
from kafka_client.record import encode_message_body, sink_record, to_kafka

H_NODE = "mqtt.node"


def message_body(msg: Message, client_id: str, username: str | None, protocol: int, node: str,
                 message_id: str, now: float) -> bytes:
    """The Kafka record body (key, value, headers) of an accepted message; `now` is the broker's
    clock (Message.expires_at is on it). The record's timestamp is msg.accepted_at."""
    extra = None
    p = msg.props
    if p or msg.expires_at is not None:  # the contract's property headers, in its order
        # seconds left now, at its acceptance (the record's timestamp): receivers count from there
        rec = sink_record(msg.topic, b"", msg.qos, msg.retain, client_id, username, protocol, 0, p,
                          None if msg.expires_at is None else msg.remaining_expiry(now))
        extra = to_kafka(rec)[2][6 if username is not None else 5:]
        extra.append((H_NODE, node.encode()))
    else:
        extra = [(H_NODE, node.encode())]
    return encode_message_body(msg.topic, msg.payload, msg.qos, msg.retain, client_id, username,
                               protocol, message_id, extra)


_FLAG = {b"0": 0, b"1": 1, b"2": 2}


def decode_message(key: bytes, value: bytes | None, headers: Iterable[tuple[str, bytes]], timestamp_ms: int,
                   clock_now: float,
                   wall_now: float) -> tuple[Message, str, str]:
    """(Message, publisher client id, accepting node) of a messages-topic record: the inverse
    of message_body, reading each header once (a node decodes every message it delivers)."""
    node = client_id = ""
    qos, retain, expiry = 0, False, None
    props: dict = {}
    ups = None
    for name, val in headers:
        if name.startswith(H_USER_PREFIX):
            if ups is None:
                ups = props[PR.USER_PROPERTY] = []
            ups.append((name[len(H_USER_PREFIX):], (val or b"").decode()))
        elif name == H_CLIENT_ID:
            client_id = (val or b"").decode()
        elif name == H_QOS:
            qos = _FLAG.get(val, 0)
        elif name == H_RETAIN:
            retain = val == b"1"
        elif name == H_NODE:
            node = (val or b"").decode()
        elif name == H_MESSAGE_EXPIRY:
            expiry = int(val)
        elif name == H_PAYLOAD_FORMAT:
            props[PR.PAYLOAD_FORMAT_INDICATOR] = int(val)
        elif name == H_CONTENT_TYPE:
            props[PR.CONTENT_TYPE] = (val or b"").decode()
        elif name == H_RESPONSE_TOPIC:
            props[PR.RESPONSE_TOPIC] = (val or b"").decode()
        elif name == H_CORRELATION_DATA:
            props[PR.CORRELATION_DATA] = bytes(val or b"")
    expires_at = None
    accepted_at = timestamp_ms / 1000.0
    if expiry is not None:
        # [MQTT-3.3.2-6] counted from the first acceptance, on any node
        expires_at = clock_now + expiry - max(0.0, wall_now - accepted_at)
    msg = Message((key or b"").decode(), value or b"", qos, retain, props or None, expires_at,
                  client_id, accepted_at)
    return msg, client_id, node


# A JSON object as decoded (a will in a control record): its optional fields are read with .get()
JsonObject = Any


def dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def loads(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    return json.loads(raw)


# ------------------------------------------------------------------ wills in control records
def will_to_dict(will: Will | None, now_wall: float) -> dict | None:
    """A CONNECT's Will (protocol packets.Will) as JSON: topic, payload (latin-1 text),
    qos, retain, properties we carry (delay, expiry, the forwarded ones)."""
    if will is None:
        return None
    props = dict(will.properties or {})
    d = {"topic": will.topic, "payload": bytes(will.payload).decode("latin-1"), "qos": will.qos,
         "retain": bool(will.retain), "delay": props.pop(PR.WILL_DELAY_INTERVAL, 0) or 0}
    expiry = props.pop(PR.MESSAGE_EXPIRY_INTERVAL, None)
    if expiry is not None:
        d["expiry"] = expiry
    if props:
        d["props"] = _props_to_json(props)
    return d


def will_message(d: JsonObject, client_id: str, clock_now: float, wall_now: float) -> Message:
    props = _props_from_json(d.get("props")) if d.get("props") else None
    expires_at = clock_now + d["expiry"] if d.get("expiry") is not None else None
    return Message(d["topic"], d["payload"].encode("latin-1"), d["qos"], d["retain"], props,
                   expires_at, client_id, wall_now)


def will_from_dict(d: JsonObject | None) -> Will | None:
    """The Will back as a protocol packets.Will (for a session restored on another node)."""
    if d is None:
        return None
    from broker.protocol import packets as P
    props = _props_from_json(d.get("props")) if d.get("props") else {}
    if d.get("delay"):
        props[PR.WILL_DELAY_INTERVAL] = d["delay"]
    if d.get("expiry") is not None:
        props[PR.MESSAGE_EXPIRY_INTERVAL] = d["expiry"]
    return P.Will(d["topic"], d["payload"].encode("latin-1"), d["qos"], d["retain"], props or None)


def _props_to_json(props: dict) -> dict:
    out: dict[str, Any] = {}
    for k, v in props.items():
        if isinstance(v, (bytes, bytearray)):
            out[str(k)] = {"b": bytes(v).decode("latin-1")}
        elif isinstance(v, list):
            out[str(k)] = [list(x) for x in v]
        else:
            out[str(k)] = v
    return out


def _props_from_json(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and "b" in v:
            v = v["b"].encode("latin-1")
        elif isinstance(v, list):
            v = [tuple(x) for x in v]
        out[int(k)] = v
    return out
