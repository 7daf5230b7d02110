"""An accepted application message, shared by every session it is delivered to."""
from __future__ import annotations

import math

from typing import Any

from ..protocol import properties as PR
from ..protocol.codec import encode_publish
from ..protocol.properties import encode_properties


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
