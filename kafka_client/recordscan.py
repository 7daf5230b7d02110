"""Kafka v2 record batches read record by record, keys first: the cluster's own stream.

A cluster node reads every record of the messages topic and wants only those whose key (the MQTT
topic) matches one of its sessions' subscriptions: most records are for nobody on it. So the scan
reads just each record's offset, timestamp and key (one pass of plain Python over the records);
the value and headers are read by record(i) for the records wanted, and nothing is read of a
fetch nobody on the node can want (Scanned.end, from the batches' headers alone).

kafka_client.recordbatch decodes every field of every record with numpy instead: the right tool
for the history job's large columnar reads, but its fixed cost per call (some 30 numpy passes,
about 0.4 ms) exceeds this scan's whole cost at the cluster's fetch sizes (tens to a few thousand
records, bench/cluster_bench.py).

Format: see kafka_client/recordbatch.py. Malformed bytes raise CorruptBatchError.
"""
from __future__ import annotations

import struct

from .record import read_zz_varint, zz_varint
from .recordbatch import (
    BATCH_HEADER,
    CODEC_MASK,
    CONTROL_MASK,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    CorruptBatchError,
    _decompress,
    max_ts_of,
)

_HEAD = struct.Struct(">qi")


def _varint(buf: bytes, pos: int, limit: int) -> tuple[int, int]:
    """A zigzag varint at `pos` ending at or before `limit`: (value, position after it)."""
    try:
        value, pos = read_zz_varint(buf, pos)
    except ValueError:
        pos = limit + 1
    if pos > limit:
        raise CorruptBatchError("varint runs past the end of its record")
    return value, pos


