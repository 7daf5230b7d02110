"""The broker's own Python CPU per connection (no sockets, no kernel, no load generator).

    PYTHONPATH=. .venv/bin/python bench/conn_cycle.py [--cycles 20000] [--repeats 5] [--level 4]
    PYTHONPATH=. .venv/bin/python bench/conn_cycle.py --profile     # cProfile of one run
    PYTHONPATH=. .venv/bin/python bench/conn_cycle.py --instructions  # exact, under callgrind

Drives the real per-connection path, MQTTProtocol (transport/connection_protocol.py) of a
Server, with an in-memory transport: connection_made, CONNECT (clean, keep alive 60), the
flush writing CONNACK, DISCONNECT, the flush closing, connection_lost. `--hold N` keeps N
connections open meanwhile (as the bench's `conns` scenario does), which is what makes the
garbage collector's passes cost something. Prints the best of `--repeats` runs, in us per
connection: CPU time (process), so a busy machine inflates it less than wall-clock rates.
`--instructions` counts instead the machine instructions of one connect + close (valgrind's
callgrind, the difference between runs of 500 and 2,500 cycles): the same on any run, so it
shows changes of a few percent that timings cannot (needs valgrind: apt-get install valgrind).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker.protocol import packets as P  # noqa: E402
from broker.protocol.codec import encode  # noqa: E402
from broker.server import Server  # noqa: E402
from broker.transport.connection_protocol import MQTTProtocol  # noqa: E402
from broker.transport.eventloop import install_uvloop  # noqa: E402
from settings import Config  # noqa: E402


class Transport:
    """What MQTTProtocol uses of an asyncio transport; writes are dropped."""
    __slots__ = ("closing",)

    def __init__(self):
        self.closing = False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 50000) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        pass

    def is_closing(self):
        return self.closing

    def can_write_eof(self):
        return True

    def write_eof(self):
        pass

    def close(self):
        self.closing = True

    abort = close

    def get_write_buffer_size(self):
        return 0


async def run(a) -> list[float]:
    server = Server(Config(host="127.0.0.1", port=0))
    await server.start()
    spec = server.listener_specs()[0]
    if a.gc_threshold:
        gc.set_threshold(a.gc_threshold)
    if not a.no_freeze:
        gc.collect()
        gc.freeze()  # as serve() does
    disconnect = encode(P.Disconnect(), a.level)
    # the loop runs server.flush() once per turn for every connection that wrote in it (one
    # call_soon per turn): here the flushes are called directly, so none is scheduled (handles
    # that never ran would pile up in the loop's queue and bill the run for their memory)
    server.broker.schedule_flush = lambda: None
    held = []
    for i in range(a.hold):
        p = MQTTProtocol(server.state, spec)
        p.connection_made(Transport())
        p.data_received(encode(P.Connect(f"held-{i}", a.level, keep_alive=60), a.level))
        server.flush()
        held.append(p)
    results = []
    for r in range(a.repeats):
        connects = [encode(P.Connect(f"c{r}-{i:05d}", a.level, keep_alive=60), a.level)
                    for i in range(max(a.cycles, a.encode))][:a.cycles]
        t0 = time.process_time()
        for data in connects:
            p = MQTTProtocol(server.state, spec)
            t = Transport()
            p.connection_made(t)
            p.data_received(data)
            server.flush()
            p.data_received(disconnect)
            server.flush()
            p.connection_lost(None)
        results.append((time.process_time() - t0) / a.cycles * 1e6)
    await server.stop()
    return results


def instructions(level: int) -> int:
    """Instructions per cycle: two runs under callgrind that differ only in their cycle count
    (both encode the same CONNECTs up front), so start-up and set-up cancel out."""
    import re
    import subprocess
    counts = []
    for cycles in (500, 2500):
        r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                            sys.executable, os.path.abspath(__file__), "--cycles", str(cycles),
                            "--repeats", "1", "--hold", "100", "--level", str(level),
                            "--encode", "2500"], capture_output=True, text=True)
        m = re.search(r"Collected : (\d+)", r.stderr)
        if r.returncode or m is None:
            raise SystemExit(f"callgrind run failed (is valgrind installed?): {r.stderr[-500:]}")
        counts.append(int(m.group(1)))
    return (counts[1] - counts[0]) // 2000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hold", type=int, default=5000, help="connections kept open meanwhile")
    ap.add_argument("--level", type=int, default=4, choices=[4, 5])
    ap.add_argument("--no-freeze", action="store_true", help="no gc.freeze() (serve() does one)")
    ap.add_argument("--gc-threshold", type=int, default=0, help="gc.set_threshold(N) (default: leave)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--instructions", action="store_true",
                    help="machine instructions per connection, under callgrind")
    ap.add_argument("--encode", type=int, default=0, help=argparse.SUPPRESS)  # CONNECTs encoded
    a = ap.parse_args()
    if a.instructions:
        print(f"{instructions(a.level):,} instructions per connect + close (callgrind); "
              f"MQTT level {a.level}, 100 held open")
        return
    install_uvloop()
    if a.profile:
        import cProfile
        import pstats
        a.repeats = 1
        prof = cProfile.Profile()
        prof.runcall(asyncio.run, run(a))
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    res = asyncio.run(run(a))
    print(f"{min(res):.2f} us CPU per connection (best of {a.repeats}; all: "
          f"{', '.join(f'{x:.2f}' for x in res)}); MQTT level {a.level}, {a.hold} held open")


if __name__ == "__main__":
    main()
