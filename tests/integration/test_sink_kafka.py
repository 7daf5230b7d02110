"""Sink -> real Kafka (Tansu via EmbeddedKafka): record contract, outage + restart, crash recovery."""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from kafka_client.embedded import EmbeddedKafka, free_port
from kafka_client.record import SinkRecord, from_kafka, to_kafka
from sink.forward.service import Sink

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kafka(tmp_path):
    k = EmbeddedKafka(log_file=str(tmp_path / "tansu.log")).start()
    yield k
    k.stop()


def consume(bootstrap: str, topic: str, n: int, timeout: float = 30.0, ids=None) -> list:
    """Every record of `topic` (manual assignment of all partitions, from the beginning) until at
    least n arrived (or, with ids, every message id in ids arrived) or timeout. Per partition in
    offset order."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=500)
    try:
        deadline = time.monotonic() + timeout
        parts = None
        while time.monotonic() < deadline:
            c.topics()                       # refresh metadata
            parts = c.partitions_for_topic(topic)
            if parts:
                break
            time.sleep(0.2)
        assert parts, f"topic {topic} never appeared"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning()
        out = []
        want = set(ids) if ids is not None else None
        while time.monotonic() < deadline:
            if want is None and len(out) >= n or want is not None and not want:
                break
            for _, recs in c.poll(300).items():
                out.extend(recs)
                if want is not None:
                    want.difference_update(mid(r) for r in recs)
        # a little longer, to catch extra (unexpected) records
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            for _, recs in c.poll(100).items():
                out.extend(recs)
        return out
    finally:
        c.close()


def rec(topic: str, i: int, qos: int = 1, **kw) -> SinkRecord:
    return SinkRecord(topic=topic, payload=i.to_bytes(4, "big"), qos=qos, retain=False, client_id="c1",
                      username=None, protocol=5, accepted_at_ms=int(time.time() * 1000), **kw)


def mid(r) -> str:
    return dict(r.headers)["mqtt.message_id"].decode()


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def assert_per_topic_order(records, expected: dict[str, list[str]]):
    """Every expected id arrived, nothing unexpected, and per MQTT topic the last occurrence of each
    message id is in submit order (a replay may re-send earlier records: duplicates, never gaps)."""
    seen = collections.defaultdict(list)
    for r in records:
        seen[r.key.decode()].append(mid(r))
    assert set(seen) == set(expected), (len(records),)
    for topic, ids in expected.items():
        got = seen[topic]
        assert set(got) == set(ids), (topic, len(set(ids) - set(got)), "missing")
        last = {m: i for i, m in enumerate(got)}
        assert sorted(ids, key=last.__getitem__) == ids, f"order broken for {topic}"


# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["process", "thread", "none", "async", "sharded"])
def test_headers_and_payload_round_trip(kafka, tmp_path, mode):
    cfg = {"bootstrap_servers": kafka.bootstrap,
           "forwarder": {"none": "thread", "async": "process", "sharded": "process"}.get(mode, mode),
           "durability": mode if mode in ("none", "async") else "spool", "stats_interval": 1,
           "forwarders": 3 if mode == "sharded" else 1}
    s = Sink.from_config(cfg, str(tmp_path))
    s.start()
    sent = []
    try:
        async def go():
            for i in range(60):
                r = SinkRecord(
                    topic=f"dev/{i % 4}/ü", payload=bytes((i + j) % 256 for j in range(i * 37 % 700)),
                    qos=i % 3, retain=bool(i % 2), client_id=f"client-{i % 5}",
                    username=None if i % 3 == 0 else f"user{i}", protocol=(3, 4, 5)[i % 3],
                    accepted_at_ms=1_700_000_000_000 + i,
                    payload_format=(i % 2) if i % 4 == 0 else None,
                    content_type="application/octet-stream" if i % 5 == 0 else None,
                    response_topic="reply/x" if i % 6 == 0 else None,
                    correlation_data=bytes([0, 255, i]) if i % 7 == 0 else None,
                    message_expiry=i * 10 if i % 8 == 0 else None,
                    user_properties=[(f"p{j % 3}", f"v{j}-ä") for j in range(i % 12)] + [("p0", "v0-ä")] or None)
                assert s.submit(r)
                assert r.message_id
                sent.append(r)
            f = s.barrier()
            if f is not None:
                await f
        asyncio.run(go())
        got = consume(kafka.bootstrap, "mqtt.messages", len(sent))
    finally:
        s.close()
    assert len(got) == len(sent)
    by_id = {mid(r): r for r in got}
    for r in sent:
        k = by_id[r.message_id]
        key, value, headers, ts = to_kafka(r)
        assert (k.key, k.value, k.timestamp) == (key, value, ts)
        got_headers = list(k.headers)
        assert got_headers[:-1] == headers                 # names, values and order exactly,
        assert got_headers[-1][0] == "mqtt.sig"            # then the broker's signature
        assert from_kafka(k.key, k.value, k.headers, k.timestamp) == r
    assert len({r.message_id for r in sent}) == len(sent)
    for t in {r.topic for r in sent}:  # per-topic order kept, also across sharded forwarders
        assert [mid(k) for k in got if k.key == t.encode()] == \
            [r.message_id for r in sent if r.topic == t]


@pytest.mark.timeout(60)
def test_rules_and_exclude(kafka, tmp_path):
    cfg = {"bootstrap_servers": kafka.bootstrap, "forwarder": "thread",
           "rules": [{"filter": "sensors/+/temp", "topic": "mqtt.temps"},
                     {"filter": "sensors/#", "topic": "mqtt.sensors"}],
           "exclude": ["debug/#", "$SYS/#"]}
    s = Sink.from_config(cfg, str(tmp_path))
    s.start()
    try:
        for t in ["sensors/a/temp", "sensors/a/hum", "sensors", "debug/x", "$SYS/broker/load", "other"]:
            assert s.submit(rec(t, 1))
        st = s.stats()
        assert st["accepted"] == 4 and st["excluded"] == 2
        assert [r.key for r in consume(kafka.bootstrap, "mqtt.temps", 1)] == [b"sensors/a/temp"]
        assert sorted(r.key for r in consume(kafka.bootstrap, "mqtt.sensors", 2)) == [b"sensors", b"sensors/a/hum"]
        assert [r.key for r in consume(kafka.bootstrap, "mqtt.messages", 1)] == [b"other"]
    finally:
        s.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["process", "thread", "sharded"])
def test_kafka_outage_and_empty_restart(kafka, tmp_path, mode, caplog):
    """Kafka down for several seconds while QoS 1 records keep being acked; it comes back empty
    (Tansu memory storage): every record arrives, per-topic order kept."""
    caplog.set_level(logging.INFO)
    s = Sink.from_config({"bootstrap_servers": kafka.bootstrap, "stats_interval": 1,
                          "forwarder": "process" if mode == "sharded" else mode,
                          "forwarders": 2 if mode == "sharded" else 1}, str(tmp_path))
    s.start()
    expected: dict[str, list[str]] = collections.defaultdict(list)
    ack_times = []
    topics = [f"site/{i}/m" for i in range(5)]

    async def produce(seconds: float, start: int) -> int:
        i = start
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            batch = []
            for _ in range(20):
                r = rec(topics[i % len(topics)], i)
                assert s.submit(r)
                batch.append(r)
                i += 1
            t0 = time.monotonic()
            f = s.barrier()
            if f is not None:
                await f
            ack_times.append(time.monotonic() - t0)
            for r in batch:
                expected[r.topic].append(r.message_id)
            await asyncio.sleep(0.01)
        return i

    try:
        n = asyncio.run(produce(1.5, 0))
        wait_for(lambda: s.stats()["forwarded"] >= n, 20, "forwarding before the outage")
        kafka.stop()
        n = asyncio.run(produce(6.0, n))               # broker keeps acking from the spool
        st = s.stats()
        assert not st["kafka_up"], st
        assert st["spool_messages"] > 0 and st["lag_seconds"] > 1, st
        kafka.start()                                  # same port, empty
        n = asyncio.run(produce(1.5, n))
        wait_for(lambda: s.stats()["spool_messages"] == 0 and s.stats()["kafka_up"], 60, "drain after outage")
        got = consume(kafka.bootstrap, "mqtt.messages", n, timeout=30,
                      ids=[m for v in expected.values() for m in v])
        st = s.stats()
    finally:
        s.close()
    assert max(ack_times) < 1.0, max(ack_times)         # acks never waited for Kafka
    assert sum(map(len, expected.values())) == n
    assert_per_topic_order(got, expected)
    assert st["replays"] >= 1, st                       # the empty restart was detected
    if mode == "thread":                                # (process mode logs to its own stderr)
        assert "is unavailable" in caplog.text and "reachable again" in caplog.text


DRIVER = textwrap.dedent("""
    import asyncio, os, sys, time
    sys.path.insert(0, {root!r})
    from kafka_client.record import SinkRecord
    from sink.forward.service import Sink
    s = Sink.from_config({{"bootstrap_servers": {bootstrap!r}, "forwarder": "process"}}, {data!r})
    s.start()
    print("FWD", s._procs[0].pid, flush=True)
    async def main():
        i = 0
        while True:
            batch = []
            for _ in range(10):
                r = SinkRecord(topic=f"k/{{i % 3}}", payload=str(i).encode(), qos=1, retain=False,
                               client_id="drv", username=None, protocol=5, accepted_at_ms=int(time.time() * 1000))
                assert s.submit(r)
                batch.append(r.message_id)
                i += 1
            f = s.barrier()
            if f is not None:
                await f
            print("\\n".join("ACK " + m for m in batch), flush=True)
            await asyncio.sleep(0.005)
    asyncio.run(main())
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kafka_down", [False, True])
def test_sigkill_mid_stream_loses_no_acked_record(kafka, tmp_path, kafka_down):
    """The broker process (and its forwarder) are SIGKILLed while records flow; a new Sink on the
    same spool delivers every record whose barrier had resolved."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(root=str(ROOT), bootstrap=kafka.bootstrap, data=str(tmp_path)))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    acked: list[str] = []
    fwd_pid = None
    try:
        t_end = None
        for line in p.stdout:
            line = line.decode().strip()
            if line.startswith("FWD "):
                fwd_pid = int(line.split()[1])
            elif line.startswith("ACK "):
                acked.append(line[4:])
                if len(acked) == 1000 and kafka_down:
                    kafka.stop()                       # the rest only reaches the spool
                if len(acked) >= 2000 and t_end is None:
                    t_end = time.monotonic()
                if t_end is not None:
                    break
    finally:
        os.kill(p.pid, signal.SIGKILL)
        if fwd_pid:
            try:
                os.kill(fwd_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # read what the driver had printed before it died
        rest = p.stdout.read().decode().split("\n")
        acked += [ln[4:] for ln in rest if ln.startswith("ACK ")]
        p.wait()
    if kafka_down:
        kafka.start()                                  # comes back empty
    s = Sink.from_config({"bootstrap_servers": kafka.bootstrap, "forwarder": "process"}, str(tmp_path))
    s.start()
    try:
        wait_for(lambda: s.stats()["spool_messages"] == 0 and s.stats()["kafka_up"], 60, "drain after restart")
        got = consume(kafka.bootstrap, "mqtt.messages", len(acked), timeout=30, ids=acked)
    finally:
        s.close()
    ids = {mid(r) for r in got}
    missing = [m for m in acked if m not in ids]
    assert not missing, f"{len(missing)} acknowledged records missing of {len(acked)}"


@pytest.mark.timeout(90)
def test_spool_full_refuses_then_recovers(tmp_path):
    port = free_port()
    k = EmbeddedKafka(port=port)
    s = Sink.from_config({"bootstrap_servers": k.bootstrap, "forwarder": "thread", "spool_max_bytes": 20_000},
                         str(tmp_path))
    s.start()
    try:
        results = [s.submit(rec("full/x", i, payload_format=None)) for i in range(1000)]
        assert results[0] and not results[-1]
        accepted = sum(results)
        st = s.stats()
        assert st["dropped"] == 1000 - accepted and 0 < st["spool_bytes"] <= 20_000 + 200
        k.start()
        wait_for(lambda: s.stats()["spool_messages"] == 0, 60, "spool drained")
        assert s.submit(rec("full/x", 5000))
        got = consume(k.bootstrap, "mqtt.messages", accepted + 1, ids=None)
        assert len({mid(r) for r in got}) == accepted + 1
    finally:
        s.close()
        k.stop()


@pytest.mark.timeout(90)
def test_embedded_kafka_restart_between_runs_replays_window(tmp_path):
    """Sink-managed embedded Kafka: the second run starts a fresh (empty) Tansu; the forwarder
    detects it (topic id changed) and replays the window of already forwarded records."""
    port = free_port()
    cfg = {"embedded_port": port, "forwarder": "process"}
    s = Sink.from_config(cfg, str(tmp_path))
    s.start()
    first = [rec("e/1", i) for i in range(50)]
    for r in first:
        s.submit(r)
    wait_for(lambda: s.stats()["forwarded"] == 50, 30, "first run forwarded")
    s.close()
    s = Sink.from_config(cfg, str(tmp_path))
    s.start()
    try:
        second = [rec("e/1", i) for i in range(50, 60)]
        for r in second:
            s.submit(r)
        got = consume(s.bootstrap, "mqtt.messages", 60, ids=[r.message_id for r in first + second])
        wait_for(lambda: s.stats()["replays"] >= 1, 10, "replay counted")
    finally:
        s.close()
    assert_per_topic_order(got, {"e/1": [r.message_id for r in first + second]})


# ---------------------------------------------------------------------------------------------
# keep_until = "history": the spool keeps every record until the history job's committed file
# (sink/history/commits.py) covers it; this test plays the job by writing that file itself.
def topic_id(bootstrap: str, topic: str = "mqtt.messages", wait_ms: int = 5000) -> str | None:
    """The topic's id as Kafka's metadata gives it now (None: not known)."""
    from kafka.net.compat import KafkaNetClient
    c = KafkaNetClient(bootstrap_servers=[bootstrap])
    try:
        c._manager.bootstrap(wait_ms)
        c.cluster.add_topic(topic)
        c.poll(timeout_ms=wait_ms, future=c.cluster.request_update())
        tid = c.cluster.topic_id(topic)
    finally:
        c.close()
    return str(tid) if tid else None


def commit_what_kafka_has(bootstrap: str, path: str, key: bytes, topic: str = "mqtt.messages") -> int:
    """Write the committed file the way the job does: next offset of every partition, under the
    current topic id, signed with the broker's key. -> records covered."""
    from settings import secrets
    from sink.history import commits
    got = consume(bootstrap, topic, 1, timeout=30)
    ends: dict[int, int] = {}
    for r in got:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    commits.write_committed(path, 1, {topic: {"topic_id": topic_id(bootstrap, topic), "offsets": ends}},
                             key=secrets.derive(key, secrets.COMMITTED))
    return len(got)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_history_retention_replays_uncommitted_after_kafka_restart(kafka, tmp_path, mode):
    """Records the table has not committed are sent again after Tansu is SIGKILLed and restarted
    (however old they are: no window); committed ones are not; the spool shrinks after a commit."""
    committed = str(tmp_path / "ckpt" / "history_committed.json")
    s = Sink.from_config({"bootstrap_servers": kafka.bootstrap, "forwarder": mode, "keep_until": "history",
                          "committed_file": committed, "replay_window_seconds": 0,
                          "spool_segment_bytes": 4096}, str(tmp_path))
    s.start()
    try:
        first = [rec(f"h/{i % 3}", i) for i in range(300)]
        for r in first:
            assert s.submit(r)
        wait_for(lambda: s.stats()["forwarded"] >= 300, 30, "first part forwarded")
        st = s.stats()
        assert st["spool_held_messages"] == 300 and st["spool_uncommitted_messages"] == 300, st
        held_bytes = st["spool_bytes"]
        assert held_bytes > 0 and st["spool_messages"] == 0, st
        segs_before = len([n for n in os.listdir(tmp_path / "spool") if n.endswith(".seg")])
        assert commit_what_kafka_has(kafka.bootstrap, committed, s.key) == 300     # the "job" committed these
        wait_for(lambda: s.stats()["spool_held_messages"] == 0, 30, "spool released committed records")
        wait_for(lambda: len([n for n in os.listdir(tmp_path / "spool") if n.endswith(".seg")]) < segs_before,
                 30, "committed segments deleted")
        assert s.stats()["spool_bytes"] < held_bytes
        second = [rec(f"h/{i % 3}", i) for i in range(300, 700)]
        for r in second:
            assert s.submit(r)
        wait_for(lambda: s.stats()["forwarded"] >= 700, 30, "second part forwarded")
        assert s.stats()["spool_uncommitted_messages"] == 400
        kafka.proc.send_signal(signal.SIGKILL)
        kafka.proc.wait()
        kafka.start()                                          # same port, empty
        got = consume(kafka.bootstrap, "mqtt.messages", 400, timeout=60,
                      ids=[r.message_id for r in second])
        wait_for(lambda: s.stats()["replays"] >= 1, 30, "replay counted")
        st = s.stats()
    finally:
        s.close()
    ids = collections.Counter(mid(r) for r in got)
    assert all(ids[r.message_id] >= 1 for r in second)                  # every uncommitted one again
    assert not any(r.message_id in ids for r in first)                 # committed ones not re-sent
    assert_per_topic_order(got, {t: [r.message_id for r in second if r.topic == t]
                                 for t in {r.topic for r in second}})


@pytest.mark.timeout(120)
def test_history_retention_survives_broker_restart(kafka, tmp_path):
    """Uncommitted records sent before a broker restart are still held (the checkpoint keeps the
    committed position) and are re-sent when the new broker finds Kafka empty."""
    committed = str(tmp_path / "history_committed.json")
    cfg = {"bootstrap_servers": kafka.bootstrap, "forwarder": "process", "keep_until": "history",
           "committed_file": committed, "replay_window_seconds": 0}     # no window: only the guarantee
    s = Sink.from_config(cfg, str(tmp_path))
    s.start()
    recs = [rec("r/1", i) for i in range(200)]
    for r in recs:
        s.submit(r)
    wait_for(lambda: s.stats()["forwarded"] >= 200, 30, "forwarded")
    s.close()
    kafka.stop()
    kafka.start()                                               # empty
    s = Sink.from_config(cfg, str(tmp_path))
    s.start()
    try:
        assert s.stats()["spool_bytes"] > 0
        got = consume(kafka.bootstrap, "mqtt.messages", 200, timeout=60, ids=[r.message_id for r in recs])
    finally:
        s.close()
    assert {mid(r) for r in got} == {r.message_id for r in recs}
