"""The event loop: uvloop, with its table of transports by file descriptor made cheap.

uvloop's Loop keeps every transport it makes in `Loop._transports`, a weakref.WeakValueDictionary
keyed by file descriptor, for one check: add_reader() and the like refuse an fd that a live
transport owns. An entry of that class is made (KeyedRef) and removed (its callback) by Python
code, which costs 9,600 machine instructions per connection: a tenth of the broker's whole cost
of a connection, and 30% of a bare uvloop server's (bench/conn_instructions.sh).

install_uvloop() imports uvloop with a TransportTable in its place: a dict, whose entries the
interpreter makes and replaces in C. It holds its transports strongly, so a closed transport
(its protocol already released by uvloop, its socket closed, about 800 bytes left) stays until
its fd number is reused by the next connection or tidy() drops it: the server calls tidy() once a
second, and it prunes when the table holds more than twice the transports alive at the last
prune (plus PRUNE_SLACK), so what is held is bounded and the pruning costs O(1) per connection.
The check keeps its meaning: it asks the transport whether it is alive.
"""
from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import weakref

PRUNE_SLACK = 256  # closed transports always allowed to wait for their fd to be reused

# what uvloop.loop imports (uvloop/includes/__init__.py lists them): imported before the swap, so
# that no module but uvloop.loop is first imported while TransportTable stands in
UVLOOP_IMPORTS = ("asyncio", "collections", "concurrent.futures", "errno", "functools", "gc",
                  "inspect", "itertools", "os", "signal", "socket", "subprocess", "ssl", "stat",
                  "threading", "traceback", "time", "warnings", "typing")


class TransportTable(dict):
    """uvloop's Loop._transports (fd -> transport), as a plain dict; see the module's text."""

    def __init__(self) -> None:
        super().__init__()
        self.keep = PRUNE_SLACK  # entries allowed before the next prune

    def prune(self) -> int:
        """Drop the transports that are closed or closing; returns how many are left."""
        for fd, transport in list(self.items()):
            if transport.is_closing():
                del self[fd]
        return len(self)

    def tidy(self) -> None:
        """Prune once the table holds more than twice what was alive at the last prune."""
        if len(self) > self.keep:
            self.keep = 2 * self.prune() + PRUNE_SLACK


def install_uvloop() -> bool:
    """Make uvloop asyncio's event loop, with a TransportTable as its transport table (unless
    uvloop was imported already: then its own). False if uvloop is not installed."""
    try:
        if "uvloop.loop" not in sys.modules:
            for name in UVLOOP_IMPORTS:
                importlib.import_module(name)
            # uvloop.loop takes weakref.WeakValueDictionary once, when it is imported
            original = weakref.WeakValueDictionary
            weakref.WeakValueDictionary = TransportTable  # type: ignore[assignment, misc]
            try:
                importlib.import_module("uvloop.loop")
            finally:
                weakref.WeakValueDictionary = original  # type: ignore[misc]
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def transport_table(loop: asyncio.AbstractEventLoop) -> TransportTable | None:
    """The loop's TransportTable, if it has one (a uvloop Loop made after install_uvloop()).

    Why gc.get_referents(): uvloop declares `_transports` as a private C field of its Loop
    (`cdef object _transports`, uvloop/loop.pxd), with no Python attribute to read it by; the
    collector's view of the loop's references is the one documented way to reach it. A plain
    alternative costs more or guesses more: no swap at all (uvloop's WeakValueDictionary) costs
    9,600 machine instructions per connection (module text); recording "the table made last" in
    TransportTable.__init__ pairs table and loop by timing, not by reference. This runs once per
    loop (Server.start), 0.34 us for uvloop 0.23's 29 referents: nothing per connection.
    If uvloop changes (reads WeakValueDictionary elsewhere, stops making one per Loop, or stops
    listing the field to the collector), this returns None: the server then never tidies, and a
    closed transport is held until its fd is reused (bounded by the peak of open fds). The edge is
    guarded by tests/unit/test_eventloop.py::test_uvloop_takes_a_transport_table_and_nothing_else_does
    (and ::test_the_servers_tick_bounds_the_closed_transports), which fail on such a uvloop."""
    for o in gc.get_referents(loop):
        if type(o) is TransportTable:
            return o
    return None
