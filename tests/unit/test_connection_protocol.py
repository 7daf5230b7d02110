"""The per-connection protocol object (transport/connection_protocol.py) with a fake transport:
held acks sent in one place after the sink's barrier and the store's commit, as successes or
failures; flow control both ways; the password check through the CheckQueue."""
import asyncio
import socket

import pytest

from broker.core.durability import Pending
from broker.core.hooks import SESSION_EVENTS, STORED_EVENTS, Hook
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from broker.server import Server
from broker.transport.connection_protocol import READ_PAUSE_GROWTH, MQTTProtocol
from broker.transport.sockets import DEFER_ACCEPT_SECONDS
from settings import AuthConfig, Config, ListenerConfig


class FakeTransport:
    def __init__(self):
        self.data = bytearray()
        self.buffered = 0          # what get_write_buffer_size() reports
        self.reading = True
        self.closing = False
        self.eof = False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1234) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        self.data += data

    def get_write_buffer_size(self):
        return self.buffered

    def pause_reading(self):
        assert self.reading
        self.reading = False

    def resume_reading(self):
        assert not self.reading
        self.reading = True

    def is_closing(self):
        return self.closing

    def can_write_eof(self):
        return True

    def write_eof(self):
        self.eof = True

    def abort(self):
        self.closing = True

    def close(self):
        self.closing = True

    def received(self, level=5):
        pkts, err = Decoder(level).feed(bytes(self.data))
        assert err is None
        self.data.clear()
        return pkts


class Sink:
    durable = True

    def hook(self):
        from sink.forward.hook import SinkHook
        return SinkHook(self)

    def __init__(self):
        self.futures = []

    def submit_message(self, *args):
        return True

    def barrier(self):
        fut = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut


class Store(Hook):
    """A durable hook like the state store: acks of a turn with changes wait for its commit."""
    provides = frozenset({"barrier", "on_turn_end"})

    def __init__(self):
        self.turn, self.changed, self.result = None, False, 0

    def barrier(self):
        if not self.changed:
            return None
        self.turn = self.turn or Pending()
        return self.turn

    def on_turn_end(self):
        turn, self.turn, self.changed = self.turn, None, False
        if turn is not None:
            turn.resolve(None if self.result >= 0 else "disk error")


def serve(sink=None, store=None, level=5, **mqtt):
    server = Server(Config(**mqtt), hooks=[h for h in (store, sink) if h is not None])
    server.loop = server.state.loop = asyncio.get_running_loop()
    proto = MQTTProtocol(server.state, ListenerConfig())
    t = FakeTransport()
    proto.connection_made(t)
    proto.data_received(encode(P.Connect("c", level), level))
    server.flush()
    assert t.received(level)[0].type == P.CONNACK
    return server, proto, t


def publish(qos, pid, level=5):
    return encode(P.Publish("t", b"m", qos, False, False, pid), level)


async def settle():
    for _ in range(3):
        await asyncio.sleep(0)


async def test_held_ack_goes_out_after_the_barrier():
    sink = Sink()
    server, proto, t = serve(sink)
    proto.data_received(publish(1, 7) + publish(1, 8))
    server.flush()
    assert t.received() == [] and len(sink.futures) == 1  # one barrier for the read
    sink.futures[0].set_result(None)
    await settle()
    server.flush()
    assert [(p.packet_id, p.reason_code) for p in t.received()] == [(7, 0x10), (8, 0x10)]


async def test_failed_barrier_sends_failure_codes_v5_and_closes_311():
    sink = Sink()
    server, proto, t = serve(sink)
    proto.data_received(publish(2, 9))
    sink.futures[0].set_exception(OSError("disk full"))
    await settle()
    server.flush()
    (rec,) = t.received()
    assert (rec.type, rec.reason_code) == (P.PUBREC, rc.UNSPECIFIED_ERROR) and not t.eof
    server, proto, t = serve(sink, level=4)
    proto.data_received(publish(1, 1, level=4))
    sink.futures[-1].set_exception(OSError("disk full"))
    await settle()
    server.flush()
    assert t.received(4) == [] and t.eof  # 3.1.x: closed, never a success


async def test_held_ack_fails_when_one_durable_hook_fails_even_if_another_succeeded():
    """The ack gate waits for the tokens of every hook providing barrier() and sends a failure
    when any failed [MQTT-4.3.2-4]: here the store's commit failed, the spool's write worked."""
    sink, store = Sink(), Store()
    server, proto, t = serve(sink, store)
    store.changed, store.result = True, -1
    proto.data_received(publish(1, 5))
    server.flush()                 # the commit fails: the held ack is now a failure...
    assert t.received() == []      # ...sent once the spool's barrier resolved too
    sink.futures[0].set_result(None)
    await settle()
    server.flush()
    (ack,) = t.received()
    assert (ack.packet_id, ack.reason_code) == (5, rc.UNSPECIFIED_ERROR)


