"""Raw asyncio/uvloop MQTT load generator used by bench/bench.py.

One process runs every client of one scenario on one event loop (the bench
pins it to its own core).  It speaks MQTT 3.1.1 by default (``--mqtt 5`` for
MQTT 5 with empty property sets) and is written to keep per-message Python
work tiny:

* PUBLISH packets are encoded once; QoS 0 publishers write ~64 KiB batches of
  pre-joined packets until the transport's high-water mark pauses them.
* QoS 1/2 publishers keep one pre-encoded PUBLISH per packet id (ids
  1..window) and re-send packet ``p`` as soon as id ``p`` is released
  (PUBACK / PUBCOMP), so the window is refilled with no encoding at all.
* QoS 0 throughput subscribers count bytes / fixed packet size (the first
  PUBLISH header is checked; on mismatch they fall back to parsing).
* The other roles parse fixed headers only and batch all replies produced by
  one ``data_received`` call into a single write.

The result is printed as one JSON line on stdout.  For the ``conns``
scenario the process prints ``READY <n>`` once all connections have their
CONNACK and then waits for a line on stdin before closing them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# uvloop as the broker runs it: its table of transports a dict (broker/transport/eventloop.py),
# 3 us less of the load generator's CPU per connection, the same against every broker
from broker.transport.eventloop import install_uvloop, transport_table  # noqa: E402

PAYLOAD_SIZE = 64
MQTT_VERSION = 4
CONNECT_FLAGS = 0x02  # clean session; --persistent makes it 0x00

# ----------------------------------------------------------------- encoding


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def mqtt_str(s: str | bytes) -> bytes:
    if isinstance(s, str):
        s = s.encode()
    return struct.pack(">H", len(s)) + s


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def props() -> bytes:
    """Empty property block (MQTT 5 only)."""
    return b"\x00" if MQTT_VERSION == 5 else b""


def connect_packet(client_id: str, keepalive: int = 0) -> bytes:
    vh = (mqtt_str("MQTT") + bytes([MQTT_VERSION, CONNECT_FLAGS])
          + struct.pack(">H", keepalive)
          + ((b"\x05\x11\x00\x00\x0e\x10" if CONNECT_FLAGS == 0 else b"\x00") if MQTT_VERSION == 5 else b""))
    return packet(0x10, vh + mqtt_str(client_id))


def subscribe_packet(pid: int, topic: str, qos: int) -> bytes:
    return packet(0x82, struct.pack(">H", pid) + props() + mqtt_str(topic) + bytes([qos]))


def publish_packet(topic: str, payload: bytes, qos: int = 0, pid: int = 0) -> bytes:
    body = mqtt_str(topic)
    if qos:
        body += struct.pack(">H", pid)
    body += props() + payload
    return packet(0x30 | (qos << 1), body)


DISCONNECT = b"\xe0\x00"


def make_payload(tag: int = 0) -> bytes:
    return (b"%016x" % tag + b"x" * PAYLOAD_SIZE)[:PAYLOAD_SIZE]


# ----------------------------------------------------------------- protocol


class Client(asyncio.Protocol):
    """Minimal MQTT client; subclasses override on_publish / on_ack."""

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.transport = None
        self.buf = bytearray()
        self.connack = asyncio.get_running_loop().create_future()
        self.suback = None
        self.closed = asyncio.get_running_loop().create_future()
        self.paused = False
        self.out = []  # replies produced during one data_received

    # -- transport callbacks
    def connection_made(self, transport):
        self.transport = transport  # (TCP_NODELAY: uvloop and asyncio set it on TCP transports)
        transport.set_write_buffer_limits(high=256 * 1024, low=64 * 1024)
        transport.write(connect_packet(self.client_id))

    def connection_lost(self, exc):
        if not self.connack.done():
            self.connack.set_exception(
                ConnectionError(f"{self.client_id}: connection lost before CONNACK: {exc}"))
        if self.suback is not None and not self.suback.done():
            self.suback.set_exception(
                ConnectionError(f"{self.client_id}: connection lost before SUBACK"))
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.on_resume()

    def on_resume(self):
        pass

    def data_received(self, data):
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        out = self.out
        while n - pos >= 2:
            b0 = buf[pos]
            rl = buf[pos + 1]
            hl = 2
            if rl & 0x80:
                rl &= 0x7F
                shift = 7
                while True:
                    if pos + hl >= n:
                        rl = -1
                        break
                    b = buf[pos + hl]
                    hl += 1
                    rl |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                if rl < 0:
                    break
            end = pos + hl + rl
            if end > n:
                break
            t = b0 >> 4
            if t == 3:
                self.on_publish(b0, buf, pos + hl, end)
            elif t == 4 or t == 7:  # PUBACK / PUBCOMP
                self.on_release(buf[pos + hl] << 8 | buf[pos + hl + 1])
            elif t == 5:  # PUBREC
                out.append(b"\x62\x02" + bytes(buf[pos + hl:pos + hl + 2]))
            elif t == 6:  # PUBREL
                out.append(b"\x70\x02" + bytes(buf[pos + hl:pos + hl + 2]))
                self.on_pubrel()
            elif t == 2:
                rc = buf[pos + hl + 1]
                if rc != 0:
                    self.connack.set_exception(ConnectionError(f"CONNACK rc={rc}"))
                elif not self.connack.done():
                    self.connack.set_result(True)
            elif t == 9:
                if self.suback is not None and not self.suback.done():
                    self.suback.set_result(bytes(buf[pos + hl + 2:end]))
            pos = end
        if pos:
            del buf[:pos]
        if out:
            self.transport.write(b"".join(out))
            out.clear()
        self.after_data()

    def on_publish(self, b0, buf, start, end):
        pass

    def set_lowat(self, n):
        """SO_RCVLOWAT: only wake up when >= n bytes are readable (fewer,
        larger reads for byte-counting subscribers)."""
        if self.transport is None or self.transport.is_closing():
            return
        try:
            sock = self.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
        except (OSError, AttributeError):
            pass

    def on_release(self, pid):
        pass

    def on_pubrel(self):
        pass

    def after_data(self):
        pass

    async def subscribe(self, topic: str, qos: int):
        self.suback = asyncio.get_running_loop().create_future()
        self.transport.write(subscribe_packet(1, topic, qos))
        codes = await self.suback
        if codes and codes[-1] >= 0x80:
            raise RuntimeError(f"SUBSCRIBE {topic} refused: {codes.hex()}")


class Subscriber(Client):
    """Counts PUBLISHes; answers QoS 1 (PUBACK) and QoS 2 (PUBREC, PUBCOMP)."""

    def __init__(self, client_id, latency=False, cap=None):
        super().__init__(client_id)
        self.cap = cap
        self.received = 0
        self.latency = latency
        self.samples = []

    def on_publish(self, b0, buf, start, end):
        self.received += 1
        qos = (b0 >> 1) & 3
        tl = buf[start] << 8 | buf[start + 1]
        p = start + 2 + tl
        if qos:
            pid = bytes(buf[p:p + 2])
            p += 2
            self.out.append((b"\x40\x02" if qos == 1 else b"\x50\x02") + pid)
        if self.latency:
            if MQTT_VERSION == 5:
                # property length (varint); we never ask for properties, so
                # usually 0, but skip whatever the broker sent.
                plen, shift = 0, 0
                while True:
                    b = buf[p]
                    p += 1
                    plen |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                p += plen
            t0 = int(bytes(buf[p:p + 16]), 16)
            self.samples.append(time.perf_counter_ns() - t0)

    def after_data(self):
        if self.cap is not None and self.cap.parked:
            self.cap.unpark()


class CountingSubscriber(Client):
    """QoS 0 subscriber that counts bytes / expected PUBLISH size."""

    def __init__(self, client_id, pkt_size: int, first_byte: int):
        super().__init__(client_id)
        self.pkt_size = pkt_size
        self.first_byte = first_byte
        self.counting = False  # switched on after SUBACK
        self.checked = False
        self.nbytes = 0
        self.parsed = 0
        self.fallback = False

    @property
    def received(self):
        return self.parsed if self.fallback else self.nbytes // self.pkt_size

    def start_counting(self):
        self.counting = True
        if self.buf:  # anything that arrived together with SUBACK
            data = bytes(self.buf)
            self.buf.clear()
            self.data_received(data)

    def data_received(self, data):
        if not self.counting or self.fallback:
            Client.data_received(self, data)
            return
        if self.checked:
            self.nbytes += len(data)
            return
        # verify the first PUBLISH really has the size we assume
        probe = bytes(self.buf) + data
        self.buf.clear()
        if len(probe) < 5:
            self.buf += probe
            return
        self.checked = True
        rl, hl, shift = 0, 1, 0
        while hl < 5:
            b = probe[hl]
            hl += 1
            rl |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if probe[0] != self.first_byte or hl + rl != self.pkt_size:
            sys.stderr.write(
                f"loadgen: {self.client_id}: PUBLISH size {hl + rl} (first byte {probe[0]:#x}) != expected "
                f"{self.pkt_size} ({self.first_byte:#x}); falling back to parsing\n")
            self.fallback = True
            Client.data_received(self, probe)
            return
        self.nbytes += len(probe)

    def on_publish(self, b0, buf, start, end):
        self.parsed += 1


class LagCap:
    """End-to-end flow control for QoS 1/2: a publisher whose packet id is
    released (PUBACK/PUBCOMP from the broker) re-uses it only while fewer than
    `max_lag` messages are published-but-not-yet-delivered to the subscribers;
    otherwise the id is parked until the subscribers catch up.  Without it the
    broker acknowledges publishers faster than it can deliver and its queue
    (and latency) grows for the whole run, which is not a steady state."""

    def __init__(self, max_lag, n_sub):
        self.max_lag = max_lag
        self.n_sub = n_sub
        self.pubs = []
        self.subs = []
        self.parked = []  # (publisher, pid)
        self.parks = 0
        self.kicks = 0
        self.baseline = 0  # messages considered stranded by the broker

    async def stall_breaker(self, stall=0.02):
        """If nothing has been delivered for `stall` s while ids are parked,
        the broker is sitting on messages it will not deliver without new
        traffic (mosquitto 2.0.11 strands queued QoS 2 messages this way):
        treat the current lag as stranded, rebase the cap on it and go on.
        Stranded messages show up as delivered_total < acked_total."""
        last = -1
        while True:
            await asyncio.sleep(stall)
            rec = sum(s.received for s in self.subs)
            if self.parked and rec == last:
                self.kicks += 1
                self.baseline = self.lag()
                self.unpark(force=True)
            last = rec

    def lag(self):
        return sum(p.sent for p in self.pubs) * self.n_sub - sum(s.received for s in self.subs)

    def over(self):
        return self.max_lag > 0 and self.lag() - self.baseline >= self.max_lag

    def unpark(self, force=False):
        if not self.parked or (self.over() and not force):
            return
        parked, self.parked = self.parked, []
        by_pub = {}
        for p, pid in parked:
            by_pub.setdefault(p, []).append(pid)
        for p, pids in by_pub.items():
            if p.running and not p.transport.is_closing():
                p.transport.write(b"".join(p.pkts[i] for i in pids))
                p.sent += len(pids)
            else:
                p.inflight -= len(pids)


class Publisher(Client):
    def __init__(self, client_id, topic, qos, window, batch_bytes=65536, cap=None):
        super().__init__(client_id)
        self.cap = cap
        self.topic = topic
        self.qos = qos
        self.running = False
        self.sent = 0  # QoS0: written; QoS1/2: PUBLISH written (incl. in flight)
        self.done = 0  # QoS1/2: PUBACK / PUBCOMP received
        self.inflight = 0
        payload = make_payload(0)
        if qos == 0:
            one = publish_packet(topic, payload)
            self.batch_n = max(1, batch_bytes // len(one))
            self.batch = one * self.batch_n
            self.one = one
        else:
            self.window = window
            # one pre-encoded PUBLISH per packet id
            self.pkts = [None] + [publish_packet(topic, payload, qos, pid) for pid in range(1, window + 1)]

    def start(self):
        self.running = True
        if self.qos == 0:
            self.pump()
        else:
            w = self.window
            self.transport.write(b"".join(self.pkts[1:w + 1]))
            self.sent += w
            self.inflight = w

    def on_resume(self):
        if self.qos == 0 and self.running:
            self.pump()

    def pump(self):
        tr = self.transport
        batch = self.batch
        n = self.batch_n
        while self.running and not self.paused and not tr.is_closing():
            tr.write(batch)
            self.sent += n

    def on_release(self, pid):
        self.done += 1
        if not self.running:
            self.inflight -= 1
        elif self.cap is not None and self.cap.over():
            self.cap.parked.append((self, pid))
            self.cap.parks += 1
        else:
            self.out.append(self.pkts[pid])
            self.sent += 1


class LatencyPublisher(Client):
    def __init__(self, client_id, topic):
        super().__init__(client_id)
        self.topic = topic
        self.sent = 0
        self.prefix = publish_packet(topic, b"\0" * PAYLOAD_SIZE)[:-PAYLOAD_SIZE]
        self.pad = b"x" * (PAYLOAD_SIZE - 16)

    def send_one(self):
        self.transport.write(self.prefix + b"%016x" % time.perf_counter_ns() + self.pad)
        self.sent += 1


# ----------------------------------------------------------------- helpers


def percentile(sorted_values: list, q: float):
    """The q-quantile (0-1) of sorted values, nearest rank rounded down; None when empty."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, int(q * n))] if n else None


