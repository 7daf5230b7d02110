#!/usr/bin/env python3
"""Many idle devices held by one broker process: memory per connection and the CPU their keep
alives cost, ours and Mosquitto side by side.

    .venv/bin/python bench/idle_devices.py                          # 100,000 devices asked for
    .venv/bin/python bench/idle_devices.py --devices 10000 --window 30 --only ours

For each broker (a fresh process, alternating, --repeats times): its RSS once started (idle
resident memory); --devices connect (MQTT 3.1.1, clean session, keep alive --keep-alive 60,
--rate connects per second); its RSS once they all have their CONNACK (and a second later):
(RSS with them - RSS before) / devices is the memory per connection; then for --window seconds
each device sends a PINGREQ once per keep-alive period (the devices' offsets spread evenly
over the period, as independent devices' are) and the broker's CPU (schedstat, all threads)
over the window, divided by its length, is the CPU the keep alives cost per second (the
PINGREQs, PINGRESPs, the broker's keep-alive timers and whatever else an idle broker does),
printed as a share of one core and per 10,000 connections. PINGRESPs missing and connections
the broker closed are counted.

File limits: every device is one socket in the broker and one here. The script raises its soft
RLIMIT_NOFILE to the hard limit; where that is below --devices + 64 (the broker's own files) it
runs with as many devices as fit and prints the figures per connection, with the 100,000 figure
extrapolated from them and marked so (raise `ulimit -Hn` as root for the real count).
"""
from __future__ import annotations

import argparse
import datetime
import errno
import json
import os
import platform
import select
import shutil
import socket
import statistics
import sys
import tempfile
import time

from harness import (
    add_broker_args,
    broker_names,
    broker_proc,
    free_port,
    print_command,
    raise_file_limit,
    run_dir,
    run_repeats,
    schedstat_s,
    show_json,
    status_kib,
)
from storm import IP_BIND_ADDRESS_NO_PORT, connect_packet

BROKER_FILES = 64
SOURCES = 250  # source addresses 127.0.4.1 .. : ports chosen per address at connect


class Devices:
    """N sockets on one epoll: connect at a rate, then PINGREQ each once per period."""

    def __init__(self, a):
        self.a = a
        self.ep = select.epoll(a.devices + 16)
        self.socks: dict[int, socket.socket] = {}
        self.connacked = 0
        self.pongs = 0
        self.closed = 0
        self.failed = 0
        self.buf: dict[int, bytes] = {}

    def poll(self, timeout: float) -> None:
        for fd, ev in self.ep.poll(timeout):
            sock = self.socks.get(fd)
            if sock is None:
                continue
            if ev & select.EPOLLOUT:
                self.ep.modify(fd, select.EPOLLIN)
                try:
                    sock.send(connect_packet(f"idle-{fd}-{os.getpid()}", clean=True,
                                             keep_alive=self.a.keep_alive))
                except OSError:
                    ev |= select.EPOLLHUP
            if ev & select.EPOLLIN:
                try:
                    data = sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data:
                    data = self.buf.pop(fd, b"") + data
                    i = 0
                    while i + 2 <= len(data):
                        n = 2 + data[i + 1]
                        if i + n > len(data):
                            break
                        if data[i] == 0x20:
                            self.connacked += 1
                        elif data[i] == 0xD0:
                            self.pongs += 1
                        i += n
                    if i < len(data):
                        self.buf[fd] = data[i:]
                elif data is not None:
                    ev |= select.EPOLLHUP
            if ev & (select.EPOLLHUP | select.EPOLLERR):
                self.ep.unregister(fd)
                del self.socks[fd]
                sock.close()
                self.closed += 1

    def connect_all(self) -> float:
        a = self.a
        addr = (a.host, a.port)
        t0 = time.time()
        for k in range(a.devices):
            due = t0 + k / a.rate
            while time.time() < due:
                self.poll(max(0.0, min(0.01, due - time.time())))
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.bind((f"127.0.4.{1 + k % SOURCES}", 0))
                sock.setblocking(False)
                err = sock.connect_ex(addr)
                if err not in (0, errno.EINPROGRESS):
                    raise OSError(err, os.strerror(err))
            except OSError:
                sock.close()
                self.failed += 1
                continue
            self.socks[sock.fileno()] = sock
            self.ep.register(sock.fileno(), select.EPOLLOUT | select.EPOLLIN)
        end = time.time() + 60
        while self.connacked + self.closed + self.failed < a.devices and time.time() < end:
            self.poll(0.05)
        return time.time() - t0

    def ping_for(self, seconds: float) -> int:
        """Each device pings once per keep-alive period, offsets spread over it (keep alive 0:
        none, the broker's idle cost alone)."""
        period = self.a.keep_alive
        if not period:
            end = time.time() + seconds
            while time.time() < end:
                self.poll(0.1)
            return 0
        fds = list(self.socks)
        n = len(fds)
        t0 = time.time()
        sent = 0
        k = 0  # pings due so far, over all devices in order
        while True:
            now = time.time()
            if now - t0 >= seconds:
                break
            due = int((now - t0) / period * n)
            while k < due:
                sock = self.socks.get(fds[k % n])
                k += 1
                if sock is not None:
                    try:
                        sock.send(b"\xc0\x00")
                        sent += 1
                    except OSError:
                        pass
            self.poll(0.01)
        end = time.time() + 2
        while self.pongs < sent and time.time() < end:
            self.poll(0.05)
        return sent

    def close(self) -> None:
        for sock in self.socks.values():
            try:
                sock.send(b"\xe0\x00")
            except OSError:
                pass
            sock.close()
        self.socks.clear()
        self.ep.close()


