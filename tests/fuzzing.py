"""Hostile-client fuzzing shared by tests/unit/test_fuzz.py (hypothesis drives `rng`) and
bench/fuzz.py (a plain seeded loop): a seed corpus of valid packets, mutators, and the two
targets (the incremental Decoder; the sans-I/O Connection + Broker with a fake clock).

A target returns normally when the input was handled; anything else it raises is a crash:
only MQTTError (MalformedPacket / ProtocolError with a reason code) may come out of the
codec, and nothing at all may escape Connection.data_received.
"""
from __future__ import annotations

import random

from broker.core.broker import Broker
from broker.core.clientlog import ClientLog
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import Decoder, encode, encode_ack, encode_publish
from broker.protocol.errors import MQTTError
from broker.protocol.properties import encode_vbi
from settings import MQTTConfig
from tests import vectors
from tests.sansio import drain, feed

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


# level -> encoded client packets (CONNECT first) / every packet type, for the decoder
CLIENT_SEEDS = {lv: [encode(p, lv) for p in _client_packets(lv)] for lv in (V4, V5)}
SEEDS = {lv: CLIENT_SEEDS[lv] + [encode(p, lv) for p in _server_packets(lv)] for lv in (V4, V5)}
# plus the shared byte fixtures (tests/vectors.py: every packet type, the captured seeds/003 bytes)
for _lv in (V4, V5):
    SEEDS[_lv] = SEEDS[_lv] + [v.data for v in vectors.of(_lv, max_size=1024)]
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


def mutated(rng, corpus, splice=None) -> bytes:
    """A seed from `corpus` with 1..4 mutations stacked (splicing with `splice`, default
    `corpus`)."""
    data = rng.choice(corpus)
    for _ in range(1 + int(rng.random() ** 2 * 4)):
        data = mutate(rng, data, splice or corpus)
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


# ---------------------------------------------------------------- well-formed, hostile values

# Topic names and filters a broker must refuse or handle: wildcards in a name, empty, $SYS,
# shared-subscription edge cases, non-ASCII, long.
TOPICS = ("a/b", "a/c", "", "a/+", "#", "a/#", "$SYS/x", "$share/g/a", "\u00e9/\u00fc", "a//b", "/",
          "t" * 300, "a\u0001b")
FILTERS = ("#", "a/#", "+", "a/+", "+/+/#", "$share/g/a/#", "$share//a", "$share/g", "$share/g/",
           "a/#/b", "a+", "", "$SYS/#", "a/b", "x" * 300)
PIDS = (1, 2, 3, 4, 5, 7, 8, 65535)


def random_packet(rng, level: int) -> bytes:
    """A well-formed client packet with hostile values (aliases out of range, wildcard topics,
    unknown packet ids, Subscription Identifiers from a client...), so that the checks after
    decoding are reached, not only the decoder's."""
    v5 = level == V5
    k = rng.randrange(11)
    pid = rng.choice(PIDS)
    if k < 4:
        qos = rng.randrange(3)
        props = {}
        if v5:
            if rng.random() < 0.4:
                props[PR.TOPIC_ALIAS] = rng.choice((0, 1, 2, 8, 9, 65535))
            if rng.random() < 0.2:
                props[PR.MESSAGE_EXPIRY_INTERVAL] = rng.choice((0, 1, 60, 2 ** 32 - 1))
            if rng.random() < 0.1:
                props[PR.PAYLOAD_FORMAT_INDICATOR] = 1
            if rng.random() < 0.05:
                props[PR.SUBSCRIPTION_IDENTIFIER] = [1]
            if rng.random() < 0.1:
                props[PR.RESPONSE_TOPIC] = rng.choice(("r", "r/#", ""))
            if rng.random() < 0.1:
                props[PR.USER_PROPERTY] = [("k", "v")] * rng.randrange(1, 4)
        return encode(P.Publish(rng.choice(TOPICS), rng.choice((b"", b"x", b"\xff\xfe", b"y" * 200)),
                                qos, rng.random() < 0.3, bool(qos) and rng.random() < 0.2,
                                pid if qos else None, props or None), level)
    if k < 7:
        t = rng.choice((P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP))
        return encode_ack(t, pid, rng.choice((0, 0x10, 0x80, 0x92)) if v5 else 0, None, level)
    if k == 7:
        topics = [(rng.choice(FILTERS), O(rng.randrange(3), v5 and rng.random() < 0.3,
                                          v5 and rng.random() < 0.5, rng.randrange(3) if v5 else 0))
                  for _ in range(rng.randrange(1, 4))]
        props = ({PR.SUBSCRIPTION_IDENTIFIER: [rng.choice((1, 5, 268435455))]}
                 if v5 and rng.random() < 0.5 else None)
        return encode(P.Subscribe(pid, topics, props), level)
    if k == 8:
        return encode(P.Unsubscribe(pid, [rng.choice(FILTERS) for _ in range(rng.randrange(1, 3))]),
                      level)
    if k == 9:
        return PINGREQ
    if v5 and rng.random() < 0.5:
        props = {PR.SESSION_EXPIRY_INTERVAL: rng.choice((0, 10))} if rng.random() < 0.5 else None
        return encode(P.Disconnect(rng.choice((0, 4, 0x80)), props), level)
    return rng.choice((b"\xe0\x00", CONNECTS[level][0]))  # DISCONNECT, or a second CONNECT


