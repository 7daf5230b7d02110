"""Forwarder: spool (or memory queue) -> Kafka, off the broker's event loop.

Runs either as a separate process (``python -m sink.forward.forwarder``, the default: it
has its own GIL) or as a thread inside the broker process. Both run
:class:`Forwarder`; only the control channel differs:

* process: the Sink writes one JSON config line on the child's stdin, then single
  command bytes (``n`` new data, ``d`` drain and exit, ``q`` exit now). EOF on
  stdin means the broker died: the forwarder exits (and stops the embedded Kafka
  it was told to watch). Status goes back as JSON lines on stdout.
* thread: the same through a :class:`ThreadControl` and a callback.

Delivery and ordering
---------------------
Spool entries already hold Kafka v2 record bodies (encoded once by the broker). The forwarder
reads a chunk of them (up to 2,000), groups them per partition (murmur2 of the key, like
kafka-python's default partitioner) into RecordBatches and sends one ProduceRequest per leader
(``acks=all``) through kafka-python's network client (kafka_client/produce.py), up to four chunks in
flight. Acknowledged chunks advance the forwarded position over a contiguous prefix only; it is
persisted in ``checkpoint.json`` (spool mode). On a failed chunk the forwarder waits for
everything in flight, rewinds to the first record of that chunk and sends again from there, in
order (duplicates possible, never gaps). A record Kafka refuses for good is found by re-sending
that chunk one record per request and is dropped alone.

The loop is a state machine (:class:`State`, one :meth:`Forwarder.step` per turn):
CONNECTING -> FORWARDING; a failed chunk -> RESENDING -> FORWARDING (from that chunk, after a
back-off); Kafka lost data -> REPLAYING -> PROBING (fresh metadata) -> FORWARDING (from the
replay start). Chunks in flight are :class:`InFlight` records; with keep_until = "history"
acknowledged chunks wait in ``pending`` as :class:`AckedChunk` records until committed.

Kafka losing data (embedded Tansu restarted empty, topic re-created) is
detected, not assumed: a partition offset that goes backwards in a produce
acknowledgement, or a topic id that changes in the metadata (topic ids and last
offsets are kept in the checkpoint so this also works across restarts). Then:

* ``keep_until = "history"``: every record the history job has not committed yet
  (sink/progress.py; the forwarder remembers, per acknowledged chunk, the next offset of
  each partition it wrote and the topic id, and keeps that list in its checkpoint) is sent
  again. Spool segments are deleted only once committed.
* ``keep_until = "kafka"``: the replay window is re-sent: records already forwarded whose
  accept time is within ``replay_window_seconds`` and that are among the last
  ``replay_window_messages``.

Each record keeps its ``mqtt.message_id``, so consumers can drop the duplicates; per MQTT
topic, the last occurrence of each message id is in submit order.
"""
from __future__ import annotations

import bisect
import collections
import enum
import json
import logging
import os
import select
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from kafka_client.headers import signature_mac
from kafka_client.produce import BatchSender, ChunkFuture, NotReady
from kafka_client.record import entry_fields, entry_shard, entry_timestamp, sign_body
from settings import HistoryConfig, SinkConfig, secrets

from .. import progress
from .spool import (
    DirLock,
    SpoolBatch,
    SpoolPosition,
    SpoolReader,
    checkpoint_name,
    read_checkpoint,
    read_min_checkpoint,
    seg_name,
    write_checkpoint,
)

log = logging.getLogger("sink.forwarder")

DEFAULT_PRODUCER = dict(
    acks="all",
    enable_idempotence=False,               # Tansu forgets producer ids on restart
    max_in_flight_requests_per_connection=5,  # chunks in flight; a failure re-sends from the first
    # records gather up to 20 ms into one request: at 25,000 msg/s, 20 ms instead of 5 costs the
    # forwarder 20% and Tansu 40% less CPU (bench/pipeline.py); the table's 2 s trigger hides it
    linger_ms=20,
    batch_size=256 * 1024,
    max_block_ms=1000,                      # send() never blocks long (metadata unknown)
    bootstrap_timeout_ms=2000,
    metadata_max_age_ms=5000,               # also how fast a re-created topic is noticed
    delivery_timeout_ms=30000,
    request_timeout_ms=10000,
    reconnect_backoff_ms=50,
    reconnect_backoff_max_ms=1000,
    retry_backoff_ms=100,
)


def producer_config(bootstrap: str, kafka_opts: dict | None) -> dict:
    cfg = dict(DEFAULT_PRODUCER)
    cfg.update(kafka_opts or {})
    if str(cfg.get("acks")) not in ("all", "-1"):
        log.warning("sink.kafka.acks=%r ignored: the sink always uses acks='all'", cfg.get("acks"))
    cfg["acks"] = "all"
    cfg["bootstrap_servers"] = bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap
    for k in ("key_serializer", "value_serializer"):
        cfg.pop(k, None)
    return cfg


# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------
class Checkpoint(NamedTuple):
    """Where a forwarder starts: the acknowledged position and what it knew about Kafka
    (topic ids, last offsets, with keep_until = "history" the chunks not yet committed)."""
    pos: int
    seq: int
    kafka: dict


class SpoolSource:
    """The on-disk spool, with checkpointing and segment retention."""

    def __init__(self, spool_dir: str, retain_max_bytes: int, shard: int = 0, shards: int = 1) -> None:
        self.dir = spool_dir
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
            log.info("resuming an interrupted replay at spool position %d", resume)
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
                "updated_ms": int(time.time() * 1000)}
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
        """Delete segments every forwarder is done with: sent (and inside no replay window), or,
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
        now_ms = time.time() * 1000
        for i in range(len(segs) - 1):           # the last segment is live: never deleted
            b, nxt = segs[i], segs[i + 1]
            if nxt > acked_pos or nxt > self.reader.pos:
                break                             # not fully forwarded (or being replayed)
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
    Positions are cumulative bytes; forwarded records are kept for the replay window."""

    def __init__(self, retain_max_bytes: int) -> None:
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
        now_ms = time.time() * 1000
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


