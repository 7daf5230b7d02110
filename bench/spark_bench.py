"""Benchmark of the Spark history job (not a test).

    .venv/bin/python bench/spark_bench.py [--records 50000] [--payload-bytes 200]
                                          [--latency-samples 10] [--trigger-seconds 5]
                                          [--source python|auto] [--cpu-records 200000]
                                          [--batch-records 50000] [--only cpu]

0. CPU per record (the robust figure on a shared machine): --cpu-records records shaped like the
   forwarder's (64 B payload, 6 headers) pre-loaded into Kafka, then the running job reads them
   in micro-batches of --batch-records (25,000 msg/s x 2 s trigger = 50,000). CPU is read from
   /proc for the JVM, its Python workers and the driver process (utime+stime, children
   included) at the end of each batch; the figure spans the batches after the first two (a
   long-running job is warm): us/record, split JVM / Python, and per process kind. Also the
   CPU the job costs when idle.

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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from sink.history.job import Job, progress_since, start_query  # noqa: E402

TOPIC = "mqtt.messages"


def headers(i: int, run: str) -> list[tuple[str, bytes]]:
    return [("mqtt.message_id", f"{run}-{i:08d}".encode()), ("mqtt.client_id", f"dev-{i % 100}".encode()),
            ("mqtt.username", b"svc"), ("mqtt.qos", b"1"), ("mqtt.retain", b"0"),
            ("mqtt.protocol", b"5"), ("mqtt.content_type", b"application/json"),
            ("mqtt.user.site", b"plant-7"), ("mqtt.user.line", str(i % 4).encode())]


def forwarder_headers(i: int, run: str) -> list[tuple[str, bytes]]:
    """What the broker's forwarder writes for a QoS 1 MQTT 5 publish without properties."""
    return [("mqtt.message_id", f"{run}{i:x}".encode()), ("mqtt.client_id", f"pub-{i % 8}".encode()),
            ("mqtt.username", b"svc"), ("mqtt.qos", b"1"), ("mqtt.retain", b"0"),
            ("mqtt.protocol", b"5")]


def prefill(bootstrap: str, n: int, payload_bytes: int, run: str,
            forwarder_shape: bool = False) -> float:
    from kafka import KafkaProducer
    prod = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                         batch_size=256 * 1024)
    body = (b'{"v": 1, "pad": "' + b"x" * max(0, payload_bytes - 20) + b'"}')
    make = forwarder_headers if forwarder_shape else headers
    run = f"{int(time.time()):x}{os.getpid():08x}-" if forwarder_shape else run
    t = time.monotonic()
    for i in range(n):
        prod.send(TOPIC, key=f"devices/d{i % 100}/telemetry".encode(), value=body,
                  headers=make(i, run))
    prod.flush()
    prod.close()
    return time.monotonic() - t


