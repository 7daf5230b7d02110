"""Continuous rules under load (docs/rules.md "How the job runs rules"): a broker with its sink
(Kafka) and the history job, both started with one --config file, JSON readings published at
--rate msg/s, 1 % of them "hot"; stateless rules publish what they select to alerts/r<i>
(--mix: five different rules, or the "hot" one N times).

Prints, for 0 and for --rules rules: the job's CPU seconds per 1,000 messages (the JVM and its
Python workers, from /proc), and with rules the latency from each hot PUBLISH to its alert at a
subscriber (p50, p99), and the load average.

    PYTHONPATH=. python bench/rules_bench.py --rate 5000 --seconds 30 --rules 5
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from pipeline import TICK, descendants, free_port, wait_port  # noqa: E402

from kafka_client.embedded import EmbeddedKafka  # noqa: E402

PY = sys.executable
RULE = ("SELECT topic, payload_json:seq::bigint AS seq, payload_json:t::double AS t "
        "FROM messages WHERE payload_json:hot::boolean")
#: --mix distinct: five different stateless rules as users write them (fields, topic, text),
#: each taking 0.1-1 % of the readings; the first is RULE (its alerts are the ones timed)
DISTINCT = [
    RULE,
    "SELECT topic, payload_json:seq::bigint AS seq FROM messages "
    "WHERE payload_json:seq::bigint % 100 = 1",
    "SELECT topic, payload_json:temp::int AS temp, accepted_at FROM messages "
    "WHERE topic = 'plant/d7' AND payload_json:temp::int > 33",
    "SELECT topic, payload_json:temp::int AS temp FROM messages "
    "WHERE payload_json:temp::int > 35 AND payload_json:seq::bigint % 7 = 0",
    "SELECT topic, length(payload) AS size, qos FROM messages "
    "WHERE topic = 'plant/d3' AND payload_text LIKE '%\"temp\": 36}'",
]


def rule_sql(i: int, mix: str) -> str:
    """Rule i's SQL: --mix same runs RULE N times (what the figures before 2026-11-29 used)."""
    return RULE if mix == "same" else DISTINCT[i % len(DISTINCT)]


def config(work: str, port: int, bootstrap: str, rules: int, log_level: str = "WARNING",
           trigger: float = 1.0, mix: str = "distinct") -> str:
    path = os.path.join(work, "broker.toml")
    text = (f'[broker]\nport = {port}\ndata_dir = "{work}/data"\nlog_level = "{log_level}"\n'
            f'[sink]\nenabled = true\nbootstrap_servers = "{bootstrap}"\n'
            f'[history]\ntable = "{work}/history"\ntrigger_seconds = {trigger:g}\nconnect = false\n'
            f'starting_offsets = "latest"\n')
    for i in range(rules):
        text += (f'[[history.rules]]\nname = "r{i}"\nsql = {json.dumps(rule_sql(i, mix))}\n'
                 f'publish = "alerts/r{i}"\n')
    with open(path, "w") as f:
        f.write(text)
    return path


def with_children_s(pid: int) -> float:
    """A process's CPU seconds with those of its children that ended (cutime, cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in parts[11:15]) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def job_cpu(job: subprocess.Popen) -> float:
    """The job's CPU seconds: its processes' and those of the ones that ended (Spark's Python
    workers come and go: counting only the living ones lost a worker's seconds when it ended)."""
    return sum(with_children_s(p) for p in [job.pid] + descendants(job.pid))


class Load(threading.Thread):
    """QoS 0 JSON readings at `rate` msg/s (paced every 10 ms); seq and send time inside."""

    def __init__(self, port: int, rate: int) -> None:
        super().__init__(daemon=True)
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rules-load", protocol=mqtt.MQTTv5)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.rate, self.sent, self.stop_flag = rate, 0, threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop_flag.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while self.sent < due:
                n = self.sent
                self.c.publish(f"plant/d{n % 50}", json.dumps(
                    {"seq": n, "t": time.time(), "hot": n % 100 == 0, "temp": 20 + n % 17}), qos=0)
                self.sent += 1
            time.sleep(0.01)


def phase(work: str, bootstrap: str, rules: int, a) -> dict:
    port = free_port()
    work = os.path.join(work, f"rules-{rules}")   # a table, checkpoint and data dir per phase:
    os.makedirs(work)                             # each job starts at the newest records
    cfg = config(work, port, bootstrap, rules, a.log_level, a.trigger, a.mix)
    env = {**os.environ, "PYTHONPATH": ROOT}
    logs = open(os.path.join(work, f"run-{rules}.log"), "wb")
    broker = subprocess.Popen([PY, "-m", "broker", "--config", cfg], cwd=ROOT, env=env,
                              stdout=logs, stderr=subprocess.STDOUT, start_new_session=True)
    job = None
    try:
        wait_port(port)
        job = subprocess.Popen([PY, "-m", "sink.job", "--config", cfg], cwd=ROOT, env=env,
                               stdout=logs, stderr=subprocess.STDOUT, start_new_session=True)
        lat: list[float] = []
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rules-sub", protocol=mqtt.MQTTv5)
        sub.on_message = lambda c, u, m: lat.append(time.time() - json.loads(m.payload)["t"])
        sub.connect("127.0.0.1", port)
        sub.loop_start()
        sub.subscribe("alerts/r0", qos=1)
        load = Load(port, a.rate)
        load.start()
        time.sleep(a.warmup)       # Spark starts, the rules start, the first batches
        lat.clear()
        c0, s0, w0 = job_cpu(job), load.sent, time.monotonic()
        time.sleep(a.seconds)
        c1, s1, w1 = job_cpu(job), load.sent, time.monotonic()
        load.stop_flag.set()
        lat_ms = sorted(x * 1000 for x in lat)

        def pct(p: float) -> float | None:
            return round(lat_ms[min(len(lat_ms) - 1, int(p * len(lat_ms)))], 1) if lat_ms else None
        return {"rules": rules, "mix": a.mix, "trigger_s": a.trigger, "msgs": s1 - s0,
                "rate": round((s1 - s0) / (w1 - w0)),
                "job_cpu_s": round(c1 - c0, 2),
                "job_cpu_ms_per_1000_msgs": round((c1 - c0) * 1e6 / max(1, s1 - s0), 2),
                "alerts": len(lat_ms), "p50_ms": pct(0.50), "p99_ms": pct(0.99),
                "loadavg": os.getloadavg()[0]}
    finally:
        for p in (job, broker):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=90.0)
    ap.add_argument("--rules", type=int, default=5)
    ap.add_argument("--trigger", type=float, default=1.0,
                    help="[history] trigger_seconds (default 1; the job's own default is 5)")
    ap.add_argument("--mix", choices=("distinct", "same"), default="distinct",
                    help="distinct: five different rules (DISTINCT); same: RULE every time")
    ap.add_argument("--only", type=int, help="run only with this many rules (no baseline)")
    ap.add_argument("--log-level", default="WARNING", help="the broker's and the job's (logs in the "
                    "work directory, printed at the end)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="rules-bench-")
    kafka = EmbeddedKafka(log_file=os.path.join(work, "tansu.log")).start()
    try:
        for n in ((a.only,) if a.only is not None else (0, a.rules)):
            print(json.dumps(phase(work, kafka.bootstrap, n, a)), flush=True)
    finally:
        kafka.stop()
        print(f"logs: {work}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
