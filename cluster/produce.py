"""The cluster's writes to Kafka, batched per event-loop turn.

The loop appends records (their Kafka v2 record bodies, encoded once) and kicks a producer
thread at most once per turn; the thread sends everything waiting as one ProduceRequest per
leader (acks=all), through the sink's BatchSender (kafka-python's network client, no per-record
accumulator: kafka_client/produce.py), waits for the answer, and reports each record's outcome
back to the loop in one batch. One request in flight at a time keeps the records of a partition
in the order they were appended; a retriable error sends the same records again until
`delivery_timeout` (then they fail: the acknowledgements waiting for them become failures).

Why not KafkaProducer.send(): about 19 us of CPU per record here (its accumulator, futures and
per-record callbacks), against about 4 us this way (bench/cluster_bench.py, the sending node's
CPU per message).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    import asyncio

from kafka_client.produce import BatchSender, NotReady, TopicMoved
from kafka_client.record import encode_body

log = logging.getLogger(__name__)


class Producer:
    def __init__(self, loop: asyncio.AbstractEventLoop, bootstrap: str, kafka: dict,
                 done: Callable[[list[tuple[Any, str | None]]], None], delivery_timeout: float = 30.0,
                 sign: Callable[[str, bytes, int], bytes] | None = None, sender: Any = None) -> None:
        """done(list of (tag, failure or None)) is called on the loop for every record sent;
        sign(topic, body, timestamp) gives each record body its signature (cluster/trust.py);
        `sender` (tests): what sends the requests instead of a BatchSender on `bootstrap`."""
        self.sign = sign
        self.loop = loop
        self.user_done = done
        self.backlog = 0                 # records handed to send() and not answered yet
        self.handed = 0                  # records handed to send() since the start
        self.answered = 0                # ... answered (in the order they were handed)
        self.delivery_timeout = delivery_timeout
        if sender is None:
            cfg = {"bootstrap_servers": bootstrap.split(","), "client_id": "mqtt-cluster"}
            cfg.update(kafka)
            sender = BatchSender(cfg, create_topics=False)  # (cluster/link.py ensure_topics)
        self.sender = sender
        self.pending: list = []          # on the loop: (topic, ts, body, tag) not yet handed over
        # (topic, partition) -> the offset after the last record Kafka acknowledged from here
        self.acked_upto: dict[tuple[str, int], int] = {}
        # set by the thread when Kafka took records below offsets it had acknowledged before
        # (it lost its data); taken by take_went_back()
        self.went_back: str | None = None
        self.kicked = False
        self.cond = threading.Condition()
        self.queue: list = []            # handed to the thread
        self.front: list = []            # handed to the thread, to send before anything else
        self.resume = False              # with front: topics made again may be written to
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="cluster-producer", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ on the loop
    def send(self, topic: str, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]] | None, ts: int,
             tag: Any) -> None:
        """Queue one record (value None: a tombstone); `tag` comes back with its outcome."""
        self.send_body(topic, encode_body(key, value, headers or []) if value is not None
                       else _tombstone(key, headers or []), ts, tag)

    def send_body(self, topic: str, body: bytes, ts: int, tag: Any) -> bytes:
        """send() of a record body already encoded (kafka_client.record.encode_message_body);
        returns the body as written (signed: as the log will hold it)."""
        if self.sign is not None:
            body = self.sign(topic, body, ts)
        self.pending.append((topic, ts, body, tag))
        self.backlog += 1
        self.handed += 1
        if not self.kicked:
            self.kicked = True
            self.loop.call_soon(self.kick)
        return body

    def send_again(self, topic: str, items: list[tuple[bytes, int, Any]]) -> None:
        """After Kafka lost its data: send_body() of (body, ts, tag) records (cluster/keep.py's
        copies of what the lost log had), in order, before every other record not written yet:
        those appended this turn, those handed to the thread, and the run it is sending (sent
        again after these: it is newer). From then on records go to the topics under the ids
        Kafka gives them now (until then, a topic made again is not written to: TopicMoved)."""
        sign = self.sign
        front = [(topic, ts, sign(topic, body, ts) if sign is not None else body, tag)
                 for body, ts, tag in items]
        self.backlog += len(items)
        self.handed += len(items)
        with self.cond:  # (together: the thread takes both at once, before its next attempt)
            self.front.extend(front)
            self.resume = True
            self.cond.notify()

    def take_went_back(self) -> str | None:
        """Why Kafka lost data, seen by the offsets it gave this producer's records (once)."""
        why, self.went_back = self.went_back, None
        return why

    def done(self, outcome: list) -> None:
        """On the loop: the thread's answer for a run of records."""
        self.backlog -= len(outcome)
        self.answered += len(outcome)
        self.user_done(outcome)

    def kick(self) -> None:
        """Hand what this turn appended to the thread."""
        self.kicked = False
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        with self.cond:
            self.queue.extend(batch)
            self.cond.notify()

    def flush(self, timeout: float) -> bool:
        """Wait (blocking) until everything handed over was answered (shutdown)."""
        self.kick()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.cond:
                if not self.queue and not self.front and not self.busy:
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(3)
        self.sender.close()

    # ------------------------------------------------------------ on the thread
    busy = False
    resume = False

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.front and not self.stopping:
                    self.cond.wait(0.5)
                    if not self.queue and not self.front:
                        self._idle()
                if self.stopping and not self.queue and not self.front:
                    return
                work, self.queue = self._take_front() + self.queue, []
                self.busy = True
            try:
                for chunk in _chunks(work, CHUNK_BYTES):
                    self._send(chunk)
            finally:
                self.busy = False

    def _take_front(self) -> list:
        """(Holding self.cond.) The records send_again() put first, taken; with them, the
        word that topics made again may now be written to (resume)."""
        front, self.front = self.front, []
        if self.resume:
            self.resume = False
            self.sender.forget_ids()
        return front

    def _idle(self) -> None:
        try:
            self.sender.poll(0)
            self.sender.maybe_refresh()
        except Exception:
            pass

    def _send(self, work: list) -> None:
        groups: dict[str, list] = {}
        for topic, ts, body, _ in work:
            groups.setdefault(topic, []).append((ts, body))
        deadline = time.monotonic() + self.delivery_timeout
        failure = None
        err: Exception  # the last attempt's
        while True:
            if self.front or self.resume:  # after Kafka lost its data: what it had, first
                with self.cond:
                    front = self._take_front()
                for chunk in _chunks(front, CHUNK_BYTES):
                    self._send(chunk)
            try:
                fut = self.sender.send(groups)
                while not fut.poll():
                    self.sender.poll(50)
                    if time.monotonic() > deadline:
                        raise TimeoutError("no answer from Kafka")
                if fut.exception is None:
                    for tp, base in (fut.value or {}).items():
                        end, before = base + fut.counts.get(tp, 0), self.acked_upto.get(tp, 0)
                        if base < before:
                            # offsets went back: Kafka lost what it had acknowledged
                            if self.went_back is None:
                                self.went_back = f"{tp[0]}-{tp[1]} took records at offset " \
                                                 f"{base}, below the {before} it had acknowledged"
                            self.acked_upto[tp] = end
                        elif end > before:
                            self.acked_upto[tp] = end
                    break
                raise fut.exception
            except NotReady as exc:
                err = exc
                if isinstance(exc, TopicMoved):
                    # Kafka lost its data: nothing goes to the new log before the node wrote
                    # again what the old one had (send_again); said once (not after that)
                    with self.cond:
                        if not self.resume and self.went_back is None:
                            self.went_back = str(exc)
            except Exception as exc:  # retriable Kafka errors and lost connections: again
                err = exc
                # also again: an unknown error (-1), which Tansu answers when two writers race
                # for one offset (a just restarted Kafka): nothing was written. Had it been,
                # the copy is dropped by every reader (message ids, control `seq`)
                if not getattr(exc, "retriable", True) and not _unknown(exc) and \
                        not isinstance(exc, (OSError, TimeoutError)):
                    failure = f"the cluster's Kafka refused the records: {exc}"
                    break
            if time.monotonic() > deadline:
                failure = f"the cluster's Kafka did not take the records within " \
                          f"{self.delivery_timeout:.0f} s: {err}"
                break
            try:
                self.sender.request_update()
                self.sender.poll(100)
            except Exception:
                time.sleep(0.1)
        if failure:
            log.warning("cluster: %s", failure)
        outcome = [(tag, failure) for _, _, _, tag in work]
        try:
            self.loop.call_soon_threadsafe(self.done, outcome)
        except RuntimeError:  # the loop closed
            pass


def _unknown(exc: Exception) -> bool:
    from kafka.errors import UnknownError
    return isinstance(exc, UnknownError)


# At most this many bytes of records per request (so per RecordBatch): Tansu answers a fetch
# with whole batches whatever the fetch's size limits, and kafka-python refuses a response over
# 100 MB (receive_message_max_bytes); a turn under heavy load can gather far more than that.
CHUNK_BYTES = 1 << 20


def _chunks(work: list, limit: int) -> Iterator[list]:
    """`work` in order, cut into runs of at most `limit` bytes of record bodies (at least one)."""
    start, size = 0, 0
    for i, item in enumerate(work):
        size += len(item[2])
        if size > limit and i > start:
            yield work[start:i]
            start, size = i, len(item[2])
    yield work[start:]


def _tombstone(key: bytes, headers: list[tuple[str, bytes]] = []) -> bytes:  # noqa: B006
    """A record body with a null value (Kafka's tombstone): keyLength key -1 headers."""
    from kafka_client.record import vlen, zz_varint
    parts = [vlen(len(key)), key, zz_varint(-1), vlen(len(headers))]
    for name, val in headers:
        nb = name.encode()
        parts += (vlen(len(nb)), nb, vlen(len(val)), val)
    return b"".join(parts)
