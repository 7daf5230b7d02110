"""The forwarder's state machine (sink/forward/forwarder.py State), one step at a time, with a fake clock
and a fake Kafka: which decision it takes on a failed chunk, a refused record, lost data and a
Kafka that is not there yet."""
import pytest

from kafka_client.record import decode_body, encode_message
from settings import SinkConfig
from sink.forward import commit_watch, sources
from sink.forward import forwarder as fw
from sink.forward.forwarder import Forwarder, Runtime, State, ThreadControl
from sink.forward.sources import MemorySource

T0 = 1_800_000_000.0          # wall clock of the fake clock at monotonic 0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def time(self):
        return T0 + self.now

    def sleep(self, s):
        self.now += s

    def advance(self, s):
        self.now += s


class KafkaTimeoutError(Exception):
    retriable = True


class MessageSizeTooLargeError(Exception):   # Kafka refuses the record for good
    retriable = False


class Future:
    def __init__(self, groups):
        self.groups = groups
        self.counts = {(t, 0): len(v) for t, v in groups.items()}
        self.exception = self.value = None
        self.done = False

    def poll(self):
        return self.done

    def values(self):
        return [int(decode_body(body)[1]) for recs in self.groups.values() for _, body in recs]


class Cluster:
    """Kafka's metadata as the producer knows it: asked for (request_update), it is answered at
    once unless the test answers it (answers False: set _last_successful_refresh_ms)."""

    def __init__(self, clock):
        self.clock = clock
        self._last_successful_refresh_ms = 0
        self.updates = 0
        self.answers = True
        self.id = "id-1"                  # the topic's id in Kafka

    def topic_id(self, topic):
        return self.id

    def request_update(self):
        self.updates += 1
        if self.answers:
            self.refreshed()

    def refreshed(self):
        self._last_successful_refresh_ms = self.clock.monotonic() * 1000 + 2


class FakeKafka:
    """Stands in for produce.BatchSender: records what is sent; the test answers each request."""
    attempts = 0
    refuse_connect = 0

    def __init__(self, pcfg):
        FakeKafka.attempts += 1
        if FakeKafka.refuse_connect:
            FakeKafka.refuse_connect -= 1
            raise KafkaTimeoutError("no brokers")
        self.sent: list[Future] = []
        self.log: list[int] = []          # values Kafka has, in order
        self.cluster = Cluster(FakeKafka.clock)
        FakeKafka.last = self

    def send(self, groups):
        fut = Future(groups)
        self.sent.append(fut)
        return fut

    def ack(self, i, base=None):
        fut = self.sent[i]
        fut.value = {tp: (len(self.log) if base is None else base) for tp in fut.counts}
        self.log += fut.values()
        fut.done = True

    def fail(self, i, exc):
        self.sent[i].exception = exc
        self.sent[i].done = True

    def poll(self, ms=0):
        pass

    def maybe_refresh(self):
        pass

    def partitions_for(self, topic, wait_ms=0):
        return {0}

    def close(self):
        pass


class NoRealClock:
    """Stands in for the time module of the forwarder's modules: every time is read from the
    clocks the Forwarder is given, never from the real one."""

    def monotonic(self):
        raise AssertionError("the forwarder read the real clock (time.monotonic)")

    def time(self):
        raise AssertionError("the forwarder read the real clock (time.time)")

    def sleep(self, s):
        pass


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    for module in (fw, commit_watch, sources):
        monkeypatch.setattr(module, "time", NoRealClock())
    monkeypatch.setattr(fw, "BatchSender", FakeKafka)
    FakeKafka.attempts = FakeKafka.refuse_connect = 0
    FakeKafka.clock = c
    return c


def make(clock, source, rt=None, chunk=2000, **sink):
    """A Forwarder on the fake clock: sink sets keys of its [sink] section (linger_ms 0 unless
    given in kafka), rt its Runtime."""
    sink.setdefault("kafka", {"linger_ms": 0})
    return Forwarder(SinkConfig(**sink), rt or Runtime(spool_dir="", data_dir="", bootstrap="127.0.0.1:1"),
                     source, ThreadControl(), lambda st: None, clock=clock.monotonic, wall_clock=clock.time,
                     chunk_records=chunk)


def forwarder(clock, n, chunk=4, **sink):
    f = make(clock, MemorySource(1 << 20, clock=clock.time), chunk=chunk, **sink)
    add(f, clock, 0, n)
    return f


def add(f, clock, first, n):
    for i in range(first, first + n):
        f.source.append(encode_message("mqtt.messages", "t/x", str(i).encode(), 1, False, "c", None, 5,
                                       int(clock.time() * 1000), f"id-{i}"))


def steps(f, clock, n=1):
    for _ in range(n):
        f.step(clock.monotonic())


