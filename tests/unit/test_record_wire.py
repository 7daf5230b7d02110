"""Kafka v2 record bodies (encoded once in the broker) and RecordBatches (built by the forwarder),
checked against kafka-python's own parser, with sizes around the varint boundaries."""
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from kafka_client.record import (
    SinkRecord,
    body_key,
    build_batch,
    decode_body,
    decode_entry,
    encode_body,
    encode_entry,
    encode_record,
    entry_fields,
    entry_parts,
    entry_shard,
    read_zz_varint,
    to_kafka,
    zz_varint,
)

# lengths around the 1-byte / 2-byte / 3-byte varint boundaries (zigzag: 63/64, 8191/8192)
SIZES = st.sampled_from([0, 1, 63, 64, 127, 128, 255, 8191, 8192, 20000])


@st.composite
def blobs(draw):
    return draw(st.one_of(st.binary(max_size=300), SIZES.map(lambda n: bytes([n % 251]) * n)))


names = st.text(min_size=0, max_size=140).filter(lambda s: "\x00" not in s or True)
headers = st.lists(st.tuples(names, blobs()), max_size=12)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_zigzag_varint_round_trip(n):
    v, o = read_zz_varint(zz_varint(n), 0)
    assert (v, o) == (n, len(zz_varint(n)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(blobs(), blobs(), headers, st.integers(0, 1 << 42)), min_size=1, max_size=20))
def test_batch_parses_with_kafka_python(recs):
    bodies = [(ts, encode_body(k, v, h)) for k, v, h, ts in recs]
    buf = build_batch(bodies)
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    assert batch.magic == 2 and batch.compression_type == 0
    got = list(batch)
    assert len(got) == len(recs)
    for i, (r, (k, v, h, ts)) in enumerate(zip(got, recs)):
        assert r.offset == i
        assert r.timestamp == ts
        assert r.key == k and r.value == v      # empty stays empty (length 0, not null)
        assert [(n, bytes(x)) for n, x in r.headers] == [(n, bytes(x)) for n, x in h]
    # also as a fetch response would carry it (two batches back to back)
    mr = MemoryRecords(buf + buf)
    assert mr.next_batch() is not None and mr.next_batch() is not None


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=70), blobs(), blobs(), headers, st.integers(0, 1 << 42))
def test_entry_round_trip(kt, k, v, h, ts):
    buf = encode_entry(kt, k, v, h, ts)
    assert decode_entry(buf) == (kt, k, v, h, ts)
    kt2, ts2, body = entry_parts(buf)
    assert (kt2, ts2) == (kt, ts) and body_key(body) == k and decode_body(body) == (k, v, h)
    assert 0 <= entry_shard(buf, 3) < 3
    assert entry_fields(buf) == (kt.encode(), ts, bytes(body))


@st.composite
def sink_records(draw):
    opt = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    return SinkRecord(
        topic=draw(st.text(min_size=1, max_size=130)), payload=draw(blobs()), qos=draw(st.integers(0, 2)),
        retain=draw(st.booleans()), client_id=draw(st.text(max_size=130)), username=opt(st.text(max_size=70)),
        protocol=draw(st.sampled_from([3, 4, 5])), accepted_at_ms=draw(st.integers(0, 1 << 42)),
        payload_format=opt(st.integers(0, 1)), content_type=opt(st.text(max_size=130)),
        response_topic=opt(st.text(max_size=70)), correlation_data=opt(blobs()),
        message_expiry=opt(st.integers(0, 1 << 32)),
        user_properties=opt(st.lists(st.tuples(st.text(max_size=70), st.text(max_size=140)), max_size=5)),
        message_id=draw(st.text(max_size=40)))


@settings(max_examples=200, deadline=None)
@given(sink_records(), st.sampled_from(["mqtt.messages", "t"]))
def test_encode_record_is_the_contract(rec, kt):
    """The broker's fast encoder produces exactly the contract's record (to_kafka)."""
    buf = encode_record(rec, kt)
    key, value, hdrs, ts = to_kafka(rec)
    assert buf == encode_entry(kt, key, value, hdrs, ts)
    r = next(iter(DefaultRecordBatch(build_batch([(ts, entry_parts(buf)[2])]))))
    assert (r.key, r.value, r.timestamp) == (key, value, ts)
    assert [(n, bytes(x)) for n, x in r.headers] == hdrs


def test_version_1_entries_are_still_read():
    import struct
    kt, key, value = b"mqtt.messages", b"a/b", b"xyz"
    hdrs = [("mqtt.message_id", b"m1"), ("mqtt.qos", b"1")]
    parts = [struct.pack("<BqHIIH", 1, 77, len(kt), len(key), len(value), len(hdrs)), kt, key, value]
    for n, v in hdrs:
        parts += [struct.pack("<HI", len(n), len(v)), n.encode(), v]
    buf = b"".join(parts)
    assert decode_entry(buf) == ("mqtt.messages", key, value, hdrs, 77)
    kt2, ts, body = entry_parts(buf)
    assert (kt2, ts) == ("mqtt.messages", 77) and decode_body(body) == (key, value, hdrs)
    assert entry_shard(buf, 4) == entry_shard(encode_entry("mqtt.messages", key, value, hdrs, 77), 4)
    assert entry_fields(buf) == entry_fields(encode_entry("mqtt.messages", key, value, hdrs, 77))
