"""Forwarder-only CPU benchmark (a script, not a test): spool -> forwarder process -> real Tansu.

    .venv/bin/python bench/forwarder_bench.py [--records 200000] [--payload 200] [--topics 50]
        [--rate 0] [--runs 3] [--code DIR ...]

A spool is filled with --records entries (the bytes the broker writes: kafka_client.record.encode_message)
and one ``python -m sink.forward.forwarder`` process (the default deployment) forwards them to a fresh
embedded Tansu. With --rate R > 0 the spool starts empty and the bench appends R records/s
(notifying the forwarder like the Sink does), so the forwarder runs at that offered load instead
of as fast as it can.

Reported: the forwarder process's CPU seconds (utime + stime from /proc/<pid>/stat) per record
forwarded, measured between the first status with records forwarded and the one reaching
--records (start-up, imports and the Kafka connection are left out), and the rate. CPU per
record is what to compare on a loaded machine; wall-clock rates are noisy.

--stub-kafka replaces Kafka by a stub that acknowledges every request at once (in the forwarder
process, which runs the unchanged Forwarder.run): what is left is the forwarder's own work per
record (spool reads, grouping, RecordBatch building, bookkeeping), with far less noise than
with Tansu competing for the same cores.

--code DIR (repeatable) runs the forwarder from another checkout (e.g. one made with
``git archive <commit> sink mqtt_topics | tar -x -C DIR``); runs alternate between the
checkouts to spread the machine's load evenly.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from kafka_client.record import encode_message  # noqa: E402
from settings import SinkConfig  # noqa: E402
from sink.forward.spool import SpoolWriter  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK      # utime, stime


def entries(n: int, payload: int, topics: int, start: int = 0):
    body = b"x" * payload
    now = int(time.time() * 1000)
    for i in range(start, start + n):
        yield encode_message("mqtt.messages", f"bench/{i % topics}", body, 1, False, f"c{i % 100}",
                             None, 5, now, f"id-{i}")


# The forwarder process with --stub-kafka: Forwarder.run() from the checkout on sys.path, with
# produce.BatchSender replaced by a stub acknowledging each request at once; the RecordBatches are
# still built (kafka_client.record.build_batch), as the real sender does.
STUB = r"""
import inspect, json, sys, time
from sink.forward import forwarder as fw
from kafka_client.record import body_key, build_batch
spool, n = sys.argv[1], int(sys.argv[2])

class Done:
    exception = None
    def __init__(self, value, counts):
        self.value, self.counts = value, counts
    def poll(self):
        return True

class Stub:
    cluster = None
    def __init__(self, cfg):
        self.next = {}
    def send(self, groups):
        value, counts = {}, {}
        for topic, recs in groups.items():
            build_batch(recs)
            tp = (topic, 0)
            value[tp], counts[tp] = self.next.get(tp, 0), len(recs)
            self.next[tp] = value[tp] + len(recs)
        return Done(value, counts)
    def poll(self, ms=0): pass
    def maybe_refresh(self): pass
    def partitions_for(self, topic, wait_ms=0): return {0}
    def close(self): pass

fw.BatchSender = Stub
ctl = fw.ThreadControl()
t = {}
def publish(st):
    if st["forwarded"] and "t0" not in t:
        t["t0"], t["w0"], t["n0"] = time.process_time(), time.monotonic(), st["forwarded"]
    if st["forwarded"] >= n and "t1" not in t:
        t["t1"], t["w1"], t["n1"] = time.process_time(), time.monotonic(), st["forwarded"]
        ctl.command("stop")
source = fw.SpoolSource(spool, 1 << 30)
if hasattr(fw, "Runtime") and "rt" in inspect.signature(fw.Forwarder).parameters:
    from settings import SinkConfig   # the [sink] defaults, as the process gets them
    f = fw.Forwarder(SinkConfig(), fw.Runtime(spool_dir=spool, data_dir="", bootstrap="stub:0"), source, ctl,
                     publish, status_interval=0.02)
else:                                 # a checkout from before the Forwarder took its [sink] section
    f = fw.Forwarder(source, ctl, publish, "stub:0", status_interval=0.02)
f.run()
print(json.dumps({"us_per_msg": (t["t1"] - t["t0"]) / (t["n1"] - t["n0"]) * 1e6,
                  "rate": (t["n1"] - t["n0"]) / (t["w1"] - t["w0"])}))
