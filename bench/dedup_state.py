"""How the history job's de-duplication cost grows with its state (not a test).

    .venv/bin/python bench/dedup_state.py [--window "24 hours"] [--rows-per-batch 200000]
                                          [--seconds 150]

The job drops duplicate message ids with Spark's dropDuplicatesWithinWatermark (RocksDB state,
the job's settings from sink/history/spark.py). This feeds it unique ids from Spark's
rate-micro-batch source (no Kafka, no Python: the operator alone) and prints, every 5th
batch, the ids held and the time the operator spends looking for ids to evict
(allRemovalsTimeMs, summed over tasks) - Spark scans the whole state for that on every
batch, so the figure grows with rate x window whatever the batch size.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sink.history.spark import get_spark  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", default="24 hours", help="the job's dedup_window")
    ap.add_argument("--rows-per-batch", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=150)
    a = ap.parse_args()
    spark = get_spark("dedup-state")
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", a.rows_per_batch).load()
          .selectExpr("concat('abcdef0123', hex(value)) AS message_id",
                      "current_timestamp() AS ingested_at")
          .withWatermark("ingested_at", a.window).dropDuplicatesWithinWatermark(["message_id"]))
    with tempfile.TemporaryDirectory(prefix="dedup-state-") as ck:
        q = (df.writeStream.format("noop").option("checkpointLocation", ck)
             .trigger(processingTime="0 seconds").start())
        seen, held, t = set(), 0, time.monotonic()
        print("| batch | ids held | batch ms | eviction scan ms (task time) | state commit ms |")
        print("|---|---|---|---|---|")
        try:
            while time.monotonic() - t < a.seconds and q.isActive:
                for p in q.recentProgress:
                    if p["batchId"] in seen:
                        continue
                    seen.add(p["batchId"])
                    so = p["stateOperators"][0] if p["stateOperators"] else {}
                    held += so.get("numRowsUpdated", 0) - so.get("numRowsRemoved", 0)
                    if p["batchId"] % 5 == 0:
                        print(f"| {p['batchId']} | {held:,} | {p['durationMs'].get('triggerExecution')} | "
                              f"{so.get('allRemovalsTimeMs')} | {so.get('commitTimeMs')} |", flush=True)
                time.sleep(0.5)
        finally:
            q.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
