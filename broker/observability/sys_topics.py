"""$SYS/broker/... topics, as Mosquitto publishes them, for MQTT dashboards.

Published as retained messages every `interval` seconds through the normal routing,
so `$SYS/#` subscribers (filters starting with a wildcard never match them) see them.
"""
from __future__ import annotations

import time

from .. import __version__
from ..core.message import Message


class SysPublisher:
    def __init__(self, server, interval: float = 10.0):
        self.server = server
        self.interval = interval
        self.started = time.time()
        self.last = 0.0

    def values(self) -> dict[str, str]:
        b = self.server.broker
        connected = sum(1 for c in b.connections if c.session is not None)
        return {
            "$SYS/broker/version": f"mqtt-history-broker {__version__}",
            "$SYS/broker/uptime": f"{int(time.time() - self.started)} seconds",
            "$SYS/broker/clients/connected": str(connected),
            "$SYS/broker/clients/total": str(len(b.sessions)),
            "$SYS/broker/clients/disconnected": str(len(b.sessions) - connected),
            "$SYS/broker/messages/received": str(sum(b.received_by_qos)),
            "$SYS/broker/messages/sent": str(sum(b.sent_by_qos)),
            "$SYS/broker/publish/messages/received": str(sum(b.received_by_qos)),
            "$SYS/broker/publish/messages/sent": str(sum(b.sent_by_qos)),
            "$SYS/broker/publish/messages/dropped": str(
                sum(b.stats.get(k, 0) for k in ("dropped_queue_full", "dropped_expired",
                                                "dropped_too_large", "dropped_slow_consumer"))),
            "$SYS/broker/bytes/received": str(self.server.bytes_in),
            "$SYS/broker/bytes/sent": str(self.server.bytes_out),
            "$SYS/broker/retained messages/count": str(b.retained.count),
            "$SYS/broker/subscriptions/count": str(b.router.count),
            "$SYS/broker/store/messages/count": str(sum(len(s.queue) for s in b.sessions.values())),
        }

    def publish(self) -> None:
        b = self.server.broker
        now = time.time()
        for topic, value in self.values().items():
            msg = Message(topic, value.encode(), 0, True, None, None, None, now)
            b.retained.set(topic, msg)
            b.route(msg, None)
