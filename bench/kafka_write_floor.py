"""What one acknowledged Kafka write costs here, with nothing else running: the floor under the
cluster's QoS 1 path (docs/cluster.md "QoS 1 throughput on one node").

    .venv/bin/python bench/kafka_write_floor.py [--records 200000] [--batches 16,64,256,1024,4096]

Starts an embedded Kafka (Tansu) and writes `--records` records of a cluster message's size
(a 14-byte key, 64-byte payload, one header) to one partition through the cluster's own writer
(kafka_client/produce.py BatchSender: one ProduceRequest at a time, acks=all, waiting for each
answer), in requests of each of `--batches` records. Prints per batch size: records/s, the CPU
per record of Tansu and of this client (from /proc), and the time per request.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import schedstat_s  # noqa: E402  (beside this script)

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from kafka_client.produce import BatchSender, NotReady  # noqa: E402
from kafka_client.record import encode_body  # noqa: E402


def cpu_seconds(pid: int) -> float:
    return schedstat_s(pid) or 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="records per batch size")
    ap.add_argument("--batches", default="16,64,256,1024,4096", help="records per request")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kafka-floor-")
    kafka = EmbeddedKafka(log_file=os.path.join(tmp, "tansu.log")).start()
    sender = BatchSender({"bootstrap_servers": [kafka.bootstrap]}, create_topics=True)
    try:
        if not sender.partitions_for("floor", wait_ms=5000):
            raise SystemExit("Kafka did not create the topic")
        sender.pinned["floor"] = 0
        body = encode_body(b"sensors/1/temp", b"x" * 64, [("mid", b"n1-1-123456")])
        print("| records per request | records/s | Tansu us/record | client us/record | ms per request |")
        print("|---|---|---|---|---|")
        for size in (int(b) for b in a.batches.split(",")):
            records = [(int(time.time() * 1000), body)] * size
            k0, c0, t0 = cpu_seconds(kafka.proc.pid), cpu_seconds(os.getpid()), time.monotonic()
            done = 0
            while done < a.records:
                while True:
                    try:
                        fut = sender.send({"floor": records})
                        break
                    except NotReady:
                        sender.poll(50)
                while not fut.poll():
                    sender.poll(50)
                if fut.exception is not None:
                    raise SystemExit(f"Kafka refused the records: {fut.exception}")
                done += size
            wall = time.monotonic() - t0
            print(f"| {size:,} | {done / wall:,.0f} | {1e6 * (cpu_seconds(kafka.proc.pid) - k0) / done:.2f} "
                  f"| {1e6 * (cpu_seconds(os.getpid()) - c0) / done:.2f} | {1e3 * wall / (done / size):.2f} |")
    finally:
        sender.close()
        kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