# ---------------------------------------------------------------------------
# Control channels
# ---------------------------------------------------------------------------
class ThreadControl:
    def __init__(self) -> None:
        self._ev = threading.Event()
        self._cmds: collections.deque = collections.deque()

    def notify(self) -> None:
        self._ev.set()

    def command(self, c: str) -> None:
        self._cmds.append(c)
        self._ev.set()

    def wait(self, timeout: float) -> list[str]:
        if timeout > 0:
            self._ev.wait(timeout)
        self._ev.clear()
        out = []
        while self._cmds:
            out.append(self._cmds.popleft())
        return out


class PipeControl:
    """stdin of the forwarder process: command bytes; EOF = parent gone."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)

    def wait(self, timeout: float) -> list[str]:
        try:
            r, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        except InterruptedError:
            return []
        if not r:
            return []
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return []
        if not data:
            return ["eof"]
        out = []
        if b"d" in data:
            out.append("drain")
        if b"q" in data:
            out.append("stop")
        return out


# ---------------------------------------------------------------------------
# States and records of the forwarder loop
# ---------------------------------------------------------------------------
class State(enum.Enum):
    """What the forwarder does now (Forwarder.state). The data a state needs is in the fields
    named here; draining (``drain``) and back-off (``retry_at``) are timers valid in any state."""
    CONNECTING = "connecting"  # no Kafka producer yet: one attempt a second
    FORWARDING = "forwarding"  # read the spool, send chunks (up to 4 in flight, lingering for fuller ones)
    RESENDING = "resending"    # a chunk failed (resend_at): once nothing is in flight, rewind to its
                               # first record, back off, forward again (duplicates, never gaps)
    REPLAYING = "replaying"    # Kafka lost data (lost_reason): once nothing is in flight, probe
    PROBING = "probing"        # metadata asked at probe_since_ms: when it describes the new Kafka (or
                               # after 15 s), rewind to what Kafka may have lost, forward again


REWINDING = frozenset({State.RESENDING, State.REPLAYING, State.PROBING})  # nothing new is read
LOST = frozenset({State.REPLAYING, State.PROBING})


@dataclass(slots=True, eq=False)
class InFlight:
    """One chunk of the spool sent (one ProduceRequest per leader), not yet answered."""
    future: ChunkFuture | None  # None: none of its records is this forwarder's (other shards'/undecodable)
    start: int                  # spool position of its first record
    end: int                    # spool position after its last record
    first_seq: int
    last_seq: int
    first_ts: int               # accept time (ms) of its first record: the lag while it is out
    sent_at: float              # time.monotonic()
    records: int                # records sent (this forwarder's, decodable)


@dataclass(slots=True)
class AckedChunk:
    """An acknowledged chunk the history table may not have yet (keep_until = "history")."""
    end: int                              # spool position after it
    next_seq: int                         # seq after its last record
    offsets: dict                         # (topic, partition) -> offset after its records
    topic_ids: dict                       # topic -> topic id when written (None: unknown)

    def to_json(self) -> list:
        return [self.end, self.next_seq, [[t, p, n] for (t, p), n in self.offsets.items()], self.topic_ids]

    @classmethod
    def from_json(cls, v: list) -> "AckedChunk":
        end, next_seq, offsets, ids = v
        return cls(end, next_seq, {(t, p): n for t, p, n in offsets}, ids)


# Kafka errors that refuse a record for good: find it (one record per request) and drop it alone
REFUSED_FOR_GOOD = frozenset({"MessageSizeTooLargeError", "RecordTooLargeError", "InvalidTopicError",
                              "InvalidRecordError", "TopicAuthorizationFailedError", "CorruptRecordError"})


# ---------------------------------------------------------------------------
# The forwarder loop
# ---------------------------------------------------------------------------
class Forwarder:
    def __init__(self, source: SpoolSource | MemorySource, control: ThreadControl | PipeControl,
                 publish: Callable[[dict], None], bootstrap: str, kafka_opts: dict | None = None,
                 replay_window_seconds: float = 3600, replay_window_messages: int = 1_000_000,
                 max_inflight: int = 10000, drain_timeout: float = 5.0,
                 unreachable_after: float = 3.0, status_interval: float = 0.1,
                 shard: int = 0, shards: int = 1, keep_until: str = "kafka",
                 committed_file: str | None = None, chunk_records: int = 2000,
                 linger_ms: float | None = None, sink_key: bytes | None = None,
                 embedded: bool = False, stale_after: float = 120.0, job_file: str | None = None) -> None:
        # -- configuration
        self.source = source
        self.control = control
        self.publish = publish
        self.bootstrap = bootstrap
        self.pcfg = producer_config(bootstrap, kafka_opts)
        # keep_until = "history": records stay (and are re-sent after Kafka lost them) until the
        # history job's committed file (sink/progress.py) says the table has them
        self.keep_until = keep_until
        self.committed_file = committed_file
        # the broker's key (settings/secrets.py): signs every record; the job's committed file must
        # be signed with it. None (tests): records unsigned, the committed file taken as it is
        self._records_key = self._kid = self._committed_key = None
        if sink_key:
            self._records_key = signature_mac(secrets.derive(sink_key, secrets.RECORDS))
            self._kid = secrets.key_id(sink_key)
            self._committed_key = secrets.derive(sink_key, secrets.COMMITTED)
        # the embedded Kafka (Tansu, memory only) starts empty whenever the broker (re)starts it:
        # re-sending what it lost is routine then, not a problem to warn about
        self.embedded = embedded
        self.stale_after = stale_after      # [sink] history_stale_seconds
        self.job_file = job_file            # where the job says which committed file it writes
        self.chunk_records = chunk_records
        # how long records gather into a chunk: [sink.kafka] linger_ms, as for a Kafka producer
        self.linger = float(self.pcfg["linger_ms"] if linger_ms is None else linger_ms) / 1000
        self.shard, self.shards = shard, shards  # this forwarder sends topics with crc32 % shards == shard
        self.window_s = float(replay_window_seconds)
        self.window_n = int(replay_window_messages)
        self.max_inflight = max_inflight
        self.drain_timeout = drain_timeout
        self.unreachable_after = unreachable_after
        self.status_interval = status_interval
        # -- state (see State) and its data
        self.state = State.CONNECTING
        self.resend_at: SpoolPosition | None = None  # RESENDING (or a replay's end): the failed chunk
        self.lost_reason: str | None = None           # REPLAYING, PROBING: why Kafka lost data
        self._lost_routine = False                    # ... because the embedded Kafka restarted
        self.probe_since_ms: float | None = None      # PROBING: when fresh metadata was asked (monotonic)
        self.retry_at = 0.0                           # back-off: nothing is sent or rewound before
        self.drain_deadline: float | None = None      # draining: exit once caught up, or then
        # -- Kafka
        # None until _ensure_producer() connects (and after close()): every other use follows it
        self.producer: BatchSender = None  # type: ignore[assignment]
        self._next_producer_try = 0.0
        self.kafka_up: bool | None = None            # None: not connected yet
        self._down_since = 0.0
        self._last_ack = 0.0
        self.topic_ids: dict[str, str] = {}           # topic -> id ("" unknown): a new id = re-created
        self.offsets: dict[str, int] = {}             # "topic/partition" -> last offset written
        self._ids_valid_after = 0.0                   # topic ids cached before this (ms) are stale
        # -- reading and sending
        self.inflight: collections.deque[InFlight] = collections.deque()
        self.inflight_records = 0
        self._last_read = 0.0
        self._last_full = False                       # the last read filled its chunk: read again now
        self._lingering = False
        self._read_empty = False
        self._single_until = -1          # send one record per request up to here (find a refused one)
        self._replay_until = -1          # records sent from below here are counted as replayed
        self._stalled_ts: int | None = None           # accept time of the oldest unsent record (lag)
        self._stall_probe = 0.0
        self._last_check = 0.0
        # -- positions: acknowledged by Kafka; with keep_until = "history" also committed by the table
        self.acked_pos = 0
        self.acked_seq = 0
        self.max_acked_seq = 0
        self.pending: collections.deque[AckedChunk] = collections.deque()  # acked, not committed
        self.committed_pos = 0
        self.committed_seq = 0
        self._progress: dict[str, Any] | None = None
        self._progress_key: tuple[int, int, int] | None = None
        # -- watching the job's commits: what keeps records from being released, if anything
        self._file_state = "missing"      # ok | missing | unreadable | unsigned | bad_signature
        self._file_batch = None           # the job's last batch id seen, and when it changed:
        self._file_changed_at = 0.0
        self._waiting_since: float | None = None   # records wait for the table since (monotonic)
        self.commit_status = "ok"         # ok, or what is wrong (see _watch_commits)
        self.commit_problem = ""
        self._problem_logged: tuple[str | None, float] = (None, 0.0)
        self._not_ready_since: float | None = None
        # -- counters and exit
        self.forwarded = 0
        self.failed = 0
        self.poisoned = 0
        self.replayed = 0
        self.replays = 0
        self.stopped = False
        self.exit_reason = ""

    # -- status --------------------------------------------------------------------------------
    def _set_up(self) -> None:
        if self.kafka_up is not True:
            if self.kafka_up is False:
                log.info("Kafka at %s is reachable again after %.1fs; forwarding spooled records",
                         self.bootstrap, time.monotonic() - self._down_since)
            else:
                log.info("connected to Kafka at %s", self.bootstrap)
            self.kafka_up = True

    def _set_down(self, why: object) -> None:
        if self.kafka_up is not False:
            log.warning("Kafka at %s is unavailable (%s); records stay in the spool until it is back",
                        self.bootstrap, why)
            self.kafka_up = False
            self._down_since = time.monotonic()

    def status(self) -> dict:
        now_ms = time.time() * 1000
        if self.inflight:
            ts = self.inflight[0].first_ts
        elif self._stalled_ts is not None:
            ts = self._stalled_ts
        else:
            ts = None
        lag = max(0.0, (now_ms - ts) / 1000) if ts is not None else 0.0
        rpos, rseq = self.retained()
        return dict(pos=self.acked_pos, seq=self.acked_seq, forwarded=self.forwarded, failed=self.failed,
                    poisoned=self.poisoned, replayed=self.replayed, replays=self.replays,
                    kafka_up=bool(self.kafka_up), lag_seconds=round(lag, 3), inflight=self.inflight_records,
                    retained_pos=rpos, retained_seq=rseq,
                    committed_seq=self.committed_seq if self.keep_until == "history" else None,
                    commit_status=self.commit_status, commit_problem=self.commit_problem,
                    commit_waiting_seconds=round(time.monotonic() - self._waiting_since, 1)
                    if self._waiting_since is not None else 0.0)

    def retained(self) -> SpoolPosition:
        """From where the spool must keep records."""
        if self.keep_until == "history":
            return SpoolPosition(min(self.committed_pos, self.acked_pos), min(self.committed_seq, self.acked_seq))
        return SpoolPosition(self.acked_pos, self.acked_seq)

    def kafka_state(self) -> dict:
        st = {"topic_ids": self.topic_ids, "offsets": self.offsets}
        if self.keep_until == "history":
            self._merge_pending(256)
            st["pending"] = [c.to_json() for c in self.pending]
        return st

    def _merge_pending(self, limit: int) -> None:
        """Keep the list short by merging neighbours (conservative: a merged entry is committed
        only when all of it is)."""
        pend = self.pending
        while len(pend) > limit:
            out: collections.deque[AckedChunk] = collections.deque()
            it = iter(pend)
            for a in it:
                b = next(it, None)
                if b is None:
                    out.append(a)
                    break
                offsets = dict(a.offsets)
                for tp, n in b.offsets.items():
                    offsets[tp] = max(n, offsets.get(tp, 0))
                out.append(AckedChunk(b.end, b.next_seq, offsets, {**a.topic_ids, **b.topic_ids}))
            pend = out
        self.pending = pend

    # -- what the history table has committed ---------------------------------------------------
    def _read_progress(self) -> None:
        path = self.committed_file
        if not path:
            return
        try:
            st = os.stat(path)
        except OSError:
            self._file_state, self._progress_key = "missing", None
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._progress_key:
            return
        self._progress_key = key
        data = progress.read_committed(path, self._committed_key)
        if data is None:
            self._file_state = "unreadable"
            return
        if data["signature"] in ("unsigned", "bad"):
            # anyone who can write the file would make the spool delete records: not trusted
            self._file_state = "unsigned" if data["signature"] == "unsigned" else "bad_signature"
            return
        for t in data["topics"].values():      # "" (unknown) and null mean the same
            t["topic_id"] = t["topic_id"] or None
        self._progress, self._file_state = data, "ok"
        if data.get("batch_id") != self._file_batch:
            self._file_batch, self._file_changed_at = data.get("batch_id"), time.monotonic()

    def _advance_committed(self) -> None:
        """Drop from `pending` what the table has; the committed position follows."""
        self._read_progress()
        state = self._progress
        pend = self.pending
        is_committed = progress.is_committed
        if self.state in LOST:
            return                             # pending is about to be replayed and cleared
        moved = False
        while pend:
            c = pend[0]
            if not all(is_committed(state, t, c.topic_ids.get(t), p, n - 1) for (t, p), n in c.offsets.items()):
                break
            pend.popleft()
            self.committed_pos, self.committed_seq = c.end, c.next_seq
            moved = True
        if (not pend and not self.inflight and self.state not in REWINDING
                and self.source.pos >= self.acked_pos):
            # everything acked was committed (or skipped: torn tails, other shards' records)
            self.committed_pos = max(self.committed_pos, self.acked_pos)
            self.committed_seq = max(self.committed_seq, self.acked_seq)
        if pend and state is not None:
            self._replay_dead_incarnation(pend[0], state)
        now = time.monotonic()
        if moved or not pend:
            self._waiting_since = None if not pend else now
        elif self._waiting_since is None:
            self._waiting_since = now
        self._watch_commits(now)

    def _replay_dead_incarnation(self, head: AckedChunk, state: dict) -> None:
        """The oldest uncommitted chunk was acknowledged under a topic id (or none known) that
        is neither Kafka's nor the job's any more: its records went with that incarnation of the
        topic, and no commit of the job can ever cover it. Send again what the table lacks."""
        for (t, _p) in head.offsets:
            cur = self.topic_ids.get(t) or None
            job = state["topics"].get(t)
            if cur and job is not None and job["topic_id"] == cur and head.topic_ids.get(t) != cur:
                self._lost(f"the oldest records the history table lacks were written to {t} under "
                           f"topic id {head.topic_ids.get(t) or '(unknown)'}; Kafka and the job now "
                           f"have {cur}")
                return

    def _head_blocker(self, state: dict | None) -> str | None:
        """Why the job's commits cannot cover the oldest waiting chunk (None: they can, once
        the job gets that far)."""
        if state is None or not self.pending:
            return None
        head = self.pending[0]
        for (t, _p), _n in head.offsets.items():
            job = state["topics"].get(t)
            if job is None:
                return (f"the history job does not report Kafka topic {t} (does it read it? "
                        "[history] kafka_topics)")
            if job["topic_id"] != head.topic_ids.get(t):
                return (f"the job reads {t} under topic id {job['topic_id']}, these records were "
                        f"written under {head.topic_ids.get(t)}")
        return None

    def _other_table(self, job: dict | None) -> str | None:
        # (keep_until = "history" only, where committed_file is given)
        if job is None or job["committed_file"] == os.path.abspath(self.committed_file):  # type: ignore[type-var]
            return None
        return (f"the history job (pid {job.get('pid')}) writes table {job.get('table')} and "
                f"reports its commits in {job['committed_file']}, but this broker reads "
                f"{self.committed_file}: start both with one config ([history] table/checkpoint, "
                "no --table/--checkpoint flags) or set [sink] committed_file")

    def _watch_commits(self, now: float) -> None:
        """keep_until = "history": say at once what keeps records in the spool (no committed
        file and no job running, an unsigned file, a job writing another table's), or when they
        have waited stale_after seconds with no commit, or while the job commits others."""
        status, problem = "ok", ""
        if self._waiting_since is not None:
            waited = now - self._waiting_since
            n = max(0, self.acked_seq - self.committed_seq)
            path = self.committed_file
            fs = self._file_state
            job = progress.running_job(self.job_file) if fs != "ok" or waited > self.stale_after else None
            other = self._other_table(job)
            if other:
                status, problem = "other_table", other
            elif fs == "missing" and job is not None:    # a job that has not committed yet
                if waited > self.stale_after:
                    status, problem = "stale", (f"the history job (pid {job.get('pid')}) has not "
                                                f"committed anything yet ({path})")
            elif fs != "ok":
                status, problem = fs, {
                    "missing": f"no committed file {path} and no history job running with this "
                               "data directory (python -m sink.job --config <the broker's config>)",
                    "unreadable": f"the history job's committed file {path} cannot be read",
                    "unsigned": f"the committed file {path} is not signed: it is ignored (a job "
                                "started before the broker made its key signs its next commit)",
                    "bad_signature": f"the committed file {path} is signed with another key "
                                     "(forged, or a job using another data directory): it is ignored",
                }[fs]
            elif waited > self.stale_after:
                blocker = self._head_blocker(self._progress)
                if blocker and self._file_changed_at > self._waiting_since:
                    status, problem = "stalled", f"the history job commits, but {blocker}"
                elif now - self._file_changed_at > self.stale_after:
                    status, problem = "stale", (f"the history job has committed nothing for "
                                                f"{now - self._file_changed_at:.0f} s ({path})")
            if problem:
                problem += (f"; {n} records kept in the spool for {waited:.0f} s (at "
                            "spool_max_bytes QoS 1/2 publishers get 0x97)")
        self.commit_status, self.commit_problem = status, problem
        last, at = self._problem_logged
        if status != last or (status != "ok" and now - at > 600):
            if status != "ok":
                log.warning("records wait for the history table: %s", problem)
            elif last is not None and last != "ok":
                log.info("the history job's commits release spooled records again")
            self._problem_logged = (status, now)

    # -- kafka ------------------------------------------------------------------------------------
    def _ensure_producer(self) -> bool:
        if self.producer is not None:
            return True
        now = time.monotonic()
        if now < self._next_producer_try:
            return False
        self._next_producer_try = now + 1.0
        try:
            self.producer = BatchSender(self.pcfg)
        except Exception as exc:  # NoBrokersAvailable / KafkaTimeoutError / config errors
            self._set_down(f"{type(exc).__name__}: {exc}")
            return False
        self.state = State.FORWARDING                 # CONNECTING -> FORWARDING (or at once REPLAYING:)
        # load metadata of topics we produced to before, to notice re-created topics
        for t in list(self.topic_ids):
            try:
                self.producer.partitions_for(t, wait_ms=int(self.pcfg.get("max_block_ms", 1000)))
            except Exception:
                pass
        self._check_topic_ids()
        self._set_up()
        return True

    def _metadata(self) -> Any:  # kafka_client's cluster metadata, if the producer has one
        return getattr(self.producer, "cluster", None)

    def _check_topic_ids(self) -> None:
        md = self._metadata()
        if md is None or not hasattr(md, "topic_id"):
            return
        if getattr(md, "_last_successful_refresh_ms", 0) < self._ids_valid_after:
            return                      # ids cached from before the last replay: wait for fresh ones
        for t, known in list(self.topic_ids.items()):
            try:
                cur = md.topic_id(t)
            except Exception:
                return
            if cur is None:
                continue
            cur = str(cur)
            if not known:
                self.topic_ids[t] = cur
            elif cur != known:
                self.topic_ids[t] = cur
                self._lost(f"topic {t} was re-created (topic id {known} -> {cur})", routine=True)

    def _metadata_fresh(self) -> bool | None:
        md = self._metadata()
        ts = getattr(md, "_last_successful_refresh_ms", None)
        if not ts:
            return None
        age = time.monotonic() * 1000 - ts
        return age < self.pcfg.get("metadata_max_age_ms", 300000) + 2000

    # -- transitions ---------------------------------------------------------------------------------
    def _lost(self, reason: str, routine: bool = False) -> None:
        """Kafka lost data: -> REPLAYING (kept while a replay is already under way). `routine`:
        the embedded Kafka restarted empty, as it does whenever the broker starts it (the replay
        logs one INFO line); anything else is a WARNING."""
        if self.state not in LOST:
            self.state = State.REPLAYING
            self.lost_reason = reason
            self._lost_routine = routine and self.embedded
            if not self._lost_routine:
                log.warning("Kafka lost data: %s", reason)

    def _chunk_failed(self, c: InFlight) -> None:
        """-> RESENDING from the chunk's first record (a replay under way ends there instead)."""
        self.resend_at = SpoolPosition(c.start, c.first_seq)
        if self.state not in LOST:
            self.state = State.RESENDING

    def _forward_from(self, pos: int, seq: int | None) -> None:
        """RESENDING/PROBING -> FORWARDING: read again from pos."""
        self.state = State.FORWARDING
        self.resend_at = self.lost_reason = self.probe_since_ms = None
        self.source.seek(pos, seq)

    # -- acknowledgements ------------------------------------------------------------------------------
    def _reap(self) -> None:
        inflight = self.inflight
        while inflight:
            c = inflight[0]
            fut = c.future
            if fut is not None and not fut.poll():
                break
            inflight.popleft()
            self.inflight_records -= c.records
            if self.resend_at is not None:
                continue                      # will be sent again
            if fut is None or fut.exception is None:
                self._acked(c, fut)
            else:
                self._refused(c, fut.exception)

    def _acked(self, c: InFlight, fut: ChunkFuture | None) -> None:
        tps = {}
        if fut is not None:
            for (topic, part), base in fut.value.items():  # type: ignore[union-attr]  # answered
                tp = f"{topic}/{part}"
                last = self.offsets.get(tp)
                if last is not None and base <= last and self.state not in LOST:
                    self._lost(f"offset of {tp} went back from {last} to {base}", routine=True)
                n = fut.counts[(topic, part)]
                self.offsets[tp] = base + n - 1
                tps[(topic, part)] = base + n
                if not self.topic_ids.get(topic):
                    m = self._metadata()
                    tid = m.topic_id(topic) if m is not None and hasattr(m, "topic_id") else None
                    self.topic_ids[topic] = str(tid) if tid else ""
                    if not tid and hasattr(self.producer, "request_update"):
                        self.producer.request_update()   # learn it before the next chunk
            self._set_up()
            self._last_ack = time.monotonic()
        next_seq = c.last_seq + 1
        if self.keep_until == "history" and self.state not in LOST:
            self.pending.append(AckedChunk(c.end, next_seq, tps,
                                           {t: self.topic_ids.get(t) or None for t, _ in tps}))
        self.acked_pos = max(self.acked_pos, c.end)
        if next_seq > self.acked_seq:
            self.acked_seq = next_seq
        if next_seq > self.max_acked_seq:
            new = next_seq - max(self.max_acked_seq, c.first_seq)
            self.max_acked_seq = next_seq
            if fut is not None:
                self.forwarded += min(c.records, max(0, new))

    def _refused(self, c: InFlight, exc: Exception) -> None:
        retriable = getattr(exc, "retriable", False) or "Timeout" in type(exc).__name__
        if not retriable and type(exc).__name__ in REFUSED_FOR_GOOD:
            if c.records == 1:
                log.error("Kafka refused record seq=%d for good (%s): dropped", c.last_seq, exc)
                self.poisoned += 1
                self.failed += 1
                self.acked_pos = max(self.acked_pos, c.end)
                self.acked_seq = max(self.acked_seq, c.last_seq + 1)
                return
            self._single_until = c.end     # find the refused record: one per request
        self.failed += c.records
        self._set_down(f"{type(exc).__name__}: {exc}")
        self._chunk_failed(c)
        self._stalled_ts = c.first_ts

    # -- sending ---------------------------------------------------------------------------------------
    def _fill(self) -> bool:
        if len(self.inflight) >= 4:           # chunks (requests) in flight
            return False
        now = time.monotonic()
        if not self._last_full and now - self._last_read < self.linger:
            self._lingering = True            # let a few ms of records gather: fewer, larger requests
            return False
        self._lingering = False
        room = self.max_inflight - self.inflight_records
        if room <= 0:
            return False
        single = self.source.pos < self._single_until
        want = 1 if single else min(room, self.chunk_records)
        batch = self.source.read(want, 1 << 20)
        got = len(batch)
        self._read_empty = not got
        self._last_read = now
        self._last_full = got >= want
        if not got:
            if not self.inflight:
                self._stalled_ts = None
                self.acked_pos = max(self.acked_pos, self.source.pos)
            return False
        groups: dict[bytes, list] = {}
        n_own = 0
        first_ts = None
        shards, shard = self.shards, self.shard
        rk, kid = self._records_key, self._kid
        for seq, payload in zip(batch.seqs, batch.payloads):
            try:
                if shards > 1 and entry_shard(payload, shards) != shard:
                    continue  # another forwarder's topic (per-topic order stays within one forwarder)
                kt, ts, body = entry_fields(payload)
            except (ValueError, struct.error, IndexError) as exc:
                log.error("undecodable spool record seq=%d skipped: %s", seq, exc)
                continue
            if first_ts is None:
                first_ts = ts
            lst = groups.get(kt)
            if lst is None:
                groups[kt] = lst = []
            if rk is not None:
                body = sign_body(body, kt, ts, rk, kid)  # type: ignore[arg-type]  # kid set with rk
            lst.append((ts, body))
            n_own += 1
        start, first_seq = batch.start, batch.first_seq
        if first_ts is None:
            p0 = batch.payloads[0]
            first_ts = entry_timestamp(p0) if len(p0) >= 9 else 0
        fut = None
        if groups:
            try:
                fut = self.producer.send({k.decode(errors="replace"): v for k, v in groups.items()})
            except NotReady as exc:
                self.source.seek(start, first_seq)
                self._stalled_ts = first_ts
                self.retry_at = time.monotonic() + 0.05
                # a new topic has no leader for a moment (Kafka is creating it): only a wait
                # longer than unreachable_after means Kafka is not there
                if self._not_ready_since is None:
                    self._not_ready_since = time.monotonic()
                elif time.monotonic() - self._not_ready_since > self.unreachable_after:
                    self._set_down(str(exc))
                return True
            except Exception as exc:
                name = type(exc).__name__
                if "Timeout" in name or getattr(exc, "retriable", False):
                    self._set_down(f"{name}: {exc}")
                    self.source.seek(start, first_seq)
                    self._stalled_ts = first_ts
                    self.retry_at = time.monotonic() + 0.5
                    return True
                raise
        self._not_ready_since = None
        if start < self._replay_until:
            self.replayed += n_own
        self.inflight.append(InFlight(fut, start, batch.end, first_seq, batch.last_seq, first_ts,
                                      time.monotonic(), n_own))
        self.inflight_records += n_own
        return True

    def _rewind(self) -> None:
        """RESENDING, REPLAYING, PROBING: act once nothing is in flight."""
        if self.inflight:
            return                            # wait until nothing is in flight
        if self.state in LOST:
            # Tansu acknowledges records produced to a topic it no longer has (after a restart)
            # and drops them; only a Metadata request re-creates the topic. So refresh the
            # metadata first (PROBING) and replay only once it describes the new Kafka.
            md = self._metadata()
            mono_ms = time.monotonic() * 1000
            if md is not None and hasattr(md, "request_update"):
                if self.state is State.REPLAYING:
                    self.state = State.PROBING
                    self.probe_since_ms = mono_ms
                    md.request_update()
                    return
                # (PROBING: probe_since_ms is set)
                fresh = getattr(md, "_last_successful_refresh_ms", mono_ms) > self.probe_since_ms + 1  # type: ignore[operator]
                # and names every topic: a topic the restarted Kafka has not re-created yet has
                # no id, and chunks acknowledged without one could never be matched to a commit
                if not fresh or not all(md.topic_id(t) for t in self.topic_ids
                                        if hasattr(md, "topic_id")):
                    if mono_ms - self.probe_since_ms < 15000:  # type: ignore[operator]
                        md.request_update()
                        self.retry_at = time.monotonic() + 0.05
                        return
                for t in self.topic_ids:
                    tid = md.topic_id(t) if hasattr(md, "topic_id") else None
                    self.topic_ids[t] = str(tid) if tid else ""
                self._ids_valid_after = mono_ms
            now_ms = int(time.time() * 1000)
            upto = self.acked_pos if self.resend_at is None else self.resend_at.pos
            if self.keep_until == "history":
                start = min(self.committed_pos, upto)  # everything the table does not have yet
                self.pending.clear()
            elif self.window_s > 0 and self.window_n > 0:
                start = self.source.find_position(self.max_acked_seq - self.window_n,
                                                  now_ms - int(self.window_s * 1000), upto)
            else:
                start = upto
            self.replays += 1
            self._replay_until = max(self._replay_until, upto)
            what = ("not yet committed by the history job" if self.keep_until == "history"
                    else "forwarded in the replay window")
            if self._lost_routine:   # one line says what was recovered
                log.info("the embedded Kafka started empty (memory storage, %s): sending again the "
                         "records %s (spool positions %d-%d, %d bytes)", self.lost_reason, what,
                         start, upto, upto - start)
            else:
                log.warning("replaying the records %s (from spool position %d to %d, %d bytes)",
                            what, start, upto, upto - start)
            self.offsets = {}
            self._forward_from(start, None)
        else:                                 # RESENDING
            pos, seq = self.resend_at  # type: ignore[misc]  # RESENDING: set
            self._forward_from(pos, seq)
            self.retry_at = time.monotonic() + 0.5

    # -- main loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        ck = self.source.load()
        self.acked_pos, self.acked_seq, kstate = ck.pos, ck.seq, ck.kafka
        self.max_acked_seq = self.acked_seq
        self.topic_ids = dict(kstate.get("topic_ids") or {})
        self.offsets = {k: int(v) for k, v in (kstate.get("offsets") or {}).items()}
        if self.keep_until == "history":
            c = self.source.committed()
            self.committed_pos, self.committed_seq = c if c is not None else (self.acked_pos, self.acked_seq)
            if self.committed_pos < self.acked_pos:   # sent before the restart, not yet committed
                self.pending = collections.deque(AckedChunk.from_json(v) for v in kstate.get("pending") or ())
                if not self.pending:                  # unknown offsets: send them again
                    self._replay_until = self.acked_pos
                    self.source.seek(self.committed_pos, None)
        last_status = last_ckpt = last_house = 0.0
        timeout = 0.0
        try:
            while True:
                if self.inflight and self.producer is not None and timeout > 0:
                    cmds = self.control.wait(0)         # wait on Kafka: an answer wakes us at once
                    try:
                        self.producer.poll(int(timeout * 1000))
                    except Exception as exc:
                        log.debug("poll: %s", exc)
                elif self._lingering and timeout > 0:
                    # records gather until the linger ends: the spool's notifications would only
                    # wake us early (hundreds of times a second under load)
                    cmds = self.control.wait(0)
                    time.sleep(timeout)
                else:
                    cmds = self.control.wait(timeout)
                for cmd in cmds:
                    if cmd in ("stop", "eof"):
                        self.exit_reason = cmd
                        return
                    if cmd == "drain" and self.drain_deadline is None:
                        self.drain_deadline = time.monotonic() + self.drain_timeout
                now = time.monotonic()
                busy = self.step(now)
                if now - last_status >= self.status_interval:
                    last_status = now
                    self.publish(self.status())
                if now - last_ckpt >= 0.5:
                    last_ckpt = now
                    if self.keep_until == "history":
                        self._advance_committed()
                    self.source.commit(self.acked_pos, self.acked_seq, self.kafka_state(), self._resume_pos(),
                                       committed=self._committed_ckpt())
                if now - last_house >= 1.0:
                    last_house = now
                    self.source.housekeeping(self.acked_pos, self.acked_seq, self.window_s, self.window_n,
                                             keep_from=self.retained().pos if self.keep_until == "history"
                                             else None)
                if self.drain_deadline is not None:
                    caught_up = self._read_empty and not self.inflight and self.state not in REWINDING
                    if caught_up or now > self.drain_deadline:
                        if not caught_up:
                            log.warning("drain timeout; unforwarded records stay in the spool")
                        self.exit_reason = "drained"
                        return
                timeout = (0.0 if busy else 0.002 if self.inflight else
                           max(0.0005, self._last_read + self.linger - now) if self._lingering else 0.05)
        finally:
            self._shutdown()

    def step(self, now: float) -> bool:
        """One turn of the state machine: connect, take the answers, check Kafka once a second,
        then rewind or send. -> whether a chunk was sent (turn again at once)."""
        if not self._ensure_producer():
            if self._stalled_ts is None and now - self._stall_probe > 1.0:
                self._stall_probe = now
                self._stalled_ts = self.source.ts_at(self.acked_pos)
            return False
        self.producer.poll(0)
        self._reap()
        if now - self._last_check > 1.0:
            self._last_check = now
            self._check_kafka(now)
        if now < self.retry_at:
            return False
        if self.state in REWINDING:
            self._rewind()
            return False
        return self._fill()

    def _check_kafka(self, now: float) -> None:
        """Once a second: re-created topics, stale metadata, a chunk unanswered for too long."""
        self.producer.maybe_refresh()
        self._check_topic_ids()
        fresh = self._metadata_fresh()
        if fresh is False and now - self._last_ack > self.unreachable_after:
            self._set_down("no metadata from Kafka for a while")
        elif fresh and self.kafka_up is False and not self.inflight and self.resend_at is None:
            self._set_up()
        oldest = self.inflight[0] if self.inflight else None
        if oldest is not None and now - oldest.sent_at > self.unreachable_after \
                and oldest.future is not None and not oldest.future.poll():
            self._set_down(f"no acknowledgement for {self.unreachable_after:.0f}s")

    def _resume_pos(self) -> int:
        """Where a restarted forwarder must start reading: the first record not acknowledged
        (below acked_pos only while a replay is in progress)."""
        if self.resend_at is not None:
            p = self.resend_at.pos
        elif self.inflight:
            p = self.inflight[0].start
        else:
            p = self.source.pos
        return min(p, self.acked_pos)

    def _committed_ckpt(self) -> SpoolPosition | None:
        return self.retained() if self.keep_until == "history" else None

    def _shutdown(self) -> None:
        if self.producer is not None:
            deadline = time.monotonic() + (1 if self.exit_reason != "eof" else 0)
            while self.inflight and time.monotonic() < deadline:
                try:
                    self.producer.poll(10)
                except Exception:
                    break
                self._reap()
            self._reap()
            self.producer.close()
            self.producer = None  # type: ignore[assignment]  # (see __init__)
        try:
            if self.keep_until == "history":
                self._advance_committed()
            self.source.commit(self.acked_pos, self.acked_seq, self.kafka_state(), self._resume_pos(), force=True,
                               committed=self._committed_ckpt())
        except Exception as exc:
            log.error("cannot write checkpoint: %s", exc)
        self.publish(self.status())
        self.source.close()
        self.stopped = True


@dataclass(slots=True)
class Runtime:
    """What a forwarder needs besides its [sink] section: what the broker's Sink found when it
    started. The process gets both on its stdin (``encode_setup``), never on its command line."""
    spool_dir: str                      # [sink] spool_dir resolved ("" = <data_dir>/spool)
    data_dir: str                       # the broker's: the history job says there which file it writes
    bootstrap: str                      # [sink] bootstrap_servers, or the embedded Kafka's address
    embedded: bool = False              # the broker's embedded Kafka (empty after a restart: routine)
    committed_file: str | None = None   # keep_until = "history": the job's committed file
    table: str = HistoryConfig().table  # [history] table: the job writing it says so in job_file
    sink_key: bytes | None = None       # the broker's key (settings/secrets.py); None: unsigned
    shard: int = 0                      # this forwarder sends the topics with crc32 % shards == shard
    shards: int = 1
    watch_pid: int | None = None        # the embedded Kafka: stopped if the broker dies first
    log_level: int = logging.INFO

    @property
    def job_file(self) -> str | None:
        return progress.job_file(self.data_dir, self.table) if self.data_dir else None

    def to_json(self) -> dict:
        out = {f: getattr(self, f) for f in self.__slots__}
        out["sink_key"] = self.sink_key.hex() if self.sink_key else None
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Runtime":
        d = dict(d)
        d["sink_key"] = bytes.fromhex(d["sink_key"]) if d.get("sink_key") else None
        return cls(**d)


def forwarder_for(sink: SinkConfig, rt: Runtime, source: SpoolSource | MemorySource,
                  control: ThreadControl | PipeControl, publish: Callable[[dict], None]) -> Forwarder:
    """The forwarder of a [sink] section: the one mapping of its keys onto a Forwarder (the
    process's and the thread's alike)."""
    return Forwarder(source, control, publish, rt.bootstrap, sink.kafka,
                     sink.replay_window_seconds, sink.replay_window_messages, sink.max_inflight,
                     sink.drain_timeout_seconds, shard=rt.shard, shards=rt.shards,
                     keep_until=sink.keep_until, committed_file=rt.committed_file,
                     sink_key=rt.sink_key, embedded=rt.embedded,
                     stale_after=sink.history_stale_seconds, job_file=rt.job_file)


def encode_setup(sink: SinkConfig, rt: Runtime) -> bytes:
    """The forwarder process's first stdin line: its [sink] section as the tree serializes it
    (Section.to_table) and its Runtime."""
    return json.dumps({"sink": sink.to_table(), "runtime": rt.to_json()}).encode() + b"\n"


def decode_setup(line: bytes) -> tuple[SinkConfig, Runtime]:
    """encode_setup's line back: the section checked by the tree again (a ConfigError names a
    key), the Runtime."""
    d = json.loads(line)
    return SinkConfig.from_table(d["sink"]), Runtime.from_json(d["runtime"])


# ---------------------------------------------------------------------------
# Process entry point: python -m sink.forward.forwarder   (setup = first stdin line, JSON)
# ---------------------------------------------------------------------------
def main() -> int:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            return 1
        line += chunk
    sink, rt = decode_setup(line)
    logging.basicConfig(level=rt.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    if logging.getLogger("kafka").level == logging.NOTSET:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the broker decides when we stop
    if sink.forwarder_cpus:  # keep the forwarder off the broker's core when asked to
        os.sched_setaffinity(0, sink.forwarder_cpus)
    shard, shards = rt.shard, rt.shards
    lock = DirLock(rt.spool_dir, "forwarder.lock" if shards <= 1 else f"forwarder-{shard}.lock")
    lock.acquire(timeout=15)
    out = sys.stdout.buffer

    def publish(st: dict) -> None:
        try:
            out.write(json.dumps(st).encode() + b"\n")
            out.flush()
        except (BrokenPipeError, ValueError):
            pass

    fwd = forwarder_for(sink, rt, SpoolSource(rt.spool_dir, sink.spool_max_bytes, shard, shards),
                        PipeControl(0), publish)
    try:
        fwd.run()
    finally:
        lock.release()
        if fwd.exit_reason == "eof" and rt.watch_pid:
            # the broker died without closing us: don't leave its embedded Kafka behind
            try:
                os.kill(rt.watch_pid, signal.SIGTERM)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
