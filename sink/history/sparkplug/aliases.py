"""Which metric an alias names: the last birth (NBIRTH, DBIRTH) of each edge node and device.

Sparkplug 3.0 (section 6.4.2): a birth gives each metric its name and, optionally, an alias;
later DATA (and CMD) messages may carry the alias alone. A birth replaces the map of its edge
node (NBIRTH) or device (DBIRTH) as a whole, from its place in the stream on: a rebirth with new
aliases makes the old ones unknown. An alias no birth defined resolves to nothing (the row keeps
the alias, its metric is NULL).

The map is kept by the job in memory and rebuilt at its start from the births in the table
(``from_births``): the table is what the job committed, batch by batch, so the map after a
restart is the one of the last committed batch, with no second file that a crash between two
writes could leave behind or ahead of the table.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Key = tuple[str, str, str | None]          # (group_id, edge_node_id, device_id or None)
Entry = tuple[str | None, int | None]    # (metric name, datatype code)


class Aliases:
    """alias maps per edge node / device. ``copy`` is cheap (a birth replaces a map, never
    changes one): a micro-batch works on a copy, kept only once the batch is committed."""

    def __init__(self, maps: dict[Key, dict[int, Entry]] | None = None) -> None:
        self.maps: dict[Key, dict[int, Entry]] = dict(maps or {})

    def copy(self) -> Aliases:
        return Aliases(self.maps)

    def of(self, key: Key) -> dict[int, Entry]:
        return self.maps.get(key) or {}

    def birth(self, key: Key, metrics: Iterable[tuple[str | None, int | None, int | None]]) -> None:
        """A birth of ``key`` with these (name, alias, datatype): its map from now on."""
        self.maps[key] = {alias: (name, datatype) for name, alias, datatype in metrics
                          if alias is not None}

    def __len__(self) -> int:
        return len(self.maps)

    @classmethod
    def from_births(cls, rows: Iterable[dict[str, Any]]) -> Aliases:
        """The maps of the last birth of each key among ``rows`` (rows of sparkplug_metrics with
        message_type NBIRTH/DBIRTH: group_id, edge_node_id, device_id, message_id,
        accepted_at, metric, alias, datatype code as ``datatype_code``; order does not matter:
        the last birth is the one accepted last, then the greatest message id)."""
        last: dict[Key, tuple[Any, str]] = {}
        metrics: dict[tuple[Key, str], list[tuple[str | None, int | None, int | None]]] = {}
        for r in rows:
            key = (r["group_id"], r["edge_node_id"], r["device_id"])
            order = (r["accepted_at"], r["message_id"])
            if key not in last or order > last[key]:
                last[key] = order
            metrics.setdefault((key, r["message_id"]), []).append(
                (r["metric"], r["alias"], r["datatype_code"]))
        out = cls()
        for key, (_, message_id) in last.items():
            out.birth(key, metrics[(key, message_id)])
        return out
