"""What the history table has committed: the contract between the Spark job and the spool.

The history job writes this file after every micro-batch it has committed to the table; the
broker-side spool/forwarder reads it and keeps every record until the table holds it, so an
embedded Kafka that restarts empty (Tansu keeps topics in memory) loses nothing: records not yet
covered here are sent again.

File (JSON, replaced atomically: written to a temporary name, fsynced, renamed):

    {"version": 1,
     "batch_id": 41,                 # the job's last committed micro-batch
     "written_at": 1763800000.123,   # wall clock, seconds
     "topics": {"mqtt.messages": {"topic_id": "<Kafka topic id or null>",
                                  "offsets": {"0": 120000}}}}   # partition -> next offset

`offsets[p] = n` means every record of that partition with offset < n is in the table.
`topic_id` tells one incarnation of a topic from the next (a restarted Tansu gives a new id and
starts offsets at 0 again): offsets are only comparable under the same topic id.

A leaf module: it imports nothing from broker/ or from the rest of sink/.
"""
from __future__ import annotations

import json
import os
import time

FILE_NAME = "history_committed.json"
VERSION = 1


def committed_path(table: str, checkpoint: str | None = None) -> str:
    """Where the job writes the file: inside its checkpoint directory.

    Same default as the job's checkpoint (`<table>_checkpoint`), so the broker finds it from the
    same [history] settings. Only local paths work for the broker side.
    """
    ckpt = checkpoint or (table.rstrip("/") + "_checkpoint")
    if ckpt.startswith("file:"):
        ckpt = ckpt[len("file:"):]
    return os.path.join(ckpt, FILE_NAME)


def write_committed(path: str, batch_id: int, topics: dict[str, dict]) -> None:
    """Atomically replace the file. `topics`: {name: {"topic_id": str|None, "offsets": {p: n}}}."""
    data = {"version": VERSION, "batch_id": int(batch_id), "written_at": time.time(),
            "topics": {t: {"topic_id": v.get("topic_id"),
                           "offsets": {str(p): int(n) for p, n in v.get("offsets", {}).items()}}
                       for t, v in topics.items()}}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, json.dumps(data, separators=(",", ":")).encode())


def atomic_write(path: str, raw: bytes) -> None:
    """Replace the file at ``path`` with ``raw``: a temporary name, fsync, rename (readers see
    the old or the new content, never a mix)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_committed(path: str) -> dict | None:
    """The last committed state, or None when there is none yet (or it cannot be read)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None
    topics = {}
    for name, v in (data.get("topics") or {}).items():
        try:
            topics[name] = {"topic_id": v.get("topic_id"),
                            "offsets": {int(p): int(n) for p, n in v.get("offsets", {}).items()}}
        except (AttributeError, TypeError, ValueError):
            return None
    data["topics"] = topics
    return data


def is_committed(state: dict | None, topic: str, topic_id: str | None, partition: int,
                 offset: int) -> bool:
    """Whether the record at (topic, partition, offset) of that topic incarnation is in the table."""
    if state is None:
        return False
    t = state["topics"].get(topic)
    if t is None or t["topic_id"] != topic_id:
        return False
    return offset < t["offsets"].get(partition, 0)
