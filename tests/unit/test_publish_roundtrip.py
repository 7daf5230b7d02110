"""Outgoing PUBLISH round trip at the Variable Byte Integer boundaries (1.5.5).

A forwarded QoS 1/2 PUBLISH whose Remaining Length was exactly 127, 16,383 or 2,097,151 was
corrupt: Message.encoded counted the header byte in the length and the packet identifier was
patched one byte too far. Here messages go through the broker the way a subscriber's bytes
do (Connection -> Broker.route -> Session -> Message.encoded + packet id patch, and the
resend, offline-queue and retained-replay paths) and the bytes are read back by a minimal
parser written from the specification, independent of broker/protocol's decoder. Sizes are
chosen so that the Remaining Length (and the property block length) land on each boundary.
"""
from dataclasses import dataclass, replace

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from broker.core.broker import Broker
from broker.core.connection import Connection
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import encode
from settings import MQTTConfig

BOUNDS = (127, 16383, 2097151)  # largest 1-, 2- and 3-byte Variable Byte Integers
DELTAS = (0, 1, -1, 2, -2)  # hypothesis favours the first: the boundary itself
TOPIC_LENS = [1, 2, 126, 127, 128, 129, 16382, 16383, 16384, 16385, 65535]
PB_TARGETS = [127, 128, 16383, 16384, 2097151, 2097152, 126, 129, 16382, 16385,
              2097150]  # property block lengths (the block's own length is a VBI too)
SUB_IDS = [1, 127, 128, 16383, 16384, 2097151, 2097152, 268435455]
EXPIRY = 3600


def vbi_size(n: int) -> int:
    return 1 if n < 128 else 2 if n < 16384 else 3 if n < 2097152 else 4


# ---------------------------------------------------------------- independent parser

def read_vbi(buf: bytes, i: int) -> tuple[int, int]:
    """Variable Byte Integer at buf[i]: (value, index after). Minimal encoding checked."""
    value, mult, start = 0, 1, i
    while True:
        byte = buf[i]
        i += 1
        value += (byte & 127) * mult
        if byte < 128:
            break
        mult *= 128
        assert i - start < 4, "Variable Byte Integer longer than 4 bytes"
    assert i - start == vbi_size(value), "Variable Byte Integer not minimally encoded"
    return value, i


def split_packets(data: bytes) -> list:
    """Control packets in `data`: (first byte, Remaining Length, header size, body)."""
    out, i = [], 0
    while i < len(data):
        rl, j = read_vbi(data, i + 1)
        assert j + rl <= len(data), "packet runs past the end of the output"
        out.append((data[i], rl, j - i, data[j:j + rl]))
        i = j + rl
    return out


def string(body: bytes, i: int) -> tuple[bytes, int]:
    n = body[i] << 8 | body[i + 1]
    assert i + 2 + n <= len(body)
    return body[i + 2:i + 2 + n], i + 2 + n


def parse_publish(first: int, body: bytes, level: int) -> dict:
    """3.3 PUBLISH from the specification: flags, topic, packet id, properties, payload."""
    assert first >> 4 == 3
    qos = first >> 1 & 3
    topic, i = string(body, 0)
    p = {"dup": bool(first & 8), "qos": qos, "retain": bool(first & 1), "topic": topic,
         "pid": None, "props": {}, "sub_ids": []}
    if qos:
        p["pid"] = body[i] << 8 | body[i + 1]
        i += 2
    if level == 5:
        n, i = read_vbi(body, i)
        end = i + n
        props = p["props"]
        while i < end:
            ident = body[i]  # every PUBLISH property identifier is below 128: one byte
            i += 1
            assert ident not in props or ident in (0x0B, 0x26), f"property {ident:#x} twice"
            if ident == 0x01:  # Payload Format Indicator
                props[ident], i = body[i], i + 1
            elif ident == 0x02:  # Message Expiry Interval
                props[ident], i = int.from_bytes(body[i:i + 4], "big"), i + 4
            elif ident in (0x03, 0x08, 0x09):  # Content Type, Response Topic, Correlation Data
                props[ident], i = string(body, i)
            elif ident == 0x0B:  # Subscription Identifier, once per matching subscription
                sid, i = read_vbi(body, i)
                p["sub_ids"].append(sid)
            elif ident == 0x23:  # Topic Alias
                props[ident], i = body[i] << 8 | body[i + 1], i + 2
            elif ident == 0x26:  # User Property
                k, i = string(body, i)
                v, i = string(body, i)
                props.setdefault(ident, []).append((k, v))
            else:
                raise AssertionError(f"property {ident:#x} not allowed in PUBLISH")
        assert i == end, "property block length does not match its content"
    p["payload"] = body[i:]
    return p


