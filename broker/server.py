"""asyncio glue: listeners, one Protocol per socket feeding a sans-I/O Connection,
one write per connection per event-loop turn, timers, signals and shutdown."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket

from .config import Config
from .core.broker import Broker
from .core.connection import Connection

log = logging.getLogger("broker.server")


class MQTTProtocol(asyncio.Protocol):
    __slots__ = ("server", "conn", "transport")

    def __init__(self, server: "Server"):
        self.server = server
        self.conn: Connection | None = None
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        self.conn = Connection(self.server.broker, f"{peer[0]}:{peer[1]}" if peer else "?")
        self.conn.transport = transport

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.data_received(data)
        if conn.held_acks:
            self.server.hold_acks(conn)

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        if self.conn is not None:
            self.conn.connection_lost()
            self.conn.transport = None


class Server:
    def __init__(self, config: Config, sink=None, auth=None):
        self.config = config
        self.sink = sink
        self.broker = Broker(config.mqtt, sink=sink, auth=auth)
        self.broker.schedule_flush = self._schedule_flush
        self.loop: asyncio.AbstractEventLoop | None = None
        self.servers: list = []
        self._flush_scheduled = False
        self._ticker = None
        self.stopped = None

    # ------------------------------------------------------------ output
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what every dirty connection accumulated this turn, in one call each."""
        self._flush_scheduled = False
        dirty = self.broker.dirty
        self.broker.dirty = []
        for conn in dirty:
            out = conn.take_output()
            t = conn.transport
            if t is None:
                continue
            if out:
                t.write(out[0] if len(out) == 1 else b"".join(out))
            if conn.close_requested:
                t.close()

    def hold_acks(self, conn: Connection) -> None:
        """PUBACK/PUBREC wait until the sink says the messages are on disk."""
        acks = conn.held_acks
        conn.held_acks = []
        fut = self.sink.barrier() if self.sink is not None else None
        if fut is None:
            conn.release_acks(acks)
        else:
            fut.add_done_callback(lambda f: conn.release_acks(acks))

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = self.loop.create_future()
        cfg = self.config
        srv = await self.loop.create_server(lambda: MQTTProtocol(self), cfg.host, cfg.port,
                                            reuse_address=True, backlog=4096)
        self.servers.append(srv)
        for s in srv.sockets:
            log.info("listening for MQTT on %s:%s", *s.getsockname()[:2])
        self._ticker = self.loop.call_later(1.0, self._tick)

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]

    def _tick(self) -> None:
        try:
            self.broker.tick()
        except Exception:  # never let a timer bug stop the broker
            log.exception("timer tick failed")
        self._ticker = self.loop.call_later(1.0, self._tick)

    async def stop(self) -> None:
        log.info("shutting down")
        for srv in self.servers:
            srv.close()
        if self._ticker:
            self._ticker.cancel()
        self.broker.shutdown()
        self.flush()
        for srv in self.servers:
            await srv.wait_closed() if False else None
        await asyncio.sleep(0.05)
        if not self.stopped.done():
            self.stopped.set_result(None)


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def serve(config: Config, sink=None, auth=None) -> None:
    server = Server(config, sink=sink, auth=auth)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
