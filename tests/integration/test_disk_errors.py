"""Nothing acknowledged is lost, even when the disk fails (real sockets, a real full disk)."""
from __future__ import annotations

import time

import pytest

from broker.protocol import packets as P
from broker.protocol import reason_codes as rc
from kafka_client.embedded import EmbeddedKafka
from kafka_client.record import from_kafka
from tests.conftest import BrokerProcess
from tests.diskfull import SmallFS
from tests.mqtt_raw import RawClient

from .test_sink_kafka import consume

BIG = bytes(9000)  # more than the page a full tmpfs may still have room in


@pytest.fixture
def small_fs(tmp_path):
    fs = SmallFS(tmp_path / "fs", "2m")
    yield fs
    fs.close()


@pytest.mark.timeout(120)
def test_spool_disk_full_fails_acks_then_recovers(tmp_path, small_fs):
    k = EmbeddedKafka(log_file=str(tmp_path / "tansu.log")).start()
    b = BrokerProcess(tmp_path, {"sink.spool_dir": f"{small_fs.path}/spool"},
                      args=["--kafka-bootstrap", k.bootstrap])
    try:
        b.start()
        sub = RawClient(b.port)
        sub.connect("watcher")
        sub.subscribe("d/#", qos=1)
        v5 = RawClient(b.port)
        v5.connect("v5-pub")
        v5.publish("d/ok", b"before" + BIG, qos=1, pid=1)
        assert v5.recv_type(P.PUBACK).reason_code == rc.SUCCESS

        small_fs.fill()
        v5.publish("d/q1", b"lost-1" + BIG, qos=1, pid=2)
        ack = v5.recv_type(P.PUBACK, timeout=10)
        assert (ack.packet_id, ack.reason_code) == (2, rc.UNSPECIFIED_ERROR), ack
        v5.publish("d/q2", b"lost-2" + BIG, qos=2, pid=3)
        rec = v5.recv_type(P.PUBREC, timeout=10)
        assert (rec.packet_id, rec.reason_code) == (3, rc.UNSPECIFIED_ERROR), rec
        v4 = RawClient(b.port, level=P.MQTT_311)
        v4.connect("v4-pub")
        v4.publish("d/q1", b"lost-3" + BIG, qos=1, pid=1)
        seen = v4.expect_closed(10)
        assert not [p for p in seen if p.type == P.PUBACK], seen  # closed, never a success
        v5.send(b"\xc0\x00")                                      # the broker keeps serving
        assert v5.recv_type(P.PINGRESP).type == P.PINGRESP

        small_fs.free()
        # after a failed PUBREC the packet id is free: the same id is a new message (4.3.3)
        v5.publish("d/q2", b"again" + BIG, qos=2, pid=3)
        rec = v5.recv_type(P.PUBREC, timeout=10)
        assert (rec.packet_id, rec.reason_code) == (3, rc.SUCCESS), rec
        v5.send(P.Ack(P.PUBREL, 3))
        assert v5.recv_type(P.PUBCOMP).reason_code == rc.SUCCESS
        v4 = RawClient(b.port, level=P.MQTT_311)
        v4.connect("v4-pub")
        v4.publish("d/q1", b"after" + BIG, qos=1, pid=1)
        assert v4.recv_type(P.PUBACK, timeout=10).packet_id == 1

        # subscribers: messages are routed before they are stored, so they saw the refused ones
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            try:
                p = sub.recv(1)
            except TimeoutError:
                continue
            if p.type == P.PUBLISH:
                got.append(p.payload[:6])
                sub.send(P.Ack(P.PUBACK, p.packet_id))
        assert got == [b"before", b"lost-1", b"lost-2", b"lost-3", b"again" + BIG[:1], b"after" + BIG[:1]]
        # Kafka gets every acknowledged message, and none of the refused ones
        consume(k.bootstrap, "mqtt.messages", 3, timeout=30)
        time.sleep(1)  # then read again: anything forwarded after the first three shows up too
        recs = [from_kafka(r.key, r.value, r.headers, r.timestamp)
                for r in consume(k.bootstrap, "mqtt.messages", 3, timeout=10)]
        assert sorted(r.payload[:6] for r in recs) == sorted([b"before", b"again" + BIG[:1],
                                                              b"after" + BIG[:1]]), b.logs()[-3000:]
        logs = b.logs()
        assert logs.count("free disk space") == 1, logs[-3000:]
        assert "succeed again" in logs
    finally:
        b.stop()
        k.stop()