def test_failed_chunk_waits_for_the_others_rewinds_to_its_first_record_and_backs_off(clock):
    f = forwarder(clock, 10)
    steps(f, clock, 3)                      # connect, then one chunk per step: 0-3, 4-7, 8-9
    k = FakeKafka.last
    assert f.state is State.FORWARDING and [fut.values() for fut in k.sent] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                                 [8, 9]]
    k.ack(0)
    k.fail(1, KafkaTimeoutError("request timed out"))
    steps(f, clock)
    assert f.state is State.RESENDING and f.resend_at.seq == 4
    assert f._resume_pos() == f.resend_at.pos    # a restart now would start at the failed chunk
    assert f.acked_seq == 4 and f.failed == 4 and f.kafka_up is False
    assert len(k.sent) == 3                 # nothing new while one is still in flight
    k.ack(2)                                # acknowledged, but behind the failed chunk: sent again
    steps(f, clock)
    assert f.state is State.FORWARDING and f.acked_seq == 4 and not f.inflight
    steps(f, clock)
    assert len(k.sent) == 3                 # backing off
    clock.advance(0.5)
    steps(f, clock, 2)
    assert [fut.values() for fut in k.sent[3:]] == [[4, 5, 6, 7], [8, 9]]
    k.ack(3)
    k.ack(4)
    steps(f, clock)
    assert f.acked_seq == 10 and f.forwarded == 10 and f.kafka_up is True
    assert k.log[-6:] == [4, 5, 6, 7, 8, 9]    # in order from the failed record: duplicates, no gap


def test_a_record_refused_for_good_is_found_one_by_one_and_dropped_alone(clock):
    f = forwarder(clock, 3)
    steps(f, clock, 2)
    k = FakeKafka.last
    k.fail(0, MessageSizeTooLargeError("too large"))
    steps(f, clock)                         # -> RESENDING, one record per request up to the chunk's end
    assert f.state is State.FORWARDING and f.failed == 3 and f.poisoned == 0
    clock.advance(0.5)
    steps(f, clock, 3)
    assert [fut.values() for fut in k.sent[1:]] == [[0], [1], [2]]
    k.ack(1)
    k.fail(2, MessageSizeTooLargeError("too large"))
    k.ack(3)
    steps(f, clock)
    assert f.poisoned == 1 and f.state is State.FORWARDING and f.resend_at is None
    assert f.acked_seq == 3 and f.forwarded == 2 and k.log == [0, 2]
    steps(f, clock)
    add(f, clock, 3, 5)
    steps(f, clock)
    assert k.sent[-1].values() == [3, 4, 5, 6]   # past the refused chunk: whole chunks again


