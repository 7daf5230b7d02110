"""The analytics sink as the broker sees it: ``Sink.submit`` / ``barrier`` / ``stats``.

broker (event loop) --submit--> spool writer thread (group commit, fsync)
                                   |  segment files in spool_dir
                                   v
                       forwarder process (or thread) --acks=all--> Kafka

See sink/forward/spool.py for the on-disk format and sink/forward/forwarder.py for delivery,
ordering, outage and Kafka-restart handling.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from kafka_client.record import Buffer, MessageEncoder, SinkRecord, encode_record
from mqtt_topics import matches as topic_matches  # one topic-filter matcher for the project
from settings import HistoryConfig, SinkConfig

from ..history import commits
from .forwarder import Forwarder, Runtime, ThreadControl, encode_setup
from .sources import MemorySource, SpoolSource
from .spool import DirLock, SpoolWriter

if TYPE_CHECKING:
    from kafka_client.embedded import EmbeddedKafka

    from .hook import SinkHook

log = logging.getLogger(__name__)

_MISSING = object()
_EXCLUDED = object()
_REFUSED = object()


def normalize_config(cfg: SinkConfig | dict | None, data_dir: str) -> SinkConfig:
    """The [sink] section (a dict is checked as one: ConfigError naming a bad key), with
    spool_dir resolved ("" = <data_dir>/spool)."""
    if not isinstance(cfg, SinkConfig):
        cfg = SinkConfig.from_table(cfg)
    return dataclasses.replace(cfg, spool_dir=cfg.spool_dir or os.path.join(data_dir, "spool"))


def committed_file(cfg: SinkConfig, history: HistoryConfig | None) -> str:
    """Where the history job reports what the table has committed: [sink] committed_file, else
    found from [history] table/checkpoint the way the job finds it (sink/history/commits.py)."""
    if cfg.committed_file:
        return cfg.committed_file
    h = history or HistoryConfig()
    return commits.committed_path(h.table, h.checkpoint or None)


class Sink:
    def __init__(self, cfg: SinkConfig | dict | None, data_dir: str,
                 history: HistoryConfig | None = None) -> None:
        self.cfg = normalize_config(cfg, data_dir)
        self.committed_file = committed_file(self.cfg, history) if self.cfg.keep_until == "history" else None
        self.table = (history or HistoryConfig()).table   # the job writing it says so (commits.job_file)
        self.data_dir = data_dir
        self.key: bytes | None = None   # settings/secrets.py: signs records, checks the committed file
        self.durable = self.cfg.durability == "spool"          # acks wait for the fsync
        self.on_disk = self.cfg.durability in ("spool", "async")  # records go through the spool file
        self.max_bytes = self.cfg.spool_max_bytes
        self._route_cache: dict[str, str | None] = {}
        # message ids: "<prefix>-<n hex>", one prefix and counter per Kafka topic, so the ids a
        # history job reads from one topic are consecutive (sink/history/dedup.py keeps them as intervals)
        self._ids: dict[str, list] = {}   # Kafka topic -> [prefix, counter, prefix as bytes]
        self._encode = MessageEncoder().encode
        self.embedded: EmbeddedKafka | None = None
        self.bootstrap = self.cfg.bootstrap_servers
        self._writer: SpoolWriter | None = None
        self._mem: MemorySource | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: collections.deque = collections.deque()   # (target_seq, future, first_seq)
        self._barrier_next = 0        # first record seq not covered by a barrier yet
        self._done_seq = -1           # last record seq the spool writer handled (written or failed)
        self._failed_upto = -1        # last record seq of the latest failed spool write
        self._started = False
        self._closed = False
        # counters
        self.accepted = 0
        self.excluded = 0
        self.dropped = 0
        self.spooled = 0
        self.spool_errors = 0
        self._fst: dict = {}          # latest forwarder status
        self._fwd_pos = 0
        self._fwd_seq = 0
        self._kept_pos = 0            # what the spool holds from (= _fwd_pos unless keep_until = "history")
        self._kept_seq = 0
        self._committed_seq = None
        self._full = False
        # forwarder plumbing
        self._procs: dict[int, subprocess.Popen] = {}   # shard -> forwarder process
        self._notify_fds: dict[int, int] = {}
        self._shard_status: dict[int, dict] = {}
        self._proc_lock = threading.Lock()
        self._fwd_thread: threading.Thread | None = None
        self._fwd: Forwarder | None = None
        self._ctl: ThreadControl | None = None
        self._stop_ev = threading.Event()
        self._bg: threading.Thread | None = None
        self.kafka_recycles = 0       # embedded Kafka restarts to give back what the table holds
        self._sent_at_recycle = 0     # records sent to Kafka (new + refilled) at the last one

    @classmethod
    def from_config(cls, cfg: SinkConfig | dict | None, data_dir: str,
                    history: HistoryConfig | None = None) -> "Sink":
        return cls(cfg, data_dir, history)

    # ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        c = self.cfg
        if not self.bootstrap:
            from kafka_client.embedded import EmbeddedKafka
            port = c.embedded_port or None
            logf = c.embedded_log_file or None
            self.embedded = EmbeddedKafka(port=port, log_file=logf).start()
            self.bootstrap = self.embedded.bootstrap
            log.info("embedded Kafka (Tansu, memory storage) at %s", self.bootstrap)
            if c.keep_until != "history":
                log.warning("the embedded Kafka keeps every record in memory and deletes none; "
                            "with [sink] keep_until = \"history\" (and the history job running) "
                            "it is kept within embedded_max_mb (scripts/run.sh does this)")
        if logging.getLogger("kafka").level == logging.NOTSET:
            logging.getLogger("kafka").setLevel(logging.CRITICAL)   # our own WARNING/INFO say it
        from settings import secrets
        self.key = secrets.sink_key(self.data_dir, create=True)
        if self.on_disk:
            self._writer = SpoolWriter(c.spool_dir, c.spool_segment_bytes, fsync=self.durable,
                                       group_commit=c.spool_group_commit_ms / 1000,
                                       on_durable=self._on_durable, on_written=self._notify_forwarder,
                                       on_error=self._on_write_error).open()
            self._fwd_pos, self._fwd_seq = self._writer.ckpt_pos, self._writer.ckpt_seq
            self._barrier_next = self._writer.next_seq
            self._done_seq = self._writer.durable_seq
            self._kept_pos, self._kept_seq = self._writer.kept_pos, self._writer.kept_seq
            backlog = self._writer.next_seq - self._fwd_seq
            if backlog > 0:
                log.info("%d unforwarded records in the spool %s will be forwarded",
                         backlog, c.spool_dir)
        else:
            self._mem = MemorySource(self.max_bytes)
        if self.on_disk and c.forwarder == "process":
            for shard in range(max(1, c.forwarders)):
                self._start_process(shard)
        else:
            self._start_thread()
        self._bg = threading.Thread(target=self._background, name="sink-stats", daemon=True)
        self._bg.start()
        self._started = True
        log.info("started (durability=%s, forwarder=%s, kafka=%s, topic=%s, spool=%s)",
                 c.durability, c.forwarder if self.on_disk else "thread", self.bootstrap, c.topic,
                 c.spool_dir if self.on_disk else "memory")

    def runtime(self, shard: int = 0) -> Runtime:
        """What a forwarder needs besides the [sink] section (self.cfg)."""
        return Runtime(spool_dir=self.cfg.spool_dir, data_dir=self.data_dir,
                       bootstrap=self.bootstrap, embedded=self.embedded is not None,
                       committed_file=self.committed_file, table=self.table,
                       sink_key=self.key, shard=shard,
                       shards=max(1, self.cfg.forwarders),
                       watch_pid=self.embedded.proc.pid if self.embedded and self.embedded.proc else None,
                       log_level=log.getEffectiveLevel())

    def _start_process(self, shard: int = 0) -> None:
        """One forwarder process; with `forwarders` > 1 each sends the topics whose crc32 falls
        in its shard, so per-topic order holds and kafka-python's per-producer ceiling scales."""
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.Popen([sys.executable, "-m", "sink.forward.forwarder"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=root, start_new_session=True)
        # the key: never on its command line
        proc.stdin.write(encode_setup(self.cfg, self.runtime(shard)))  # type: ignore[union-attr]  # stdin=PIPE
        proc.stdin.flush()  # type: ignore[union-attr]  # stdin=PIPE
        fd = proc.stdin.fileno()  # type: ignore[union-attr]  # stdin=PIPE
        os.set_blocking(fd, False)
        self._notify_fds[shard] = fd
        self._procs[shard] = proc
        t = threading.Thread(target=self._read_status, args=(proc, shard), name="sink-fwd-status",
                             daemon=True)
        t.start()

    def _read_status(self, proc: subprocess.Popen, shard: int = 0) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]  # stdout=PIPE
            try:
                st = json.loads(line)
            except ValueError:
                continue
            self._apply_status(st, shard)

    def _apply_status(self, st: dict, shard: int = 0) -> None:
        """Combine the forwarders' reports: the spool is forwarded up to the slowest of them."""
        self._shard_status[shard] = st
        sts = list(self._shard_status.values())
        if len(sts) == 1:
            self._fst = st
        else:
            self._fst = dict(
                forwarded=sum(x.get("forwarded", 0) for x in sts),
                failed=sum(x.get("failed", 0) for x in sts),
                replayed=sum(x.get("replayed", 0) for x in sts),
                replays=sum(x.get("replays", 0) for x in sts),
                lag_seconds=max(x.get("lag_seconds", 0.0) for x in sts),
                kafka_up=all(x.get("kafka_up", False) for x in sts),
                **{k: v for k, v in max(sts, key=lambda x: x.get("commit_waiting_seconds", 0.0)).items()
                   if k.startswith("commit_")})
        if len(sts) == max(1, len(self._procs)):
            slowest = min(sts, key=lambda x: x.get("pos", 0))
            self._fwd_pos = slowest.get("pos", self._fwd_pos)
            self._fwd_seq = slowest.get("seq", self._fwd_seq)
            kept = min(sts, key=lambda x: x.get("retained_pos", x.get("pos", 0)))
            self._kept_pos = kept.get("retained_pos", self._fwd_pos)
            self._kept_seq = kept.get("retained_seq", self._fwd_seq)
            cs = [x.get("committed_seq") for x in sts]
            self._committed_seq = None if None in cs else min(cs)  # type: ignore[type-var]  # no None

    def _start_thread(self) -> None:
        self._ctl = ThreadControl()
        c = self.cfg
        source: SpoolSource | MemorySource = \
            SpoolSource(c.spool_dir, self.max_bytes) if self.on_disk else self._mem  # type: ignore[assignment]
        self._fwd_lock = DirLock(c.spool_dir, "forwarder.lock") if self.on_disk else None
        if self._fwd_lock:
            self._fwd_lock.acquire(timeout=15)
        rt = dataclasses.replace(self.runtime(), shards=1)   # one thread sends every topic
        self._fwd = Forwarder(c, rt, source, self._ctl, self._apply_status)
        self._fwd_thread = threading.Thread(target=self._run_thread_fwd, name="sink-forwarder", daemon=True)
        self._fwd_thread.start()

    def _run_thread_fwd(self) -> None:
        try:
            self._fwd.run()  # type: ignore[union-attr]  # set by _start_thread()
        except Exception:
            log.exception("forwarder thread crashed")

    def _notify_forwarder(self) -> None:
        fds = self._notify_fds
        if fds:
            for fd in list(fds.values()):
                try:
                    os.write(fd, b"n")
                except (BlockingIOError, BrokenPipeError, OSError):
                    pass
        elif self._ctl is not None:
            self._ctl.notify()

    # -- event loop API ------------------------------------------------------------------------
    def _route(self, topic: str) -> str | None:
        for f in self.cfg.exclude:
            if topic_matches(f, topic):
                return None
        for f, kt in self.cfg.rules:
            if topic_matches(f, topic):
                return kt
        return self.cfg.topic

    def _target(self, topic: str) -> Any:  # a Kafka topic (str), _EXCLUDED or _REFUSED
        """Kafka topic for an accepted message, _EXCLUDED, or _REFUSED (closed / spool full)."""
        kt = self._route_cache.get(topic, _MISSING)
        if kt is _MISSING:
            kt = self._route(topic)
            if len(self._route_cache) < 100_000:
                self._route_cache[topic] = kt
        if kt is None:
            self.excluded += 1
            return _EXCLUDED
        if self._closed:
            self.dropped += 1
            return _REFUSED
        # the one of the two this durability uses (the other is None)
        src: SpoolWriter | MemorySource = self._writer if self.on_disk else self._mem  # type: ignore[assignment]
        if src.end_pos - self._kept_pos >= self.max_bytes:
            self.dropped += 1
            if not self._full:
                self._full = True
                log.warning("spool full (%d bytes >= spool_max_bytes); refusing new records",
                            src.end_pos - self._kept_pos)
            return _REFUSED
        if self._full:
            self._full = False
            log.info("spool below spool_max_bytes again; accepting records")
        return kt

    def _appended(self) -> bool:
        self.accepted += 1
        if not self.on_disk:
            self.spooled += 1
            self._ctl.notify()  # type: ignore[union-attr]  # in memory: the forwarder thread's
        return True

    def _id_counter(self, kafka_topic: str) -> list:
        c = self._ids.get(kafka_topic)
        if c is None:
            prefix = f"{int(time.time()):x}{secrets.token_hex(4)}-"
            c = self._ids[kafka_topic] = [prefix, 0, prefix.encode()]
        return c

    def _next_id(self, kafka_topic: str) -> str:
        c = self._id_counter(kafka_topic)
        c[1] += 1
        return f"{c[0]}{c[1]:x}"

    def submit(self, rec: SinkRecord) -> bool:
        kt = self._target(rec.topic)
        if kt is _EXCLUDED:
            return True
        if kt is _REFUSED:
            return False
        if rec.message_id is None:
            rec.message_id = self._next_id(kt)
        (self._writer if self.on_disk else self._mem).append(encode_record(rec, kt))  # type: ignore[union-attr]
        return self._appended()

    def submit_message(self, topic: str, payload: Buffer, qos: int, retain: bool, client_id: str,
                       username: str | None, protocol: int, accepted_at_ms: int) -> bytes | bool:
        """submit() of a message without MQTT 5 properties or expiry, no SinkRecord built (the
        broker's hot path). Same record; returns its message id (bytes) when it was taken, True
        when its topic is excluded, False when refused."""
        kt = self._target(topic)
        if kt.__class__ is not str:
            return kt is _EXCLUDED
        c = self._ids.get(kt) or self._id_counter(kt)
        n = c[1] = c[1] + 1
        mid = c[2] + b"%x" % n
        (self._writer if self.on_disk else self._mem).append(self._encode(  # type: ignore[union-attr]
            kt, topic, payload, qos, retain, client_id, username, protocol, accepted_at_ms, mid))
        self._appended()
        return mid

    # what a history replay's live switch-over needs (sink/replay): records taken so far, and how
    # many of them Kafka has acknowledged (sequence numbers of the spool, or of the memory queue)
    def accepted_seq(self) -> int:
        """The sequence number the next record taken will have."""
        src = self._writer if self.on_disk else self._mem
        return src.next_seq if src is not None else 0

    def forwarded_seq(self) -> int:
        """Every record with a lower sequence number is in Kafka (acknowledged)."""
        return self._fwd_seq

    def hook(self) -> SinkHook:
        """The broker hook handing accepted messages to this sink (sink/forward/hook.py)."""
        from .hook import SinkHook
        return SinkHook(self)

    def barrier(self) -> "asyncio.Future | None":
        """A future for the records appended since the previous barrier: its result once they
        are on disk, an OSError if any of them could not be written; None if nothing to wait for."""
        w = self._writer
        if w is None or not self.durable:  # "async" and "none" acknowledge at once
            return None
        start, target = self._barrier_next, w.next_seq - 1
        self._barrier_next = target + 1
        if target < start:              # nothing appended since (e.g. an excluded topic)
            ws = self._waiters
            return ws[-1][1] if ws and ws[-1][0] == target and not ws[-1][1].done() else None
        loop = asyncio.get_running_loop()
        if loop is not self._loop:          # first call (or a new loop: forget the old waiters)
            self._loop = loop
            self._waiters.clear()
        fut = loop.create_future()
        if self._failed_upto < start:
            self._waiters.append((target, fut, start))
            if target > self._done_seq:
                w.kick()
                return fut
            # the writer handled them meanwhile, maybe before it could see this waiter
            self._waiters.pop()
            if self._failed_upto < start:   # read after _done_seq (the writer sets it first)
                return None
        fut.set_exception(OSError("sink spool write failed"))
        return fut

    # writer thread -> loop
    def _on_durable(self, last_seq: int, n: int) -> None:
        self.spooled += n
        self._done_seq = last_seq
        loop = self._loop
        if loop is not None and self._waiters:
            try:
                loop.call_soon_threadsafe(self._resolve, last_seq)
            except RuntimeError:   # loop closed
                pass

    def _on_write_error(self, last_seq: int, n: int, exc: Exception) -> None:
        self.spool_errors += n
        self._failed_upto = last_seq   # before _done_seq: barrier() reads them the other way round
        self._done_seq = last_seq
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._resolve, last_seq, exc)
            except RuntimeError:
                pass

    def _resolve(self, seq: int, exc: Exception | None = None) -> None:
        ws = self._waiters
        while ws and ws[0][0] <= seq:
            _, fut, _ = ws.popleft()
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(OSError(f"sink spool write failed: {exc}"))
        if exc is not None and ws and ws[0][2] <= seq:  # the next waiter covers failed records too
            _, fut, _ = ws.popleft()
            if not fut.done():
                fut.set_exception(OSError(f"sink spool write failed: {exc}"))

    # -- stats -------------------------------------------------------------------------------------
    def stats(self) -> dict:
        st = self._fst
        src = self._writer if self.on_disk else self._mem
        end_pos = src.end_pos if src else 0
        next_seq = src.next_seq if src else 0
        return dict(
            accepted=self.accepted, excluded=self.excluded, dropped=self.dropped,
            spooled=self.spooled, spool_errors=self.spool_errors,
            forwarded=st.get("forwarded", 0), failed=st.get("failed", 0),
            replayed=st.get("replayed", 0), replays=st.get("replays", 0),
            spool_messages=max(0, next_seq - self._fwd_seq), spool_bytes=max(0, end_pos - self._kept_pos),
            spool_held_messages=max(0, next_seq - self._kept_seq),
            spool_uncommitted_messages=(max(0, next_seq - self._committed_seq)
                                        if self._committed_seq is not None else 0),
            lag_seconds=st.get("lag_seconds", 0.0), kafka_up=bool(st.get("kafka_up", False)),
            embedded_kafka_bytes=self.embedded.rss_bytes() if self.embedded else 0,
            embedded_kafka_recycles=self.kafka_recycles,
            durability=self.cfg.durability, bootstrap=self.bootstrap, **self._commit_stats(st))

    def _commit_stats(self, st: dict) -> dict:
        """keep_until = "history": whether the job's commits release spooled records (metric
        mqtt_sink_history_commit_ok; the status and the problem in words for /health and the
        dashboard), and history_lag_seconds: how long records have waited for the table since
        the job's last commit that took any (0: the table has every record acknowledged by
        Kafka), the dashboard's Lag chart. keep_until = "kafka": the job's commits are not
        followed, history_lag_seconds is None."""
        if self.cfg.keep_until != "history":
            return {"history_lag_seconds": None}   # the job's commits are not followed
        status = st.get("commit_status", "ok")
        waiting = st.get("commit_waiting_seconds", 0.0)
        return dict(history_lag_seconds=waiting,
                    history_commit_ok=status == "ok", history_commit_status=status,
                    history_commit_problem=st.get("commit_problem", ""),
                    history_commit_waiting_seconds=waiting)

    def _background(self) -> None:
        interval = self.cfg.stats_interval
        next_stats = time.monotonic() + interval if interval > 0 else float("inf")
        while not self._stop_ev.wait(1.0):
            if self._closed:
                return
            now = time.monotonic()
            if now >= next_stats:
                next_stats = now + interval
                s = self.stats()
                log.info("sink stats: accepted=%d spooled=%d forwarded=%d failed=%d dropped=%d excluded=%d "
                         "spool=%d msgs/%d bytes lag=%.1fs kafka_up=%s refills=%d",
                         s["accepted"], s["spooled"], s["forwarded"], s["failed"], s["dropped"],
                         s["excluded"], s["spool_messages"], s["spool_bytes"], s["lag_seconds"],
                         s["kafka_up"], s["replays"])
            k = self.embedded
            if k is not None and not self._closed:
                self._bound_embedded(k)
            if k is not None and k.proc is not None and k.proc.poll() is not None and not self._closed:
                log.warning("embedded Kafka exited (code %s); restarting it on %s (it restarts empty: "
                            "the forwarder sends again %s)", k.proc.returncode, k.bootstrap,
                            "what the history table has not committed" if self.cfg.keep_until == "history"
                            else "the records of the refill window")
                try:
                    k.start()
                except Exception as exc:
                    log.error("cannot restart embedded Kafka: %s", exc)
            for shard, p in list(self._procs.items()):
                if p.poll() is None or self._closed:
                    continue
                with self._proc_lock:
                    if self._closed or self._procs.get(shard) is not p:
                        continue
                    log.error("forwarder process %d exited (code %s); restarting it", shard,
                              p.returncode)
                    self._notify_fds.pop(shard, None)
                    try:
                        p.stdin.close()  # type: ignore[union-attr]  # stdin=PIPE
                    except OSError:
                        pass
                    self._start_process(shard)

    def _bound_embedded(self, k: EmbeddedKafka) -> None:
        """Keep the embedded Kafka (memory storage, which deletes no record: no DeleteRecords,
        no retention) within [sink] embedded_max_mb: once the history table holds what it
        holds (keep_until = "history": the spool keeps every record the table has not
        committed), restart it empty. The forwarder finds it empty and sends again what is not
        committed yet; the job reads the new log (dedup by message id). Only while the table
        has at least half of what Kafka holds (the tail sent again is the rest), so a job that
        is down or behind never makes it restart in a loop."""
        bound = self.cfg.embedded_max_mb << 20
        if (not bound or self.committed_file is None or self._committed_seq is None
                or k.proc is None or k.proc.poll() is not None):
            return  # (no committed file read yet: the job has not written one)
        rss = k.rss_bytes()
        if rss < bound:
            return
        st = self.stats()
        tail = st["spool_uncommitted_messages"]
        sent = st["forwarded"] + st["replayed"]
        if tail * 2 > sent - self._sent_at_recycle:
            return  # the table has less than half of what Kafka holds: a restart frees little
        log.info("embedded Kafka holds %d MB (bound [sink] embedded_max_mb = %d): restarting it "
                 "empty; the history table has every record but the %d the spool sends again",
                 rss >> 20, self.cfg.embedded_max_mb, tail)
        self._sent_at_recycle = sent
        try:
            k.restart(kill=True)
            self.kafka_recycles += 1
        except Exception as exc:
            log.error("cannot restart embedded Kafka: %s", exc)

    # -- shutdown -------------------------------------------------------------------------------------
    def close(self) -> None:
        if not self._started or self._closed:
            return
        with self._proc_lock:
            self._closed = True
        self._stop_ev.set()
        if self._writer is not None:
            self._writer.flush()
        drain = self.cfg.drain_timeout_seconds
        procs = list(self._procs.values())
        for p in procs:  # all drain at once
            try:
                os.set_blocking(p.stdin.fileno(), True)  # type: ignore[union-attr]  # stdin=PIPE
                p.stdin.write(b"d")  # type: ignore[union-attr]  # stdin=PIPE
                p.stdin.flush()  # type: ignore[union-attr]  # stdin=PIPE
            except (BrokenPipeError, OSError, ValueError):
                pass
        for p in procs:
            try:
                p.wait(drain + 5)
            except subprocess.TimeoutExpired:
                log.warning("forwarder did not stop; killing it")
                p.kill()
                p.wait()
            try:
                p.stdin.close()  # type: ignore[union-attr]  # stdin=PIPE
            except (BrokenPipeError, OSError):
                pass
        self._notify_fds.clear()
        self._procs.clear()
        if self._fwd_thread is not None:
            self._ctl.command("drain")  # type: ignore[union-attr]  # with _fwd_thread
            self._fwd_thread.join(drain + 5)
            self._fwd_thread = None
            if self._fwd_lock:
                self._fwd_lock.release()
        if self._writer is not None:
            self._writer.close()
        if self._bg is not None:
            self._bg.join(2)
        if self.embedded is not None:
            self.embedded.stop()
        s = self.stats()
        lost = s["spool_messages"]
        if lost and not self.on_disk:
            log.warning("%d records not forwarded are lost (durability = none)", lost)
        log.info("closed (accepted=%d forwarded=%d, %d records left in the spool)",
                 s["accepted"], s["forwarded"], lost if self.on_disk else 0)
