"""What the broker process does to itself and tells its host: the garbage collector tuned for a
server, free heap pages given back, and the service manager told when it is ready or stopping."""
from __future__ import annotations

import gc
import logging
import socket

from settings import environment

log = logging.getLogger(__name__)


def notify_service_manager(state: str) -> None:
    """sd_notify(3) without libsystemd: one datagram to the socket in $NOTIFY_SOCKET (set by
    systemd for Type=notify units; "@name" is an abstract socket). Nothing when it is unset."""
    path = environment.NOTIFY_SOCKET.get()
    if not path:
        return
    if path[0] == "@":
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(state.encode(), path)
    except OSError as exc:
        log.warning("cannot tell the service manager %s at NOTIFY_SOCKET=%s: %s", state,
                    path, exc)


# Young-generation threshold of the garbage collector (CPython's default is 700 allocations).
# What a connection holds (protocol, Connection, Session, uvloop's transport) is freed by
# reference counting when it closes (no cycles are left behind), so the collector's passes over
# it are pure cost: every young pass walks each connection opened since the last one, and each
# tenth pass walks them again. At 10,000 a burst of 5,000 connects costs 4% fewer instructions
# (bench `conns` under callgrind: 108,900 -> 104,000 per connection; the collector's share
# 12,900 -> 8,000). A young pass then walks at most 10,000 objects (under a millisecond), and
# the cyclic garbage that waits for one (TLS and WebSocket connections make some) stays small.
# The per-message paths make no cycles either (tests: test_matching_leaves_no_reference_cycles,
# test_a_closed_connection_is_freed_without_the_garbage_collector): one that did would hold its
# garbage for up to 10,000 allocations instead of 700.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """The garbage collector, for a server whose state is long-lived and cycle-free."""
    # Everything made so far (modules, config, restored state) lives as long as the process: out
    # of the collector's sight, so its full passes walk only what came after (bench.py `conns`:
    # the collector's time per connection 8.4 -> 4.6 us)
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere).
    Importing and starting leave free holes in the heap (each module's compiled code is read
    whole, then freed) that glibc keeps mapped: 1.8 MiB of the idle broker's RSS."""
    import ctypes
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return
    trim(0)
