"""The Connection as a sans-I/O state machine: bytes in, bytes + events out, a fake clock.

AuthRequested (the caller checks the password, then auth_done), AcksHeld (the acks wait
for durability, then acks_done with success or a failure), the bound on what waits for a
CONNACK, and AckGate's store-commit decisions (transport/connection_protocol.py) without a loop.
"""
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.core.durability import Pending, when_all
from broker.core.events import NO_EVENTS, AcksHeld, AuthRequested, ack_fields, held_ack
from broker.core.hooks import AllowAll
from broker.core.message import Message
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from settings import MQTTConfig
from tests.unit.test_core import Clock

CONNECT_V5 = encode(P.Connect("c", 5, keep_alive=10), 5)
PUBACK_7 = b"\x40\x02\x00\x07"   # v5 success without properties, and 3.1.1
PUBACK_7_NO_MATCH = b"\x40\x04\x00\x07\x10\x00"  # v5: 0x10 No matching subscribers
# the same acks held for durability: (type, packet id, reason code), encoded once when sent
HELD_PUBACK_7 = held_ack(P.PUBACK, 7, rc.SUCCESS)
HELD_PUBACK_7_NO_MATCH = held_ack(P.PUBACK, 7, rc.NO_MATCHING_SUBSCRIBERS)


class Sink:
    """A durable sink: every message is taken; acks wait for its barrier."""
    durable = True

    def hook(self):
        from sink.forward.hook import SinkHook
        return SinkHook(self)

    def __init__(self):
        self.records = []

    def submit(self, rec):
        self.records.append(rec)
        return True

    def submit_message(self, topic, *rest):
        self.records.append(topic)
        return True


class Cached(AllowAll):
    """Remembers alice's password (no hash needed); bob's needs a check."""

    def authenticate_cached(self, client_id, username, password):
        return 0 if username == "alice" else None


def broker(sink=None, defer=False, **cfg):
    clock = Clock()
    b = Broker(MQTTConfig(**cfg), sink=sink, auth=Cached(), clock=clock, wall=clock)
    b.defer_auth = defer
    return b, clock


def output(conn, level=5) -> bytes:
    return b"".join(bytes(x) for x in conn.take_output())


def decode(data: bytes, level=5) -> list:
    pkts, err = Decoder(level).feed(data)
    assert err is None
    return pkts


def connected(b, level=5) -> Connection:
    conn = Connection(b)
    assert conn.data_received(encode(P.Connect("c", level), level)) is NO_EVENTS
    (ack,) = decode(output(conn, level), level)
    assert ack.type == P.CONNACK and ack.reason_code == 0
    return conn


def publish(qos, pid=7, topic="t", level=5) -> bytes:
    return encode(P.Publish(topic, b"m", qos, False, False, pid if qos else None), level)


# ------------------------------------------------------------ fast paths: no event objects
def test_no_events_without_durability_waits():
    b, _ = broker()
    conn = connected(b)
    assert conn.data_received(publish(0)) is NO_EVENTS
    assert conn.data_received(publish(1)) is NO_EVENTS
    assert output(conn) == PUBACK_7_NO_MATCH  # sent at once
    sinked, _ = broker(Sink())
    conn = connected(sinked)
    assert conn.data_received(publish(0)) is NO_EVENTS and output(conn) == b""


# ------------------------------------------------------------ AuthRequested
def test_auth_requested_holds_what_follows_until_auth_done():
    b, clock = broker(defer=True)
    conn = Connection(b)
    connect = encode(P.Connect("c", 5, username="bob", password=b"pw"), 5)
    events = conn.data_received(connect + publish(1) + b"\xc0\x00")
    assert [type(e) for e in events] == [AuthRequested]
    (ev,) = events
    assert (ev.client_id, ev.assigned, ev.connect.username) == ("c", None, "bob")
    assert output(conn) == b"" and conn.awaiting_auth()   # [MQTT-3.1.4-5]: nothing processed
    assert conn.data_received(b"\xc0\x00") is NO_EVENTS and output(conn) == b""
    clock.t += 5
    assert conn.auth_done(*ev, 0) is NO_EVENTS
    pkts = decode(output(conn))
    assert [p.type for p in pkts] == [P.CONNACK, P.PUBACK, P.PINGRESP, P.PINGRESP]
    assert not conn.awaiting_auth() and conn.deferred is None


