#!/usr/bin/env python3
"""Peak memory of a replay's table reading (what sink/replay/worker.py does before Kafka) for a
topic filter over a generated hour of history.

An hour of --mib MiB of payload (incompressible, --payload bytes each, on --topics topics
"dev/<n>/t") is written as the history job would (one Parquet file, one row group, committed
through the table's log). Then, in a fresh process each, the table part of a replay is read
(sink.history.reader.read_history with the worker's columns, its rows turned into frames'
items) for each filter given, and the process's peak RSS (VmHWM) is printed, with the
messages found and the time taken.

    PYTHONPATH=. .venv/bin/python bench/replay_memory.py                       # 60 MiB hour
    PYTHONPATH=. .venv/bin/python bench/replay_memory.py --filters 'nomatch/#,dev/+/t'
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOUR = int(dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone.utc).timestamp() * 1000)


def generate(table_dir: Path, mib: int, payload: int, topics: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sink.history.manifest import Change, FileEntry, Table
    n = mib * (1 << 20) // payload
    t = Table(table_dir)
    rel = "date=2024-05-01/bench-h10.parquet"
    path = t.abs(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    rnd = os.urandom(payload * n)  # each payload its own bytes: nothing to compress
    up = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
    cols = {
        "message_id": pa.array([f"bench-{i:x}" for i in range(n)], pa.string()),
        "topic": pa.array([f"dev/{i % topics}/t" for i in range(n)], pa.string()),
        "payload": pa.array([rnd[i * payload:(i + 1) * payload] for i in range(n)], pa.binary()),
        "qos": pa.array([1] * n, pa.int32()),
        "retain": pa.array([False] * n, pa.bool_()),
        "client_id": pa.array(["dev"] * n, pa.string()),
        "accepted_at": pa.array([(HOUR + i * 3_600_000 // n) * 1000 for i in range(n)],
                                pa.timestamp("us")),
        "kafka_partition": pa.array([0] * n, pa.int32()),
        "kafka_offset": pa.array(range(n), pa.int64()),
        "payload_format": pa.array([None] * n, pa.int32()),
        "content_type": pa.array([None] * n, pa.string()),
        "response_topic": pa.array([None] * n, pa.string()),
        "correlation_data": pa.array([None] * n, pa.binary()),
        "message_expiry": pa.array([None] * n, pa.int64()),
        "user_properties": pa.array([[]] * n, up),
    }
    pq.write_table(pa.table(cols), path, row_group_size=n)   # Spark: one large row group
    t.commit(Change("append", add=[FileEntry(rel, "2024-05-01", 10, path.stat().st_size, n)]))
    return n


def child(table: str, filt: str, settings: str) -> None:
    """The table part of a replay, as the worker reads it; prints one JSON line."""
    import time

    from sink.history.reader import read_history
    from sink.replay import worker  # noqa: F401  (the worker's imports, for a fair baseline)
    from sink.replay.records import TABLE_COLUMNS, from_rows
    kw = json.loads(settings)
    t0 = time.perf_counter()
    n = 0
    for batch in read_history(table, filt, HOUR - 1000, None, columns=TABLE_COLUMNS, **kw):
        n += len(from_rows(batch))
    print(json.dumps({"messages": n, "seconds": round(time.perf_counter() - t0, 2),
                      "peak_rss_mib": round(peak_rss_kib() / 1024, 1)}))


def peak_rss_kib() -> int:
    """This process's peak RSS since its exec (VmHWM; ru_maxrss would start from the parent's,
    Linux keeping it across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=60)
    ap.add_argument("--payload", type=int, default=1000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--filters", default="nomatch/#,+/nomatch,dev/7/t,dev/+/t")
    ap.add_argument("--settings", default="{}", help="read_history keyword arguments (JSON)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "history"
        n = generate(table, args.mib, args.payload, args.topics)
        base = subprocess.run([sys.executable, "-c", "import pyarrow.parquet, pyarrow.compute; "
                               "import sink.replay.worker, sink.history.reader; import sys; "
                               "sys.path.insert(0, 'bench'); import replay_memory as r; "
                               "print(r.peak_rss_kib())"], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(f"the worker's modules with pyarrow imported, nothing read: "
              f"{int(base.stdout.split()[-1]) / 1024:.1f} MiB")
        print(f"one hour: {n:,} messages of {args.payload} bytes on {args.topics} topics "
              f"({args.mib} MiB of payload, one row group)")
        for filt in args.filters.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", str(table), filt,
                                  args.settings], capture_output=True, text=True, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
            if out.returncode:
                print(f"{filt:<16} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{filt:<16} {r['messages']:>9,} messages  peak RSS {r['peak_rss_mib']:>7.1f} MiB"
                  f"  {r['seconds']:>6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
