"""Memory and CPU of the copies a cluster node keeps of the messages it wrote (cluster/keep.py):
10,000 QoS 1 messages as ClusterNode.route() keeps them (record body, entry, the mark shared by
the records of one acknowledgement), measured with tracemalloc, and the time per record of keep,
acknowledge and let go.

    .venv/bin/python bench/cluster_keep_memory.py [--payload BYTES] [--count N]
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

from broker.core.message import Message
from cluster import records as R
from cluster.keep import OVERHEAD, Keep


def acknowledge(entries: list) -> None:
    """As ClusterNode._completed: acknowledged 100 at a time, one mark each."""
    for i in range(0, len(entries), 100):
        mark = {p: i + 100 for p in range(8)}
        for e in entries[i:i + 100]:
            Keep.answered(e, None, mark)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--payload", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--count", type=int, default=10_000, help="messages (default 10000)")
    a = ap.parse_args()
    msgs = [Message(f"sensors/room{i % 50}/temperature", b"x" * a.payload, 1, False, None, None,
                    "client-1", time.time()) for i in range(a.count)]
    bodies = [R.message_body(m, "client-1", None, 5, "n1", f"n1-0123456789ab-{i}", 0.0)
              for i, m in enumerate(msgs)]
    keep = Keep(1 << 40, 600.0, time.monotonic)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    entries = [keep.add(b, 0, None) for b in bodies]
    acknowledge(entries)
    del entries
    bodies_bytes = sum(len(b) for b in bodies)
    held = tracemalloc.get_traced_memory()[0] - before  # entries, deque, marks (bodies: before)
    tracemalloc.stop()
    keep.trim({p: a.count + 100 for p in range(8)})
    t0 = time.perf_counter()  # the time, without tracemalloc
    entries = [keep.add(b, 0, None) for b in bodies]
    acknowledge(entries)
    took_keep = time.perf_counter() - t0
    del entries
    t0 = time.perf_counter()
    keep.trim({p: a.count + 100 for p in range(8)})
    took_trim = time.perf_counter() - t0
    n = a.count
    print(f"{n} messages of {a.payload} payload bytes ({bodies_bytes / n:.0f} record bytes "
          f"each): kept copies take {(held + bodies_bytes) / 1e6:.2f} MB "
          f"({(held + bodies_bytes) / n:.0f} bytes each, of which "
          f"{held / n:.0f} bookkeeping; counted against cluster.keep_bytes as "
          f"{OVERHEAD} + record bytes); keep + acknowledge {took_keep / n * 1e6:.2f} us, "
          f"let go {took_trim / n * 1e6:.2f} us per message")
    assert keep.bytes == 0


if __name__ == "__main__":
    main()
