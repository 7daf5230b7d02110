"""Prometheus metrics and /health over a small asyncio HTTP endpoint.

Counters are read from the core at scrape time (a custom collector), so the hot path
pays only for plain integer increments.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..core.view import BrokerView

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..transport.state import ServerState

log = logging.getLogger(__name__)


class BrokerCollector:
    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.view = BrokerView(server.broker)  # the core's read-only view (core/view.py)

    def collect(self) -> Iterator[Metric]:
        st = self.view.stats()
        yield GaugeMetricFamily("mqtt_connections", "Open client connections", value=st["connections"])
        yield GaugeMetricFamily("mqtt_sessions", "Sessions (connected and offline)", value=st["sessions"])
        yield GaugeMetricFamily("mqtt_subscriptions", "Subscriptions", value=st["subscriptions"])
        yield GaugeMetricFamily("mqtt_retained_messages", "Retained messages (clients', not $SYS)",
                                value=st["retained"])
        yield GaugeMetricFamily("mqtt_queued_messages", "Messages queued for sessions", value=st["queued"])
        yield GaugeMetricFamily("mqtt_queued_bytes", "Payload + topic bytes queued for sessions "
                                "(mqtt.max_queued_bytes_total)", value=st["queued_bytes"])
        yield GaugeMetricFamily("mqtt_retained_bytes", "Payload + topic bytes of retained messages "
                                "(mqtt.max_retained_bytes)", value=st["retained_bytes"])
        yield GaugeMetricFamily("mqtt_inflight_messages", "Unacknowledged outbound QoS 1/2",
                                value=st["inflight"])
        c = CounterMetricFamily("mqtt_messages_received", "PUBLISH received from clients", labels=["qos"])
        for q in range(3):
            c.add_metric([str(q)], st["received_by_qos"][q])
        yield c
        c = CounterMetricFamily("mqtt_messages_sent", "PUBLISH sent to clients", labels=["qos"])
        for q in range(3):
            c.add_metric([str(q)], st["sent_by_qos"][q])
        yield c
        yield CounterMetricFamily("mqtt_bytes_received", "Bytes received", value=self.server.bytes_in)
        yield CounterMetricFamily("mqtt_bytes_sent", "Bytes sent", value=self.server.bytes_out)
        yield CounterMetricFamily("mqtt_connections_accepted", "Connections accepted",
                                  value=st["connections_total"])
        yield CounterMetricFamily("mqtt_sessions_refused", "CONNECTs refused: mqtt.max_sessions reached",
                                  value=st["refused_max_sessions"])
        d = CounterMetricFamily("mqtt_messages_dropped", "Messages dropped", labels=["reason"])
        for reason in ("queue_full", "queues_total", "expired", "too_large", "sink_refused",
                       "not_authorized", "slow_consumer", "topic_limit", "retained_replay",
                       "retained_quota", "cluster_busy"):
            d.add_metric([reason], st.get("sink_refused" if reason == "sink_refused"
                                          else f"dropped_{reason}", 0))
        yield d
        checks = getattr(self.server, "auth_checks", None)
        if checks is not None:
            yield GaugeMetricFamily("mqtt_auth_pending", "Password checks waiting or running",
                                    value=checks.pending)
            yield CounterMetricFamily("mqtt_auth_refused_busy", "CONNECTs refused with Server busy "
                                      "(auth.max_pending_checks reached)", value=checks.refused)
            yield CounterMetricFamily("mqtt_auth_skipped", "Password checks not run: the client "
                                      "left before its turn", value=checks.skipped)
        yield from hook_metrics(self.view.hook_stats())


def hook_metrics(sections: dict) -> Iterator[GaugeMetricFamily]:
    """The hooks' figures (stats(): the sink's, the cluster's) as gauges mqtt_<section>_<name>;
    a dict under "<name>_by_<label>" is one gauge per key with that label, e.g. the cluster's
    clients_by_node -> mqtt_cluster_clients{node="n1"}."""
    for section, stats in sections.items():
        for k, v in stats.items():
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, (int, float)):
                yield GaugeMetricFamily(f"mqtt_{section}_{k}", f"{section}: {k}", value=v)
            elif isinstance(v, dict) and "_by_" in k:
                name, label = k.rsplit("_by_", 1)
                g = GaugeMetricFamily(f"mqtt_{section}_{name}", f"{section}: {name} by {label}",
                                      labels=[label])
                for key, value in v.items():
                    g.add_metric([str(key)], float(value))
                yield g


async def start_http(server: ServerState, host: str, port: int) -> asyncio.Server:
    """Serve GET /metrics (Prometheus text format) and GET /health (JSON)."""
    registry = CollectorRegistry()
    registry.register(BrokerCollector(server))
    started = time.time()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) > 1 else "/"
            if path == "/metrics":
                body, ctype, status = generate_latest(registry), "text/plain; version=0.0.4", "200 OK"
            elif path in ("/health", "/healthz"):
                view = BrokerView(server.broker)
                st = view.stats()
                info = {"status": "ok", "uptime_seconds": round(time.time() - started, 1),
                        "connections": st["connections"], "sessions": st["sessions"]}
                for section, stats in view.hook_stats().items():
                    info[section] = {k: v for k, v in stats.items()
                                     if isinstance(v, (int, float, bool, str))}
                body, ctype, status = json.dumps(info).encode(), "application/json", "200 OK"
            else:
                body, ctype, status = b"try /metrics or /health\n", "text/plain", "404 Not Found"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}"
                         f"\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, host, port)
    log.info("metrics on http://%s:%s/metrics, health on /health", host, srv.sockets[0].getsockname()[1])
    return srv
