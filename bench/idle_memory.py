"""Python memory the broker holds per idle connection, by allocation site (tracemalloc).

    PYTHONPATH=. .venv/bin/python bench/idle_memory.py --conns 1000 [--level 4] [--top 15]
    PYTHONPATH=. .venv/bin/python bench/idle_memory.py --conns 2000 --cpu   # CPU per connection setup

Runs a broker Server (uvloop, as in production) in a child process with tracemalloc on, opens
`--conns` connected, idle MQTT clients from this process, and prints the growth of the broker's
traced memory between before and after, divided by the number of connections, with the top
allocation sites. (RSS per connection, which also counts the allocator's slack, is the bench's
`conns` scenario.) With --cpu, tracemalloc stays off and the broker's CPU time (user + system,
getrusage) per connection set up (accept, CONNECT, CONNACK) is printed instead: robust on a
loaded machine, unlike connections per second.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import asyncio, sys, tracemalloc, gc, resource
sys.path.insert(0, sys.argv[1])
from settings import Config
from broker.server import Server
from broker.transport.eventloop import install_uvloop
install_uvloop()
top = int(sys.argv[2])
cpu_only = sys.argv[3] == "cpu"

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

async def main():
    server = Server(Config(host="127.0.0.1", port=0))
    await server.start()
    print(server.port, flush=True)
    loop = asyncio.get_running_loop()
    r = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(r), sys.stdin)
    await r.readline()                      # "start": the clients are about to connect
    gc.collect()
    if cpu_only:
        t0 = cpu()
        await r.readline()
        n = int((await r.readline()).decode())
        print(f"{(cpu() - t0) / n * 1e6:.1f} us broker CPU per connection set up ({n} connections)")
        print("END", flush=True)
        await server.stop()
        return
    tracemalloc.start(6)
    before = tracemalloc.take_snapshot()
    await r.readline()                      # "measure n"
    n = int((await r.readline()).decode())
    gc.collect()
    after = tracemalloc.take_snapshot()
    stats = after.compare_to(before, "traceback")
    total = sum(s.size_diff for s in stats)
    print(f"{total / n:.0f} bytes per idle connection ({n} connections, Python heap, tracemalloc)")
    for s in sorted(stats, key=lambda s: -s.size_diff)[:top]:
        frames = [f for f in s.traceback if "tracemalloc" not in f.filename][-3:]
        def short(f):
            name = f.filename
            name = os.path.relpath(name, sys.argv[1]) if name.startswith(sys.argv[1]) else os.path.basename(name)
            return f"{name}:{f.lineno}"
        where = " <- ".join(short(f) for f in reversed(frames))
        print(f"{s.size_diff / n:8.0f} B/conn  {where}")
    print("END", flush=True)
    await server.stop()

import os
asyncio.run(main())
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conns", type=int, default=1000)
    p.add_argument("--level", type=int, default=4, choices=[4, 5])
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--cpu", action="store_true", help="CPU per connection set up, no tracemalloc")
    a = p.parse_args()
    sys.path.insert(0, REPO)
    from broker.protocol import packets as P
    from broker.protocol.codec import encode
    child = subprocess.Popen([sys.executable, "-c", CHILD, REPO, str(a.top),
                              "cpu" if a.cpu else "mem"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    port = int(child.stdout.readline())
    child.stdin.write("start\n")
    child.stdin.flush()
    time.sleep(0.5)
    socks = []
    for i in range(a.conns):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(encode(P.Connect(f"idle-{i}", a.level, keep_alive=60), a.level))
        socks.append(s)
    for s in socks:
        assert s.recv(64)[:1] == b"\x20"
    time.sleep(0.5)
    child.stdin.write(f"measure\n{a.conns}\n")
    child.stdin.flush()
    for line in child.stdout:
        if line.strip() == "END":
            break
        print(line, end="")
    for s in socks:
        s.close()
    child.wait(30)


if __name__ == "__main__":
    main()
