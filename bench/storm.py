#!/usr/bin/env python3
"""Reconnect storm after a restart: ours and Mosquitto side by side, each with its persistence.

    .venv/bin/python bench/storm.py                                  # 20,000 devices, both brokers
    .venv/bin/python bench/storm.py --devices 5000 --only ours --repeats 1

For each broker (alternating, --repeats times), with a fresh data directory:

1. setup: --devices devices connect with persistent sessions (MQTT 3.1.1, clean session 0,
   keep alive 60), subscribe to two filters at QoS 1 (`storm/dev/<i>/cmd` and
   `storm/grp/<i % 100>/cfg`) and disconnect; then one publisher sends --queued QoS 1 messages
   to each of a --queued-fraction of them (on their own topic), acknowledged by the broker
   while they are offline, so they wait in the sessions' queues.
2. the broker is stopped (SIGTERM: Mosquitto writes its persistence file then; ours has
   committed every change) and started again: the restart.
3. the storm: as soon as the port accepts connections, every device reconnects with its
   session, the connects spread evenly over --spread seconds (1 s), each device PUBACKs the
   queued messages it gets. Meanwhile --pingers clients, connected before the storm, send a
   PINGREQ every --ping-interval and time the PINGRESP (the accept loop must not starve
   established clients: goal < 50 ms).

Printed per broker: seconds from the restart until the port accepts, until every CONNACK,
until every queued message arrived; CONNACKs refused or missing, sessions not present, queued
messages missing; the broker's peak RSS (VmHWM) and CPU (schedstat, restart to the end, and
the restore before listening); the PINGREQ round trip p50/p99/max during the storm; the
load generator's CPU.

Processes: the broker pinned to --broker-cpu (taskset), the storm's workers (--workers
processes, each a share of the devices, each from its own 127.0.x.y source address so the
ephemeral ports of one do not run out) and the pinger (SCHED_FIFO when allowed, so its round
trip is the broker's, not the busy load generator core's) pinned to --loadgen-cpu.

File limits: every device is one socket in the broker and one in a worker. The script raises
its soft RLIMIT_NOFILE to the hard limit (children inherit it); where the hard limit is lower
than --devices + --pingers + 64 (the broker's own files), it runs with as many devices as fit
and says so (`ulimit -Hn` is raised only by root with CAP_SYS_RESOURCE, e.g. in
/etc/security/limits.conf or the container's --ulimit nofile=...).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import errno
import json
import os
import platform
import select
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from harness import (
    PY,
    REPO,
    add_broker_args,
    broker_names,
    broker_proc,
    free_port,
    pin,
    print_command,
    raise_file_limit,
    run_dir,
    run_repeats,
    schedstat_s,
    status_kib,
)

BROKER_FILES = 64  # files a broker holds besides its clients' sockets (listener, epoll, db, logs)
GROUPS = 100
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux


# ----------------------------------------------------------------- MQTT 3.1.1 packets

def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    n, rl = len(body), bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        rl.append(b | (0x80 if n else 0))
        if not n:
            break
    return bytes([first]) + bytes(rl) + body


def connect_packet(client_id: str, clean: bool, keep_alive: int = 60) -> bytes:
    return _packet(0x10, _str("MQTT") + bytes([4, 0x02 if clean else 0x00])
                   + struct.pack(">H", keep_alive) + _str(client_id))


def device_id(i: int) -> str:
    return f"storm-dev-{i:06d}"


def device_filters(i: int) -> list[str]:
    return [f"storm/dev/{i}/cmd", f"storm/grp/{i % GROUPS}/cfg"]


def queued_count(i: int, fraction: float, per_device: int) -> int:
    """Messages queued for device i while it is offline (every 1/fraction-th device)."""
    if fraction <= 0 or per_device <= 0:
        return 0
    step = max(1, round(1 / fraction))
    return per_device if i % step == 0 else 0


def split_packets(buf: bytes) -> tuple[list, bytes]:
    """The whole packets at the start of buf as (first byte, body), and the rest."""
    pos, n, pkts = 0, len(buf), []
    while n - pos >= 2:
        rl, hl = 0, 1
        for k in range(4):
            if pos + hl >= n:
                return pkts, buf[pos:]
            b = buf[pos + hl]
            hl += 1
            rl |= (b & 0x7F) << (7 * k)
            if not b & 0x80:
                break
        if pos + hl + rl > n:
            break
        pkts.append((buf[pos], buf[pos + hl:pos + hl + rl]))
        pos += hl + rl
    return pkts, buf[pos:]


# ----------------------------------------------------------------- worker side (asyncio)

class Device(asyncio.Protocol):
    """One device: CONNECT, then SUBSCRIBE (setup) or PUBACK what arrives (storm)."""
    __slots__ = (
        "buf",
        "closed",
        "connack_at",
        "done_at",
        "finished",
        "got",
        "i",
        "present",
        "rc",
        "start",
        "suback",
        "transport",
        "w",
        "want",
    )

    def __init__(self, i: int, w: Worker, want: int = 0):
        self.i, self.w, self.want = i, w, want
        self.transport = None
        self.buf = b""
        self.connack_at = self.done_at = None
        self.present = self.rc = None
        self.got = 0
        self.suback = False
        self.closed = False
        self.start = 0.0
        self.finished = False  # counted by the worker: refused, closed, or got all it waits for

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(connect_packet(device_id(self.i), clean=False))

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.w.changed(self)

    def data_received(self, data: bytes) -> None:
        out = self.feed(data)
        if out:
            self.transport.write(out)

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the broker; returns the replies (PUBACKs) to send."""
        pkts, self.buf = split_packets(self.buf + data if self.buf else data)
        out = []
        for first, body in pkts:
            t = first >> 4
            if t == 2:  # CONNACK
                self.connack_at = time.time()
                self.present, self.rc = body[0] & 1, body[1]
                if self.want == 0:
                    self.done_at = self.connack_at
                self.w.changed(self)
            elif t == 3:  # PUBLISH
                if first & 0x06:
                    tl = (body[0] << 8) | body[1]
                    out.append(b"\x40\x02" + body[2 + tl:4 + tl])  # PUBACK
                self.got += 1
                if self.got == self.want:
                    self.done_at = time.time()
                    self.w.changed(self)
            elif t == 9:  # SUBACK
                self.suback = all(c < 0x80 for c in body[2:])
                self.w.changed(self)
        return b"".join(out)


