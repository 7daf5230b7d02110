"""The Kafka part of a replay, inside the worker process: the sink's records from the history
table's committed offsets on, read on a thread into a bounded queue (sink/replay/worker.py).

- **Start.** From the offsets in the job's committed file (``sink.history.commits``) when its topic id
  is Kafka's current one; from 0 when it is not (the embedded Kafka restarted: the table has
  everything of the old log), when there is no file, or for a partition it does not name.
- **The boundary.** The end of each partition (its high watermark) when the reading starts:
  every row of the table snapshot the worker took before that is either below the committed
  offsets or in ``[committed, boundary)``. The ids of every record read up to the boundary are
  kept (as intervals: sink.history.dedup) and handed to the table's part, which leaves out the
  rows whose id is among them: those come from here, in Kafka's order. So the committed file may
  lag the table (it does, by a batch or so) without a message twice.
- **Duplicates.** A record whose ``mqtt.message_id`` was read before (producer retries, records
  the sink sent again) is dropped; records without the broker's signature too (as the job does).
- **Bounded.** Matching records wait in a queue of at most ``max_bytes``; when it is full no more
  is fetched (Kafka keeps them). If it fills before the boundary is reached, the ids are still
  read to the boundary and the reading then goes back to where the queue filled.
- **Markers** in the queue, in order with the records: ``("head",)`` when a fetch reached the
  end of every partition (after each such fetch that brought records, so that a busy topic,
  where no fetch comes back empty, still has them: feed.py arms its tap again at one);
  ``("synced", n)`` answers ``sync(n)``: it follows every record Kafka held when the request came
  (hook.py: the switch to live). The end offsets it waits for are fixed when the request comes
  (each partition's high watermark in the first answer to a fetch issued after it), so the
  answer comes once the reading gets there, however busy the topic is meanwhile: it never
  chases a high watermark that keeps moving. ``("error", text)`` when the replay cannot go on.
- **A restarted embedded Kafka** (a new topic id, or offsets out of range) while the reading is
  at the end of the log: read the new log from 0 (what is read again is dropped as a duplicate).
  While it is behind: an error (records the table committed meanwhile are not sent again).
"""
from __future__ import annotations

import collections
import heapq
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from kafka_client.fetch import Fetcher, Records
from kafka_client.headers import H_MESSAGE_ID
from kafka_client.recordbatch import Decoded, first_header
from mqtt_topics import matches
from sink.history.dedup import Ledger, TaskFilter

from .records import from_kafka_record, item_size

log = logging.getLogger(__name__)

FETCH_WAIT_MS = 200
METADATA_EVERY = 2.0          # seconds between checks for new partitions and topic ids
START_TIMEOUT = 60.0          # Kafka unreachable this long at the start: the replay fails
_ID = H_MESSAGE_ID.encode()


class ReplayFetcher(Fetcher):
    """A Fetcher that reports offsets out of range instead of moving past them."""
    restart_on_loss = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out_of_range: set[tuple[str, int]] = set()

    def _out_of_range(self, tp: tuple[str, int]) -> bool:
        self.out_of_range.add(tp)
        return False


def copy_ledger(ledger: Ledger) -> Ledger:
    return Ledger(collections.OrderedDict((k, (v[0].copy(), v[1].copy(), v[2]))
                                          for k, v in ledger.groups.items()))


