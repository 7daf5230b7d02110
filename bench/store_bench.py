"""Persistence figures: time to restore retained messages and sessions, and the
cost of writing state (ops/s through the batched SQLite commits).

    .venv/bin/python bench/store_bench.py [--retained 100000] [--sessions 10000]
"""
import argparse
import os
import resource
import tempfile
import time

from broker.core.broker import Broker
from broker.core.message import Message
from broker.core.session import Session, Subscription
from broker.store.sqlite import Store
from settings import MQTTConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retained", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--queued", type=int, default=5, help="queued messages per session")
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    path = os.path.join(d, "state.db")
    store = Store(path)
    t0 = time.perf_counter()
    for i in range(a.retained):
        m = Message(f"sensors/{i % 100}/{i}", b"x" * 64, 1, True, None, None, "c", time.time())
        store.retain_set(m.topic, m)
    store.commit()
    t_ret = time.perf_counter() - t0
    t0 = time.perf_counter()
    shared = Message("alerts/all", b"y" * 64, 1, False, None, None, "c", time.time())
    for i in range(a.sessions):
        s = Session(f"device-{i}")
        s.expiry_interval = 86400
        store.save_session(s)
        store.save_subscription(s.client_id, Subscription(f"devices/{i}/#", f"devices/{i}/#", None,
                                                          1, False, False, 0, None, s))
        for _ in range(a.queued):
            store.enqueue(s.client_id, shared, 1, False, None)
    store.commit()
    t_ses = time.perf_counter() - t0
    store.db.close()
    size = os.path.getsize(path) + (os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    b = Broker(MQTTConfig())
    summary = Store(path).load(b)
    t_load = time.perf_counter() - t0
    ops = a.retained + a.sessions * (2 + a.queued)
    print(f"write: {a.retained:,} retained in {t_ret:.2f}s; {a.sessions:,} sessions "
          f"(+1 subscription, +{a.queued} queued each) in {t_ses:.2f}s; "
          f"{ops / (t_ret + t_ses):,.0f} store ops/s; file {size / 1e6:.1f} MB")
    print(f"restore: {summary['retained']:,} retained messages and {summary['sessions']:,} sessions "
          f"({sum(len(s.queue) for s in b.sessions.values()):,} queued messages) in {t_load:.2f}s")
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (before restore "
          f"{rss0 / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
