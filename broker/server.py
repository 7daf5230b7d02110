"""asyncio glue: listeners (TCP, TLS, WebSocket), one Protocol per socket feeding a
sans-I/O Connection, one write per connection per event-loop turn, timers, signals."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket

from .config import Config, ListenerConfig
from .core.broker import Broker
from .core.connection import Connection, StoredAck
from .transport import tls

log = logging.getLogger("broker.server")

LARGE_READ = 16384         # a read this big is flushed at once instead of at the end of the turn
WRITE_HIGH_WATER = 1 << 20  # bytes buffered for a client before QoS 0 is dropped / QoS 1-2 queued


class MQTTProtocol(asyncio.Protocol):
    __slots__ = ("server", "conn", "listener", "transport", "discard", "linger_timer")

    def __init__(self, server: "Server", listener: ListenerConfig):
        self.server = server
        self.listener = listener
        self.conn: Connection | None = None
        self.transport = None
        self.discard = -1          # >= 0 while closing: input bytes still allowed (and dropped)
        self.linger_timer = None

    def connection_made(self, transport) -> None:
        server = self.server
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        conn = self.conn = Connection(server.broker, f"{peer[0]}:{peer[1]}" if peer else "?")
        conn.transport = transport
        max_conn = server.config.mqtt.max_connections
        if max_conn and len(server.broker.connections) > max_conn:
            log.warning("refusing %s: max_connections (%d) reached", conn.peer, max_conn)
            conn.finish(publish_will=False)
            self.close_gracefully()
            return
        conn.identity = tls.listener_identity(self.listener, transport.get_extra_info("ssl_object"))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        self.server.bytes_in += len(data)
        if self.discard >= 0:  # closing: input never reaches the core
            self.discard -= len(data)
            if self.discard < 0:
                self.transport.abort()
            return
        conn.data_received(data)
        if conn.held_acks:
            self.server.hold_acks(conn)
        if len(data) >= LARGE_READ:
            # The loop may hand us many large reads from one socket in a row (libuv reads
            # up to 32 x 64 KiB per wake-up): write out now so output never piles up for a
            # whole turn, which bounds memory and latency under fan-out.
            self.server.flush()

    def eof_received(self):
        return False  # the transport closes (after writing what it holds)

    def close_gracefully(self) -> None:
        """Close after the last output (a server DISCONNECT) without resetting the connection
        under a client that is still sending: a socket closed with unread input sends a TCP RST,
        and the client's next send or read fails before it has read the DISCONNECT. So send
        FIN after the output (half-close), then read and drop the client's input until it
        closes too, for at most close_linger_seconds / close_linger_bytes, then close."""
        t = self.transport
        if self.discard >= 0 or t.is_closing():
            return
        if not t.can_write_eof():  # TLS (close_notify) and WebSocket (Close frame) close themselves
            t.close()
            return
        cfg = self.server.config.mqtt
        t.write_eof()
        self.discard = cfg.close_linger_bytes
        self.linger_timer = self.server.loop.call_later(cfg.close_linger_seconds, t.abort)

    def pause_writing(self) -> None:
        self.conn.paused = True

    def resume_writing(self) -> None:
        self.conn.resume_writing()

    def connection_lost(self, exc) -> None:
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        if self.conn is not None:
            self.conn.connection_lost()
            self.conn.transport = None


class Server:
    def __init__(self, config: Config, sink=None, auth=None, store=None):
        self.config = config
        self.sink = sink
        self.store = store
        self.broker = Broker(config.mqtt, sink=sink, auth=auth, store=store)
        self.broker.schedule_flush = self._schedule_flush
        self.auth_checks = None
        if getattr(auth, "passwords", None) is not None:
            # scrypt takes ~100 ms: on a few threads, with a bounded queue (auth/checks.py)
            from .auth.checks import DEFAULT_MAX_PENDING, CheckQueue
            self.auth_checks = CheckQueue(getattr(auth, "check_threads", 0),
                                          getattr(auth, "max_pending_checks", DEFAULT_MAX_PENDING))
            self.broker.defer_auth = self._defer_auth
            self.broker.max_deferred_bytes = getattr(auth, "max_deferred_bytes",
                                                     self.broker.max_deferred_bytes)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.servers: list = []
        self.ports: dict[str, int] = {}
        self.tls_contexts: list = []
        self.bytes_in = 0
        self.bytes_out = 0
        self._flush_scheduled = False
        self._held_turn: list = []  # (conn, held acks) since the store's last commit
        self._ticker = None
        self._gc = 0
        self.sys = None
        self.dashboard = None  # broker/dashboard ([dashboard] enabled = true)

    # ------------------------------------------------------------ output
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what every dirty connection accumulated this turn, in one call each."""
        self._flush_scheduled = False
        store = self.store
        if store is not None and (store.ops or store.resync):
            self.commit_store()  # state changes reach the store before the acknowledgements go out
        dirty = self.broker.dirty
        self.broker.dirty = []
        n = 0
        for conn in dirty:
            out = conn.take_output()
            t = conn.transport
            if t is None:
                continue
            if out:
                data = out[0] if len(out) == 1 else b"".join(out)
                n += len(data)
                t.write(data)
            if conn.close_requested:
                t.get_protocol().close_gracefully()
        self.bytes_out += n

    def commit_store(self) -> None:
        """Commit the state changes made so far; if that fails, the acks waiting to be written
        whose messages needed those changes become failures (the store retries the changes)."""
        held, self._held_turn = self._held_turn, []
        if self.store.commit() >= 0:
            for _, acks in held:  # decided: a later failed commit must not turn them
                for i, a in enumerate(acks):
                    if type(a) is StoredAck:
                        acks[i] = bytes(a)
            return
        why = "the message could not be stored (broker disk error)"
        for conn in list(self.broker.dirty):
            conn.fail_stored_acks(conn.out, why)
        for conn, acks in held:
            conn.fail_stored_acks(acks, why)

    def hold_acks(self, conn: Connection) -> None:
        """PUBACK/PUBREC wait until the sink says the messages are on disk."""
        acks = conn.held_acks
        conn.held_acks = []
        fut = self.sink.barrier() if self.sink is not None else None
        if fut is None:
            conn.release_acks(acks)
        else:
            if self.store is not None:
                self._held_turn.append((conn, acks))  # the store's next commit decides them too
            fut.add_done_callback(lambda f: self._acks_done(f, conn, acks))

    def _acks_done(self, fut, conn: Connection, acks: list) -> None:
        """The sink's barrier resolved: success acks, or failures if the spool write failed."""
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is None:
            conn.release_acks(acks)
        else:
            conn.fail_acks(acks, "the message could not be stored (broker disk error)")

    def _defer_auth(self, conn: Connection, connect, client_id: str, assigned) -> bool:
        """Queue the password check; False when too many are pending (the CONNECT is refused)."""
        auth = self.broker.auth

        def check() -> int:  # in a worker thread
            return auth.authenticate(client_id, connect.username, connect.password)

        def done(code) -> None:
            conn.auth_done(connect, client_id, assigned, 0x80 if code is None else code)
            if conn.held_acks:
                self.hold_acks(conn)

        cached = getattr(auth, "authenticate_cached", None)
        code = cached(client_id, connect.username, connect.password) if cached else None
        if code is not None:  # remembered result: no hash, so no queue (reconnect storms)
            done(code)
            return True
        t = conn.transport
        peer = t.get_extra_info("peername") if t is not None else None
        return self.auth_checks.submit(peer[0] if peer else conn.peer, check,
                                       conn.awaiting_auth, done)

    # ------------------------------------------------------------ lifecycle
    def listener_specs(self) -> list[ListenerConfig]:
        # the checks live with the other config checks
        from .config import listener_specs
        return listener_specs(self.config)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.store is not None:
            self.store.load(self.broker)
        for spec in self.listener_specs():
            kind = spec.type
            ctx = None
            if kind in ("tls", "wss"):
                ctx = tls.make_context(spec)
                self.tls_contexts.append((ctx, spec))
            if kind in ("ws", "wss"):
                from .transport.websocket import start_listener
                srv = await start_listener(self, spec, ctx)
            else:
                srv = await self.loop.create_server(
                    lambda spec=spec: MQTTProtocol(self, spec), spec.host, spec.port,
                    reuse_address=True, backlog=4096, ssl=ctx)
            self.servers.append(srv)
            port = list(srv.sockets)[0].getsockname()[1]
            self.ports[spec.name] = port
            log.info("listening for MQTT (%s) on %s:%s%s", kind, spec.host, port,
                     spec.path if kind in ("ws", "wss") else "")
        m = self.config.metrics
        if m.enabled:
            from .observability.metrics import start_http
            srv = await start_http(self, m.host, m.port)
            self.servers.append(srv)
            self.ports["metrics"] = srv.sockets[0].getsockname()[1]
        if m.sys_interval:
            from .observability.sys_topics import SysPublisher
            self.sys = SysPublisher(self, m.sys_interval)
        if self.config.dashboard.enabled:
            from .dashboard import start as start_dashboard
            self.dashboard = await start_dashboard(self)
            self.ports["dashboard"] = self.dashboard.port
        self._ticker = self.loop.call_later(1.0, self._tick)

    @property
    def port(self) -> int:
        return self.ports["mqtt"]

    def reload_tls(self) -> None:
        """SIGHUP: reload certificates (open connections keep theirs) and auth files."""
        for ctx, spec in self.tls_contexts:
            try:
                tls.load(ctx, spec)
                log.info("reloaded TLS certificate %s", spec.certfile)
            except ValueError as exc:
                log.error("%s (keeping the previous certificate)", exc)
        reload_auth = getattr(self.broker.auth, "reload", None)
        if reload_auth is not None:
            reload_auth()

    def _tick(self) -> None:
        try:
            self.broker.tick()
            if self.store is not None:
                self.commit_store()
                self._gc += 1
                if self._gc % 60 == 0:
                    self.store.collect_garbage()
            if self.sys is not None:
                now = self.loop.time()
                if now - self.sys.last >= self.sys.interval:
                    self.sys.last = now
                    self.sys.publish()
        except Exception:  # never let a timer bug stop the broker
            log.exception("timer tick failed")
        self._ticker = self.loop.call_later(1.0, self._tick)

    async def stop(self) -> None:
        log.info("shutting down")
        for srv in self.servers:
            srv.close()
        if self._ticker:
            self._ticker.cancel()
        if self.dashboard is not None:
            await self.dashboard.stop()
        self.broker.shutdown()
        self.flush()
        if self.auth_checks is not None:
            self.auth_checks.close()
        if self.store is not None:
            self.store.close()
        await asyncio.sleep(0.05)


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def serve(config: Config, sink=None, auth=None, store=None) -> None:
    server = Server(config, sink=sink, auth=auth, store=store)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    await stop.wait()
    await server.stop()