async def test_ack_waits_for_the_stores_commit_of_its_turn_and_goes_out_in_the_same_flush():
    store = Store()
    server, proto, t = serve(None, store)
    store.changed = True
    proto.data_received(publish(1, 6))
    assert t.received() == [] and store.turn is not None
    server.flush()                 # the commit succeeds: the ack goes out with this flush
    (ack,) = t.received()
    assert (ack.packet_id, ack.reason_code) == (6, 0x10)


async def test_inbound_backpressure_pauses_reading_of_a_client_that_does_not_read():
    _, proto, t = serve()
    proto.data_received(b"\xc0\x00")
    assert t.reading                       # output not paused: reading goes on
    t.buffered = 3 << 20                   # deliveries of one turn, well past the high-water mark
    proto.pause_writing()                  # asyncio: the write buffer passed the high-water mark
    proto.data_received(b"\xc0\x00")
    assert t.reading and proto.conn.paused  # a reading client (acks) is still read
    t.buffered += READ_PAUSE_GROWTH        # answers piled up since the pause, up to the bound
    proto.data_received(b"\xc0\x00")
    assert t.reading
    t.buffered += 1
    proto.data_received(b"\xc0\x00")
    assert not t.reading                   # stops reading the client
    t.buffered = 0
    proto.resume_writing()
    assert t.reading and not proto.conn.paused


async def test_a_client_whose_reads_take_long_gives_way_to_the_others(monkeypatch):
    """Reads of one connection that took READ_TURN_BUDGET in all (a client sending back to back:
    libuv hands over up to 2 MiB of its input per wake-up) pause its reading for one loop
    iteration, so other connections' packets (a PINGREQ) are read in between; reads within the
    budget are not paused. Backpressure's pause in the meantime is kept."""
    from broker.transport import connection_protocol as cp
    server, proto, t = serve()
    clock = [0.0, 0.0]  # now, how much it moves per reading (two per read: its start and end)

    def perf_counter():
        clock[0] += clock[1]
        return clock[0]
    monkeypatch.setattr(cp, "perf_counter", perf_counter)

    def read(seconds):  # a read that takes `seconds`
        clock[1] = seconds
        proto.data_received(b"\xc0\x00")

    read(cp.READ_TURN_BUDGET / 3)
    read(cp.READ_TURN_BUDGET / 3)
    assert t.reading                       # within the budget
    read(cp.READ_TURN_BUDGET / 2)
    assert not t.reading                   # past it: other connections first
    await settle()                         # the loop goes round (polling the others)
    assert t.reading and proto.busy == 0
    read(cp.READ_TURN_BUDGET * 2)          # one long read alone
    assert not t.reading
    proto.pause_writing()                  # backpressure while it waits its turn
    t.buffered += READ_PAUSE_GROWTH + 1
    proto.pause_reading_if_flooded()
    await settle()
    assert not t.reading                   # still paused: the client does not read
    t.buffered = 0
    proto.resume_writing()
    assert t.reading

    # a large read (uvloop's are up to 256,000 bytes) is handled a slice at a time: past the
    # budget, the rest of it waits for the next iteration too; every packet once, in order
    clock[1] = cp.READ_TURN_BUDGET * 3 / 4
    n = 100_000
    t.data.clear()
    proto.data_received(b"\xc0\x00" * n)  # 200,000 bytes of PINGREQ
    server.flush()
    first = len(t.data) // 2
    assert 0 < first < n and not t.reading
    for _ in range(20):
        await asyncio.sleep(0)
        server.flush()
    assert t.data == b"\xd0\x00" * n and t.reading and proto.held is None


async def test_graceful_close_reads_again_to_discard_input():
    server, proto, t = serve()
    proto.pause_writing()
    t.buffered = READ_PAUSE_GROWTH + 1
    proto.data_received(b"\xc0\x00")
    assert not t.reading
    proto.conn.server_disconnect(rc.ADMINISTRATIVE_ACTION, "bye")
    server.flush()
    assert t.eof and t.reading             # half-closed, the client's input is drained
    proto.connection_lost(None)


