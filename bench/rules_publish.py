"""The rules' MQTT client (sink/history/rules/publish.py) alone: CPU and wall time of
``Publisher.publish_all`` for a batch of --rows alert rows, QoS 1, to a broker it starts.

    PYTHONPATH=. python bench/rules_publish.py --rows 830
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kafka_client.embedded import free_port  # noqa: E402
from sink.history.rules.publish import Publisher  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=830, help="rows per batch (830: five rules' "
                    "alerts of a 5 s batch in bench/rules_bench.py)")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    broker = subprocess.Popen([sys.executable, "-m", "broker", "--port", str(port), "--set",
                               "sink.enabled=false"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        p = Publisher("127.0.0.1", port, "bench", "", "rules-publish-bench")
        rows = [b'{"topic":"plant/d1","seq":123456,"t":1764376000.123456}'] * a.rows
        p.publish_all("alerts/bench", rows[:10])   # connected, warm
        for _ in range(a.rounds):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(a.batches):
                p.publish_all("alerts/bench", rows)
            cpu = (time.process_time() - c0) / a.batches * 1000
            wall = (time.perf_counter() - w0) / a.batches * 1000
            print(f"{a.rows} rows: {cpu:.1f} ms CPU, {wall:.1f} ms wall per publish_all "
                  f"({cpu * 1000 / a.rows:.0f} us CPU per row)", flush=True)
        p.close()
    finally:
        broker.terminate()
        broker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
