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
    """The loop's TransportTable, if it has one (a uvloop Loop made after install_uvloop())."""
    for o in gc.get_referents(loop):  # (uvloop's Loop keeps it in a C field)
        if type(o) is TransportTable:
            return o
    return None