async def test_a_server_disconnect_to_a_client_whose_socket_is_gone_closes_it_quietly():
    """[MQTT-3.14.4-2] the server closes the connection after its DISCONNECT: when the client's
    side is already gone, the half-close fails (ENOTCONN) and the connection is aborted; the
    error does not escape the flush (it stopped a broker's shutdown midway, the other
    connections not closed)."""
    server, proto, t = serve()

    def gone():
        raise OSError(107, "Transport endpoint is not connected")
    t.write_eof = gone
    proto.conn.server_disconnect(rc.SERVER_SHUTTING_DOWN, "stopping")
    server.flush()
    assert t.received()[0].type == P.DISCONNECT
    assert t.closing and proto.linger_timer is None
    proto.connection_lost(None)


async def test_client_disconnect_closes_at_once_server_disconnect_lingers():
    """After the client's DISCONNECT nothing more comes [MQTT-3.14.4-1]: the socket is closed
    at once, no half-close and linger timer; a broker-ended connection still lingers."""
    for level in (5, 4):
        server, proto, t = serve(level=level)
        proto.data_received(encode(P.Disconnect(), level))
        # nothing to write: closed in the read itself, no flush needed
        assert t.closing and proto.conn not in server.broker.dirty
        server.flush()
        assert t.closing and not t.eof and proto.linger_timer is None and not t.data
        proto.connection_lost(None)
        # output from the same read (the PUBACK of a PUBLISH before the DISCONNECT) goes first
        server, proto, t = serve(level=level)
        proto.data_received(publish(1, 9, level) + encode(P.Disconnect(), level))
        assert not t.closing and proto.conn in server.broker.dirty
        server.flush()
        assert [(p.type, p.packet_id) for p in t.received(level)] == [(P.PUBACK, 9)]
        assert t.closing and not t.eof and proto.linger_timer is None
        proto.connection_lost(None)
    server, proto, t = serve()
    proto.data_received(encode(P.Disconnect(rc.SUCCESS, {0x11: 10}), 5))  # expiry after 0: error
    server.flush()
    assert t.received()[0].reason_code == rc.PROTOCOL_ERROR
    assert t.eof and not t.closing and proto.linger_timer is not None
    proto.connection_lost(None)


async def test_password_check_runs_on_the_check_queue_and_busy_refuses():
    from broker.auth.checks import CheckQueue
    from broker.core.hooks import AllowAll

    class Auth(AllowAll):
        passwords = object()

        def authenticate(self, client_id, username, password):
            return 0 if password == b"good" else rc.BAD_USER_NAME_OR_PASSWORD

    server = Server(Config(auth=AuthConfig(max_pending_checks=1)), auth=Auth())
    server.loop = server.state.loop = asyncio.get_running_loop()
    assert isinstance(server.auth_checks, CheckQueue)
    conns = []
    for pw in (b"good", b"bad"):
        proto = MQTTProtocol(server.state, ListenerConfig())
        t = FakeTransport()
        proto.connection_made(t)
        proto.data_received(encode(P.Connect(f"c{pw.decode()}", 5, username="u", password=pw))
                            + b"\xc0\x00")
        conns.append((proto, t))
    server.flush()
    (busy,) = conns[1][1].received()      # one check pending at most: the second is refused
    assert (busy.type, busy.reason_code) == (P.CONNACK, rc.SERVER_BUSY)
    for _ in range(200):
        await asyncio.sleep(0.01)
        server.flush()
        if conns[0][1].data:
            break
    ack, pong = conns[0][1].received()
    assert (ack.type, ack.reason_code, pong.type) == (P.CONNACK, 0, P.PINGRESP)
    server.auth_checks.close()


async def test_listeners_accept_a_connection_once_its_first_bytes_arrived():
    """TCP_DEFER_ACCEPT on every TCP listener (plain and WebSocket): the kernel hands the broker
    a connection with its CONNECT (or HTTP upgrade) already there, one wake-up less each."""
    if not hasattr(socket, "TCP_DEFER_ACCEPT"):
        pytest.skip("this platform has no TCP_DEFER_ACCEPT (Linux only)")
    server = Server(Config(host="127.0.0.1", port=0,
                           listeners=[ListenerConfig(type="ws", host="127.0.0.1", port=0)]))
    await server.start()
    try:
        socks = [s for srv in server.servers for s in srv.sockets]
        assert len(socks) == 2
        for s in socks:
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) >= DEFER_ACCEPT_SECONDS
    finally:
        await server.stop()