class Scanned:
    """The data records of one fetch (control batches skipped). Until something asks for a
    record, only the batches' headers are read: `end` (the offset after the last data record
    fetched) and next_offset come from those."""

    __slots__ = ("_batches", "_raw", "_buf", "offsets", "_ts", "_ks", "_kl", "_rest", "_limits", "first",
                 "end", "next_offset", "scanned", "gap")

    def __init__(self, raw: bytes | memoryview, gap_from: int | None = None) -> None:
        """``gap_from``: the offset the fetch asked from; the records stop where the answer
        skips offsets (``gap``: the first offset missing, the offset it went on at, that batch's
        max timestamp ms; kafka_client/gaps.py)."""
        mv = memoryview(raw)
        batches = []  # (records bytes or (start, end) in raw, base offset, base ts, max ts, log append, n)
        pos, total = 0, len(mv)
        self.end = -1
        self.next_offset: int | None = None
        self.gap: tuple[int, int, int] | None = None
        while total - pos >= LOG_OVERHEAD + 5:
            base_offset, length = _HEAD.unpack_from(mv, pos)
            end = pos + LOG_OVERHEAD + length
            if end > total:
                break  # partial batch at the end of the fetch
            if gap_from is not None:
                expected = gap_from if self.next_offset is None else self.next_offset
                if base_offset > expected:
                    self.gap = (expected, base_offset, max_ts_of(mv, pos, end))
                    break
            magic = mv[pos + 16]
            if magic != 2:
                raise CorruptBatchError(f"record batch with message format v{magic}: only v2 "
                                        "(Kafka 0.11+) is supported")
            if length < BATCH_HEADER.size - LOG_OVERHEAD:
                raise CorruptBatchError(f"record batch of {length} bytes is too short")
            (_, _, _, _, _, attrs, last_delta, base_ts, max_ts, _, _, _,
             count) = BATCH_HEADER.unpack_from(mv, pos)
            if not attrs & CONTROL_MASK and count > 0:
                batches.append((attrs & CODEC_MASK, pos + BATCH_HEADER.size, end, base_offset,
                                base_ts, max_ts, bool(attrs & TIMESTAMP_TYPE_MASK), count))
                self.end = base_offset + last_delta + 1
            self.next_offset = base_offset + last_delta + 1
            pos = end
        self._batches = batches
        self._raw = mv
        self._buf = b""
        self.offsets: list[int] = []
        self._ts: list[int] = []
        self._ks: list[int] = []
        self._kl: list[int] = []
        self._rest: list[int] = []
        self._limits: list[int] = []
        self.first = 0
        self.scanned = False

    def since(self, start: int) -> Scanned:
        """Only the records at or after offset `start` (a fetch may begin inside a batch)."""
        offs = self.offsets if self.scanned else self._scan()
        first = 0
        while first < len(offs) and offs[first] < start:
            first += 1
        self.first = first
        return self

    def __len__(self) -> int:
        return len(self._scan()) - self.first

    def indexes(self) -> range:
        return range(self.first, len(self._scan()))

    def _scan(self) -> list[int]:
        """The one pass over the records: offset, timestamp and key of each."""
        if self.scanned:
            return self.offsets
        mv = self._raw
        parts, spans = [], []
        at = 0
        for codec, start, end, *_ in self._batches:
            part = bytes(mv[start:end]) if not codec else _decompress(codec, mv[start:end])
            parts.append(part)
            spans.append((at, at + len(part)))
            at += len(part)
        buf = self._buf = b"".join(parts) if len(parts) != 1 else parts[0]
        offsets: list[int] = []
        tss: list[int] = []
        ks: list[int] = []
        kl: list[int] = []
        rest: list[int] = []
        limits: list[int] = []
        for (_, _, _, base_off, base_ts, max_ts, log_append, count), (pos, end) in \
                zip(self._batches, spans):
            for _ in range(count):
                if pos >= end:
                    raise CorruptBatchError("batch holds fewer records than its header says")
                b = buf[pos]
                if b < 0x80:
                    size, pos = (b >> 1) ^ -(b & 1), pos + 1
                else:
                    size, pos = _varint(buf, pos, end)
                limit = pos + size
                if size < 1 or limit > end:
                    raise CorruptBatchError("bad record length")
                pos += 1  # attributes (unused)
                ts_delta, pos = _varint(buf, pos, limit)
                b = buf[pos] if pos < limit else 0x80
                if b < 0x80:  # offset delta: one byte up to 63
                    off_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
                else:
                    off_delta, pos = _varint(buf, pos, limit)
                b = buf[pos] if pos < limit else 0x80
                if b < 0x80:  # key length: one byte up to 63
                    n, pos = (b >> 1) ^ -(b & 1), pos + 1
                else:
                    n, pos = _varint(buf, pos, limit)
                if n < -1 or pos + max(n, 0) > limit:
                    raise CorruptBatchError("key runs past the end of its record")
                offsets.append(base_off + off_delta)
                tss.append(max_ts if log_append else base_ts + ts_delta)
                ks.append(pos)
                kl.append(n)
                pos += max(n, 0)
                rest.append(pos)
                limits.append(limit)
                pos = limit
            if pos != end:
                raise CorruptBatchError(f"{end - pos} bytes left after the last record of a batch")
        self.offsets, self._ts, self._ks, self._kl = offsets, tss, ks, kl
        self._rest, self._limits = rest, limits
        self.scanned = True
        return offsets

    def key(self, i: int) -> bytes | None:
        n = self._kl[i]
        return None if n < 0 else self._buf[self._ks[i]:self._ks[i] + n]

    def body(self, i: int) -> bytes:
        """Record i from its keyLength varint to its end (what a signature covers,
        kafka_client/record.py sign_body), assuming the writer's shortest key-length varint."""
        kl = self._kl[i]
        start = self._ks[i] - (1 if -64 <= kl < 64 else len(zz_varint(kl)))
        return self._buf[start:self._limits[i]]

    def tail(self, i: int, n: int) -> bytes:
        """The last `n` bytes of record i (of a signed record: its signature's MAC)."""
        end = self._limits[i]
        return self._buf[max(end - n, self._ks[i]):end]

    def topic(self, i: int) -> str | None:
        """The key as text (an MQTT topic), None when null."""
        n = self._kl[i]
        if n < 0:
            return None
        s = self._ks[i]
        return self._buf[s:s + n].decode(errors="replace")

    def record(self, i: int) -> tuple:
        """(offset, key, value, [(header name, value)], timestamp ms)."""
        buf = self._buf
        pos, limit = self._rest[i], self._limits[i]
        n, pos = _varint(buf, pos, limit)
        if n < -1 or pos + max(n, 0) > limit:
            raise CorruptBatchError("value runs past the end of its record")
        value = None if n < 0 else buf[pos:pos + n]
        pos += max(n, 0)
        count, pos = _varint(buf, pos, limit)
        if count < 0:
            raise CorruptBatchError("negative header count")
        headers = []
        for _ in range(count):
            n, pos = _varint(buf, pos, limit)
            if n < 0 or pos + n > limit:
                raise CorruptBatchError("bad header key")
            name = buf[pos:pos + n].decode(errors="replace")  # matches no header then
            pos += n
            n, pos = _varint(buf, pos, limit)
            if n < -1 or pos + max(n, 0) > limit:
                raise CorruptBatchError("header value runs past the end of its record")
            headers.append((name, None if n < 0 else buf[pos:pos + n]))
            pos += max(n, 0)
        if pos != limit:
            raise CorruptBatchError("record length does not match its fields")
        return self.offsets[i], self.key(i), value, headers, self._ts[i]


def scan(raw: bytes | memoryview) -> Scanned:
    return Scanned(raw)
