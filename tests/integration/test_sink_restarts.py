"""keep_until = "history" with the real pieces: the broker's Sink, its forwarder process and its
embedded Kafka (Tansu) are SIGKILLed in a few orders while records flow, and a stand-in for the
history job commits (signed, as the job does) what Kafka has. The Sink restarts both; the spool
must drain (every record committed, nothing held back) and no record may be lost.
The orderings in general are tests/unit/test_forwarder_restarts.py (fake clock)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from kafka_client.embedded import free_port
from settings import secrets
from sink.forward.service import Sink
from sink.history import commits
from tests.integration.test_sink_kafka import rec, topic_id, wait_for

pytestmark = [pytest.mark.kafka]
TOPIC = "mqtt.messages"


class Job(threading.Thread):
    """Every 0.3 s: read what Kafka has under its current topic id and report it committed, as
    sink.job does after each micro-batch (a signed sink/history/commits.py file)."""

    def __init__(self, bootstrap: str, path: str, key: bytes):
        super().__init__(daemon=True)
        self.bootstrap, self.path, self.key = bootstrap, path, key
        self.table: set[str] = set()
        self.batch = 0
        self.stop = threading.Event()

    def topic_id(self) -> str | None:
        return topic_id(self.bootstrap, TOPIC, 2000)

    def once(self) -> None:
        c = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                          consumer_timeout_ms=300, request_timeout_ms=3000)
        try:
            before = self.topic_id()
            parts = c.partitions_for_topic(TOPIC)
            if not before or not parts:
                return
            tps = [TopicPartition(TOPIC, p) for p in parts]
            c.assign(tps)
            c.seek_to_beginning()
            got, offsets = set(), {tp.partition: 0 for tp in tps}
            deadline, empty = time.monotonic() + 10, 0
            while empty < 2 and time.monotonic() < deadline:   # (Tansu's ListOffsets under-reports)
                polled = c.poll(300)
                empty = 0 if polled else empty + 1
                for tp, recs in polled.items():
                    for r in recs:
                        got.add(dict(r.headers)["mqtt.message_id"].decode())
                        offsets[tp.partition] = max(offsets[tp.partition], r.offset + 1)
            if empty < 2 or self.topic_id() != before:
                return                    # Kafka restarted meanwhile: commit nothing this time
            self.table |= got
            self.batch += 1
            commits.write_committed(self.path, self.batch, {TOPIC: {"topic_id": before, "offsets": offsets}},
                                     key=secrets.derive(self.key, secrets.COMMITTED))
        finally:
            c.close()

    def run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                self.once()
            except Exception:             # Kafka restarting
                pass


def kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("order", [("forwarder", "kafka"), ("kafka", "forwarder"), ("kafka", "kafka"),
                                   ("forwarder", "kafka", "forwarder", "kafka")],
                         ids=lambda o: "-then-".join(o))
def test_spool_drains_after_the_forwarder_and_kafka_are_killed(tmp_path, order):
    committed = str(tmp_path / "ckpt" / commits.FILE_NAME)
    s = Sink.from_config({"embedded_port": free_port(), "forwarder": "process", "keep_until": "history",
                          "committed_file": committed, "replay_window_seconds": 0,
                          "spool_segment_bytes": 4096, "stats_interval": 0}, str(tmp_path))
    s.start()
    job = Job(s.bootstrap, committed, s.key)
    job.start()
    sent: list[str] = []

    def publish(n: int) -> None:
        for _ in range(n):
            r = rec(f"k/{len(sent) % 3}", len(sent))
            assert s.submit(r)
            sent.append(r.message_id)

    try:
        publish(200)
        wait_for(lambda: s.stats()["spool_held_messages"] == 0, 60, "first records committed")
        for what in order:
            publish(150)
            time.sleep(0.3)
            if what == "kafka":
                old = s.embedded.proc
                kill(old)
                wait_for(lambda: s.embedded.proc is not old and s.embedded.proc is not None
                         and s.embedded.proc.poll() is None, 30, "the Sink restarts Kafka")
            else:
                old = s._procs[0]
                kill(old)
                wait_for(lambda: s._procs[0] is not old, 30, "the Sink restarts the forwarder")
            publish(100)
        publish(50)
        wait_for(lambda: s.stats()["spool_held_messages"] == 0 and s.stats()["spool_messages"] == 0,
                 120, f"the spool to drain ({s.stats()})")
        st = s.stats()
    finally:
        job.stop.set()
        job.join(10)
        s.close()
    missing = set(sent) - job.table
    assert not missing, f"{len(missing)} of {len(sent)} records never reached the table"
    assert st["history_commit_ok"] and st["history_commit_status"] == "ok", st
    assert st["spool_uncommitted_messages"] == 0, st
