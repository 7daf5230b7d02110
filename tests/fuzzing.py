"""Hostile-client fuzzing shared by tests/unit/test_fuzz.py (hypothesis drives `rng`) and
bench/fuzz.py (a plain seeded loop): a seed corpus of valid packets, mutators, and the two
targets (the incremental Decoder; the sans-I/O Connection + Broker with a fake clock).

A target returns normally when the input was handled; anything else it raises is a crash:
only MQTTError (MalformedPacket / ProtocolError with a reason code) may come out of the
codec, and nothing at all may escape Connection.data_received.
"""
from __future__ import annotations

import random

from broker.config import MQTTConfig
from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import Decoder, encode, encode_publish
from broker.protocol.errors import MQTTError
from broker.protocol.properties import encode_vbi

V4, V5 = P.MQTT_311, P.MQTT_5
O = P.SubscriptionOptions

_PUB_PROPS = {PR.PAYLOAD_FORMAT_INDICATOR: 1, PR.MESSAGE_EXPIRY_INTERVAL: 60,
              PR.CONTENT_TYPE: "text/plain", PR.RESPONSE_TOPIC: "r/1", PR.CORRELATION_DATA: b"\x01\x02",
              PR.TOPIC_ALIAS: 2, PR.USER_PROPERTY: [("k", "v"), ("k", "w")]}
_REASON = {PR.REASON_STRING: "why", PR.USER_PROPERTY: [("a", "b")]}


def _client_packets(level: int) -> list:
    """Packets a client sends (all fields a broker must read), valid for `level`."""
    v5 = level == V5
    will_props = {PR.WILL_DELAY_INTERVAL: 1, PR.CONTENT_TYPE: "c"} if v5 else None
    out = [
        P.Connect("fz", level, keep_alive=30, username="u", password=b"pw",
                  will=P.Will("w/t", b"bye", 1, True, will_props),
                  properties={PR.SESSION_EXPIRY_INTERVAL: 10, PR.RECEIVE_MAXIMUM: 5,
                              PR.TOPIC_ALIAS_MAXIMUM: 4, PR.MAXIMUM_PACKET_SIZE: 100000,
                              PR.REQUEST_PROBLEM_INFORMATION: 1,
                              PR.USER_PROPERTY: [("x", "y")]} if v5 else None),
        P.Publish("a/b", b"hello", 0, False),
        P.Publish("a/c", b"q1", 1, True, False, 7, _PUB_PROPS if v5 else None),
        P.Publish("a/d", b"q2" * 20, 2, False, True, 8, {PR.MESSAGE_EXPIRY_INTERVAL: 5} if v5 else None),
        P.Ack(P.PUBACK, 1), P.Ack(P.PUBREC, 2), P.Ack(P.PUBREL, 8), P.Ack(P.PUBCOMP, 3),
        P.Subscribe(9, [("a/#", O(2)), ("+/b", O(1, v5, v5, 1 if v5 else 0)), ("$share/g/s", O(0))],
                    {PR.SUBSCRIPTION_IDENTIFIER: [42], PR.USER_PROPERTY: [("s", "t")]} if v5 else None),
        P.Unsubscribe(10, ["a/#", "x"], {PR.USER_PROPERTY: [("u", "v")]} if v5 else None),
        P.PingReq(),
        P.Disconnect(4 if v5 else 0, {PR.SESSION_EXPIRY_INTERVAL: 0, PR.REASON_STRING: "bye"} if v5 else None),
    ]
    if v5:
        out[4:8] = [P.Ack(P.PUBACK, 1, 0x10, _REASON), P.Ack(P.PUBREC, 2, 0x80, _REASON),
                    P.Ack(P.PUBREL, 8, 0x92, _REASON), P.Ack(P.PUBCOMP, 3, 0, _REASON)]
        out.append(P.Auth(0x18, {PR.AUTHENTICATION_METHOD: "m", PR.AUTHENTICATION_DATA: b"d"}))
    return out


