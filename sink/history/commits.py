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

The broker deletes spooled records on the strength of this file, so it does not trust whoever
can write it: the job signs it (``"mac"``: HMAC-SHA256 of the rest, keyed by a key derived from
the broker's secret, settings/secrets.py) and the broker ignores, and warns about, a file whose
signature fails. The job also names its table (``"table"``), so a broker reading another
table's file can say so.

Written in the history job (sink/history/job/report.py); read in the forwarder
(sink/forward/commit_watch.py), the replay worker (sink/replay/tail.py) and by sink.query (which
job runs: the status file). A leaf module: it imports nothing from broker/ or from the rest of
sink/, so each of those processes imports only this of the job's side.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import time

FILE_NAME = "history_committed.json"
VERSION = 1
#: in the broker's data directory, one per table (job_file): which table the running job writes
#: and where it reports its commits ({"pid", "started_at", "table", "committed_file"}), so a
#: broker reading another committed file can say so. JOB_FILE is the name of before, one per data
#: directory, which two jobs on one data directory overwrote: still read.
JOB_FILE = "history_job.json"


def job_file(data_dir: str, table: str) -> str:
    """The status file of the job writing `table`, in the data directory:
    history_job.<the table's directory name>-<8 hex digits of its absolute path>.json."""
    import re
    where = os.path.abspath(table) if "://" not in table else table
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", where.rstrip("/").rsplit("/", 1)[-1])[:40] or "table"
    digest = hashlib.sha256(where.encode()).hexdigest()[:8]
    return os.path.join(data_dir, f"history_job.{name}-{digest}.json")


def running_jobs(data_dir: str) -> list[dict]:
    """Every job that said in the data directory which table it writes and still runs (the
    newest first)."""
    try:
        names = [n for n in os.listdir(data_dir)
                 if n.startswith("history_job.") and n.endswith(".json")]
    except OSError:
        return []
    found = [j for j in (running_job(os.path.join(data_dir, n), others=False) for n in names) if j]

    def started(info: dict) -> float:
        value = info.get("started_at")
        return float(value) if isinstance(value, (int, float)) else 0.0
    return sorted(found, key=started, reverse=True)


def committed_path(table: str, checkpoint: str | None = None) -> str:
    """Where the job writes the file: inside its checkpoint directory.

    Same default as the job's checkpoint (`<table>_checkpoint`), so the broker finds it from the
    same [history] settings. Only local paths work for the broker side.
    """
    ckpt = checkpoint or (table.rstrip("/") + "_checkpoint")
    if ckpt.startswith("file:"):
        ckpt = ckpt[len("file:"):]
    return os.path.join(ckpt, FILE_NAME)


def write_committed(path: str, batch_id: int, topics: dict[str, dict], key: bytes | None = None,
                    table: str | None = None) -> None:
    """Atomically replace the file. `topics`: {name: {"topic_id": str|None, "offsets": {p: n}}};
    `key`: the derived key that signs it (None: unsigned, which a broker with a key ignores)."""
    data = {"version": VERSION, "batch_id": int(batch_id), "written_at": time.time(),
            "topics": {t: {"topic_id": v.get("topic_id"),
                           "offsets": {str(p): int(n) for p, n in v.get("offsets", {}).items()}}
                       for t, v in topics.items()}}
    if table is not None:
        data["table"] = table
    if key is not None:
        data["mac"] = _mac(key, data)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, json.dumps(data, separators=(",", ":")).encode())


def _mac(key: bytes, data: dict) -> str:
    body = {k: v for k, v in data.items() if k != "mac"}
    return hmac.new(key, json.dumps(body, sort_keys=True, separators=(",", ":")).encode(),
                    hashlib.sha256).hexdigest()


def running_job(job_file: str | None, others: bool = True) -> dict | None:
    """What the history job said about itself in job_file (pid, started_at, table,
    committed_file as an absolute path), if that job still runs; else (others) a running job
    of another table that said so in the same directory (a broker then says it reads another
    table's commits), or None."""
    if not job_file:
        return None
    try:
        with open(job_file) as f:
            info = json.load(f)
        info["committed_file"] = os.path.abspath(info["committed_file"])
        if job_alive(info):
            return info
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    if others:
        jobs = running_jobs(os.path.dirname(job_file) or ".")
        return jobs[0] if jobs else None
    return None


def job_alive(info: dict) -> bool:
    try:
        os.kill(int(info["pid"]), 0)
    except PermissionError:
        return True                                   # running, as another user
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory (a rename in it survives a crash); nothing where that cannot be done."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], raw: bytes) -> None:
    """Replace the file at ``path`` with ``raw``: a temporary name, fsync, rename (readers see
    the old or the new content, never a mix)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_committed(path: str, key: bytes | None = None) -> dict | None:
    """The last committed state, or None when there is none yet (or it cannot be read).

    With `key`, ``state["signature"]`` says whether the file is signed with it: "ok", "unsigned"
    or "bad" (forged, or signed with another broker's key); without, "unchecked"."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None
    if key is None:
        data["signature"] = "unchecked"
    elif not isinstance(data.get("mac"), str):
        data["signature"] = "unsigned"
    else:
        data["signature"] = "ok" if hmac.compare_digest(data["mac"], _mac(key, data)) else "bad"
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
