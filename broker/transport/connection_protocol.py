"""One protocol object per client connection (uvicorn style), for TCP, TLS and WebSocket.

MQTTProtocol owns what the sans-I/O Connection (core/connection.py) must not: the transport,
flow control both ways (pause_writing/resume_writing towards the Connection, pause_reading of
a client that sends without reading), the linger timer of a graceful close, and the
events the Connection returns: AuthRequested (the password check on the CheckQueue's threads)
and AcksHeld (acks waiting for durability). AckGate is the one place where
acknowledgements that wait for durability are decided and sent, as successes or failures.

WebSocket (transport/websocket.py) wraps its framing around the same MQTTProtocol through a
transport adapter, so both share every check.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, Sequence

from settings import ListenerConfig

from ..core.connection import CLIENT_DONE, Connection, loopback_host
from ..core.durability import when_all
from ..core.events import AcksHeld, AdmitRequested, AuthRequested
from ..protocol import reason_codes as rc
from . import tls

if TYPE_CHECKING:
    from ..core.hooks import Hooks
    from .state import ServerState

log = logging.getLogger(__name__)

LARGE_READ = 16384         # a read this big is flushed at once instead of at the end of the turn
WRITE_HIGH_WATER = 1 << 20  # bytes buffered for a client before QoS 0 is dropped / QoS 1-2 queued
# Inbound backpressure: while output is paused (deliveries are queued or dropped), what still
# grows the buffer is the answers to the client's own packets (acks, PINGRESP, SUBACK); once they
# add this many bytes its input is not read until the buffer drains (resume_writing), so a client
# that sends without reading cannot make the broker buffer answers without bound.
READ_PAUSE_GROWTH = WRITE_HIGH_WATER
# Fairness between connections: uvloop reads up to 256,000 bytes at a time, up to 32 times from
# one socket per wake-up, and the core handled each read whole, so a client sending back to back
# held the loop for all of it before anyone else's PINGREQ was read (1,000 PUBLISHes each walking
# many wildcard branches: tens of seconds). Once
# one connection's reads have taken this long (seconds, since its last pause), reading it waits
# one loop iteration: the others are served in between; a large read is handled a slice at a
# time, the rest of it waiting likewise. A stall is then this budget plus what one slice costs,
# which the limits bound (bench/stall.py wildcard_branches: a 16 KiB slice of PUBLISHes that walk
# the most wildcard levels one client may subscribe, mqtt.max_wildcard_levels, is about 15 ms).
READ_TURN_BUDGET = 0.02
READ_COUNTED = 0.0005  # reads shorter than this are not counted (32 of them: 16 ms)
READ_SLICE = 16384     # a larger read is handled this much at a time, the budget checked between
TAKING = bytes(1)      # MQTTProtocol.held while take_turn() handles what was held (compared by identity)


class AckGate:
    """PUBACK/PUBREC that wait for durability, decided in one place (one per server).

    The acks of one read wait for the tokens (core/durability.py) of every hook providing
    barrier(), asked once for all of them: the state store's commit of this turn, the sink's
    spool fsync, the cluster's Kafka acknowledgement. They leave as successes once all resolved,
    or as failures (v5 0x80, 3.1.x close) when any failed; with no token they leave at once."""

    __slots__ = ("hooks", "end_turn")

    def __init__(self, hooks: Hooks, end_turn: Callable[[], None]) -> None:
        self.hooks = hooks  # the broker's Hooks registry: its barrier tuple is read at each hold
        # schedules the end of this event-loop turn (the server's flush, which runs on_turn_end:
        # a token such as the store's is resolved by it even if nothing else is written)
        self.end_turn = end_turn

    def hold(self, conn: Connection, held: AcksHeld) -> None:
        """The acks of one read (an AcksHeld event)."""
        acks, subacks = held.acks, held.subacks
        tokens = [t for barrier in self.hooks.barrier if (t := barrier()) is not None]
        if not tokens:
            conn.acks_done(acks, None, subacks)
            return
        self.end_turn()
        if len(tokens) == 1:
            tokens[0].add_done_callback(lambda t: conn.acks_done(acks, t.failure, subacks))
        else:
            when_all(tokens, lambda failure: conn.acks_done(acks, failure, subacks))


class MQTTProtocol(asyncio.Protocol):
    __slots__ = ("server", "conn", "listener", "transport", "discard", "linger_timer",
                 "reading_paused", "read_limit", "busy", "held")

    def __init__(self, server: ServerState, listener: ListenerConfig) -> None:
        self.server = server
        self.listener = listener
        # both set by connection_made(), which the loop calls first; the transport is None
        # again after connection_lost() (the methods that may run then check)
        self.conn: Connection = None  # type: ignore[assignment]
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.discard = -1          # >= 0 while closing: input bytes still allowed (and dropped)
        self.linger_timer: asyncio.TimerHandle | None = None
        self.reading_paused = False
        self.read_limit = 0        # while output is paused: buffered bytes past which reading stops
        # seconds its reads took since reading last gave way to the others (READ_TURN_BUDGET);
        # while it waits for the next loop iteration (reading paused): `held`, what is left of
        # its last read (b"": nothing), else None
        self.busy = 0.0
        self.held: bytes | None = None

    # ------------------------------------------------------------ transport events
    def connection_made(self, transport: Any) -> None:  # an asyncio.Transport, or a WSTransport
        # TCP_NODELAY: uvloop and asyncio set it on every TCP transport they make (also under
        # TLS and WebSocket); asking for the socket here would cost an object per connection
        server = self.server
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.transport = transport
        conn = self.conn = Connection(server.broker, None)  # conn.peer: peer_name(), when logged
        conn.owner = self
        max_conn = server.config.mqtt.max_connections
        if max_conn and len(server.broker.connections) > max_conn:
            conn.note(logging.WARNING, "refusing %s: max_connections (%d) reached", conn.peer,
                      max_conn)
            conn.finish(publish_will=False)
            self.close_gracefully()
            return
        if self.listener.use_identity_as_username:
            conn.identity = tls.listener_identity(self.listener, transport.get_extra_info("ssl_object"))

    def peer_name(self) -> str:
        """The client's address ("host:port"), for log lines."""
        t = self.transport
        peer = t.get_extra_info("peername") if t is not None else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def peer_is_loopback(self) -> bool:
        """Whether the client connects from this machine (anonymous clients, core/connection.py)."""
        t = self.transport
        peer = t.get_extra_info("peername") if t is not None else None
        return bool(peer) and loopback_host(peer[0])

    def data_received(self, data: bytes) -> None:
        self.server.bytes_in += len(data)
        if self.discard >= 0:  # closing: input never reaches the core
            self.discard -= len(data)
            if self.discard < 0:
                self.transport.abort()
            return
        if len(data) > READ_SLICE:
            return self.feed_slices(data)
        start = perf_counter()
        self.feed(data)
        spent = perf_counter() - start
        if spent >= READ_COUNTED:  # (an idle connection's cheap reads store no float)
            busy = self.busy + spent
            if busy <= READ_TURN_BUDGET:
                self.busy = busy
            else:
                self.give_way(b"")

    def feed(self, data: bytes) -> None:
        conn = self.conn
        events = conn.data_received(data)
        if events:
            self.handle_events(events)
        if conn.close_requested == CLIENT_DONE and not conn.is_dirty:
            self.transport.close()  # the client's DISCONNECT and nothing to write: close now
            return
        if conn.paused and not self.reading_paused:
            self.pause_reading_if_flooded()
        if len(data) >= LARGE_READ:
            # The loop may hand us many large reads from one socket in a row (libuv reads
            # up to 32 x 64 KiB per wake-up): write out now so output never piles up for a
            # whole turn, which bounds memory and latency under fan-out.
            self.server.flush()

    def feed_slices(self, data: bytes) -> None:
        """A large read (uvloop's are up to 256,000 bytes), READ_SLICE at a time: once this
        connection's reads have taken READ_TURN_BUDGET, the rest of it waits for the next loop
        iteration (give_way())."""
        start = perf_counter()
        n = len(data)
        i = 0
        while i < n:
            self.feed(data[i:i + READ_SLICE])
            i += READ_SLICE
            if self.transport is None or self.conn.close_requested or self.discard >= 0:
                return  # (what follows a close is dropped, as the core drops it within a read)
            busy = self.busy + (perf_counter() - start)
            if busy > READ_TURN_BUDGET:
                return self.give_way(data[i:])
        self.busy += perf_counter() - start

    def give_way(self, rest: bytes) -> None:
        """This connection's reads took READ_TURN_BUDGET: `rest` of the last one and reading
        wait for the next loop iteration, so that every other connection is served first."""
        self.busy = 0.0
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.held is None and not self.reading_paused:
            t.pause_reading()
        self.held = rest
        self.server.loop.call_soon(self.next_turn)

    def next_turn(self) -> None:
        # uvloop runs call_soon callbacks before it polls (asyncio after): one more round makes
        # sure the loop polls the other connections before take_turn()
        self.server.loop.call_soon(self.take_turn)

    def take_turn(self) -> None:
        """The loop went round once since give_way(): what was held is handled (it may give way
        again), then reading goes on (unless paused since for backpressure: resume_writing())."""
        rest = self.held
        if rest is None or rest is TAKING:
            return
        self.held = TAKING  # (reading still paused while the rest is handled)
        if rest and self.transport is not None:
            self.feed_slices(rest)
        if self.held is not TAKING:  # gave way again: the next iteration goes on
            return
        self.held = None
        t = self.transport
        if t is not None and not t.is_closing() and not self.reading_paused:
            t.resume_reading()

    def eof_received(self) -> bool:
        return False  # the transport closes (after writing what it holds)

    def pause_writing(self) -> None:
        self.read_limit = self.transport.get_write_buffer_size() + READ_PAUSE_GROWTH
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            t = self.transport
            if t is not None and not t.is_closing() and self.held is None:  # (else take_turn() will)
                t.resume_reading()
        self.conn.resume_writing()

    def pause_reading_if_flooded(self) -> None:
        """Output is paused and the client still sends: stop reading it once the answers
        buffered for it since the pause pass READ_PAUSE_GROWTH; resume_writing() reads again."""
        t = self.transport
        if t is not None and not t.is_closing() and t.get_write_buffer_size() > self.read_limit:
            self.reading_paused = True
            if self.held is None:  # (else paused already, waiting for take_turn())
                t.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        conn = self.conn
        if conn is not None:
            if not conn.close_requested:  # (else the core ended the connection already)
                conn.connection_lost()
            conn.owner = None  # no reference cycle: both are freed now, not by a GC pass
        self.transport = None  # type: ignore[assignment]

    # ------------------------------------------------------------ the Connection's events
    def handle_events(self, events: Sequence[Any]) -> None:
        for ev in events:
            t = type(ev)
            if t is AcksHeld:
                self.server.acks.hold(self.conn, ev)
            elif t is AuthRequested:
                self.check_password(ev)
            elif t is AdmitRequested:
                ev.token.add_done_callback(lambda tok, ev=ev: self.admit_done(ev, tok.failure))

    def check_password(self, ev: AuthRequested) -> None:
        """Run the password check on the CheckQueue's threads (bounded); a full queue refuses
        the CONNECT with 0x89 Server busy (3.1.x: return code 3)."""
        server = self.server
        auth = server.broker.auth
        c, client_id = ev.connect, ev.client_id

        def check() -> int:  # in a worker thread
            # (the core's events type `connect` as object: it is a packets.Connect)
            return auth.authenticate(client_id, c.username, c.password)  # type: ignore[attr-defined]

        def done(code: int | None) -> None:
            self.auth_done(ev, 0x80 if code is None else code)

        t = self.transport
        peer = t.get_extra_info("peername") if t is not None else None
        # (auth_checks is set whenever the core defers password checks: Server.__init__)
        if not server.auth_checks.submit(
                peer[0] if peer else self.conn.peer, check, self.conn.awaiting_auth, done):
            self.auth_done(ev, rc.SERVER_BUSY, "too many password checks waiting; try again later")

    def admit_done(self, ev: AdmitRequested, failure: str | None) -> None:
        events = self.conn.admit_done(ev.connect, ev.client_id, ev.assigned, failure)  # type: ignore[arg-type]
        if events:
            self.handle_events(events)

    def auth_done(self, ev: AuthRequested, code: int, why: str | None = None) -> None:
        events = self.conn.auth_done(ev.connect, ev.client_id, ev.assigned, code, why)  # type: ignore[arg-type]
        if events:
            self.handle_events(events)

    # ------------------------------------------------------------ output
    def write_output(self) -> int:
        """Write what the Connection accumulated this turn, in one call; the byte count."""
        conn = self.conn
        out = conn.take_output()
        t = self.transport
        if t is None:
            return 0
        n = 0
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            n = len(data)
            wait = conn in conn.broker.durable_out
            if wait or self in self.server.held_out:
                self.hold_output(data, wait)  # (counted when written)
                n = 0
            else:
                t.write(data)
        if conn.close_requested:  # [MQTT-3.14.4-2] closed after the last output (a DISCONNECT)
            held = self.server.held_out.get(self)
            if held is not None:  # written first, without waiting any longer
                for entry in held:
                    entry[1] = True
                self.write_held()
            if conn.close_requested == CLIENT_DONE:
                t.close()  # the client's DISCONNECT: nothing more comes, no linger
            else:
                self.close_gracefully()
        return n

    def hold_output(self, data: bytes | bytearray, wait: bool) -> None:
        """Output that leaves once the hooks providing barrier() say what it depends on is
        durable (`wait`: a persistent session's new QoS 2 PUBLISH, whose packet id a broker
        that takes the session over must know [MQTT-4.4.0-1]), or, not `wait`, once the output
        held before it has left. A failed barrier lets it go too: the session here is right,
        only a takeover before the store catches up could send the PUBLISH again."""
        entry: list = [data, not wait]
        held = self.server.held_out.get(self)
        if held is None:
            held = self.server.held_out[self] = deque()
        held.append(entry)
        if wait:
            tokens = [tok for barrier in self.server.acks.hooks.barrier
                      if (tok := barrier()) is not None]
            if tokens:
                def ready(_: Any, entry: list = entry) -> None:
                    entry[1] = True
                    self.write_held()
                when_all(tokens, ready)
                return
            entry[1] = True
        self.write_held()

    def write_held(self) -> None:
        """Write the held output that may leave, in order."""
        held, t = self.server.held_out.get(self), self.transport
        if held is None:
            return
        while held and held[0][1]:
            data = held.popleft()[0]
            if t is not None and not t.is_closing():
                t.write(data)
                self.server.bytes_out += len(data)
        if not held:
            del self.server.held_out[self]

    def close_gracefully(self) -> None:
        """Close after the last output (a server DISCONNECT) without resetting the connection
        under a client that is still sending: a socket closed with unread input sends a TCP RST,
        and the client's next send or read fails before it has read the DISCONNECT. So send
        FIN after the output (half-close), then read and drop the client's input until it
        closes too, for at most close_linger_seconds / close_linger_bytes, then close."""
        t = self.transport
        if self.discard >= 0 or t.is_closing():
            return
        if self.reading_paused:  # the client's input is read (and dropped) while lingering
            self.reading_paused = False
            t.resume_reading()
        if not t.can_write_eof():  # TLS (close_notify) and WebSocket (Close frame) close themselves
            t.close()
            return
        cfg = self.server.config.mqtt
        try:
            t.write_eof()
        except OSError:  # the client's side is gone already (ENOTCONN): nothing to linger for
            t.abort()
            return
        self.discard = cfg.close_linger_bytes
        self.linger_timer = self.server.loop.call_later(cfg.close_linger_seconds, t.abort)
