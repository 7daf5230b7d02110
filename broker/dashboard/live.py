"""What the dashboard shows about the running broker, read through the core's read-only view
(broker/core/view.py: BrokerView), never from its objects.

Nothing here runs per message but TopicCounter, a hook on accepted messages (one dict
increment each, attached only while the dashboard is on); the Sampler turns the view's counters
into rates every ``sample_seconds``. Every time in an answer is ISO 8601 in UTC (``iso()``).
"""
from __future__ import annotations

import base64
import datetime as dt
import time
from collections import deque
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

from mqtt_topics import matches

from ..core.hooks import Hook
from ..core.view import BrokerView, ClientRecord

if TYPE_CHECKING:
    from ..core.message import Message

DROP_REASONS = ("queue_full", "expired", "too_large", "slow_consumer", "not_authorized",
                "topic_limit", "sink_refused")
PREVIEW_BYTES = 200


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC with milliseconds: 2026-05-01T10:00:00.000Z."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


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


class TopicCounter(Hook):
    """Accepted messages per topic, bounded by entries: a hook on ``on_message_accepted``
    (attached while the dashboard runs), so the router itself counts nothing.

    Topics already counted are incremented; new topics are added while fewer than
    ``max_topics`` are held. Each sample turns increments into per-topic rates; when the dict is
    near full, topics that saw nothing since the previous sample make room.
    """
    provides = frozenset({"on_message_accepted"})

    def __init__(self, max_topics: int) -> None:
        self.max_topics = max_topics
        self.counts: dict[str, int] = {}
        self.prev: dict[str, int] = {}
        self.prev_t = time.monotonic()
        self.rates: dict[str, float] = {}

    def on_message_accepted(self, msg: Message, client_id: str, username: str | None, protocol: int) -> bool:
        counts = self.counts
        c = counts.get(msg.topic)
        if c is not None:
            counts[msg.topic] = c + 1
        elif len(counts) < self.max_topics:
            counts[msg.topic] = 1
        return True

    def sample(self, now: float) -> None:
        counts, prev = self.counts, self.prev
        dt_ = max(now - self.prev_t, 1e-6)
        self.rates = {t: (n - prev.get(t, 0)) / dt_ for t, n in counts.items() if n != prev.get(t)}
        if len(counts) >= self.max_topics * 0.9:
            for t in [t for t in counts if t not in self.rates]:
                del counts[t]
        self.prev = dict(counts)
        self.prev_t = now


class Sampler:
    """Every ``interval`` seconds: a point of every live series, kept for ``keep`` points."""

    def __init__(self, view: BrokerView, io_bytes: Callable[[], tuple[int, int]], interval: float, keep: int,
                 topics: TopicCounter | None,
                 sink_stats: Callable[[], dict[str, Any]] | None = None) -> None:
        """view: a BrokerView; io_bytes(): (bytes in, bytes out) of the server."""
        self.view = view
        self.io_bytes = io_bytes
        self.interval = interval
        self.points: deque = deque(maxlen=keep)
        self.topics = topics
        self.sink_stats = sink_stats or (lambda: {})
        self._last: tuple[float, dict] | None = None  # (t, counters) of the previous sample

    def counters(self) -> dict:
        c = self.view.counters()
        bytes_in, bytes_out = self.io_bytes()
        return {"in": list(c["received_by_qos"]), "out": list(c["sent_by_qos"]),
                "dropped": dropped(c), "bytes_in": bytes_in, "bytes_out": bytes_out}

    def sample(self) -> dict:
        now, ms = time.monotonic(), int(time.time() * 1000)
        c = self.counters()
        st = self.view.stats()
        point = {"t": iso(ms / 1000), "connections": st["connections"], "sessions": st["sessions"],
                 "subscriptions": st["subscriptions"], "retained": st["retained"]}
        last = self._last
        if last is not None:
            dt_ = max(now - last[0], 1e-6)
            prev = last[1]
            point["in"] = [round((x - y) / dt_, 2) for x, y in zip(c["in"], prev["in"])]
            point["out"] = [round((x - y) / dt_, 2) for x, y in zip(c["out"], prev["out"])]
            point["dropped"] = {k: round((v - prev["dropped"].get(k, 0)) / dt_, 2)
                                for k, v in c["dropped"].items()}
            point["bytes_in"] = round((c["bytes_in"] - prev["bytes_in"]) / dt_, 1)
            point["bytes_out"] = round((c["bytes_out"] - prev["bytes_out"]) / dt_, 1)
        sink = self.sink_stats()
        if sink:
            point["spool_messages"] = sink.get("spool_messages")
            point["kafka_lag_seconds"] = sink.get("lag_seconds")
            # seconds records have waited for the history table since the job's last commit
            # (the sink follows the commits with keep_until = "history"; else None)
            point["history_lag_seconds"] = sink.get("history_lag_seconds")
        self._last = (now, c)
        if self.topics is not None:
            self.topics.sample(now)
        if "in" in point:
            point["_ms"] = ms
            self.points.append(point)
        return point

    def series(self, since: float = 0.0) -> list[dict]:
        """Points after `since` (epoch seconds; a point's own "t" gives the points after it)."""
        since_ms = round(since * 1000)
        return [{k: v for k, v in p.items() if k != "_ms"} for p in self.points
                if p["_ms"] > since_ms]


def sink_stats(stats: dict | None) -> dict:
    """The sink's figures (its hook's stats(): Broker.hook_stats()["sink"]), the plain values
    only; {} without a sink (or when its stats failed)."""
    stats = stats or {}
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, bool, str)) or v is None}


def overview(view: BrokerView, io_bytes: Callable[[], tuple[int, int]]) -> dict:
    """Totals since the broker started (retained: clients' messages, without $SYS)."""
    st = view.stats()
    bytes_in, bytes_out = io_bytes()
    return {"connections": st["connections"], "sessions": st["sessions"],
            "subscriptions": st["subscriptions"], "retained": st["retained"],
            "retained_sys": st["retained_sys"],
            "received_by_qos": list(st["received_by_qos"]), "sent_by_qos": list(st["sent_by_qos"]),
            "dropped": dropped(st), "connections_total": st.get("connections_total", 0),
            "queued": st["queued"], "inflight": st["inflight"],
            "bytes_in": bytes_in, "bytes_out": bytes_out}


def client_json(rec: ClientRecord) -> dict:
    d = asdict(rec)
    d["connected_since"] = iso(rec.connected_since)
    d["subscriptions"] = [{"filter": s.filter, "qos": s.qos} for s in rec.subscriptions]
    return d


def clients(view: BrokerView, query: str = "", limit: int = 500) -> dict:
    """Connected clients, sorted by client id; ``query`` keeps ids containing it (any case)."""
    found, matched = view.clients(query, limit)
    st = view.stats()
    return {"clients": [client_json(r) for r in found], "matched": matched,
            "connected": st["connections"], "sessions": st["sessions"], "limit": limit}


def topics(view: BrokerView, counter: TopicCounter | None, filt: str = "#", limit: int = 2000) -> dict:
    """Topics with a retained message or recent traffic, matching filt, sorted by name."""
    retained = {r.topic: r for r in view.retained(filt, limit=1_000_000)[0]}
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
                                "at": iso(m.accepted_at) if m.accepted_at else None}
        out.append(item)
    return {"topics": out, "matched": len(names), "limit": limit,
            "counted_topics": len(counts), "max_counted_topics":
                counter.max_topics if counter is not None else 0}
