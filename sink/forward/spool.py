"""Durable on-disk write-ahead spool for the sink.

Layout of ``spool_dir``::

    00000000000000000000.seg   segment files, named by the global byte position
    00000000000016777310.seg   of their first byte (20 digits); append-only
    checkpoint.json            forwarded position, written atomically by the forwarder
    writer.lock / forwarder.lock   flock()s: one writer (Sink) and one forwarder per dir

Positions are global byte offsets: segment ``B`` covers ``[B, next segment base)``.
Every Sink start opens a fresh segment (base = end of the previous file), so a
torn write left by a crash is always in a sealed segment and never appended to.

Frame (little-endian)::

    u32 payload_length | u32 crc32(seq_le64 || payload) | u64 seq | payload

``seq`` is a per-spool monotonically increasing record number; the payload is a
spool entry from :func:`kafka_client.record.encode_entry` (Kafka topic, key, value,
headers, timestamp -- including the ``mqtt.message_id`` header, so a record
sent again keeps its id).

Group commit: :class:`SpoolWriter.append` only queues (cheap, event-loop safe);
a writer thread drains the queue, writes all queued frames with one write and
one ``fdatasync`` and then reports the durable sequence number.

The forwarder (:class:`SpoolReader`) tails the segments and records the
position up to which Kafka acknowledged everything in ``checkpoint.json``.
A frame that is incomplete or fails its CRC in a *sealed* segment is a torn or
corrupt write: it is logged and the rest of that segment is skipped.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from kafka_client.record import entry_timestamp
from sink.history.commits import fsync_dir

log = logging.getLogger(__name__)

FRAME = struct.Struct("<IIQ")
FRAME_SIZE = FRAME.size            # 16
_SEQ = struct.Struct("<Q")
MAX_PAYLOAD = 256 * 1024 * 1024    # anything larger is treated as corruption
SEG_SUFFIX = ".seg"
CHECKPOINT = "checkpoint.json"
READ_CHUNK = 1 << 20


class SpoolPosition(NamedTuple):
    """A place in the spool: byte position and the seq of the record there (or next there)."""
    pos: int
    seq: int


class SpoolEntry(NamedTuple):
    """One record as read back: its frame's [start, end) byte positions, seq, entry bytes."""
    start: int
    end: int
    seq: int
    payload: bytes


class SpoolBatch:
    """Records read in one go, in spool order (a forwarder chunk), as parallel lists: one
    list append per field and no object per record (the forwarder's per-record budget is a
    few microseconds). Iterating yields :class:`SpoolEntry` values."""
    __slots__ = ("starts", "ends", "seqs", "payloads")

    def __init__(self, starts: list[int], ends: list[int], seqs: list[int], payloads: list[bytes]) -> None:
        self.starts, self.ends, self.seqs, self.payloads = starts, ends, seqs, payloads

    @property
    def start(self) -> int:
        """Position of the first record (the batch must not be empty)."""
        return self.starts[0]

    @property
    def end(self) -> int:
        """Position after the last record."""
        return self.ends[-1]

    @property
    def first_seq(self) -> int:
        return self.seqs[0]

    @property
    def last_seq(self) -> int:
        return self.seqs[-1]

    def __len__(self) -> int:
        return len(self.seqs)

    def __iter__(self) -> Iterator[SpoolEntry]:
        return map(SpoolEntry, self.starts, self.ends, self.seqs, self.payloads)

    def __getitem__(self, i: int) -> SpoolEntry:
        return SpoolEntry(self.starts[i], self.ends[i], self.seqs[i], self.payloads[i])


def seg_name(base: int) -> str:
    return f"{base:020d}{SEG_SUFFIX}"


def list_segments(spool_dir: str) -> list[int]:
    out: list[int] = []
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(SEG_SUFFIX) and len(n) == 20 + len(SEG_SUFFIX):
            try:
                out.append(int(n[:20]))
            except ValueError:
                pass
    out.sort()
    return out


def frame(seq: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq)))
    return FRAME.pack(len(payload), crc, seq) + payload


