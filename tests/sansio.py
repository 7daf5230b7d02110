"""The sans-I/O test harness: a Broker with a fake clock and peers that talk to its Connections
in bytes, without sockets or asyncio (test_core, the fixture-driven flows, the fuzzer).

Everything that touches the Connection's I/O interface is in the two adapter functions
`feed` and `drain` (and `exchange`, both at once): when that interface changes (events
returned by data_received, transport state moving out), only they change.
"""
from __future__ import annotations

from broker.config import MQTTConfig
from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol.codec import Decoder, encode

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
