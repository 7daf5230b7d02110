"""The syntax of a history replay subscription (docs/history.md "Replay over MQTT"). Sans-I/O.

    $replay/<from>[..<to>]/<topic filter>

<from> and <to> are each one of:

    2024-05-01T10:00:00Z      ISO 8601, UTC ("Z", or no zone at all); fractions of a second,
    2024-05-01T10:00Z         minutes only, or a "-hh:mm" offset work too ("+hh:mm" does not:
    2024-05-01                '+' is the MQTT wildcard, so a filter holding it is not valid)
    1714557600                Unix time in seconds (a fraction allowed: 1714557600.250)
    -90s -30m -2h -7d -1w     so long before the SUBSCRIBE (a decimal allowed: -1.5h)

Without ``..<to>`` the replay continues with the live messages of the filter; with it, it
stops at <to> (a <to> in the future: live messages until then). The filter is an ordinary
topic filter (wildcards allowed), not a $share/ or another $replay/ one.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from broker.core.hooks import REPLAY_PREFIX
from mqtt_topics import valid_topic_filter

UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_AGO = re.compile(r"-(\d+(?:\.\d+)?)([smhdw])")
_EPOCH = re.compile(r"\d+(?:\.\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(T.*)?")
# the times a replay can name: up to the end of year 9999 (the last a date, and so the replay's
# marker, can show; a later one is refused); one before 1970 means the epoch (nothing is older)
MIN_MS = 0
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
EXAMPLE = "$replay/2024-05-01T10:00:00Z/sensors/#, $replay/-1h/sensors/# or " \
          "$replay/-2h..-1h/sensors/+/temp"


class BadReplay(ValueError):
    """A replay filter that does not follow the syntax: the message says what and how."""


@dataclass(frozen=True)
class ReplaySpec:
    filter: str              # the topic filter whose history is replayed
    since_ms: int            # from this accept time (ms since the epoch), included
    until_ms: int | None     # to this one, excluded; None: on to the live messages


def parse_time(text: str, now_ms: int) -> int:
    """One <from> or <to>: ms since the epoch. BadReplay when it is none of the forms, or a time
    after 9999 (or a number too large to be one); one before 1970 is the epoch."""
    try:
        ms = _parse_time(text, now_ms)
    except (ValueError, OverflowError):  # an inf or a date out of datetime's range
        ms = None
    if ms is None:
        raise BadReplay(f"'{_short(text)}' is not a time: give an ISO 8601 time in UTC "
                        "(2024-05-01T10:00:00Z or 2024-05-01), Unix seconds (1714557600) or a "
                        "time ago (-90s, -30m, -2h, -7d, -1w)")
    if ms > MAX_MS:
        raise BadReplay(f"'{_short(text)}' is after 9999-12-31, the last time a replay can "
                        "start or end at")
    return max(ms, MIN_MS)


def _parse_time(text: str, now_ms: int) -> int | None:
    m = _AGO.fullmatch(text)
    if m:
        return now_ms - round(float(m.group(1)) * UNITS_MS[m.group(2)])
    if _EPOCH.fullmatch(text):
        return round(float(text) * 1000)
    if _DATE.fullmatch(text):
        t = dt.datetime.fromisoformat(text)
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return round(t.timestamp() * 1000)
    return None


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:40]}..."


def parse(filt: str, now_ms: int) -> ReplaySpec:
    """A SUBSCRIBE's "$replay/..." filter; relative times count back from ``now_ms``."""
    if not filt.startswith(REPLAY_PREFIX):
        raise BadReplay(f"a replay filter starts with {REPLAY_PREFIX}")
    when, sep, topic_filter = filt[len(REPLAY_PREFIX):].partition("/")
    if not sep or not topic_filter or not when:
        raise BadReplay(f"'{filt}' names no time or no topic filter: write {EXAMPLE}")
    start, dots, end = when.partition("..")
    since = parse_time(start, now_ms)
    until = parse_time(end, now_ms) if dots and end else None
    if until is not None and until <= since:
        raise BadReplay(f"'{when}': the end of the time range is not after its start")
    if topic_filter.startswith(("$share/", REPLAY_PREFIX)):
        raise BadReplay(f"'{topic_filter}': a replay's topic filter is neither a shared "
                        "subscription nor another replay")
    if not valid_topic_filter(filt):
        raise BadReplay(f"'{filt}' is not a valid topic filter ('+' and '#' take a whole level: "
                        "write a time zone as Z or -hh:mm, not +hh:mm)")
    return ReplaySpec(topic_filter, since, until)
