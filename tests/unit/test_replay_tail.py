"""The replay worker's Kafka part (sink/replay/tail.py, worker.py) against a fake Kafka log, in
the test's thread (no broker, no socket): the answer to a sync request (the ``synced`` marker,
after which the session's feed switches to live delivery, docs/history.md "Replay over MQTT") comes once
the reading reaches what Kafka held when it was asked, however fast the topic keeps growing;
``head`` markers keep coming on a topic that is never idle (the feed arms its tap again at
one); a request that reaches the worker before it reads Kafka is answered too."""
from __future__ import annotations

import io
import pickle
import struct
import threading

import pytest

from kafka_client.record import build_batch, encode_message_body
from kafka_client.recordbatch import decode
from sink.replay import tail as T
from sink.replay.records import FRAME_HEAD
from sink.replay.worker import Worker

TOPIC = "mqtt.messages"


class Cluster:
    """What Tail._discover asks of kafka-python's cluster metadata."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def add_topic(self, topic):
        pass

    def request_update(self):
        return self

    # (the metadata request's future: answered at once)
    is_done = True

    def failed(self):
        return False

    def partitions_for_topic(self, topic):
        return set(range(self.partitions))

    def topic_id(self, topic):
        return "topic-id-1"


class Client:
    def poll(self, timeout_ms=0, future=None):
        pass


class FakeLog(T.ReplayFetcher):
    """One topic's partitions as logs of the sink's records (message id "p<partition>-<offset
    in hex>", MQTT topic s/a, accepted at 1000 + offset ms). Each fetch first runs ``script``
    (fetch number, self): the producer appends, a sync request comes, a partition's fetch
    fails; then answers like Kafka: from each position at most ``cap`` records with the
    partition's high watermark, nothing (and no high watermark) for a partition in
    ``failing``."""

    def __init__(self, tail_box: list, partitions: int = 1, size: int = 4, cap: int = 1000,
                 script=None, stop_after: int = 40) -> None:
        # (no Kafka client: only what Tail uses of a ReplayFetcher)
        self.positions: dict = {}
        self.high: dict = {}
        self.told: set = set()
        self.out_of_range: set = set()
        self.cluster = Cluster(partitions)
        self.client = Client()
        self.ends = {(TOPIC, p): size for p in range(partitions)}   # the logs' end offsets
        self.cap = cap
        self.script = script or (lambda n, log: None)
        self.stop_after = stop_after
        self.failing: set = set()
        self.fetches = 0
        self.tail_box = tail_box

    @property
    def tail(self) -> T.Tail:
        return self.tail_box[0]

    def append(self, p: int, n: int) -> None:
        self.ends[(TOPIC, p)] += n

    def fetch(self) -> list:
        self.told.clear()
        self.fetches += 1
        if self.fetches > self.stop_after:
            self.tail.stopped = True
            return []
        self.script(self.fetches, self)
        out = []
        for tp, pos in self.positions.items():
            if tp in self.failing:
                continue  # (an error code for the partition: no high watermark in the answer)
            end = self.ends[tp]
            self.high[tp] = end
            self.told.add(tp)
            n = min(end - pos, self.cap)
            if n > 0:
                out.append((tp[0], tp[1], batch(tp[1], pos, n), pos))
                self.positions[tp] = pos + n
        return out

    def close(self) -> None:
        pass


def batch(p: int, first: int, n: int):
    raw = build_batch([(1000 + o, encode_message_body("s/a", b"x", 1, False, "pub", None, 5,
                                                      f"p{p}-{o:x}"))
                       for o in range(first, first + n)])
    return decode(struct.pack(">q", first) + raw[8:])  # (its base offset: the first's)


def read(partitions: int = 1, **kw) -> tuple[T.Tail, FakeLog, list]:
    """A Tail over a FakeLog, run in this thread until the log's script stops it: (the tail, the
    log, what it queued for the worker: record ids as "p<partition>-<offset>" and markers)."""
    box: list = []
    log = FakeLog(box, partitions, **kw)
    tail = T.Tail("fake:9092", {}, [TOPIC], None, "s/#", 0, None, 64 << 20,
                  fetcher_factory=lambda *a: log)
    box.append(tail)
    tail.run()
    assert tail.failed is None and tail.boundary.is_set()
    return tail, log, [item if item[0].__class__ is str else item[0].decode()
                       for item, _ in tail.queue]


def offset(rid: str) -> tuple[int, int]:
    p, o = rid[1:].split("-")
    return int(p), int(o, 16)


def test_synced_comes_once_what_kafka_held_when_asked_is_read_though_the_topic_keeps_growing():
    """A topic written faster than one fetch's answer carries (at most 2 records an answer, 3
    more records every fetch): the reading never reaches the moving end of the log, yet the
    sync request is answered once it reaches the end the log had when the request came."""
    asked = {}

    def script(n, log):
        log.append(0, 3)
        if n == 5:
            log.tail.request_sync(1)
            asked["end"] = log.ends[(TOPIC, 0)]

    tail, log, items = read(cap=2, script=script, stop_after=40)
    assert ("synced", 1) in items, "no answer to the sync request while the topic kept growing"
    at = items.index(("synced", 1))
    before = [offset(i)[1] for i in items[:at] if not isinstance(i, tuple)]
    assert before == list(range(len(before)))                  # in order, nothing left out
    assert len(before) >= asked["end"]                         # all Kafka held when asked
    assert len(before) < log.ends[(TOPIC, 0)]                  # (while it kept growing)
    assert not tail.goals and not tail.syncs                   # answered once


def test_head_markers_keep_coming_on_a_topic_that_is_never_idle():
    """Every fetch brings a new record (no fetch comes back empty) and reaches the log's end:
    the stream says so after each, so a feed that dropped its held live messages arms again."""
    tail, log, items = read(script=lambda n, log: log.append(0, 1), stop_after=30)
    records = [i for i in items if not isinstance(i, tuple)]
    assert len(records) == log.ends[(TOPIC, 0)]
    assert items.count(("head",)) >= 20 and items[-1] == ("head",)


def test_synced_waits_for_the_end_of_a_partition_whose_fetch_failed():
    """A partition's fetch fails (no high watermark in the answer) just when the request comes,
    while it holds records the reading has not had yet: the answer waits until a later fetch
    tells its end and those records are read, rather than following a stale end."""
    asked = {}

    def script(n, log):
        if n == 3:
            log.append(1, 3)
            log.failing.add((TOPIC, 1))
            log.tail.request_sync(7)
            asked.update(log.ends)
        if n == 6:
            log.failing.clear()

    tail, log, items = read(partitions=2, script=script, stop_after=10)
    assert ("synced", 7) in items
    at = items.index(("synced", 7))
    read_before = {offset(i) for i in items[:at] if not isinstance(i, tuple)}
    held = {(p, o) for (_, p), end in asked.items() for o in range(end)}
    assert held <= read_before, f"answered before {sorted(held - read_before)}"


class FakeTail:
    """What Worker.run uses of a Tail: at once at the table's boundary, the table empty; its
    first take() answers the sync requests it has (Kafka has nothing more)."""

    def __init__(self, *args, **kwargs) -> None:
        self.syncs: list = []
        self.boundary = threading.Event()
        self.boundary.set()
        self.failed = None
        self.known = None
        self.takes = 0

    def request_sync(self, generation: int) -> None:
        self.syncs.append(generation)

    def start(self) -> None:
        pass

    def take(self, max_items, max_bytes, timeout) -> list:
        self.takes += 1
        if self.takes > 1:
            raise EOFError  # (the end of this test)
        return [("synced", g) for g in self.syncs]


def test_a_sync_request_that_comes_before_the_worker_reads_kafka_is_answered(tmp_path, monkeypatch):
    """The broker asks as soon as Kafka has what it needs, which can be while the worker process
    is still starting (a busy machine): the request is kept for the tail, not dropped (it is not
    asked again: the replay would never go live)."""
    monkeypatch.setattr(T, "Tail", FakeTail)
    out = io.BytesIO()
    w = Worker({"committed_file": str(tmp_path / "none.json"), "table": str(tmp_path / "none"),
                "bootstrap": "fake:9092", "topics": [TOPIC], "filter": "s/#", "since_ms": 0},
               out)
    handled, end = threading.Event(), threading.Event()

    def stdin():
        yield b'{"sync": 1}\n'
        handled.set()          # (the line was handled: the loop asks for the next one)
        end.wait(60)

    reader = threading.Thread(target=w.commands, args=(stdin(),), daemon=True)
    reader.start()
    assert handled.wait(60)
    with pytest.raises(EOFError):
        w.run()
    items = []
    data = out.getvalue()
    while data:
        (n,) = FRAME_HEAD.unpack(data[:FRAME_HEAD.size])
        items += pickle.loads(data[FRAME_HEAD.size:FRAME_HEAD.size + n])
        data = data[FRAME_HEAD.size + n:]
    assert items == [("table", 0), ("synced", 1)]
    end.set()
    reader.join(60)
    assert not reader.is_alive()   # the end of stdin ends the reading (main() then exits)
