"""The cluster's producer (cluster/produce.py) batches per event-loop turn: the records one turn
appends leave in one ProduceRequest, their outcomes come back to the loop together when its
answer arrives, and records appended while a request is in flight wait for its answer and then
leave together, in the order they were appended (one request in flight keeps a partition's
order: the acknowledgement of a QoS 1 PUBLISH waits for Kafka [MQTT-4.3.2-1] and a publisher's
messages keep their order [MQTT-4.6.0-5]).

A fake sender stands for Kafka (it counts requests and answers when the test says so) and a
fake loop runs the callbacks the producer schedules, so nothing here waits on a clock; the
producer's own thread runs, and the waits below are generous bounds for it to get there."""
from __future__ import annotations

import queue
import threading
import time

from cluster.produce import Producer
from kafka_client.record import body_key

T = "mqtt.messages"
WAIT = 5.0


class FakeLoop:
    def __init__(self) -> None:
        self.soon: list = []
        self.from_thread: queue.Queue = queue.Queue()

    def call_soon(self, fn, *args) -> None:
        self.soon.append((fn, args))

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.from_thread.put((fn, args))

    def end_turn(self) -> None:
        """Run what this turn scheduled (the producer's kick)."""
        todo, self.soon = self.soon, []
        for fn, args in todo:
            fn(*args)

    def run_answer(self, timeout: float = WAIT) -> None:
        fn, args = self.from_thread.get(timeout=timeout)
        fn(*args)


class Answer:
    def __init__(self, groups: dict) -> None:
        self.groups = groups
        self.counts = {(t, 0): len(v) for t, v in groups.items()}
        self.value: dict | None = None
        self.exception: Exception | None = None
        self.answered = threading.Event()

    def poll(self) -> bool:
        return self.answered.is_set()


class FakeSender:
    """One partition per topic; a request is answered when the test calls answer()."""

    def __init__(self) -> None:
        self.requests: list[Answer] = []
        self.offsets: dict = {}
        self.sent = threading.Condition()

    def send(self, groups: dict) -> Answer:
        a = Answer(groups)
        with self.sent:
            self.requests.append(a)
            self.sent.notify_all()
        return a

    def wait_requests(self, n: int) -> None:
        with self.sent:
            assert self.sent.wait_for(lambda: len(self.requests) >= n, WAIT), \
                f"{len(self.requests)} requests sent, {n} expected"

    def answer(self, i: int) -> None:
        a = self.requests[i]
        value = {}
        for tp, n in a.counts.items():
            value[tp] = self.offsets.get(tp, 0)
            self.offsets[tp] = value[tp] + n
        a.value = value
        a.answered.set()

    def poll(self, timeout_ms: int = 0) -> None:
        time.sleep(0.001)

    def request_update(self) -> None:
        pass

    def maybe_refresh(self) -> None:
        pass

    def forget_ids(self) -> None:
        pass

    def close(self) -> None:
        pass


def make(sender_class: type = FakeSender) -> tuple[Producer, FakeLoop, FakeSender, list]:
    loop, sender, outcomes = FakeLoop(), sender_class(), []
    p = Producer(loop, "unused:9092", {}, outcomes.append, sender=sender)  # type: ignore[arg-type]
    return p, loop, sender, outcomes


def append(p: Producer, tags: list[str]) -> None:
    for tag in tags:
        p.send(T, tag.encode(), b"payload of " + tag.encode(), None, 1000, tag)


def bodies(a: Answer) -> list[bytes]:
    return [body for _, body in a.groups[T]]


