#!/usr/bin/env python3
"""Broker memory while persistent sessions try to hold many long topic filters.

Starts `python -m broker` (persistence on, as by default: subscriptions go to state.db), then
--sessions clients each make a persistent session (expiry 1 day) and SUBSCRIBE --filters
distinct filters of --length bytes (as many per SUBSCRIBE as fit in 1 MiB), counting the SUBACK
codes (0x97: mqtt.max_subscription_bytes / _total), and go offline. Prints the broker's RSS
before and after and state.db's size, then restarts the broker and prints the RSS after
restoring.

    PYTHONPATH=. .venv/bin/python bench/subscription_bytes.py                 # defaults: capped
    PYTHONPATH=. .venv/bin/python bench/subscription_bytes.py --set mqtt.max_subscription_bytes=0 \\
        --set mqtt.max_subscription_bytes_total=0                           # no byte cap, as before
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.protocol import packets as P  # noqa: E402
from broker.protocol import properties as PR  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fill(port: int, cid: str, filters: int, length: int) -> dict:
    c = RawClient(port, timeout=120)
    assert c.connect(cid, clean_start=False,
                     properties={PR.SESSION_EXPIRY_INTERVAL: 86400}).reason_code == 0
    per = max(1, (1 << 20) // (length + 8) - 1)
    codes: dict = {}
    pid = 0
    for start in range(0, filters, per):
        pid += 1
        batch = [(f"{cid}/{i:06d}/".ljust(length, "x"), P.SubscriptionOptions(1))
                 for i in range(start, min(filters, start + per))]
        c.send(P.Subscribe(pid, batch))
        ack = c.recv(120)
        while ack.type != P.SUBACK:
            ack = c.recv(120)
        for code in ack.reason_codes:
            codes[code] = codes.get(code, 0) + 1
    c.close()
    return codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--filters", type=int, default=1000)
    ap.add_argument("--length", type=int, default=60_000)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subbytes-"))
    settings = {"metrics.sys_interval": 0, **dict(x.split("=", 1) for x in a.set)}
    b = BrokerProcess(tmp, settings=settings, log_level="WARNING").start()
    try:
        time.sleep(0.5)
        before = rss_mib(b.proc.pid)
        for s in range(a.sessions):
            codes = fill(b.port, f"s{s}", a.filters, a.length)
            print(f"session s{s}: SUBACK codes {sorted(codes.items())}", flush=True)
        time.sleep(1.0)
        print(f"RSS {before:.1f} -> {rss_mib(b.proc.pid):.1f} MiB")
    finally:
        b.stop()
    db = tmp / "state.db"
    print(f"state.db {db.stat().st_size / (1 << 20):.1f} MiB")
    b = BrokerProcess(tmp, settings=settings, log_level="WARNING").start()
    try:
        time.sleep(1.0)
        print(f"after a restart: RSS {rss_mib(b.proc.pid):.1f} MiB")
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