def _server_packets(level: int) -> list:
    v5 = level == V5
    return [
        P.Connack(True, 0, {PR.ASSIGNED_CLIENT_IDENTIFIER: "id", PR.TOPIC_ALIAS_MAXIMUM: 3,
                            PR.MAXIMUM_QOS: 1, PR.RETAIN_AVAILABLE: 0} if v5 else None),
        P.Suback(9, [0, 1, 2, 0x80] if v5 else [0, 1, 0x80], _REASON if v5 else None),
        P.Unsuback(10, [0, 0x11] if v5 else [], _REASON if v5 else None),
        P.PingResp(),
    ]


# Real captured MQTT 5.0 bytes (/work/shared/seeds/003_*.txt: PUBLISH QoS 0 with Response Topic,
# Correlation Data, Message Expiry; PUBACK / PUBREC / PUBREL / PUBCOMP).
CAPTURED = [bytes.fromhex(
    "30 31 00 07 72 65 71 75 65 73 74 10 02 00 00 01 2c 08 00 08 72 65 73 70 6f 6e 73 65"
    " 54 68 69 73 20 69 73 20 61 20 51 6f 53 20 30 20 6d 65 73 73 61 67 65"),
    bytes.fromhex("40 04 64 4a 10 00"), bytes.fromhex("50 04 11 c2 10 00"),
    bytes.fromhex("62 03 11 c2 00"), bytes.fromhex("70 04 11 c2 00 00")]

# level -> encoded client packets (CONNECT first) / every packet type, for the decoder
CLIENT_SEEDS = {lv: [encode(p, lv) for p in _client_packets(lv)] for lv in (V4, V5)}
SEEDS = {lv: CLIENT_SEEDS[lv] + [encode(p, lv) for p in _server_packets(lv)] for lv in (V4, V5)}
SEEDS[V5] = SEEDS[V5] + CAPTURED
ALL_SEEDS = SEEDS[V4] + SEEDS[V5]

# lengths around every Variable Byte Integer / two-byte-length boundary
BOUNDARIES = (0, 1, 2, 126, 127, 128, 129, 16383, 16384, 65535, 2097151, 2097152, 268435455)

_PROP_IDS = sorted(PR.TYPES) + [0x00, 0x7F, 0x80, 0xFF]


def random_properties(rng) -> bytes:
    """A property block of random identifiers (known, unknown, misplaced) with values of
    about the right shape: right type, wrong length, zero, huge."""
    body = bytearray()
    for _ in range(rng.randrange(5)):
        pid = rng.choice(_PROP_IDS)
        body += encode_vbi(pid) if pid < 0x80 else bytes((pid,))
        kind = PR.TYPES.get(pid, rng.randrange(7))
        if kind == PR.BYTE:
            body.append(rng.choice((0, 1, 2, 255)))
        elif kind == PR.TWO:
            body += rng.choice((0, 1, 65535)).to_bytes(2, "big")
        elif kind == PR.FOUR:
            body += rng.choice((0, 1, 2 ** 32 - 1)).to_bytes(4, "big")
        elif kind == PR.VBI:
            body += encode_vbi(rng.choice((0, 1, 127, 128, 268435455)))
        else:
            for _ in range(2 if kind == PR.PAIR else 1):
                s = rng.choice((b"", b"ok", b"\xff\xfe", b"\x00", b"\xed\xa0\x80", b"a" * 300))
                n = len(s) if rng.random() < 0.8 else rng.choice(BOUNDARIES) & 0xFFFF
                body += n.to_bytes(2, "big") + s
    n = len(body) if rng.random() < 0.85 else rng.choice(BOUNDARIES)
    return encode_vbi(n) + bytes(body)


