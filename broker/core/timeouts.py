"""The open connections, filed by when each must next be looked at: its CONNECT deadline
(mqtt.connect_timeout), then one and a half times its Keep Alive after the last packet it sent
[MQTT-3.1.2-22].

Broker.tick() (once a second) looks only at the connections whose time has come, instead of at
every open connection (100,000 idle devices with a 60 s Keep Alive: each looked at about once
every 90 s, not 90 times). A connection is filed again only when it is looked at (a packet read
costs nothing here: it moves `last_rx`), and leaves when it closes. Times are kept in tenths of
a second, so a connection is looked at within 0.1 s (plus the tick's period) of its deadline.

The table is also the broker's set of open connections: len(), iteration and `in`.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import Connection

NEVER = -1  # the slot of connections with no deadline (Keep Alive 0, a password being checked)
SLOTS_PER_SECOND = 10


class ConnectionTable:
    __slots__ = ("slots", "due_at", "count")

    def __init__(self) -> None:
        self.slots: dict[int, dict[Connection, None]] = {}  # tenth of a second (or NEVER) -> {connection: None}
        self.due_at: list[int] = []       # heap of the slots' times (each pushed once)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[Connection]:
        """Every open connection (a snapshot: they may close meanwhile)."""
        return iter([c for slot in self.slots.values() for c in slot])

    def __contains__(self, conn: Connection) -> bool:
        slot = self.slots.get(conn.check_at)  # type: ignore[arg-type]  # (None: filed nowhere)
        return slot is not None and conn in slot

    def file(self, conn: Connection, deadline: float | None) -> None:
        """Put conn (new, or moved) in the slot of `deadline` (a clock time; None: no deadline)."""
        at = NEVER if deadline is None else int(deadline * SLOTS_PER_SECOND) + 1
        old = conn.check_at
        if old == at:
            return
        slots = self.slots
        if old is None:
            self.count += 1
        else:
            del slots[old][conn]
        slot = slots.get(at)
        if slot is None:
            slot = slots[at] = {}
            if at != NEVER:
                heapq.heappush(self.due_at, at)
        slot[conn] = None
        conn.check_at = at

    def remove(self, conn: Connection) -> None:
        at = conn.check_at
        if at is not None:
            del self.slots[at][conn]
            conn.check_at = None
            self.count -= 1

    def due(self, now: float) -> list[Connection]:
        """The connections whose deadline has come, taken out of the table: the caller files
        again those that stay open."""
        out: list[Connection] = []
        due_at, slots = self.due_at, self.slots
        limit = now * SLOTS_PER_SECOND
        while due_at and due_at[0] <= limit:
            slot = slots.pop(heapq.heappop(due_at))
            for conn in slot:
                conn.check_at = None
            out.extend(slot)
        self.count -= len(out)
        return out
