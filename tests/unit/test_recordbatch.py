"""kafka_client/recordbatch.py (vectorised decoding of Kafka v2 record batches) against kafka-python's own
record parser, and sink.history.source.to_arrow (the rows the history job reads) against the record
contract. Property-based: sizes around the varint boundaries, empty and null keys/values, many
headers, null header values, several batches, compression."""
from __future__ import annotations

import struct
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords, MemoryRecordsBuilder

from kafka_client import recordbatch as rb
from kafka_client.headers import H_USER_PREFIX
from sink.history.schema import HEADER_COLUMNS, HEADER_COLUMNS_SCHEMA, KAFKA_SCHEMA


def _ms(t: datetime) -> int:
    """Milliseconds since the epoch, in integers (float timestamps round wrong)."""
    return (t - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


BOUNDARY_SIZES = [0, 1, 63, 64, 65, 127, 128, 8191, 8192, 8193]


def blobs(nullable=True):
    sized = st.sampled_from(BOUNDARY_SIZES).flatmap(
        lambda n: st.binary(min_size=n, max_size=n))
    some = st.one_of(st.binary(max_size=40), sized)
    return st.one_of(st.none(), some) if nullable else some


header_names = st.one_of(
    st.sampled_from([name for name, _ in HEADER_COLUMNS]),
    st.text(max_size=12).map(lambda s: H_USER_PREFIX + s),
    st.text(max_size=20),
    st.sampled_from(["mqtt.qos2", "mqtt.qo", "mqtt.user", "Mqtt.qos", ""]))
headers = st.lists(st.tuples(header_names, blobs()), max_size=30)
records = st.tuples(st.integers(0, 2 ** 41), blobs(), blobs(), headers)
batches = st.lists(st.lists(records, min_size=1, max_size=20), min_size=1, max_size=4)


def build(batch_list, compression=0, base=0) -> bytes:
    """Batches as a broker stores them: offsets from ``base`` (the baseOffset field is set the
    way a broker does: it is outside the CRC)."""
    out, offset = [], base
    for recs in batch_list:
        b = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 30)
        for ts, key, value, hdrs in recs:
            b.append(timestamp=ts, key=key, value=value, headers=hdrs)
        b.close()
        out.append(struct.pack(">q", offset) + bytes(b.buffer())[8:])
        offset += len(recs)
    return b"".join(out)


def reference(raw: bytes) -> list:
    """kafka-python's view: (offset, timestamp, timestamp_type, key, value, headers)."""
    out = []
    for batch in MemoryRecords(raw):
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
                        [(k, v) for k, v in r.headers]))
    return out


def ours(d: rb.Decoded) -> list:
    data = d.data.tobytes()

    def field(start, length):
        return None if length < 0 else data[start:start + length]

    out = []
    for i in range(len(d)):
        hs = range(d.hoff[i], d.hoff[i + 1])
        out.append((int(d.offset[i]), int(d.timestamp[i]), int(d.ts_type[i]),
                    field(d.key[0][i], d.key[1][i]), field(d.value[0][i], d.value[1][i]),
                    [(field(d.hkey[0][h], d.hkey[1][h]).decode(),
                      field(d.hvalue[0][h], d.hvalue[1][h])) for h in hs]))
    return out


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(batches, st.sampled_from([0, 1]), st.integers(0, 2 ** 40))
def test_decode_matches_kafka_python(batch_list, compression, base):
    raw = build(batch_list, compression, base)
    d = rb.decode(raw)
    assert ours(d) == reference(raw)
    assert d.next_offset == base + sum(len(b) for b in batch_list)


@SETTINGS
@given(batches, st.integers(1, 200))
def test_truncated_fetch_keeps_whole_batches(batch_list, cut):
    """Kafka may cut the last batch of a fetch: only whole batches are decoded."""
    raw = build(batch_list)
    cut = min(cut, len(raw))
    whole = reference(raw[:-cut]) if cut < len(raw) else []
    assert ours(rb.decode(raw[:-cut])) == whole


@SETTINGS
@given(batches, st.data())
def test_corrupt_bytes_raise_a_clear_error(batch_list, data):
    """Any byte changed: either decoded (a change that still parses) or CorruptBatchError,
    never an IndexError or a crash (the CRC check is what normally catches it)."""
    raw = bytearray(build(batch_list))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    start = 0
    while start + 12 + struct.unpack_from(">i", build(batch_list), start + 8)[0] <= i:
        start += 12 + struct.unpack_from(">i", build(batch_list), start + 8)[0]
    if i - start >= 17:  # the CRC, or a byte it covers
        with pytest.raises(rb.CorruptBatchError):
            rb.decode(bytes(raw), check_crcs=True)
    try:
        rb.decode(bytes(raw), check_crcs=False)
    except rb.CorruptBatchError:
        pass


def test_huge_header_count_is_corrupt_not_a_huge_allocation():
    """A header count the record has no bytes for (here ~3e9, found by the property above) is
    refused before anything is allocated for it, with the CRC check off too."""
    raw = bytearray(build([[(0, None, None, [("mqtt.user.", None)]),
                            (0, None, None, [("\x80\x800", None)])]]))
    raw[82] = 128
    with pytest.raises(rb.CorruptBatchError, match="more headers than the record"):
        rb.decode(bytes(raw), check_crcs=False)


def test_old_message_format_is_refused_with_a_hint():
    b = MemoryRecordsBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    b.append(timestamp=1, key=b"k", value=b"v", headers=[])
    b.close()
    with pytest.raises(rb.CorruptBatchError, match="only v2"):
        rb.decode(b.buffer())


def _to_arrow(d, columns, ingested_ms=0):
    from pyspark.sql.pandas.types import to_arrow_schema

    from sink.history.source import to_arrow
    schema = to_arrow_schema(HEADER_COLUMNS_SCHEMA if columns else KAFKA_SCHEMA, timezone="UTC")
    return to_arrow(pa, schema, d, "mqtt.messages", 3, columns, ingested_ms).to_pylist()


@SETTINGS
@given(batches)
def test_arrow_rows_follow_the_record_contract(batch_list):
    raw = build(batch_list)
    ref = reference(raw)
    d = rb.decode(raw)
    kafka_rows = _to_arrow(d, columns=False)
    column_rows = _to_arrow(d, columns=True, ingested_ms=1_763_800_000_123)
    for (offset, ts, ts_type, key, value, hdrs), k, c in zip(ref, kafka_rows, column_rows,
                                                             strict=True):
        for row in (k, c):
            assert (row["offset"], row["key"], row["value"], row["partition"], row["topic"],
                    row["timestampType"]) == (offset, key, value, 3, "mqtt.messages", ts_type)
            assert _ms(row["timestamp"]) == ts
        assert [(h["key"], h["value"]) for h in k["headers"]] == hdrs
        for name, col in HEADER_COLUMNS:  # the first header of that name, like the SQL
            values = [v for n, v in hdrs if n == name]
            assert c[col] == (values[0] if values else None)
        assert [(u["key"], u["value"]) for u in c["user_headers"]] == [
            (n[len(H_USER_PREFIX):], v) for n, v in hdrs if n.startswith(H_USER_PREFIX)]
        assert _ms(c["ingested_at"]) == 1_763_800_000_123


@SETTINGS
@given(batches, st.data())
def test_take_keeps_the_chosen_records_with_their_headers(batch_list, data):
    d = rb.decode(build(batch_list))
    mask = __import__("numpy").array(data.draw(st.lists(st.booleans(), min_size=len(d),
                                                        max_size=len(d))), bool)
    assert ours(d.take(mask)) == [r for r, keep in zip(ours(d), mask) if keep]