async def test_bytes_of_a_pingreq_or_disconnect_inside_a_packet_are_not_one():
    """The two-byte reads answered at once (PINGREQ, DISCONNECT) are so only between packets: the
    same bytes ending a PUBLISH that began in an earlier read are its payload."""
    for level in (5, 4):
        for tail, answer in ((b"\xc0\x00", P.PINGRESP), (b"\xe0\x00", None)):
            server, proto, t = serve(level=level)
            head = encode(P.Publish("t", tail, 1, False, False, 3), level)[:-2]
            proto.data_received(head)
            proto.data_received(tail)  # the rest of the PUBLISH: its payload
            server.flush()
            assert [(p.type, p.packet_id) for p in t.received(level)] == [(P.PUBACK, 3)]
            assert not t.closing
            proto.data_received(tail)  # now a packet of its own
            server.flush()
            got = t.received(level)
            assert [p.type for p in got] == ([answer] if answer else []) and t.closing == (answer is None)
            proto.connection_lost(None)


def _alive(*types) -> int:
    import gc
    return sum(1 for o in gc.get_objects() if type(o) in types)


async def test_a_closed_connection_is_freed_without_the_garbage_collector():
    """What process.tune_gc() relies on: whichever way a connection ends, its protocol, Connection
    and Session are freed by reference counting (no cycle left for the collector), with and
    without a will, subscriptions, in-flight messages and a session kept after it."""
    import gc

    from broker.core.connection import Connection
    from broker.core.session import Session

    def cycle(level, ending):
        server, proto, t = serve(level=level)
        b = server.broker
        b.schedule_flush = lambda: None
        proto.data_received(encode(P.Subscribe(1, [("a/#", P.SubscriptionOptions(qos=1))]), level))
        proto.data_received(publish(1, 2, level) + publish(2, 3, level))
        server.flush()
        if ending == "disconnect":
            proto.data_received(encode(P.Disconnect(), level))
        elif ending == "violation":  # v5 AUTH without a method, 3.1.1 a reserved packet type
            proto.data_received(b"\xf0\x00")
        elif ending == "split violation":  # through the stream Decoder
            proto.data_received(b"\xf0")
            proto.data_received(b"\x00")
        server.flush()
        proto.connection_lost(None)
        for s in list(b.sessions.values()):  # a kept session ends later (expiry): end it now
            b.end_session(s)

    was = gc.isenabled()
    gc.disable()
    try:
        before = _alive(MQTTProtocol, Connection, Session)
        for level in (4, 5):
            for ending in ("disconnect", "violation", "split violation", "lost"):
                cycle(level, ending)
        assert _alive(MQTTProtocol, Connection, Session) == before
    finally:
        if was:
            gc.enable()


def test_tune_gc_freezes_the_start_up_state_and_raises_the_young_threshold():
    import gc

    from broker.process import GC_YOUNG_THRESHOLD, tune_gc
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, threshold[1], threshold[2])
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class SessionStore(Hook):
    """Holds persistent sessions' state; each barrier() is a token the test resolves."""
    provides = frozenset({"barrier", *SESSION_EVENTS, *STORED_EVENTS})

    def __init__(self):
        self.tokens = []

    def barrier(self):
        self.tokens.append(Pending())
        return self.tokens[-1]

    def on_message_stored(self, client_id, msg, qos, retain, sub_ids, pid=None):
        return object()


def connected(server, cid, props=None):
    proto = MQTTProtocol(server.state, ListenerConfig())
    t = FakeTransport()
    proto.connection_made(t)
    proto.data_received(encode(P.Connect(cid, 5, properties=props), 5))
    server.flush()
    assert t.received()[0].type == P.CONNACK
    return proto, t


async def test_a_persistent_sessions_new_qos2_publish_leaves_once_its_packet_id_is_durable():
    """[MQTT-4.4.0-1]: a QoS 2 PUBLISH to a persistent session is written to the client once
    the hooks providing barrier() hold its packet id (a broker that takes the session over
    then resends it with that id, never as a new message); output after it keeps its order."""
    store = SessionStore()
    server = Server(Config(), hooks=[store])
    server.loop = server.state.loop = asyncio.get_running_loop()
    sub, st = connected(server, "sub", {PR.SESSION_EXPIRY_INTERVAL: 300})
    sub.data_received(encode(P.Subscribe(1, [("t", P.SubscriptionOptions(2))]), 5))
    for tok in store.tokens:
        tok.resolve()
    await settle()
    server.flush()
    assert [p.type for p in st.received()] == [P.SUBACK]
    pub, pt = connected(server, "pub")
    pub.data_received(publish(2, 1))
    server.flush()
    assert st.received() == []
    sub.data_received(b"\xc0\x00")  # PINGREQ: its answer waits behind the PUBLISH
    server.flush()
    assert st.received() == []
    store.tokens[-1].resolve()      # the barrier of the flush that held the PUBLISH
    await settle()
    assert [p.type for p in st.received()] == [P.PUBLISH, P.PINGRESP]
    sub.data_received(b"\xc0\x00")
    server.flush()
    assert [p.type for p in st.received()] == [P.PINGRESP]