# ---------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    sub_level: int
    pub_level: int
    msg_qos: int
    sub_qos: int
    retain: bool
    alias: bool       # the subscriber allows topic aliases (v5)
    sub_ids: tuple    # subscription identifiers of the matching subscriptions (v5)
    expiry: bool      # the message has a Message Expiry Interval (v5 publisher)
    target: int       # Remaining Length of the first outgoing form
    topic_len: int    # topic name length in bytes
    utf8: bool        # topic of two-byte characters
    filler: int       # bytes of publisher properties forwarded as they are

    @property
    def qos(self) -> int:
        return min(self.msg_qos, self.sub_qos)

    def added(self, alias: bool) -> int:
        """Bytes of properties the broker adds for this subscriber."""
        return ((5 if self.expiry else 0) + (3 if alias else 0)
                + sum(1 + vbi_size(s) for s in self.sub_ids))

    def rl(self, topic_len: int, alias: bool, payload: int) -> int:
        """Remaining Length of an outgoing form (3.3.2, 3.3.3)."""
        n = 2 + topic_len + (2 if self.qos else 0) + payload
        if self.sub_level == 5:
            pb = self.filler + self.added(alias)
            n += vbi_size(pb) + pb
        return n

    def payload_for(self, topic_len: int, alias: bool) -> int:
        """The payload size that puts that form's Remaining Length on `target`."""
        return self.target - self.rl(topic_len, alias, 0)


@st.composite
def cases(draw):
    sub_level = draw(st.sampled_from((4, 5)))
    pub_level = draw(st.sampled_from((4, 5)))
    v5 = sub_level == 5
    msg_qos, sub_qos = draw(st.sampled_from((0, 1, 2))), draw(st.sampled_from((0, 1, 2)))
    alias = v5 and draw(st.booleans())
    sub_ids = tuple(draw(st.lists(st.sampled_from(SUB_IDS), max_size=2, unique=True))) if v5 else ()
    expiry = pub_level == 5 and draw(st.booleans())
    target = draw(st.sampled_from(BOUNDS)) + draw(st.sampled_from(DELTAS))
    c = Case(sub_level, pub_level, msg_qos, sub_qos, draw(st.booleans()), alias, sub_ids, expiry,
             target, 0, draw(st.booleans()), 0)
    if pub_level == 5 and v5:  # a property block length near a boundary, when it fits
        added = c.added(alias)
        room = c.payload_for(1, alias) + vbi_size(added) + added
        near = [pb for pb in PB_TARGETS
                if pb >= added and pb - added != 1 and vbi_size(pb) + pb <= room]
        if not near or not draw(st.booleans()):
            near = [added, added + 2, added + 3]  # nothing or little forwarded
        c = replace(c, filler=draw(st.sampled_from(near)) - added)
    elif pub_level == 5:  # properties a 3.1.1 subscriber must not get
        c = replace(c, filler=draw(st.sampled_from((0, 2, 130))))
    room = c.payload_for(0, alias)  # what the topic may take
    c = replace(c, topic_len=draw(st.sampled_from([n for n in TOPIC_LENS if n <= room])))
    return c


