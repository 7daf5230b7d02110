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
# a persistent session's QoS 2 PUBLISH: its packet id (a node that takes the session over after
# this one died knows a DUP resend of it is no new message, cluster/rebuild.py)
H_QOS2_ID = "mqtt.qos2_id"


def message_body(msg: Message, client_id: str, username: str | None, protocol: int, node: str,
                 message_id: str, now: float, qos2_id: int | None = None) -> bytes:
    """The Kafka record body (key, value, headers) of an accepted message; `now` is the broker's
    clock (Message.expires_at is on it). The record's timestamp is msg.accepted_at. `qos2_id`:
    the packet id of a persistent session's QoS 2 PUBLISH (H_QOS2_ID)."""
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
    if qos2_id is not None:
        extra.append((H_QOS2_ID, b"%d" % qos2_id))
    return encode_message_body(msg.topic, msg.payload, msg.qos, msg.retain, client_id, username,
                               protocol, message_id, extra)


_FLAG = {b"0": 0, b"1": 1, b"2": 2}
_RETAIN = {b"0": False, b"1": True}
NEVER = 0xFFFFFFFF


class Malformed(ValueError):
    """A record no cluster node writes (cluster/node.py logs, counts and skips it)."""


def topic_problem(topic: str, limits: Any = None) -> str | None:
    """What makes `topic` a topic name a PUBLISH could not carry, or None: empty, a wildcard
    [MQTT-3.3.2-2], U+0000 [MQTT-4.7.3-2], longer or deeper than `limits` (the receiving
    broker's MQTTConfig: max_topic_length, max_topic_levels; None: 65535 bytes)."""
    if not topic:
        return "empty topic"  # [MQTT-4.7.3-1]
    if "+" in topic or "#" in topic:
        return "wildcard in the topic"
    if "\x00" in topic:
        return "U+0000 in the topic"
    n = len(topic)
    if limits is None:
        if n > 21845 and len(topic.encode()) > 65535:  # (3 bytes a character at most)
            return "topic longer than 65535 bytes"
        return None
    if n > limits.max_topic_length or \
            n >= limits.max_topic_levels and topic.count("/") >= limits.max_topic_levels:
        return "topic over mqtt.max_topic_length / max_topic_levels"
    return None


def _text(val: bytes | None, what: str) -> str:
    """A header's UTF-8 string [MQTT-1.5.4-1], without U+0000 [MQTT-1.5.4-2]."""
    if val is None:
        raise Malformed(f"{what}: null")
    try:
        s = str(val, "utf-8")
    except UnicodeDecodeError:
        raise Malformed(f"{what}: not UTF-8") from None
    if "\x00" in s:
        raise Malformed(f"{what}: U+0000")
    return s


def decode_message(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes]],
                   timestamp_ms: int, clock_now: float, wall_now: float,
                   limits: Any = None) -> tuple[Message, str, str]:
    """(Message, publisher client id, accepting node) of a messages-topic record: the inverse
    of message_body, reading each header once (a node decodes every message it delivers).
    Raises Malformed for a record a PUBLISH could not have made: its topic (topic_problem, with
    `limits`, the broker's MQTTConfig), its headers' values, a payload that is not UTF-8 while
    it says it is (when limits.validate_payload_format)."""
    if key is None or value is None:
        raise Malformed("null key or value")
    topic = _text(key, "topic")
    why = topic_problem(topic, limits)
    if why is not None:
        raise Malformed(why)
    node = client_id = ""
    qos, retain, expiry = 0, False, None
    props: dict = {}
    ups = None
    try:
        for name, val in headers:
            if name.startswith(H_USER_PREFIX):
                if ups is None:
                    ups = props[PR.USER_PROPERTY] = []
                ups.append((name[len(H_USER_PREFIX):], _text(val, "user property")))
            elif name == H_CLIENT_ID:
                client_id = _text(val, "client id")
            elif name == H_QOS:
                qos = _FLAG[val]
            elif name == H_RETAIN:
                retain = _RETAIN[val]
            elif name == H_NODE:
                node = _text(val, "node")
            elif name == H_MESSAGE_EXPIRY:
                expiry = int(val)
                if not 0 <= expiry <= NEVER:
                    raise Malformed("message expiry out of range")
            elif name == H_PAYLOAD_FORMAT:
                props[PR.PAYLOAD_FORMAT_INDICATOR] = {b"0": 0, b"1": 1}[val]
            elif name == H_CONTENT_TYPE:
                props[PR.CONTENT_TYPE] = _text(val, "content type")
            elif name == H_RESPONSE_TOPIC:
                rt = props[PR.RESPONSE_TOPIC] = _text(val, "response topic")
                if topic_problem(rt) is not None:
                    raise Malformed("response topic is not a topic name")
            elif name == H_CORRELATION_DATA:
                if val is None:
                    raise Malformed("correlation data: null")
                props[PR.CORRELATION_DATA] = bytes(val)
    except (KeyError, TypeError, ValueError) as exc:  # (Malformed is a ValueError)
        raise exc if isinstance(exc, Malformed) else Malformed(f"bad header value ({exc!r:.80})") \
            from None
    if ups is not None and any("\x00" in k for k, _ in ups):
        raise Malformed("user property name: U+0000")
    if limits is not None and props.get(PR.PAYLOAD_FORMAT_INDICATOR) == 1 and \
            limits.validate_payload_format:
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed("payload is not UTF-8 as its Payload Format Indicator says") from None
    expires_at = None
    accepted_at = timestamp_ms / 1000.0
    if expiry is not None:
        # [MQTT-3.3.2-6] counted from the first acceptance, on any node
        expires_at = clock_now + expiry - max(0.0, wall_now - accepted_at)
    msg = Message(topic, value, qos, retain, props or None, expires_at, client_id, accepted_at)
    return msg, client_id, node


