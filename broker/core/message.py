"""An accepted application message, shared by every session it is delivered to."""
from __future__ import annotations

import math

from typing import Any

from ..protocol import properties as PR
from ..protocol.codec import encode_publish
from ..protocol.properties import encode_properties


MAX_STRING_BYTES = 65535            # an MQTT UTF-8 string: a two-byte length (1.5.4)
MAX_PACKET_BYTES = 268435455 + 5    # the largest Remaining Length and its fixed header (2.1.4)


def string_problem(value: object, what: str) -> str | None:
    """Why `value` cannot be sent as an MQTT UTF-8 string, None when it can: well-formed UTF-8
    without surrogates [MQTT-1.5.4-1], no U+0000 [MQTT-1.5.4-2], at most 65535 bytes."""
    if not isinstance(value, str):
        return f"{what} must be a string"
    if "\x00" in value:
        return f"{what} contains U+0000 (NUL), which MQTT strings must not [MQTT-1.5.4-2]"
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return (f"{what} is not well-formed UTF-8: it has a lone surrogate (U+D800..U+DFFF) "
                "[MQTT-1.5.4-1]")
    if n > MAX_STRING_BYTES:
        return f"{what} is {n} bytes in UTF-8; an MQTT string holds at most {MAX_STRING_BYTES}"
    return None


def topic_name_problem(topic: object, what: str = "the topic", max_length: int = 0,
                       max_levels: int = 0) -> str | None:
    """Why `topic` cannot be a PUBLISH's Topic Name, None when it can: not empty
    [MQTT-4.7.3-1], no wildcard [MQTT-3.3.2-2], no U+0000 [MQTT-4.7.3-2], well-formed UTF-8
    [MQTT-1.5.4-1], at most 65535 bytes [MQTT-4.7.3-3]; and within this broker's
    mqtt.max_topic_length (`max_length`) and max_topic_levels (`max_levels`) when given."""
    if not isinstance(topic, str):
        return f"{what} must be a string"
    if not topic:
        return f"{what} is empty: a topic name has at least one character [MQTT-4.7.3-1]"
    if "+" in topic or "#" in topic:
        return (f"{what} contains a wildcard (+ or #): a topic name must not, only topic "
                "filters may [MQTT-3.3.2-2]")
    if "\x00" in topic:
        return f"{what} contains U+0000 (NUL), which topic names must not [MQTT-4.7.3-2]"
    try:
        n = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return (f"{what} is not well-formed UTF-8: it has a lone surrogate (U+D800..U+DFFF) "
                "[MQTT-1.5.4-1]")
    if n > MAX_STRING_BYTES:
        return (f"{what} is {n} bytes in UTF-8; a topic name holds at most {MAX_STRING_BYTES} "
                "[MQTT-4.7.3-3]")
    if max_length and len(topic) > max_length:   # as Connection.on_publish counts it
        return (f"{what} is {len(topic)} characters long; this broker takes at most {max_length} "
                "(mqtt.max_topic_length)")
    if max_levels and topic.count("/") >= max_levels:
        return f"{what} has more than {max_levels} levels (mqtt.max_topic_levels)"
    return None


def properties_problem(props: dict[int, Any] | None) -> str | None:
    """Why a PUBLISH's properties cannot be sent, None when they can: every string (Content Type,
    Response Topic, User Properties) a well-formed MQTT string, the Response Topic a topic name
    [MQTT-3.3.2-14]."""
    if not props:
        return None
    for pid, what in ((PR.CONTENT_TYPE, "the Content Type"),
                      (PR.RESPONSE_TOPIC, "the Response Topic")):
        v = props.get(pid)
        if v is not None:
            problem = (topic_name_problem(v, what) if pid == PR.RESPONSE_TOPIC
                       else string_problem(v, what))
            if problem is not None:
                return problem
    for pair in props.get(PR.USER_PROPERTY) or ():
        for v in pair:
            problem = string_problem(v, "a User Property")
            if problem is not None:
                return problem
    return None


