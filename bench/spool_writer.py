"""The spool writer's cost per record at a steady rate (not a test).

    .venv/bin/python bench/spool_writer.py [--rate 25000] [--seconds 10] [--group-commit-ms 0,2]

Appends 120-byte records the way the broker does (every 1 ms the records of that millisecond,
then a kick), with fdatasync on (durability "spool"), in a temporary directory, and prints the
writer's fdatasync count per second and the process's CPU per record (user + system), for each
group-commit interval given (sink/forward/spool.py GROUP_COMMIT_SECONDS).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sink.forward.spool import SpoolWriter  # noqa: E402


def run(rate: int, seconds: float, group_commit: float) -> tuple:
    with tempfile.TemporaryDirectory(prefix="spool-bench-", dir=os.environ.get("SPOOL_DIR")) as d:
        w = SpoolWriter(d, fsync=True, group_commit=group_commit).open()
        payload = b"x" * 120
        t0 = time.monotonic()
        c0 = os.times()
        sent, tick = 0, 0
        while True:
            tick += 1
            due = t0 + tick / 1000
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            if due - t0 >= seconds:
                break
            n = int(rate * (due - t0)) - sent
            for _ in range(n):
                w.append(payload)
            sent += n
            w.kick()
        while w.durable_seq < sent - 1:
            time.sleep(0.001)
        c1 = os.times()
        batches = w.batches
        w.close()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        return sent, batches / seconds, cpu / sent * 1e6, (c1.system - c0.system) / sent * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=25_000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--group-commit-ms", default="0,2")
    a = ap.parse_args()
    print(f"{'group commit':>12} {'records':>9} {'syncs/s':>8} {'CPU us/rec':>10} {'of which sys':>12}")
    for ms in [float(x) for x in a.group_commit_ms.split(",")]:
        sent, syncs, cpu, sys_ = run(a.rate, a.seconds, ms / 1000)
        print(f"{ms:>10g}ms {sent:>9,} {syncs:>8.0f} {cpu:>10.2f} {sys_:>12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
