"""The sink's side of the broker hooks (broker/core/hooks.py): accepted messages become sink
records. The broker core imports nothing from sink/; this adapter imports the core's Hook.

    Broker(..., sink=Sink(...))       # Sink.hook() makes the SinkHook
    Broker(..., hooks=[SinkHook(x)])  # any object with submit(SinkRecord) -> bool
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker.core.durability import Pending
from broker.core.hooks import Hook
from kafka_client.record import sink_record

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from broker.core.message import Message

SPOOL_ERROR = "the message could not be stored (broker disk error)"


class SinkHook(Hook):
    """on_message_accepted -> sink.submit_message (no properties, no expiry: no SinkRecord
    built, the hot path) or sink.submit(SinkRecord). False when the sink refuses (spool full).
    The record's message id goes on the Message (``sink_id``) for a history replay's switch-over.
    With durability "spool" it provides barrier(): acks wait for the spool's fsync."""

    def __init__(self, sink: Any) -> None:  # a sink.forward.service.Sink, or anything with submit()
        self.sink = sink
        # the common case (no properties, no expiry) without building a SinkRecord, when the sink can
        self._submit_message = getattr(sink, "submit_message", None)
        self.clock = time.monotonic
        provides = {"on_message_accepted"}
        if getattr(sink, "durable", False):
            provides.add("barrier")
        if callable(getattr(sink, "stats", None)):
            provides.add("stats")
        self.provides = frozenset(provides)

    def barrier(self) -> Pending | None:
        """The sink's barrier (an asyncio future for the records appended since the last one)
        as the core's token: a spool write that failed makes the acks failures."""
        fut = self.sink.barrier()
        if fut is None:
            return None
        token = Pending()
        fut.add_done_callback(lambda f: token.resolve(
            SPOOL_ERROR if f.cancelled() or f.exception() is not None else None))
        return token

    def stats(self) -> dict:
        return {"sink": self.sink.stats()}

    def attach(self, broker: HookHost) -> None:
        self.clock = broker.clock  # Message.expires_at is on the broker's clock

    def on_message_accepted(self, msg: Message, client_id: str, username: str | None, protocol: int) -> bool:
        p = msg.props
        if not p and msg.expires_at is None and self._submit_message is not None:
            mid = self._submit_message(msg.topic, msg.payload, msg.qos, msg.retain, client_id,
                                       username, protocol, int(msg.accepted_at * 1000))
            if mid is True or mid is False:  # excluded from the sink, or refused
                return mid
            msg.sink_id = mid  # its Kafka record's mqtt.message_id (a replay's switch to live)
            return True
        rec = sink_record(msg.topic, msg.payload, msg.qos, msg.retain, client_id, username, protocol,
                          int(msg.accepted_at * 1000), p,
                          None if msg.expires_at is None else msg.remaining_expiry(self.clock()))
        if not self.sink.submit(rec):
            return False
        if rec.message_id is not None:
            msg.sink_id = rec.message_id.encode()
        return True