def test_auth_requested_refused_and_late_answers_ignored():
    b, _ = broker(defer=True)
    conn = Connection(b)
    (ev,) = conn.data_received(encode(P.Connect("c", 5, username="bob", password=b"x"), 5)
                               + publish(1))
    assert conn.auth_done(*ev, rc.BAD_USER_NAME_OR_PASSWORD) is NO_EVENTS
    (ack,) = decode(output(conn))
    assert (ack.type, ack.reason_code) == (P.CONNACK, 0x86) and conn.close_requested
    assert conn.auth_done(*ev, 0) is NO_EVENTS and output(conn) == b""  # already closed
    assert "c" not in b.sessions


def test_server_busy_reason_comes_from_the_caller():
    b, _ = broker(defer=True)
    conn = Connection(b)
    (ev,) = conn.data_received(encode(P.Connect("c", 5, username="bob", password=b"x"), 5))
    conn.auth_done(*ev, rc.SERVER_BUSY, "too many password checks waiting")
    (ack,) = decode(output(conn))
    assert ack.reason_code == 0x89 and ack.properties[0x1F] == "too many password checks waiting"


def test_cached_password_needs_no_event():
    b, _ = broker(defer=True)
    conn = Connection(b)
    assert conn.data_received(encode(P.Connect("c", 5, username="alice", password=b"pw"), 5)
                              + publish(1)) is NO_EVENTS
    assert [p.type for p in decode(output(conn))] == [P.CONNACK, P.PUBACK]


def test_deferred_publish_with_durable_sink_returns_message_accepted_from_auth_done():
    b, _ = broker(Sink(), defer=True)
    conn = Connection(b)
    (ev,) = conn.data_received(encode(P.Connect("c", 5, username="bob", password=b"x"), 5)
                               + publish(1))
    (acc,) = conn.auth_done(*ev, 0)
    assert type(acc) is AcksHeld and acc.acks == [HELD_PUBACK_7_NO_MATCH]
    assert [p.type for p in decode(output(conn))] == [P.CONNACK]


def padded_publish(size: int) -> bytes | None:
    """A QoS 0 PUBLISH of exactly `size` bytes, or None when none is that small."""
    for n in range(size, -1, -1):
        data = encode(P.Publish("t", b"x" * n), 5)
        if len(data) == size:
            return data
        if len(data) < size:
            return None
    return None


@settings(max_examples=80, deadline=None)
@given(cap=st.integers(60, 100_000), extra=st.integers(-2, 2))  # < max_connect_packet_size
def test_deferral_bound_is_exact(cap, extra):
    """Bytes from the read carrying the CONNECT on: up to max_deferred_bytes wait, one more
    byte gets CONNACK 0x97 Quota exceeded and the close [MQTT-3.2.2-7]."""
    b, _ = broker(defer=True)
    b.max_deferred_bytes = cap
    connect = encode(P.Connect("c", 5, username="bob", password=b"x"), 5)
    pad = padded_publish(cap + extra - len(connect))
    assume(pad is not None)
    conn = Connection(b)
    (ev,) = conn.data_received(connect)
    conn.data_received(pad)
    if extra > 0:
        assert [(p.type, p.reason_code) for p in decode(output(conn))] == [(P.CONNACK, 0x97)]
        assert conn.close_requested and conn.deferred is None
        assert conn.auth_done(*ev, 0) is NO_EVENTS and output(conn) == b""
    else:
        assert output(conn) == b"" and len(conn.deferred) == 1
        conn.auth_done(*ev, 0)
        assert [p.type for p in decode(output(conn))] == [P.CONNACK]
        assert not conn.close_requested and conn.deferred is None


# ------------------------------------------------------------ AcksHeld
def test_acks_held_then_success():
    """One event for every ack of a read (not one per message)."""
    b, _ = broker(Sink())
    conn = connected(b)
    (held,) = conn.data_received(publish(1, 7) + publish(2, 8))
    assert type(held) is AcksHeld and held.subacks == 0
    assert [ack_fields(a) for a in held.acks] == [(P.PUBACK, 7, rc.NO_MATCHING_SUBSCRIBERS),
                                                  (P.PUBREC, 8, rc.NO_MATCHING_SUBSCRIBERS)]
    assert output(conn) == b"" and conn.pending_acks == 2  # nothing before durability
    conn.acks_done(held.acks)
    assert output(conn) == PUBACK_7_NO_MATCH + b"\x50\x04\x00\x08\x10\x00"
    assert conn.pending_acks == 0


