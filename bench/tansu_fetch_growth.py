"""What a fetch costs the embedded Kafka (Tansu, memory storage) as a partition's log grows:
the time of a fetch of the newest record of a partition holding N records in few large batches,
then in many small ones, and of a small partition beside them (docs/cluster.md "Which Kafka
keeps the cluster's state").

    .venv/bin/python bench/tansu_fetch_growth.py [--records 100000]

Tansu's memory storage keeps every batch (no retention, no compaction) and a fetch's cost grows
with the number of batches in the partition fetched, not with their records: a cluster, which
writes a batch per partition per turn of each node, reads slower the longer it runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from kafka_client.fetch import Fetcher  # noqa: E402


def fetch_ms(f: Fetcher, tp: tuple[str, int], pos: int, n: int = 50) -> float:
    """The mean wall time of `n` fetches of `tp` from `pos` (the newest record), in ms."""
    t0 = time.perf_counter()
    for _ in range(n):
        f.positions = {tp: pos}
        f.fetch()
    return (time.perf_counter() - t0) / n * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000, help="records per partition")
    a = ap.parse_args()
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic
    k = EmbeddedKafka().start()
    try:
        KafkaAdminClient(bootstrap_servers=k.bootstrap).create_topics(
            [NewTopic(t, 1, 1) for t in ("few", "many", "small")])
        p = KafkaProducer(bootstrap_servers=k.bootstrap, linger_ms=0, batch_size=1 << 20)
        p.send("small", b"z", partition=0).get()
        f = Fetcher(k.bootstrap, {}, 5)
        print("| partition fetched | records | batches | fetch of its newest record, ms | "
              "of a 1-record partition beside it, ms |\n|---|---|---|---|---|")
        print(f"| (nothing else written) | 1 | 1 | {fetch_ms(f, ('small', 0), 0):.2f} | |", flush=True)
        for topic, per_batch in (("few", 1000), ("many", 10)):
            for _ in range(a.records // per_batch):
                for _ in range(per_batch):
                    p.send(topic, b"x" * 200, partition=0)
                p.flush()   # one batch
            print(f"| {topic} | {a.records:,} | {a.records // per_batch:,} | "
                  f"{fetch_ms(f, (topic, 0), a.records - 1):.2f} | "
                  f"{fetch_ms(f, ('small', 0), 0):.2f} |", flush=True)
        p.close()
    finally:
        k.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