class Meter:
    broker_core = None

    def __init__(self, broker_pid):
        self.broker_pid = broker_pid

    @classmethod
    def core_busy(cls):
        """Busy time (s) of the broker's core, all processes together."""
        if cls.broker_core is None:
            return None
        try:
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith(f"cpu{cls.broker_core} "):
                        v = [int(x) for x in line.split()[1:]]
                        return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
        return None

    def broker_cpu(self):
        """CPU seconds of the broker process (all threads): from schedstat, in ns (the clock-tick
        figures of /proc/<pid>/stat step by 10 ms: 2 us per connection in `conns`), else stat."""
        if not self.broker_pid:
            return None
        try:
            total = 0
            for task in os.listdir(f"/proc/{self.broker_pid}/task"):
                try:
                    with open(f"/proc/{self.broker_pid}/task/{task}/schedstat") as f:
                        total += int(f.read().split()[0])
                except FileNotFoundError:
                    pass  # a thread that ended meanwhile
            return total / 1e9
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/{self.broker_pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime, stime are fields 14, 15 (1-based) -> index 11, 12 after ')'
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return None

    @staticmethod
    def steal():
        """Host steal + other-process time is invisible here; report steal
        ticks summed over all CPUs (a noisy-neighbour indicator)."""
        try:
            with open("/proc/stat") as f:
                return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def snap(self):
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return (time.perf_counter(), ru.ru_utime + ru.ru_stime, self.broker_cpu(), ru.ru_utime, self.steal(),
                self.core_busy())

    @staticmethod
    def util(a, b):
        wall = b[0] - a[0]
        out = {"wall_s": wall, "loadgen_cpu": (b[1] - a[1]) / wall, "loadgen_user": (b[3] - a[3]) / wall,
               "steal": (b[4] - a[4]) / wall}
        if a[2] is not None and b[2] is not None:
            out["broker_cpu"] = (b[2] - a[2]) / wall
            if a[5] is not None and b[5] is not None:
                # whatever else ran on the broker's core (other processes,
                # interrupts/softirq of loopback traffic): noisy-neighbour hint
                out["broker_core_other"] = max(0.0, (b[5] - a[5]) / wall - out["broker_cpu"])
        return out


async def connect(loop, factory, host, port, timeout=30.0):
    tr, proto = await asyncio.wait_for(loop.create_connection(factory, host, port), timeout)
    await asyncio.wait_for(proto.connack, timeout)
    return proto


async def gather_limited(coros, limit=200):
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def settle(get_count, target, timeout=5.0, quiet=1.0):
    """Wait until get_count() >= target; give up after `timeout` s or when the
    count has not moved for `quiet` s.  Returns True when target was reached."""
    deadline = time.perf_counter() + timeout
    last = get_count()
    last_change = time.perf_counter()
    while True:
        c = get_count()
        if c >= target:
            return True
        now = time.perf_counter()
        if c != last:
            last, last_change = c, now
        if now >= deadline or now - last_change > quiet:
            return False
        await asyncio.sleep(0.02)


def close_all(clients):
    for c in clients:
        if c.transport is not None and not c.transport.is_closing():
            try:
                c.transport.write(DISCONNECT)
            except Exception:
                pass
            c.transport.close()


# ----------------------------------------------------------------- scenarios


def pub_port(a, i: int) -> int:
    """Publisher i's port: --pub-ports round robin (a cluster's nodes), else --port."""
    ports = [int(x) for x in a.pub_ports.split(",")] if a.pub_ports else [a.port]
    return ports[i % len(ports)]


async def run_throughput(a, loop, qos, n_pub, n_sub, sub_topic, pub_topic_fmt):
    meter = Meter(a.broker_pid)
    topics = [pub_topic_fmt.format(i=i) for i in range(n_pub)]
    tlen = {len(t) for t in topics}
    cap = LagCap(a.max_lag, n_sub) if qos else None
    if qos == 0 and len(tlen) == 1:
        tl = tlen.pop()
        size = len(publish_packet("x" * tl, make_payload()))

        def factory_sub(i):
            s = CountingSubscriber(f"bsub{i}-{os.getpid()}", size, 0x30)
            return s
    else:
        def factory_sub(i):
            return Subscriber(f"bsub{i}-{os.getpid()}", cap=cap)
    subs = await gather_limited(
        [connect(loop, lambda i=i: factory_sub(i), a.host, a.sub_port or a.port)
         for i in range(n_sub)])
    await asyncio.gather(*(s.subscribe(sub_topic, qos) for s in subs))
    for s in subs:
        if isinstance(s, CountingSubscriber):
            s.start_counting()
            if a.rcvlowat > 1:
                s.set_lowat(a.rcvlowat)
    pubs = await asyncio.gather(*(
        connect(loop, lambda i=i: Publisher(f"bpub{i}-{os.getpid()}", topics[i], qos, a.window, cap=cap),
                a.host, pub_port(a, i))
        for i in range(n_pub)))
    if cap is not None:
        cap.pubs, cap.subs = pubs, subs
    await asyncio.sleep(0.05)  # let subscriptions settle in brokers that route asynchronously

    def received():
        return sum(s.received for s in subs)

    def sent():
        return sum(p.sent for p in pubs)

    breaker = None
    if cap is not None and a.max_lag > 0:
        breaker = asyncio.ensure_future(cap.stall_breaker())
    for p in pubs:
        p.start()
    await asyncio.sleep(a.warmup)
    r0, s0, m0 = received(), sent(), meter.snap()
    await asyncio.sleep(a.duration)
    r1, s1, m1 = received(), sent(), meter.snap()
    for p in pubs:
        p.running = False
    if breaker is not None:
        breaker.cancel()
    if cap is not None:  # give parked ids back so the drain accounting is right
        for p, _pid in cap.parked:
            p.inflight -= 1
        cap.parked.clear()
    for s in subs:
        s.set_lowat(1)
    res = Meter.util(m0, m1)
    res["subs_disconnected"] = sum(1 for s in subs if s.closed.done())
    res["pubs_disconnected"] = sum(1 for p in pubs if p.closed.done())
    # drain: QoS1/2 wait for the publishers' windows to be acknowledged and
    # for the subscribers to get everything that was acknowledged.
    if qos:
        deadline = time.perf_counter() + a.drain
        while time.perf_counter() < deadline and any(p.inflight > 0 for p in pubs):
            await asyncio.sleep(0.02)
        complete = await settle(received, target=sum(p.done for p in pubs) * n_sub,
                                timeout=a.drain)
    else:
        # QoS 0: publishers are not flow controlled by acks, so a backlog in
        # socket buffers / broker queues may still be draining; do not wait long.
        complete = await settle(received, target=sent() * n_sub,
                                timeout=min(a.drain, 1.0), quiet=0.3)
    total_sent = sent()
    total_recv = received()
    res.update({
        "msgs_per_s": (r1 - r0) / res["wall_s"],
        "sent_per_s": (s1 - s0) / res["wall_s"],
        "sent_total": total_sent,
        "expected_total": total_sent * n_sub,
        "delivered_total": total_recv,
        "acked_total": sum(p.done for p in pubs) if qos else None,
        "inflight_left": sum(p.inflight for p in pubs) if qos else None,
        "drain_complete": complete,
        "lag_parks": cap.parks if cap is not None else None,
        "stall_kicks": cap.kicks if cap is not None else None,
        "fallback_parse": any(getattr(s, "fallback", False) for s in subs),
    })
    for p in pubs:  # drop any unsent QoS 0 backlog instead of flushing it
        if p.transport is not None:
            p.transport.abort()
    close_all(subs)
    await asyncio.sleep(0.05)
    return res


async def run_latency(a, loop):
    meter = Meter(a.broker_pid)
    topic = f"bench/{os.getpid() % 100000:05d}/lat"
    sub = await connect(loop, lambda: Subscriber(f"blsub-{os.getpid()}", latency=True),
                        a.host, a.sub_port or a.port)
    await sub.subscribe(topic, 0)
    pub = await connect(loop, lambda: LatencyPublisher(f"blpub-{os.getpid()}", topic),
                        a.host, pub_port(a, 0))
    await asyncio.sleep(0.05)
    rate = a.rate
    tick = a.tick
    t_start = time.perf_counter()
    warm_end = t_start + a.warmup
    end = warm_end + a.duration
    m0 = None
    n_due_sent = 0
    # Send paced: at every tick send the messages that are due; each one is
    # stamped and written separately (no batching into one write).
    while True:
        now = time.perf_counter()
        if m0 is None and now >= warm_end:
            m0 = meter.snap()
            sub.samples.clear()
            s0 = pub.sent
        if now >= end:
            break
        due = int((now - t_start) * rate)
        while n_due_sent < due:
            pub.send_one()
            n_due_sent += 1
        await asyncio.sleep(tick)
    m1 = meter.snap()
    complete = await settle(lambda: sub.received, target=pub.sent, timeout=a.drain)
    samples = sorted(sub.samples)
    res = Meter.util(m0, m1)
    n = len(samples)

    def pct(q):
        return percentile(samples, q) / 1e6 if n else None

    res.update({
        "rate_target": rate,
        "sent_per_s": (pub.sent - s0) / res["wall_s"],
        "samples": n,
        "sent_total": pub.sent,
        "delivered_total": sub.received,
        "drain_complete": complete,
        "lat_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99), "p99.9": pct(0.999),
                   "max": samples[-1] / 1e6 if n else None,
                   "mean": sum(samples) / n / 1e6 if n else None},
    })
    close_all([pub, sub])
    await asyncio.sleep(0.05)
    return res