def test_acks_held_then_failure_v5_frees_the_qos2_packet_id():
    b, _ = broker(Sink())
    conn = connected(b)
    (e1,) = conn.data_received(publish(1, 7))
    (e2,) = conn.data_received(publish(2, 9))
    conn.acks_done(e1.acks + e2.acks, "disk full")
    a1, a2 = decode(output(conn))
    assert (a1.type, a1.packet_id, a1.reason_code) == (P.PUBACK, 7, rc.UNSPECIFIED_ERROR)
    assert (a2.type, a2.packet_id, a2.reason_code) == (P.PUBREC, 9, rc.UNSPECIFIED_ERROR)
    assert a1.properties[0x1F] == "disk full" and not conn.close_requested
    # 4.3.3: after a PUBREC >= 0x80 the same packet id is a new message, not a duplicate
    (e3,) = conn.data_received(publish(2, 9))
    assert type(e3) is AcksHeld and conn.pending_acks == 1


def test_acks_held_failure_closes_a_311_connection():
    b, _ = broker(Sink())
    conn = connected(b, 4)
    (ev,) = conn.data_received(publish(1, 7, level=4))
    assert ev.acks == [HELD_PUBACK_7]
    conn.acks_done(ev.acks, "disk full")
    assert output(conn, 4) == b"" and conn.close_requested  # 3.1.x has no failure ack
    assert conn not in b.connections


def test_acks_after_close_are_dropped():
    b, _ = broker(Sink())
    conn = connected(b)
    (ev,) = conn.data_received(publish(1))
    conn.connection_lost()
    conn.acks_done(ev.acks)
    assert output(conn) == b"" and conn.pending_acks == 0


def test_pending_acks_count_against_receive_maximum():
    b, _ = broker(Sink(), receive_maximum=2)
    conn = connected(b)
    (held,) = conn.data_received(publish(1, 1) + publish(1, 2))
    assert len(held.acks) == 2 and conn.pending_acks == 2
    assert conn.data_received(publish(1, 3)) is NO_EVENTS  # [MQTT-3.3.4-9]
    (d,) = decode(output(conn))
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.RECEIVE_MAXIMUM_EXCEEDED)


# ------------------------------------------------------------ durability tokens (core/durability.py)
def test_a_pending_token_resolves_once_and_a_late_callback_runs_at_once():
    seen = []
    t = Pending()
    t.add_done_callback(lambda x: seen.append(("early", x.failure)))
    t.resolve("disk full")
    t.resolve(None)                       # decided for good: a later outcome changes nothing
    t.add_done_callback(lambda x: seen.append(("late", x.failure)))
    assert seen == [("early", "disk full"), ("late", "disk full")]


def test_when_all_waits_for_every_token_and_reports_the_first_failure():
    a, b, c = Pending(), Pending(), Pending()
    out = []
    when_all([a, b, c], out.append)
    b.resolve("spool write failed")
    a.resolve()
    assert out == []                      # c still pending: nothing decided
    c.resolve("commit failed")
    assert out == ["spool write failed"]  # the first failure in the order given


def test_the_stores_barrier_is_its_turn_commit(tmp_path):
    """A PUBACK/PUBREC of a message that changed stored state waits for the commit of its
    turn; a failed commit makes it a failure, and the changes stay pending for a retry."""
    from broker.store.sqlite import Store
    b, _ = broker()
    store = Store(str(tmp_path / "state.db"))
    b.add_hook(store)
    assert store.barrier() is None        # nothing changed: acks need not wait
    store.retain_set("t", Message("t", b"v", 1, True, None, None, "c", 0.0))
    ok = store.barrier()
    assert ok is not None and not ok.done
    assert store.barrier() is None        # a read that changed nothing since: no wait
    store.retain_set("t2", Message("t2", b"v", 1, True, None, None, "c", 0.0))
    assert store.barrier() is ok          # one token per turn
    store.on_turn_end()
    assert ok.done and ok.failure is None and not store.ops
    store.retain_set("u", Message("u", b"v", 1, True, None, None, "c", 0.0))
    failing = store.barrier()
    store.db.execute("PRAGMA query_only=ON")  # every write now fails (as on a full disk)
    store.on_turn_end()
    assert failing.done and failing.failure and store.failing == 1 and store.ops
    # the failed changes are kept for a retry; a later read that adds none is not held
    assert store.barrier() is None


