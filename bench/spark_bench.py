"""Benchmark of the Spark history job (not a test).

    .venv/bin/python bench/spark_bench.py [--records 50000] [--payload-bytes 200]
                                          [--latency-samples 10] [--trigger-seconds 5]
                                          [--source python|auto]

1. Throughput: pre-fill Kafka (embedded Tansu) with N records shaped like the forwarder's, run
   the job with --available-now and time it. Twice: a cold run (first query in the JVM: Python
   workers, codegen, RocksDB start) and a warm run (a second table, same JVM) - the warm figure is
   what a long-running job sustains.
2. Latency: the job running continuously at the trigger interval; records are produced one at a
   time and the time until each is visible through Spark (sink.query.run_sql) is measured.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sink.job import JobConfig, start_query  # noqa: E402
from sink.kafka_embedded import EmbeddedKafka  # noqa: E402

TOPIC = "mqtt.messages"


def headers(i: int, run: str) -> list[tuple[str, bytes]]:
    return [("mqtt.message_id", f"{run}-{i:08d}".encode()), ("mqtt.client_id", f"dev-{i % 100}".encode()),
            ("mqtt.username", b"svc"), ("mqtt.qos", b"1"), ("mqtt.retain", b"0"),
            ("mqtt.protocol", b"5"), ("mqtt.content_type", b"application/json"),
            ("mqtt.user.site", b"plant-7"), ("mqtt.user.line", str(i % 4).encode())]


def prefill(bootstrap: str, n: int, payload_bytes: int, run: str) -> float:
    from kafka import KafkaProducer
    prod = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                         batch_size=256 * 1024)
    body = (b'{"v": 1, "pad": "' + b"x" * max(0, payload_bytes - 20) + b'"}')
    t = time.monotonic()
    for i in range(n):
        prod.send(TOPIC, key=f"devices/d{i % 100}/telemetry".encode(), value=body,
                  headers=headers(i, run))
    prod.flush()
    prod.close()
    return time.monotonic() - t


def throughput(spark, kafka, n: int, payload: int, source: str, label: str, work: Path) -> float:
    fill = prefill(kafka.bootstrap, n, payload, label)
    # Each run reads the whole topic into a new table: count what is in Kafka now.
    cfg = JobConfig(bootstrap=kafka.bootstrap, table=str(work / f"tp-{label}"),
                    available_now=True, source=source)
    t = time.monotonic()
    query, used = start_query(spark, cfg)
    query.awaitTermination()
    elapsed = time.monotonic() - t
    rows = sum(p.get("numInputRows", 0) for p in query.recentProgress)
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress
               if p.get("numInputRows", 0)) / 1000.0
    print(f"  {label:5s}: {rows} records (prefill {n} in {fill:.1f}s) through source={used} in "
          f"{elapsed:.1f}s wall = {rows / elapsed:,.0f} rows/s "
          f"(data batches alone {busy:.1f}s = {rows / max(busy, 1e-9):,.0f} rows/s)", flush=True)
    return rows / elapsed


def latency(spark, kafka, samples: int, trigger: float, source: str, work: Path) -> list[float]:
    from kafka import KafkaProducer
    from sink.query import run_sql
    cfg = JobConfig(bootstrap=kafka.bootstrap, table=str(work / "latency"),
                    trigger_seconds=trigger, source=source, starting_offsets="latest")
    query, _ = start_query(spark, cfg)
    prod = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=0)
    try:
        # Wait for the first (empty) batch so the query is warm, as a long-running job is.
        deadline = time.monotonic() + 120
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.5)
        out = []
        for i in range(samples):
            mid = f"lat-{i:04d}"
            sent = time.monotonic()
            prod.send(TOPIC, key=b"devices/lat", value=b"{}",
                      headers=[("mqtt.message_id", mid.encode()), ("mqtt.client_id", b"lat"),
                               ("mqtt.qos", b"1"), ("mqtt.retain", b"0"), ("mqtt.protocol", b"5")]
                      ).get(30)
            while time.monotonic() - sent < 120:
                if (Path(cfg.table) / "_spark_metadata").is_dir() and run_sql(
                        spark, cfg.table, f"SELECT 1 FROM messages WHERE message_id = '{mid}'"):
                    break
                time.sleep(0.25)
            out.append(time.monotonic() - sent)
            print(f"  sample {i}: {out[-1]:.2f}s", flush=True)
            time.sleep((i % 3) * 0.9)  # land at different points of the trigger cycle
        return out
    finally:
        prod.close()
        query.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--payload-bytes", type=int, default=200)
    ap.add_argument("--latency-samples", type=int, default=10)
    ap.add_argument("--trigger-seconds", type=float, default=5.0, help="default: the job's default")
    ap.add_argument("--source", default="python", choices=("python", "auto", "kafka"))
    args = ap.parse_args()

    from sink.spark import get_spark
    t = time.monotonic()
    spark = get_spark("mqtt-history-bench")
    print(f"SparkSession started in {time.monotonic() - t:.1f}s; cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp, EmbeddedKafka() as kafka:
        work = Path(tmp)
        print(f"throughput ({args.records} records of ~{args.payload_bytes} B payload, 9 headers, "
              "available-now):", flush=True)
        throughput(spark, kafka, args.records, args.payload_bytes, args.source, "cold", work)
        # Warm run: same JVM; the topic now holds 2N records, all read into a new table.
        throughput(spark, kafka, args.records, args.payload_bytes, args.source, "warm", work)
        print(f"latency, produce -> row visible via Spark (trigger {args.trigger_seconds:g}s):",
              flush=True)
        lat = latency(spark, kafka, args.latency_samples, args.trigger_seconds, args.source, work)
        lat.sort()
        p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))]
        print(f"  median {statistics.median(lat):.2f}s, p95 {p95:.2f}s, min {lat[0]:.2f}s, "
              f"max {lat[-1]:.2f}s over {len(lat)} samples", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