def packet_with_random_properties(rng) -> bytes:
    """A v5 packet whose property block is random_properties()."""
    props = random_properties(rng)
    kind = rng.randrange(6)
    if kind == 0:
        return encode_publish(b"a/p", b"x", rng.randrange(3), False, False, 5, props, V5)
    if kind == 1:  # CONNECT: header, properties, client id
        body = b"\x00\x04MQTT\x05\x02\x00\x3c" + props + b"\x00\x02fz"
        return b"\x10" + encode_vbi(len(body)) + body
    if kind == 2:
        body = b"\x00\x09" + props + b"\x00\x01a\x01"
        return b"\x82" + encode_vbi(len(body)) + body
    if kind == 3:
        body = b"\x00" + props
        return b"\xe0" + encode_vbi(len(body)) + body
    if kind == 4:
        body = b"\x00\x07\x10" + props
        return bytes((rng.choice(b"\x40\x50\x62\x70"),)) + encode_vbi(len(body)) + body
    body = b"\x18" + props
    return b"\xf0" + encode_vbi(len(body)) + body


def _vbi_end(data: bytes) -> int:
    """Index just past the fixed header's Remaining Length (or len(data))."""
    i = 1
    while i < len(data) and i < 5 and data[i] & 0x80:
        i += 1
    return min(i + 1, len(data))


def mutate(rng, data: bytes, corpus) -> bytes:
    """Apply one random mutation to `data`."""
    b = bytearray(data)
    op = rng.randrange(10)
    if op == 0 and b:  # bit flip
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif op == 1 and b:  # random byte
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 2:  # insert bytes
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
    elif op == 3 and b:  # delete bytes
        i = rng.randrange(len(b))
        del b[i:i + rng.randrange(1, 4)]
    elif op == 4 and b:  # truncate
        del b[rng.randrange(len(b)):]
    elif op == 5:  # splice: a prefix of this one, the tail of another (or both whole)
        other = rng.choice(corpus)
        if rng.random() < 0.5:
            b = b[:rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1):]
        else:
            b = b + bytearray(other)
    elif op == 6 and b:  # Remaining Length set to a boundary value
        b[1:_vbi_end(b)] = encode_vbi(rng.choice(BOUNDARIES))
    elif op == 7 and len(b) > 3:  # a two-byte length (string, binary, packet id) set to a boundary
        i = rng.randrange(1, len(b) - 1)
        b[i:i + 2] = (rng.choice(BOUNDARIES) & 0xFFFF).to_bytes(2, "big")
    elif op == 8 and b:  # first byte: any type / flags
        b[0] = rng.randrange(256)
    else:
        b = bytearray(packet_with_random_properties(rng))
    return bytes(b)


def mutated(rng, corpus) -> bytes:
    """A seed from `corpus` with 1..4 mutations stacked."""
    data = rng.choice(corpus)
    for _ in range(1 + int(rng.random() ** 2 * 4)):
        data = mutate(rng, data, corpus)
    return data


def chunks(rng, data: bytes) -> list:
    """`data` cut at random places (often whole, sometimes byte by byte)."""
    r = rng.random()
    if r < 0.3 or len(data) < 2:
        return [data]
    if r < 0.4:
        return [data[i:i + 1] for i in range(len(data))]
    cuts = sorted({rng.randrange(1, len(data)) for _ in range(rng.randrange(1, 6))})
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


# ---------------------------------------------------------------- targets

def fuzz_decoder(rng, data: bytes, level: int) -> None:
    """Feed `data` in random chunks; only MQTTError may be reported, never raised."""
    d = Decoder(level, rng.choice((268435460, 256)), rng.choice((None, 64)))
    fed = 0
    for part in chunks(rng, data):
        fed += len(part)
        pkts, err = d.feed(part)
        for p in pkts:
            assert p.type in P.TYPE_NAMES, p
        if err is not None:
            assert isinstance(err, MQTTError), repr(err)
            assert 0x80 <= err.reason_code <= 0xA2, err.reason_code
            return
        # no unbounded memory: never more than what arrived
        assert d.buffered() <= fed, (d.buffered(), fed)


