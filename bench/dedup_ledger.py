"""Cost of the history job's de-duplication (sink/history/dedup.py) as its history grows (not a test).

    .venv/bin/python bench/dedup_ledger.py [--rows-per-batch 100000] [--batches 300]
                                           [--partitions 4] [--tasks 2] [--gaps-per-batch 2]

Runs what the job does per micro-batch, without Spark or Kafka: the planning side merges the
previous batch's task summaries into the ledger and writes it; each task parses the message
ids of its records (as Kafka gives them: the forwarder's "<prefix>-<hex>", spread over
partitions by key), drops those seen before, and writes its summary. Prints, every 10th
batch, the ids seen so far, the ledger's size and the CPU microseconds per record, which
should stay flat however many ids were seen (compare bench/dedup_state.py for Spark's
dropDuplicatesWithinWatermark, whose cost grows with the ids held).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sink.history.dedup import LedgerStore, TaskFilter, load_ledger, write_task_summary  # noqa: E402


def _columns(ids: list[bytes]) -> tuple:
    lengths = np.fromiter((len(i) for i in ids), np.int64, len(ids))
    starts = np.zeros(len(ids), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.frombuffer(b"".join(ids), np.uint8), starts, lengths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows-per-batch", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--gaps-per-batch", type=int, default=2, help="ids lost before Kafka")
    ap.add_argument("--replay-every", type=int, default=50,
                    help="every Nth batch also re-reads the previous batch (a Kafka restart)")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    prefix = b"6922a1b2c3d4e5f6-"
    n, seen, prev = 0, 0, []
    total_cpu, total_rows, dropped = 0.0, 0, 0
    print(f"{'batch':>6} {'ids seen':>12} {'intervals':>9} {'dropped':>8} {'us/record':>10}")
    with tempfile.TemporaryDirectory(prefix="dedup-ledger-") as d:
        store = LedgerStore(d)
        for b in range(a.batches):
            seq = np.arange(n + 1, n + 1 + a.rows_per_batch + a.gaps_per_batch)
            lost = rng.choice(len(seq), a.gaps_per_batch, replace=False)
            seq = np.delete(seq, lost)
            n += a.rows_per_batch + a.gaps_per_batch
            ids = [prefix + format(int(s), "x").encode() for s in seq]
            if a.replay_every and b and b % a.replay_every == 0:
                ids = prev + ids
            part = rng.integers(0, a.partitions, len(ids))  # the key's partition
            prev = ids
            t0 = time.process_time()
            ledger, bdir = store.prepare({"t": {"m": {"0": b}}}, {"t": {"m": {"0": b + 1}}}, b * 2000)
            for t in range(a.tasks):
                tf = TaskFilter(load_ledger(ledger))
                for p in range(t, a.partitions, a.tasks):
                    sel = np.flatnonzero(part == p)
                    for chunk in np.array_split(sel, max(1, len(sel) // 50_000)):
                        keep = tf.keep(*_columns([ids[i] for i in chunk]))
                        dropped += int((~keep).sum())
                write_task_summary(bdir, f"t{t}", tf.summary())
            cpu = time.process_time() - t0
            total_cpu += cpu
            total_rows += len(ids)
            seen += len(seq)
            if b % 10 == 9 or b == a.batches - 1:
                led = store._ledger_for(store._key) if store._key else None
                print(f"{b + 1:>6} {seen:>12,} {led.intervals() if led else 0:>9} {dropped:>8,} "
                      f"{cpu / len(ids) * 1e6:>10.2f}", flush=True)
    print(f"mean {total_cpu / total_rows * 1e6:.2f} us CPU per record over {total_rows:,} records "
          f"(id parsing, ledger lookups, summaries, ledger files; building the test ids excluded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
