"""$SYS/broker/... topics, as Mosquitto publishes them, for MQTT dashboards.

Published as retained messages every `interval` seconds through the normal routing,
so `$SYS/#` subscribers (filters starting with a wildcard never match them) see them.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import __version__
from ..core.message import Message
from ..core.view import BrokerView

if TYPE_CHECKING:
    from ..transport.state import ServerState


class SysPublisher:
    def __init__(self, server: ServerState, interval: float = 10.0) -> None:
        self.server = server
        self.view = BrokerView(server.broker)  # the core's read-only view (core/view.py)
        self.interval = interval
        self.started = time.time()
        self.last = 0.0

    def values(self) -> dict[str, str]:
        st = self.view.stats()
        received, sent = str(sum(st["received_by_qos"])), str(sum(st["sent_by_qos"]))
        return {
            "$SYS/broker/version": f"mqtt-history-broker {__version__}",
            "$SYS/broker/uptime": f"{int(time.time() - self.started)} seconds",
            "$SYS/broker/clients/connected": str(st["clients_connected"]),
            "$SYS/broker/clients/total": str(st["sessions"]),
            "$SYS/broker/clients/disconnected": str(st["sessions"] - st["clients_connected"]),
            "$SYS/broker/messages/received": received,
            "$SYS/broker/messages/sent": sent,
            "$SYS/broker/publish/messages/received": received,
            "$SYS/broker/publish/messages/sent": sent,
            "$SYS/broker/publish/messages/dropped": str(
                sum(st.get(k, 0) for k in ("dropped_queue_full", "dropped_expired",
                                           "dropped_too_large", "dropped_slow_consumer"))),
            "$SYS/broker/bytes/received": str(self.server.bytes_in),
            "$SYS/broker/bytes/sent": str(self.server.bytes_out),
            "$SYS/broker/retained messages/count": str(st["retained"] + st["retained_sys"]),
            "$SYS/broker/subscriptions/count": str(st["subscriptions"]),
            "$SYS/broker/store/messages/count": str(st["queued"]),
            **hook_topics(self.view.hook_stats()),
        }

    def publish(self) -> None:
        """Retained in memory and routed (Broker.publish_local): never stored nor sent to the sink."""
        b = self.server.broker
        now = time.time()
        for topic, value in self.values().items():
            b.publish_local(Message(topic, value.encode(), 0, True, None, None, None, now))


def hook_topics(sections: dict) -> dict[str, str]:
    """The hooks' figures (the sink's, the cluster's) as $SYS/broker/<section>/<name>; a dict
    "<name>_by_<label>" as $SYS/broker/<section>/<name>/<key> (the cluster's clients per node)."""
    out = {}
    for section, stats in sections.items():
        for k, v in stats.items():
            if isinstance(v, dict) and "_by_" in k:
                name = k.rsplit("_by_", 1)[0]
                for key, value in v.items():
                    out[f"$SYS/broker/{section}/{name}/{key}"] = str(value)
            elif isinstance(v, bool):
                out[f"$SYS/broker/{section}/{k}"] = "true" if v else "false"
            elif isinstance(v, (int, float, str)):
                out[f"$SYS/broker/{section}/{k}"] = str(v)
    return out
