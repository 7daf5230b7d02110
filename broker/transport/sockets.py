"""Listening sockets made the way the broker wants them (no resolver threads, TCP_DEFER_ACCEPT)."""
from __future__ import annotations

import logging
import socket
from typing import Iterable

log = logging.getLogger(__name__)


def numeric_listen_socket(host: str, port: int) -> socket.socket | None:
    """The bound socket create_server(host, port, reuse_address=True) makes, for a numeric
    address (None for a name, which the loop resolves). The event loop would resolve even a
    numeric address with getaddrinfo on libuv's thread pool, which then keeps 4 threads for the
    process's life (0.7 MiB) and loads the IDNA codec (0.4 MiB). Same options (SO_REUSEADDR;
    IPv6 only on an IPv6 address) and the same error as the loop's."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            packed = socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        break
    else:
        return None
    addr: tuple = (socket.inet_ntop(family, packed), port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            addr += (0, 0)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(addr)
        except OSError as err:
            raise OSError(err.errno, f"error while attempting to bind on address {addr!r}: "
                          f"{(err.strerror or str(err)).lower()}") from None
    except BaseException:
        sock.close()
        raise
    return sock


DEFER_ACCEPT_SECONDS = 1


def defer_accept(sockets: Iterable[socket.socket]) -> None:
    """TCP_DEFER_ACCEPT (Linux): the kernel hands a connection over once its first bytes have
    arrived, so accepting it and reading its CONNECT take one wake-up instead of two (about
    6 us less CPU per connection, bench/bench.py --scenarios conns). Every client of these
    listeners speaks first (MQTT CONNECT, TLS ClientHello, HTTP upgrade); one that stays
    silent is accepted after about DEFER_ACCEPT_SECONDS, then mqtt.connect_timeout applies."""
    opt = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if opt is None:
        return
    for sock in sockets:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, opt, DEFER_ACCEPT_SECONDS)
            except OSError as exc:  # not fatal: connections are accepted as without it
                log.warning("TCP_DEFER_ACCEPT not set on %s: %s", sock.getsockname(), exc)