def _connects(level: int) -> list:
    """CONNECT variants for the hostile client: the seed (will, user name), a persistent
    session that later runs resume (small Receive Maximum, Topic Alias Maximum and Maximum
    Packet Size towards it), an empty client id with a delayed will, and MQTT 3.1."""
    v5 = level == V5
    keep = {PR.SESSION_EXPIRY_INTERVAL: 100, PR.RECEIVE_MAXIMUM: 2, PR.TOPIC_ALIAS_MAXIMUM: 2,
            PR.MAXIMUM_PACKET_SIZE: 64}
    will = P.Will("w/d", b"x", 2, False, {PR.WILL_DELAY_INTERVAL: 30, PR.MESSAGE_EXPIRY_INTERVAL: 5}
                  if v5 else None)
    out = [CLIENT_SEEDS[level][0],
           encode(P.Connect("fz-keep", level, clean_start=False, keep_alive=0,
                            properties=keep if v5 else None), level),
           encode(P.Connect("", level, keep_alive=5, will=will,
                            properties={PR.SESSION_EXPIRY_INTERVAL: 60} if v5 else None), level)]
    if not v5:
        out.append(encode(P.Connect("fz31", P.MQTT_31), P.MQTT_31))
    return out


CONNECTS = {lv: _connects(lv) for lv in (V4, V5)}


# ---------------------------------------------------------------- targets

def fuzz_decoder(rng, data: bytes, level: int) -> None:
    """Feed `data` in random chunks: only MQTTError with a spec reason code may be reported,
    never raised; at most the bytes that arrived are held; and (without the pre-CONNECT
    limit, which depends on how reads fall) the result is the same as for one read."""
    limit, connect_limit = rng.choice((268435460, 256)), rng.choice((None, 64))
    d = Decoder(level, limit, connect_limit)
    got, err, fed = [], None, 0
    for part in chunks(rng, data):
        fed += len(part)
        pkts, err = d.feed(part)
        got += pkts
        for p in pkts:
            assert p.type in P.TYPE_NAMES, p
        if err is not None:
            assert isinstance(err, MQTTError), repr(err)
            assert err.reason_code in DISCONNECT_CODES or err.reason_code in CONNACK_CODES, err
            break
        assert d.buffered() <= fed, (d.buffered(), fed)  # no unbounded memory
    if connect_limit is None:
        whole, werr = Decoder(level, limit).feed(data)
        assert whole == got, "decoded differently when the bytes arrive in pieces"
        assert type(werr) is type(err) and (err is None or werr.reason_code == err.reason_code)


# Reason codes a server may put in a DISCONNECT (3.14.2.1) / a CONNACK (3.2.2.2).
DISCONNECT_CODES = {0x00, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93,
                    0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0,
                    0xA1, 0xA2}
