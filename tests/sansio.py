"""The sans-I/O test harness: a Broker with a fake clock and peers that talk to its Connections
in bytes, without sockets or asyncio (test_core, the fixture-driven flows, the fuzzer).

Everything that touches the Connection's I/O interface is in the two adapter functions
`feed` and `drain` (and `exchange`, both at once): when that interface changes (events
returned by data_received, transport state moving out), only they change.
"""
from __future__ import annotations

from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol.codec import Decoder, encode
from settings import MQTTConfig

# ---------------------------------------------------------------- the adapter

def feed(conn: Connection, data: bytes):
    """Bytes from the client into the core; returns what the core asks of its caller."""
    return conn.data_received(data)


def drain(conn: Connection) -> bytes:
    """The bytes the core wrote to the client since the last drain."""
    return b"".join(bytes(x) for x in conn.take_output())


def exchange(conn: Connection, data: bytes = b"") -> bytes:
    """Bytes in, bytes out: feed `data` (if any), then drain."""
    if data:
        feed(conn, data)
    return drain(conn)


# ---------------------------------------------------------------- broker and peers

class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(**cfg):
    """A Broker with the given [mqtt] settings and a fake clock: (broker, clock)."""
    clock = Clock()
    b = Broker(MQTTConfig(**cfg), clock=clock, wall=clock)
    return b, clock


class Client:
    """A sans-I/O peer: encodes packets into a Connection and decodes what it writes."""

    def __init__(self, broker, level=5):
        self.conn = Connection(broker)
        self.level = level
        self.dec = Decoder(level)
        self.pending = []

    def send(self, pkt):
        feed(self.conn, encode(pkt, self.level))

    def send_bytes(self, data: bytes):
        feed(self.conn, data)

    def received(self):
        pkts, err = self.dec.feed(drain(self.conn))
        assert err is None
        pkts, self.pending = self.pending + pkts, []
        return pkts

    def connect(self, cid, clean=True, props=None, **kw):
        self.send(P.Connect(cid, self.level, clean_start=clean, properties=props, **kw))
        ack, *self.pending = self.received()
        assert ack.type == P.CONNACK
        return ack


# ---------------------------------------------------------------- what the server does, and reading
# (the socket helpers of tests/integration/helpers.py, without sockets: moved tests read alike)

def connect_bytes(name: str = "MQTT", level: int = 5, flags: int = 0x02, client_id: str = "x",
                  keep_alive: int = 60) -> bytes:
    """A CONNECT forged field by field (protocol name, level, flags), to break one at a time."""
    from broker.protocol.properties import encode_utf8
    body = encode_utf8(name) + bytes((level, flags)) + keep_alive.to_bytes(2, "big")
    if level == 5:
        body += b"\x00"
    body += encode_utf8(client_id)
    return bytes((0x10, len(body))) + body


def lose(c: Client) -> None:
    """The socket closed without DISCONNECT: what MQTTProtocol.connection_lost does."""
    c.conn.connection_lost()


def until_closed(c: Client) -> list:
    """Every packet the broker writes before it closes the connection (the server closes it
    after writing them: MQTTProtocol.write_output, then connection_lost); fails if it stays open."""
    pkts = c.received()
    assert c.conn.close_requested, f"the broker did not close the connection; saw {pkts!r}"
    c.conn.connection_lost()
    return pkts


def expect_disconnect(c: Client, code: int) -> list:
    """The broker sends DISCONNECT with `code`, last, and closes the connection."""
    seen = until_closed(c)
    assert seen and seen[-1].type == P.DISCONNECT, f"closed without a DISCONNECT last; saw {seen!r}"
    assert seen[-1].reason_code == code, \
        f"DISCONNECT reason 0x{seen[-1].reason_code:02X}, expected 0x{code:02X}: {seen[-1]!r}"
    return seen


def bye(*clients: Client) -> None:
    """Normal DISCONNECT (0x00), then the socket closes."""
    for c in clients:
        c.send(P.Disconnect())
        c.conn.connection_lost()


def run_for(broker, clock: Clock, seconds: float) -> None:
    """Let `seconds` pass as under the server: Broker.tick() once a second (Server._tick), and
    once more at the end."""
    end = clock.t + seconds
    while clock.t + 1.0 < end:
        clock.t += 1.0
        broker.tick()
    clock.t = end
    broker.tick()


