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
back-off); Kafka lost data -> REFILLING -> PROBING (fresh metadata) -> FORWARDING (from the
first record Kafka may have lost: the refill). Chunks in flight are :class:`InFlight` records;
with keep_until = "history" acknowledged chunks wait as AckedChunk records until committed
(sink/forward/commit_watch.py: :class:`CommitWatcher` follows the history job's commits). Every time is read from the
Forwarder's injected clocks (``clock``, ``wall_clock``).

Kafka losing data (embedded Tansu restarted empty, topic re-created) is
detected, not assumed (sink/forward/loss.py, :class:`LossDetector`): a partition offset that
goes backwards in a produce acknowledgement, or a topic id that changes in the metadata (topic
ids and last offsets are kept in the checkpoint so this also works across restarts). The ids
are checked in every metadata refresh before the next chunk is sent, and after a failed request
nothing is sent until metadata refreshed since then came in: otherwise records sent to a Kafka
that restarted empty go into the new log (a topic another client made again) before the refill
of what it lost, and per-topic order breaks. Then:

* ``keep_until = "history"``: every record the history job has not committed yet
  (sink/history/commits.py; the forwarder remembers, per acknowledged chunk, the next offset of
  each partition it wrote and the topic id, and keeps that list in its checkpoint) is sent
  again. Spool segments are deleted only once committed.
* ``keep_until = "kafka"``: the refill window is re-sent: records already forwarded whose
  accept time is within ``replay_window_seconds`` and that are among the last
  ``replay_window_messages`` (the settings keep their names).

Each record keeps its ``mqtt.message_id``, so consumers can drop the duplicates; per MQTT
topic, the last occurrence of each message id is in submit order.
"""
from __future__ import annotations

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
from typing import Any, Callable

from kafka_client.headers import signature_mac
from kafka_client.produce import BatchSender, ChunkFuture, NotReady
from kafka_client.record import entry_fields, entry_shard, entry_timestamp, sign_body
from settings import HistoryConfig, SinkConfig, secrets

from ..history import commits
from .commit_watch import AckedChunk, CommitWatcher
from .loss import LossDetector
from .sources import MemorySource, SpoolSource
from .spool import DirLock, SpoolPosition

log = logging.getLogger(__spec__.name if __name__ == "__main__" else __name__)  # (python -m: its module path)

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
    REFILLING = "refilling"    # Kafka lost data (lost_reason): once nothing is in flight, probe
    PROBING = "probing"        # metadata asked at probe_since_ms: when it describes the new Kafka (or
                               # after 15 s), rewind to what Kafka may have lost, forward again


REWINDING = frozenset({State.RESENDING, State.REFILLING, State.PROBING})  # nothing new is read
LOST = frozenset({State.REFILLING, State.PROBING})


@dataclass(slots=True, eq=False)
class InFlight:
    """One chunk of the spool sent (one ProduceRequest per leader), not yet answered."""
    future: ChunkFuture | None  # None: none of its records is this forwarder's (other shards'/undecodable)
    start: int                  # spool position of its first record
    end: int                    # spool position after its last record
    first_seq: int
    last_seq: int
    first_ts: int               # accept time (ms) of its first record: the lag while it is out
    sent_at: float              # Forwarder.clock()
    records: int                # records sent (this forwarder's, decodable)


# Kafka errors that refuse a record for good: find it (one record per request) and drop it alone
REFUSED_FOR_GOOD = frozenset({"MessageSizeTooLargeError", "RecordTooLargeError", "InvalidTopicError",
                              "InvalidRecordError", "TopicAuthorizationFailedError", "CorruptRecordError"})


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
        return commits.job_file(self.data_dir, self.table) if self.data_dir else None

    def to_json(self) -> dict:
        out = {f: getattr(self, f) for f in self.__slots__}
        out["sink_key"] = self.sink_key.hex() if self.sink_key else None
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Runtime":
        d = dict(d)
        d["sink_key"] = bytes.fromhex(d["sink_key"]) if d.get("sink_key") else None
        return cls(**d)


# ---------------------------------------------------------------------------
# The forwarder loop
# ---------------------------------------------------------------------------
class Forwarder:
    """The sending state machine: spool -> Kafka. What Kafka lost is noticed by its
    :class:`LossDetector`; with keep_until = "history" the job's commits are followed by its
    :class:`CommitWatcher`. Every time is read from `clock` (monotonic seconds) and `wall_clock`
    (seconds since the epoch, to compare with the records' accept times)."""

    def __init__(self, sink: SinkConfig, rt: Runtime, source: SpoolSource | MemorySource,
                 control: ThreadControl | PipeControl, publish: Callable[[dict], None], *,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 unreachable_after: float = 3.0, status_interval: float = 0.1,
                 chunk_records: int = 2000) -> None:
        # -- configuration: the [sink] section and what the broker's Sink found (Runtime)
        self.source = source
        self.control = control
        self.publish = publish
        self.clock = clock
        self.wall_clock = wall_clock
        self.bootstrap = rt.bootstrap
        self.pcfg = producer_config(rt.bootstrap, sink.kafka)
        # the broker's key (settings/secrets.py): signs every record; the job's committed file must
        # be signed with it. None (tests): records unsigned, the committed file taken as it is
        self._records_key = self._kid = None
        committed_key = None
        if rt.sink_key:
            self._records_key = signature_mac(secrets.derive(rt.sink_key, secrets.RECORDS))
            self._kid = secrets.key_id(rt.sink_key)
            committed_key = secrets.derive(rt.sink_key, secrets.COMMITTED)
        # keep_until = "history": records stay (and are re-sent after Kafka lost them) until the
        # history job's committed file (sink/history/commits.py) says the table has them
        self.commits = CommitWatcher(rt.committed_file, committed_key, rt.job_file, sink.history_stale_seconds,
                                     clock) if sink.keep_until == "history" else None
        self.loss = LossDetector()
        # the embedded Kafka (Tansu, memory only) starts empty whenever the broker (re)starts it:
        # re-sending what it lost is routine then, not a problem to warn about
        self.embedded = rt.embedded
        self.chunk_records = chunk_records
        # how long records gather into a chunk: [sink.kafka] linger_ms, as for a Kafka producer
        self.linger = float(self.pcfg["linger_ms"]) / 1000
        self.shard, self.shards = rt.shard, rt.shards  # this forwarder sends topics with crc32 % shards == shard
        self.window_s = float(sink.replay_window_seconds)
        self.window_n = int(sink.replay_window_messages)
        self.max_inflight = sink.max_inflight
        self.drain_timeout = sink.drain_timeout_seconds
        self.unreachable_after = unreachable_after
        self.status_interval = status_interval
        # -- state (see State) and its data
        self.state = State.CONNECTING
        self.resend_at: SpoolPosition | None = None  # RESENDING (or a refill's end): the failed chunk
        self.lost_reason: str | None = None           # REFILLING, PROBING: why Kafka lost data
        self._lost_routine = False                    # ... because the embedded Kafka restarted
        self.probe_since_ms: float | None = None      # PROBING: when fresh metadata was asked (clock)
        # a request failed at this time (clock, ms): no chunk is sent before metadata refreshed
        # since has been checked for topics made again (see _metadata_checked)
        self.failed_since_ms: float | None = None
        self._ids_checked_ms: float | None = None     # the metadata refresh topic ids were last checked in
        self.retry_at = 0.0                           # back-off: nothing is sent or rewound before
        self.drain_deadline: float | None = None      # draining: exit once caught up, or then
        # -- Kafka
        # None until _ensure_producer() connects (and after close()): every other use follows it
        self.producer: BatchSender = None  # type: ignore[assignment]
        self._next_producer_try = 0.0
        self.kafka_up: bool | None = None            # None: not connected yet
        self._down_since = 0.0
        self._last_ack = 0.0
        # -- reading and sending
        self.inflight: collections.deque[InFlight] = collections.deque()
        self.inflight_records = 0
        self._last_read = 0.0
        self._last_full = False                       # the last read filled its chunk: read again now
        self._lingering = False
        self._read_empty = False
        self._single_until = -1          # send one record per request up to here (find a refused one)
        self._refill_until = -1          # records sent from below here are counted as refilled
        self._stalled_ts: int | None = None           # accept time of the oldest unsent record (lag)
        self._stall_probe = 0.0
        self._last_check = 0.0
        self._not_ready_since: float | None = None
        # -- positions acknowledged by Kafka (with keep_until = "history" the table's: self.commits)
        self.acked_pos = 0
        self.acked_seq = 0
        self.max_acked_seq = 0
        # -- counters and exit
        self.forwarded = 0
        self.failed = 0
        self.poisoned = 0
        self.refilled = 0    # records sent again after Kafka lost data (stats: "replayed")
        self.refills = 0     # times Kafka lost data and records were sent again ("replays")
        self.stopped = False
        self.exit_reason = ""

    # -- status --------------------------------------------------------------------------------
    def _set_up(self) -> None:
        if self.kafka_up is not True:
            if self.kafka_up is False:
                log.info("Kafka at %s is reachable again after %.1fs; forwarding spooled records",
                         self.bootstrap, self.clock() - self._down_since)
            else:
                log.info("connected to Kafka at %s", self.bootstrap)
            self.kafka_up = True

    def _set_down(self, why: object) -> None:
        if self.failed_since_ms is None and self.producer is not None:
            self.failed_since_ms = self.clock() * 1000
            self._ask_metadata()
        if self.kafka_up is not False:
            log.warning("Kafka at %s is unavailable (%s); records stay in the spool until it is back",
                        self.bootstrap, why)
            self.kafka_up = False
            self._down_since = self.clock()

    def status(self) -> dict:
        now_ms = self.wall_clock() * 1000
        if self.inflight:
            ts = self.inflight[0].first_ts
        elif self._stalled_ts is not None:
            ts = self._stalled_ts
        else:
            ts = None
        lag = max(0.0, (now_ms - ts) / 1000) if ts is not None else 0.0
        rpos, rseq = self.retained()
        commits = self.commits
        return dict(pos=self.acked_pos, seq=self.acked_seq, forwarded=self.forwarded, failed=self.failed,
                    poisoned=self.poisoned, replayed=self.refilled, replays=self.refills,
                    kafka_up=bool(self.kafka_up), lag_seconds=round(lag, 3), inflight=self.inflight_records,
                    retained_pos=rpos, retained_seq=rseq,
                    committed_seq=commits.committed_seq if commits is not None else None,
                    commit_status=commits.status if commits is not None else "ok",
                    commit_problem=commits.problem if commits is not None else "",
                    commit_waiting_seconds=commits.waiting_seconds() if commits is not None else 0.0)

    def retained(self) -> SpoolPosition:
        """From where the spool must keep records."""
        if self.commits is not None:
            cpos, cseq = self.commits.committed
            return SpoolPosition(min(cpos, self.acked_pos), min(cseq, self.acked_seq))
        return SpoolPosition(self.acked_pos, self.acked_seq)

    def kafka_state(self) -> dict:
        st = self.loss.state()
        if self.commits is not None:
            st["pending"] = self.commits.to_json(256)
        return st

    # -- what the history table has committed ---------------------------------------------------
    def _advance_committed(self) -> None:
        """Let the commit watcher drop what the table has; the committed position follows."""
        commits = self.commits
        if commits is None:
            return
        if self.state in LOST:
            commits.read()
            return                             # pending is about to be refilled and cleared
        idle = not self.inflight and self.state not in REWINDING and self.source.pos >= self.acked_pos
        lost = commits.advance(SpoolPosition(self.acked_pos, self.acked_seq), idle, self.loss.topic_ids)
        if lost:
            self._lost(lost)

    # -- kafka ------------------------------------------------------------------------------------
    def _ensure_producer(self) -> bool:
        if self.producer is not None:
            return True
        now = self.clock()
        if now < self._next_producer_try:
            return False
        self._next_producer_try = now + 1.0
        try:
            self.producer = BatchSender(self.pcfg)
        except Exception as exc:  # NoBrokersAvailable / KafkaTimeoutError / config errors
            self._set_down(f"{type(exc).__name__}: {exc}")
            return False
        self.state = State.FORWARDING                 # CONNECTING -> FORWARDING (or at once REFILLING:)
        # load metadata of topics we produced to before, to notice re-created topics
        for t in list(self.loss.topic_ids):
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
        lost = self.loss.check_ids(self._metadata())
        if lost:
            self._lost(lost, routine=True)

    def _ask_metadata(self) -> None:
        md = self._metadata()
        if md is not None and hasattr(md, "request_update"):
            md.request_update()

    def _metadata_since(self, since_ms: float) -> bool:
        """Metadata refreshed after since_ms names every topic written (or 15 s have passed:
        go on with what there is). Until then it is asked for again every 50 ms."""
        md = self._metadata()
        if md is None or not hasattr(md, "request_update"):
            return True
        mono_ms = self.clock() * 1000
        fresh = getattr(md, "_last_successful_refresh_ms", mono_ms) > since_ms + 1
        # a topic the restarted Kafka has not re-created yet has no id, and chunks acknowledged
        # without one could never be matched to a commit
        if (fresh and self.loss.names_every_topic(md)) or mono_ms - since_ms >= 15000:
            return True
        md.request_update()
        self.retry_at = self.clock() + 0.05
        return False

    def _metadata_checked(self) -> bool:
        """FORWARDING: may a chunk be sent now? Tansu acknowledges records produced to a topic
        it no longer has (after it restarted empty) and drops them, and a topic another client
        made again takes them (in the new log before the older records the refill sends again:
        per-topic order lost). So after a failed request nothing is sent before fresh metadata
        came in, and topic ids are checked in every refresh before the next chunk goes: a topic
        made again -> REFILLING first."""
        if self.failed_since_ms is not None:
            if not self._metadata_since(self.failed_since_ms):
                return False
            self.failed_since_ms = None
        md = self._metadata()
        refreshed = getattr(md, "_last_successful_refresh_ms", None)
        if refreshed != self._ids_checked_ms:
            self._ids_checked_ms = refreshed
            self._check_topic_ids()
        return self.state not in LOST

    def _metadata_fresh(self) -> bool | None:
        md = self._metadata()
        ts = getattr(md, "_last_successful_refresh_ms", None)
        if not ts:
            return None
        age = self.clock() * 1000 - ts
        return age < self.pcfg.get("metadata_max_age_ms", 300000) + 2000

    # -- transitions ---------------------------------------------------------------------------------
    def _lost(self, reason: str, routine: bool = False) -> None:
        """Kafka lost data: -> REFILLING (kept while a refill is already under way). `routine`:
        the embedded Kafka restarted empty, as it does whenever the broker starts it (the refill
        logs one INFO line); anything else is a WARNING."""
        if self.state not in LOST:
            self.state = State.REFILLING
            self.lost_reason = reason
            self._lost_routine = routine and self.embedded
            if not self._lost_routine:
                log.warning("Kafka lost data: %s", reason)

    def _chunk_failed(self, c: InFlight) -> None:
        """-> RESENDING from the chunk's first record (a refill under way ends there instead)."""
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
        tps: dict = {}
        if fut is not None:
            tps, lost, unknown = self.loss.acknowledged(fut.value, fut.counts,  # type: ignore[arg-type]  # answered
                                                        self._metadata())
            if lost:
                self._lost(lost, routine=True)
            if unknown and hasattr(self.producer, "request_update"):
                self.producer.request_update()   # learn the topic's id before the next chunk
            self._set_up()
            self._last_ack = self.clock()
        next_seq = c.last_seq + 1
        if self.commits is not None and self.state not in LOST:
            self.commits.acked(AckedChunk(c.end, next_seq, tps, self.loss.ids_of(tps)))
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
        if not self._metadata_checked():
            return False
        now = self.clock()
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
                self.retry_at = self.clock() + 0.05
                # a new topic has no leader for a moment (Kafka is creating it): only a wait
                # longer than unreachable_after means Kafka is not there
                if self._not_ready_since is None:
                    self._not_ready_since = self.clock()
                elif self.clock() - self._not_ready_since > self.unreachable_after:
                    self._set_down(str(exc))
                return True
            except Exception as exc:
                name = type(exc).__name__
                if "Timeout" in name or getattr(exc, "retriable", False):
                    self._set_down(f"{name}: {exc}")
                    self.source.seek(start, first_seq)
                    self._stalled_ts = first_ts
                    self.retry_at = self.clock() + 0.5
                    return True
                raise
        self._not_ready_since = None
        if start < self._refill_until:
            self.refilled += n_own
        self.inflight.append(InFlight(fut, start, batch.end, first_seq, batch.last_seq, first_ts,
                                      self.clock(), n_own))
        self.inflight_records += n_own
        return True

    def _rewind(self) -> None:
        """RESENDING, REFILLING, PROBING: act once nothing is in flight."""
        if self.inflight:
            return                            # wait until nothing is in flight
        if self.state in LOST:
            # Tansu acknowledges records produced to a topic it no longer has (after a restart)
            # and drops them; only a Metadata request re-creates the topic. So refresh the
            # metadata first (PROBING) and refill only once it describes the new Kafka.
            md = self._metadata()
            mono_ms = self.clock() * 1000
            if md is not None and hasattr(md, "request_update"):
                if self.state is State.REFILLING:
                    self.state = State.PROBING
                    self.probe_since_ms = mono_ms
                    md.request_update()
                    return
                # (PROBING: probe_since_ms is set)
                if not self._metadata_since(self.probe_since_ms):  # type: ignore[arg-type]
                    return
                self.loss.restart(md, mono_ms)
                self.failed_since_ms = None
            now_ms = int(self.wall_clock() * 1000)
            upto = self.acked_pos if self.resend_at is None else self.resend_at.pos
            if self.commits is not None:
                start = min(self.commits.committed_pos, upto)  # everything the table does not have yet
                self.commits.pending.clear()
            elif self.window_s > 0 and self.window_n > 0:
                start = self.source.find_position(self.max_acked_seq - self.window_n,
                                                  now_ms - int(self.window_s * 1000), upto)
            else:
                start = upto
            self.refills += 1
            self._refill_until = max(self._refill_until, upto)
            what = ("not yet committed by the history job" if self.commits is not None
                    else "forwarded in the refill window")
            if self._lost_routine:   # one line says what was recovered
                log.info("the embedded Kafka started empty (memory storage, %s): sending again the "
                         "records %s (spool positions %d-%d, %d bytes)", self.lost_reason, what,
                         start, upto, upto - start)
            else:
                log.warning("Kafka lost records: sending again the records %s (from spool position %d to "
                            "%d, %d bytes)",
                            what, start, upto, upto - start)
            self.loss.forget_offsets()
            self._forward_from(start, None)
        else:                                 # RESENDING
            pos, seq = self.resend_at  # type: ignore[misc]  # RESENDING: set
            self._forward_from(pos, seq)
            self.retry_at = self.clock() + 0.5

    # -- main loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        ck = self.source.load()
        self.acked_pos, self.acked_seq, kstate = ck.pos, ck.seq, ck.kafka
        self.max_acked_seq = self.acked_seq
        self.loss = LossDetector(kstate)
        if self.commits is not None:
            c = self.source.committed()
            committed = c if c is not None else SpoolPosition(self.acked_pos, self.acked_seq)
            # sent before the restart, not yet committed: the chunks saved with their offsets
            self.commits.load(committed, kstate.get("pending") if committed.pos < self.acked_pos else ())
            if committed.pos < self.acked_pos and not self.commits.pending:
                self._refill_until = self.acked_pos   # unknown offsets: send them again
                self.source.seek(committed.pos, None)
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
                        self.drain_deadline = self.clock() + self.drain_timeout
                now = self.clock()
                busy = self.step(now)
                if now - last_status >= self.status_interval:
                    last_status = now
                    self.publish(self.status())
                if now - last_ckpt >= 0.5:
                    last_ckpt = now
                    self.checkpoint()
                if now - last_house >= 1.0:
                    last_house = now
                    self.housekeeping()
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
        elif fresh and self.kafka_up is False and not self.inflight and self.resend_at is None \
                and self.failed_since_ms is None:
            self._set_up()
        oldest = self.inflight[0] if self.inflight else None
        if oldest is not None and now - oldest.sent_at > self.unreachable_after \
                and oldest.future is not None and not oldest.future.poll():
            self._set_down(f"no acknowledgement for {self.unreachable_after:.0f}s")

    def _resume_pos(self) -> int:
        """Where a restarted forwarder must start reading: the first record not acknowledged
        (below acked_pos only while a refill is in progress)."""
        if self.resend_at is not None:
            p = self.resend_at.pos
        elif self.inflight:
            p = self.inflight[0].start
        else:
            p = self.source.pos
        return min(p, self.acked_pos)

    def _committed_ckpt(self) -> SpoolPosition | None:
        return self.retained() if self.commits is not None else None

    def checkpoint(self, force: bool = False) -> None:
        """Follow the job's commits (keep_until = "history"), save where to start again."""
        self._advance_committed()
        self.source.commit(self.acked_pos, self.acked_seq, self.kafka_state(), self._resume_pos(), force=force,
                           committed=self._committed_ckpt())

    def housekeeping(self) -> None:
        """Let the spool delete what no one needs any more."""
        self.source.housekeeping(self.acked_pos, self.acked_seq, self.window_s, self.window_n,
                                 keep_from=self.retained().pos if self.commits is not None else None)

    def _shutdown(self) -> None:
        if self.producer is not None:
            deadline = self.clock() + (1 if self.exit_reason != "eof" else 0)
            while self.inflight and self.clock() < deadline:
                try:
                    self.producer.poll(10)
                except Exception:
                    break
                self._reap()
            self._reap()
            self.producer.close()
            self.producer = None  # type: ignore[assignment]  # (see __init__)
        try:
            self.checkpoint(force=True)
        except Exception as exc:
            log.error("cannot write checkpoint: %s", exc)
        self.publish(self.status())
        self.source.close()
        self.stopped = True


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

    fwd = Forwarder(sink, rt, SpoolSource(rt.spool_dir, sink.spool_max_bytes, shard, shards),
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
