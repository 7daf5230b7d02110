"""Log lines about clients: what a client chose is escaped and shortened, and the number of
lines clients can cause is bounded, per connection and in all.

A client chooses its client id, user name, topics and the text of the errors it provokes.
Written raw, a newline in a client id forges log lines, and 300 connections with 65,000-character
ids and one bad packet each wrote 18.6 MiB of log in a second. So every line about a client
goes through `ClientLog.line()` (Connection.note() for a connection):

- every argument is shown with `shown()`: control characters (C0, DEL, C1), line and paragraph
  separators and other unprintable characters as \\xNN / \\uNNNN escapes, at most SHOWN_CHARS
  characters kept and the rest counted ("...(+64,800 chars)");
- a connection writes at most PER_CONNECTION_BURST lines, then one per PER_CONNECTION_INTERVAL
  seconds; all clients together at most `lines_per_second` (mqtt.client_log_lines_per_second) on
  average, in bursts of up to BURST_SECONDS of it. Lines over either bound are counted and one
  WARNING every SUMMARY_INTERVAL seconds (from `tick()`) says how many were left out.

Sans-I/O: time comes from the broker's clock.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

SHOWN_CHARS = 200            # characters of one client-chosen string kept in a log line
PER_CONNECTION_BURST = 10    # lines one connection may log at once...
PER_CONNECTION_INTERVAL = 6.0  # ...then one per this many seconds (10 a minute)
BURST_SECONDS = 10.0         # all clients: bursts of up to this many seconds' worth of lines
SUMMARY_INTERVAL = 10.0      # seconds between the WARNINGs counting suppressed lines

log = logging.getLogger(__name__)


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` as text safe for one log line: unprintable characters escaped, at most `limit`
    characters of it kept."""
    s = value if isinstance(value, str) else str(value)
    if len(s) <= limit and s.isprintable():
        return s  # the common case: nothing to change
    more = len(s) - limit
    if more > 0:
        s = s[:limit]
    s = "".join(c if c.isprintable() else _escape(c) for c in s)
    return f"{s}...(+{more:,} chars)" if more > 0 else s


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


class Gcra:
    """A rate limit kept in one number (the generic cell rate algorithm): `at` is when the
    bucket is full again; a line is allowed while that is at most `burst - 1` intervals ahead."""
    __slots__ = ("interval", "slack")

    def __init__(self, per_second: float, burst: float):
        self.interval = 1.0 / per_second
        self.slack = self.interval * (burst - 1)

    def next(self, at: float, now: float) -> float | None:
        """The new `at` when a line is allowed now, else None."""
        if at - now > self.slack + 1e-9:  # (sums of float intervals)
            return None
        return (at if at > now else now) + self.interval


PER_CONNECTION = Gcra(1.0 / PER_CONNECTION_INTERVAL, PER_CONNECTION_BURST)


class ClientLog:
    """The log lines of one broker about its clients (see the module docstring)."""
    __slots__ = ("clock", "all", "at", "suppressed", "summary_at")

    def __init__(self, clock: Callable[[], float], lines_per_second: float = 20.0) -> None:
        self.clock = clock
        self.all = Gcra(lines_per_second, max(1.0, lines_per_second * BURST_SECONDS)) \
            if lines_per_second else None
        self.at = 0.0
        self.suppressed = 0       # lines left out since the last summary
        self.summary_at = clock()

    def line(self, logger: logging.Logger, level: int, conn: Any, fmt: str, *args: object) -> bool:
        """Log `fmt % args` (each argument through shown()) to `logger` unless `conn` (anything
        with a `log_at` attribute, or None) or all clients together used their share; True if
        written."""
        if not logger.isEnabledFor(level):
            return False
        now = self.clock()
        mine = PER_CONNECTION.next(conn.log_at, now) if conn is not None else now
        every = self.at if self.all is None else self.all.next(self.at, now)
        if mine is None or every is None:
            self.suppressed += 1
            return False
        if conn is not None:
            conn.log_at = mine
        self.at = every
        logger.log(level, fmt, *[a if a is None or isinstance(a, (int, float)) else shown(a)
                                 for a in args])
        return True

    def tick(self, now: float) -> None:
        """Once a second (Broker.tick): the summary of suppressed lines, when there are some."""
        if self.suppressed and now - self.summary_at >= SUMMARY_INTERVAL:
            log.warning("%d log lines about clients left out in the last %.0f s (at most %d per "
                        "connection, then one per %.0f s; all clients at most %s a second: "
                        "mqtt.client_log_lines_per_second)", self.suppressed,
                        now - self.summary_at, PER_CONNECTION_BURST, PER_CONNECTION_INTERVAL,
                        f"{1 / self.all.interval:g}" if self.all else "any number")
            self.suppressed = 0
            self.summary_at = now
        elif not self.suppressed:
            self.summary_at = now