def test_failed_acks_311_close_the_connection():
    b, _ = broker()
    conn = connected(b, 4)
    conn.pending_acks = 1
    conn.acks_done([HELD_PUBACK_7], "disk full")
    assert output(conn, 4) == b"" and conn.close_requested  # 3.1.x has no failure ack


# ------------------------------------------------------------ timers with the fake clock
def test_keep_alive_timeout_on_the_fake_clock():
    b, clock = broker()
    conn = Connection(b)
    conn.data_received(CONNECT_V5)
    output(conn)
    clock.t += 15          # 1.5 x keep alive: still in time [MQTT-3.1.2-22]
    conn.check_timeouts(clock())
    assert output(conn) == b""
    clock.t += 0.5
    conn.check_timeouts(clock())
    (d,) = decode(output(conn))
    assert (d.type, d.reason_code) == (P.DISCONNECT, rc.KEEP_ALIVE_TIMEOUT) and conn.close_requested


def persistent_with_store(tmp_path):
    """A broker with the SQLite store and a connected v5 persistent session "keeper"."""
    from broker.store.sqlite import Store
    b, _ = broker()
    b.add_hook(Store(str(tmp_path / "state.db")))
    conn = Connection(b)
    conn.data_received(encode(P.Connect("keeper", 5, clean_start=False,
                                        properties={PR.SESSION_EXPIRY_INTERVAL: 60}), 5))
    output(conn)
    return b, conn


def test_a_persistent_sessions_suback_waits_for_durability_and_fails_per_filter(tmp_path):
    """A SUBACK says the subscriptions exist: for a persistent session it waits for the hooks
    providing barrier(), like a PUBACK; if they fail, every filter gets 0x80 [MQTT-3.9.3-1]."""
    b, conn = persistent_with_store(tmp_path)
    (ev,) = conn.data_received(encode(P.Subscribe(3, [("a/#", P.SubscriptionOptions(1)),
                                                      ("b", P.SubscriptionOptions(0))]), 5))
    assert isinstance(ev, AcksHeld) and ev.subacks == 1 and output(conn) == b""
    conn.acks_done(ev.acks, "disk full", ev.subacks)
    (ack,) = decode(output(conn))
    assert (ack.type, ack.packet_id, ack.reason_codes) == (P.SUBACK, 3, [0x80, 0x80])
    assert conn.pending_acks == 0 and not conn.close_requested
    clean = connected(b)
    assert clean.data_received(encode(P.Subscribe(4, [("c", P.SubscriptionOptions(1))]), 5)) \
        is NO_EVENTS  # a clean session's SUBACK does not wait


def test_a_long_held_suback_fails_with_its_own_packet_id(tmp_path):
    """A SUBACK of more than 127 bytes (a two-byte Remaining Length) held for durability and
    then failed keeps the SUBSCRIBE's packet id [MQTT-3.8.4-2], one 0x80 per filter
    [MQTT-3.9.3-1]; held and sent as a success, it is the SUBACK the filters got."""
    b, conn = persistent_with_store(tmp_path)
    filters = [(f"f/{i}", P.SubscriptionOptions(1)) for i in range(200)]
    (ev,) = conn.data_received(encode(P.Subscribe(0x1234, filters), 5))
    conn.acks_done(ev.acks, "disk full", ev.subacks)
    (ack,) = decode(output(conn))
    assert (ack.type, ack.packet_id, ack.reason_codes) == (P.SUBACK, 0x1234, [0x80] * 200)
    assert ack.properties[PR.REASON_STRING] == "disk full"
    (ev,) = conn.data_received(encode(P.Subscribe(0x1235, filters), 5))
    conn.acks_done(ev.acks, None, ev.subacks)
    (ack,) = decode(output(conn))
    assert (ack.type, ack.packet_id, ack.reason_codes) == (P.SUBACK, 0x1235, [1] * 200)