# A JSON object as decoded (a will in a control record): its optional fields are read with .get()
JsonObject = Any


def dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# ------------------------------------------------------------------ reading control records
# Every control record is checked here, whole, before anything reads it: a record of any other
# shape (not JSON, another JSON type, a field missing or of another type, too large) raises
# Malformed and is skipped, so what applies it (control.py, node.py) reads only what a node
# writes.
MAX_CONTROL_BYTES = 16 << 20
_ID = 1024      # characters of a node id, incarnation, request id, user name, ban value...


def _str(limit: int = 65535) -> Any:
    return lambda v: isinstance(v, str) and len(v) <= limit


def _int(lo: int, hi: int) -> Any:
    return lambda v: type(v) is int and lo <= v <= hi


def _num(v: Any) -> bool:
    return type(v) in (int, float) and v == v and abs(v) < 1e15


def _bool(v: Any) -> bool:
    return type(v) is bool


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _list_of(check: Any) -> Any:
    return lambda v: type(v) is list and all(check(x) for x in v)


def _latin1(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        v.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _topic(v: Any) -> bool:
    return isinstance(v, str) and topic_problem(v) is None


def _utf8(v: Any) -> bool:
    return isinstance(v, str) and "\x00" not in v and len(v) <= 65535


def _pair(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and _utf8(v[0]) and _utf8(v[1])


_WILL_PROPS = {PR.PAYLOAD_FORMAT_INDICATOR: _int(0, 1), PR.CONTENT_TYPE: _utf8,
               PR.RESPONSE_TOPIC: _topic, PR.USER_PROPERTY: _list_of(_pair),
               PR.CORRELATION_DATA: lambda v: type(v) is dict and list(v) == ["b"] and
               _latin1(v["b"]) and len(v["b"]) <= 65535}
_U32 = _int(0, NEVER)
_PID = _int(1, 0xFFFF)
_OFFSET = _int(0, 1 << 62)


def _partition_key(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 6 and v.isascii() and v.isdigit()


def _filter(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 65535 and "\x00" not in v


def _positions(v: Any) -> bool:
    return type(v) is dict and all(_partition_key(k) and _OFFSET(o) for k, o in v.items())


def _will_props(v: Any) -> bool:
    if type(v) is not dict:
        return False
    for k, x in v.items():
        check = _WILL_PROPS.get(int(k)) if _partition_key(k) else None
        if check is None or not check(x):
            return False
    return True


def _flag(v: Any) -> bool:
    return type(v) in (int, bool) and v in (0, 1)


def _sub_row(v: Any) -> bool:
    return (type(v) is list and 6 <= len(v) <= 7 and _utf8(v[0]) and _int(0, 2)(v[1]) and
            _flag(v[2]) and _flag(v[3]) and _int(0, 2)(v[4]) and _opt(_int(0, 268435455))(v[5])
            and (len(v) == 6 or v[6] is None or _positions(v[6])))


def _inflight_row(v: Any) -> bool:
    return type(v) is list and len(v) == 4 and _int(0, 1 << 20)(v[0]) and _OFFSET(v[1]) and \
        _PID(v[2]) and _flag(v[3])


def _fields(spec: dict, d: Any) -> bool:
    """d is a JSON object whose keys are those of `spec` (name: (check, required)), each
    value passing its check."""
    if type(d) is not dict:
        return False
    for name in d:
        if name not in spec:
            return False
    for name, (check, required) in spec.items():
        if name in d:
            if not check(d[name]):
                return False
        elif required:
            return False
    return True


def _carried(v: Any) -> bool:  # the messages a session was handed over with (cluster/handover.py)
    return _fields({"h": (_str(_ID), True), "n": (_int(0, 1 << 30), True),
                    "upto": (_positions, True)}, v)


_WILL = {"topic": (_topic, True), "payload": (_latin1, True), "qos": (_int(0, 2), True),
         "retain": (_bool, True), "delay": (_U32, True), "expiry": (_U32, False),
         "props": (_will_props, False)}
_CHECKPOINT = {"subs": (_list_of(_sub_row), True), "pos": (_positions, True),
               "inflight": (_list_of(_inflight_row), True), "next": (_positions, False),
               "wrote": (_opt(_str(2 * _ID + 20)), False),
               "next_pid": (_int(0, 0xFFFF), True),
               "qos2": (_list_of(_PID), True), "expiry": (_U32, True),
               "user": (_opt(_str(_ID)), True), "carried": (_carried, False)}


def _will(v: Any) -> bool:
    return _fields(_WILL, v)


def _checkpoint(v: Any) -> bool:
    return _fields(_CHECKPOINT, v)


_WRITER = {"t": (_str(8), True), "node": (_str(_ID), True), "inc": (_str(_ID), True),
           "seq": (_int(1, 1 << 62), True)}
_BAN_KINDS = ("clientid", "username", "address")  # broker/admin/bans.py KINDS
CONTROL = {  # kind: (key prefix, fields)
    "join": ("n:", {**_WRITER, "at": (_num, False)}),
    "beat": ("n:", {**_WRITER, "read": (_positions, False)}),
    "leave": ("n:", _WRITER),
    "evict": ("n:", {**_WRITER, "by": (_str(_ID), True), "by_inc": (_str(_ID), True),
                     "at": (_num, False)}),
    "claim": ("c:", {**_WRITER, "req": (_str(_ID), True), "clean": (_bool, True),
                     "expiry": (_U32, True), "will": (_opt(_will), True),
                     "user": (_opt(_str(_ID)), True)}),
    "state": ("c:", {**_WRITER, "epoch": (_OFFSET, True), "connected": (_bool, True),
                     "expiry": (_U32, True), "expires_at": (_opt(_num), True),
                     "will": (_opt(_will), True), "will_at": (_opt(_num), True),
                     "user": (_opt(_str(_ID)), True), "session": (_opt(_checkpoint), True),
                     "final": (_bool, False), "fired": (_bool, False)}),
    "end": ("c:", {**_WRITER, "epoch": (_OFFSET, True), "fired": (_bool, True)}),
    "ban": ("b:", {**_WRITER, "kind": (lambda v: v in _BAN_KINDS, True),
                   "value": (lambda v: isinstance(v, str) and 0 < len(v) <= _ID, True),
                   "reason": (_str(500), True), "until": (_opt(_num), True),
                   "at": (_opt(_num), True), "by": (_str(_ID), True)}),
    "unban": ("b:", {**_WRITER, "kind": (lambda v: v in _BAN_KINDS, True),
                     "value": (lambda v: isinstance(v, str) and 0 < len(v) <= _ID, True)}),
    # the topic filters of a node's sessions (None: more than it lists, take it as wanting
    # every message), and a bell that wakes a node's reading (cluster/interest.py)
    "interest": ("i:", {**_WRITER, "filters": (_opt(_list_of(_filter)), True)}),
    "bell": ("r:", {**_WRITER, "to": (_str(_ID), True)}),
}


def ban_key(kind: str, value: str) -> str:
    return f"b:{kind}:{value}"


def decode_control(key: bytes | None, value: bytes | None) -> tuple[str, dict | None]:
    """(key, record) of a control-topic record, the record None for a tombstone. Raises
    Malformed for anything a node does not write: the key is `n:<node id>` for a node's
    record, `c:<client id>` for a client's, `b:<kind>:<value>` for a ban's, `i:<node id>` for
    a node's interest and `r:<node id>` for a bell to a node."""
    if key is None:
        raise Malformed("null key")
    try:
        k = str(key, "utf-8")
    except UnicodeDecodeError:
        raise Malformed("key is not UTF-8") from None
    if value is None:
        if k[:2] not in ("n:", "c:", "b:", "i:", "r:"):
            raise Malformed("tombstone of an unknown key")
        return k, None
    if len(value) > MAX_CONTROL_BYTES:
        raise Malformed(f"{len(value)} bytes (at most {MAX_CONTROL_BYTES})")
    try:
        rec = json.loads(value)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise Malformed(f"not JSON ({exc!s:.80})") from None
    if type(rec) is not dict:
        raise Malformed(f"a JSON {type(rec).__name__}, not an object")
    kind = rec.get("t")
    spec = CONTROL.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise Malformed(f"unknown kind {kind!r:.40}")
    prefix, fields = spec
    if not k.startswith(prefix):
        raise Malformed(f"a {kind} record under key {k[:40]!r}")
    if not _fields(fields, rec):
        raise Malformed(f"a {kind} record with missing, unknown or mistyped fields")
    if prefix in ("n:", "i:") and k[2:] != rec["node"]:
        raise Malformed(f"a {kind} record of node {rec['node'][:40]!r} under key {k[:40]!r}")
    if prefix == "r:" and k[2:] != rec["to"]:
        raise Malformed(f"a bell for {rec['to'][:40]!r} under key {k[:40]!r}")
    if prefix == "b:" and k != ban_key(rec["kind"], rec["value"]):
        raise Malformed(f"a {kind} record under key {k[:40]!r}")
    return k, rec


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