def recv(c: Client):
    """The next packet the broker sent to `c` (the later ones stay pending, in order)."""
    pkts = c.received()
    assert pkts, "nothing received"
    c.pending = pkts[1:]
    return pkts[0]


def recv_type(c: Client, ptype: int):
    pkt = recv(c)
    assert pkt.type == ptype, f"expected {P.TYPE_NAMES[ptype]}, got {pkt!r}"
    return pkt


def recv_publish(c: Client) -> P.Publish:
    return recv_type(c, P.PUBLISH)


def nothing(c: Client) -> bool:
    """Nothing sent to `c` that it has not read."""
    pkts = c.received()
    c.pending = pkts
    return not pkts


def recv_skipping(c: Client, ptype: int):
    """The next packet of `ptype`; PUBLISHes before it (the client's own subscriptions) stay
    pending, in order."""
    pkts = c.received()
    for i, p in enumerate(pkts):
        if p.type == ptype:
            c.pending = pkts[:i] + pkts[i + 1:]
            return p
        assert p.type == P.PUBLISH, f"expected {P.TYPE_NAMES[ptype]}, got {p!r}"
    raise AssertionError(f"no {P.TYPE_NAMES[ptype]}; received {pkts!r}")


def subscribe(c: Client, *filters: str, qos: int = 0, pid: int = 1, **opts) -> P.Suback:
    c.send(P.Subscribe(pid, [(f, P.SubscriptionOptions(qos, **opts)) for f in filters]))
    return recv_type(c, P.SUBACK)


def publish(c: Client, topic: str, payload: bytes = b"", qos: int = 0, pid: int | None = None,
            **kw) -> None:
    c.send(P.Publish(topic, payload, qos, packet_id=pid if qos else None, **kw))


def publish_ok(c: Client, topic: str, payload: bytes = b"x", qos: int = 0, pid: int = 1,
               expect_code: int | None = None, **kw):
    """Publish and complete the inbound flow; the PUBACK/PUBREC (None for QoS 0)."""
    publish(c, topic, payload, qos, pid, **kw)
    if qos == 0:
        return None
    a = recv_skipping(c, P.PUBACK if qos == 1 else P.PUBREC)
    assert a.packet_id == pid
    if expect_code is not None:
        assert a.reason_code == expect_code, \
            f"reason 0x{a.reason_code:02X}, expected 0x{expect_code:02X}"
    if qos == 2:
        c.send(P.Ack(P.PUBREL, pid))
        comp = recv_skipping(c, P.PUBCOMP)
        assert comp.packet_id == pid and comp.reason_code == 0
    return a


def ack(c: Client, pub: P.Publish) -> None:
    """Complete the flow of a PUBLISH received from the broker (PUBACK, or PUBREC+PUBCOMP)."""
    if pub.qos == 1:
        c.send(P.Ack(P.PUBACK, pub.packet_id))
    elif pub.qos == 2:
        c.send(P.Ack(P.PUBREC, pub.packet_id))
        rel = recv_skipping(c, P.PUBREL)
        assert rel.packet_id == pub.packet_id
        c.send(P.Ack(P.PUBCOMP, pub.packet_id))


def props(pkt) -> dict:
    return pkt.properties or {}


def assert_served(broker) -> None:
    """The broker still serves other clients: a fresh subscriber gets a fresh publisher's message."""
    sub, pub = Client(broker), Client(broker)
    assert sub.connect("alive-sub").reason_code == 0 and pub.connect("alive-pub").reason_code == 0
    assert subscribe(sub, "alive", qos=1).reason_codes == [1]
    publish_ok(pub, "alive", b"still-alive", qos=1, expect_code=0)
    m = recv_publish(sub)
    assert (m.topic, m.payload, m.qos) == ("alive", b"still-alive", 1)
    ack(sub, m)
    bye(sub, pub)

# ---------------------------------------------------------------- what the server does around the core

def closed(conn: Connection) -> bool:
    """Whether the core asked for the connection to be closed (the server closes the socket
    after writing what is in `out`)."""
    return conn.close_requested


def advance(broker, clock: Clock, seconds: float) -> None:
    """Time passes: the fake clock moves on and the broker's timers run once (the server calls
    Broker.tick() every second: keep alive, delayed wills, session and message expiry)."""
    clock.t += seconds
    broker.tick()
