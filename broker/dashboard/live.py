"""What the dashboard shows about the running broker: read-only views of its state.

Nothing here runs per message. The only per-message cost of the dashboard is one dict
increment in Broker.route (``broker.topic_counts``, set only when the dashboard is enabled);
the Sampler below turns the broker's counters into rates every ``sample_seconds``.
"""
from __future__ import annotations

import base64
import time
from collections import deque

from mqtt_topics import matches

PROTOCOLS = {3: "3.1", 4: "3.1.1", 5: "5.0"}
DROP_REASONS = ("queue_full", "expired", "too_large", "slow_consumer", "not_authorized",
                "topic_limit", "sink_refused")
PREVIEW_BYTES = 200


def dropped(stats: dict) -> dict[str, int]:
    """Dropped messages by reason (the same names as the Prometheus metric)."""
    return {r: stats.get(r if r == "sink_refused" else f"dropped_{r}", 0) for r in DROP_REASONS}


def preview(payload: bytes, limit: int = PREVIEW_BYTES) -> dict:
    """A payload for a page: UTF-8 text when it is text, else base64; cut at limit bytes."""
    raw = bytes(payload[:limit])
    cut = len(payload) > limit
    # a cut may split the last character: allow up to 3 bytes less
    for end in range(len(raw), max(len(raw) - 4, -1) if cut else len(raw) - 1, -1):
        try:
            return {"text": raw[:end].decode("utf-8"), "truncated": cut, "bytes": len(payload)}
        except UnicodeDecodeError:
            continue
    return {"base64": base64.b64encode(raw).decode("ascii"), "truncated": cut,
            "bytes": len(payload)}


class TopicCounter:
    """Messages routed per topic, bounded by entries.

    The broker increments ``counts`` (a plain dict) for topics already in it and adds new topics
    while it holds fewer than ``max_topics``. Each sample turns increments into per-topic rates;
    when the dict is near full, topics that saw nothing since the previous sample make room.
    """

    def __init__(self, broker, max_topics: int):
        self.broker = broker
        self.max_topics = max_topics
        self.counts: dict[str, int] = {}
        self.prev: dict[str, int] = {}
        self.prev_t = time.monotonic()
        self.rates: dict[str, float] = {}
        broker.topic_counts_max = max_topics
        broker.topic_counts = self.counts

    def sample(self, now: float) -> None:
        counts, prev = self.counts, self.prev
        dt = max(now - self.prev_t, 1e-6)
        self.rates = {t: (n - prev.get(t, 0)) / dt for t, n in counts.items() if n != prev.get(t)}
        if len(counts) >= self.max_topics * 0.9:
            for t in [t for t in counts if t not in self.rates]:
                del counts[t]
        self.prev = dict(counts)
        self.prev_t = now

    def close(self) -> None:
        self.broker.topic_counts = None


class Sampler:
    """Every ``interval`` seconds: a point of every live series, kept for ``keep`` points."""

    def __init__(self, server, interval: float, keep: int, topics: TopicCounter | None,
                 history_status=None):
        self.server = server
        self.interval = interval
        self.points: deque = deque(maxlen=keep)
        self.topics = topics
        self.history_status = history_status or (lambda: {})
        self._last = None  # (t, counters) of the previous sample

    def counters(self) -> dict:
        b = self.server.broker
        return {"in": list(b.received_by_qos), "out": list(b.sent_by_qos),
                "dropped": dropped(b.stats),
                "bytes_in": self.server.bytes_in, "bytes_out": self.server.bytes_out}

    def sample(self) -> dict:
        now, wall = time.monotonic(), time.time()
        b = self.server.broker
        c = self.counters()
        point = {"t": round(wall, 3), "connections": len(b.connections),
                 "sessions": len(b.sessions), "subscriptions": b.router.count,
                 "retained": b.retained.count}
        last = self._last
        if last is not None:
            dt = max(now - last[0], 1e-6)
            prev = last[1]
            point["in"] = [round((x - y) / dt, 2) for x, y in zip(c["in"], prev["in"])]
            point["out"] = [round((x - y) / dt, 2) for x, y in zip(c["out"], prev["out"])]
            point["dropped"] = {k: round((v - prev["dropped"].get(k, 0)) / dt, 2)
                                for k, v in c["dropped"].items()}
            point["bytes_in"] = round((c["bytes_in"] - prev["bytes_in"]) / dt, 1)
            point["bytes_out"] = round((c["bytes_out"] - prev["bytes_out"]) / dt, 1)
        sink = sink_stats(self.server)
        if sink:
            point["spool_messages"] = sink.get("spool_messages")
            point["kafka_lag_seconds"] = sink.get("lag_seconds")
        hist = self.history_status()
        if hist.get("lag_seconds") is not None:
            point["history_lag_seconds"] = hist["lag_seconds"]
        self._last = (now, c)
        if self.topics is not None:
            self.topics.sample(now)
        if "in" in point:
            self.points.append(point)
        return point

    def series(self, since: float = 0.0) -> list[dict]:
        return [p for p in self.points if p["t"] > since]


