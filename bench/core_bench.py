"""Micro-benchmark of the sans-I/O hot path (decode -> route -> encode), no sockets.

    PYTHONPATH=. .venv/bin/python bench/core_bench.py [--messages N] [--level 4]
    PYTHONPATH=. .venv/bin/python bench/core_bench.py --instructions   # exact, under callgrind

Prints messages/s through the core for fan-in (one subscriber), fan-out (100) and QoS 1 fan-in
(its window freed without PUBACKs), and QoS 1 through real PUBACKs with the subscriber's Receive
Maximum 32, so most messages wait in its queue (the enqueue / pump path), and without a Receive
Maximum (qos1_puback: the subscriber's PUBACKs as bench/bench.py's qos1_fanin has them). `--instructions`
counts instead the machine instructions per delivered message of each (valgrind's callgrind,
the difference between two runs of different lengths): the same on any run, however busy the
machine, so it shows changes of a few percent that timings cannot.
"""
import argparse
import os
import re
import subprocess
import sys
import time

from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol.codec import encode
from settings import MQTTConfig

# name: (subscribers, QoS, the subscriber PUBACKs, its Receive Maximum or None: unbounded)
SCENARIOS = {"qos0_fanin": (1, 0, False, None), "qos0_fanout": (100, 0, False, None),
             "qos1_fanin": (1, 1, False, None), "qos1_acked": (1, 1, True, 32),
             "qos1_puback": (1, 1, True, None)}


def run(n: int, subscribers: int, qos: int, level: int, acked: bool = False,
        dashboard: bool = False, store: bool = False, window: int | None = 32) -> float:
    b = Broker(MQTTConfig())
    if dashboard:  # the dashboard's per-topic counter: a hook on accepted messages
        from broker.dashboard.live import TopicCounter
        b.add_hook(TopicCounter(10_000))
    gate = None
    if store:  # the default persistence (a SQLite store) and the ack gate, as the server runs them
        import tempfile

        from broker.core.events import AcksHeld
        from broker.store.sqlite import Store
        from broker.transport.connection_protocol import AckGate
        b.add_hook(Store(os.path.join(tempfile.mkdtemp(), "state.db")))
        gate = AckGate(b.hooks, lambda: None)
    subs = []
    for i in range(subscribers):
        c = Connection(b)
        props = {0x21: window} if acked and window and level == 5 else None  # Receive Maximum
        c.data_received(encode(P.Connect(f"s{i}", level, properties=props), level))
        if acked and window:
            c.receive_max = window  # (3.1.1 has no Receive Maximum: the same window for the bench)
        c.data_received(encode(P.Subscribe(1, [("bench/#", P.SubscriptionOptions(qos))]), level))
        c.take_output()
        subs.append(c)
    b.dirty.clear()
    pub = Connection(b)
    pub.data_received(encode(P.Connect("p", level), level))
    pub.take_output()
    batch = 200
    pkts = [encode(P.Publish(f"bench/p{i % 8}", b"x" * 64, qos, packet_id=(i % 60000) + 1 if qos else None), level)
            for i in range(batch)]
    chunk = b"".join(pkts)
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        events = pub.data_received(chunk)
        if gate is not None:
            for ev in events:
                if type(ev) is AcksHeld:
                    gate.hold(pub, ev)
            for end in b.hooks.on_turn_end:  # the server's flush: commit, then the acks go out
                end()
        sent += batch
        pub.take_output()
        for c in subs:
            c.take_output()
            if qos == 1 and acked:
                while c.session.inflight_out:  # PUBACK each, as the client would: the queue moves
                    c.data_received(b"".join(b"\x40\x02" + pid.to_bytes(2, "big")
                                             for pid in list(c.session.inflight_out)))
                    c.take_output()
            elif qos == 1:
                # acknowledge what was delivered so the window keeps moving
                c.session.inflight_out.clear()
        b.dirty.clear()
    dt = time.perf_counter() - t0
    return sent * subscribers / dt


def instructions(scenario: str, level: int, extra: tuple = ()) -> int:
    """Instructions per delivered message: two callgrind runs of 4,000 and 24,000 messages,
    so start-up and set-up cancel out."""
    subs = SCENARIOS[scenario][0]
    counts = []
    for n in (4000, 24000):
        r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                            sys.executable, os.path.abspath(__file__), "--only", scenario,
                            "--messages", str(n * (20 if subs > 1 else 1)), "--level", str(level),
                            *extra],
                           capture_output=True, text=True)
        m = re.search(r"Collected : (\d+)", r.stderr)
        if r.returncode or m is None:
            raise SystemExit(f"callgrind run failed (is valgrind installed?): {r.stderr[-500:]}")
        counts.append(int(m.group(1)))
    return (counts[1] - counts[0]) // (20000 * subs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--level", type=int, default=4)
    ap.add_argument("--only", choices=list(SCENARIOS))
    ap.add_argument("--instructions", action="store_true",
                    help="machine instructions per delivery, under callgrind")
    ap.add_argument("--dashboard", action="store_true",
                    help="with the dashboard's per-topic counter hook attached")
    ap.add_argument("--store", action="store_true",
                    help="with the default persistence (SQLite store) and the ack gate")
    a = ap.parse_args()
    for name, (subs, qos, acked, window) in SCENARIOS.items():
        if a.only and name != a.only:
            continue
        if a.instructions:
            extra = tuple(f for f, on in (("--store", a.store), ("--dashboard", a.dashboard)) if on)
            print(f"{name:12}: {instructions(name, a.level, extra):8,} instructions per delivery "
                  f"(callgrind, level {a.level}{' ' + ' '.join(extra) if extra else ''})", flush=True)
            continue
        n = a.messages if subs == 1 else a.messages // 20
        r = run(n, subs, qos, a.level, acked, a.dashboard, a.store, window)
        print(f"{name:12}: {r:12,.0f} deliveries/s (core only, level {a.level})", flush=True)


if __name__ == "__main__":
    main()
