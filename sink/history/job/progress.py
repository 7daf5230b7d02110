"""The query's progress: its reports (batches, rows, backlog) and the offsets each committed
micro-batch ends at (the checkpoint's commit log)."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sink.history.paths import local as _local

StreamingQuery = Any   # pyspark's (pyspark is imported only where Spark runs)


def _offsets(value: Any) -> dict[str, int]:
    """{"topic-p": offset} from either source's offset JSON."""
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, dict) and "t" in value and isinstance(value["t"], dict):
        value = value["t"]  # sink.history.source format
    out = {}
    for topic, parts in (value or {}).items():
        if isinstance(parts, dict):
            for p, off in parts.items():
                if isinstance(off, int):
                    out[f"{topic}-{p}"] = off
    return out


def backlog(progress: dict) -> int | None:
    """Records in Kafka not yet processed, from a StreamingQueryProgress dict."""
    total, known = 0, False
    for src in progress.get("sources", []):
        end, latest = _offsets(src.get("endOffset")), _offsets(src.get("latestOffset"))
        if latest:
            known = True
            total += sum(max(0, off - end.get(k, 0)) for k, off in latest.items())
    return total if known else None


def describe_progress(p: dict) -> str:
    rows = p.get("numInputRows", 0)
    lag = backlog(p)
    dur = p.get("durationMs", {}).get("triggerExecution")
    return (f"batch {p.get('batchId')}: {rows} rows, "
            f"{p.get('processedRowsPerSecond', 0.0) or 0.0:.0f} rows/s processed, "
            f"{p.get('inputRowsPerSecond', 0.0) or 0.0:.0f} rows/s arriving, "
            f"took {dur if dur is not None else '?'} ms, "
            f"backlog {lag if lag is not None else 'unknown'} records")


# ---- what the table has committed (sink/history/commits.py: read by the broker's spool) -------------

def committed_offsets(end_offsets: Iterable[object]) -> dict[str, dict[str, Any]]:
    """{kafka_topic: {"topic_id", "offsets": {partition: next offset}}} from the end offsets of
    a committed micro-batch: one JSON (str or dict) per source, either sink.history.source's
    ({"t": {topic: {p: n}}, "ids": {topic: id}}) or Spark's Kafka connector's ({topic: {p: n}},
    which carries no topic id: null)."""
    out: dict[str, dict] = {}
    for value in end_offsets:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        if not isinstance(value, dict):
            continue
        ids = value.get("ids", {}) if "t" in value else {}
        for topic, parts in (value["t"] if "t" in value else value).items():
            if isinstance(parts, dict):
                out[topic] = {"topic_id": ids.get(topic) or None,
                              "offsets": {int(p): int(n) for p, n in parts.items()
                                          if isinstance(n, int) and n >= 0}}
    return out


def committed_from_checkpoint(checkpoint: str) -> tuple[int, dict] | None:
    """(batch id, offsets) of the last batch in the checkpoint's commit log, or None."""
    root = _local(checkpoint)
    try:
        batches = [int(f.name) for f in (root / "commits").iterdir() if f.name.isdigit()]
        if not batches:
            return None
        lines = (root / "offsets" / str(max(batches))).read_text().splitlines()
    except (OSError, ValueError):
        return None
    # offsets/N: "v1", the batch metadata, then one line per source
    return max(batches), committed_offsets([ln for ln in lines[2:] if ln.strip()])


def progress_since(query: StreamingQuery, after: int) -> list[dict[str, Any]]:
    """The query's progress reports with a batchId above ``after``, oldest first, as dicts.
    PySpark's ``recentProgress`` renders every retained report (up to 100) as JSON on each call;
    this walks the JVM's list from the newest back and renders only the new ones."""
    jsq = getattr(query, "_jsq", None)
    if jsq is None:  # Spark Connect's StreamingQuery
        return [p for p in query.recentProgress if p.get("batchId", -1) > after]
    reports = jsq.recentProgress()
    out = []
    for i in range(len(reports) - 1, -1, -1):
        jp = reports[i]
        if jp.batchId() <= after:
            break
        out.append(json.loads(jp.json()))
    out.reverse()
    return out
