#!/usr/bin/env python3
"""Wrong dashboard passwords as fast as --concurrency clients can send them, for --duration
seconds, while an MQTT client keeps connecting with a right password (result cache off, so each
of its CONNECTs costs one scrypt on the MQTT check pool).

Starts `python -m broker` with the dashboard (one operator account) and an MQTT password file,
then prints: how the bad logins were answered (401 checked, 429 throttled, 503 busy) and how
many per second, the broker's CPU seconds and RSS growth over the flood, and the MQTT CONNECT
latency p50/p99 during the flood next to a quiet baseline.

Two runs: as it comes (every bad login for one account from 127.0.0.1: after [dashboard]
login_failures that pair's checks take turns one second apart, the attempts wait for them, 429
beyond login_lockout_seconds of turns), and with --no-throttle (login_failures set huge: what a
flood from many addresses costs; the bounded check pool answers 503 past max_pending_logins).

    PYTHONPATH=. .venv/bin/python bench/dashboard_login_flood.py --duration 10
    PYTHONPATH=. .venv/bin/python bench/dashboard_login_flood.py --duration 10 --no-throttle
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from auth_flood import cpu_seconds  # noqa: E402  (bench/auth_flood.py, beside this file)

from broker.admin.accounts import set_account  # noqa: E402
from broker.auth import hash_password  # noqa: E402
from tests.conftest import BrokerProcess, free_port, wait_port  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def bad_login(url: str) -> int:
    req = urllib.request.Request(url, data=json.dumps({"user": "root", "password": "guess"}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def connect_latencies(port: int, seconds: float, stop: threading.Event | None = None) -> list:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (stop and stop.is_set()):
        c = RawClient(port, timeout=60)
        t0 = time.perf_counter()
        ack = c.connect(f"dev-{len(out)}", username="alice", password=b"secret")
        out.append((time.perf_counter() - t0) * 1000)
        assert ack.reason_code == 0, ack
        c.close()
    return out


def pct(xs: list, p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--no-throttle", action="store_true",
                    help="turn the throttle off (a flood from many addresses)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="login-flood-"))
    pw = tmp / "passwd"
    pw.write_text(f"alice:{hash_password('secret')}\n")
    set_account(str(tmp / "operators"), "root", "admin", "right-password")
    dport = free_port()
    settings = {"auth.password_file": str(pw), "auth.cache_seconds": 0,
                "persistence.enabled": False, "metrics.sys_interval": 0,
                "dashboard.enabled": True, "dashboard.port": dport,
                "dashboard.users_file": str(tmp / "operators")}
    if args.no_throttle:
        settings["dashboard.login_failures"] = 1000
    b = BrokerProcess(tmp, settings=settings)
    b.cmd[b.cmd.index("DEBUG")] = "WARNING"
    b.start()
    wait_port(dport, b.proc)
    url = f"http://127.0.0.1:{dport}/api/login"
    try:
        quiet = connect_latencies(b.port, 3.0)
        pid = b.proc.pid
        cpu0, rss0, t0 = cpu_seconds(pid), rss_mib(pid), time.monotonic()
        stop = threading.Event()
        codes: dict = {}
        lock = threading.Lock()

        def flood():
            while not stop.is_set():
                code = bad_login(url)
                with lock:
                    codes[code] = codes.get(code, 0) + 1
        threads = [threading.Thread(target=flood, daemon=True) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        during = connect_latencies(b.port, args.duration)
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t0
        cpu, rss = cpu_seconds(pid) - cpu0, rss_mib(pid) - rss0
        total = sum(codes.values())
        print(f"throttle {'off' if args.no_throttle else 'on'}: {total} bad logins in "
              f"{elapsed:.1f} s = {total / elapsed:.0f}/s; answers "
              + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
        print(f"broker CPU {cpu:.1f} s over {elapsed:.1f} s ({cpu / elapsed * 100:.0f}% of one "
              f"core), RSS {rss:+.1f} MiB")
        print(f"MQTT CONNECT with a password: quiet p50 {statistics.median(quiet):.0f} ms "
              f"p99 {pct(quiet, 0.99):.0f} ms ({len(quiet)}); during the flood p50 "
              f"{statistics.median(during):.0f} ms p99 {pct(during, 0.99):.0f} ms ({len(during)})")
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
