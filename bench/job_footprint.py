"""Where the history job's memory goes: the resident memory (RSS and PSS: shared pages counted
once) of every process of `python -m sink.job` (the driver, its JVM, the Python workers), idle
and while Kafka receives records at a given rate.

    .venv/bin/python bench/job_footprint.py [--rate 25000] [--seconds 20] [--idle 60]

Starts an embedded Kafka (Tansu) and the job with the settings scripts/run.sh uses (defaults,
free ports, Spark Connect on), waits until it has started and been idle ``--idle`` s, prints the
process tree, then produces ``--rate`` records/s for ``--seconds`` s (as the broker's forwarder
writes them: kafka-python, the contract headers) and prints the peak and the tree again once the
job is idle. Needs quiet cores for the ingest part; the idle figures are not sensitive to that.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def children(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            st = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        if int(st.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(p))
    return out


def _field(path: str, name: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree(pid: int, depth: int = 0, parent_cmd: str | None = None) -> list[tuple[int, int, int, int, str]]:
    """(depth, pid, rss, pss, what) for pid and every descendant."""
    try:
        cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
    except OSError:
        return []
    what = ("JVM (driver)" if "java" in cmd.split(" ")[0] else
            cmd.split(" -m ")[-1][:70] if " -m " in cmd else cmd[:70])
    if cmd == parent_cmd and what.startswith("JVM"):
        return []  # the JVM's fork that has not yet run its program (it shares the JVM's pages)
    rows = [(depth, pid, _field(f"/proc/{pid}/status", "VmRSS:"),
             _field(f"/proc/{pid}/smaps_rollup", "Pss:"), what)]
    for c in children(pid):
        rows += tree(c, depth + 1, cmd)
    return rows


def totals(pid: int) -> tuple[int, int]:
    rows = tree(pid)
    return sum(r[2] for r in rows), sum(r[3] for r in rows)


def show(title: str, pid: int, rows: list[tuple[int, int, int, int, str]] | None = None) -> None:
    rows = tree(pid) if rows is None else rows
    print(f"\n{title}")
    print(f"  {'pid':>7} {'RSS MB':>7} {'PSS MB':>7}  process")
    for depth, p, rss, pss, what in rows:
        print(f"  {p:>7} {rss / 2**20:7.0f} {pss / 2**20:7.0f}  {'  ' * depth}{what}")
    print(f"  {'total':>7} {sum(r[2] for r in rows) / 2**20:7.0f} "
          f"{sum(r[3] for r in rows) / 2**20:7.0f}")


def nmt(pid: int) -> None:
    """The JVM's committed memory by area (jcmd VM.native_memory summary), for each JVM."""
    for _depth, p, _, _, what in tree(pid):
        if what.startswith("JVM"):
            out = subprocess.run(["jcmd", str(p), "VM.native_memory", "summary"],
                                 capture_output=True, text=True).stdout
            print(f"\n  JVM {p}: " + "; ".join(
                ln.strip().lstrip("-").strip().split("(reserved")[0] + ln.split("committed=")[1].split(")")[0]
                for ln in out.splitlines() if "committed=" in ln and ln.strip().startswith(("-", "Total"))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=25000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--idle", type=float, default=60)
    ap.add_argument("--nice", type=int, default=None,
                    help="the job's niceness (default: the job's, 10); 0 on a machine other "
                         "work overloads, where a job at 10 may not get a Python worker started "
                         "within Spark's fixed 10 s")
    ap.add_argument("--nmt", action="store_true",
                    help="the JVM's own accounting too (Native Memory Tracking, jcmd of a JDK)")
    args = ap.parse_args()
    from kafka_client.embedded import EmbeddedKafka, free_port
    from tests.e2e.test_spark_history import contract_headers, simple_message
    tmp = Path(tempfile.mkdtemp(prefix="job-footprint-"))
    kafka = EmbeddedKafka(log_file=str(tmp / "tansu.log")).start()
    log_path = tmp / "job.log"
    connect_port = free_port()
    job = subprocess.Popen(
        [sys.executable, "-m", "sink.job", "--kafka-bootstrap", kafka.bootstrap, "--table",
         str(tmp / "history"), "--data-dir", str(tmp), "--connect-port", str(connect_port),
         *(["--nice", str(args.nice)] if args.nice is not None else [])],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                       **({"SPARK_SUBMIT_OPTS": "-XX:NativeMemoryTracking=summary"}
                          if args.nmt else {})}, stdout=open(log_path, "ab"),
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while "history job started" not in log_path.read_text(errors="replace"):
            if job.poll() is not None:
                print(log_path.read_text(errors="replace")[-3000:])
                return 1
            time.sleep(1)
        started = time.monotonic()
        show("just started (the catalog's one-time spark-sql registration may run beside it)",
             job.pid)
        while "registered in the Derby metastore" not in log_path.read_text(errors="replace"):
            if time.monotonic() - started > 600 or job.poll() is not None:
                print("the table was not registered in the catalog within 600 s")
                break
            time.sleep(1)
        print(f"\nthe catalog registration ended {time.monotonic() - started:.0f} s after the start")
        time.sleep(args.idle)
        show(f"idle ({args.idle:g} s after that)", job.pid)
        if args.nmt:
            nmt(job.pid)
        peak = [0, 0]
        at_peak: list[tuple[int, int, int, int, str]] = []
        stop = threading.Event()

        def sample():
            while not stop.wait(0.5):
                rows = tree(job.pid)
                rss, pss = sum(r[2] for r in rows), sum(r[3] for r in rows)
                if rss > peak[0]:
                    at_peak[:] = rows
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        from kafka import KafkaProducer
        prod = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks=1, linger_ms=20,
                             batch_size=256 * 1024)
        t0, sent = time.monotonic(), 0
        while time.monotonic() - t0 < args.seconds:
            due = int((time.monotonic() - t0) * args.rate)
            for i in range(sent, due):
                m = simple_message(i, "fp")
                prod.send("mqtt.messages", key=m["topic"].encode(), value=m["payload"],
                          headers=contract_headers(m), timestamp_ms=m["accepted_ms"])
            sent = due
            time.sleep(0.01)
        prod.flush()
        print(f"\nproduced {sent} records in {time.monotonic() - t0:.1f} s "
              f"({sent / (time.monotonic() - t0):.0f}/s)")
        time.sleep(args.idle)
        stop.set()
        print(f"peak while ingesting: RSS {peak[0] / 2**20:.0f} MB, PSS {peak[1] / 2**20:.0f} MB")
        show("the processes at the peak (RSS)", job.pid, at_peak)
        show(f"idle again ({args.idle:g} s after the load)", job.pid)
        for sql in ("SELECT count(*) FROM messages",
                    "SELECT topic, count(*) FROM messages GROUP BY topic ORDER BY 2 DESC LIMIT 5"):
            times = []
            for _ in range(3):
                out = subprocess.run(
                    [sys.executable, "-m", "sink.query", "--connect", f"sc://127.0.0.1:{connect_port}",
                     "--data-dir", str(tmp), "-v", "--format", "csv", sql], cwd=ROOT,
                    capture_output=True, text=True, timeout=600,
                    env={**os.environ, "PYTHONPATH": str(ROOT)})
                m = re.search(r"answered by Spark Connect in ([0-9.]+) s", out.stderr)
                times.append(m.group(1) if m else "failed: " + out.stderr[-300:])
            print(f"query {sql!r}: {', '.join(times)} s (Spark Connect, 3 runs)")
        if args.nmt:
            nmt(job.pid)
        return 0
    finally:
        try:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(job.pid, signal.SIGKILL)
        kafka.stop()


if __name__ == "__main__":
    sys.exit(main())