def filler_props(n: int) -> dict:
    """Publisher properties of exactly n bytes (n != 1): User Properties of up to 65,540
    bytes, then Correlation Data (3 + length) or a Payload Format Indicator (2)."""
    props, users = {}, []
    while n > 3 + 65535:
        chunk = min(5 + 65535, n - 3)
        users.append(("k", "u" * (chunk - 6)))
        n -= chunk
    if n >= 3:
        props[PR.CORRELATION_DATA] = b"\x80" * (n - 3)  # bytes that look like VBI continuations
    elif n == 2:
        props[PR.PAYLOAD_FORMAT_INDICATOR] = 0
    if users:
        props[PR.USER_PROPERTY] = users
    return props


def payload(k: int, n: int) -> bytes:
    """n bytes that differ per message and per offset (a shifted byte shows)."""
    return (bytes(range(k, 256)) + bytes(range(256)) * (n // 256 + 1))[:n]


# ---------------------------------------------------------------- the broker side

class Peer:
    """A client driven with bytes; what the broker writes is parsed by split_packets."""

    def __init__(self, broker, level: int):
        self.conn = Connection(broker)
        self.level = level

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def read(self) -> list:
        return split_packets(b"".join(bytes(x) for x in self.conn.take_output()))

    def publishes(self) -> list:
        return [(rl, hdr, parse_publish(first, body, self.level))
                for first, rl, hdr, body in self.read() if first >> 4 == 3]

    def connack_then_publishes(self) -> tuple[int, list]:
        packets = self.read()
        first, _, _, body = packets[0]
        assert first == 0x20 and all(f >> 4 == 3 for f, *_ in packets[1:])
        return body[0] & 1, [(rl, hdr, parse_publish(f, b, self.level)) for f, rl, hdr, b in packets[1:]]


def connect_subscriber(b, c: Case, cid: str, clean: bool) -> Peer:
    s = Peer(b, c.sub_level)
    props = None
    if c.sub_level == 5:
        props = {PR.SESSION_EXPIRY_INTERVAL: 600}
        if c.alias:
            props[PR.TOPIC_ALIAS_MAXIMUM] = 4
    s.send(encode(P.Connect(cid, c.sub_level, clean_start=clean, keep_alive=0, properties=props),
                  c.sub_level))
    return s


def subscribe(s: Peer, c: Case, topic: str) -> None:
    """One subscription per identifier (the exact topic, then '#'), so one message carries
    them all [MQTT-3.3.4-3]; Retain As Published so the RETAIN flag is forwarded (v5)."""
    o = P.SubscriptionOptions(c.sub_qos, False, c.sub_level == 5)
    filters = [topic, "#"][:max(1, len(c.sub_ids))]
    for i, f in enumerate(filters):
        props = {PR.SUBSCRIPTION_IDENTIFIER: [c.sub_ids[i]]} if i < len(c.sub_ids) else None
        s.send(encode(P.Subscribe(1 + i, [(f, o)], props), c.sub_level))


def ack_all(s: Peer, forms: list) -> None:
    """Acknowledge by the packet ids read from the wire; QoS 2 must get the PUBREL back."""
    for _, _, p in forms:
        pid = p["pid"]
        if p["qos"] == 1:
            s.send(bytes((0x40, 2, pid >> 8, pid & 255)))
        elif p["qos"] == 2:
            s.send(bytes((0x50, 2, pid >> 8, pid & 255)))
            (first, rl, _, body), = s.read()
            assert first == 0x62 and body[:2] == bytes((pid >> 8, pid & 255)), "PUBREL"
            s.send(bytes((0x70, 2, pid >> 8, pid & 255)))


def check(form, c: Case, level: int, topic: bytes, alias: int | None, body: bytes, *,
          dup: bool, retain: bool, pub_props: dict, session, rl: int | None = None) -> None:
    got_rl, hdr, p = form
    assert hdr == 1 + vbi_size(got_rl)
    assert got_rl == (rl if rl is not None else c.rl(len(topic), bool(alias), len(body)))
    assert (p["qos"], p["dup"], p["retain"]) == (c.qos, dup, retain)
    assert p["topic"] == topic
    assert p["payload"] == body
    if c.qos:
        # the packet id patched in is the one the session holds this message under
        assert p["pid"] and session.inflight_out[p["pid"]].msg.payload == body
    else:
        assert p["pid"] is None
    if level == 5:
        want = {k: ([(a.encode(), b.encode()) for a, b in v] if k == PR.USER_PROPERTY else v)
                for k, v in pub_props.items()}
        if c.expiry:
            want[PR.MESSAGE_EXPIRY_INTERVAL] = EXPIRY
        if alias:
            want[PR.TOPIC_ALIAS] = alias
        assert p["props"] == want
        assert sorted(p["sub_ids"]) == sorted(c.sub_ids)
    else:
        assert p["props"] == {} and p["sub_ids"] == []


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


def roundtrip(c: Case) -> None:
    assert c.payload_for(c.topic_len, c.alias) >= 0, "no payload size reaches the target"
    clock = Clock()
    # packets up to the 4-byte Remaining Length boundary: above the default size limits
    b = Broker(MQTTConfig(queue_qos0_messages=True, maximum_packet_size=268435455,
                          max_retained_message_size=0, max_user_property_bytes=0,
                          max_user_properties=0), clock=clock, wall=clock)
    v5 = c.sub_level == 5
    topic = "é" * (c.topic_len // 2) + "t" * (c.topic_len % 2) if c.utf8 else "t" * c.topic_len
    tb = topic.encode()
    assert len(tb) == c.topic_len
    pub_props = filler_props(c.filler) if c.pub_level == 5 else {}
    fwd = pub_props if v5 else {}
    sent_props = dict(pub_props)
    if c.expiry:
        sent_props[PR.MESSAGE_EXPIRY_INTERVAL] = EXPIRY

    sub = connect_subscriber(b, c, "s", clean=v5)  # v5: expiry 600; 3.1.1: clean session 0
    subscribe(sub, c, topic)
    assert [f >> 4 for f, *_ in sub.read()] == [2] + [9] * max(1, len(c.sub_ids))
    session = b.sessions["s"]
    pub = Peer(b, c.pub_level)
    pub.send(encode(P.Connect("p", c.pub_level), c.pub_level))

    def publish(k: int, n: int) -> bytes:
        body = payload(k, n)
        pub.send(encode(P.Publish(topic, body, c.msg_qos, c.retain, False, k if c.msg_qos else None,
                                  sent_props or None), c.pub_level))
        return body

    live_retain = c.retain and v5  # Retain As Published (v5); 3.1.1 forwards RETAIN=0
    alias = 1 if c.alias else None
    # 1. live: topic (and a new alias), on the target Remaining Length
    m1 = publish(1, c.payload_for(c.topic_len, c.alias))
    forms = sub.publishes()
    assert len(forms) == 1
    check(forms[0], c, c.sub_level, tb, alias, m1, dup=False, retain=live_retain, pub_props=fwd,
          session=session, rl=c.target)
    sent = [m1]
    # 2. live, alias only: empty topic [MQTT-3.3.2-12]
    if c.alias:
        m2 = publish(2, c.payload_for(0, True))
        (f2,) = sub.publishes()
        check(f2, c, c.sub_level, b"", 1, m2, dup=False, retain=live_retain, pub_props=fwd,
              session=session, rl=c.target)
        sent.append(m2)
    # 3. offline: unacknowledged messages resent with DUP=1 [MQTT-4.4.0-1] (no alias: aliases
    #    end with the connection [MQTT-3.3.2-7]), then the queued one, on the target again
    sub.conn.connection_lost()
    m3 = publish(3, c.payload_for(c.topic_len, c.alias))
    sub = connect_subscriber(b, c, "s", clean=False)
    present, forms = sub.connack_then_publishes()
    assert present == 1
    assert len(forms) == (len(sent) if c.qos else 0) + 1
    if c.qos:
        for form, body in zip(forms, sent):
            check(form, c, c.sub_level, tb, None, body, dup=True, retain=live_retain,
                  pub_props=fwd, session=session)
    check(forms[-1], c, c.sub_level, tb, alias, m3, dup=False, retain=live_retain, pub_props=fwd,
          session=session, rl=c.target)
    ack_all(sub, forms)
    assert not session.inflight_out
    # 4. retained: a new subscription gets the last retained message with RETAIN=1
    #    [MQTT-3.3.1-9], carrying that subscription's identifier (paced by Session.pump)
    if c.retain:
        rc = replace(c, sub_ids=c.sub_ids[:1])
        r = connect_subscriber(b, rc, "r", clean=True)
        subscribe(r, rc, topic)
        forms = r.publishes()
        if not m3:  # an empty retained payload deletes the retained message [MQTT-3.3.1-6]
            assert forms == []
            return
        (form,) = forms
        check(form, rc, c.sub_level, tb, alias, m3, dup=False, retain=True, pub_props=fwd,
              session=b.sessions["r"], rl=c.target if len(c.sub_ids) < 2 else None)
        ack_all(r, [form])
        assert not b.sessions["r"].inflight_out


@settings(max_examples=200, deadline=None, database=None)
@given(c=cases())
# the forms that were corrupt: QoS 1/2 at Remaining Length 127 / 16,383 / 2,097,151
@example(c=Case(5, 5, 1, 1, False, False, (), False, 127, 1, False, 0))
@example(c=Case(4, 4, 2, 2, False, False, (), False, 127, 1, False, 0))
@example(c=Case(5, 5, 1, 2, True, True, (1, 128), True, 16383, 127, False, 200))
@example(c=Case(4, 5, 2, 1, False, False, (), False, 16383, 16000, True, 0))
@example(c=Case(5, 4, 2, 2, False, True, (268435455,), False, 2097151, 65535, False, 0))
@example(c=Case(4, 4, 1, 1, True, False, (), False, 2097151, 2, False, 0))
# property blocks of 127 / 16,383 / 2,097,151 bytes (expiry 5 + alias 3 + identifier 128: 3)
@example(c=Case(5, 5, 1, 1, True, True, (128,), True, 16384, 1, False, 127 - 11))
@example(c=Case(5, 5, 2, 2, False, True, (128,), True, 2097151, 127, False, 16383 - 11))
@example(c=Case(5, 5, 1, 2, False, True, (128,), True, 2097160, 1, False, 2097151 - 11))
def test_outgoing_publish_roundtrips_at_vbi_boundaries(c):
    event(f"Remaining Length {c.target}")  # --hypothesis-show-statistics shows the coverage
    pb = c.filler + c.added(c.alias)
    if c.sub_level == 5 and any(abs(pb - b) <= 1 for b in BOUNDS):
        event(f"property block length {pb}")
    roundtrip(c)


@pytest.mark.parametrize("payload_len", [0, 100, 127 - 11, 128, 16_383 - 11, 16_384, 70_000])
@pytest.mark.parametrize("level", [4, 5])
def test_packet_identifier_offset_in_a_received_publish_at_every_remaining_length_size(level, payload_len):
    """Sections 2.2.1 and 3.3.2: the Packet Identifier follows the fixed header (Remaining Length of
    1-4 bytes) and the topic name; publish_pid_offset finds it in the bytes as received, where
    the broker patches each subscriber's id in."""
    raw = encode(P.Publish("a/b/c", b"x" * payload_len, qos=1, packet_id=0xBEEF), level)
    off = P.publish_pid_offset(raw, len(b"a/b/c"))
    assert raw[off:off + 2] == b"\xbe\xef"
