"""Holes in Tansu's fetch answers under concurrent writers to one partition (kafka_client/gaps.py).

    .venv/bin/python bench/kafka_holes.py [--seconds 60] [--writers 3] [--busy 2] [--read-past]

Starts the embedded Kafka (Tansu), makes a one-partition topic and has `--writers` threads write
small batches to it at once (the cluster's BatchSender, a connection each), while one reader
(kafka_client.fetch.Fetcher, the cluster's and the replay's) follows the partition, fetching as
the cluster does. `--busy N` runs N busy loops beside it (the holes show on a loaded machine).
It prints how many records Kafka acknowledged, how many the reader got, the offsets it never got
and the holes it met (filled while asked again, read past); then it reads the partition again
from its start with kafka-python's consumer: every acknowledged record is in the log, in order.
`--read-past` is the reader before kafka_client/gaps.py (it read past a hole): the records it
never got are the ones a cluster node would not have delivered.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from kafka_client.fetch import Fetcher  # noqa: E402
from kafka_client.produce import BatchSender  # noqa: E402
from kafka_client.record import encode_body  # noqa: E402
from kafka_client.recordscan import Scanned  # noqa: E402

TOPIC = "holes.test"


def writer(bootstrap: str, i: int, acked: list[int], stop: threading.Event) -> None:
    sender = BatchSender({"bootstrap_servers": bootstrap.split(","), "client_id": f"writer{i}"})
    sender.pinned = {TOPIC: 0}
    n = 0
    while not stop.is_set():
        records = [(int(time.time() * 1000), encode_body(b"k", b"w%d-%d" % (i, n + j), []))
                   for j in range(1 + n % 3)]
        try:
            fut = sender.send({TOPIC: records})
        except Exception:  # not connected yet
            sender.poll(50)
            continue
        while not fut.poll():
            sender.poll(20)
        if fut.exception is None:
            n += len(records)
            acked[i] = n
    sender.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside it (0: none)")
    ap.add_argument("--read-past", action="store_true",
                    help="the reader without kafka_client/gaps.py: it reads past a hole")
    args = ap.parse_args()

    kafka = EmbeddedKafka(log_file="/tmp/kafka_holes_tansu.log").start()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        from kafka.admin import KafkaAdminClient, NewTopic
        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
        admin.close()
        stop, acked = threading.Event(), [0] * args.writers
        threads = [threading.Thread(target=writer, args=(kafka.bootstrap, i, acked, stop), daemon=True)
                   for i in range(args.writers)]
        for t in threads:
            t.start()
        decoder = (lambda raw, gap_from: Scanned(raw)) if args.read_past else Scanned
        f = Fetcher(kafka.bootstrap, {}, 5, decoder, create_topics=False)
        f.positions[(TOPIC, 0)] = 0
        got: set[int] = set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            for _, _, rec, start in f.fetch():
                got.update(rec.offsets[i] for i in rec.since(start).indexes())
        stop.set()
        for t in threads:
            t.join(5)
        upto = f.positions[(TOPIC, 0)]
        never = sorted(set(range(upto)) - got)
        print(f"{args.seconds:.0f} s, {args.writers} writers, {args.busy} busy loops, reader "
              f"{'reading past holes' if args.read_past else 'asking again for holes'}:")
        print(f"  acknowledged by Kafka: {sum(acked)} records; the reader got {len(got)} "
              f"(offsets 0..{upto - 1}); never got: {len(never)} {never[:10]}")
        print(f"  holes met: {f.gaps.filled} filled when asked again, {f.gaps.skipped} read past")

        from kafka import KafkaConsumer, TopicPartition
        c = KafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False, group_id=None)
        tp = TopicPartition(TOPIC, 0)
        c.assign([tp])
        c.seek(tp, 0)
        offsets: list[int] = []
        values: set[bytes] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and c.position(tp) < sum(acked):
            for rs in c.poll(timeout_ms=500).values():
                for r in rs:
                    offsets.append(r.offset)
                    values.add(r.value)
        c.close()
        contiguous = offsets == list(range(len(offsets)))
        print(f"  the log read again afterwards: {len(offsets)} records, {len(values)} distinct, "
              f"offsets {'contiguous' if contiguous else 'NOT contiguous'}")
    finally:
        for p in busy:
            p.kill()
        kafka.stop()


if __name__ == "__main__":
    main()