class Tail(threading.Thread):
    def __init__(self, bootstrap: str, kafka: dict, topics: list[str], committed: dict | None,
                 topic_filter: str, since_ms: int, until_ms: int | None, max_bytes: int,
                 check: Any = None,
                 fetcher_factory: Callable[[str, dict, int], ReplayFetcher] = ReplayFetcher) -> None:
        super().__init__(name="replay-kafka", daemon=True)
        self.bootstrap, self.kafka, self.topics = bootstrap, kafka, topics
        self.committed = committed
        self.topic_filter, self.since_ms, self.until_ms = topic_filter, since_ms, until_ms
        self.max_bytes = max_bytes
        self.check = check                       # (key, key id, Verdicts) or None
        self.fetcher_factory = fetcher_factory
        self.fetcher: ReplayFetcher | None = None
        self.seen = TaskFilter(Ledger())         # ids read from Kafka so far
        self.queue: collections.deque = collections.deque()
        self.queued_bytes = 0
        self.cond = threading.Condition()
        self.boundary = threading.Event()        # set once `known` is complete (or on error)
        self.known: Ledger | None = None         # ids read up to the boundary
        self.ends: dict | None = None            # the boundary, per (topic, partition)
        self.resume: tuple | None = None         # (positions, seen ids) where the queue filled first
        self.collecting = True
        self.syncs: list = []                    # sync requests not yet seen by a fetch
        # [(generations, {(topic, partition): end offset})]: sync requests, oldest first, each
        # answered once the reading reaches its ends (filled from fetches after the request)
        self.goals: list[tuple[list, dict]] = []
        self.ids: dict = {}                      # topic -> its Kafka topic id when read
        self.at_head = False
        self.stopped = False
        self.failed: str | None = None
        self.counts = {"read": 0, "matched": 0, "duplicates": 0, "unsigned": 0}
        self._matches: dict = {}

    # ------------------------------------------------------------ the worker's side
    def request_sync(self, generation: int) -> None:
        with self.cond:
            self.syncs.append(generation)
            self.cond.notify_all()

    def take(self, max_items: int, max_bytes: int, timeout: float) -> list:
        """Queued records and markers, oldest first (waits up to ``timeout`` for the first)."""
        with self.cond:
            if not self.queue:
                self.cond.wait(timeout)
            out: list[Any] = []
            size = 0
            q = self.queue
            while q and len(out) < max_items and size < max_bytes:
                item, n = q.popleft()
                out.append(item)
                size += n
            self.queued_bytes -= size
            self.cond.notify_all()
            return out

    def stop(self) -> None:
        self.stopped = True
        with self.cond:
            self.cond.notify_all()

    # ------------------------------------------------------------ the thread
    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the worker says it, in the stream
            log.exception("replay: reading Kafka failed")
            self._error(f"reading Kafka at {self.bootstrap} failed: {exc}")
        finally:
            if self.fetcher is not None:
                self.fetcher.close()

    def _error(self, text: str) -> None:
        self.failed = text
        self._put(("error", text), 0)
        self.boundary.set()

    def _put(self, item: tuple, size: int) -> None:
        with self.cond:
            self.queue.append((item, size))
            self.queued_bytes += size
            self.cond.notify_all()

    def _run(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while self.fetcher is None:
            try:
                self.fetcher = self.fetcher_factory(self.bootstrap, self.kafka, FETCH_WAIT_MS)
            except Exception as exc:
                if time.monotonic() > deadline or self.stopped:
                    return self._error(f"Kafka at {self.bootstrap} did not answer within "
                                       f"{START_TIMEOUT:.0f} s ({exc})")
                time.sleep(1.0)
        f = self.fetcher
        self._discover(first=True)
        last_meta = time.monotonic()
        while not self.stopped:
            if self.boundary.is_set() and self.collecting and not self._room():
                continue  # (waited for room)
            with self.cond:  # the fetches from now on are issued after these requests
                if self.syncs:
                    self.goals.append((list(self.syncs), {}))
                    del self.syncs[:]
            before = dict(f.positions)
            seen_before = copy_ledger(self.seen.kept) if not self.boundary.is_set() else None
            batches = f.fetch()
            fresh = f.told  # (Fetcher.told: the high watermarks this fetch was given)
            for _, ends in self.goals:  # each partition's end: the first one told after the request
                for tp in fresh:
                    ends.setdefault(tp, f.high[tp])
            if self.ends is None and all(tp in f.high for tp in f.positions):
                self.ends = {tp: f.high[tp] for tp in f.positions}
            if f.out_of_range:
                if not self._restarted(set(t for t, _ in f.out_of_range)):
                    return
                f.out_of_range.clear()
                continue
            if batches and self.collecting and not self.boundary.is_set() and \
                    self.queued_bytes >= self.max_bytes:
                # full before the boundary: read ids only up to it, then come back here
                self.collecting = False
                self.resume = (before, seen_before)
            # the partitions' records merged by accept time, each partition's in its order
            for item in heapq.merge(*(self._records(topic, d, start)
                                      for topic, p, d, start in batches), key=_accepted_at):
                self._put(item, item_size(item))
            head = all(tp in fresh and f.positions[tp] >= f.high[tp] for tp in f.positions)
            if not self.boundary.is_set() and self.ends is not None and \
                    all(f.positions[tp] >= end for tp, end in self.ends.items()):
                self._at_boundary()
                continue
            if self.boundary.is_set() and self.collecting:
                if head and (batches or not self.at_head):
                    self._put(("head",), 0)
                self.at_head = head
                while self.goals and self._reached(self.goals[0][1]):
                    for g in self.goals.pop(0)[0]:
                        self._put(("synced", g), 0)
            now = time.monotonic()
            if now - last_meta >= METADATA_EVERY:
                last_meta = now
                if not self._discover():
                    return

    def _reached(self, ends: dict) -> bool:
        """The reading is at or past these ends in every partition (one not among them yet: no
        fetch issued after the request has been answered for it)."""
        positions = self.fetcher.positions  # type: ignore[union-attr]  # (_run())
        return all(tp in ends and pos >= ends[tp] for tp, pos in positions.items())

    def _room(self) -> bool:
        """Wait a little for room in the queue; True when there is."""
        with self.cond:
            if self.queued_bytes < self.max_bytes or self.stopped:
                return True
            self.cond.wait(0.5)
            return self.queued_bytes < self.max_bytes

    def _at_boundary(self) -> None:
        self.known = copy_ledger(self.seen.kept)
        if self.resume is not None:  # the queue filled on the way: read again from there
            positions, seen = self.resume
            self.fetcher.positions.update(positions)  # type: ignore[union-attr]  # (_run())
            self.seen = TaskFilter(seen)
            self.resume = None
            self.collecting = True
        log.info("replay: Kafka read to the table's boundary %s (%d records, %d matching)",
                 {f"{t}-{p}": n for (t, p), n in (self.ends or {}).items()},
                 self.counts["read"], self.counts["matched"])
        self.boundary.set()

    def _records(self, topic: str, d: Decoded, start: int) -> list:
        """The new records of one partition's fetch that the replay sends (checked, not read
        before, matching, in the time range), as records.py items; their ids are kept."""
        keep = d.offset >= start  # (a fetch may begin inside a batch)
        if not keep.all():
            d = d.take(keep)
        if not len(d):
            return []
        self.counts["read"] += len(d)
        if self.check is not None:  # before de-duplication: a forged id must not hide a real one
            from sink.history.verify import signed
            ok = signed(d, topic, *self.check)
            if not ok.all():
                self.counts["unsigned"] += int((~ok).sum())
                d = d.take(ok)
        fresh = self.seen.keep(d.data, *first_header(d, _ID))
        self.counts["duplicates"] += int((~fresh).sum())
        out: list = []
        if not self.collecting:
            return out
        recs = Records(d, -1)
        for i in np.flatnonzero(fresh).tolist():
            key = recs.key(i)
            topic_name = key.decode("utf-8", "replace") if key is not None else ""
            if not self._match(topic_name):
                continue
            _, _, value, headers, ts = recs.record(i)
            if ts < self.since_ms or (self.until_ms is not None and ts >= self.until_ms):
                continue
            item = from_kafka_record(key, value, headers, ts)
            if item is None:
                continue
            self.counts["matched"] += 1
            out.append(item)
        return out

    def _match(self, topic: str) -> bool:
        hit = self._matches.get(topic)
        if hit is None:
            hit = matches(self.topic_filter, topic)
            if len(self._matches) > 100_000:
                self._matches.clear()
            self._matches[topic] = hit
        return hit

    # ------------------------------------------------------------ partitions and restarts
    def _discover(self, first: bool = False) -> bool:
        """Partitions to read (new ones from 0; at the first call from the committed offsets),
        and whether a topic was re-created (a restarted embedded Kafka). False: stop (error)."""
        f: ReplayFetcher = self.fetcher  # type: ignore[assignment]  # _run() made it first
        for t in self.topics:
            f.cluster.add_topic(t)
        deadline = time.monotonic() + (START_TIMEOUT if first else 0.2)
        while True:  # at the start, a metadata answer must say which topics exist
            fut = f.cluster.request_update()
            f.client.poll(timeout_ms=200, future=fut)
            if fut.is_done and not fut.failed():
                break
            if time.monotonic() > deadline or self.stopped:
                if first:
                    self._error(f"Kafka at {self.bootstrap} gave no metadata within "
                                f"{START_TIMEOUT:.0f} s")
                    return False
                return True
        restarted = set()
        for t in self.topics:
            parts = f.cluster.partitions_for_topic(t) or set()
            tid = _topic_id(f, t)
            if not parts:
                continue
            if t in self.ids and tid and self.ids[t] and tid != self.ids[t]:
                restarted.add(t)
                continue
            if tid:
                self.ids[t] = tid
            for p in parts:
                if (t, p) not in f.positions:
                    f.positions[(t, p)] = self._start_offset(t, p, tid) if first else 0
        if restarted:
            return self._restarted(restarted)
        return True

    def _start_offset(self, topic: str, p: int, tid: str) -> int:
        c = (self.committed or {}).get("topics", {}).get(topic)
        if c is None:
            return 0
        if c.get("topic_id") and tid and c["topic_id"] != tid:
            log.info("replay: %s is a new log (topic id %s, the table committed %s): the table "
                     "has everything of the old one, reading the new one from 0", topic, tid,
                     c["topic_id"])
            return 0
        return int(c["offsets"].get(p, 0))

    def _restarted(self, topics: set) -> bool:
        """The log of these topics started again (the embedded Kafka restarted)."""
        f: ReplayFetcher = self.fetcher  # type: ignore[assignment]  # (as in _discover())
        if not self.boundary.is_set():  # nothing sent yet: the table has all of the old log
            log.info("replay: Kafka's log of %s started again before the boundary: reading the "
                     "new one from 0", ", ".join(sorted(topics)))
            self.ends = None
        elif not (self.at_head and self.collecting):
            self._error("the embedded Kafka restarted while this replay was behind it: messages "
                        "the history table committed meanwhile would be missing")
            return False
        else:
            log.info("replay: Kafka's log of %s started again: reading it from 0 (what was read "
                     "already is dropped as a duplicate)", ", ".join(sorted(topics)))
        for tp in list(f.positions):
            if tp[0] in topics:
                f.positions[tp] = 0
                f.high.pop(tp, None)
                for _, ends in self.goals:  # the new log's end, from the next fetch
                    ends.pop(tp, None)
        for t in topics:
            self.ids.pop(t, None)
        return True


def _accepted_at(item: tuple) -> int:
    return item[5]


def _topic_id(f: Fetcher, topic: str) -> str:
    try:
        tid = f.cluster.topic_id(topic)
    except Exception:
        return ""
    return str(tid) if tid else ""
