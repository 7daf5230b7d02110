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
    """alias maps per edge node / device, at most ``max_keys`` of them (``[history]
    sparkplug_max_nodes``: the least recently used is forgotten first; its next DATA keeps
    ``metric`` NULL until its next birth). ``copy`` is cheap (a birth replaces a map, never
    changes one): a micro-batch works on a copy, kept only once the batch is committed."""

    def __init__(self, maps: dict[Key, dict[int, Entry]] | None = None,
                 max_keys: int | None = None) -> None:
        self.maps: dict[Key, dict[int, Entry]] = dict(maps or {})   # oldest use first
        self.max_keys = max_keys
        self.forgotten = 0

    def copy(self) -> Aliases:
        return Aliases(self.maps, self.max_keys)

    def of(self, key: Key) -> dict[int, Entry]:
        m = self.maps.pop(key, None)
        if m is None:
            return {}
        self.maps[key] = m   # the most recently used now
        return m

    def birth(self, key: Key, metrics: Iterable[tuple[str | None, int | None, int | None]]) -> None:
        """A birth of ``key`` with these (name, alias, datatype): its map from now on."""
        self.maps.pop(key, None)
        self.maps[key] = {alias: (name, datatype) for name, alias, datatype in metrics
                          if alias is not None}
        if self.max_keys is not None:
            while len(self.maps) > self.max_keys:
                del self.maps[next(iter(self.maps))]
                self.forgotten += 1

    def __len__(self) -> int:
        return len(self.maps)

    @classmethod
    def from_births(cls, rows: Iterable[dict[str, Any]], max_keys: int | None = None) -> Aliases:
        """The maps of the last birth of each key among ``rows`` (rows of sparkplug_metrics with
        message_type NBIRTH/DBIRTH: group_id, edge_node_id, device_id, message_id,
        accepted_at, metric, alias, datatype code as ``datatype_code``; order does not matter:
        the last birth is the one accepted last, then the greatest message id). With
        ``max_keys``, the keys born most recently."""
        last: dict[Key, tuple[Any, str]] = {}
        metrics: dict[tuple[Key, str], list[tuple[str | None, int | None, int | None]]] = {}
        for r in rows:
            key = (r["group_id"], r["edge_node_id"], r["device_id"])
            order = (r["accepted_at"], r["message_id"])
            if key not in last or order > last[key]:
                last[key] = order
            metrics.setdefault((key, r["message_id"]), []).append(
                (r["metric"], r["alias"], r["datatype_code"]))
        out = cls(max_keys=max_keys)
        for key, (_, message_id) in sorted(last.items(), key=lambda kv: kv[1]):
            out.birth(key, metrics[(key, message_id)])
        out.forgotten = 0
        return out