async def open_conns(a, loop, tag):
    """Connect a.conns clients (CONNECT, CONNACK), a.conn_concurrency at a time; and the seconds."""
    t0 = time.perf_counter()
    clients = await gather_limited(
        [connect(loop, lambda i=i: Client(f"{tag}{i}-{os.getpid()}"), a.host, a.port,
                 timeout=120)
         for i in range(a.conns)],
        limit=a.conn_concurrency)
    return clients, time.perf_counter() - t0


async def close_conns(clients):
    close_all(clients)  # DISCONNECT, then close
    await asyncio.wait([c.closed for c in clients], timeout=30)
    await asyncio.sleep(0.2)


def conn_figures(n, t_conn, m0, m1, m2, m3):
    """connections/s and CPU per connection: the broker's (/proc/<pid>/schedstat) for accept +
    CONNECT + CONNACK (m0-m1) and for DISCONNECT + close (m2-m3, including ~0.2 s idle), the
    load generator's for the connect phase; robust on a busy machine, unlike connections/s"""
    res = {"connections": n, "connect_s": t_conn, "connects_per_s": n / t_conn if t_conn else None,
           "loadgen_us_per_conn": (m1[1] - m0[1]) / n * 1e6 if n else None}
    if m0[2] is not None and m3[2] is not None and n:
        res["broker_us_per_connect"] = (m1[2] - m0[2]) / n * 1e6
        res["broker_us_per_close"] = (m3[2] - m2[2]) / n * 1e6
    return res


