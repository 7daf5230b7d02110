#!/usr/bin/env python3
"""Event-loop stall from the worst single packet the broker's limits allow.

Two measurements per scenario, each --repeats times (the worst is reported):

- core: the CPU time (time.process_time) the broker's sans-I/O core takes for the packet, fed
  to a Connection in 64 KiB reads with the default settings, the answer taken: what holds the
  event loop, without the sockets, and little affected by other processes on the machine;
- socket: `python -m broker` (default settings unless --set) with a client that sends PINGREQ
  back to back and times each round trip while another client sends the packet: the stall is
  the longest round trip while the packet was handled, minus the median round trip before it
  (on a busy machine this includes waiting for a core).

Scenarios (all within the defaults; each packet is built from the broker's own settings):

  user_props      PUBLISH of maximum_packet_size bytes of empty User Properties (refused after
                  max_user_properties; before that limit: all decoded, 3.3 s for 19 MiB)
  user_props_max  the largest PUBLISH accepted: max_user_properties pairs holding
                  max_user_property_bytes, payload up to maximum_packet_size, one subscriber
  subscribe_max   SUBSCRIBE with max_filters_per_subscribe distinct filters (max_subscriptions_
                  per_client of them are stored, the rest get 0x97)
  unsubscribe_max UNSUBSCRIBE with max_filters_per_subscribe filters, all subscribed
  connect_max     CONNECT of max_connect_packet_size with a will and max_user_properties
  retained_match  SUBSCRIBE '#' with the retained store filled to --retained messages
  wildcard_branches  one SUBSCRIBE of max_filters_per_subscribe filters of max_topic_levels levels
                  branching into '+' levels (the first 10 levels 'a' or '+', '+' below, a last
                  level no topic has), then --burst QoS 0 PUBLISHes on new topics of that depth
                  that walk every branch granted (before mqtt.max_wildcard_levels: all 1,000, 40-90
                  ms of CPU per PUBLISH)
  wildcard_subscribe that SUBSCRIBE alone
  (the_old_limits prints what the hostile PUBLISH of 4,000,000 empty User Properties did)

    PYTHONPATH=. .venv/bin/python bench/stall.py                  # all scenarios, 3 repeats
    PYTHONPATH=. .venv/bin/python bench/stall.py --scenarios user_props --repeats 5
    PYTHONPATH=. .venv/bin/python bench/stall.py --set mqtt.max_user_properties=0 \\
        --set mqtt.maximum_packet_size=20000000 --scenarios user_props   # the limit off
"""
from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import settings  # noqa: E402
from broker.protocol import packets as P  # noqa: E402
from broker.protocol import properties as PR  # noqa: E402
from broker.protocol.codec import encode  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402

SCENARIOS = ("user_props", "user_props_max", "subscribe_max", "unsubscribe_max", "connect_max",
             "retained_match", "wildcard_subscribe", "wildcard_branches")
BURST = 1000  # PUBLISHes of wildcard_branches (--burst)


class Pinger:
    """PINGREQ after PINGRESP, as fast as the broker answers, in a process of its own (so the
    attacker's work in this one never delays a ping); samples() returns (sent at, round trip),
    time.perf_counter() being the same monotonic clock in both processes."""

    def __init__(self, port: int):
        self.parent, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_ping_loop, args=(port, child), daemon=True)
        self.proc.start()
        assert self.parent.recv() == "connected"

    def window(self, start: float, end: float) -> list[float]:
        self.parent.send(("window", start, end))
        return self.parent.recv()

    def close(self) -> None:
        self.parent.send(("stop",))
        self.proc.join(5)


def _ping_loop(port: int, pipe) -> None:
    c = RawClient(port, timeout=60)
    assert c.connect("pinger").reason_code == 0
    sock = c.sock
    samples: list = []
    pipe.send("connected")
    while True:
        if pipe.poll():
            msg = pipe.recv()
            if msg[0] == "stop":
                return
            _, start, end = msg
            pipe.send([rtt for t, rtt in samples if start <= t <= end or (t < start and t + rtt > start)])
            del samples[:-20000]
        t0 = time.perf_counter()
        sock.sendall(b"\xc0\x00")
        got = b""
        while len(got) < 2:
            chunk = sock.recv(2 - len(got))
            if not chunk:
                return
            got += chunk
        samples.append((t0, time.perf_counter() - t0))
        time.sleep(0.0002)


def read_some(sock: socket.socket, seconds: float) -> int:
    """Read and drop what the broker sends for `seconds` (or until it closes): bytes read."""
    sock.settimeout(0.05)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = sock.recv(1 << 20)
        except (TimeoutError, socket.timeout):
            continue
        except OSError:
            break
        if not chunk:
            break
        n += len(chunk)
    return n