class Pinger(asyncio.Protocol):
    def __init__(self, i: int, samples: list):
        self.i, self.samples = i, samples
        self.transport = None
        self.sent_at = None
        self.connected = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(connect_packet(f"storm-ping-{os.getpid()}-{self.i}", clean=True, keep_alive=0))

    def data_received(self, data: bytes) -> None:
        now = time.time()
        for k in range(0, len(data) - 1, 2):
            if data[k] == 0x20 and not self.connected.done():
                self.connected.set_result(True)
            elif data[k] == 0xD0 and self.sent_at is not None:
                self.samples.append((self.sent_at, now - self.sent_at))
                self.sent_at = None

    def ping(self) -> None:
        if self.sent_at is None and self.transport is not None and not self.transport.is_closing():
            self.sent_at = time.time()
            self.transport.write(b"\xc0\x00")

    def connection_lost(self, exc) -> None:
        self.transport = None


class Worker:
    def __init__(self, a):
        self.a = a
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.left = 0  # storm: devices not finished yet

    def changed(self, d: Device) -> None:
        """A device's state moved: wake the waiting coroutine (setup), count it (storm)."""
        self.event.set()
        if not d.finished and (d.closed or d.done_at is not None or d.rc not in (None, 0)):
            d.finished = True
            self.left -= 1

    async def connect(self, factory, source: str):
        """Connect from the address `source`: bound with IP_BIND_ADDRESS_NO_PORT, so the port
        is chosen at connect() for the 4-tuple (a plain bind(port 0) searches the port range
        for one free on that address: slower with every socket bound, 13 s of CPU at 20,000)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((source, 0))
            sock.setblocking(False)
            await self.loop.sock_connect(sock, (self.a.host, self.a.port))
            return await self.loop.create_connection(factory, sock=sock)
        except BaseException:
            sock.close()
            raise

    async def setup(self, ids: list[int], source: str) -> dict:
        sem = asyncio.Semaphore(200)
        ok = 0

        async def one(i: int) -> None:
            nonlocal ok
            async with sem:
                d = Device(i, self)
                try:
                    await self.connect(lambda: d, source)
                except OSError:
                    return
                while d.rc is None and not d.closed:
                    await self.wait()
                if d.rc != 0:
                    d.transport.close()
                    return
                fs = device_filters(i)
                d.transport.write(_packet(0x82, b"\x00\x01" + b"".join(_str(f) + b"\x01" for f in fs)))
                while not d.suback and not d.closed:
                    await self.wait()
                if d.suback:
                    ok += 1
                d.transport.write(b"\xe0\x00")
                d.transport.close()

        await asyncio.gather(*(one(i) for i in ids))
        return {"subscribed": ok}

    async def wait(self) -> None:
        self.event.clear()
        try:
            await asyncio.wait_for(self.event.wait(), 1.0)
        except TimeoutError:
            pass

    async def publish(self, ids: list[int], source: str) -> dict:
        """One client publishes the queued messages (QoS 1, window 100), waits for the PUBACKs."""
        loop = self.loop
        acked = [0]
        done = loop.create_future()
        total = sum(queued_count(i, self.a.queued_fraction, self.a.queued) for i in ids)

        class Pub(asyncio.Protocol):
            def connection_made(self, t):
                self.t = t
                t.write(connect_packet(f"storm-pub-{os.getpid()}", clean=True))

            def data_received(self, data):
                pkts, self.buf = split_packets(getattr(self, "buf", b"") + data)
                for first, _ in pkts:
                    if first == 0x20 and not ready.done():
                        ready.set_result(True)
                    elif first == 0x40:
                        acked[0] += 1
                        if acked[0] == total and not done.done():
                            done.set_result(True)

        ready = loop.create_future()
        _, p = await self.connect(Pub, source)
        await ready
        pid, sent = 0, 0
        payload = b"q" * 64
        for i in ids:
            for _k in range(queued_count(i, self.a.queued_fraction, self.a.queued)):
                pid = pid % 65535 + 1
                topic = f"storm/dev/{i}/cmd"
                p.t.write(_packet(0x32, _str(topic) + struct.pack(">H", pid) + payload))
                sent += 1
                while sent - acked[0] >= 100:
                    await asyncio.sleep(0.001)
        if total:
            await asyncio.wait_for(done, 120)
        p.t.write(b"\xe0\x00")
        p.t.close()
        return {"queued": total, "acked": acked[0]}

    def storm(self, ids: list[int], source: str, t0: float) -> dict:
        """Reconnect every device of `ids`, spread evenly over a.spread seconds from t0.

        Plain non-blocking sockets and epoll, no asyncio: about a third of the CPU per device
        of asyncio transports, so that the load generator's core keeps up with 20,000
        reconnects in a second as far as it can (its CPU is reported)."""
        a = self.a
        devices = [Device(i, self, queued_count(i, a.queued_fraction, a.queued)) for i in ids]
        ep = select.epoll(len(devices) + 16)
        by_fd: dict = {}
        socks: dict = {}
        failed = 0
        n = len(devices)
        connect = connect_packet  # each device's CONNECT, made when due
        addr = (a.host, a.port)
        cpu0 = time.process_time()
        self.left = n
        deadline = t0 + a.timeout
        k = 0
        IN, OUT = select.EPOLLIN, select.EPOLLOUT
        BAD = select.EPOLLERR | select.EPOLLHUP
        while self.left > 0:
            now = time.time()
            if now > deadline:
                break
            while k < n and t0 + a.spread * k / n <= now:  # the devices due by now
                d = devices[k]
                k += 1
                d.start = now
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.bind((source, 0))
                    sock.setblocking(False)
                    err = sock.connect_ex(addr)
                    if err not in (0, errno.EINPROGRESS):
                        raise OSError(err, os.strerror(err))
                except OSError:
                    sock.close()
                    failed += 1
                    d.closed = True
                    self.changed(d)
                    continue
                fd = sock.fileno()
                by_fd[fd] = d
                socks[fd] = sock
                ep.register(fd, OUT | IN)
            timeout = 0.05 if k >= n else max(0.0, min(0.05, t0 + a.spread * k / n - time.time()))
            for fd, ev in ep.poll(timeout):
                d, sock = by_fd[fd], socks[fd]
                if ev & OUT and d.transport is None:  # connected: the CONNECT
                    d.transport = sock
                    ep.modify(fd, IN)
                    try:
                        sock.send(connect(device_id(d.i), clean=False))
                    except OSError:
                        ev |= BAD
                if ev & IN:
                    try:
                        data = sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        data = b""
                    if data:
                        out = d.feed(data)
                        if out:
                            sock.send(out)  # (a few PUBACKs: the socket buffer takes them)
                    elif data is not None:
                        ev |= BAD
                if ev & BAD:
                    ep.unregister(fd)
                    d.closed = True
                    self.changed(d)
        cpu = time.process_time() - cpu0
        self.devices = devices
        self.socks = socks
        return {
            "devices": n, "connect_failed": failed,
            "connacks": sum(1 for d in devices if d.rc is not None),
            "refused": sum(1 for d in devices if d.rc not in (None, 0)),
            "closed_early": sum(1 for d in devices if d.closed and d.done_at is None),
            "not_present": sum(1 for d in devices if d.rc == 0 and not d.present),
            "queued_expected": sum(d.want for d in devices),
            "queued_got": sum(min(d.got, d.want) for d in devices),
            "extra_got": sum(max(0, d.got - d.want) for d in devices),
            "first_start": min((d.start for d in devices if d.start), default=None),
            "last_connack": max((d.connack_at for d in devices if d.connack_at), default=None),
            "last_done": max((d.done_at for d in devices if d.done_at), default=None),
            "all_done": all(d.done_at is not None for d in devices),
            "connack_lat": sorted(d.connack_at - d.start for d in devices if d.connack_at),
            "cpu_s": cpu,
        }

    async def ping(self, n: int, interval: float, source: str) -> None:
        samples: list = []
        pingers = []
        for i in range(n):
            _, p = await self.connect(lambda i=i: Pinger(i, samples), source)
            await asyncio.wait_for(p.connected, 30)
            pingers.append(p)
        print(json.dumps({"ready": True}), flush=True)
        stop = asyncio.ensure_future(self.loop.run_in_executor(None, sys.stdin.readline))
        while not stop.done():
            for p in pingers:
                p.ping()
            await asyncio.sleep(interval)
        missing = sum(1 for p in pingers if p.transport is None)
        print(json.dumps({"samples": samples, "lost": missing}), flush=True)


async def worker_main(a) -> None:
    w = Worker(a)
    ids = list(range(a.lo, a.hi))
    if a.role == "setup":
        res = await w.setup(ids, a.source)
    elif a.role == "publish":
        res = await w.publish(list(range(a.devices)), a.source)
    elif a.role == "ping":
        await w.ping(a.pingers, a.ping_interval, a.source)
        return
    else:  # storm: wait for "go T0" from the orchestrator
        print(json.dumps({"ready": True}), flush=True)
        line = await w.loop.run_in_executor(None, sys.stdin.readline)
        res = w.storm(ids, a.source, float(line.split()[1]))
        print(json.dumps(res), flush=True)
        await w.loop.run_in_executor(None, sys.stdin.readline)  # "stop"
        for sock in w.socks.values():
            try:
                sock.send(b"\xe0\x00")
            except OSError:
                pass
            sock.close()
        return
    print(json.dumps(res), flush=True)


# ----------------------------------------------------------------- orchestrator

def spawn_worker(a, role: str, port: int, lo: int, hi: int, source: str,
                 fifo: bool = False) -> subprocess.Popen:
    argv = pin(a.loadgen_cpu)
    if fifo and shutil.which("chrt"):
        argv += ["chrt", "-f", "10"]
    argv += [PY, os.path.abspath(__file__), "--role", role, "--host", a.host, "--port", str(port),
             "--lo", str(lo), "--hi", str(hi), "--source", source, "--devices", str(a.devices),
             "--queued", str(a.queued), "--queued-fraction", str(a.queued_fraction),
             "--spread", str(a.spread), "--timeout", str(a.timeout), "--pingers", str(a.pingers),
             "--ping-interval", str(a.ping_interval)]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read_json(p: subprocess.Popen, timeout: float) -> dict:
    line = p.stdout.readline()
    if not line:
        p.wait(timeout)
        raise RuntimeError(f"worker exited with {p.returncode}")
    return json.loads(line)


def slices(n: int, k: int) -> list[tuple[int, int]]:
    return [(n * j // k, n * (j + 1) // k) for j in range(k)]


def pct(xs: list, q: float):
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def run_one(a, name: str, tmp: str, rep: int) -> dict:
    datadir = run_dir(tmp, name, rep)
    port = free_port(a.host)
    b = broker_proc(a, name, port, datadir,
                    f"persistence true\npersistence_location {datadir}/\n"
                    "# stock otherwise: max_queued_messages 1000, max_inflight_messages 20,\n"
                    "# autosave_interval 1800 (and at shutdown), set_tcp_nodelay false\n")
    res: dict = {"broker": name}
    workers: list = []
    pinger = None
    try:
        # 1. setup: sessions with subscriptions, then queued messages
        b.start()
        if not b.wait_port(a.host, port):
            raise RuntimeError(f"{name} did not start: {b.tail()}")
        t = time.time()
        ws = [spawn_worker(a, "setup", port, lo, hi, f"127.0.1.{j + 1}")
              for j, (lo, hi) in enumerate(slices(a.devices, a.workers))]
        res["subscribed"] = sum(read_json(w, 600)["subscribed"] for w in ws)
        for w in ws:
            w.wait(30)
        pub = spawn_worker(a, "publish", port, 0, a.devices, "127.0.1.100")
        r = read_json(pub, 600)
        pub.wait(30)
        res["queued_acked"] = r["acked"]
        res["setup_s"] = time.time() - t
        time.sleep(0.5)
        # 2. restart
        b.stop()
        ws = [spawn_worker(a, "storm", port, lo, hi, f"127.0.2.{j + 1}")
              for j, (lo, hi) in enumerate(slices(a.devices, a.workers))]
        workers = ws
        for w in ws:
            read_json(w, 60)  # ready (imports done)
        t_restart = time.time()
        pid = b.start()
        if not b.wait_port(a.host, port):
            raise RuntimeError(f"{name} did not restart: {b.tail()}")
        t_listen = time.time()
        cpu_listen = schedstat_s(pid)
        spy = None
        if a.py_spy and name == "ours":  # a profile of the storm (its figures: not comparable)
            spy = subprocess.Popen(pin(a.loadgen_cpu) + [
                os.path.join(os.path.dirname(PY), "py-spy"), "record", "--nonblocking", "-r", "250",
                "-f", "raw", "-o", a.py_spy, "-d", "15", "-p", str(pid)], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            time.sleep(1)
        res["rss_listen_kib"] = status_kib(pid, "VmRSS")
        # 3. the storm, with established pingers
        pinger = spawn_worker(a, "ping", port, 0, 0, "127.0.3.1", fifo=True)
        read_json(pinger, 60)
        t0 = time.time() + 0.05
        for w in ws:
            w.stdin.write(f"go {t0!r}\n")
            w.stdin.flush()
        outs = [read_json(w, a.timeout + 60) for w in ws]
        t_end = time.time()
        cpu_end = schedstat_s(pid)
        res["rss_peak_kib"] = status_kib(pid, "VmHWM")
        res["rss_end_kib"] = status_kib(pid, "VmRSS")
        pinger.stdin.write("stop\n")
        pinger.stdin.flush()
        pr = read_json(pinger, 60)
        pinger.wait(30)
        pinger = None
        if spy is not None:
            spy.wait(60)
        for w in ws:
            w.stdin.write("stop\n")
            w.stdin.flush()
        for w in ws:
            w.wait(60)
        workers = []
        lat = sorted(x for o in outs for x in o["connack_lat"])
        last_connack = max((o["last_connack"] for o in outs if o["last_connack"]), default=None)
        last_done = max((o["last_done"] for o in outs if o["last_done"]), default=None)
        first = min((o["first_start"] for o in outs if o["first_start"]), default=None)
        window = [rtt for (sent, rtt) in pr["samples"] if t0 <= sent <= (last_done or t_end)]
        window.sort()
        res.update({
            "devices": sum(o["devices"] for o in outs),
            "connacks": sum(o["connacks"] for o in outs),
            "refused": sum(o["refused"] for o in outs),
            "connect_failed": sum(o["connect_failed"] for o in outs),
            "closed_early": sum(o["closed_early"] for o in outs),
            "not_present": sum(o["not_present"] for o in outs),
            "queued_expected": sum(o["queued_expected"] for o in outs),
            "queued_got": sum(o["queued_got"] for o in outs),
            "extra_got": sum(o["extra_got"] for o in outs),
            "all_done": all(o["all_done"] for o in outs),
            "listen_s": t_listen - t_restart,
            "connack_all_s": (last_connack - t_restart) if last_connack else None,
            "delivered_all_s": (last_done - t_restart) if last_done else None,
            "storm_connack_s": (last_connack - first) if last_connack and first else None,
            "storm_delivered_s": (last_done - first) if last_done and first else None,
            "connack_lat_ms": {k: (pct(lat, q) or 0) * 1e3 for k, q in
                               (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
            "broker_cpu_restore_s": cpu_listen,
            "broker_cpu_storm_s": (cpu_end - cpu_listen) if cpu_end is not None else None,
            "loadgen_cpu_s": sum(o["cpu_s"] for o in outs),
            "ping_ms": {k: (pct(window, q) or 0) * 1e3 for k, q in
                        (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
            "ping_samples": len(window), "pingers_lost": pr["lost"],
            "wall_s": t_end - t_restart,
        })
    finally:
        for w in workers + ([pinger] if pinger else []):
            if w.poll() is None:
                w.kill()
        b.stop()
    return res


def fmt(x, d=2):
    return "-" if x is None else f"{x:,.{d}f}"


def show_run(r: dict) -> str:
    if "error" in r:
        return f"error: {r['error'][:400]}"
    return (f"CONNACKs {r['connacks']:,}/{r['devices']:,} in {fmt(r['connack_all_s'], 3)} s, "
            f"queued {r['queued_got']:,}/{r['queued_expected']:,} in "
            f"{fmt(r['delivered_all_s'], 3)} s after the restart; ping max "
            f"{r['ping_ms']['max']:.1f} ms; broker CPU {fmt(r['broker_cpu_storm_s'], 2)} s")


def report(runs: list[dict], names: list[str], a) -> None:
    rows = [
        ("devices reconnecting", "devices", 0),
        ("sessions subscribed at setup", "subscribed", 0),
        ("queued QoS 1 messages acked at setup", "queued_acked", 0),
        ("restart -> port accepts, s", "listen_s", 3),
        ("restart -> every CONNACK, s", "connack_all_s", 3),
        ("restart -> every queued message, s", "delivered_all_s", 3),
        ("first connect -> every CONNACK, s", "storm_connack_s", 3),
        ("first connect -> every queued msg, s", "storm_delivered_s", 3),
        ("CONNACK latency p50, ms", ("connack_lat_ms", "p50"), 1),
        ("CONNACK latency p99, ms", ("connack_lat_ms", "p99"), 1),
        ("PINGREQ round trip p50, ms", ("ping_ms", "p50"), 2),
        ("PINGREQ round trip p99, ms", ("ping_ms", "p99"), 2),
        ("PINGREQ round trip max, ms", ("ping_ms", "max"), 2),
        ("broker CPU restoring (to listening), s", "broker_cpu_restore_s", 3),
        ("broker CPU during the storm, s", "broker_cpu_storm_s", 3),
        ("broker peak RSS (VmHWM), MiB", "rss_peak_kib", 1),
        ("broker RSS when listening, MiB", "rss_listen_kib", 1),
        ("load generator CPU (storm), s", "loadgen_cpu_s", 2),
        ("CONNACKs refused", "refused", 0),
        ("connects failed / closed early", None, 0),
        ("sessions not present", "not_present", 0),
        ("queued messages missing", None, 0),
    ]

    def get(r, key):
        if key is None:
            return None
        if isinstance(key, tuple):
            return (r.get(key[0]) or {}).get(key[1])
        v = r.get(key)
        return v / 1024 if v is not None and key.startswith("rss") else v

    def med(name, key):
        vals = [get(r, key) for r in runs if r["broker"] == name and "error" not in r]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    print()
    print(f"{'storm (median of ' + str(a.repeats) + ')':<42}" + "".join(f"{n:>14}" for n in names)
          + ("   ours/mosq" if len(names) == 2 else ""))
    print("-" * (42 + 14 * len(names) + 12))
    for title, key, d in rows:
        if key is None:  # sums over the runs
            keys = (("connect_failed", "closed_early") if title.startswith("connects")
                    else ("queued_expected", "-queued_got"))
            cells = [sum((-1 if k[0] == "-" else 1) * r.get(k.lstrip("-"), 0) for r in runs
                         for k in keys if r["broker"] == n and "error" not in r) for n in names]
            print(f"{title + ' (sum)':<42}" + "".join(f"{c:>14,}" for c in cells))
            continue
        vals = [med(n, key) for n in names]
        ratio = ""
        if len(names) == 2 and vals[0] and vals[1] and d:
            ratio = f"{vals[0] / vals[1]:>12.2f}"
        print(f"{title:<42}" + "".join(f"{fmt(v, d):>14}" for v in vals) + ratio)
    for r in runs:
        if "error" in r:
            print(f"ERROR {r['broker']}: {r['error'][:400]}")
        elif not r.get("all_done"):
            print(f"WARNING {r['broker']} run {r.get('repeat')}: not every device got its CONNACK "
                  f"and queued messages within --timeout {a.timeout} s")
    ping = [r["ping_ms"]["max"] for r in runs if r.get("broker") == "ours" and "ping_ms" in r]
    if ping:
        print(f"\nours: PINGREQ round trip of established clients during the storm, worst run max "
              f"{max(ping):.1f} ms (goal < 50 ms): {'met' if max(ping) < 50 else 'NOT met'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=20000)
    p.add_argument("--queued", type=int, default=4, help="QoS 1 messages queued per queued device")
    p.add_argument("--queued-fraction", type=float, default=0.25,
                   help="share of the devices with queued messages (default 0.25: every 4th)")
    p.add_argument("--spread", type=float, default=1.0, help="reconnects spread over this many s")
    p.add_argument("--pingers", type=int, default=10)
    p.add_argument("--ping-interval", type=float, default=0.01)
    p.add_argument("--workers", type=int, default=2, help="load generator processes for the devices")
    p.add_argument("--timeout", type=float, default=120.0)
    add_broker_args(p, repeats=2, broker_cmd_note="; its persistence is on by default")
    p.add_argument("--py-spy", metavar="FILE",
                   help="record our restarted broker with py-spy (raw stacks to FILE; its figures "
                        "are then not comparable)")
    # worker side (the script runs itself)
    p.add_argument("--role", choices=["setup", "publish", "storm", "ping"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lo", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--hi", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--source", default="127.0.0.1", help=argparse.SUPPRESS)
    a = p.parse_args()

    nofile, hard = raise_file_limit()
    if a.role:
        sys.path.insert(0, REPO)
        from broker.transport.eventloop import install_uvloop
        install_uvloop()
        asyncio.run(worker_main(a))
        return 0

    print_command()
    fit = nofile - a.pingers - BROKER_FILES
    if a.devices > fit:
        print(f"NOTE: the file limit is {nofile} (hard {hard}): a broker holds one socket per "
              f"device, so {fit:,} devices run instead of {a.devices:,} (raise `ulimit -Hn` as root "
              "for more)", flush=True)
        a.devices = fit
    per_worker = a.devices / a.workers + 16
    if per_worker > nofile:
        a.workers = -(-a.devices // (nofile - 16))
    names = broker_names(a)
    ver = ""
    if "mosquitto" in names:
        r = subprocess.run([a.mosquitto_bin, "-h"], capture_output=True, text=True, check=False)
        ver = (r.stdout + r.stderr).splitlines()[0].strip()
    print(f"brokers: {', '.join(names)} {ver}; {a.devices:,} devices, 2 QoS 1 subscriptions each, "
          f"{a.queued} queued QoS 1 messages for every {round(1 / a.queued_fraction)}th device, "
          f"reconnects spread over {a.spread} s; broker on core {a.broker_cpu}, "
          f"{a.workers} load generator processes and the pinger on core {a.loadgen_cpu}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="storm-") as tmp:
        runs = run_repeats(a, names, tmp, run_one, show_run)
    report(runs, names, a)
    if a.json:
        for r in runs:
            r.pop("connack_lat", None)
        with open(a.json, "w") as f:
            json.dump({"command": sys.argv, "date": datetime.datetime.now(datetime.UTC).isoformat(),
                       "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "nofile": nofile},
                       "mosquitto_version": ver, "args": vars(a), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