def parse_frames(buf: bytes | bytearray | memoryview, off: int = 0) -> Iterator[tuple[int, int, int, memoryview]]:
    """Yield (offset, end, seq, payload_memoryview) for complete valid frames in buf
    starting at off. Stops at the first incomplete frame; raises CorruptFrame at the
    first complete frame whose CRC/length is bad."""
    mv = memoryview(buf)
    n = len(mv)
    while off + FRAME_SIZE <= n:
        ln, crc, seq = FRAME.unpack_from(mv, off)
        if ln > MAX_PAYLOAD:
            raise CorruptFrame(off, f"implausible length {ln}")
        end = off + FRAME_SIZE + ln
        if end > n:
            return
        payload = mv[off + FRAME_SIZE:end]
        if zlib.crc32(payload, zlib.crc32(mv[off + 8:off + 16])) != crc:
            raise CorruptFrame(off, "CRC mismatch")
        yield off, end, seq, payload
        off = end


class CorruptFrame(Exception):
    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"{why} at offset {offset}")
        self.offset = offset
        self.why = why


def scan_segment(path: str) -> dict:
    """Validate a whole segment. -> dict(count, first_seq, last_seq, first_ts, last_ts,
    valid_end (offset in file), size, status 'ok' | 'torn' | 'corrupt')."""
    info: dict[str, Any] = dict(count=0, first_seq=None, last_seq=None, first_ts=None, last_ts=None,
                valid_end=0, size=0, status="ok")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        info["status"] = "missing"
        return info
    info["size"] = len(data)
    try:
        for _off, end, seq, payload in parse_frames(data):
            if info["first_seq"] is None:
                info["first_seq"] = seq
                info["first_ts"] = entry_timestamp(payload)
            info["count"] += 1
            info["last_seq"] = seq
            info["last_ts"] = entry_timestamp(payload)
            info["valid_end"] = end
    except CorruptFrame:
        info["status"] = "corrupt"
        return info
    if info["valid_end"] != len(data):
        info["status"] = "torn"
    return info


def checkpoint_name(shard: int = 0, shards: int = 1) -> str:
    """One checkpoint per forwarder: checkpoint.json, or checkpoint-<shard>.json when sharded."""
    return CHECKPOINT if shards <= 1 else f"checkpoint-{shard}.json"


def read_min_checkpoint(spool_dir: str, names: Iterable[str] | None = None) -> dict | None:
    """The checkpoint furthest behind among the forwarders' (what every one of them has sent)."""
    if names is None:
        try:
            names = [n for n in os.listdir(spool_dir)
                     if n.startswith("checkpoint") and n.endswith(".json")]
        except FileNotFoundError:
            return None
    cks = [c for c in (read_checkpoint(spool_dir, n) for n in names) if c is not None]
    return min(cks, key=lambda c: int(c["pos"])) if cks else None


def read_checkpoint(spool_dir: str, name: str = CHECKPOINT) -> dict | None:
    p = os.path.join(spool_dir, name)
    try:
        with open(p, "rb") as f:
            d = json.loads(f.read())
        int(d["pos"]), int(d["seq"])
        return d
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("spool checkpoint %s unreadable (%s): sending every retained segment again", p, exc)
        return None


def write_checkpoint(spool_dir: str, data: dict, fsync: bool = True, name: str = CHECKPOINT) -> None:
    p = os.path.join(spool_dir, name)
    tmp = p + ".tmp"
    raw = json.dumps(data, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, raw)
        if fsync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)


class DirLock:
    """An exclusive flock() on a file in the spool dir (released when the process dies)."""

    def __init__(self, spool_dir: str, name: str) -> None:
        self.path = os.path.join(spool_dir, name)
        self.fd: int | None = None

    def acquire(self, timeout: float = 0.0) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    os.close(fd)
                    raise RuntimeError(f"spool lock {self.path} is held by another process "
                                       f"(another broker/forwarder on the same spool_dir?)") from exc
                time.sleep(0.05)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------------------
# Writer side (inside the broker process)
# ---------------------------------------------------------------------------
#: Under load, the writer waits until this long after its last fdatasync before the next one
#: ([sink] spool_group_commit_ms),
#: so one sync covers more records (at 25,000 msg/s: ~50 instead of a few); an idle spool's
#: first record is written at once. Adds at most this much to a QoS 1/2 acknowledgement.
GROUP_COMMIT_SECONDS = 0.002


