"""Live charts of a JSON field: (topic filter, field path) pairs the page asks for, fed by the
messages the broker accepts.

FieldCharts is a hook on ``on_message_accepted`` (attached while the dashboard runs). With no
chart asked for it does nothing per message; else it checks the topic against each chart's
filter and, when one matches, parses the payload once (at most ``max_payload_bytes``, else the
message is skipped and counted) and reads each matching chart's field. A payload that is not
JSON, or a field that is missing or not a number, is skipped and counted, never an error.
Bounds: at most ``max_charts`` pairs ([dashboard] max_field_charts); a chart nobody asked for in
``idle_seconds`` is dropped; each keeps ``keep`` points (one per sample: avg, min, max, count).
"""
from __future__ import annotations

import json
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Callable

from mqtt_topics import matches

from ..core.hooks import Hook
from .history import BadRequest, check_field, check_filter
from .live import iso

if TYPE_CHECKING:
    from ..core.message import Message

IDLE_SECONDS = 300.0


def field_steps(path: str) -> list[str | int]:
    """A checked field path (history.check_field) as keys and array indexes:
    ``a.b[2].c`` -> ["a", "b", 2, "c"]."""
    steps: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        if name:
            steps.append(name)
        if rest:
            steps.extend(int(i) for i in rest.rstrip("]").split("]["))
    return steps


def extract(doc: object, steps: list[str | int]) -> float | None:
    """The number at ``steps`` in a parsed JSON document, None when absent or not a finite
    number (true/false are not numbers here)."""
    for step in steps:
        if isinstance(step, int):
            if not isinstance(doc, list) or step >= len(doc):
                return None
        elif not isinstance(doc, dict) or step not in doc:
            return None
        doc = doc[step]  # type: ignore[index]  # checked above
    if isinstance(doc, bool) or not isinstance(doc, (int, float)):
        return None
    try:
        x = float(doc)
    except OverflowError:  # an integer beyond a double's range
        return None
    return x if math.isfinite(x) else None


class FieldChart:
    """One (filter, field) pair: the current sample's sums and the points so far."""

    def __init__(self, filt: str, field: str, keep: int, now: float) -> None:
        self.filter, self.field = filt, field
        self.steps = field_steps(field)
        self.points: deque = deque(maxlen=keep)  # [time, avg, min, max, n]
        self.asked = now
        self.n, self.sum, self.min, self.max = 0, 0.0, math.inf, -math.inf
        self.bad_json = 0      # matching payloads that are not JSON (UTF-8)
        self.too_large = 0     # matching payloads above max_payload_bytes
        self.missing = 0       # JSON payloads without the field as a number

    def add(self, x: float) -> None:
        self.n += 1
        self.sum += x
        self.min = min(self.min, x)
        self.max = max(self.max, x)

    def close(self, wall: float) -> None:
        if self.n:
            self.points.append([iso(wall), self.sum / self.n, self.min, self.max, self.n])
        self.n, self.sum, self.min, self.max = 0, 0.0, math.inf, -math.inf

    def answer(self, since: float = 0.0) -> dict:
        since_iso = iso(since) if since else ""
        return {"filter": self.filter, "field": self.field,
                "points": [p for p in self.points if p[0] > since_iso],  # ISO UTC sorts by time
                "skipped_bad_json": self.bad_json, "skipped_too_large": self.too_large,
                "missing_field": self.missing}


class FieldCharts(Hook):
    provides = frozenset({"on_message_accepted"})

    def __init__(self, max_charts: int, max_payload_bytes: int, keep: int,
                 idle_seconds: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_charts = max_charts
        self.max_payload_bytes = max_payload_bytes
        self.keep = keep
        self.idle_seconds = idle_seconds
        self.clock = clock
        self.charts: dict[tuple[str, str], FieldChart] = {}

    def watch(self, filt: str, field: str) -> FieldChart:
        """The chart of (filt, field), started when new; BadRequest when max_charts are
        charted and none has been idle for idle_seconds."""
        filt, field = check_filter(filt), check_field(field)
        now = self.clock()
        chart = self.charts.get((filt, field))
        if chart is None:
            self.drop_idle(now)
            if len(self.charts) >= self.max_charts:
                raise BadRequest(
                    f"the dashboard already charts {len(self.charts)} JSON fields live "
                    f"([dashboard] max_field_charts = {self.max_charts}): a chart nobody looks "
                    f"at ends after {self.idle_seconds:g} s; try again then, or raise the "
                    "setting")
            chart = self.charts[(filt, field)] = FieldChart(filt, field, self.keep, now)
        chart.asked = now
        return chart

    def drop_idle(self, now: float) -> None:
        for key in [k for k, c in self.charts.items() if now - c.asked > self.idle_seconds]:
            del self.charts[key]

    def on_message_accepted(self, msg: Message, client_id: str, username: str | None,
                            protocol: int) -> bool:
        if not self.charts:
            return True
        topic = msg.topic
        hit = [c for c in self.charts.values() if matches(c.filter, topic)]
        if not hit:
            return True
        payload = msg.payload
        if len(payload) > self.max_payload_bytes:
            for c in hit:
                c.too_large += 1
            return True
        try:
            doc = json.loads(bytes(payload))
        except (ValueError, RecursionError):  # not UTF-8 / not JSON / nested too deep
            for c in hit:
                c.bad_json += 1
            return True
        for c in hit:
            x = extract(doc, c.steps)
            if x is None:
                c.missing += 1
            else:
                c.add(x)
        return True

    def sample(self, wall: float) -> None:
        """Every sample: each chart's point of the messages since the previous one."""
        self.drop_idle(self.clock())
        for c in self.charts.values():
            c.close(wall)
