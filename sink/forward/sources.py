"""Where the forwarder reads records from: the on-disk spool (:class:`SpoolSource`, with its
checkpoint and segment retention) or, with durability = "none", memory (:class:`MemorySource`).
Both keep what the refill window needs and take the wall clock (``clock``) they compare the
records' accept times with."""
from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from typing import Any, Callable, NamedTuple

from kafka_client.record import entry_timestamp

from .spool import (
    SpoolBatch,
    SpoolPosition,
    SpoolReader,
    checkpoint_name,
    read_checkpoint,
    read_min_checkpoint,
    seg_name,
    write_checkpoint,
)

log = logging.getLogger(__name__)


class Checkpoint(NamedTuple):
    """Where a forwarder starts: the acknowledged position and what it knew about Kafka
    (topic ids, last offsets, with keep_until = "history" the chunks not yet committed)."""
    pos: int
    seq: int
    kafka: dict


class SpoolSource:
    """The on-disk spool, with checkpointing and segment retention."""

    def __init__(self, spool_dir: str, retain_max_bytes: int, shard: int = 0, shards: int = 1,
                 clock: Callable[[], float] = time.time) -> None:
        self.dir = spool_dir
        self.clock = clock          # wall clock: the refill window, the checkpoint's updated_ms
        self.shard, self.shards = shard, shards
        self.ckpt_name = checkpoint_name(shard, shards)
        self.all_ckpts = [checkpoint_name(i, shards) for i in range(shards)]
        self.reader = SpoolReader(spool_dir)
        self.peeker = SpoolReader(spool_dir)
        self.retain_max_bytes = retain_max_bytes
        self._last_ckpt: tuple[Any, ...] | None = None

    def load(self) -> Checkpoint:
        # a shard without its own checkpoint yet (forwarders added) starts where all had got to
        ck = read_checkpoint(self.dir, self.ckpt_name) or read_min_checkpoint(self.dir) or {}
        pos, seq = int(ck.get("pos", 0)), int(ck.get("seq", 0))
        if not ck:
            segs = self.reader.segments(True)
            pos = segs[0] if segs else 0
        resume = min(pos, int(ck.get("resume", pos)))
        if resume < pos:
            log.info("resuming an interrupted refill (records Kafka lost, sent again) at spool "
                     "position %d", resume)
        self.reader.seek(resume)
        self._last_ckpt = (pos, seq, resume)
        return Checkpoint(pos, seq, ck.get("kafka") or {})

    def read(self, n: int, nbytes: int) -> SpoolBatch:
        return self.reader.read(n, nbytes)

    @property
    def pos(self) -> int:
        return self.reader.pos

    def seek(self, pos: int, seq: int | None) -> None:
        self.reader.seek(pos)

    def ts_at(self, pos: int) -> int | None:
        self.peeker.seek(pos)
        recs = self.peeker.read(1, 1)
        return entry_timestamp(recs.payloads[0]) if recs else None

    def find_position(self, min_seq: int, min_ts: int, upto: int) -> int:
        return self.reader.find_position(min_seq, min_ts, upto)

    def commit(self, pos: int, seq: int, kafka_state: dict, resume: int, force: bool = False,
               committed: SpoolPosition | None = None) -> None:
        key = (pos, seq, resume, committed)
        if not force and self._last_ckpt == key:
            return
        data = {"pos": pos, "seq": seq, "resume": resume, "kafka": kafka_state,
                "updated_ms": int(self.clock() * 1000)}
        if committed is not None:
            data["committed_pos"], data["committed_seq"] = committed
        write_checkpoint(self.dir, data, name=self.ckpt_name)
        self._last_ckpt = key

    def committed(self) -> SpoolPosition | None:
        """Up to where the history table has every record (keep_until = "history")."""
        ck = read_checkpoint(self.dir, self.ckpt_name) or read_min_checkpoint(self.dir) or {}
        if "committed_pos" not in ck:
            return None
        return SpoolPosition(int(ck["committed_pos"]), int(ck.get("committed_seq", 0)))

    def housekeeping(self, acked_pos: int, acked_seq: int, window_s: float, window_n: int,
                     keep_from: int | None = None) -> None:
        """Delete segments every forwarder is done with: sent (and inside no refill window), or,
        with keep_from (keep_until = "history"), wholly before keep_from (committed)."""
        if self.shards > 1:  # a segment goes only when every forwarder has sent its share of it
            slowest = read_min_checkpoint(self.dir, self.all_ckpts)
            if slowest is None or len([1 for n in self.all_ckpts
                                       if os.path.exists(os.path.join(self.dir, n))]) < self.shards:
                return
            acked_pos = min(acked_pos, int(slowest["pos"]))
            acked_seq = min(acked_seq, int(slowest["seq"]))
            if keep_from is not None:
                cks = [read_checkpoint(self.dir, n) or {} for n in self.all_ckpts]
                keep_from = min([keep_from] + [int(c.get("committed_pos", 0)) for c in cks])
        if keep_from is not None:
            acked_pos = min(acked_pos, keep_from)
            window_s = window_n = 0
        segs = self.reader.segments(True)
        now_ms = self.clock() * 1000
        for i in range(len(segs) - 1):           # the last segment is live: never deleted
            b, nxt = segs[i], segs[i + 1]
            if nxt > acked_pos or nxt > self.reader.pos:
                break                             # not fully forwarded (or being refilled)
            m = self.reader.segment_meta(b, True)
            if m["last_seq"] is not None and window_s > 0 and window_n > 0:
                keep = (m["last_ts"] >= now_ms - window_s * 1000
                        and m["last_seq"] >= acked_seq - window_n
                        and acked_pos - nxt < self.retain_max_bytes)
                if keep:
                    break
            try:
                os.unlink(os.path.join(self.dir, seg_name(b)))
                log.debug("spool: deleted forwarded segment %s", seg_name(b))
            except FileNotFoundError:
                pass
            self.reader.forget(b)
            self.peeker.forget(b)

    def close(self) -> None:
        self.reader.close()
        self.peeker.close()