class SpoolWriter:
    """Append-only segment writer with group commit in a background thread.

    ``append`` is called on the event loop: it assigns the sequence number and
    queues the payload (no I/O). The writer thread writes everything queued with
    one ``os.write`` + one ``fdatasync`` and then calls ``on_durable(last_seq)``
    (from the writer thread) and ``on_written()``.
    """

    def __init__(self, spool_dir: str, segment_bytes: int = 16 << 20, fsync: bool = True,
                 on_durable: Callable[[int, int], None] | None = None, on_written: Callable[[], None] | None = None,
                 on_error: Callable[[int, int, Exception], None] | None = None, idle_interval: float = 0.01,
                 max_batch_bytes: int = 8 << 20, group_commit: float = GROUP_COMMIT_SECONDS) -> None:
        self.dir = spool_dir
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.on_durable = on_durable
        self.on_written = on_written
        self.on_error = on_error
        self.idle_interval = idle_interval
        self.max_batch_bytes = max_batch_bytes
        self.group_commit = group_commit if fsync else 0.0
        self._last_sync = 0.0
        self._q: collections.deque = collections.deque()
        self._ev = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._lock = DirLock(spool_dir, "writer.lock")
        self._fd: int | None = None
        self._base = 0
        self._file_off = 0
        self.next_seq = 0           # next seq to assign (event loop)
        self.end_pos = 0            # logical end including queued frames (event loop)
        self.durable_seq = -1       # last seq written (+fsynced when fsync) (writer thread)
        self.decided_seq = -1       # last seq written or refused (writer thread)
        self.written_pos = 0        # position after the last written frame
        self.ckpt_pos = 0
        self.ckpt_seq = 0
        self.kept_pos = 0
        self.kept_seq = 0
        self.batches = 0
        self.write_errors = 0
        self.failing = 0            # records refused since writes started failing (0: healthy)

    # -- start / recovery ------------------------------------------------------------
    def open(self) -> "SpoolWriter":
        os.makedirs(self.dir, exist_ok=True)
        self._lock.acquire()
        ck = read_min_checkpoint(self.dir) or {}
        self.ckpt_pos = int(ck.get("pos", 0))
        self.ckpt_seq = int(ck.get("seq", 0))
        # keep_until = "history": what the spool holds starts at the committed position
        kept = [c for c in (read_checkpoint(self.dir, n) for n in os.listdir(self.dir)
                            if n.startswith("checkpoint") and n.endswith(".json")) if c]
        self.kept_pos = min([self.ckpt_pos] + [int(c.get("committed_pos", c["pos"])) for c in kept])
        self.kept_seq = min([self.ckpt_seq] + [int(c.get("committed_seq", c["seq"])) for c in kept])
        segs = list_segments(self.dir)
        base, next_seq = self.ckpt_pos, self.ckpt_seq
        # drop empty trailing segments (crash right after creating a segment)
        while segs and os.path.getsize(os.path.join(self.dir, seg_name(segs[-1]))) == 0 and len(segs) > 0:
            b = segs.pop()
            os.unlink(os.path.join(self.dir, seg_name(b)))
            base = max(base, b)
        for b in reversed(segs):
            info = scan_segment(os.path.join(self.dir, seg_name(b)))
            base = max(base, b + info["size"])
            if info["status"] in ("torn", "corrupt"):
                log.warning("spool: segment %s ends with a torn/corrupt write (%d of %d bytes valid, %s); "
                            "the damaged tail is skipped", seg_name(b), info["valid_end"], info["size"],
                            info["status"])
            if info["last_seq"] is not None:
                next_seq = max(next_seq, info["last_seq"] + 1)
                break
        self.next_seq = next_seq
        self.durable_seq = self.decided_seq = next_seq - 1
        self._new_segment(base)
        self.end_pos = self.written_pos = base
        self._thread = threading.Thread(target=self._run, name="sink-spool-writer", daemon=True)
        self._thread.start()
        return self

    def _new_segment(self, base: int) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None  # never write to a closed (maybe reused) descriptor
        path = os.path.join(self.dir, seg_name(base))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._base = base
        self._file_off = os.fstat(self._fd).st_size
        if self.fsync:
            fsync_dir(self.dir)

    # -- event loop side -------------------------------------------------------------------
    def append(self, payload: bytes) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        self.end_pos += FRAME_SIZE + len(payload)
        self._q.append((seq, payload))
        return seq

    def kick(self) -> None:
        self._ev.set()

    @property
    def pending(self) -> int:
        return len(self._q)

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        q = self._q
        while True:
            self._ev.wait(self.idle_interval)
            self._ev.clear()
            if not q:
                if self._closing:
                    return
                continue
            if self.group_commit:  # group commit: one fdatasync per interval at most, under load
                wait = self._last_sync + self.group_commit - time.monotonic()
                if wait > 0 and not self._closing:
                    time.sleep(wait)
            while q:
                bufs = []
                size = 0
                last = -1
                while q and size < self.max_batch_bytes:
                    seq, payload = q.popleft()
                    f = frame(seq, payload)
                    bufs.append(f)
                    size += len(f)
                    last = seq
                data = b"".join(bufs)
                start_pos = self._base + self._file_off
                try:
                    if self._fd is None:  # the last write failed: continue in a fresh segment
                        self._new_segment(start_pos)
                    mv = memoryview(data)
                    while mv:
                        n = os.write(self._fd, mv)  # type: ignore[arg-type]  # opened above when None
                        mv = mv[n:]
                    if self.fsync:
                        os.fdatasync(self._fd)  # type: ignore[arg-type]  # (as above)
                        self._last_sync = time.monotonic()
                except OSError as exc:
                    self._write_failed(start_pos, size, len(bufs), last, exc)
                    continue
                if self.failing:
                    log.info("spool: writes to %s succeed again (%d records were refused while they "
                             "failed)", self.dir, self.failing)
                    self.failing = 0
                self._file_off += size
                self.written_pos = start_pos + size
                self.durable_seq = self.decided_seq = last
                self.batches += 1
                if self.on_durable:
                    self.on_durable(last, len(bufs))
                if self.on_written:
                    self.on_written()
                if self._file_off >= self.segment_bytes:
                    try:
                        self._new_segment(self._base + self._file_off)
                    except OSError as exc:
                        log.error("spool: cannot roll segment: %s", exc)

    def _write_failed(self, start_pos: int, size: int, n: int, last: int, exc: OSError) -> None:
        """A batch could not be made durable (disk full, EIO): its records are refused (their
        acks fail), what reached the file is cut off, and the next batch starts a new segment
        after the batch's positions (the event loop already counted them)."""
        self.write_errors += 1
        if not self.failing:
            log.error("spool: cannot write to %s: %s. QoS 1/2 publishers get failure acks (MQTT 5: "
                      "0x80) or are disconnected (3.1.x) until writes succeed again: free disk space "
                      "or fix the device; writes are retried", self.dir, exc)
        else:
            log.debug("spool: write of %d records failed again: %s", n, exc)
        self.failing += n
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._file_off)  # no half-written or unsynced frames stay
            except OSError:
                pass
            empty = self._file_off == 0
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
            if empty:
                try:
                    os.unlink(os.path.join(self.dir, seg_name(self._base)))
                except OSError:
                    pass
        self._base, self._file_off = start_pos + size, 0
        self.written_pos = start_pos + size
        self.decided_seq = last
        if self.on_error:
            self.on_error(last, n, exc)
        time.sleep(0.1)

    def flush(self, timeout: float = 10.0) -> bool:
        """Block (not for the event loop) until everything appended is written."""
        target = self.next_seq - 1
        deadline = time.monotonic() + timeout
        # until every record is written or refused (not "failing with an empty queue": the
        # writer may hold the records it took from the queue and be about to succeed)
        while self.decided_seq < target and time.monotonic() < deadline:
            if self._thread is None or not self._thread.is_alive():
                return False
            self._ev.set()
            time.sleep(0.002)
        return self.durable_seq >= target

    def close(self) -> None:
        self._closing = True
        self._ev.set()
        if self._thread:
            self._thread.join(10)
            self._thread = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._lock.release()


