"""Micro-benchmark of the sans-I/O hot path (decode -> route -> encode), no sockets.

    .venv/bin/python bench/core_bench.py [--messages N] [--subscribers K] [--qos Q]
Prints messages/s through the core for fan-in (one subscriber) and fan-out.
"""
import argparse
import time

from settings import MQTTConfig
from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol.codec import encode


def run(n: int, subscribers: int, qos: int, level: int, dashboard: bool = False) -> float:
    b = Broker(MQTTConfig())
    if dashboard:  # the dashboard's per-topic counter: a hook on accepted messages
        from broker.dashboard.live import TopicCounter
        b.add_hook(TopicCounter(10_000))
    subs = []
    for i in range(subscribers):
        c = Connection(b)
        c.data_received(encode(P.Connect(f"s{i}", level), level))
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
        pub.data_received(chunk)
        sent += batch
        pub.take_output()
        for c in subs:
            c.take_output()
            if qos == 1:
                # acknowledge what was delivered so the window keeps moving
                c.session.inflight_out.clear()
        b.dirty.clear()
    dt = time.perf_counter() - t0
    return sent * subscribers / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--level", type=int, default=4)
    ap.add_argument("--dashboard", action="store_true",
                    help="with the dashboard's per-topic counter hook attached")
    a = ap.parse_args()
    for subs, qos in ((1, 0), (100, 0), (1, 1)):
        n = a.messages if subs == 1 else a.messages // 20
        r = run(n, subs, qos, a.level, a.dashboard)
        print(f"qos {qos} subscribers {subs:4d}: {r:12,.0f} deliveries/s (core only, level {a.level})")


if __name__ == "__main__":
    main()
