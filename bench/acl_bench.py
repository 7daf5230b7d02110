"""CPU cost of the ACL's per-message deny check on the delivery path (sans-I/O core, no sockets).

    PYTHONPATH=. .venv/bin/python bench/acl_bench.py [--messages N] [--subscribers K] [--repeats R]

Modes: no ACL; an ACL whose deny rules cannot meet the subscription (no per-message check);
an ACL with `topic deny bench/secret` under subscriptions to `bench/#` (every delivery checked,
decisions cached). Prints CPU microseconds per delivery (time.process_time, robust under load).
"""
import argparse
import os
import statistics
import tempfile
import time

from broker.auth import AccessControl
from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol.codec import encode
from settings import MQTTConfig

ACLS = {
    "no ACL": None,
    "ACL, no deny overlap": "user u\ntopic readwrite #\ntopic deny other/secret\n",
    "ACL, deny overlaps (checked)": "user u\ntopic readwrite #\ntopic deny bench/secret\n",
}


def run(n: int, subscribers: int, acl_text: str | None, level: int = 4) -> float:
    auth = None
    if acl_text is not None:
        fd, path = tempfile.mkstemp()
        os.write(fd, acl_text.encode())
        os.close(fd)
        auth = AccessControl(acl_file=path)
    b = Broker(MQTTConfig(), auth=auth)
    subs = []
    for i in range(subscribers):
        c = Connection(b)
        c.data_received(encode(P.Connect(f"s{i}", level, username="u"), level))
        c.data_received(encode(P.Subscribe(1, [("bench/#", P.SubscriptionOptions(0))]), level))
        c.take_output()
        subs.append(c)
    b.dirty.clear()
    pub = Connection(b)
    pub.data_received(encode(P.Connect("p", level, username="u"), level))
    pub.take_output()
    batch = 200
    chunk = b"".join(encode(P.Publish(f"bench/p{i % 8}", b"x" * 64, 0), level) for i in range(batch))
    t0 = time.process_time()
    sent = 0
    while sent < n:
        pub.data_received(chunk)
        sent += batch
        for c in subs:
            c.take_output()
        b.dirty.clear()
    return (time.process_time() - t0) / (sent * subscribers) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--subscribers", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    for name, text in ACLS.items():
        runs = [run(a.messages, a.subscribers, text) for _ in range(a.repeats)]
        print(f"{name:30s} {statistics.median(runs):6.3f} CPU us/delivery "
              f"(median of {a.repeats}, {a.subscribers} subscribers, {a.messages} messages)")


if __name__ == "__main__":
    main()