class MemorySource:
    """durability = "none": records only in memory (this process), same interface.
    Positions are cumulative bytes; forwarded records are kept for the refill window."""

    def __init__(self, retain_max_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock          # wall clock: the refill window
        self._lock = threading.Lock()
        # (start, end, seq, payload) like a SpoolEntry, as a plain tuple: built on the event loop
        self._items: list[tuple[int, int, int, bytes]] = []
        self._head_seq = 0          # seq of _items[0]
        self.end_pos = 0            # producer side (event loop)
        self.next_seq = 0
        self._read_seq = 0
        self.retain_max_bytes = retain_max_bytes

    # event loop side
    def append(self, payload: bytes) -> int:
        with self._lock:
            seq = self.next_seq
            start = self.end_pos
            self.end_pos = start + len(payload)
            self.next_seq = seq + 1
            self._items.append((start, self.end_pos, seq, payload))
        return seq

    # forwarder side
    def load(self) -> Checkpoint:
        return Checkpoint(0, 0, {})

    @property
    def pos(self) -> int:
        with self._lock:
            i = self._read_seq - self._head_seq
            return _start(self._items[i]) if i < len(self._items) else self.end_pos

    def read(self, n: int, nbytes: int) -> SpoolBatch:
        with self._lock:
            i = self._read_seq - self._head_seq
            out = self._items[i:i + n]
        self._read_seq += len(out)
        if not out:
            return SpoolBatch([], [], [], [])
        starts, ends, seqs, payloads = map(list, zip(*out))
        return SpoolBatch(starts, ends, seqs, payloads)

    def seek(self, pos: int, seq: int | None = None) -> None:
        with self._lock:
            i = bisect.bisect_left(self._items, pos, key=_start)
            self._read_seq = self._head_seq + i

    def ts_at(self, pos: int) -> int | None:
        with self._lock:
            i = bisect.bisect_left(self._items, pos, key=_start)
            if i == len(self._items):
                return None
            _, _, _, payload = self._items[i]
            return entry_timestamp(payload)

    def find_position(self, min_seq: int, min_ts: int, upto: int) -> int:
        with self._lock:
            for start, _end, seq, payload in self._items:
                if start >= upto:
                    break
                if seq >= min_seq and entry_timestamp(payload) >= min_ts:
                    return start
        return upto

    def commit(self, *a: Any, **k: Any) -> None:
        pass

    def committed(self) -> None:
        return None

    def housekeeping(self, acked_pos: int, acked_seq: int, window_s: float, window_n: int,
                     keep_from: int | None = None) -> None:
        if keep_from is not None:
            acked_pos = min(acked_pos, keep_from)
            window_s = window_n = 0
        now_ms = self.clock() * 1000
        with self._lock:
            items = self._items
            k = 0
            limit = self._read_seq - self._head_seq
            while k < len(items) and k < limit:
                start, end, seq, payload = items[k]
                if end > acked_pos:
                    break
                if (window_s > 0 and window_n > 0 and entry_timestamp(payload) >= now_ms - window_s * 1000
                        and seq >= acked_seq - window_n and acked_pos - start < self.retain_max_bytes):
                    break
                k += 1
            if k:
                del items[:k]
                self._head_seq += k

    def close(self) -> None:
        pass


def _start(item: tuple) -> int:
    start, _, _, _ = item
    return start
