"""Codec tests from byte vectors, including the captured packets in seeds/003."""
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode, encode_ack, encode_publish
from broker.protocol.errors import MalformedPacket, ProtocolError
from broker.protocol.properties import decode_vbi, encode_vbi


def h(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", "").replace("\n", ""))


def decode_one(data: bytes, level=P.MQTT_5):
    pkts, err = Decoder(level).feed(data)
    if err:
        raise err
    assert len(pkts) == 1
    return pkts[0]


# seeds/003: QoS 0 PUBLISH with Message Expiry Interval 300 and Response Topic "response"
SEED_PUBLISH_QOS0 = h("""30 31 00 07 72 65 71 75 65 73 74 10 02 00 00 01 2c 08 00 08
72 65 73 70 6f 6e 73 65 54 68 69 73 20 69 73 20 61 20 51 6f
53 20 30 20 6d 65 73 73 61 67 65""")


def test_seed_publish_qos0_decodes():
    p = decode_one(SEED_PUBLISH_QOS0)
    assert p.type == P.PUBLISH and p.qos == 0 and not p.retain and not p.dup
    assert p.topic == "request"
    assert p.packet_id is None
    assert p.properties == {PR.MESSAGE_EXPIRY_INTERVAL: 300, PR.RESPONSE_TOPIC: "response"}
    assert p.payload == b"This is a QoS 0 message"


def test_seed_publish_qos0_encodes_byte_exact():
    p = P.Publish("request", b"This is a QoS 0 message", 0, False, False, None,
                  {PR.MESSAGE_EXPIRY_INTERVAL: 300, PR.RESPONSE_TOPIC: "response"})
    assert encode(p) == SEED_PUBLISH_QOS0


def test_seed_puback_no_matching_subscribers():
    # seeds/003: PUBACK (40 04 64 4a 10 00), Reason Code 0x10 and empty properties
    data = h("40 04 64 4a 10 00")
    a = decode_one(data)
    assert (a.type, a.packet_id, a.reason_code, a.properties) == (P.PUBACK, 0x644A, 0x10, None)
    assert encode_ack(P.PUBACK, 0x644A, rc.NO_MATCHING_SUBSCRIBERS) == data


def test_seed_qos2_flow():
    # seeds/003: PUBREC (50 04 11 c2 10 00), PUBREL (62 03 11 c2 00), PUBCOMP (70 04 11 c2 00 00)
    rec = decode_one(h("50 04 11 c2 10 00"))
    assert (rec.type, rec.packet_id, rec.reason_code) == (P.PUBREC, 0x11C2, 0x10)
    rel = decode_one(h("62 03 11 c2 00"))
    assert (rel.type, rel.packet_id, rel.reason_code) == (P.PUBREL, 0x11C2, 0)
    comp = decode_one(h("70 04 11 c2 00 00"))
    assert (comp.type, comp.packet_id, comp.reason_code) == (P.PUBCOMP, 0x11C2, 0)
    assert encode_ack(P.PUBREC, 0x11C2, 0x10) == h("50 04 11 c2 10 00")
    # success may use the short form (3.4.2.1)
    assert encode_ack(P.PUBCOMP, 0x11C2, 0) == h("70 02 11 c2")


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


def test_qos3_and_qos0_dup_are_malformed():  # [MQTT-3.3.1-4], [MQTT-3.3.1-2]
    for first in (0x36, 0x38):
        pkts, err = Decoder().feed(bytes((first,)) + h("04 00 01 61 00"))
        assert isinstance(err, MalformedPacket) and err.reason_code == rc.MALFORMED_PACKET


def test_invalid_utf8_and_null_in_topic_are_malformed():
    for topic in (b"\xff\xfe", b"a\x00b", b"\xed\xa0\x80"):  # bad byte, U+0000, a surrogate
        body = len(topic).to_bytes(2, "big") + topic + b"\x00"
        pkts, err = Decoder().feed(bytes((0x30, len(body))) + body)
        assert isinstance(err, MalformedPacket), topic


def test_property_included_twice_is_protocol_error():
    # Content Type twice
    props = h("03 00 01 61 03 00 01 62")
    body = h("00 01 61") + bytes((len(props),)) + props
    pkts, err = Decoder().feed(bytes((0x30, len(body))) + body)
    assert isinstance(err, ProtocolError) and err.reason_code == rc.PROTOCOL_ERROR


def test_user_properties_keep_order_and_duplicates():
    up = [("k", "1"), ("a", "x"), ("k", "2"), ("k", "1")]
    p = P.Publish("t", b"", 0, properties={PR.USER_PROPERTY: up, PR.CORRELATION_DATA: b"\x00\xff",
                                            PR.CONTENT_TYPE: "text/plain",
                                            PR.PAYLOAD_FORMAT_INDICATOR: 1})
    back = decode_one(encode(p))
    assert back.properties[PR.USER_PROPERTY] == up
    assert back.properties[PR.CORRELATION_DATA] == b"\x00\xff"
    assert back == p


def test_property_not_allowed_in_packet_is_malformed():
    # Session Expiry Interval (0x11) inside a PUBLISH
    props = h("11 00 00 00 01")
    body = h("00 01 61") + bytes((len(props),)) + props
    pkts, err = Decoder().feed(bytes((0x30, len(body))) + body)
    assert isinstance(err, MalformedPacket)


def test_fixed_header_flags_checked():
    # PUBREL must have flags 0010 [MQTT-3.6.1-1]; SUBSCRIBE 0010 [MQTT-3.8.1-1]
    for data in (h("60 02 00 01"), h("80 06 00 01 00 01 61 00"), h("c1 00")):
        pkts, err = Decoder().feed(data)
        assert isinstance(err, MalformedPacket), data


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


def test_connect_reserved_flag_is_malformed():  # [MQTT-3.1.2-3]
    c = bytearray(encode(P.Connect("x", 4), 4))
    c[9] |= 1
    pkts, err = Decoder(4).feed(bytes(c))
    assert isinstance(err, MalformedPacket)


def test_connect_unsupported_level():
    c = bytearray(encode(P.Connect("x", 4), 4))
    c[8] = 6
    pkts, err = Decoder(4).feed(bytes(c))
    assert err.reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION


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
    # 3.1.1 SUBSCRIBE with reserved option bits set is malformed
    pkts, err = Decoder(4).feed(h("82 08 00 01 00 03 61 2f 62 04"))
    assert isinstance(err, MalformedPacket)


def test_subscription_identifier_zero_is_protocol_error():
    body = h("00 01 02 0b 00 00 01 61 00")
    pkts, err = Decoder().feed(bytes((0x82, len(body))) + body)
    assert isinstance(err, ProtocolError)


def test_v311_publish_has_no_properties():
    data = encode(P.Publish("a", b"\x01\x02", 1, True, True, 10), 4)
    assert data == h("3b 07 00 01 61 00 0a 01 02")
    assert decode_one(data, 4) == P.Publish("a", b"\x01\x02", 1, True, True, 10)


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
