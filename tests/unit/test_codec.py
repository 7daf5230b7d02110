"""Codec tests: the shared byte fixtures of tests/vectors.py (every packet type, captured
seeds/003 bytes, malformed packets), plus boundaries, properties and incremental decoding."""
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode, encode_ack, encode_publish
from broker.protocol.errors import MalformedPacket
from broker.protocol.properties import decode_vbi, encode_vbi
from tests import vectors as V

h = V.h


def decode_one(data: bytes, level=P.MQTT_5):
    pkts, err = Decoder(level).feed(data)
    if err:
        raise err
    assert len(pkts) == 1
    return pkts[0]


# ---------------------------------------------------------------- the shared byte fixtures

@pytest.mark.parametrize("vec", V.VALID, ids=repr)
def test_vector_decodes_to_its_packet(vec):
    """Every valid fixture (each packet type, 3.1/3.1.1/5.0, captured seeds/003 bytes, edge
    lengths) decodes to the expected packet, whole and byte by byte."""
    assert decode_one(vec.data, vec.level) == vec.packet
    d = Decoder(vec.level)
    got = []
    for i in range(len(vec.data)):
        pkts, err = d.feed(vec.data[i:i + 1])
        assert err is None
        got += pkts
    assert got == [vec.packet] and d.buffered() == 0


@pytest.mark.parametrize("vec", [v for v in V.VALID if v.canonical], ids=repr)
def test_vector_encodes_byte_exact(vec):
    """Where the encoding is canonical, our encoder produces exactly the fixture's bytes."""
    assert encode(vec.packet, vec.level) == vec.data


@pytest.mark.parametrize("vec", [v for v in V.VALID if not v.canonical], ids=repr)
def test_non_canonical_vector_reencodes_to_an_equivalent_form(vec):
    """The long form of a success ack (3.6.2.1, 3.7.2.1): we send the short form, which
    decodes to the same packet."""
    data = encode(vec.packet, vec.level)
    assert data != vec.data and len(data) < len(vec.data)
    assert decode_one(data, vec.level) == vec.packet


@pytest.mark.parametrize("vec", V.MALFORMED, ids=repr)
def test_malformed_vector_reports_its_reason_code(vec):
    """Every malformed fixture is reported (never raised) with the expected error class and
    reason code, also when a valid packet came first in the same read."""
    pkts, err = Decoder(vec.level).feed(vec.data)
    assert pkts == [] and type(err) is vec.error and err.reason_code == vec.reason, err
    if vec.data[0] >> 4 != P.CONNECT:
        pkts, err = Decoder(vec.level).feed(b"\xc0\x00" + vec.data)
        assert pkts == [P.PingReq()] and err.reason_code == vec.reason


def test_every_packet_type_has_a_vector_at_each_level():
    for level in (P.MQTT_311, P.MQTT_5):
        types = {v.data[0] >> 4 for v in V.of(level)}
        assert types == set(range(1, 16 if level == P.MQTT_5 else 15)), level
    assert len(V.CAPTURED) == 5  # all of seeds/003


_STREAMABLE = {lv: [v for v in V.of(lv) if v.data[0] >> 4 != P.CONNECT] for lv in (P.MQTT_311, P.MQTT_5)}


@settings(max_examples=150, deadline=None)
@given(level=st.sampled_from([P.MQTT_311, P.MQTT_5]), data=st.data())
def test_vectors_in_one_stream_cut_anywhere(level, data):
    """Any sequence of fixtures, cut into reads at any points (within or between packets, the
    edge-length ones too), decodes to the fixtures' packets in order."""
    vecs = data.draw(st.lists(st.sampled_from(_STREAMABLE[level]), min_size=1, max_size=6))
    stream = b"".join(x.data for x in vecs)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=8))))
    d = Decoder(level)
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)]):
        pkts, err = d.feed(stream[a:b])
        assert err is None
        got += pkts
    assert got == [x.packet for x in vecs] and d.buffered() == 0


def test_seed_qos1_and_qos2_first_bytes():
    # seeds/003: QoS 1 PUBLISH starts 0x32, QoS 2 starts 0x34
    assert encode_publish(b"request", b"x", 1, False, False, 0x644A, None, 5)[0] == 0x32
    assert encode_publish(b"request", b"x", 2, False, False, 0x11C2, None, 5)[0] == 0x34


# Remaining Length boundaries (1.5.5). 125: a whole packet of exactly 127 bytes.
VBI_TABLE = [(0, "00"), (125, "7d"), (127, "7f"), (128, "80 01"), (16383, "ff 7f"),
             (16384, "80 80 01"), (2097151, "ff ff 7f"), (2097152, "80 80 80 01"),
             (268435455, "ff ff ff 7f")]


