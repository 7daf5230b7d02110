#!/usr/bin/env python3
"""Broker memory while one client tries to store N retained messages on distinct topics.

Starts `python -m broker` (persistence on, as by default: retained messages go to state.db),
connects one anonymous MQTT 5 client and publishes --messages retained QoS 1 messages of
--payload bytes on distinct topics (--window unacknowledged at a time), counting the PUBACK
codes: 0x00/0x10 stored, 0x97 refused at mqtt.max_retained_messages / max_retained_bytes. Prints
the broker's RSS before and after, its peak, the retained count from /metrics and state.db's
size, then restarts the broker and prints how long restoring took and the RSS after it.

    PYTHONPATH=. .venv/bin/python bench/retained_cap.py                  # defaults: capped
    PYTHONPATH=. .venv/bin/python bench/retained_cap.py --set mqtt.max_retained_messages=0 \\
        --set mqtt.max_retained_bytes=0                                   # no cap, as before
"""
from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.protocol import packets as P  # noqa: E402
from broker.protocol.codec import Decoder, encode  # noqa: E402
from tests.conftest import BrokerProcess, free_port  # noqa: E402


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def publish_all(port: int, n: int, payload: bytes, window: int) -> dict:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(encode(P.Connect("retainer", P.MQTT_5)))
    dec = Decoder(P.MQTT_5)
    codes: dict = {}
    sent = acked = 0
    connack = False
    while acked < n:
        batch = bytearray()
        while sent < n and sent - acked < window and connack:
            sent += 1
            batch += encode(P.Publish(f"retained/{sent // 1000}/{sent}", payload, 1, True,
                                      packet_id=sent % 65535 + 1))
        if batch:
            s.sendall(batch)
        pkts, err = dec.feed(s.recv(1 << 20))
        assert err is None, err
        for p in pkts:
            if p.type == P.CONNACK:
                assert p.reason_code == 0, p
                connack = True
            elif p.type == P.PUBACK:
                acked += 1
                codes[p.reason_code] = codes.get(p.reason_code, 0) + 1
    s.sendall(encode(P.Disconnect()))
    s.close()
    return codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--payload", type=int, default=32)
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="retained-cap-"))
    mport = free_port()
    b = BrokerProcess(tmp, settings={"metrics.enabled": True, "metrics.port": mport,
                                     "metrics.sys_interval": 0,
                                     **dict(x.split("=", 1) for x in args.set)},
                      log_level="WARNING").start()
    try:
        pid = b.proc.pid
        time.sleep(0.5)
        before = rss_mib(pid)
        t0 = time.monotonic()
        codes = publish_all(b.port, args.messages, b"v" * args.payload, args.window)
        took = time.monotonic() - t0
        time.sleep(1.5)  # a tick: the store's last commit
        after, peak = rss_mib(pid), rss_mib(pid, "VmHWM")
        count = metric(mport, "mqtt_retained_messages")
        db = tmp / "state.db"
        print(f"broker: {' '.join(b.cmd[1:])}")
        print(f"{args.messages:,} retained QoS 1 PUBLISHes of {args.payload} bytes on distinct "
              f"topics in {took:.1f} s: PUBACK codes "
              + ", ".join(f"0x{k:02X} x {v:,}" for k, v in sorted(codes.items())))
        print(f"retained messages held: {count:,.0f}; state.db {db.stat().st_size / 2**20:.1f} MiB")
        print(f"broker RSS: {before:.1f} MiB before, {after:.1f} MiB after (+{after - before:.1f}), "
              f"peak {peak:.1f} MiB")
        b.stop()
        t0 = time.monotonic()
        b.start()
        took = time.monotonic() - t0
        time.sleep(0.5)
        print(f"restart: listening after {took:.1f} s, RSS {rss_mib(b.proc.pid):.1f} MiB, "
              f"{metric(mport, 'mqtt_retained_messages'):,.0f} retained restored")
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
