"""Sink throughput / latency benchmark (a script, not a test).

    .venv/bin/python bench/sink_bench.py [--records 30000] [--payload 200]
                                         [--modes spool-process,spool-thread,none-thread]

For each mode, against a real (embedded Tansu) Kafka:

1. burst: submit N records from an asyncio loop the way the broker does (batches of --batch
   submits, then await Sink.barrier()). Reports the event-loop cost of submit (us/record), the
   durable-ack rate (records/s acknowledged to publishers) and the rate at which they are
   acknowledged by Kafka (until forwarded == N), plus event-loop stalls while forwarding
   (p99/max overshoot of a 1 ms sleep: what the forwarder costs the broker's loop via the GIL).
2. latency: a steady --rate records/s for --seconds; a consumer in another process measures
   submit -> visible in Kafka (consume time - record timestamp) p50/p99/max.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from kafka_client.record import SinkRecord  # noqa: E402
from sink.forward.service import Sink  # noqa: E402


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def consumer_proc(bootstrap: str, topic: str, n: int, q, timeout: float, skip: int = 0) -> None:
    import logging
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    deadline = time.monotonic() + timeout
    parts = None
    while time.monotonic() < deadline and not parts:
        c.topics()
        parts = c.partitions_for_topic(topic)
        if not parts:
            time.sleep(0.05)
    c.assign([TopicPartition(topic, p) for p in sorted(parts or [])])
    c.seek_to_beginning()
    seen = 0
    while seen < skip and time.monotonic() < deadline:     # catch up with the burst phase first
        for _, recs in c.poll(100).items():
            seen += len(recs)
    q.put("ready")
    lags = []
    while len(lags) < n and time.monotonic() < deadline:
        for _, recs in c.poll(50).items():
            now = time.time() * 1000
            lags.extend(now - r.timestamp for r in recs if r.key.startswith(b"lat/"))
    c.close()
    q.put(lags)


async def loop_lag_probe(stop: asyncio.Event, out: list) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        out.append((time.perf_counter() - t - 0.001) * 1000)


def mkrec(i: int, payload: bytes, prefix: str = "bench") -> SinkRecord:
    return SinkRecord(topic=f"{prefix}/{i % 16}", payload=payload, qos=1, retain=False, client_id="bench",
                      username=None, protocol=5, accepted_at_ms=int(time.time() * 1000),
                      user_properties=[("k", "v")])


def run_mode(mode: str, args) -> dict:
    durability, fwd, *n = mode.split("-")  # e.g. spool-process-2: two sharded forwarders
    k = EmbeddedKafka().start()
    data = tempfile.mkdtemp(prefix="sinkbench-")
    s = Sink.from_config({"bootstrap_servers": k.bootstrap, "durability": durability, "forwarder": fwd,
                          "forwarders": int(n[0]) if n else 1,
                          "stats_interval": 0, "spool_max_bytes": 4 << 30,
                          "replay_window_seconds": 0}, data)
    s.start()
    payload = os.urandom(args.payload)
    res = {"mode": mode}
    try:
        # warm up: topic creation, producer connection
        s.submit(SinkRecord(topic="bench/warm", payload=b"x", qos=1, retain=False, client_id="b",
                            username=None, protocol=5, accepted_at_ms=int(time.time() * 1000)))
        t = time.monotonic()
        while s.stats()["forwarded"] < 1 and time.monotonic() - t < 30:
            time.sleep(0.05)
        base = s.stats()["forwarded"]

        async def burst():
            stop = asyncio.Event()
            lags: list = []
            probe = asyncio.create_task(loop_lag_probe(stop, lags))
            n = args.records
            submit_time = 0.0
            t0 = time.perf_counter()
            i = 0
            while i < n:
                ts = time.perf_counter()
                for _ in range(min(args.batch, n - i)):
                    if not s.submit(mkrec(i, payload)):
                        raise RuntimeError("spool full")
                    i += 1
                submit_time += time.perf_counter() - ts
                f = s.barrier()
                if f is not None:
                    await f
                await asyncio.sleep(0)
            t_acked = time.perf_counter() - t0
            while s.stats()["forwarded"] - base < n and time.perf_counter() - t0 < 300:
                await asyncio.sleep(0.01)
            t_fwd = time.perf_counter() - t0
            stop.set()
            await probe
            return n, submit_time, t_acked, t_fwd, lags

        n, submit_time, t_acked, t_fwd, lags = asyncio.run(burst())
        res.update(submit_us=submit_time / n * 1e6, acked_per_s=n / t_acked, kafka_per_s=n / t_fwd,
                   loop_stall_p99_ms=pct(lags, 99), loop_stall_max_ms=max(lags) if lags else float("nan"))

        # steady rate -> end-to-end latency (consumer in another process)
        total = int(args.rate * args.seconds)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        cp = ctx.Process(target=consumer_proc, args=(k.bootstrap, "mqtt.messages", total, q, 120, n + 1))
        cp.start()
        q.get(timeout=120)

        async def steady():
            interval = args.batch / args.rate
            t0 = time.perf_counter()
            i = 0
            while i < total:
                for _ in range(min(args.batch, total - i)):
                    s.submit(mkrec(i, payload, "lat"))
                    i += 1
                f = s.barrier()
                if f is not None:
                    await f
                delay = t0 + (i / args.batch) * interval - time.perf_counter()
                await asyncio.sleep(max(0, delay))

        asyncio.run(steady())
        lat = q.get(timeout=150)
        cp.join(10)
        res.update(e2e_p50_ms=pct(lat, 50), e2e_p99_ms=pct(lat, 99), e2e_max_ms=max(lat) if lat else float("nan"),
                   e2e_count=len(lat))
    finally:
        s.close()
        k.stop()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=30000)
    ap.add_argument("--payload", type=int, default=200)
    ap.add_argument("--batch", type=int, default=100, help="submits per barrier (one event-loop batch)")
    ap.add_argument("--rate", type=float, default=2000, help="records/s in the latency phase")
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--modes", default="spool-process,spool-thread,none-thread")
    args = ap.parse_args()
    print(f"sink bench: {args.records} records x {args.payload} B payload, batches of {args.batch}; "
          f"latency at {args.rate:.0f}/s for {args.seconds:.0f}s; cores={os.cpu_count()}")
    hdr = (f"{'mode':<14}{'submit us/rec':>14}{'acked rec/s':>13}{'kafka rec/s':>13}{'loop p99 ms':>13}"
           f"{'loop max ms':>13}{'e2e p50 ms':>12}{'e2e p99 ms':>12}{'e2e max ms':>12}")
    rows = []
    for mode in args.modes.split(","):
        r = run_mode(mode.strip(), args)
        rows.append(r)
        print(f"  done {mode}: {r}", flush=True)
    print()
    print(hdr)
    for r in rows:
        print(f"{r['mode']:<14}{r['submit_us']:>14.1f}{r['acked_per_s']:>13.0f}{r['kafka_per_s']:>13.0f}"
              f"{r['loop_stall_p99_ms']:>13.2f}{r['loop_stall_max_ms']:>13.2f}{r['e2e_p50_ms']:>12.1f}"
              f"{r['e2e_p99_ms']:>12.1f}{r['e2e_max_ms']:>12.1f}")


if __name__ == "__main__":
    main()