# ---------------------------------------------------------------------------
# Reader side (inside the forwarder)
# ---------------------------------------------------------------------------
class SpoolReader:
    """Tails the segments from a global position. Not thread-safe (one forwarder)."""

    def __init__(self, spool_dir: str) -> None:
        self.dir = spool_dir
        self.pos = 0
        self._segs: list[int] = []
        self._segs_at = 0.0
        self._fd: int | None = None
        self._fd_base: int | None = None
        self._bad_since: float | None = None
        self._meta: dict[int, dict] = {}
        self.skipped_bytes = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._fd_base = None

    def segments(self, refresh: bool = False) -> list[int]:
        now = time.monotonic()
        if refresh or now - self._segs_at > 0.05:
            self._segs = list_segments(self.dir)
            self._segs_at = now
        return self._segs

    def seek(self, pos: int) -> None:
        self.pos = pos
        self._bad_since = None

    def _locate(self) -> tuple[int | None, int | None]:
        """-> (segment base containing self.pos, next base or None). Adjusts pos forward
        if it points before the oldest segment or into a gap."""
        segs = self.segments()
        if not segs:
            return None, None
        if self.pos < segs[0]:
            self.pos = segs[0]
        cur = None
        nxt = None
        for i, b in enumerate(segs):
            if b <= self.pos:
                cur = b
                nxt = segs[i + 1] if i + 1 < len(segs) else None
            else:
                break
        if nxt is not None and self.pos >= nxt:  # stale list
            return self._locate_refresh()
        return cur, nxt

    def _locate_refresh(self) -> tuple[int | None, int | None]:
        self._segs_at = 0
        segs = self.segments(True)
        cur = nxt = None
        for i, b in enumerate(segs):
            if b <= self.pos:
                cur, nxt = b, (segs[i + 1] if i + 1 < len(segs) else None)
        return cur, nxt

    def _open(self, base: int) -> int | None:
        if self._fd_base == base:
            return self._fd
        self.close()
        try:
            self._fd = os.open(os.path.join(self.dir, seg_name(base)), os.O_RDONLY)
        except FileNotFoundError:
            return None
        self._fd_base = base
        return self._fd

    def read(self, max_records: int = 1000, max_bytes: int = 4 << 20) -> SpoolBatch:
        """-> up to max_records records from self.pos on; advances self.pos. Empty when caught up."""
        out = SpoolBatch([], [], [], [])
        add_start, add_end, add_seq, add_payload = (out.starts.append, out.ends.append, out.seqs.append,
                                                    out.payloads.append)
        seqs = out.seqs
        nbytes = 0
        while len(seqs) < max_records and nbytes < max_bytes:
            base, nxt = self._locate()
            if base is None:
                return out
            fd = self._open(base)
            if fd is None:  # deleted under us
                self._segs_at = 0
                continue
            off = self.pos - base
            want = max(READ_CHUNK, FRAME_SIZE)
            buf = os.pread(fd, want, off)
            if len(buf) >= FRAME_SIZE:
                ln = FRAME.unpack_from(buf, 0)[0]
                if FRAME_SIZE + ln > len(buf) and ln <= MAX_PAYLOAD:
                    buf = os.pread(fd, FRAME_SIZE + ln, off)
            got = 0
            bad = None
            try:
                at = base + off
                for foff, fend, seq, payload in parse_frames(buf):
                    add_start(at + foff)
                    add_end(at + fend)
                    add_seq(seq)
                    add_payload(bytes(payload))
                    got = fend
                    nbytes += fend - foff
                    if len(seqs) >= max_records or nbytes >= max_bytes:
                        break
            except CorruptFrame as exc:
                bad = exc
            self.pos = base + off + got
            if got:
                self._bad_since = None
                continue
            # nothing parsed at self.pos
            if nxt is None:
                nxt = self._locate_refresh()[1]
            if nxt is None:
                if bad is not None:   # live segment: maybe a write in progress; wait
                    now = time.monotonic()
                    if self._bad_since is None:
                        self._bad_since = now
                    elif now - self._bad_since > 5:
                        log.error("spool: %s in live segment %s; waiting", bad, seg_name(base))
                        self._bad_since = now
                return out
            # sealed segment: whatever remains is a clean end, or a torn/corrupt tail
            size = os.fstat(fd).st_size
            if off < size:
                log.warning("spool: skipping %d bytes of torn/corrupt data at the end of segment %s (%s)",
                            size - off, seg_name(base), bad or "incomplete frame")
                self.skipped_bytes += size - off
            self.pos = nxt
        return out

    # -- refill / retention helpers --------------------------------------------------------------
    def segment_meta(self, base: int, sealed: bool) -> dict:
        m = self._meta.get(base)
        if m is None:
            m = scan_segment(os.path.join(self.dir, seg_name(base)))
            if sealed:
                self._meta[base] = m
        return m

    def forget(self, base: int) -> None:
        self._meta.pop(base, None)

    def find_position(self, min_seq: int, min_ts: int, upto: int) -> int:
        """First position (< upto) of a record with seq >= min_seq and ts >= min_ts; upto if none."""
        segs = self.segments(True)
        for i, b in enumerate(segs):
            if b >= upto:
                break
            sealed = i + 1 < len(segs)
            m = self.segment_meta(b, sealed)
            if m["last_seq"] is None or m["last_seq"] < min_seq or (m["last_ts"] or 0) < min_ts:
                continue
            try:
                with open(os.path.join(self.dir, seg_name(b)), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            try:
                for off, _end, seq, payload in parse_frames(data):
                    if b + off >= upto:
                        return upto
                    if seq >= min_seq and entry_timestamp(payload) >= min_ts:
                        return b + off
            except CorruptFrame:
                pass
        return upto
