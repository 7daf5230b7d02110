"""The embedded Kafka (Tansu, memory storage: no DeleteRecords, no retention) stays within
[sink] embedded_max_mb: with keep_until = "history", once the history table has committed what
Kafka holds the broker restarts it empty, so the records the table has are gone from Kafka and
its memory does not grow with the number of records ever sent; the table still gets every
message exactly once (the spool sends again what the table had not committed)."""
from __future__ import annotations

import asyncio
import re
import time
import urllib.request

import pytest

from sink.history.commits import committed_path
from sink.history.job import Job, run
from sink.history.query import run_sql
from tests.conftest import BrokerProcess, free_port
from tests.e2e.test_history_retention import publish
from tests.integration.test_sink_kafka import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(900)]
ROUNDS, PER_ROUND, BOUND_MB = 5, 40_000, 24


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


def kafka_records(bootstrap: str) -> int:
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = c.partitions_for_topic("mqtt.messages") or set()
        tps = [TopicPartition("mqtt.messages", p) for p in parts]
        begin, end = c.beginning_offsets(tps), c.end_offsets(tps)
        return sum(end[tp] - begin[tp] for tp in tps)
    finally:
        c.close()


def test_embedded_kafka_gives_back_what_the_table_holds(spark, tmp_path):
    table = str(tmp_path / "history")
    kport, mport = free_port(), free_port()
    (tmp_path / "b").mkdir()
    broker = BrokerProcess(tmp_path / "b", settings={
        "sink.enabled": True, "sink.embedded_port": kport, "sink.keep_until": "history",
        "sink.committed_file": committed_path(table), "sink.embedded_max_mb": BOUND_MB,
        "metrics.enabled": True, "metrics.port": mport}).start()
    bootstrap = f"127.0.0.1:{kport}"
    cfg = Job.of(bootstrap=bootstrap, table=table, trigger_seconds=1, available_now=True,
                 source="python", data_dir=str(tmp_path / "b"))  # the broker's key signs the commit
    sizes = []
    try:
        for r in range(ROUNDS):
            assert asyncio.run(publish(broker.port, PER_ROUND)) == PER_ROUND
            wait_for(lambda: metric(mport, "mqtt_sink_spool_messages") == 0, 120, "all in Kafka")
            sent = (r + 1) * PER_ROUND
            assert run(spark, cfg) == 0
            # the broker sees the job's commit, then restarts its Kafka once past the bound
            wait_for(lambda: metric(mport, "mqtt_sink_spool_uncommitted_messages") == 0, 60,
                     "the broker to read the job's commit")
            size = metric(mport, "mqtt_sink_embedded_kafka_bytes")
            if size >= BOUND_MB << 20:
                wait_for(lambda: metric(mport, "mqtt_sink_embedded_kafka_bytes") < BOUND_MB << 20,
                         30, "the embedded Kafka to be restarted")
            sizes.append(metric(mport, "mqtt_sink_embedded_kafka_bytes"))
            # what the table committed is no longer in Kafka
            assert kafka_records(bootstrap) < sent
        recycles = metric(mport, "mqtt_sink_embedded_kafka_recycles")
        assert recycles >= 2
        assert max(sizes) < BOUND_MB * 1.5 * (1 << 20)       # not ROUNDS x a round's records
        time.sleep(1)
        assert run(spark, cfg) == 0
        rows = run_sql(spark, table,
                       "SELECT count(*) AS n, count(DISTINCT message_id) AS ids FROM messages")
        assert (rows[0].n, rows[0].ids) == (ROUNDS * PER_ROUND, ROUNDS * PER_ROUND)
    finally:
        broker.stop()
    assert "restarting it empty" in (tmp_path / "b" / f"broker-{broker.port}.log").read_text()
