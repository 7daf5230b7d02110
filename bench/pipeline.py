"""Pipeline benchmark: MQTT -> broker (sink) -> Kafka (Tansu) -> Spark history table.
A script, not a test.

    .venv/bin/python bench/pipeline.py --rates 5000,15000,25000,50000 --duration 20 --warmup 60
    .venv/bin/python bench/pipeline.py --rates 25000 --broker-only --mosquitto   # the baseline

For each offered rate it starts, as a new user would run them: the embedded Kafka (Tansu), the
broker with the sink (`--kafka-bootstrap`), and the history job (`python -m sink.job`, 2 s
trigger, table in a temporary directory). Then 8 QoS 1 publishers (64-byte payloads, paced to
the offered rate in 1 ms ticks, at most --window unacknowledged each; what a full window holds
back waits in the publisher and goes out when PUBACKs free it) and one QoS 1 subscriber of
everything run for --duration seconds. A long-running job is warm: its JVM is still compiling
hot code a minute after start (C2 compiler threads ~18% of a core at 65 s), so `--warmup 60`
gives the steady-state figures. Reported:

* accepted: PUBACKs received; the subscriber's count is checked too (the broker stays correct);
  PUBACK latency percentiles (publish sent -> PUBACK read), the 1 ms ticks that ended with
  messages waiting for a window, and what was still waiting when publishing ended;
* time until all accepted messages are in Kafka (sum of the topic's end offsets) and in the
  table (rows in its Parquet files, read from the footers with pyarrow; no Spark session), after
  publishing ended, and the sustained rates (accepted / (duration + that time));
* CPU microseconds per accepted message of each process, from /proc/<pid>/stat over the whole
  run (publishing start to everything in the table; idle time included): broker main process,
  forwarder(s), Tansu, and the job (its Python driver, the JVM and the JVM's Python workers);
  and the same over the publishing phase only (`cpu_us_per_msg_publishing`: the broker's and
  forwarder's live cost, without the idle seconds spent waiting for the table).

CPU per message is the robust figure on a busy machine; wall-clock times are not. The job logs
at WARNING; JOB_LOG_LEVEL=INFO in the environment gives its full log (with --keep, in the work
directory).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from loadgen import Client, Subscriber, connect, make_payload, percentile, publish_packet  # noqa: E402

from kafka_client.embedded import EmbeddedKafka, free_port  # noqa: E402

PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
TOPIC = "mqtt.messages"


# ------------------------------------------------------------------------- /proc
def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / TICK     # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children(p):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class CpuMeter:
    """CPU seconds per group of processes; processes that appear later (Python workers) and the
    last value of those that exit are counted."""

    def __init__(self, groups):
        self.groups = groups            # name -> callable returning pids
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}
        self.base: dict[str, float] = {}

    def sample(self) -> None:
        for name, fn in self.groups.items():
            for pid in fn():
                v = cpu_s(pid)
                if v:
                    self.last[pid] = max(v, self.last.get(pid, 0.0))
                    self.owner[pid] = name

    def totals(self) -> dict[str, float]:
        t = {name: 0.0 for name in self.groups}
        for pid, v in self.last.items():
            t[self.owner[pid]] += v
        return t

    def start(self) -> None:
        self.sample()
        self.base = self.totals()

    def since_start(self) -> dict[str, float]:
        self.sample()
        t = self.totals()
        return {k: t[k] - self.base.get(k, 0.0) for k in t}


# ------------------------------------------------------------------------- counts
def kafka_count(spool_dir: str) -> int:
    """Records Kafka acknowledged (acks=all): the forwarders' checkpoints (a fresh spool starts
    at seq 0; written every 0.5 s). Tansu's ListOffsets is not used: its "latest" offsets lag by
    one per partition."""
    from sink.forward.spool import read_min_checkpoint
    ck = read_min_checkpoint(spool_dir)
    return int(ck["seq"]) if ck else 0


class TableCounter:
    """Rows in the table: those its newest version lists (sink/history/manifest.py: rows per
    file, no Spark session); for a table of Spark's file sink, the rows of its Parquet files,
    from their footers (each file read once)."""

    def __init__(self, table: str):
        self.table = table
        self.rows: dict[str, int] = {}

    def count(self) -> int:
        from sink.history.manifest import Table
        t = Table(self.table)
        if t.exists():
            return t.snapshot().rows
        import pyarrow.parquet as pq
        for d, dirs, files in os.walk(self.table):
            dirs[:] = [x for x in dirs if not x.startswith(("_", "."))]
            for f in files:
                if f.endswith(".parquet") and not f.startswith((".", "_")):
                    p = os.path.join(d, f)
                    if p not in self.rows:
                        try:
                            self.rows[p] = pq.read_metadata(p).num_rows
                        except Exception:
                            continue
        return sum(self.rows.values())


# ------------------------------------------------------------------------- load
class PacedPublisher(Client):
    """QoS 1 publisher: sends what the pacer allows, at most `window` unacknowledged. What a full
    window holds back waits in the client, as a device's queue does, and goes out as PUBACKs
    free the window (``drop_when_full``: it is dropped instead, the old behaviour)."""

    def __init__(self, client_id, topic, window, drop_when_full=False):
        super().__init__(client_id)
        self.window = window
        self.pkts = [None] + [publish_packet(topic, make_payload(0), 1, pid) for pid in range(1, window + 1)]
        self.free = list(range(window, 0, -1))
        self.sent_at = [0.0] * (window + 1)
        self.ack_latency: list[float] = []
        self.drop_when_full = drop_when_full
        self.sent = self.acked = self.pending = 0

    def send(self, n: int, now: float) -> int:
        """Offer n more messages; returns how many went out now."""
        want = n if self.drop_when_full else self.pending + n
        k = min(want, len(self.free))
        if self.transport.is_closing():
            k = 0
        if not self.drop_when_full:
            self.pending = want - k
        if k <= 0:
            return 0
        pids = [self.free.pop() for _ in range(k)]
        for p in pids:
            self.sent_at[p] = now
        self.transport.write(b"".join(self.pkts[p] for p in pids))
        self.sent += k
        return k

    def data_received(self, data):
        # PUBACK with a reason code >= 0x80 (MQTT 5) never happens on 3.1.1: count them all
        super().data_received(data)

    def on_release(self, pid):
        self.acked += 1
        self.ack_latency.append(time.monotonic() - self.sent_at[pid])
        self.free.append(pid)


def percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda q: round(percentile(v, q) * 1000, 1)  # noqa: E731
    return {"p50": pick(0.50), "p99": pick(0.99), "p999": pick(0.999), "max": round(v[-1] * 1000, 1)}


async def offer(host: str, port: int, rate: float, duration: float, publishers: int, window: int,
                drop_when_full: bool = False):
    loop = asyncio.get_running_loop()
    sub = await connect(loop, lambda: Subscriber(f"psub-{os.getpid()}"), host, port)
    await sub.subscribe("bench/#", 1)
    pubs = [await connect(loop, lambda i=i: PacedPublisher(f"ppub{i}-{os.getpid()}", f"bench/{i}", window,
                                                           drop_when_full), host, port)
            for i in range(publishers)]
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    due = 0.0
    owed = 0
    i = 0
    held_ticks = 0  # 1 ms ticks that ended with messages waiting for a window
    held = False    # whether the last tick did
    while True:
        now = time.monotonic() - t0
        if now >= duration:
            break
        target = int(rate * now)
        want = target - owed
        if want > 0 or held:
            # spread exactly over the publishers (the remainder to the next ones in turn)
            base, extra = divmod(max(want, 0), publishers)
            stamp = t0 + now
            for j in range(publishers):
                pubs[(i + j) % publishers].send(base + (1 if j < extra else 0), stamp)
            i += extra
            owed += max(want, 0)
            held = any(p.pending for p in pubs)
            held_ticks += held
        due += 0.001
        await asyncio.sleep(max(0.0, due - (time.monotonic() - t0)))
    t_pub_end = time.monotonic()
    # wait for the last PUBACKs
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(p.acked < p.sent for p in pubs):
        await asyncio.sleep(0.01)
    accepted = sum(p.acked for p in pubs)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sub.received < accepted:
        await asyncio.sleep(0.05)
    res = dict(offered=owed, sent=sum(p.sent for p in pubs), accepted=accepted,
               not_sent_at_end=sum(p.pending for p in pubs), ticks_with_full_window=held_ticks,
               ack_latency_ms=percentiles_ms([x for p in pubs for x in p.ack_latency]),
               delivered_to_subscriber=sub.received, publish_seconds=t_pub_end - t0)
    for c in pubs + [sub]:
        c.transport.close()
    return res, t_pub_end


# ------------------------------------------------------------------------- one run
def wait_port(port: int, timeout: float = 30.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def job_died(work: str, rc: int) -> None:
    """The job ended before the table had every message: say so with the end of its log."""
    with open(os.path.join(work, "job.log"), "rb") as f:
        tail = f.read()[-3000:].decode(errors="replace")
    print(f"the history job exited (code {rc}) before the table had every message; end of "
          f"{work}/job.log:\n{tail}", file=sys.stderr)


def run_one(a, rate: int) -> dict:
    work = tempfile.mkdtemp(prefix="pipeline-bench-")
    env = {**os.environ, "PYTHONPATH": ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                               if os.environ.get("PYTHONPATH") else "")}
    if a.broker_only:
        return run_broker_only(a, rate, work, env)
    kafka = EmbeddedKafka(log_file=os.path.join(work, "tansu.log")).start()
    table = os.path.join(work, "history")
    port = free_port()
    broker = job = None
    logs = {n: open(os.path.join(work, f"{n}.log"), "wb") for n in ("broker", "job")}
    try:
        bargs = [PY, "-m", "broker", "--port", str(port), "--data-dir", os.path.join(work, "data"),
                 "--kafka-bootstrap", kafka.bootstrap, "--log-level", "WARNING",
                 "--set", f"sink.keep_until={a.keep_until}",
                 "--set", f"sink.committed_file={os.path.join(table + '_checkpoint', 'history_committed.json')}"]
        for s in a.set or []:
            bargs += ["--set", s]
        broker = subprocess.Popen(bargs, cwd=ROOT, env=env, stdout=logs["broker"], stderr=subprocess.STDOUT,
                                  start_new_session=True)
        wait_port(port)
        job = subprocess.Popen([PY, "-m", "sink.job", "--kafka-bootstrap", kafka.bootstrap, "--table", table,
                                "--data-dir", os.path.join(work, "data"),  # checks the broker's signatures
                                "--trigger-seconds", str(a.trigger),
                                "--log-level", os.environ.get("JOB_LOG_LEVEL", "WARNING"),
                                "--connect-port", str(free_port())],  # Spark Connect on, as by default
                               cwd=ROOT, env=env, stdout=logs["job"], stderr=subprocess.STDOUT,
                               start_new_session=True)

        def forwarders():
            return [p for p in children(broker.pid) if "sink.forward.forwarder" in cmdline(p)]

        meter = CpuMeter({
            "broker": lambda: [broker.pid],
            "forwarder": forwarders,
            "tansu": lambda: [kafka.proc.pid],
            "job": lambda: [job.pid] + descendants(job.pid),
        })
        spool_dir = os.path.join(work, "data", "spool")
        counter = TableCounter(table)
        # let the job start (its first empty batches) before measuring
        deadline = time.monotonic() + a.job_startup
        while time.monotonic() < deadline and not os.path.isdir(table + "_checkpoint"):
            time.sleep(0.5)
        time.sleep(3)
        base_kafka = base_table = 0
        warm = None
        if a.warmup > 0:  # a long-running job is warm (JIT, Python workers, RocksDB): get it there
            wl, _ = asyncio.run(offer("127.0.0.1", port, rate, a.warmup, a.publishers, a.window,
                                      a.drop_when_full))
            deadline = time.monotonic() + a.timeout
            while time.monotonic() < deadline and counter.count() < wl["accepted"]:
                time.sleep(0.5)
            base_kafka, base_table = kafka_count(spool_dir), counter.count()
            warm = {"accepted": wl["accepted"], "table_rows": base_table}
            time.sleep(2 * a.trigger)
        meter.start()
        t_start = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        load, t_pub_end = asyncio.run(offer("127.0.0.1", port, rate, a.duration, a.publishers, a.window,
                                            a.drop_when_full))
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        n = load["accepted"]
        cpu_pub = meter.since_start()      # publishing (and its last acks): the live cost
        in_kafka = in_table = None
        deadline = time.monotonic() + a.timeout
        while time.monotonic() < deadline and (in_kafka is None or in_table is None):
            if in_table is None and job.poll() is not None:
                job_died(work, job.returncode)
                break
            meter.sample()
            now = time.monotonic()
            if in_kafka is None and kafka_count(spool_dir) - base_kafka >= n:
                in_kafka = now - t_pub_end
            if in_table is None and counter.count() - base_table >= n:
                in_table = now - t_pub_end
            time.sleep(0.2)
        cpu = meter.since_start()
        busy = time.monotonic() - t_start
        res = dict(rate=rate, **load, kafka_acked=kafka_count(spool_dir) - base_kafka,
                   table_rows=counter.count() - base_table, warmup=warm,
                   seconds_to_kafka=None if in_kafka is None else round(in_kafka, 2),
                   seconds_to_table=None if in_table is None else round(in_table, 2),
                   accepted_per_s=round(n / load["publish_seconds"]),
                   kafka_per_s=None if in_kafka is None else round(n / (load["publish_seconds"] + in_kafka)),
                   table_per_s=None if in_table is None else round(n / (load["publish_seconds"] + in_table)),
                   measured_seconds=round(busy, 1),
                   cpu_us_per_msg={k: round(v / max(n, 1) * 1e6, 1) for k, v in cpu.items()},
                   cpu_us_per_msg_publishing={k: round(v / max(n, 1) * 1e6, 1) for k, v in cpu_pub.items()},
                   work_dir=work)
        res["cpu_us_per_msg"]["total"] = round(sum(res["cpu_us_per_msg"].values()), 1)
        # the load generator shares the two cores: its cost is part of what the machine carries
        res["loadgen_us_per_msg"] = round((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime)
                                          / max(n, 1) * 1e6, 1)
        return res
    finally:
        for p in (job, broker):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        kafka.stop()
        for f in logs.values():
            f.close()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def _load_on(argv: list, port: int, a, rate: int, env: dict) -> tuple[dict, float]:
    """Start a broker (argv), offer the load, stop it: (load result, its CPU us per accepted)."""
    broker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_port(port)
        c0 = cpu_s(broker.pid)
        load, _ = asyncio.run(offer("127.0.0.1", port, rate, a.duration, a.publishers, a.window,
                                    a.drop_when_full))
        return load, (cpu_s(broker.pid) - c0) / max(load["accepted"], 1) * 1e6
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(30)


def run_broker_only(a, rate: int, work: str, env: dict) -> dict:
    """The same load on a broker without the sink: its CPU per message is the baseline; with
    --mosquitto, the same load on Mosquitto too (no persistence; in-flight and queue limits
    lifted so that it delivers everything) and the ratio of the two."""
    port = free_port()
    try:
        load, us = _load_on([PY, "-m", "broker", "--port", str(port), "--data-dir", os.path.join(work, "data"),
                             "--no-sink", "--log-level", "WARNING"] + sum((["--set", s] for s in a.set or []), []),
                            port, a, rate, env)
        n = load["accepted"]
        out = dict(rate=rate, **load, accepted_per_s=round(n / load["publish_seconds"]),
                   kafka_acked=None, table_rows=None, seconds_to_kafka=None, seconds_to_table=None,
                   table_per_s=None, cpu_us_per_msg={"broker": round(us, 1), "forwarder": 0, "tansu": 0,
                                                     "job": 0, "total": round(us, 1)})
        if a.mosquitto:
            port = free_port()
            conf = os.path.join(work, "mosquitto.conf")
            with open(conf, "w") as f:
                f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                        "max_inflight_messages 0\nmax_queued_messages 1000000\n")
            mload, mus = _load_on([a.mosquitto, "-c", conf], port, a, rate, env)
            out["mosquitto"] = dict(accepted=mload["accepted"], delivered=mload["delivered_to_subscriber"],
                                    cpu_us_per_msg=round(mus, 1))
            out["ours_over_mosquitto_cpu"] = round(us / mus, 2) if mus else None
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="5000,15000,25000,50000", help="offered msg/s, comma-separated")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of publishing per rate")
    ap.add_argument("--publishers", type=int, default=8)
    ap.add_argument("--window", type=int, default=500, help="unacknowledged QoS 1 PUBLISHes per publisher")
    ap.add_argument("--drop-when-full", action="store_true",
                    help="a publisher whose window is full drops its share of a tick instead of "
                         "queueing it (the behaviour before 2026-11-23: one ack stall of window/rate "
                         "seconds loses messages for good)")
    ap.add_argument("--trigger", type=float, default=2.0, help="job micro-batch trigger, seconds")
    ap.add_argument("--keep-until", default="history", choices=["history", "kafka"], help="[sink] keep_until")
    ap.add_argument("--set", action="append", help="extra broker --set SECTION.KEY=VALUE (repeatable)")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds of the same load before measuring, drained into the table first "
                         "(a long-running job is warm; 0 = measure a freshly started job)")
    ap.add_argument("--timeout", type=float, default=300.0, help="max seconds to wait for Kafka/table")
    ap.add_argument("--job-startup", type=float, default=120.0, help="max seconds for the job to start")
    ap.add_argument("--broker-only", action="store_true",
                    help="the same load on a broker without the sink (baseline CPU per message)")
    ap.add_argument("--mosquitto", nargs="?", const=shutil.which("mosquitto") or "/usr/sbin/mosquitto",
                    help="with --broker-only: the same load on Mosquitto too (CPU us per message, ratio)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs, table)")
    ap.add_argument("--json", action="store_true", help="one JSON line per rate instead of the table")
    a = ap.parse_args(argv)
    results = []
    for rate in [int(x) for x in a.rates.split(",") if x.strip()]:
        r = run_one(a, rate)
        results.append(r)
        print(json.dumps(r), file=sys.stderr if not a.json else sys.stdout, flush=True)
    if not a.json:
        print("| offered/s | accepted | accepted/s | to Kafka s | to table s | into table/s "
              "| broker us | forwarder us | Tansu us | job us | total us/msg | broker / forwarder us while publishing "
              "| load generator us | job | PUBACK ms p50/p99/max | ms with a full window |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results:
            c = r["cpu_us_per_msg"]
            print(f"| {r['rate']} | {r['accepted']} | {r['accepted_per_s']} | {r['seconds_to_kafka']} | "
                  f"{r['seconds_to_table']} | {r['table_per_s']} | {c['broker']} | {c['forwarder']} | "
                  f"{c['tansu']} | {c['job']} | {c['total']} | "
                  f"{r.get('cpu_us_per_msg_publishing', {}).get('broker')} / "
                  f"{r.get('cpu_us_per_msg_publishing', {}).get('forwarder')} | "
                  f"{r.get('loadgen_us_per_msg')} | {'warm' if r.get('warmup') else 'cold start'} | "
                  f"{'/'.join(str(r.get('ack_latency_ms', {}).get(k)) for k in ('p50', 'p99', 'max'))} | "
                  f"{r.get('ticks_with_full_window')} |")
        for r in results:
            if "mosquitto" in r:
                m = r["mosquitto"]
                print(f"{r['rate']}/s offered, no sink: ours {r['cpu_us_per_msg']['broker']} us/msg, Mosquitto "
                      f"{m['cpu_us_per_msg']} us/msg ({m['accepted']} accepted, {m['delivered']} delivered); "
                      f"ours/Mosquitto CPU = {r['ours_over_mosquitto_cpu']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
