"""kafka_client/recordscan.py (the cluster's keys-first reading of fetched Kafka v2 record batches)
against kafka-python's own record parser: offsets, timestamps, keys, values and headers of every
record, several batches, compression, a fetch cut inside its last batch or starting inside its
first, control batches skipped; malformed bytes raise CorruptBatchError, never another error."""
from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st
from kafka.record import MemoryRecordsBuilder

from kafka_client.recordbatch import CorruptBatchError
from kafka_client.recordscan import Scanned
from tests.unit.test_recordbatch import SETTINGS, batches, build, reference


def everything(s: Scanned) -> list:
    out = []
    for i in s.indexes():
        off, key, value, headers, ts = s.record(i)
        assert key == s.key(i) and s.offsets[i] == off
        out.append((off, ts, key, value, headers))
    return out


def as_reference(raw: bytes) -> list:
    return [(off, ts, key, value, hs) for off, ts, _, key, value, hs in reference(raw)]


@SETTINGS
@given(batches, st.sampled_from([0, 1]), st.integers(0, 2 ** 40))
def test_scan_matches_kafka_python(batch_list, compression, base):
    raw = build(batch_list, compression, base)
    s = Scanned(raw)
    n = sum(len(b) for b in batch_list)
    assert s.end == s.next_offset == base + n  # from the batch headers, before any scan
    assert not s.scanned
    assert everything(s) == as_reference(raw)
    assert [s.topic(i) for i in s.indexes()] == \
        [None if k is None else k.decode(errors="replace") for _, _, _, k, _, _ in reference(raw)]


@SETTINGS
@given(batches, st.integers(0, 2 ** 40), st.data())
def test_since_skips_the_records_before_the_offset_asked_from(batch_list, base, data):
    """A fetch from an offset inside a batch returns the whole batch: the records before it
    are not the reader's."""
    raw = build(batch_list, 0, base)
    n = sum(len(b) for b in batch_list)
    start = data.draw(st.integers(base, base + n - 1))
    s = Scanned(raw).since(start)
    assert everything(s) == [r for r in as_reference(raw) if r[0] >= start]
    assert len(s) == base + n - start


@SETTINGS
@given(batches, st.integers(1, 200))
def test_truncated_fetch_keeps_whole_batches(batch_list, cut):
    raw = build(batch_list)
    cut = min(cut, len(raw))
    whole = as_reference(raw[:-cut]) if cut < len(raw) else []
    s = Scanned(raw[:-cut])
    assert everything(s) == whole
    assert s.end == (whole[-1][0] + 1 if whole else -1)


def test_control_batches_are_skipped_but_move_the_next_offset():
    data = build([[(1, b"k", b"v", [])]])
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    b.append(timestamp=2, key=b"\0\0\0\0", value=b"\0\0\0\0\0\0", headers=[])
    b.close()
    control = bytearray(struct.pack(">q", 1) + bytes(b.buffer())[8:])
    struct.pack_into(">h", control, 21, 0x20)  # attributes: a control batch (CRC not checked)
    s = Scanned(data + bytes(control))
    assert s.next_offset == 2 and s.end == 1
    assert everything(s) == [(0, 1, b"k", b"v", [])]


@SETTINGS
@given(batches, st.data())
def test_corrupt_bytes_raise_a_clear_error(batch_list, data):
    """Any byte changed: read (a change that still parses) or CorruptBatchError, never an
    IndexError or a UnicodeDecodeError (a header name that is not UTF-8 matches no header)."""
    raw = bytearray(build(batch_list))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    try:
        everything(Scanned(bytes(raw)))
    except CorruptBatchError:
        pass