def publish_problem(topic: object, payload: object, props: dict[int, Any] | None = None,
                    max_packet_size: int = MAX_PACKET_BYTES, max_topic_length: int = 0,
                    max_levels: int = 0) -> str | None:
    """Why a message cannot enter the broker as a PUBLISH, None when it can: the checks the
    decoder and Connection.on_publish make on a client's PUBLISH, for every other way in (the
    admin API, a history replay, a restored store). A PUBLISH of this topic and payload must fit
    `max_packet_size` (mqtt.maximum_packet_size for new messages)."""
    problem = topic_name_problem(topic, "the topic", max_topic_length, max_levels)
    if problem is not None:
        return problem
    if not isinstance(payload, (bytes, bytearray)):
        return "the payload must be bytes"
    problem = properties_problem(props)
    if problem is not None:
        return problem
    # the smallest PUBLISH carrying them: fixed header (at most 5), topic, packet id
    size = 1 + 4 + 2 + len(str(topic).encode("utf-8")) + 2 + len(payload)
    if size > max_packet_size:
        return (f"the payload is {len(payload)} bytes: with its topic it does not fit the maximum "
                f"packet size of {max_packet_size} bytes (mqtt.maximum_packet_size)")
    return None


def check_new_message(topic: object, payload: object, props: dict[int, Any] | None,
                      cfg: Any) -> str | None:
    """publish_problem() under the broker's mqtt limits (an MQTTConfig): what a client's
    PUBLISH would be held to."""
    return publish_problem(topic, payload, props, cfg.maximum_packet_size, cfg.max_topic_length,
                           cfg.max_topic_levels)


class Message:
    """Immutable once routed. `props` holds the properties forwarded unaltered
    ([MQTT-3.3.2-4], [MQTT-3.3.2-15], [MQTT-3.3.2-16], [MQTT-3.3.2-17], [MQTT-3.3.2-18],
    [MQTT-3.3.2-20]; Topic Alias and Subscription Identifiers removed); `forms` caches the encoded
    PUBLISH per distinct outgoing form so each form is encoded once."""

    __slots__ = ("topic", "topic_bytes", "payload", "qos", "retain", "props", "expires_at",
                 "sender", "forms", "accepted_at", "store_id", "sink_id")
    sink_id: bytes  # (declared for the type checker; left unset by __init__, see below)

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool,
                 props: dict[int, Any] | None, expires_at: float | None, sender: str | None,
                 accepted_at: float = 0.0) -> None:
        self.topic = topic
        self.topic_bytes = topic.encode()
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.props = props
        self.expires_at = expires_at
        self.sender = sender
        self.forms: dict[tuple[Any, ...], tuple[bytes, int]] = {}
        self.accepted_at = accepted_at
        self.store_id: int | tuple[int, int] | None = None  # its key in the store: a row id
        # (broker/store/sqlite.py), or (partition, offset) in the cluster's log (cluster/node.py)
        # sink_id, left unset (read with getattr): the sink's message id (bytes), set by the sink
        # hook when it takes the message; a history replay's live switch-over compares it

    def remaining_expiry(self, now: float) -> int | None:
        """Seconds left (rounded up), 0 when expired, None when it never expires."""
        if self.expires_at is None:
            return None
        left = self.expires_at - now
        return math.ceil(left) if left > 0 else 0

    def encoded(self, level: int, qos: int, retain: bool, sub_ids: tuple[int, ...] | None,
                expiry: int | None, alias: int = 0, send_topic: bool = True) -> tuple[bytes, int]:
        """(PUBLISH bytes with packet id 0, offset of the packet id or -1).

        The result is cached per form: one encode serves every subscriber that
        receives the same form; callers patch only the packet identifier.
        """
        v5 = level == 5
        key = (v5, qos, retain, sub_ids, expiry, alias, send_topic) if v5 else (False, qos, retain)
        form = self.forms.get(key)
        if form is not None:
            return form
        topic = self.topic_bytes if send_topic else b""
        block = None
        if v5:
            if self.props is None and sub_ids is None and expiry is None and not alias:
                block = b"\x00"
            else:
                props = dict(self.props) if self.props else {}
                if expiry is not None:
                    props[PR.MESSAGE_EXPIRY_INTERVAL] = expiry  # [MQTT-3.3.2-6]
                if alias:
                    props[PR.TOPIC_ALIAS] = alias
                if sub_ids:
                    props[PR.SUBSCRIPTION_IDENTIFIER] = list(sub_ids)  # [MQTT-3.3.4-3], [MQTT-3.3.4-4]
                block = encode_properties(props)
        # DUP 0: a first send [MQTT-3.3.1-3] (resends set it, Session.resume)
        data = encode_publish(topic, self.payload, qos, retain, False, 1 if qos else None,
                              block, level)
        off = -1
        if qos:
            # header byte + remaining-length bytes + 2 + topic; the Remaining Length is
            # len(data) - 1 - its own size, so count its bytes rather than derive them
            vbi = 1
            while data[vbi] & 0x80:
                vbi += 1
            off = 1 + vbi + 2 + len(topic)
        form = (data, off)
        self.forms[key] = form
        return form