def sink_stats(server) -> dict:
    """The sink's stats() (any keys; other components add theirs), {} without a sink."""
    stats = server.broker.hook_stats().get("sink") or {}  # a failing hook gives none
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, bool, str)) or v is None}


def overview(server) -> dict:
    """Totals since the broker started."""
    b = server.broker
    sessions = b.sessions.values()
    return {"connections": len(b.connections), "sessions": len(b.sessions),
            "subscriptions": b.router.count, "retained": b.retained.count,
            "received_by_qos": list(b.received_by_qos), "sent_by_qos": list(b.sent_by_qos),
            "dropped": dropped(b.stats), "connections_total": b.stats.get("connections_total", 0),
            "queued": sum(len(s.queue) for s in sessions),
            "inflight": sum(len(s.inflight_out) for s in sessions),
            "bytes_in": server.bytes_in, "bytes_out": server.bytes_out}


def clients(broker, query: str = "", limit: int = 500) -> dict:
    """Connected clients, sorted by client id; ``query`` keeps ids containing it (any case)."""
    q = query.lower()
    now_mono, now_wall = broker.clock(), broker.wall()
    found = []
    for conn in broker.connections:
        s = conn.session
        if s is None or s.link is not conn:  # not (or no longer) past CONNECT
            continue
        if q and q not in conn.client_id.lower():
            continue
        found.append(conn)
    found.sort(key=lambda c: c.client_id)
    out = []
    for conn in found[:limit]:
        s = conn.session
        out.append({
            "client_id": conn.client_id, "protocol": PROTOCOLS.get(conn.level, str(conn.level)),
            "username": conn.username, "address": conn.peer,
            "connected_since": round(now_wall - (now_mono - conn.connected_at), 3),
            "keep_alive": conn.keep_alive,
            "subscriptions": [{"filter": sub.filter, "qos": sub.qos}
                              for sub in list(s.subscriptions.values())[:100]],
            "subscription_count": len(s.subscriptions),
            "inflight": len(s.inflight_out), "queued": len(s.queue)})
    return {"clients": out, "matched": len(found), "connected": len(broker.connections),
            "sessions": len(broker.sessions), "limit": limit}


def topics(broker, counter: TopicCounter | None, filt: str = "#", limit: int = 2000) -> dict:
    """Topics with a retained message or recent traffic, matching filt, sorted by name."""
    now = broker.clock()
    retained = {m.topic: m for m in broker.retained.match(filt)  # walks only what can match
                if m.expires_at is None or m.expires_at > now}
    counts = counter.counts if counter is not None else {}
    rates = counter.rates if counter is not None else {}
    names = list(retained) + [t for t in counts if t not in retained and matches(filt, t)]
    names.sort()
    out = []
    for t in names[:limit]:
        item = {"topic": t, "rate": round(rates.get(t, 0.0), 2), "count": counts.get(t)}
        m = retained.get(t)
        if m is not None:
            item["retained"] = {**preview(m.payload), "qos": m.qos,
                                "at": round(m.accepted_at, 3) if m.accepted_at else None}
        out.append(item)
    return {"topics": out, "matched": len(names), "limit": limit,
            "counted_topics": len(counts), "max_counted_topics":
                counter.max_topics if counter is not None else 0}