def run_one(a, name: str, tmp: str, rep: int) -> dict:
    datadir = run_dir(tmp, name, rep)
    a.port = port = free_port(a.host)
    b = broker_proc(a, name, port, datadir, "persistence false\n"
                    "# stock otherwise (max_connections -1, set_tcp_nodelay false)\n")
    pid = b.start()
    d = None
    try:
        if not b.wait_port(a.host, port):
            raise RuntimeError(f"{name} did not start: {b.tail()}")
        time.sleep(2.0)
        res = {"broker": name, "rss_idle_kib": status_kib(pid, "VmRSS")}
        d = Devices(a)
        res["connect_s"] = d.connect_all()
        time.sleep(1.0)
        d.poll(0)
        res["rss_held_kib"] = status_kib(pid, "VmRSS")
        res["connected"] = d.connacked
        c0, t0 = schedstat_s(pid), time.time()
        sent = d.ping_for(a.window)
        c1, t1 = schedstat_s(pid), time.time()
        res.update({
            "pings": sent, "pongs": d.pongs, "closed": d.closed, "failed": d.failed,
            "window_s": t1 - t0, "cpu_per_s": (c1 - c0) / (t1 - t0),
            "kib_per_conn": (res["rss_held_kib"] - res["rss_idle_kib"]) / max(1, d.connacked),
            "rss_end_kib": status_kib(pid, "VmRSS"),
        })
        return res
    finally:
        if d is not None:
            d.close()
        b.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=100_000)
    p.add_argument("--keep-alive", type=int, default=60)
    p.add_argument("--window", type=float, default=60.0, help="seconds of keep-alive traffic measured")
    p.add_argument("--rate", type=float, default=5000.0, help="connects per second while connecting")
    add_broker_args(p, repeats=1)
    a = p.parse_args()
    print_command()
    nofile, hard = raise_file_limit()
    asked = a.devices
    if a.devices > nofile - BROKER_FILES:
        a.devices = nofile - BROKER_FILES
        print(f"NOTE: the file limit is {nofile} (hard {hard}): a broker holds one socket per "
              f"device, so {a.devices:,} devices run instead of {asked:,}; the {asked:,} figures "
              "below are extrapolated from the per-connection ones (raise `ulimit -Hn` as root "
              "for a real run)", flush=True)
    if a.loadgen_cpu is not None and shutil.which("taskset"):
        os.sched_setaffinity(0, {a.loadgen_cpu})
    names = broker_names(a)
    print(f"brokers: {', '.join(names)}; {a.devices:,} idle devices, keep alive {a.keep_alive} s, "
          f"a PINGREQ per device per period; {a.window:.0f} s measured; broker on core "
          f"{a.broker_cpu}, devices on core {a.loadgen_cpu}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="idle-") as tmp:
        runs = run_repeats(a, names, tmp, run_one, show_json)

    def med(name, key):
        v = [r[key] for r in runs if r["broker"] == name and key in r]
        return statistics.median(v) if v else None

    rows = [("devices connected", "connected", 1, 0), ("connect phase, s", "connect_s", 1, 1),
            ("idle resident memory (no clients), MiB", "rss_idle_kib", 1 / 1024, 1),
            ("RSS with the devices, MiB", "rss_held_kib", 1 / 1024, 1),
            ("memory per connection, KiB", "kib_per_conn", 1, 2),
            ("CPU per second, % of a core", "cpu_per_s", 100, 2)]
    print()
    print(f"{'idle devices (median of ' + str(a.repeats) + ')':<44}"
          + "".join(f"{n:>12}" for n in names) + ("    ours/mosq" if len(names) == 2 else ""))
    print("-" * (44 + 12 * len(names) + 13))
    for title, key, scale, d in rows:
        vals = [med(n, key) for n in names]
        cells = "".join(f"{v * scale:>12,.{d}f}" if v is not None else f"{'-':>12}" for v in vals)
        ratio = f"{vals[0] / vals[1]:>13.2f}" if len(names) == 2 and all(vals) and d else ""
        print(f"{title:<44}{cells}{ratio}")
    for n in names:
        cpu, kib, conn = med(n, "cpu_per_s"), med(n, "kib_per_conn"), med(n, "connected")
        if cpu is None or not conn:
            continue
        print(f"{n}: CPU {cpu * 1e6 / conn * 1e4 / 1e6 * 100:.3f}% of a core per 10,000 devices; "
              f"{asked:,} devices: {'extrapolated ' if asked != conn else ''}"
              f"{kib * asked / 1024:,.0f} MiB and {cpu * asked / conn * 100:.1f}% of a core")
    for r in runs:
        if "error" in r:
            print(f"ERROR {r['broker']}: {r['error'][:400]}")
        elif r["closed"] or r["failed"] or r["pongs"] < r["pings"]:
            print(f"WARNING {r['broker']}: {r['closed']} closed, {r['failed']} failed to connect, "
                  f"{r['pings'] - r['pongs']} PINGRESPs missing")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": sys.argv, "date": datetime.datetime.now(datetime.UTC).isoformat(),
                       "host": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "nofile": nofile}, "args": vars(a), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
