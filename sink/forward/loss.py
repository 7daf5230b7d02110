"""Noticing that Kafka lost data (the embedded Tansu restarted empty, a topic re-created).

Detected, not assumed: a partition's offset that goes back in a produce acknowledgement, or a
topic id that changes in the metadata. Both are kept in the forwarder's checkpoint (``state``),
so a restarted forwarder notices a Kafka that lost data while it was down. What to do about it
(the refill, sink/forward/forwarder.py) is not decided here: each check returns why data was lost,
or None.
"""
from __future__ import annotations

from typing import Any


class LossDetector:
    """The topic ids and the last offset per partition this forwarder wrote."""

    def __init__(self, kafka_state: dict | None = None) -> None:
        st = kafka_state or {}
        # topic -> id ("" unknown): a new id means the topic was re-created
        self.topic_ids: dict[str, str] = dict(st.get("topic_ids") or {})
        # "topic/partition" -> last offset written: an acknowledgement below it means Kafka lost it
        self.offsets: dict[str, int] = {k: int(v) for k, v in (st.get("offsets") or {}).items()}
        self.ids_valid_after = 0.0   # metadata refreshed before this (ms, monotonic) holds stale ids

    def state(self) -> dict:
        """What the checkpoint keeps (loaded back by the constructor)."""
        return {"topic_ids": self.topic_ids, "offsets": self.offsets}

    def acknowledged(self, answer: dict, counts: dict, metadata: Any) -> tuple[dict, str | None, bool]:
        """A chunk's acknowledgement: answer (topic, partition) -> base offset, counts (topic,
        partition) -> records written. -> the offset after the chunk per (topic, partition), why
        Kafka lost data (an offset went back; None: it did not), and whether a topic's id is still
        unknown (metadata, the producer's cluster metadata, did not name it: ask for an update)."""
        offsets = self.offsets
        ids = self.topic_ids
        after = {}
        lost = None
        unknown = False
        for (topic, part), base in answer.items():
            tp = f"{topic}/{part}"
            last = offsets.get(tp)
            if last is not None and base <= last and lost is None:
                lost = f"offset of {tp} went back from {last} to {base}"
            n = counts[(topic, part)]
            offsets[tp] = base + n - 1
            after[(topic, part)] = base + n
            if not ids.get(topic):
                tid = metadata.topic_id(topic) if metadata is not None and hasattr(metadata, "topic_id") else None
                ids[topic] = str(tid) if tid else ""
                unknown = unknown or not tid
        return after, lost, unknown

    def ids_of(self, after: dict) -> dict:
        """The topic ids (None: unknown) of a chunk's topics, as acknowledged now."""
        return {t: self.topic_ids.get(t) or None for t, _ in after}

    def check_ids(self, metadata: Any) -> str | None:
        """Compare the topic ids of fresh metadata with those known. -> why Kafka lost data (a
        topic was re-created) or None; unknown ids are learnt."""
        if metadata is None or not hasattr(metadata, "topic_id"):
            return None
        if getattr(metadata, "_last_successful_refresh_ms", 0) < self.ids_valid_after:
            return None                 # ids cached from before the last refill: wait for fresh ones
        lost = None
        for t, known in list(self.topic_ids.items()):
            try:
                cur = metadata.topic_id(t)
            except Exception:
                return lost
            if cur is None:
                continue
            cur = str(cur)
            if not known:
                self.topic_ids[t] = cur
            elif cur != known:
                self.topic_ids[t] = cur
                lost = lost or f"topic {t} was re-created (topic id {known} -> {cur})"
        return lost

    def names_every_topic(self, metadata: Any) -> bool:
        """Metadata names an id for every topic written (a topic the restarted Kafka has not
        re-created yet has none)."""
        return all(metadata.topic_id(t) for t in self.topic_ids if hasattr(metadata, "topic_id"))

    def restart(self, metadata: Any, refreshed_ms: float) -> None:
        """Kafka lost data and is written again from scratch: its ids from now on are those of
        metadata; offsets start again (nothing written yet to compare with)."""
        for t in self.topic_ids:
            tid = metadata.topic_id(t) if hasattr(metadata, "topic_id") else None
            self.topic_ids[t] = str(tid) if tid else ""
        self.ids_valid_after = refreshed_ms

    def forget_offsets(self) -> None:
        self.offsets = {}