def two_chunks_acknowledged(clock, n):
    """A forwarder that connected and sent n records in two chunks, both acknowledged."""
    f = forwarder(clock, n, chunk=n // 2)
    steps(f, clock, 3)
    k = FakeKafka.last
    k.ack(0)
    k.ack(1)
    steps(f, clock)
    return f, k


def test_kafka_losing_data_probes_metadata_then_replays_the_window(clock):
    f, k = two_chunks_acknowledged(clock, 6)
    assert f.acked_seq == 6 and f.loss.offsets == {"mqtt.messages/0": 5}
    add(f, clock, 6, 4)
    steps(f, clock, 2)                      # 6-8 and 9 in flight
    k.cluster.answers = False
    k.ack(2, base=0)                        # the offset went back: Kafka restarted empty
    steps(f, clock)
    assert f.state is State.REFILLING and "went back from 5 to 0" in f.lost_reason
    assert len(k.sent) == 4 and k.cluster.updates == 0   # nothing sent, waits for the one in flight
    k.ack(3)
    steps(f, clock)
    assert f.state is State.PROBING and k.cluster.updates == 1
    clock.advance(0.05)
    steps(f, clock)                         # no fresh metadata yet: keep probing, send nothing
    assert f.state is State.PROBING and k.cluster.updates == 2 and len(k.sent) == 4
    k.cluster._last_successful_refresh_ms = clock.monotonic() * 1000 + 10
    clock.advance(0.05)
    steps(f, clock)
    assert f.state is State.FORWARDING and f.refills == 1 and f.loss.offsets == {}
    steps(f, clock, 4)
    assert [fut.values() for fut in k.sent[4:]] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert f.refilled == 10 and f.acked_seq == 10


def test_after_a_failed_request_nothing_is_sent_before_fresh_metadata(clock):
    """A Kafka that restarted empty acknowledges records for a topic it no longer has and drops
    them (Tansu): after a failure the next chunk waits for metadata refreshed since."""
    f = forwarder(clock, 6, chunk=3)
    steps(f, clock, 3)
    k = FakeKafka.last
    k.ack(0)
    k.cluster.refreshed()                   # metadata from before the failure
    clock.advance(0.1)
    k.cluster.answers = False
    k.fail(1, KafkaTimeoutError("request timed out"))
    steps(f, clock)
    assert f.state is State.FORWARDING and k.cluster.updates == 1   # asked at the failure
    for _ in range(5):
        clock.advance(0.5)
        steps(f, clock)
    assert len(k.sent) == 2 and k.cluster.updates > 1   # still asking, nothing sent
    assert f.kafka_up is False              # (the metadata from before the failure is no sign of life)
    k.cluster.refreshed()
    clock.advance(0.05)
    steps(f, clock)
    assert [fut.values() for fut in k.sent[2:]] == [[3, 4, 5]]


def test_without_fresh_metadata_sending_is_tried_again_after_15_seconds(clock):
    f = forwarder(clock, 4, chunk=2)
    steps(f, clock, 3)
    k = FakeKafka.last
    k.ack(0)
    k.cluster.answers = False
    k.fail(1, KafkaTimeoutError("request timed out"))
    steps(f, clock)
    clock.advance(14.9)
    steps(f, clock)
    assert len(k.sent) == 2
    clock.advance(0.2)
    steps(f, clock)
    assert [fut.values() for fut in k.sent[2:]] == [[2, 3]]


def test_a_topic_made_again_in_a_metadata_refresh_is_refilled_before_any_new_record(clock):
    """Another client (a second forwarder, the history job) made the topic again after Kafka
    restarted empty: what this forwarder sends next would go into the new log before the
    records Kafka lost. The ids of every refresh are checked before the next chunk: the refill
    goes first and per-topic order holds."""
    f, k = two_chunks_acknowledged(clock, 4)
    assert f.acked_seq == 4 and f.loss.topic_ids == {"mqtt.messages": "id-1"}
    k.cluster.id = "id-2"
    k.cluster.refreshed()                   # (maybe_refresh, or a refresh kafka-python asked for)
    add(f, clock, 4, 2)
    steps(f, clock)
    assert len(k.sent) == 2 and f.state in (State.REFILLING, State.PROBING)
    assert "re-created" in f.lost_reason
    steps(f, clock, 5)
    assert [fut.values() for fut in k.sent[2:]] == [[0, 1], [2, 3], [4, 5]]


def test_probing_gives_up_waiting_for_fresh_metadata_after_15_seconds(clock):
    f = forwarder(clock, 2)
    steps(f, clock, 2)
    k = FakeKafka.last
    k.ack(0)
    steps(f, clock)
    k.cluster.answers = False
    f._lost("test")
    steps(f, clock)
    assert f.state is State.PROBING
    clock.advance(14)
    steps(f, clock)
    assert f.state is State.PROBING and f.refills == 0
    clock.advance(1.01)
    steps(f, clock)
    assert f.state is State.FORWARDING and f.refills == 1


def test_connecting_retries_once_a_second(clock):
    FakeKafka.refuse_connect = 2
    f = forwarder(clock, 1)
    steps(f, clock, 3)
    assert f.state is State.CONNECTING and FakeKafka.attempts == 1 and f.kafka_up is False
    clock.advance(1.0)
    steps(f, clock)
    assert f.state is State.CONNECTING and FakeKafka.attempts == 2
    clock.advance(1.0)
    steps(f, clock)
    assert f.state is State.FORWARDING and FakeKafka.attempts == 3 and f.kafka_up is True
    steps(f, clock)
    assert FakeKafka.last.sent[0].values() == [0]


def test_lingers_for_fuller_chunks_unless_the_last_read_was_full(clock):
    f = forwarder(clock, 6, chunk=4)
    f.linger = 0.005
    steps(f, clock, 2)                      # connect; a full chunk of 4
    steps(f, clock)                         # the read was full: read again at once (2 left)
    k = FakeKafka.last
    assert [fut.values() for fut in k.sent] == [[0, 1, 2, 3], [4, 5]]
    add(f, clock, 6, 1)
    steps(f, clock)
    assert len(k.sent) == 2 and f._lingering   # the last read was short: wait a few ms
    clock.advance(0.006)
    steps(f, clock)
    assert k.sent[-1].values() == [6]


def test_history_mode_replays_from_the_committed_position_not_the_window(clock):
    """keep_until = "history": after Kafka lost data, what the table has not committed is sent
    again, from the committed position (the replay window plays no part)."""
    f = forwarder(clock, 6, chunk=3, keep_until="history")
    steps(f, clock, 3)
    k = FakeKafka.last
    k.ack(0)
    k.ack(1)
    steps(f, clock)
    commits = f.commits
    assert [(c.end, c.next_seq) for c in commits.pending] == [(commits.pending[0].end, 3), (f.acked_pos, 6)]
    commits.committed_pos, commits.committed_seq = commits.pending[0].end, 3   # the table has the first chunk
    commits.pending.popleft()
    f._lost("test")
    steps(f, clock)                         # -> PROBING
    k.cluster._last_successful_refresh_ms = clock.monotonic() * 1000 + 10
    steps(f, clock)
    assert f.state is State.FORWARDING and not commits.pending
    steps(f, clock, 2)
    assert k.sent[-1].values() == [3, 4, 5] and len(k.sent) == 3
    k.ack(2)
    steps(f, clock)
    assert [(c.end, c.next_seq) for c in commits.pending] == [(f.acked_pos, 6)]   # awaits the table again


def test_linger_comes_from_sink_kafka_linger_ms(clock):
    """[sink.kafka] linger_ms sets how long records gather into one request (default 20 ms)."""
    src = MemorySource(1 << 20)
    assert make(clock, src, kafka={}).linger == 0.020
    assert make(clock, src, kafka={"linger_ms": 50}).linger == 0.050
