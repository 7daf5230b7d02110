#!/usr/bin/env python3
"""Another client's PINGREQ round trips while one SUBSCRIBE repeats a "$replay/..." filter.

`python -m broker` with the sink (its Kafka need not answer: the replay's workers start, which
is what costs) and an empty history table, so replays are available; a device subscribes to
`$replay/-1m/bob/t0` --repeats times in ONE SUBSCRIBE while a client in a process of its own
(bench/stall.py Pinger) sends PINGREQ after PINGRESP. Printed per repeat count: how long the
SUBACK took, the worst PINGREQ round trip from the SUBSCRIBE to 2 s after its SUBACK (and the
median before it), and the most child processes of the broker seen at once (its replay
workers, and whatever children it has without a replay: printed first).

    PYTHONPATH=. .venv/bin/python bench/replay_stall.py                    # 100 and 1,000
    PYTHONPATH=. .venv/bin/python bench/replay_stall.py --repeats 100 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stall import Pinger  # noqa: E402

from broker.protocol import packets as P  # noqa: E402
from sink.history.manifest import Change, Table  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402


def children(pid: int) -> int:
    """Processes whose parent is `pid` (the broker's replay workers)."""
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        n += 1
            except (OSError, ValueError, IndexError):
                pass
    return n


def once(port: int, pid: int, repeats: int, pinger: Pinger, n: int) -> tuple[float, float, float, int]:
    dev = RawClient(port, timeout=600)
    assert dev.connect(f"bob-{n}").reason_code == 0
    time.sleep(0.3)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], children(pid))
            time.sleep(0.02)
    w = threading.Thread(target=watch, daemon=True)
    w.start()
    t0 = time.perf_counter()
    base = pinger.window(t0 - 0.3, t0)
    dev.send(P.Subscribe(1, [("$replay/-1m/bob/t0", P.SubscriptionOptions(1))] * repeats))
    ack = dev.recv_type(P.SUBACK)
    t_ack = time.perf_counter()
    assert len(ack.reason_codes) == repeats, ack
    time.sleep(2.0)
    during = pinger.window(t0, time.perf_counter())
    stop.set()
    w.join()
    dev.close()
    time.sleep(1.0)  # its replay ends with the connection; the worker is reaped
    return t_ack - t0, max(during) if during else float("nan"), statistics.median(base), peak[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", default="100,1000")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "history"
        Table(table).commit(Change("append", add=[]))
        broker = BrokerProcess(Path(tmp), settings={"history.table": str(table)},
                               args=["--kafka-bootstrap", "127.0.0.1:9"], log_level="INFO").start()
        pinger = Pinger(broker.port)
        try:
            time.sleep(1.0)
            print(f"the broker's child processes before any replay: "
                  f"{children(broker.proc.pid)}")
            print(f"{'repeats':>8} {'SUBACK ms':>10} {'worst PINGREQ ms':>17} "
                  f"{'median before ms':>17} {'workers at once':>16}")
            n = 0
            for r in (int(x) for x in args.repeats.split(",")):
                for _ in range(args.rounds):
                    n += 1
                    ack, worst, median, peak = once(broker.port, broker.proc.pid, r, pinger, n)
                    print(f"{r:>8,} {ack * 1000:>10.1f} {worst * 1000:>17.1f} "
                          f"{median * 1000:>17.2f} {peak:>16}")
        finally:
            pinger.close()
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
