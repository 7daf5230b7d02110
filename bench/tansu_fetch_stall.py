"""Partitions the embedded Kafka (Tansu, memory storage) answers empty while they hold records:
how long a reader stays stuck below a partition's end, by fetch wait and number of readers
(docs/cluster.md "Which Kafka keeps the cluster's state"; the reason `cluster.fetch_wait_ms` is 20).

    .venv/bin/python bench/tansu_fetch_stall.py [--seconds 20] [--waits 5,10,20,50]

As a cluster runs it: one topic of 8 partitions written by 4 producers (each a record to two
partitions and one to a 1-partition "control" topic, then a flush, 50 times a second), and
readers fetching every partition of both (kafka_client.fetch.Fetcher, as a node does). The first
reader is measured; the others only load Tansu as other nodes do. A "stuck answer" is a
partition answered with no record while its high watermark, in the same answer, is more than 5
records beyond the position asked; a stall is how long a partition stays so.

Found with bench/cluster_faults.py (2026-11-29): with the 5 ms wait, partitions of the messages
topic answered empty for 1-5 s while their end moved on, on every node, before any fault, so
delivery p99 was 3-11 s. A new connection fetching the partition from offset 0 got nothing
either, while Tansu acknowledged the producers' writes within 54 ms: the records were written
and Tansu's fetch did not see them. The cause inside Tansu was not pinned down (its memory
storage keeps the versions of objects it read in a 5 s cache, tansu-storage/src/dynostore/
metadata.rs, a likely place). Under this load Tansu serves each reader the same ~57 fetches a
second with a 5 ms wait as with 20: the shorter wait adds contention, not reads.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from kafka_client.fetch import Fetcher  # noqa: E402

PARTITIONS = 8
RATE = 50.0       # flushes a second per producer
PRODUCERS = 4


def run(wait_ms: int, readers: int, seconds: float) -> dict:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic
    k = EmbeddedKafka().start()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        KafkaAdminClient(bootstrap_servers=k.bootstrap).create_topics(
            [NewTopic("m", PARTITIONS, 1), NewTopic("c", 1, 1)])
        follow = {("c", 0): 0, **{("m", i): 0 for i in range(PARTITIONS)}}

        def produce(parts: list[int]) -> None:
            p = KafkaProducer(bootstrap_servers=k.bootstrap, linger_ms=0, acks=-1)
            due = time.monotonic()
            while not stop.is_set():
                for q in parts:
                    p.send("m", b"x" * 200, key=b"k", partition=q)
                p.send("c", b"y" * 300, key=b"c", partition=0)
                p.flush()
                due += 1 / RATE
                time.sleep(max(0.0, due - time.monotonic()))
            p.close()

        def load() -> None:  # another node's reader
            g = Fetcher(k.bootstrap, {}, wait_ms)
            g.positions = dict(follow)
            while not stop.is_set():
                g.fetch()
            g.close()

        threads = [threading.Thread(target=produce, args=([i, i + PRODUCERS],))
                   for i in range(PRODUCERS)]
        threads += [threading.Thread(target=load) for _ in range(readers - 1)]
        for t in threads:
            t.start()
        f = Fetcher(k.bootstrap, {}, wait_ms)
        f.positions = dict(follow)
        since: dict = {}
        stalls: list[float] = []
        fetches = stuck = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            before = dict(f.positions)
            f.fetch()
            fetches += 1
            now = time.monotonic()
            for tp, pos in f.positions.items():
                if pos == before[tp] and f.high.get(tp, 0) - pos > 5:
                    stuck += 1
                    since.setdefault(tp, now)
                elif tp in since:
                    stalls.append(now - since.pop(tp))
        stalls += [time.monotonic() - t0 for t0 in since.values()]
        f.close()
        return {"fetches": fetches, "stuck": stuck, "stalls": sorted(stalls)}
    finally:
        stop.set()
        for t in threads:
            t.join()
        k.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per row")
    ap.add_argument("--waits", default="5,10,20,50", help="fetch waits in ms, with 3 readers")
    a = ap.parse_args()
    logging.getLogger("kafka_client").setLevel(logging.ERROR)
    rows = [(5, 1)] + [(int(w), 3) for w in a.waits.split(",")]
    print("| fetch wait ms | readers | fetches/s (measured reader) | stuck answers | stalls | "
          "over 0.5 s | longest s |\n|---|---|---|---|---|---|---|", flush=True)
    for wait, readers in rows:
        r = run(wait, readers, a.seconds)
        s = r["stalls"]
        print(f"| {wait} | {readers} | {r['fetches'] / a.seconds:.0f} | {r['stuck']} | {len(s)} | "
              f"{sum(x > 0.5 for x in s)} | {s[-1] if s else 0:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