"""


def run_stub(code: str, args) -> dict:
    d = tempfile.mkdtemp(prefix="fwdbench-")
    spool = os.path.join(d, "spool")
    w = SpoolWriter(spool, fsync=False).open()
    for e in entries(args.records, args.payload, args.topics):
        w.append(e)
    w.flush(120)
    w.close()
    try:
        out = subprocess.run([sys.executable, "-c", STUB, spool, str(args.records)], env=dict(
            os.environ, PYTHONPATH=code), cwd=code, capture_output=True, timeout=args.timeout, check=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return json.loads(out.stdout.splitlines()[-1])


def run_once(code: str, args) -> dict:
    if args.stub_kafka:
        return run_stub(code, args)
    d = tempfile.mkdtemp(prefix="fwdbench-")
    spool = os.path.join(d, "spool")
    k = EmbeddedKafka().start()
    w = SpoolWriter(spool, fsync=False).open()
    if args.rate <= 0:
        for e in entries(args.records, args.payload, args.topics):
            w.append(e)
        w.flush(120)
    env = dict(os.environ, PYTHONPATH=code)
    proc = subprocess.Popen([sys.executable, "-m", "sink.forward.forwarder"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, cwd=code)
    setup = {"sink": SinkConfig().to_table(),     # the [sink] defaults, as the broker sends them
             "runtime": dict(spool_dir=spool, data_dir="", bootstrap=k.bootstrap, log_level=40)}
    proc.stdin.write(json.dumps(setup).encode() + b"\n")
    proc.stdin.flush()
    stop = threading.Event()

    def writer() -> None:         # offered load: append at --rate, notify like the Sink does
        sent, t0 = 0, time.monotonic()
        while sent < args.records and not stop.is_set():
            due = min(args.records, int((time.monotonic() - t0) * args.rate))
            if due > sent:
                for e in entries(due - sent, args.payload, args.topics, sent):
                    w.append(e)
                w.flush(10)
                sent = due
                try:
                    proc.stdin.write(b"n")
                    proc.stdin.flush()
                except OSError:
                    return
            time.sleep(0.002)

    first = last = None
    started = args.rate <= 0
    deadline = time.monotonic() + args.timeout
    try:
        for line in proc.stdout:
            st = json.loads(line)
            if not started and st.get("kafka_up"):   # offer the load once the forwarder is connected
                started = True
                threading.Thread(target=writer, daemon=True).start()
            n = st.get("forwarded", 0)
            if n and first is None:
                first = (n, cpu_seconds(proc.pid), time.monotonic())
            if n >= args.records:
                last = (n, cpu_seconds(proc.pid), time.monotonic())
                break
            if time.monotonic() > deadline:
                break
    finally:
        stop.set()
        proc.stdin.write(b"q")
        proc.stdin.close()
        proc.wait(30)
        w.close()
        k.stop()
        shutil.rmtree(d, ignore_errors=True)
    if first is None or last is None or last[0] == first[0]:
        raise SystemExit(f"forwarder did not finish ({first}, {last})")
    n = last[0] - first[0]
    return dict(us_per_msg=(last[1] - first[1]) / n * 1e6, rate=n / (last[2] - first[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--payload", type=int, default=200)
    ap.add_argument("--topics", type=int, default=50)
    ap.add_argument("--rate", type=float, default=0, help="offered records/s (0: spool pre-filled)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--stub-kafka", action="store_true", help="a stub acknowledging at once instead of Tansu")
    ap.add_argument("--code", action="append", help="checkout to run the forwarder from (default: this one)")
    args = ap.parse_args()
    codes = args.code or [ROOT]
    res: dict[str, list] = {c: [] for c in codes}
    for i in range(args.runs):
        for c in codes:
            r = run_once(c, args)
            res[c].append(r)
            print(f"run {i + 1} {c}: {r['us_per_msg']:.2f} us CPU/msg, {r['rate']:.0f} msg/s", flush=True)
    for c, rs in res.items():
        us = [r["us_per_msg"] for r in rs]
        print(f"{c}: median {statistics.median(us):.2f} us CPU/msg (min {min(us):.2f}, max {max(us):.2f}), "
              f"median rate {statistics.median(r['rate'] for r in rs):.0f} msg/s over {len(rs)} runs")


if __name__ == "__main__":
    main()