def publish_until_success(c: RawClient, topic: str, payload: bytes, pid: int, timeout=60):
    """The store retries with a growing delay: publish until the ack is a success."""
    deadline = time.monotonic() + timeout
    while True:
        c.publish(topic, payload, qos=1, pid=pid)
        ack = c.recv_type(P.PUBACK, timeout=10)
        if ack.reason_code == rc.SUCCESS or time.monotonic() > deadline:
            return ack
        time.sleep(0.5)


@pytest.fixture(params=["no sink", "sink"])
def sink_args(request, tmp_path):
    """Without the sink acks go out after the commit; with it they are also held for the spool."""
    if request.param == "no sink":
        yield []
        return
    k = EmbeddedKafka(log_file=str(tmp_path / "tansu.log")).start()
    yield ["--kafka-bootstrap", k.bootstrap]
    k.stop()


@pytest.mark.timeout(180)
def test_store_disk_full_fails_acks_keeps_serving_and_recovers(tmp_path, small_fs, sink_args):
    b = BrokerProcess(tmp_path, {"persistence.path": f"{small_fs.path}/state.db"},
                      args=sink_args).start()
    keeper = RawClient(b.port)
    keeper.connect("keeper", clean_start=False, properties={0x11: 3600})
    keeper.subscribe("s/#", qos=1)
    keeper.close()  # offline: what is published to s/# is queued for it, in the store
    watcher = RawClient(b.port)  # online: the turn's output flushes (and commits) at once,
    watcher.connect("watcher")   # before the sink's barrier releases the held acks
    watcher.subscribe("s/#", qos=0)
    time.sleep(0.3)
    v5 = RawClient(b.port)
    v5.connect("v5-pub")
    v5.publish("s/x", b"before" + BIG, qos=1, pid=1)
    assert v5.recv_type(P.PUBACK).reason_code == rc.SUCCESS

    small_fs.fill()
    v5.publish("s/x", b"lost-1" + BIG * 10, qos=1, pid=2)
    ack = v5.recv_type(P.PUBACK, timeout=10)
    assert (ack.packet_id, ack.reason_code) == (2, rc.UNSPECIFIED_ERROR), ack
    v5.publish("s/x", b"lost-2" + BIG * 10, qos=2, pid=3)
    rec = v5.recv_type(P.PUBREC, timeout=10)
    assert (rec.packet_id, rec.reason_code) == (3, rc.UNSPECIFIED_ERROR), rec
    # what does not need the store is still served: PINGRESP, CONNACK, QoS 1 without
    # persistent subscribers
    v5.send(b"\xc0\x00")
    assert v5.recv_type(P.PINGRESP).type == P.PINGRESP
    other = RawClient(b.port)
    assert other.connect("newcomer").reason_code == 0
    other.publish("elsewhere", b"x", qos=1, pid=9)
    assert other.recv_type(P.PUBACK).reason_code == rc.NO_MATCHING_SUBSCRIBERS
    v4 = RawClient(b.port, level=P.MQTT_311)
    v4.connect("v4-pub")
    v4.publish("s/x", b"lost-3" + BIG * 10, qos=1, pid=1)
    seen = v4.expect_closed(10)
    assert not [p for p in seen if p.type == P.PUBACK], seen

    small_fs.free()
    ack = publish_until_success(v5, "s/x", b"after" + BIG, pid=4)
    assert ack.reason_code == rc.SUCCESS, b.logs()[-3000:]
    v5.publish("s/x", b"again" + BIG, qos=2, pid=3)  # the failed PUBREC freed packet id 3
    rec = v5.recv_type(P.PUBREC, timeout=10)
    assert (rec.packet_id, rec.reason_code) == (3, rc.SUCCESS), rec
    v5.send(P.Ack(P.PUBREL, 3))
    assert v5.recv_type(P.PUBCOMP).reason_code == rc.SUCCESS
    logs = b.logs()
    assert logs.count("free disk space") == 1 and "succeed again" in logs, logs[-3000:]

    b.kill()  # every acknowledged message is in the store
    b2 = BrokerProcess(tmp_path, {"persistence.path": f"{small_fs.path}/state.db"},
                       args=sink_args).start()
    try:
        keeper = RawClient(b2.port)
        assert keeper.connect("keeper", clean_start=False,
                              properties={0x11: 3600}).session_present
        got = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                p = keeper.recv(1)
            except TimeoutError:
                if b"again" in got:
                    break
                continue
            if p.type == P.PUBLISH:
                got.append(p.payload[:6].rstrip(b"\0"))
                keeper.send(P.Ack(P.PUBACK, p.packet_id))
        # the acknowledged ones, in order; the refused ones and the retries may be there too
        # (kept and written when the disk recovered: at least once)
        acked = [x for x in got if x in (b"before", b"after", b"again")]
        assert list(dict.fromkeys(acked)) == [b"before", b"after", b"again"], got
    finally:
        b2.stop()
