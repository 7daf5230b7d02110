"""Soak: the whole stack (broker with its sink and embedded Kafka, keep_until = "history", the
history job, the dashboard) at a steady rate for a long time, with clients connecting and leaving.

    .venv/bin/python bench/soak.py --rate 3000 --minutes 30

Started as scripts/run.sh starts them (free ports, data in a temporary directory). Load: 8 QoS 1
publishers paced to --rate and one subscriber of everything (bench/pipeline.py's), plus a client
that every --churn-seconds connects, subscribes, publishes 10 QoS 1 messages and leaves. Every
30 s it prints the resident memory (RSS) of every process: broker, forwarder(s), Tansu, the job's
driver, its JVM and its Python workers (summed as "job"). At the end: the accepted messages
against the table's rows and distinct ids (each accepted message in the table once), and each
process's growth per 10 minutes after the warm-up (--warmup-minutes), which should stay under 1%.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from loadgen import Client, connect, make_payload, publish_packet, subscribe_packet  # noqa: E402
from pipeline import TableCounter, cmdline, descendants, offer, wait_port  # noqa: E402

from kafka_client.embedded import free_port  # noqa: E402

PY = sys.executable


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Churner(Client):
    """Connects, subscribes, publishes 10 QoS 1 messages, then leaves."""

    def __init__(self, cid: str):
        super().__init__(cid)
        self.acks = 0
        self.done = asyncio.get_running_loop().create_future()

    def on_release(self, pid):
        if pid < 2:  # packet id 1 is the SUBSCRIBE's
            return
        self.acks += 1
        if self.acks >= 10 and not self.done.done():
            self.done.set_result(None)


async def churn(host: str, port: int, every: float, stop: threading.Event, counts: dict):
    loop = asyncio.get_running_loop()
    n = 0
    while not stop.is_set():
        n += 1
        try:
            c = await connect(loop, lambda: Churner(f"churn-{n}"), host, port)
            c.transport.write(subscribe_packet(1, f"churn/{n}/#", 1))
            c.transport.write(b"".join(publish_packet(f"churn/{n}/x", make_payload(i), 1, i + 2)
                                       for i in range(10)))
            await asyncio.wait_for(c.done, 30)
            counts["accepted"] += c.acks
            c.transport.close()
            counts["sessions"] += 1
        except Exception as exc:  # reported, the soak goes on
            counts["errors"] += 1
            counts["last_error"] = repr(exc)
        await asyncio.sleep(every)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--warmup-minutes", type=float, default=5)
    ap.add_argument("--churn-seconds", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="soak-")
    env = {**os.environ, "PYTHONPATH": ROOT}
    port, kport, dport, cport = free_port(), free_port(), free_port(), free_port()
    table = os.path.join(work, "history")
    logs = {n: open(os.path.join(work, f"{n}.log"), "wb") for n in ("broker", "job")}
    broker = subprocess.Popen(
        [PY, "-m", "broker", "--port", str(port), "--data-dir", os.path.join(work, "data"),
         "--sink", "--set", "sink.keep_until=history", "--set", f"sink.embedded_port={kport}",
         "--set", f"sink.committed_file={table}_checkpoint/history_committed.json",
         "--set", "dashboard.enabled=true", "--set", f"dashboard.port={dport}",
         "--set", f"dashboard.connect_url=sc://127.0.0.1:{cport}", "--log-level", "WARNING"],
        cwd=ROOT, env=env, stdout=logs["broker"], stderr=subprocess.STDOUT, start_new_session=True)
    job = subprocess.Popen(
        [PY, "-m", "sink.job", "--kafka-bootstrap", f"127.0.0.1:{kport}", "--table", table,
         "--connect-port", str(cport)],
        cwd=ROOT, env=env, stdout=logs["job"], stderr=subprocess.STDOUT, start_new_session=True)
    samples: list[tuple[float, dict]] = []
    try:
        wait_port(port)
        t0 = time.monotonic()
        while "history job started" not in open(os.path.join(work, "job.log"),
                                                errors="replace").read():
            if job.poll() is not None or time.monotonic() - t0 > 600:
                print("the job did not start; see", work)
                return 1
            time.sleep(1)

        def processes() -> dict[str, list[int]]:
            kids = descendants(broker.pid)
            return {"broker": [broker.pid],
                    "forwarder": [p for p in kids if "sink.forward.forwarder" in cmdline(p)],
                    "tansu": [p for p in kids if "tansu" in cmdline(p)],
                    "job": [job.pid] + descendants(job.pid)}

        stop = threading.Event()
        counts = {"accepted": 0, "sessions": 0, "errors": 0}
        start = time.monotonic()

        def sampler():
            while True:
                snap = {k: sum(rss(p) for p in v) for k, v in processes().items()}
                samples.append((time.monotonic() - start, snap))
                print(f"{(time.monotonic() - start) / 60:6.1f} min  " + "  ".join(
                    f"{k} {v / 2**20:7.1f} MB" for k, v in snap.items()), flush=True)
                if stop.wait(30):
                    return
        th = threading.Thread(target=sampler, daemon=True)
        th.start()

        async def load():
            churner = asyncio.ensure_future(churn("127.0.0.1", port, a.churn_seconds, stop,
                                                  counts))
            res, _ = await offer("127.0.0.1", port, a.rate, a.minutes * 60, 8, 200)
            stop.set()
            await churner
            return res
        res = asyncio.run(load())
        accepted = res["accepted"] + counts["accepted"]
        counter = TableCounter(table)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and counter.count() < accepted:
            time.sleep(2)
        th.join(35)
        from sink.history.manifest import Table
        from sink.history.spark import get_spark
        spark = get_spark("soak-check", log_level="ERROR")
        from sink.history.schema import HISTORY_SCHEMA
        r = spark.read.schema(HISTORY_SCHEMA).parquet(table).selectExpr(
            "count(*) AS n", "count(DISTINCT message_id) AS ids").collect()[0]
        spark.stop()
        print(f"\naccepted {accepted} (paced {res['accepted']}, churn {counts['accepted']} in "
              f"{counts['sessions']} sessions, {counts['errors']} errors); table {r.n} rows, "
              f"{r.ids} distinct ids ({Table(table).snapshot().id} versions, "
              f"{len(Table(table).snapshot().files)} live files)")
        warm = [(t, s) for t, s in samples if t >= a.warmup_minutes * 60]
        if len(warm) >= 2:
            (t1, s1), (t2, s2) = warm[0], warm[-1]
            for k in s1:
                growth = (s2[k] - s1[k]) / max(s1[k], 1) * 100 / max((t2 - t1) / 600, 1e-9)
                print(f"  {k}: {s1[k] / 2**20:.1f} -> {s2[k] / 2**20:.1f} MB after the warm-up: "
                      f"{growth:+.2f}% per 10 minutes")
        return 0 if r.n == r.ids == accepted else 1
    finally:
        for p in (job, broker):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        for f in logs.values():
            f.close()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work directory:", work)


if __name__ == "__main__":
    sys.exit(main())
