"""Nothing lost when the embedded Kafka restarts: with keep_until = "history" the spool keeps every
record until the history table has it. The job is down, 50,000 QoS 1 messages are published,
Tansu is SIGKILLed and restarted empty (long after any replay window), the job starts: the table
holds all 50,000, each once."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from sink.forward.spool import read_min_checkpoint
from sink.history.commits import committed_path
from sink.history.job import Job, run
from sink.history.query import run_sql
from tests.conftest import ROOT, BrokerProcess
from tests.integration.test_sink_kafka import consume, wait_for

sys.path.insert(0, str(ROOT / "bench"))
from loadgen import Client, connect, make_payload, publish_packet  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(600)]
N = 50_000


class Pub(Client):
    """QoS 1 publisher keeping `window` PUBLISHes unacknowledged; counts PUBACKs."""

    def __init__(self, cid, topic, window=200):
        super().__init__(cid)
        self.pkts = [None] + [publish_packet(topic, make_payload(i), 1, i) for i in range(1, window + 1)]
        self.window, self.left, self.acked = window, 0, 0
        self.done = asyncio.get_running_loop().create_future()

    def go(self, n):
        self.left = n
        k = min(n, self.window)
        self.left -= k
        self.transport.write(b"".join(self.pkts[1:k + 1]))

    def on_release(self, pid):
        self.acked += 1
        if self.left > 0:
            self.left -= 1
            self.out.append(self.pkts[pid])
        elif self.acked == self.target and not self.done.done():
            self.done.set_result(None)


async def publish(port, n, pubs=8):
    loop = asyncio.get_running_loop()
    ps = [await connect(loop, lambda i=i: Pub(f"ret-{i}", f"ret/{i}"), "127.0.0.1", port) for i in range(pubs)]
    for p in ps:
        p.target = n // pubs
        p.go(n // pubs)
    await asyncio.wait_for(asyncio.gather(*(p.done for p in ps)), 300)
    for p in ps:
        p.transport.close()
    return sum(p.acked for p in ps)


def test_job_down_kafka_restarted_empty_table_gets_everything_once(spark, kafka, tmp_path):
    table = str(tmp_path / "history")
    (tmp_path / "b").mkdir()
    broker = BrokerProcess(tmp_path / "b", args=["--kafka-bootstrap", kafka.bootstrap], settings={
        "sink.keep_until": "history", "sink.committed_file": committed_path(table),
        "sink.replay_window_seconds": 1}).start()                  # any window is long over
    try:
        assert asyncio.run(publish(broker.port, N)) == N            # all acknowledged (PUBACK 0)
        spool = str(tmp_path / "b" / "spool")
        wait_for(lambda: int((read_min_checkpoint(spool) or {}).get("seq", 0)) >= N, 120, "all in Kafka")
        time.sleep(2)
        kafka.proc.send_signal(signal.SIGKILL)
        kafka.proc.wait()
        kafka.start()                                                 # same port, empty
        got = consume(kafka.bootstrap, "mqtt.messages", N, timeout=180)
        assert len({dict(r.headers)["mqtt.message_id"] for r in got}) == N, broker.logs()[-3000:]
        cfg = Job.of(bootstrap=kafka.bootstrap, table=table, trigger_seconds=1, available_now=True)
        assert run(spark, cfg) == 0
        rows = run_sql(spark, table, "SELECT count(*) AS n, count(DISTINCT message_id) AS ids FROM messages")
        assert (rows[0].n, rows[0].ids) == (N, N)
    finally:
        broker.stop()
    assert os.path.exists(spool)
