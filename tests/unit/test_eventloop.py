"""transport/eventloop.py: uvloop with a TransportTable (a dict) as its table of transports by
file descriptor. install_uvloop() changes process-wide state (the loop policy, uvloop's import),
so the checks on a real uvloop run in a fresh interpreter each."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.transport.eventloop import PRUNE_SLACK, TransportTable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(code: str) -> dict:
    """Run `code` in a fresh interpreter (the repository on its path); it prints one JSON line."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_uvloop_takes_a_transport_table_and_nothing_else_does():
    """The edge eventloop.py's two tricks rest on: uvloop.loop takes weakref.WeakValueDictionary
    when imported and makes one per Loop, and gc.get_referents(loop) lists it. A uvloop that
    changes either fails here (transport_table() would find no table and the server not tidy)."""
    out = run_child("""
        import asyncio, gc, json, weakref
        from broker.transport.eventloop import TransportTable, install_uvloop, transport_table
        original = weakref.WeakValueDictionary
        ok = install_uvloop()
        loop = asyncio.new_event_loop()
        table = transport_table(loop)
        tables = [o for o in gc.get_objects() if type(o) is TransportTable]
        print(json.dumps({"installed": ok, "loop": type(loop).__module__,
                          "table": type(table).__name__, "tables": len(tables),
                          "is_the_loops": tables == [table],
                          "restored": weakref.WeakValueDictionary is original}))
    """)
    assert out == {"installed": True, "loop": "uvloop", "table": "TransportTable", "tables": 1,
                   "is_the_loops": True, "restored": True}


def test_closed_transports_are_pruned_and_the_fd_check_still_holds():
    """Connections in and out on one loop: the table holds their transports; once closed, only
    until prune(); uvloop still refuses add_reader() on a live transport's fd, and allows it on
    the fd of a closed one that is still in the table."""
    out = run_child("""
        import asyncio, json, socket
        from broker.transport.eventloop import install_uvloop, transport_table
        install_uvloop()

        async def main():
            loop = asyncio.get_running_loop()
            table = transport_table(loop)
            accepted = []
            srv = await loop.create_server(lambda: accepted.append(asyncio.Protocol()) or accepted[-1],
                                           "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            base = len(table)  # the listener's own transports are not in it (servers, not streams)
            clients = [await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
                       for _ in range(300)]
            await asyncio.sleep(0.2)
            opened = len(table) - base
            t0 = clients[0][0]
            fd = t0.get_extra_info("socket").fileno()
            try:
                loop.add_reader(fd, lambda: None)
                refused = None
            except RuntimeError as exc:
                refused = str(exc)
            for t, _ in clients:
                t.close()
            await asyncio.sleep(0.3)  # the server side sees EOF and closes its transports too
            kept = len(table) - base
            stale = fd in table and table[fd].is_closing()
            a, b = socket.socketpair()  # (low fds are reused: the dead entry may be for one)
            for s in (a, b):
                loop.add_reader(s.fileno(), lambda: None)  # a closed transport's fd: allowed
                loop.remove_reader(s.fileno())
            a.close(); b.close()
            left = table.prune() - base
            srv.close()
            print(json.dumps({"opened": opened, "refused": refused, "kept": kept, "stale": stale,
                              "left": left}))

        asyncio.run(main())
    """)
    assert out["opened"] == 600  # both ends of 300 connections
    assert out["refused"] and "is used by transport" in out["refused"]
    assert out["kept"] == 600 and out["stale"]  # closed, still held: until pruned
    assert out["left"] == 0


def test_uvloop_imported_first_keeps_its_own_table():
    out = run_child("""
        import asyncio, json
        import uvloop
        from broker.transport.eventloop import install_uvloop, transport_table
        ok = install_uvloop()
        loop = asyncio.new_event_loop()
        print(json.dumps({"installed": ok, "loop": type(loop).__module__,
                          "table": transport_table(loop) is None}))
    """)
    assert out == {"installed": True, "loop": "uvloop", "table": True}


def test_the_servers_tick_bounds_the_closed_transports():
    """The broker on uvloop: connections that CONNECT and close leave their transports in the
    table until the server's once-a-second tick prunes them."""
    out = run_child("""
        import asyncio, json, socket
        from settings import Config
        from broker.server import Server
        from broker.transport.eventloop import install_uvloop
        install_uvloop()
        CONNECT = bytes([0x10, 12, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 60, 0, 0])

        async def main():
            server = Server(Config(host="127.0.0.1", port=0))
            await server.start()
            table = server.transports
            loop = asyncio.get_running_loop()
            async def cycle():
                r, w = await asyncio.open_connection("127.0.0.1", server.port)
                w.write(CONNECT)
                await r.readexactly(4)
                w.close()
            for _ in range(2):
                await asyncio.gather(*(cycle() for _ in range(400)))
            await asyncio.sleep(0.3)
            before = len(table)
            server._tick()
            after, keep = len(table), table.keep
            await server.stop()
            print(json.dumps({"before": before, "after": after, "keep": keep}))

        asyncio.run(main())
    """)
    assert out["before"] > PRUNE_SLACK  # closed transports, one per fd number used (so many the
    # tick prunes: its slack is for fewer)
    assert out["after"] == 0  # nothing alive: every transport was closed
    assert out["keep"] == PRUNE_SLACK


class Transport:
    def __init__(self):
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing


# one step of a loop's life between two ticks: (connections opened, of the open ones how many
# close (the oldest first), whether new connections reuse the lowest free fd numbers as the
# kernel does or take new ones (the worst case for the table))
steps = st.lists(st.tuples(st.integers(0, 600), st.integers(0, 600), st.booleans()),
                 min_size=1, max_size=25)


class CountingTable(TransportTable):
    """A TransportTable that counts what its prunes look at."""

    def __init__(self):
        super().__init__()
        self.looked_at = 0

    def prune(self) -> int:
        self.looked_at += len(self)
        return super().prune()


@settings(max_examples=200, deadline=None)
@given(steps)
def test_tidy_bounds_the_closed_transports_whatever_comes_and_goes(steps):
    """However connections come and go, a tick's tidy() never drops a live transport; when it
    prunes, exactly the live ones are left and it next prunes past twice their number plus
    PRUNE_SLACK; after it the table holds at most that. Pruning costs O(1) per connection: all
    the prunes together look at fewer than twice the entries ever added."""
    table = CountingTable()
    open_fds: list[int] = []
    next_fd = 3
    added = 0
    for opened, closed, reuse in steps:
        for _ in range(opened):
            if reuse:  # the lowest fd number not open, as the kernel gives
                taken = set(open_fds)
                fd = next(n for n in range(3, next_fd + 1) if n not in taken)
            else:
                fd = next_fd
            next_fd = max(next_fd, fd + 1)
            table[fd] = Transport()
            open_fds.append(fd)
            added += 1
        for fd in open_fds[:closed]:  # the oldest close
            table[fd].closing = True
        del open_fds[:closed]
        looked_at = table.looked_at
        table.tidy()
        assert all(fd in table and not table[fd].is_closing() for fd in open_fds)
        if table.looked_at > looked_at:  # it pruned
            assert len(table) == len(open_fds)
            assert table.keep == 2 * len(open_fds) + PRUNE_SLACK
        assert len(table) <= table.keep
    assert table.looked_at <= 2 * added