def test_records_of_one_turn_go_in_one_request_and_are_acknowledged_together_on_its_answer():
    p, loop, sender, outcomes = make()
    try:
        append(p, ["a", "b", "c", "d", "e"])
        assert sender.requests == []          # nothing leaves before the turn ends
        loop.end_turn()
        sender.wait_requests(1)
        assert len(bodies(sender.requests[0])) == 5
        assert p.backlog == 5 and outcomes == []   # no acknowledgement before Kafka's answer
        sender.answer(0)
        loop.run_answer()
        assert outcomes == [[(t, None) for t in "abcde"]]   # one batch, in order
        assert p.backlog == 0 and p.answered == 5
        assert p.acked_upto == {(T, 0): 5}
        assert len(sender.requests) == 1
    finally:
        p.close()


def test_records_appended_while_a_request_is_in_flight_leave_together_after_its_answer():
    p, loop, sender, outcomes = make()
    try:
        append(p, ["a", "b"])
        loop.end_turn()
        sender.wait_requests(1)
        append(p, ["c", "d", "e"])
        loop.end_turn()
        append(p, ["f", "g", "h"])
        loop.end_turn()
        time.sleep(0.05)
        assert len(sender.requests) == 1      # one request in flight: the next waits for its answer
        sender.answer(0)
        sender.wait_requests(2)
        second = bodies(sender.requests[1])
        assert len(second) == 6               # both later turns in one request
        assert [b[1:2] for b in second] == [b"c", b"d", b"e", b"f", b"g", b"h"]  # (key: vlen 1, key)
        loop.run_answer()
        assert outcomes == [[("a", None), ("b", None)]]
        sender.answer(1)
        loop.run_answer()
        assert outcomes[1] == [(t, None) for t in "cdefgh"]
        assert p.acked_upto == {(T, 0): 8} and p.backlog == 0
    finally:
        p.close()


def test_a_refused_request_fails_the_acknowledgements_of_all_its_records():
    p, loop, sender, outcomes = make()
    try:
        append(p, ["a", "b", "c"])
        loop.end_turn()
        sender.wait_requests(1)
        refused = Exception("record too large")
        refused.retriable = False  # type: ignore[attr-defined]
        sender.requests[0].exception = refused
        sender.requests[0].answered.set()
        loop.run_answer()
        assert [t for t, _ in outcomes[0]] == ["a", "b", "c"]
        assert all(f is not None and "refused" in f for _, f in outcomes[0])
        assert p.acked_upto == {}
    finally:
        p.close()


class MadeAgainSender(FakeSender):
    """A Kafka that lost its data and whose topic was made again: every send is refused
    (TopicMoved) until the producer forgets the ids it wrote under (forget_ids())."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = False

    def send(self, groups: dict) -> Answer:
        from kafka_client.produce import TopicMoved
        if self.moved:
            raise TopicMoved(f"the topic {T} was made again in Kafka (its id changed)")
        return super().send(groups)

    def forget_ids(self) -> None:
        self.moved = False


def test_records_written_again_after_a_loss_leave_before_the_run_the_producer_was_sending():
    """[MQTT-4.6.0-5] a publisher's messages keep their order across a Kafka that lost its
    data: the run the producer was sending is not written to the topic made again (the loss
    is reported), and the copies of the older records the lost log had leave first."""
    p, loop, sender, outcomes = make(MadeAgainSender)
    try:
        sender.moved = True  # type: ignore[attr-defined]
        append(p, ["new1", "new2"])
        loop.end_turn()
        deadline = time.monotonic() + WAIT
        while p.went_back is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert "made again" in (p.take_went_back() or "")
        assert sender.requests == []
        p.send_again(T, [(b"old1", 900, "old1"), (b"old2", 950, "old2")])
        sender.wait_requests(1)
        assert bodies(sender.requests[0]) == [b"old1", b"old2"]
        sender.answer(0)
        loop.run_answer()
        sender.wait_requests(2)
        assert [body_key(b) for b in bodies(sender.requests[1])] == [b"new1", b"new2"]
        sender.answer(1)
        loop.run_answer()
        assert outcomes == [[("old1", None), ("old2", None)], [("new1", None), ("new2", None)]]
        assert p.backlog == 0
    finally:
        p.close()
