"""A micro-batch's Sparkplug B messages -> rows of ``sparkplug_metrics`` (pure Python).

Messages are taken in the order the broker accepted them (the caller sorts them); a birth
replaces its edge node's or device's alias map before the next message is decoded. A payload
that is not Sparkplug B is counted in ``Decoded.malformed`` (with why), never raised: the
message stays in ``messages`` like any other.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from sink.history.sparkplug.aliases import Aliases
from sink.history.sparkplug.decode import BIRTHS, TYPE_NAMES, Malformed, parse, parse_topic, to_json

#: the columns of a row, in the table's order (``value`` is JSON text here, VARIANT in the table)
COLUMNS = ("group_id", "message_type", "edge_node_id", "device_id", "metric", "alias", "datatype",
           "value_json", "metric_timestamp", "seq", "message_id", "topic", "accepted_at")
_UTC = dt.timezone.utc


@dataclass
class Decoded:
    rows: list[tuple] = field(default_factory=list)
    messages: int = 0                    # Sparkplug B messages decoded (malformed ones not)
    malformed: list[tuple[str, str, str]] = field(default_factory=list)   # (message_id, topic, why)


def _time(ms: int | None) -> dt.datetime | None:
    if ms is None:
        return None
    try:
        return dt.datetime.fromtimestamp(ms / 1000, _UTC)
    except (OverflowError, OSError, ValueError):
        return None   # a timestamp no TIMESTAMP holds: NULL rather than the batch failing


def decode_batch(messages: Iterable[tuple[str, str, bytes | None, dt.datetime]],
                 aliases: Aliases) -> Decoded:
    """(message_id, topic, payload, accepted_at) in accepted order -> rows; ``aliases`` is
    updated by the births met (pass a copy to keep the original)."""
    out = Decoded()
    for message_id, topic, payload, accepted_at in messages:
        t = parse_topic(topic)
        if t is None:
            continue
        known = aliases.of(t.key)
        try:
            p = parse(payload, known)
        except Malformed as exc:
            out.malformed.append((message_id, topic, str(exc)))
            continue
        out.messages += 1
        birth = t.message_type in BIRTHS
        for m in p.metrics:
            name, datatype = m.name, m.datatype
            if m.alias is not None and (name is None or datatype is None) and not birth:
                was_name, was_type = known.get(m.alias) or (None, None)
                name = name if name is not None else was_name
                datatype = datatype if datatype is not None else was_type
            out.rows.append((t.group_id, t.message_type, t.edge_node_id, t.device_id, name,
                             m.alias, None if datatype is None else TYPE_NAMES.get(datatype, str(datatype)),
                             to_json(m.value), _time(m.timestamp), p.seq, message_id, topic,
                             accepted_at))
        if birth:
            aliases.birth(t.key, ((m.name, m.alias, m.datatype) for m in p.metrics))
    return out