@pytest.mark.parametrize("n,enc", VBI_TABLE)
def test_variable_byte_integer(n, enc):
    assert encode_vbi(n) == h(enc)
    assert decode_vbi(h(enc), 0) == (n, len(h(enc)))


@pytest.mark.parametrize("n,enc", VBI_TABLE)
@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_remaining_length_boundaries_roundtrip(n, enc, level):
    """A packet whose Remaining Length is each boundary value encodes with that header,
    decodes whole and split, and survives forwarding (the cached form with its packet id
    patched in: a forwarded PUBLISH at 127 / 16383 / 2097151 used to be corrupt)."""
    from broker.core.message import Message
    if n == 0:
        assert decode_one(h("c0 00"), level) == P.PingReq()
        return
    if n == 268435455:  # the maximum: the header alone is accepted and the body awaited
        d = Decoder(level)
        pkts, err = d.feed(b"\x30" + h(enc) + b"\x00\x01t")
        assert (pkts, err) == ([], None) and d.need == n + 5
        pkts, err = Decoder(level).feed(b"\x30" + h("ff ff ff ff 01"))  # one more byte: malformed
        assert isinstance(err, MalformedPacket)
        return
    fixed = 2 + 1 + 2 + (1 if level == P.MQTT_5 else 0)  # topic "t", packet id, empty properties
    pkt = P.Publish("t", b"p" * (n - fixed), 1, False, False, 0x1234)
    data = encode(pkt, level)
    assert data[0] == 0x32 and data[1:1 + len(h(enc))] == h(enc) and len(data) == 1 + len(h(enc)) + n
    assert decode_one(data, level) == pkt
    d = Decoder(level)
    got = []
    for i in range(0, len(data), 61):
        pkts, err = d.feed(data[i:i + 61])
        assert err is None
        got += pkts
    assert got == [pkt]
    form, off = Message("t", pkt.payload, 1, False, None, None, "c").encoded(level, 1, False, None, None)
    fwd = bytearray(form)
    fwd[off], fwd[off + 1] = 0x12, 0x34
    assert bytes(fwd) == data


def test_variable_byte_integer_five_bytes_is_malformed():
    with pytest.raises(MalformedPacket):
        decode_vbi(h("80 80 80 80 01"), 0)
    pkts, err = Decoder().feed(h("30 80 80 80 80 01"))
    assert pkts == [] and isinstance(err, MalformedPacket)


def test_incremental_decoder_split_and_coalesced():
    a = encode(P.Publish("a/b", b"1" * 300, 1, False, False, 7))
    b = encode(P.PingReq())
    c = encode_ack(P.PUBACK, 9)
    stream = a + b + c
    d = Decoder()
    got = []
    for i in range(0, len(stream), 7):  # 7-byte reads split every packet
        pkts, err = d.feed(stream[i:i + 7])
        assert err is None
        got += pkts
    assert [p.type for p in got] == [P.PUBLISH, P.PINGREQ, P.PUBACK]
    assert got[0].payload == b"1" * 300 and got[0].packet_id == 7
    pkts, err = Decoder().feed(stream)  # all in one read
    assert err is None and [p.type for p in pkts] == [P.PUBLISH, P.PINGREQ, P.PUBACK]


def test_packets_before_an_error_are_returned():
    data = encode(P.PingReq()) + h("32 05 00 01 61 00 00")  # packet id 0 is malformed
    pkts, err = Decoder().feed(data)
    assert [p.type for p in pkts] == [P.PINGREQ]
    assert isinstance(err, MalformedPacket)


def test_user_properties_keep_order_and_duplicates():
    up = [("k", "1"), ("a", "x"), ("k", "2"), ("k", "1")]
    p = P.Publish("t", b"", 0, properties={PR.USER_PROPERTY: up, PR.CORRELATION_DATA: b"\x00\xff",
                                            PR.CONTENT_TYPE: "text/plain",
                                            PR.PAYLOAD_FORMAT_INDICATOR: 1})
    back = decode_one(encode(p))
    assert back.properties[PR.USER_PROPERTY] == up
    assert back.properties[PR.CORRELATION_DATA] == b"\x00\xff"
    assert back == p


def test_packet_too_large():
    d = Decoder(max_packet_size=100)
    pkts, err = d.feed(encode(P.Publish("t", b"x" * 200)))
    assert err is not None and err.reason_code == rc.PACKET_TOO_LARGE


def test_connect_roundtrip_all_levels():
    for level in (P.MQTT_31, P.MQTT_311, P.MQTT_5):
        props = {PR.SESSION_EXPIRY_INTERVAL: 60, PR.RECEIVE_MAXIMUM: 10} if level == 5 else None
        wprops = {PR.WILL_DELAY_INTERVAL: 5, PR.USER_PROPERTY: [("a", "b")]} if level == 5 else None
        c = P.Connect("dev-1", level, clean_start=False, keep_alive=30, username="u",
                      password=b"p\x00w", will=P.Will("w/t", b"bye", 1, True, wprops),
                      properties=props)
        c.protocol_name = "MQIsdp" if level == 3 else "MQTT"
        data = encode(c, level)
        back = decode_one(data, level)
        assert back == c