def build(name: str, cfg) -> tuple[list, bytes, str]:
    """(packets to send before, the hostile packet, what it is)."""
    m = cfg.mqtt
    limit = m.maximum_packet_size
    if name == "user_props":
        n = (limit - 20) // 5  # one empty pair: identifier + two 2-byte lengths
        pkt = encode(P.Publish("flood", b"", properties={PR.USER_PROPERTY: [("", "")] * n}))
        while len(pkt) > limit:
            n -= 100
            pkt = encode(P.Publish("flood", b"", properties={PR.USER_PROPERTY: [("", "")] * n}))
        return [], pkt, f"PUBLISH, {n:,} empty User Properties, {len(pkt):,} bytes"
    if name == "user_props_max":
        k = max(1, m.max_user_properties or 128)
        each = max(0, (m.max_user_property_bytes or 65536) // k - 5)
        pairs = [(f"{i:04d}", "v" * (each - 4)) for i in range(k)]
        base = encode(P.Publish("big/1", b"", properties={PR.USER_PROPERTY: pairs}))
        payload = b"p" * max(0, limit - len(base) - 8)
        pkt = encode(P.Publish("big/1", payload, properties={PR.USER_PROPERTY: pairs}))
        while len(pkt) > limit:
            payload = payload[:-16]
            pkt = encode(P.Publish("big/1", payload, properties={PR.USER_PROPERTY: pairs}))
        return [], pkt, f"PUBLISH, {k} User Properties, {len(pkt):,} bytes, one subscriber"
    if name in ("subscribe_max", "unsubscribe_max"):
        n = m.max_filters_per_subscribe or 10000
        width = max(3, min(60, (limit - 20) // n - 3))
        filters = [f"f/{i:0{width - 2}d}"[:width] for i in range(n)]
        sub = encode(P.Subscribe(1, [(f, P.SubscriptionOptions(1)) for f in filters]))
        if name == "subscribe_max":
            return [], sub, f"SUBSCRIBE, {n:,} filters, {len(sub):,} bytes"
        unsub = encode(P.Unsubscribe(2, filters))
        return [sub], unsub, f"UNSUBSCRIBE, {n:,} filters, {len(unsub):,} bytes"
    if name == "connect_max":
        k = max(1, m.max_user_properties or 128)
        size = m.max_connect_packet_size
        each = max(0, min((m.max_user_property_bytes or 65536) // k, size // (2 * k)) - 20)
        pairs = [(f"{i:04d}", "v" * each) for i in range(k)]
        will = P.Will("w/t", b"", 1, False, {PR.USER_PROPERTY: pairs})
        base = encode(P.Connect("connect-max", 5, properties={PR.USER_PROPERTY: pairs}, will=will))
        will.payload = b"w" * max(0, size - len(base) - 8)
        pkt = encode(P.Connect("connect-max", 5, properties={PR.USER_PROPERTY: pairs}, will=will))
        while len(pkt) > size and will.payload:
            will.payload = will.payload[:-(len(pkt) - size)]
            pkt = encode(P.Connect("connect-max", 5, properties={PR.USER_PROPERTY: pairs},
                                   will=will))
        return [], pkt, f"CONNECT with a will, {2 * k} User Properties, {len(pkt):,} bytes"
    if name == "retained_match":
        return [], encode(P.Subscribe(1, [("#", P.SubscriptionOptions(0))])), \
            "SUBSCRIBE '#' over a full retained store"
    if name in ("wildcard_branches", "wildcard_subscribe"):
        n = m.max_filters_per_subscribe or 1000
        depth = m.max_topic_levels
        bits = max(1, (n - 1).bit_length())
        filters = ["/".join(["+" if i >> k & 1 else "a" for k in range(bits)]
                            + ["+"] * (depth - bits - 1) + ["end"]) for i in range(n)]
        sub = encode(P.Subscribe(1, [(f, P.SubscriptionOptions(0)) for f in filters]))
        if name == "wildcard_subscribe":
            return [], sub, f"SUBSCRIBE {n:,} filters of {depth} levels, {len(sub):,} bytes"
        stamp = time.monotonic_ns()  # new topics each run: the match cache never has them
        burst = b"".join(encode(P.Publish("/".join(["a"] * bits + [f"{stamp}-{j}"]
                                                   + ["x"] * (depth - bits - 1)), b"p"))
                         for j in range(BURST))
        return [sub], burst, (f"SUBSCRIBE {n:,} filters of {depth} levels, {BURST:,} PUBLISHes "
                              f"({len(burst):,} bytes)")
    raise SystemExit(f"unknown scenario {name}")


def core_time(name: str, cfg, retained: int) -> float:
    """CPU seconds of the sans-I/O core for the scenario's packet (tests/sansio.py harness)."""
    from broker.core.broker import Broker
    from tests.sansio import Client, Clock, drain, feed, subscribe
    clock = Clock()
    b = Broker(cfg.mqtt, clock=clock, wall=clock)
    if name == "retained_match":
        pub = Client(b)
        pub.connect("filler")
        for i in range(retained):
            feed(pub.conn, encode(P.Publish(f"r/{i // 1000}/{i}", b"v" * 16, retain=True)))
    before, pkt, _ = build(name, cfg)
    sub = None
    if name == "user_props_max":
        sub = Client(b)
        sub.connect("sub")
        subscribe(sub, "big/#")
    c = Client(b)
    if name != "connect_max":
        c.connect("attacker")
        for p in before:
            feed(c.conn, p)
            drain(c.conn)
    t = time.process_time()
    for i in range(0, len(pkt), 65536):
        feed(c.conn, pkt[i:i + 65536])
    drain(c.conn)
    if sub is not None:
        drain(sub.conn)
    return time.process_time() - t


def fill_retained(port: int, n: int) -> None:
    c = RawClient(port, timeout=60)
    assert c.connect("filler").reason_code == 0
    batch = bytearray()
    for i in range(n):
        batch += encode(P.Publish(f"r/{i // 1000}/{i}", b"v" * 16, retain=True))
        if len(batch) > 1 << 16:
            c.sock.sendall(batch)
            batch.clear()
    c.sock.sendall(batch)
    c.send(P.Subscribe(9, [("nothing", P.SubscriptionOptions(0))]))  # a SUBACK: all were read
    while c.recv(60).type != P.SUBACK:
        pass
    c.close()


def run_once(port: int, name: str, cfg, pinger: Pinger) -> tuple[float, float, str, str]:
    before, pkt, what = build(name, cfg)
    if name == "user_props_max":
        sub = RawClient(port, timeout=60)
        assert sub.connect(f"sub-{time.monotonic_ns()}").reason_code == 0
        sub.send(P.Subscribe(1, [("big/#", P.SubscriptionOptions(0))]))
        sub.recv()
    attacker = socket.create_connection(("127.0.0.1", port))
    attacker.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if name != "connect_max":
        attacker.sendall(encode(P.Connect(f"attacker-{time.monotonic_ns()}", 5)))
        read_some(attacker, 0.2)
        for p in before:
            attacker.sendall(p)
            read_some(attacker, 1.0)
    time.sleep(0.5)
    t0 = time.perf_counter()
    base = pinger.window(t0 - 0.5, t0)
    attacker.sendall(pkt)
    got = read_some(attacker, 2.0)
    t1 = time.perf_counter()
    during = pinger.window(t0, t1)
    attacker.close()
    if name == "user_props_max":
        sub.close()
    median = statistics.median(base) if base else 0.0
    worst = max(during) if during else 0.0
    answer = f"{got:,} bytes back"
    return max(0.0, worst - median), median, what, answer


def main() -> int:
    global BURST
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--retained", type=int, default=0,
                    help="retained messages for retained_match (default: mqtt.max_retained_messages)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--only", choices=("core", "socket"), help="one of the two measurements")
    ap.add_argument("--burst", type=int, default=BURST, help="PUBLISHes of wildcard_branches")
    args = ap.parse_args()
    BURST = args.burst
    cfg = settings.load(None, env={}, sets=args.set)
    names = args.scenarios.split(",")
    retained = args.retained or cfg.mqtt.max_retained_messages
    if args.only != "socket":
        print(f"core: CPU ms of the broker's core for the packet (worst of {args.repeats})")
        for name in names:
            worst = max(core_time(name, cfg, retained) for _ in range(args.repeats))
            print(f"  {name:<16} {build(name, cfg)[2]:<58} {worst * 1000:8.2f}", flush=True)
    if args.only == "core":
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="stall-"))
    b = BrokerProcess(tmp, settings={"persistence.enabled": False, "metrics.sys_interval": 0,
                                     **dict(x.split("=", 1) for x in args.set)},
                      log_level="WARNING").start()
    print(f"broker: {' '.join(b.cmd[1:])}")
    print(f"{'scenario':<16} {'packet':<58} {'stall ms (worst of ' + str(args.repeats) + ')':>22} "
          f"{'median of runs':>15} {'ping ms':>8}  answer")
    try:
        pinger = Pinger(b.port)
        time.sleep(0.3)
        for name in names:
            if name == "retained_match":
                fill_retained(b.port, retained)
            stalls, pings, worst, what, answer = [], [], 0.0, "", ""
            for _ in range(args.repeats):
                stall, ping, what, answer = run_once(b.port, name, cfg, pinger)
                stalls.append(stall)
                pings.append(ping)
                worst = max(worst, stall + ping)
            print(f"{name:<16} {what:<58} {max(stalls) * 1000:>22.1f} "
                  f"{statistics.median(stalls) * 1000:>15.1f} {statistics.median(pings) * 1000:>8.2f}"
                  f"  {answer}; the other client's worst PINGREQ {worst * 1000:.1f} ms", flush=True)
        pinger.close()
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
