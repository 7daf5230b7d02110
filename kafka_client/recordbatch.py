"""Kafka v2 record batches (the bytes of a Fetch response) -> columns, with little per-record Python.

kafka-python parses every record, header and field in Python and builds a ConsumerRecord per
record (about 20 us each with our six headers). The history job needs none of those objects:
it needs columns. Here the only per-record Python is one hop over each record's length varint
(to find where it starts); every field (timestamp and offset deltas, key, value, each header) is
then decoded with numpy for all records at once, and the Arrow arrays are gathered straight from
the fetched bytes.

Format (https://kafka.apache.org/documentation/#recordbatch), all integers big-endian:

    RecordBatch: baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 (=2) |
                 crc u32 (CRC-32C of attributes..end) | attributes i16 | lastOffsetDelta i32 |
                 baseTimestamp i64 | maxTimestamp i64 | producerId i64 | producerEpoch i16 |
                 baseSequence i32 | recordCount i32 | records (compressed as a whole if
                 attributes & 7)
    Record:      length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
                 keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value |
                 headerCount varint | headers: keyLength varint | key | valueLength varint | value

Varints are zigzag-encoded (protobuf style). Control batches (transaction markers) carry no
data records and are skipped, as Kafka consumers do. Message format v0/v1 (magic 0/1, removed
in Kafka 4) is not supported: a clear error says so.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
LOG_OVERHEAD = 12  # baseOffset + batchLength: what batchLength does not count
CRC_START = 21     # the CRC covers attributes (offset 21) .. the end of the batch
CODEC_MASK, TIMESTAMP_TYPE_MASK, CONTROL_MASK = 0x07, 0x08, 0x20
LOG_APPEND_TIME = 1


class CorruptBatchError(ValueError):
    """The fetched bytes are not valid v2 record batches."""


@dataclass
class Decoded:
    """Records of one fetch, as columns. Positions index ``data`` (a uint8 array); a length of -1
    means null. Headers are flattened in record order: record i owns headers
    ``hoff[i]:hoff[i+1]``."""
    data: np.ndarray        # uint8: the (decompressed) records bytes
    offset: np.ndarray      # int64
    timestamp: np.ndarray   # int64, ms
    ts_type: np.ndarray     # int32 (0 create time, 1 log append time)
    key: tuple              # (start int64[], length int64[])
    value: tuple
    hoff: np.ndarray        # int64[n + 1]
    hkey: tuple             # per header (start, length)
    hvalue: tuple
    next_offset: int | None = None  # after the last complete batch (control batches included)
    # (decode(gap_from=...)) where the answer skipped offsets, and the decoding stopped: (the
    # first offset missing, the offset it went on at, that batch's max timestamp ms); see Gap
    gap: tuple[int, int, int] | None = None

    def __len__(self) -> int:
        return len(self.offset)

    def header_record(self) -> np.ndarray:
        """For every header, the index of its record."""
        return np.repeat(np.arange(len(self.offset)), np.diff(self.hoff))

    def take(self, idx: np.ndarray) -> Decoded:
        """The records at ``idx`` (a boolean mask or sorted indexes), headers included."""
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx
        counts = np.diff(self.hoff)[idx]
        hoff = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(counts, out=hoff[1:])
        hidx = _ranges(self.hoff[idx], counts, hoff[-1])
        return Decoded(self.data, self.offset[idx], self.timestamp[idx], self.ts_type[idx],
                       (self.key[0][idx], self.key[1][idx]),
                       (self.value[0][idx], self.value[1][idx]), hoff,
                       (self.hkey[0][hidx], self.hkey[1][hidx]),
                       (self.hvalue[0][hidx], self.hvalue[1][hidx]), self.next_offset)


def _ranges(starts: np.ndarray, lengths: np.ndarray, total: int) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n): one vectorised gather index."""
    lengths = np.asarray(lengths, np.int64)
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(np.asarray(starts, np.int64) - (ends - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


def _varints(data: np.ndarray, pos: np.ndarray, limit: np.ndarray | int) -> tuple:
    """Zigzag varints at every ``pos``: (values int64, positions after them). Each must end
    before ``limit`` (the end of its record)."""
    n = len(pos)
    if n == 0:
        return np.zeros(0, np.int64), pos
    if len(data) == 0 or pos.max() >= len(data) or pos.min() < 0:
        raise CorruptBatchError("record runs past the end of its batch")
    b = data[pos]
    raw = (b & 0x7F).astype(np.uint64)
    size = np.ones(n, np.int64)
    more = np.flatnonzero(b & 0x80)
    shift = 7
    while len(more):
        if shift > 63:
            raise CorruptBatchError("varint longer than 10 bytes")
        at = pos[more] + size[more]
        if at.max() >= len(data):
            raise CorruptBatchError("varint runs past the end of the batch")
        b = data[at]
        raw[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[more] += 1
        more = more[(b & 0x80) != 0]
        shift += 7
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    after = pos + size
    if np.any(after > limit):
        raise CorruptBatchError("varint runs past the end of its record")
    return values, after


def _field(data: np.ndarray, pos: np.ndarray,
           limit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A length-prefixed byte field (length -1 = null) at every ``pos``: (start, length, after)."""
    length, start = _varints(data, pos, limit)
    if np.any(length < -1):
        raise CorruptBatchError("negative field length")
    after = start + np.maximum(length, 0)
    if np.any(after > limit):
        raise CorruptBatchError("field runs past the end of its record")
    return start, length, after


def _record_bodies(buf: bytes, pos: int, end: int, count: int, starts: list[int], limits: list[int]) -> None:
    """The one per-record Python step: hop over each record's length varint."""
    append_start, append_limit = starts.append, limits.append
    for _ in range(count):
        if pos >= end:
            raise CorruptBatchError("batch holds fewer records than its header says")
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        else:
            raw, shift, pos = b & 0x7F, 7, pos + 1
            while True:
                if pos >= end or shift > 28:
                    raise CorruptBatchError("bad record length")
                b = buf[pos]
                raw |= (b & 0x7F) << shift
                pos += 1
                if b < 0x80:
                    break
                shift += 7
        if raw & 1:
            raise CorruptBatchError("negative record length")
        append_start(pos)
        pos += raw >> 1
        append_limit(pos)
    if pos != end:
        raise CorruptBatchError(f"{end - pos} bytes left after the last record of a batch")


def _decompress(codec: int, payload: bytes | memoryview) -> bytes:
    try:
        return _decompress_with(codec, payload)
    except CorruptBatchError:
        raise
    except Exception as exc:  # each codec has its own errors
        raise CorruptBatchError(f"cannot decompress a record batch (codec {codec}): {exc}") \
            from exc


def _decompress_with(codec: int, payload: bytes | memoryview) -> bytes:
    from kafka import codec as kc
    if codec == 1:
        return kc.gzip_decode(payload)
    if codec == 2:
        return kc.snappy_decode(bytes(payload))
    if codec == 3:
        return kc.lz4_decode(bytes(payload))
    if codec == 4:
        return kc.zstd_decode(bytes(payload))
    raise CorruptBatchError(f"unknown compression codec {codec}")


def decode(raw: bytes | memoryview, check_crcs: bool = True, gap_from: int | None = None) -> Decoded:
    """All data records of the v2 batches in ``raw`` (a Fetch response's records bytes).

    A truncated batch at the end (Kafka may cut the last one at the fetch size) is ignored;
    anything else malformed raises CorruptBatchError. ``gap_from``: the offset the fetch asked
    from; the records stop where the answer skips offsets (``Decoded.gap``, see Gap)."""
    mv = memoryview(raw)
    chunks, batch_info = [], []   # uncompressed records bytes; (base off, base ts, max ts, type, n)
    pos, total, next_offset = 0, len(mv), None
    gap = None
    while total - pos >= LOG_OVERHEAD + 5:
        base_offset, length = struct.unpack_from(">qi", mv, pos)
        end = pos + LOG_OVERHEAD + length
        if end > total:
            break  # partial batch at the end of the fetch
        if gap_from is not None:
            expected = gap_from if next_offset is None else next_offset
            if base_offset > expected:
                gap = (expected, base_offset, max_ts_of(mv, pos, end))
                break
        magic = mv[pos + 16]
        if magic != 2:
            raise CorruptBatchError(
                f"record batch with message format v{magic}: only v2 (Kafka 0.11+) is supported; "
                "read this topic with Spark's Kafka connector (--source kafka)")
        if length < BATCH_HEADER.size - LOG_OVERHEAD:
            raise CorruptBatchError(f"record batch of {length} bytes is too short")
        (_, _, _, _, crc, attrs, last_delta, base_ts, max_ts, _pid, _pepoch, _seq,
         count) = BATCH_HEADER.unpack_from(mv, pos)
        if check_crcs:
            from kafka.record.util import calc_crc32c
            if calc_crc32c(mv[pos + CRC_START:end]) != crc:
                raise CorruptBatchError(f"CRC mismatch in the record batch at offset {base_offset}")
        if not attrs & CONTROL_MASK and count > 0:
            body = mv[pos + BATCH_HEADER.size:end]
            codec = attrs & CODEC_MASK
            chunks.append(bytes(body) if not codec else _decompress(codec, body))
            ts_type = 1 if attrs & TIMESTAMP_TYPE_MASK else 0
            batch_info.append((base_offset, base_ts, max_ts, ts_type, count))
        next_offset = base_offset + last_delta + 1
        pos = end
    decoded = _decode_records(chunks, batch_info)
    decoded.next_offset = next_offset
    decoded.gap = gap
    return decoded


def max_ts_of(mv: memoryview, pos: int, end: int) -> int:
    """The max timestamp (ms) of the batch at ``pos`` (-1 when its header is cut)."""
    if end - pos < BATCH_HEADER.size:
        return -1
    return BATCH_HEADER.unpack_from(mv, pos)[8]


def _decode_records(chunks: list, batch_info: list) -> Decoded:
    buf = b"".join(chunks)
    starts: list[int] = []
    limits: list[int] = []
    at = 0
    for chunk, (_, _, _, _, count) in zip(chunks, batch_info):
        _record_bodies(buf, at, at + len(chunk), count, starts, limits)
        at += len(chunk)
    data = np.frombuffer(buf, np.uint8)
    n = len(starts)
    start = np.array(starts, np.int64)
    limit = np.array(limits, np.int64)
    counts = np.array([info[4] for info in batch_info], np.int64)
    base_off = np.repeat(np.array([i[0] for i in batch_info], np.int64), counts)
    base_ts = np.repeat(np.array([i[1] for i in batch_info], np.int64), counts)
    max_ts = np.repeat(np.array([i[2] for i in batch_info], np.int64), counts)
    ts_type = np.repeat(np.array([i[3] for i in batch_info], np.int32), counts)

    pos = start + 1  # attributes: one byte, unused
    if np.any(pos > limit):
        raise CorruptBatchError("empty record")
    ts_delta, pos = _varints(data, pos, limit)
    off_delta, pos = _varints(data, pos, limit)
    k_start, k_len, pos = _field(data, pos, limit)
    v_start, v_len, pos = _field(data, pos, limit)
    h_count, pos = _varints(data, pos, limit)
    if np.any(h_count < 0):
        raise CorruptBatchError("negative header count")
    if np.any(h_count > (limit - pos) // 2):  # a header is at least two varints (key, value length)
        raise CorruptBatchError("more headers than the record has bytes for")
    hoff = np.zeros(n + 1, np.int64)
    np.cumsum(h_count, out=hoff[1:])
    nh = int(hoff[-1])
    hk_start, hk_len = np.zeros(nh, np.int64), np.zeros(nh, np.int64)
    hv_start, hv_len = np.zeros(nh, np.int64), np.zeros(nh, np.int64)
    active = np.flatnonzero(h_count)
    j = 0
    while len(active):
        p, lim = pos[active], limit[active]
        ks, kl, p = _field(data, p, lim)
        if np.any(kl < 0):
            raise CorruptBatchError("null header key")
        vs, vl, p = _field(data, p, lim)
        out = hoff[active] + j
        hk_start[out], hk_len[out], hv_start[out], hv_len[out] = ks, kl, vs, vl
        pos[active] = p
        j += 1
        active = active[h_count[active] > j]
    if np.any(pos != limit):
        raise CorruptBatchError("record length does not match its fields")
    timestamp = np.where(ts_type == LOG_APPEND_TIME, max_ts, base_ts + ts_delta)
    return Decoded(data, base_off + off_delta, timestamp, ts_type, (k_start, k_len),
                   (v_start, v_len), hoff, (hk_start, hk_len), (hv_start, hv_len))


# ---- Arrow ------------------------------------------------------------------------------------

def binary_array(pa: Any, data: np.ndarray, start: np.ndarray, length: np.ndarray,
                 type_: Any = None) -> Any:
    """An Arrow binary (or string) array of ``data[start:start+length]`` slices; -1 = null."""
    type_ = type_ or pa.binary()
    n = len(start)
    nulls = length < 0
    lens = np.where(nulls, 0, length)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] >= 2 ** 31:
        raise ValueError("more than 2 GiB in one column of one Arrow batch")
    values = data[_ranges(start, lens, int(offsets[-1]))]
    validity = None
    null_count = int(nulls.sum())
    if null_count:
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                            pa.py_buffer(values)], null_count=null_count)


def constant_string(pa: Any, text: str, n: int) -> Any:
    """n copies of ``text`` as an Arrow string array (built without Python objects per row)."""
    raw = text.encode()
    offsets = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


def key_matches(d: Decoded, name: bytes, prefix: bool = False) -> np.ndarray:
    """Boolean mask over the headers: key == name (or starts with it, ``prefix``)."""
    ks, kl = d.hkey
    cand = np.flatnonzero(kl >= len(name) if prefix else kl == len(name))
    mask = np.zeros(len(kl), bool)
    if len(cand) and name:
        window = d.data[ks[cand, None] + np.arange(len(name), dtype=np.int64)]
        mask[cand[(window == np.frombuffer(name, np.uint8)).all(axis=1)]] = True
    elif len(cand):
        mask[cand] = True
    return mask


def first_header(d: Decoded, name: bytes) -> tuple:
    """Per record, the value of its first header called ``name``: (start, length; -1 = null or
    absent)."""
    n = len(d)
    start, length = np.zeros(n, np.int64), np.full(n, -1, np.int64)
    hits = np.flatnonzero(key_matches(d, name))
    if len(hits):
        rec = np.searchsorted(d.hoff, hits, side="right") - 1
        first = np.ones(len(hits), bool)
        first[1:] = rec[1:] != rec[:-1]
        rec, hits = rec[first], hits[first]
        start[rec], length[rec] = d.hvalue[0][hits], d.hvalue[1][hits]
    return start, length