@pytest.mark.parametrize("pkt", [
    P.Subscribe(3, [("a/+", P.SubscriptionOptions(1, True, True, 2)), ("#", P.SubscriptionOptions())],
                {PR.SUBSCRIPTION_IDENTIFIER: [7]}),
    P.Suback(3, [0, 1, 0x8F]),
    P.Unsubscribe(4, ["a", "b/#"]),
    P.Unsuback(4, [0, 0x11]),
    P.Disconnect(0x04, {PR.REASON_STRING: "bye"}),
    P.Auth(0x18, {PR.AUTHENTICATION_METHOD: "SCRAM"}),
    P.Connack(True, 0, {PR.TOPIC_ALIAS_MAXIMUM: 10}),
    P.PingReq(), P.PingResp(),
])
def test_roundtrip_v5(pkt):
    assert decode_one(encode(pkt)) == pkt


def test_v311_subscribe_and_suback():
    s = P.Subscribe(1, [("a/b", P.SubscriptionOptions(2))])
    assert decode_one(encode(s, 4), 4) == s
    assert encode(P.Suback(1, [0x80]), 4) == h("90 03 00 01 80")
    assert encode(P.Unsuback(1, [0]), 4) == h("b0 02 00 01")


# ---------------------------------------------------------------- incremental decoding

_topics = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
                  min_size=1, max_size=20)
_packets = st.one_of(
    st.builds(lambda t, pl, q, r, pid: P.Publish(t, pl, q, r, False, pid if q else None),
              _topics, st.binary(max_size=3000), st.integers(0, 2), st.booleans(),
              st.integers(1, 65535)),
    st.builds(lambda pid: P.Ack(P.PUBACK, pid), st.integers(1, 65535)),
    st.just(P.PingReq()),
    st.builds(lambda pid, t, q: P.Subscribe(pid, [(t, P.SubscriptionOptions(q))]),
              st.integers(1, 65535), _topics, st.integers(0, 2)),
)


def _decode_all(chunks, level=P.MQTT_5, **kw):
    d = Decoder(level, **kw)
    got = []
    for c in chunks:
        pkts, err = d.feed(c)
        assert err is None, err
        got += pkts
        if any(p.type == P.CONNECT for p in pkts):
            d.connect_accepted()  # as the Connection does once it accepts the CONNECT
    assert d.buffered() == 0
    return got


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pkts=st.lists(_packets, min_size=1, max_size=8), level=st.sampled_from([P.MQTT_311, P.MQTT_5]),
       cuts=st.lists(st.integers(0, 30000), max_size=12), data=st.data())
def test_any_split_decodes_like_the_whole_stream(pkts, level, cuts, data):
    """A CONNECT (under a small pre-CONNECT limit) then packets larger than that limit:
    every way of cutting the stream into reads gives the packets of one whole read."""
    connect = P.Connect("c", level)
    stream = encode(connect, level) + b"".join(encode(p, level) for p in pkts)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0] + points, points + [len(stream)])]
    whole = _decode_all([stream], level, connect_limit=64)
    assert whole[0] == connect and len(whole) == len(pkts) + 1
    assert _decode_all(chunks, level, connect_limit=64) == whole
    assert _decode_all([bytes((b,)) for b in stream[:200]] + [stream[200:]], level) == whole


@settings(max_examples=200, deadline=None)
@given(pkts=st.lists(_packets | st.builds(
           lambda t, n, q: P.Publish(t, b"p" * n, q, False, False, 7 if q else None),
           _topics, st.integers(90, 135), st.integers(0, 2)), min_size=1, max_size=6),
       level=st.sampled_from([P.MQTT_311, P.MQTT_5]))
def test_one_packet_per_read_decodes_like_the_stream(pkts, level):
    """A read holding exactly one packet (the decoder's shortcut for packets up to 129 bytes,
    payloads drawn so that packets fall on both sides of the one-byte Remaining Length) gives
    what the same packets give in one read through the general loop."""
    wires = [encode(P.Connect("c", level), level)] + [encode(p, level) for p in pkts]
    assert _decode_all(wires, level) == _decode_all([b"".join(wires)], level)