# ---- CPU from /proc ------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _procs() -> dict[int, tuple[int, str, float]]:
    """pid -> (ppid, comm, cpu seconds incl. reaped children)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        f = s[s.rindex(")") + 2:].split()
        out[int(d)] = (int(f[1]), comm, sum(int(x) for x in f[11:15]) / _TICK)
    return out


def job_cpu(exclude: set[int], detail: dict | None = None) -> dict[str, float]:
    """CPU seconds of this process and its descendants (the JVM, Python workers), minus the
    ``exclude`` subtrees (Kafka), split by kind: {"jvm": s, "python": s}. ``detail`` gets
    {process kind: s} (the driver, each kind of Spark Python worker)."""
    procs = _procs()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out = {"jvm": 0.0, "python": 0.0}
    stack = [os.getpid()]
    while stack:
        pid = stack.pop()
        if pid in exclude or pid not in procs:
            continue
        _, comm, cpu = procs[pid]
        out["jvm" if comm == "java" else "python"] += cpu
        if detail is not None:
            kind = "jvm" if comm == "java" else "driver" if pid == os.getpid() else _kind(pid)
            detail[kind] = detail.get(kind, 0.0) + cpu
        stack += children.get(pid, [])
    return out


def _kind(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[-2].decode().rsplit(".", 1)[-1]
    except (OSError, IndexError):
        return f"?{pid}"


def cpu_per_record(spark, kafka, n: int, batch: int, source: str, work: Path,
                   payload: int = 64, skip: int = 2) -> None:
    """Steady state: the job runs (trigger 1 s) over a backlog of ``n`` records in micro-batches
    of ``batch``; CPU is counted from the end of batch ``skip`` (JVM warm, workers started) to
    the end of the last one."""
    exclude = {kafka.proc.pid}
    fill = prefill(kafka.bootstrap, n, payload, "cpu", forwarder_shape=True)
    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(work / "cpu"), trigger_seconds=1,
                    source=source, max_records_per_trigger=batch)
    query, used = start_query(spark, cfg)
    snaps, rows, deadline = {}, 0, time.monotonic() + 1800
    try:
        last = -1
        while rows < n and time.monotonic() < deadline and query.isActive:
            for p in progress_since(query, last)[-1:]:  # the JVM renders only new reports
                last = p["batchId"]
                if p["batchId"] not in snaps and p.get("numInputRows", 0):
                    detail: dict = {}
                    snaps[p["batchId"]] = (job_cpu(exclude, detail), detail, time.monotonic(), p)
                    rows += p["numInputRows"]
            time.sleep(0.1)
    finally:
        query.stop()
    ids = sorted(snaps)
    if len(ids) <= skip + 1:
        print(f"  not enough batches ({len(ids)}) for a steady-state figure", flush=True)
        return
    first, last = snaps[ids[skip]], snaps[ids[-1]]
    counted = [snaps[b][3] for b in ids[skip + 1:]]
    rows = sum(p["numInputRows"] for p in counted)
    jvm, py = last[0]["jvm"] - first[0]["jvm"], last[0]["python"] - first[0]["python"]
    per = 1e6 / max(rows, 1)
    print(f"  {rows} records in {len(counted)} batches of <= {batch} (prefill {fill:.1f}s), "
          f"source={used}: CPU {jvm + py:.1f}s = {(jvm + py) * per:.1f} us/record "
          f"(JVM {jvm * per:.1f}, Python {py * per:.1f}); "
          f"wall {last[2] - first[2]:.1f}s", flush=True)
    print("  by process (us/record): " +
          ", ".join(f"{k} {(last[1][k] - first[1].get(k, 0)) * per:.1f}"
                    for k in sorted(last[1])), flush=True)
    durs: dict[str, float] = {}
    for p in counted:
        for k, v in p.get("durationMs", {}).items():
            durs[k] = durs.get(k, 0) + v
    print("  query durations (ms per batch): " +
          ", ".join(f"{k} {v / len(counted):.0f}"
                    for k, v in sorted(durs.items(), key=lambda kv: -kv[1])), flush=True)
    files = list(Path(cfg.history.table).rglob("*.parquet"))
    print(f"  {len(files)} Parquet files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB",
          flush=True)


def idle_cpu(spark, kafka, trigger: float, source: str, work: Path, seconds: float = 30) -> None:
    """CPU the running job costs with nothing to read."""
    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(work / "cpu-idle"), source=source,
                    trigger_seconds=trigger, starting_offsets="latest")
    query, _ = start_query(spark, cfg)
    try:
        deadline = time.monotonic() + 120
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * trigger)
        exclude = {kafka.proc.pid}
        c0 = job_cpu(exclude)
        time.sleep(seconds)
        c1 = job_cpu(exclude)
    finally:
        query.stop()
    cpu = sum(c1.values()) - sum(c0.values())
    print(f"  idle, trigger {trigger:g}s: {cpu / seconds * 100:.1f}% of a core "
          f"({cpu * 1000 * trigger / seconds:.0f} ms CPU per trigger)", flush=True)


def throughput(spark, kafka, n: int, payload: int, source: str, label: str, work: Path) -> float:
    fill = prefill(kafka.bootstrap, n, payload, label)
    # Each run reads the whole topic into a new table: count what is in Kafka now.
    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(work / f"tp-{label}"),
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

    from sink.history.query import run_sql
    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(work / "latency"),
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
                if (Path(cfg.history.table) / "_spark_metadata").is_dir() and run_sql(
                        spark, cfg.history.table, f"SELECT 1 FROM messages WHERE message_id = '{mid}'"):
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
    ap.add_argument("--cpu-records", type=int, default=200_000)
    ap.add_argument("--batch-records", type=int, default=50_000,
                    help="records per micro-batch in the CPU run (default 50,000 = 25k/s x 2s)")
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--only", choices=("cpu", "throughput", "latency"), action="append",
                    help="run only these parts (repeatable; default all)")
    args = ap.parse_args()
    parts = set(args.only or ("cpu", "throughput", "latency"))

    from sink.history.spark import get_spark
    t = time.monotonic()
    spark = get_spark("mqtt-history-bench")
    print(f"SparkSession started in {time.monotonic() - t:.1f}s; cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp, EmbeddedKafka() as kafka:
        work = Path(tmp)
        if "cpu" in parts:
            print(f"CPU per record ({args.cpu_records} records, 64 B payload, 6 headers):",
                  flush=True)
            cpu_per_record(spark, kafka, args.cpu_records, args.batch_records, args.source, work)
            idle_cpu(spark, kafka, 2.0, args.source, work, args.idle_seconds)
        if parts == {"cpu"}:
            spark.stop()
            return 0
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