async def run_conns(a, loop):
    meter = Meter(a.broker_pid)
    cold = None
    if a.conn_warmup:
        # a round on the broker as it started (its memory not yet mapped, first code paths), its
        # figures kept apart: what is measured is a broker that has served connections before,
        # as a running service has (each broker gets the same round)
        m0 = meter.snap()
        clients, t_conn = await open_conns(a, loop, "bwarm")
        m1 = m2 = meter.snap()
        await close_conns(clients)
        cold = conn_figures(len(clients), t_conn, m0, m1, m2, meter.snap())
        del clients
        table = transport_table(loop)
        if table is not None:  # (the broker's tick does this: here the next round would free them)
            table.prune()
    m0 = meter.snap()
    clients, t_conn = await open_conns(a, loop, "bidle")
    m1 = meter.snap()
    print(f"READY {len(clients)}", flush=True)
    # wait for the orchestrator to measure RSS
    await loop.run_in_executor(None, sys.stdin.readline)
    alive = sum(1 for c in clients if not c.closed.done())
    m2 = meter.snap()
    await close_conns(clients)
    res = conn_figures(len(clients), t_conn, m0, m1, m2, meter.snap())
    res["alive_at_measure"] = alive
    if cold is not None:
        res["cold"] = cold
    return res


async def amain(a):
    loop = asyncio.get_running_loop()
    sc = a.scenario
    # unique per run so that nothing left over from an earlier run can match
    pre = f"bench/{os.getpid() % 100000:05d}"
    fanin = f"{pre}/p{{i:0{len(str(max(a.publishers - 1, 0)))}d}}"  # equal-length topics
    if sc == "qos0_fanin":
        return await run_throughput(a, loop, 0, a.publishers, 1, f"{pre}/#", fanin)
    if sc == "qos0_fanout":
        return await run_throughput(a, loop, 0, 1, a.subscribers, f"{pre}/fan", f"{pre}/fan")
    if sc == "qos1_fanin":
        return await run_throughput(a, loop, 1, a.publishers, 1, f"{pre}/#", fanin)
    if sc == "qos2":
        return await run_throughput(a, loop, 2, a.publishers, 1, f"{pre}/#", fanin)
    if sc == "latency":
        return await run_latency(a, loop)
    if sc == "conns":
        return await run_conns(a, loop)
    raise SystemExit(f"unknown scenario {sc}")


