"""From `scripts/run.sh` to the first message answering a query, and the idle stack's memory.

    .venv/bin/python bench/cold_start.py [--idle 30] [--keep]

Starts run.sh as an operator does (embedded Kafka, broker with its sink and dashboard, the
history job with Spark Connect) on free ports in a temporary data directory, publishes one QoS 1
message as soon as the broker listens, and prints when each step was reached, in seconds from
the start: the broker listening, the job's Spark Connect port open, the first micro-batch
committed with the message, and a query through Spark Connect answering with it (a fresh
`sink.query` process: its own start-up is part of what an operator waits for). Then, after
`--idle` seconds, the resident memory (RSS, and PSS: shared pages counted once) of every process
run.sh started (bench/job_footprint.py's tree). Ctrl-C stops it all. Needs quiet cores: the
figures are start-up CPU work.
"""
from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from job_footprint import show, tree  # noqa: E402  (beside this script)

from sink.history import commits  # noqa: E402

#: The job's log lines that mark its steps (sink/history/job/): printed with their time.
JOB_STEPS = ("running at niceness", "Spark session ready", "Spark Connect on",
             "history job started", "batch 0:")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of pid and its descendants so far, with the children they have
    reaped: the start-up work, which a loaded machine stretches but does not change."""
    total = 0.0
    for _depth, p, _rss, _pss, _what in tree(pid):
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def publish_one(port: int) -> None:
    import paho.mqtt.client as mqtt
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cold-start", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish("site/dev1/temp", b'{"temp": 21.5}', qos=1).wait_for_publish(30)
    finally:
        c.loop_stop()
        c.disconnect()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=30.0, help="seconds idle before the memory figures")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cold-start-"))
    data, table = tmp / "data", str(tmp / "history")
    mqtt_port, connect_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQTT_BROKER_")}
    env["DASHBOARD_PORT"] = str(free_port())
    cmd = ["bash", "scripts/run.sh", "--data-dir", str(data), "--port", str(mqtt_port),
           "--set", f"sink.embedded_port={free_port()}", "--set", f"history.connect_port={connect_port}",
           "--set", f"history.table={table}", "--set", "history.trigger_seconds=1"]
    log = tmp / "run.log"
    t0, wall0 = time.monotonic(), time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}
    committed = commits.committed_path(table)
    try:
        while time.monotonic() - t0 < args.timeout and proc.poll() is None:
            now = time.monotonic() - t0
            if "listening" not in marks and port_open(mqtt_port):
                marks["listening"] = now
                publish_one(mqtt_port)
                marks["published (PUBACK)"] = time.monotonic() - t0
            if "spark connect" not in marks and port_open(connect_port):
                marks["spark connect"] = now
            if "committed" not in marks and os.path.exists(committed):
                marks["committed"] = now
            for name in marks.keys() - cpu.keys():
                cpu[name] = cpu_seconds(proc.pid)
            if "committed" in marks and "spark connect" in marks:
                before = _children_cpu()
                q = subprocess.run([sys.executable, "-m", "sink.query", "--data-dir", str(data),
                                    "--connect", f"sc://127.0.0.1:{connect_port}", "--wait", "0",
                                    "--format", "csv", "SELECT count(*) FROM messages"],
                                   cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
                if q.returncode == 0 and q.stdout.split()[-1:] == ["1"]:
                    marks["queryable"] = time.monotonic() - t0
                    cpu["queryable"] = cpu_seconds(proc.pid) + _children_cpu() - before
                    break
            time.sleep(0.1)
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
        for name, t in marks.items():
            print(f"{name:>20}: {t:6.1f} s  (CPU of the stack so far: {cpu.get(name, 0):6.1f} s)")
        print("the job's log (seconds from the start):")
        for line in log.read_text(errors="replace").splitlines():
            if any(k in line for k in JOB_STEPS):
                try:
                    at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
                except ValueError:
                    continue
                print(f"  {at - wall0:6.1f} s  {line[24:].split(': ', 1)[-1][:90]}")
        if "queryable" not in marks:
            print(f"not queryable within {args.timeout:.0f} s; see {log}")
            return 1
        time.sleep(args.idle)
        show(f"idle {args.idle:.0f} s after the first query (run.sh's process tree)", proc.pid)
        rows = tree(proc.pid)
        print(f"idle stack: {sum(r[2] for r in rows) / 2**20:.0f} MiB RSS, "
              f"{sum(r[3] for r in rows) / 2**20:.0f} MiB PSS")
        return 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