@pytest.mark.parametrize("size", [2, 4, 100, 127, 128, 129, 131, 132, 140])  # (no packet has 130 bytes)
def test_one_packet_per_read_respects_the_packet_size_limit(size):
    """[MQTT-3.2.2-15] / 4.13: a packet one byte over the limit is refused (0x95) also when it
    arrives alone in one read; one of exactly the limit is decoded."""
    wires = [encode(P.PingReq(), P.MQTT_5), encode(P.Ack(P.PUBACK, 1), P.MQTT_5)] + \
        [encode(P.Publish("t", b"x" * k, 0, False, False), P.MQTT_5) for k in range(size)]
    wire = next(w for w in wires if len(w) == size)
    pkts, err = Decoder(P.MQTT_5, max_packet_size=size).feed(wire)
    assert err is None and len(pkts) == 1
    pkts, err = Decoder(P.MQTT_5, max_packet_size=size - 1).feed(wire)
    assert pkts == [] and err.reason_code == rc.PACKET_TOO_LARGE


def test_large_packet_in_chunks_is_decoded_with_linear_cost():
    """48 MiB arriving in 64 KiB reads: the bytes the decoder allocates over all reads stay
    a small multiple of the packet (it used to copy the whole buffer on every read: ~18 GB)."""
    size = 48 << 20
    data = encode(P.Publish("big", b"\x00" * (size - 13), 1, False, False, 1), P.MQTT_5)
    chunks = [data[i:i + 65536] for i in range(0, len(data), 65536)]
    d = Decoder()
    allocated = 0
    got = []
    tracemalloc.start()
    try:
        for c in chunks:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            pkts, err = d.feed(c)
            allocated += tracemalloc.get_traced_memory()[1] - before
            assert err is None
            got += pkts
    finally:
        tracemalloc.stop()
    assert len(chunks) == 768 and len(got) == 1 and len(got[0].payload) == size - 13 and len(data) == size
    assert allocated < 3 * len(data), f"feed() allocated {allocated} bytes for a {len(data)}-byte packet"


def test_pre_connect_limit_refuses_a_large_connect_from_its_header():
    d = Decoder(P.MQTT_5, connect_limit=131072)
    start = b"\x10" + encode_vbi(20 << 20) + encode(P.Connect("c", P.MQTT_5))[2:]
    pkts, err = d.feed(start + b"\x00" * 65536)  # the start of a 20 MiB CONNECT
    assert pkts == [] and err.reason_code == rc.PACKET_TOO_LARGE
    assert "max_connect_packet_size" in str(err) and d.buffered() == 0
    # a CONNECT under the limit, then packets up to the normal maximum
    ok = P.Connect("c", P.MQTT_5, will=P.Will("w", b"x" * 65535, 0, False))
    pub = P.Publish("t", b"y" * 300000, 1, False, False, 1)
    assert _decode_all([encode(ok) + encode(pub)[:100], encode(pub)[100:]], connect_limit=131072) == [ok, pub]
    # not accepted yet (password being checked): a large packet is not buffered, even one
    # that began in the CONNECT's read; once accepted the normal maximum applies
    d = Decoder(P.MQTT_5, connect_limit=131072)
    pkts, err = d.feed(encode(ok) + encode(pub)[:100])
    assert pkts == [ok] and err is None
    pkts, err = d.feed(encode(pub)[100:200])
    assert pkts == [] and err.reason_code == rc.PACKET_TOO_LARGE and d.buffered() == 0
    d = Decoder(P.MQTT_5, connect_limit=131072)
    assert d.feed(encode(ok)) == ([ok], None)
    pkts, err = d.feed(encode(pub))
    assert pkts == [] and err.reason_code == rc.PACKET_TOO_LARGE
    d = Decoder(P.MQTT_5, connect_limit=131072)
    d.feed(encode(ok))
    d.connect_accepted()
    assert d.feed(encode(pub)[:1000]) == ([], None) and d.feed(encode(pub)[1000:]) == ([pub], None)


# ---------------------------------------------------------------- MQTT 3.1's DUP flag

@pytest.mark.parametrize("first, body, want", [
    (0x6A, "00 07", P.Ack(P.PUBREL, 7, 0, None)),
    (0x8A, "00 01 00 01 61 01", P.Subscribe(1, [("a", P.SubscriptionOptions(1))])),
    (0xAA, "00 02 00 01 61", P.Unsubscribe(2, ["a"])),
])
def test_mqtt31_resent_pubrel_subscribe_unsubscribe_may_carry_dup(first, body, want):
    """MQTT 3.1 (MQIsdp, level 3) sets DUP on a PUBREL, SUBSCRIBE or UNSUBSCRIBE it sends again
    (Mosquitto's test/broker 03-publish-b2c-qos2 sends 0x6A): accepted at level 3, and still
    malformed at 3.1.1 and 5, whose flags are fixed [MQTT-2.1.3-1], [MQTT-3.6.1-1]."""
    data = bytes((first,)) + bytes((len(h(body)),)) + h(body)
    assert decode_one(data, P.MQTT_31) == want
    for level in (P.MQTT_311, P.MQTT_5):
        with pytest.raises(MalformedPacket):
            decode_one(data, level)