class CoreTarget:
    """A Broker (fake clock) with two subscribers on '#' (v5 with topic aliases and a
    subscription identifier; 3.1.1), fed hostile client connections one at a time."""

    def __init__(self, renew_every: int = 500):
        self.renew_every = renew_every
        self.runs = 0
        self._new_broker()

    def _new_broker(self) -> None:
        self.now = 1000.0
        self.broker = Broker(MQTTConfig(topic_alias_maximum=8, receive_maximum=16,
                                        max_connect_packet_size=4096),
                             clock=lambda: self.now, wall=lambda: self.now)
        self.subs = []
        for level, props in ((V5, {PR.TOPIC_ALIAS_MAXIMUM: 3, PR.RECEIVE_MAXIMUM: 4}), (V4, None)):
            c = Connection(self.broker)
            # keep alive 0: the fake clock jumps ahead, the subscribers must not time out
            c.data_received(encode(P.Connect(f"sub{level}", level, keep_alive=0, properties=props),
                                   level))
            sp = {PR.SUBSCRIPTION_IDENTIFIER: [7]} if level == V5 else None
            c.data_received(encode(P.Subscribe(1, [("#", O(2))], sp), level))
            self.subs.append((c, Decoder(level)))
        self.drain()

    def drain(self) -> None:
        """Subscribers read (and must be able to decode) what the broker sent, and ack it."""
        for c, dec in self.subs:
            data = b"".join(bytes(x) for x in c.take_output())
            pkts, err = dec.feed(data)
            assert err is None, f"broker sent a subscriber bytes it cannot decode: {err}"
            for p in pkts:
                if p.type == P.PUBLISH and p.qos:
                    c.data_received(encode(P.Ack(P.PUBACK if p.qos == 1 else P.PUBREC, p.packet_id),
                                           dec.level))
                elif p.type == P.PUBREL:
                    c.data_received(encode(P.Ack(P.PUBCOMP, p.packet_id), dec.level))
            c.take_output()
        self.broker.dirty.clear()

    def run(self, rng, data: bytes, level: int) -> None:
        """One hostile connection: usually a valid CONNECT first, then `data` in chunks."""
        self.runs += 1
        if self.runs % self.renew_every == 0:
            self._new_broker()
        b = self.broker
        conn = Connection(b)
        stream = data
        if rng.random() < 0.8:
            stream = CLIENT_SEEDS[level][0] + data
        out_level = level
        fed = 0
        for part in chunks(rng, stream):
            conn.data_received(part)
            fed += len(part)
            assert conn.decoder.buffered() <= fed
            if rng.random() < 0.1:
                self.now += rng.choice((0.5, 30, 100))
                b.tick(self.now)
        out = b"".join(bytes(x) for x in conn.take_output())
        # what the broker said to the hostile client decodes cleanly (its CONNACK, acks, DISCONNECT)
        dec = Decoder(conn.level if conn.level in (3, 4, 5) else out_level)
        pkts, err = dec.feed(out)
        assert err is None, f"broker wrote bytes its own decoder rejects: {err}: {out.hex()}"
        conn.connection_lost()
        self.drain()
        # no unbounded state: only the two subscribers stay connected
        assert len(b.connections) == 2, len(b.connections)


def run_one(rng, target: CoreTarget | None) -> None:
    """One input for the decoder and, when `target` is given, for the core."""
    level = rng.choice((V4, V5))
    data = mutated(rng, SEEDS[level] if rng.random() < 0.7 else ALL_SEEDS)
    fuzz_decoder(rng, data, level)
    if target is not None:
        client = mutated(rng, CLIENT_SEEDS[level][1:] if rng.random() < 0.8 else ALL_SEEDS)
        # a few valid packets around the mutated one, so later state is reached
        pre = b"".join(rng.choice(CLIENT_SEEDS[level][1:-1]) for _ in range(rng.randrange(3)))
        target.run(rng, pre + client, level)


def new_rng(seed: int) -> random.Random:
    return random.Random(seed)