def main(argv=None):
    global MQTT_VERSION, CONNECT_FLAGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", required=True,
                   choices=["qos0_fanin", "qos0_fanout", "qos1_fanin", "qos2", "latency", "conns"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sub-port", type=int, default=0,
                   help="subscribers connect here (another node of a cluster); 0 = --port")
    p.add_argument("--pub-ports", default="",
                   help="publishers connect to these ports, round robin (PORT,PORT...); '' = --port")
    p.add_argument("--mqtt", type=int, choices=[4, 5], default=4, help="protocol level (4 = MQTT 3.1.1)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--drain", type=float, default=5.0, help="max seconds to wait for in-flight messages at the end")
    p.add_argument("--publishers", type=int, default=8)
    p.add_argument("--subscribers", type=int, default=100)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--max-lag", type=int, default=1000,
                   help="QoS1/2: max messages published but not yet delivered (0 = unlimited)")
    p.add_argument("--rcvlowat", type=int, default=4096,
                   help="SO_RCVLOWAT for QoS0 byte-counting subscribers during the run (1 = off)")
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--tick", type=float, default=0.001, help="pacing tick (uvloop timers have 1 ms resolution)")
    p.add_argument("--conns", type=int, default=5000)
    p.add_argument("--conn-concurrency", type=int, default=100)
    p.add_argument("--conn-warmup", type=int, default=1, choices=(0, 1),
                   help="conns: first connect and close --conns clients once, figures apart (1)")
    p.add_argument("--broker-pid", type=int, default=0)
    p.add_argument("--persistent", action="store_true", help="clean session 0 (persistent sessions)")
    p.add_argument("--broker-core", type=int, default=None)
    a = p.parse_args(argv)
    MQTT_VERSION = a.mqtt
    if a.persistent:
        CONNECT_FLAGS = 0x00
    Meter.broker_core = a.broker_core
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    uv = install_uvloop()
    res = asyncio.run(amain(a))
    res["scenario"] = a.scenario
    res["uvloop"] = uv
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
