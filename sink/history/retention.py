"""Retention: whole ``date`` partitions older than ``[history] retention`` leave the table.

A day D expires once every row it can hold is older than the retention: when D's end (D + 1
day, UTC) is at most ``now - retention``. Its files are removed in one commit (manifest.py) and
deleted from disk after the table's delete delay. The job applies it with its compaction passes,
``python -m sink.maintain`` on demand; rows for an expired day that arrive later (a very late
replay) are not written at all.
"""
from __future__ import annotations

import datetime as dt
from typing import Callable

from settings.checks import duration_ms as parse_duration  # noqa: F401  ('400d' -> ms)
from sink.history.manifest import Change, Snapshot

DAY_MS = 86_400_000


def day_start_ms(date: str) -> int:
    d = dt.date.fromisoformat(date)
    return int(dt.datetime(d.year, d.month, d.day, tzinfo=dt.timezone.utc).timestamp() * 1000)


def first_kept_date(now_ms: int, retention_ms: int) -> dt.date:
    """The oldest day still inside the retention (days before it have expired)."""
    # a day whose end is <= cutoff has expired; the day holding the cutoff ends after it
    cutoff = now_ms - retention_ms
    return dt.datetime.fromtimestamp(cutoff / 1000, dt.timezone.utc).date()


def expired_dates(snap: Snapshot, now_ms: int, retention_ms: int | None) -> list[str]:
    if not retention_ms:
        return []
    cutoff = now_ms - retention_ms
    return sorted({f.date for f in snap.files if day_start_ms(f.date) + DAY_MS <= cutoff})


def retention_change(now_ms: int, retention_ms: int | None) -> Callable[[Snapshot], Change | None]:
    """A commit function for Table.commit: remove every file of the expired days (None: none)."""
    def change(base: Snapshot) -> Change | None:
        dates = set(expired_dates(base, now_ms, retention_ms))
        if not dates:
            return None
        return Change(op="retention", remove=[f.path for f in base.files if f.date in dates],
                      detail={"dates": sorted(dates)})
    return change
