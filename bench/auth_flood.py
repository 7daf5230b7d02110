#!/usr/bin/env python3
"""PINGREQ round trips of a connected client while CONNECTs that need a password hash arrive.

Starts `python -m broker` with a password file (default scrypt cost, result cache off), then
sends --rate CONNECTs per second with distinct unknown user names and no password (each costs
a dummy scrypt) for --duration seconds while one connected client pings every 20 ms. Prints the
ping p50/p99, how the CONNECTs were answered, and the broker's CPU seconds.

    PYTHONPATH=. .venv/bin/python bench/auth_flood.py --rate 90 --duration 5
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.auth import hash_password  # noqa: E402
from broker.protocol import packets as P  # noqa: E402
from broker.protocol.codec import Decoder, encode  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=90.0)
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="auth-flood-"))
    pw = tmp / "passwd"
    pw.write_text(f"alice:{hash_password('secret')}\n")
    b = BrokerProcess(tmp, settings={"auth.password_file": str(pw), "auth.cache_seconds": 0,
                                     "persistence.enabled": False, "metrics.sys_interval": 0})
    b.cmd[b.cmd.index("DEBUG")] = "WARNING"
    b.start()
    try:
        pinger = RawClient(b.port, timeout=30)
        assert pinger.connect("pinger", username="alice", password=b"secret").reason_code == 0
        stop = threading.Event()
        codes: dict = {}
        socks = []

        def flood():
            i = 0
            t0 = time.monotonic()
            while not stop.is_set():
                s = socket.create_connection(("127.0.0.1", b.port))
                s.sendall(encode(P.Connect(f"f{i}", 5, username=f"nobody{i}"), 5))
                socks.append(s)
                i += 1
                time.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))

        cpu0 = cpu_seconds(b.proc.pid)
        th = threading.Thread(target=flood, daemon=True)
        th.start()
        rtts = []
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            t = time.monotonic()
            pinger.send(P.PingReq())
            pinger.recv_type(P.PINGRESP, timeout=60)
            rtts.append(time.monotonic() - t)
            time.sleep(0.02)
        stop.set()
        th.join()
        for s in socks:
            s.settimeout(60)
            data = b""
            try:
                while len(data) < 4:
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            pkts, _ = Decoder(5).feed(data)
            key = f"0x{pkts[0].reason_code:02X}" if pkts else "none"
            codes[key] = codes.get(key, 0) + 1
            s.close()
        cpu = cpu_seconds(b.proc.pid) - cpu0
        rtts.sort()
        print(f"{len(socks)} CONNECTs at {args.rate}/s for {args.duration}s; answers {codes}")
        print(f"ping p50 {statistics.median(rtts) * 1000:.1f} ms, "
              f"p99 {rtts[int(len(rtts) * 0.99) - 1] * 1000:.1f} ms, max {rtts[-1] * 1000:.1f} ms "
              f"({len(rtts)} pings); broker CPU {cpu:.2f} s")
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
