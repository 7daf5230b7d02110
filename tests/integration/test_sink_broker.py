"""MQTT PUBLISH (paho-mqtt, real broker process) -> sink -> Kafka (embedded Tansu)."""
from __future__ import annotations

import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from kafka_client.embedded import EmbeddedKafka
from kafka_client.record import from_kafka

from .test_sink_kafka import consume


@pytest.mark.timeout(90)
def test_mqtt_publish_reaches_kafka(make_broker, tmp_path):
    k = EmbeddedKafka(log_file=str(tmp_path / "tansu.log")).start()
    try:
        b = make_broker(args=["--kafka-bootstrap", k.bootstrap])
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sink-e2e", protocol=mqtt.MQTTv5)
        c.username_pw_set("alice")
        c.connect("127.0.0.1", b.port)
        c.loop_start()
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/octet-stream"
        props.UserProperty = [("a", "1"), ("b", "2"), ("a", "3")]
        props.CorrelationData = b"\x00\x01"
        props.ResponseTopic = "reply/here"
        props.MessageExpiryInterval = 300
        payload = bytes(range(256))
        infos = [c.publish(f"e2e/{i % 2}", payload + bytes([i]), qos=1, properties=props) for i in range(20)]
        for info in infos:
            info.wait_for_publish(10)
        c.publish("e2e/q0", b"qos0", qos=0).wait_for_publish(10)
        c.loop_stop()
        c.disconnect()
        got = consume(k.bootstrap, "mqtt.messages", 21)
    finally:
        k.stop()
    assert len(got) == 21, b.logs()[-3000:]
    recs = [from_kafka(r.key, r.value, r.headers, r.timestamp) for r in got]
    q1 = [r for r in recs if r.qos == 1]
    assert len(q1) == 20
    for topic in ("e2e/0", "e2e/1"):      # per-topic order
        assert [r.payload[-1] for r in q1 if r.topic == topic] == list(range(0 if topic == "e2e/0" else 1, 20, 2))
    r = q1[0]
    assert r.payload[:256] == payload and r.client_id == "sink-e2e" and r.protocol == 5
    assert r.content_type == "application/octet-stream" and r.correlation_data == b"\x00\x01"
    assert r.response_topic == "reply/here" and 0 < r.message_expiry <= 300
    assert r.user_properties == [("a", "1"), ("b", "2"), ("a", "3")]
    assert len({x.message_id for x in recs}) == 21
    assert abs(r.accepted_at_ms - time.time() * 1000) < 120_000


@pytest.mark.timeout(120)
def test_broker_sigkill_mid_stream_loses_no_acknowledged_message(tmp_path):
    """The broker process (with its sink) is SIGKILLed while clients publish QoS 1; after a
    restart on the same data directory every message it acknowledged reaches Kafka, in
    per-topic order (the spool is replayed)."""
    import threading

    from broker.protocol import packets as P
    from tests.conftest import BrokerProcess
    from tests.mqtt_raw import RawClient

    k = EmbeddedKafka(log_file=str(tmp_path / "tansu.log")).start()
    try:
        b = BrokerProcess(tmp_path, args=["--kafka-bootstrap", k.bootstrap]).start()
        acked: list[bytes] = []
        stop = threading.Event()

        def publish():
            c = RawClient(b.port)
            c.connect("killed-mid-stream")
            i = 0
            try:
                while not stop.is_set():
                    payload = b"k%06d" % i
                    c.publish(f"kill/{i % 3}", payload, qos=1, pid=(i % 60000) + 1)
                    c.recv_type(P.PUBACK)  # acknowledged: must not be lost
                    acked.append(payload)
                    i += 1
            except (ConnectionError, OSError, TimeoutError):
                pass  # the broker died under us

        t = threading.Thread(target=publish)
        t.start()
        time.sleep(2.0)
        b.kill()
        stop.set()
        t.join(10)
        assert len(acked) > 50, "too few messages were acknowledged before the kill"
        b2 = BrokerProcess(tmp_path, args=["--kafka-bootstrap", k.bootstrap]).start()
        try:
            got = consume(k.bootstrap, "mqtt.messages", len(acked), timeout=60)
        finally:
            b2.stop()
    finally:
        k.stop()
    recs = [from_kafka(r.key, r.value, r.headers, r.timestamp) for r in got]
    payloads = {r.payload for r in recs}
    missing = [p for p in acked if p not in payloads]
    assert not missing, f"{len(missing)} acknowledged messages missing, e.g. {missing[:5]}"
    for topic in ("kill/0", "kill/1", "kill/2"):  # per-topic order, duplicates aside
        seq = [r.payload for r in recs if r.topic == topic]
        firsts = list(dict.fromkeys(seq))
        assert firsts == sorted(firsts), topic