CONNACK_CODES = {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
                 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
V4_REFUSE_VERSION = b"\x20\x02\x00\x01"  # the 3.1.1 CONNACK answering an unknown protocol level
PINGREQ, PINGRESP = b"\xc0\x00", b"\xd0\x00"


# The broker's limits for the core target: small, so the fuzzer reaches them; each variant in
# CONFIGS (cycled through by long runs) turns capabilities off or limits further.
BASE_CONFIG = dict(topic_alias_maximum=8, receive_maximum=4, max_connect_packet_size=4096,
                   max_subscriptions_per_client=20, max_queued_messages=50,
                   max_filters_per_subscribe=10)
CONFIGS = (
    {},
    dict(maximum_qos=1, retain_available=False, shared_subscription_available=False),
    dict(wildcard_subscription_available=False, subscription_identifiers_available=False,
         outbound_topic_aliases=False, topic_alias_maximum=0),
    dict(server_keep_alive=10, max_topic_levels=3, max_topic_length=16,
         validate_payload_format=False, queue_qos0_messages=True, max_queued_messages=3,
         max_retained_replay=2),
    dict(maximum_packet_size=128, max_connect_packet_size=64, max_client_id_length=4,
         session_expiry_maximum=5, max_keep_alive=20),
)


class ErrorsSeen(ClientLog):
    """The broker's client log, remembering which connections reported a protocol error (4.13):
    Connection.violation() logs a line with the MQTTError (the Connection itself may be
    compiled: no subclass of it)."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker.clock, broker.cfg.client_log_lines_per_second)
        self.errors: dict[Connection, list[MQTTError]] = {}

    def line(self, logger, level, conn, fmt, *args) -> bool:
        for a in args:
            if isinstance(a, MQTTError):
                self.errors.setdefault(conn, []).append(a)
        return super().line(logger, level, conn, fmt, *args)


def watched(broker: Broker) -> Connection:
    """A hostile client's connection, its protocol errors seen (ErrorsSeen)."""
    if not isinstance(broker.client_log, ErrorsSeen):
        broker.client_log = ErrorsSeen(broker)
    return Connection(broker, "fuzz")


class CoreTarget:
    """A Broker (fake clock) with two subscribers on '#' (v5 with topic aliases and a
    subscription identifier; 3.1.1), fed hostile client connections one at a time.

    Invariants checked per input: nothing escapes data_received; what the broker wrote to the
    hostile client decodes; a v5 client it drops gets one DISCONNECT (or failed CONNACK) with
    a reason code the spec lists, last; a 3.1.1 client gets no DISCONNECT; a connection that
    was not dropped still answers PINGREQ; buffered bytes and per-client state stay within
    their configured bounds; the subscribers stay connected and can decode what they get."""

    def __init__(self, renew_every: int = 500, variant: int = 0):
        self.renew_every = renew_every
        self.runs = 0
        self.variant = variant  # index in CONFIGS; the next one at each periodic renewal
        self._new_broker()

    def _new_broker(self) -> None:
        self.now = 1000.0
        self.cfg = MQTTConfig(**{**BASE_CONFIG, **CONFIGS[self.variant % len(CONFIGS)]})
        self.broker = Broker(self.cfg, clock=lambda: self.now, wall=lambda: self.now)
        self.subs = []
        for level, props in ((V5, {PR.TOPIC_ALIAS_MAXIMUM: 3, PR.RECEIVE_MAXIMUM: 4}), (V4, None)):
            c = Connection(self.broker)
            # keep alive 0: the fake clock jumps ahead, the subscribers must not time out
            feed(c, encode(P.Connect(f"sub{level}", level, keep_alive=0, properties=props),
                                   level))
            sp = {PR.SUBSCRIPTION_IDENTIFIER: [7]} if level == V5 else None
            feed(c, encode(P.Subscribe(1, [("#", O(2))], sp), level))
            self.subs.append((c, Decoder(level)))
        self.drain()

    def drain(self) -> None:
        """Subscribers read (and must be able to decode) what the broker sent, and ack it."""
        for c, dec in self.subs:
            for _ in range(100):
                data = drain(c)
                if not data:
                    break
                pkts, err = dec.feed(data)
                assert err is None, f"broker sent a subscriber bytes it cannot decode: {err}"
                for p in pkts:
                    if p.type == P.PUBLISH and p.qos:
                        feed(c, encode(P.Ack(P.PUBACK if p.qos == 1 else P.PUBREC,
                                                     p.packet_id), dec.level))
                    elif p.type == P.PUBREL:
                        feed(c, encode(P.Ack(P.PUBCOMP, p.packet_id), dec.level))
                    assert p.type != P.DISCONNECT, p
            assert not c.close_requested
        self.broker.dirty.clear()

    def run(self, rng, *streams: bytes) -> None:
        """Hostile connections, one per stream (see core_case), their chunks (cut by `rng`)
        interleaved: a second connection may take the first one's session over."""
        self.runs += 1
        if self.runs % self.renew_every == 0:
            self.variant += 1
            self._new_broker()
        try:
            self._run(rng, streams)
        except BaseException:
            self._new_broker()  # a failed input leaves state behind: later inputs start clean
            raise

    def _run(self, rng, streams) -> None:
        b = self.broker
        conns = [watched(b) for _ in streams]
        pending = [[c, chunks(rng, data), 0] for c, data in zip(conns, streams)]
        while pending:
            entry = pending[rng.randrange(len(pending))]
            conn, parts, fed = entry
            part = parts.pop(0)
            feed(conn, part)  # nothing may escape: an exception here is a crash
            entry[2] = fed = fed + len(part)
            assert conn.buffered() <= fed  # holds at most what arrived
            if not parts:
                pending.remove(entry)
            if rng.random() < 0.1:
                self.now += rng.choice((0.5, 30, 100))
                for c, _ in self.subs:
                    feed(c, PINGREQ)  # the subscribers are alive (keep alive)
                b.tick(self.now)
        for conn in conns:
            self._check(conn)
        for conn in conns:
            conn.connection_lost()
        self.drain()
        # no unbounded state: only the two subscribers stay connected
        assert len(b.connections) == 2, len(b.connections)

    def _check(self, conn) -> None:
        """What one hostile connection got, and that it still works unless it was dropped."""
        cfg = self.cfg
        self._check_state(conn, cfg)
        out = drain(conn)
        closed = conn.close_requested
        if out == V4_REFUSE_VERSION:  # [MQTT-3.1.2-2]: answered in 3.1.1 terms
            assert closed
            pkts = []
        else:
            pkts, err = Decoder(conn.level if conn.level in (3, 4, 5) else V5).feed(out)
            assert err is None, f"broker wrote bytes its own decoder rejects: {err}: {out.hex()}"
        v5 = conn.level == V5
        for i, p in enumerate(pkts):
            if p.type == P.CONNACK:
                assert i == 0, "CONNACK not first"
                assert p.reason_code in (CONNACK_CODES if v5 else range(6)), p
                if p.reason_code:
                    assert closed and i == len(pkts) - 1, "failed CONNACK not followed by close"
            elif p.type == P.DISCONNECT:
                assert v5, "DISCONNECT sent to a 3.1.x client"
                assert i == len(pkts) - 1 and closed, "DISCONNECT not last / connection kept"
                assert p.reason_code in DISCONNECT_CODES and p.reason_code >= 0x80, p
        if self.broker.client_log.errors.pop(conn, None):
            assert closed, "protocol error reported but the connection stays open"
        if not closed and conn.session is not None and conn.session.connection is conn \
                and conn.buffered() == 0:
            feed(conn, PINGREQ)  # still working: answers a PINGREQ
            reply = drain(conn)
            assert reply.endswith(PINGRESP), reply.hex()

    @staticmethod
    def _check_state(conn, cfg) -> None:
        """Per-client state within the configured bounds."""
        assert len(conn.in_aliases) <= cfg.topic_alias_maximum
        s = conn.session
        if s is not None:
            assert len(s.inflight_in) <= cfg.receive_maximum
            assert len(s.subscriptions) <= cfg.max_subscriptions_per_client
            # what the subscriptions cost, as kept by the session, and within the bounds
            assert s.filter_bytes == sum(map(len, s.subscriptions))
            assert not cfg.max_subscription_bytes or s.filter_bytes <= cfg.max_subscription_bytes
            assert not cfg.max_wildcard_levels or s.wildcard_levels <= cfg.max_wildcard_levels
            assert len(s.queue) <= cfg.max_queued_messages
            # (in-flight towards the client is not checked against its Receive Maximum: the
            # send quota of 4.9 counts acknowledgements of messages sent on earlier connections)
            assert len(s.inflight_out) <= 65535


# ---------------------------------------------------------------- one input per target

def decoder_case(rng) -> tuple[int, bytes]:
    """(level, bytes) for the decoder: a mutated seed, or a mutated well-formed hostile packet."""
    level = rng.choice((V4, V5))
    if rng.random() < 0.3:
        return level, mutated(rng, [random_packet(rng, level)], SEEDS[level])
    return level, mutated(rng, SEEDS[level] if rng.random() < 0.7 else ALL_SEEDS)


def decoder_input(rng) -> None:
    level, data = decoder_case(rng)
    fuzz_decoder(rng, data, level)


def core_stream(rng, level: int) -> bytes:
    """What a hostile client sends: usually a CONNECT, then a few packets (valid seeds and
    well-formed hostile ones, so later states are reached), usually ending with a mutated one."""
    r = rng.random()
    out = ([rng.choice(CONNECTS[level])] if r < 0.75 else
           [mutated(rng, CONNECTS[level], SEEDS[level])] if r < 0.9 else [])  # first-packet paths
    for _ in range(rng.randrange(8)):
        out.append(random_packet(rng, level) if rng.random() < 0.6
                   else rng.choice(CLIENT_SEEDS[level][1:-1]))
    if rng.random() < 0.75:
        pick = rng.random()
        seeds = ([random_packet(rng, level)] if pick < 0.4 else
                 CLIENT_SEEDS[level][1:] if pick < 0.85 else ALL_SEEDS)
        out.append(mutated(rng, seeds, SEEDS[level]))
    return b"".join(out)


def core_case(rng) -> tuple[int, list]:
    """(level, streams): usually one hostile client, sometimes two at once (same client ids,
    so sessions are taken over mid-stream)."""
    level = rng.choice((V4, V5))
    streams = [core_stream(rng, level)]
    if rng.random() < 0.15:
        streams.append(core_stream(rng, rng.choice((V4, V5))))
    return level, streams


def core_input(rng, target: CoreTarget) -> None:
    target.run(rng, *core_case(rng)[1])


def new_rng(seed: int) -> random.Random:
    return random.Random(seed)
