"""asyncio glue: listeners (TCP, TLS, WebSocket) and lifecycle, one write per connection per
event-loop turn, timers, signals. The per-connection protocol object (transport, flow control,
events, held acks) is transport/connection_protocol.py."""
from __future__ import annotations

import asyncio
import logging
import signal
from functools import partial
from typing import TYPE_CHECKING, Any, Sequence

from settings import Config, ListenerConfig, listener_specs

from . import native
from .core.broker import Broker
from .process import notify_service_manager, release_free_memory, tune_gc
from .transport import tls
from .transport.connection_protocol import AckGate, MQTTProtocol
from .transport.eventloop import TransportTable, transport_table
from .transport.sockets import defer_accept, numeric_listen_socket
from .transport.state import ServerState

if TYPE_CHECKING:
    from websockets.asyncio.server import Server as WSServer

    from .dashboard.api import Dashboard
    from .observability.sys_topics import SysPublisher

log = logging.getLogger(__name__)


class Server:
    def __init__(self, config: Config, auth: Any = None, hooks: Sequence[Any] = ()) -> None:
        """hooks: the persistence store, the sink, the cluster... (core/hooks.py), attached to
        the broker after auth; the server only calls their lifecycle events."""
        self.config = config
        self.broker = Broker(config.mqtt, auth=auth, hooks=hooks)
        self.hooks = self.broker.hooks
        self.broker.schedule_flush = self._schedule_flush  # (typed None in the core)
        # anonymous clients from other machines only when auth.allow_anonymous = true is set
        # (unset: from loopback addresses only, as Mosquitto 2's local-only default)
        self.broker.anonymous_remote = config.auth.allow_anonymous is True
        self.auth_checks = None
        if getattr(auth, "passwords", None) is not None:  # an auth hook with a password file
            # scrypt takes ~100 ms: on a few threads, with a bounded queue (auth/checks.py), and
            # what a client sends meanwhile bounded too: the [auth] section says how far
            from .auth.checks import CheckQueue
            bounds = config.auth
            self.auth_checks = CheckQueue(bounds.check_threads, bounds.max_pending_checks)
            self.broker.defer_auth = True  # CONNECTs with a user name return AuthRequested
            self.broker.max_deferred_bytes = bounds.max_deferred_bytes
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self.servers: list = []
        self.ports: dict[str, int] = {}
        self.tls_contexts: list = []
        self._flush_scheduled = False
        self.acks = AckGate(self.hooks, self._schedule_flush)  # acks waiting for durability, decided in one place
        self._ticker: asyncio.TimerHandle | None = None
        self.transports: TransportTable | None = None  # uvloop's TransportTable (transport/eventloop.py), if it has one
        self.sys: SysPublisher | None = None
        self.dashboard: Dashboard | None = None  # broker/dashboard ([dashboard] enabled = true)
        # banned client ids, user names, addresses (0x8A at CONNECT); kept in the data dir
        from .admin.bans import BanList, bans_file
        self.bans = BanList(bans_file(config.data_dir))
        self.broker.bans = self.bans.check  # (typed None in the core)
        # what the protocols, metrics, $SYS and the dashboard get: never the Server itself
        self.state = ServerState(self.broker, config, self.acks, self.flush, self.bans,
                                 self.auth_checks)
        for h in hooks:  # a cluster shares the list between its nodes (cluster/node.py)
            share = getattr(h, "share_bans", None)
            if share is not None:
                share(self.bans)

    # ------------------------------------------------------------ output
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what every dirty connection accumulated this turn, in one call each."""
        self._flush_scheduled = False
        # (Hooks sets its event tuples by name: the core does not declare them)
        for turn_end in self.hooks.on_turn_end:  # state changes are committed before the
            turn_end()                           # acknowledgements that wait for them go out
        dirty = self.broker.dirty
        self.broker.dirty = []
        n = 0
        for conn in dirty:
            owner = conn.owner
            if owner is None:
                conn.take_output()
                continue
            n += owner.write_output()
        self.state.bytes_out += n
        if self.broker.durable_out:
            self.broker.durable_out.clear()

    # ------------------------------------------------------------ lifecycle
    def listener_specs(self) -> list[ListenerConfig]:
        return listener_specs(self.config)   # checked with the other settings (settings/load.py)

    async def start(self) -> None:
        self.loop = self.state.loop = asyncio.get_running_loop()
        self.transports = transport_table(self.loop)
        for start in self.hooks.on_start:  # restore state before clients can connect
            start()
        srv: asyncio.Server | WSServer
        for spec in self.listener_specs():
            kind = spec.type
            ctx = None
            if kind in ("tls", "wss"):
                ctx = tls.make_context(spec)
                self.tls_contexts.append((ctx, spec))
            try:
                if kind in ("ws", "wss"):
                    from .transport.websocket import start_listener
                    srv = await start_listener(self.state, spec, ctx)
                else:
                    factory = partial(MQTTProtocol, self.state, spec)
                    sock = numeric_listen_socket(spec.host, spec.port)  # type: ignore[arg-type]  # (required: set)
                    if sock is not None:
                        srv = await self.loop.create_server(factory, sock=sock, backlog=4096,
                                                            ssl=ctx)
                    else:  # a name: resolved by the loop
                        srv = await self.loop.create_server(factory, spec.host, spec.port,
                                                            reuse_address=True, backlog=4096,
                                                            ssl=ctx)
            except OSError as exc:
                raise ListenError(exc, f"MQTT ({kind}, listener {spec.name!r})", spec.host,
                                  spec.port) from None  # type: ignore[arg-type]  # (required: set)
            self.servers.append(srv)
            defer_accept(srv.sockets)
            port = list(srv.sockets)[0].getsockname()[1]
            self.ports[spec.name] = port
            log.info("listening for MQTT (%s) on %s:%s%s: %s", kind, spec.host, port,
                     spec.path if kind in ("ws", "wss") else "", who_may_connect(spec, self.config))
        m = self.config.metrics
        if m.enabled:
            from .observability.metrics import start_http
            try:
                srv = await start_http(self.state, m.host, m.port)
            except OSError as exc:
                raise ListenError(exc, "metrics ([metrics] port)", m.host, m.port) from None
            self.servers.append(srv)
            self.ports["metrics"] = srv.sockets[0].getsockname()[1]
        if m.sys_interval:
            from .observability.sys_topics import SysPublisher
            self.sys = SysPublisher(self.state, m.sys_interval)
        if self.config.dashboard.enabled:
            from .dashboard import start as start_dashboard
            try:
                self.dashboard = await start_dashboard(self.state)
            except OSError as exc:
                d = self.config.dashboard
                raise ListenError(exc, "the dashboard ([dashboard] port)", d.host, d.port) from None
            self.ports["dashboard"] = self.dashboard.port
        self._ticker = self.loop.call_later(1.0, self._tick)

    @property
    def port(self) -> int:
        return self.ports["mqtt"]

    @property
    def bytes_in(self) -> int:
        return self.state.bytes_in

    @property
    def bytes_out(self) -> int:
        return self.state.bytes_out

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
            if self.transports is not None:
                self.transports.tidy()  # closed transports: at most about twice the live ones
            for tick in self.hooks.on_tick:
                tick()
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
        self.broker.shutdown(self.config.cluster.server_reference if self.config.cluster.enabled
                             else None)
        self.flush()  # the DISCONNECTs go out, then the connections close [MQTT-3.14.4-2]
        if self.auth_checks is not None:
            self.auth_checks.close()
        for stop in self.hooks.on_stop:
            stop()
        await asyncio.sleep(0.05)


class ListenError(OSError):
    """A listener could not be opened: str() names which one, its address and why."""

    def __init__(self, exc: OSError, what: str, host: str, port: int) -> None:
        super().__init__(exc.errno, f"cannot listen on {host}:{port} for {what}: "
                         f"{exc.strerror or exc}")
        self.host, self.port = host, port


async def serve(config: Config, auth: Any = None, hooks: Sequence[Any] = ()) -> None:
    server = Server(config, auth=auth, hooks=hooks)
    await server.start()
    log_codec()
    tune_gc()
    release_free_memory()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    notify_service_manager("READY=1")  # every listener is up (systemd Type=notify)
    await stop.wait()
    notify_service_manager("STOPPING=1")
    await server.stop()


LOCAL_HOSTS = ("127.0.0.1", "::1", "localhost")


def who_may_connect(spec: ListenerConfig, config: Config) -> str:
    """One line for the log at start: who can reach a listener and how it authenticates them."""
    a = config.auth
    local = spec.host in LOCAL_HOSTS or spec.host.startswith("127.")
    reach = "this machine only" if local else "reachable from other machines"
    if spec.use_identity_as_username:
        users = "clients with a certificate from " + spec.cafile + " (its CN is the user name)"
    elif a.password_file:
        users = "user names and passwords from " + a.password_file
    else:
        users = "no users (no auth.password_file)"
    if a.allow_anonymous is True:
        anon = "anonymous clients from anywhere (auth.allow_anonymous = true)"
    elif a.allow_anonymous is False or a.password_file:
        anon = "no anonymous clients"
    elif local:
        anon = "anonymous clients"
    else:
        anon = ("anonymous clients from this machine only; to let devices in, add users with "
                "`python -m broker.auth passwd FILE add USER` and set auth.password_file = FILE "
                "(or auth.allow_anonymous = true for anonymous access from anywhere)")
    return f"{reach}; {users}; {anon}"


def log_codec() -> None:
    if native.running() == "compiled":
        log.info("codec and core: compiled (mypyc)")
    else:
        log.info("codec and core: pure Python (slower; bash scripts/setup.sh compiles them when "
                 "gcc and the Python headers are installed)")
