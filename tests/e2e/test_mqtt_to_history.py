"""The whole product: MQTT clients (paho v5 and v3.1.1) -> broker -> sink -> embedded Kafka
-> Spark job -> history table -> Spark SQL. Each message appears exactly once, every field right."""
from __future__ import annotations

import datetime as dt

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sink.history.job import Job, run
from sink.history.query import run_sql
from tests.conftest import BrokerProcess
from tests.integration.test_sink_kafka import consume

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(300)]


def client(cid, protocol, username=None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=protocol)
    if username:
        c.username_pw_set(username, "ignored")
    return c


def test_mqtt_messages_queryable_exactly_once(spark, kafka, tmp_path):
    broker = BrokerProcess(tmp_path, args=["--kafka-bootstrap", kafka.bootstrap]).start()
    try:
        v5 = client("dev-v5", mqtt.MQTTv5, username="alice")
        v5.connect("127.0.0.1", broker.port)
        v5.loop_start()
        props = Properties(PacketTypes.PUBLISH)
        props.PayloadFormatIndicator = 1
        props.ContentType = "application/json"
        props.ResponseTopic = "replies/dev-v5"
        props.CorrelationData = b"\x00req-1\xff"
        props.MessageExpiryInterval = 3600
        props.UserProperty = [("unit", "C"), ("site", "lab"), ("unit", "F")]
        before = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        for q in (0, 1, 2):
            v5.publish(f"sensors/v5/q{q}", f'{{"t": {20 + q}}}'.encode(), qos=q,
                       properties=props).wait_for_publish(10)
        v5.publish("sensors/v5/retained", b"last", qos=1, retain=True).wait_for_publish(10)

        v3 = client("dev-v311", mqtt.MQTTv311)
        v3.connect("127.0.0.1", broker.port)
        v3.loop_start()
        v3.publish("sensors/v311/raw", b"\x00\xff\xfe binary", qos=1).wait_for_publish(10)
        v3.publish("sensors/v311/text", "héllo".encode(), qos=2).wait_for_publish(10)
        for c in (v5, v3):
            c.loop_stop()
            c.disconnect()
        assert len(consume(kafka.bootstrap, "mqtt.messages", 6)) == 6, broker.logs()[-3000:]
    finally:
        broker.stop()

    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(tmp_path / "history"), trigger_seconds=1,
                    available_now=True)
    assert run(spark, cfg) == 0
    assert run(spark, cfg) == 0  # a second pass over the same Kafka adds nothing
    rows = run_sql(spark, cfg.history.table, "SELECT * FROM messages ORDER BY topic")
    assert [r.topic for r in rows] == ["sensors/v311/raw", "sensors/v311/text", "sensors/v5/q0",
                                       "sensors/v5/q1", "sensors/v5/q2", "sensors/v5/retained"]
    assert len({r.message_id for r in rows}) == 6
    by = {r.topic: r for r in rows}
    for q in (0, 1, 2):
        r = by[f"sensors/v5/q{q}"]
        assert (r.qos, r.retain, r.client_id, r.username, r.protocol) == (q, False, "dev-v5", "alice", 5)
        assert r.payload_text == f'{{"t": {20 + q}}}' and bytes(r.payload) == r.payload_text.encode()
        assert (r.payload_format, r.content_type, r.response_topic) == \
            (1, "application/json", "replies/dev-v5")
        assert bytes(r.correlation_data) == b"\x00req-1\xff"
        assert 3590 <= r.message_expiry <= 3600
        assert [(p.key, p.value) for p in r.user_properties] == [("unit", "C"), ("site", "lab"),
                                                                 ("unit", "F")]
        assert before - dt.timedelta(seconds=5) <= r.accepted_at <= r.ingested_at
        assert r.date == r.accepted_at.date()
        assert r.kafka_topic == "mqtt.messages"
    ret = by["sensors/v5/retained"]
    assert (ret.retain, ret.qos, ret.payload_text, ret.content_type, ret.user_properties) == \
        (True, 1, "last", None, [])
    raw = by["sensors/v311/raw"]
    assert bytes(raw.payload) == b"\x00\xff\xfe binary" and raw.payload_text is None
    assert (raw.protocol, raw.username, raw.client_id, raw.qos) == (4, None, "dev-v311", 1)
    assert by["sensors/v311/text"].payload_text == "héllo" and by["sensors/v311/text"].qos == 2
