"""The rules' MQTT client (sink/history/rules/publish.py) against the broker: a batch of rows is
published QoS 1 within the broker's Receive Maximum [MQTT-3.3.4-7] (with more in flight a broker
may disconnect with 0x93), every row once, in order, whatever the batch's size."""
from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from sink.history.rules.publish import Publisher


def subscriber(port: int, topic: str) -> tuple[mqtt.Client, list[bytes]]:
    got: list[bytes] = []
    subscribed = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="alerts-sub", protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, u, m: got.append(m.payload)
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.subscribe(topic, qos=1)
    assert subscribed.wait(10)
    return c, got


def test_a_batch_is_published_within_the_brokers_receive_maximum_every_row_once_in_order(make_broker):
    broker = make_broker({"mqtt.receive_maximum": 5})
    sub, got = subscriber(broker.port, "alerts/#")
    p = Publisher("127.0.0.1", broker.port, "u", "p", "$rules-test-window", timeout=30)
    try:
        rows = [f'{{"n": {i}}}'.encode() for i in range(300)]
        assert p.publish_all("alerts/a", rows) == 300
        assert p._window == 5   # the broker's Receive Maximum, below the client's 1000
        assert p.publish_all("alerts/a", rows[:7]) == 7   # the same connection goes on
        assert p._client.is_connected()
        deadline = threading.Event()
        for _ in range(100):
            if len(got) >= 307:
                break
            deadline.wait(0.1)
        assert got == rows + rows[:7]
    finally:
        p.close()
        sub.loop_stop()


def test_a_large_batch_goes_out_in_windows_of_max_inflight(make_broker):
    broker = make_broker()
    sub, got = subscriber(broker.port, "alerts/#")
    p = Publisher("127.0.0.1", broker.port, "u", "p", "$rules-test-large", max_inflight=100)
    try:
        rows = [f'{{"n": {i}}}'.encode() for i in range(5000)]
        assert p.publish_all("alerts/big", rows) == 5000
        assert p._window == 100
        waiter = threading.Event()
        for _ in range(200):
            if len(got) >= 5000:
                break
            waiter.wait(0.1)
        assert got == rows
    finally:
        p.close()
        sub.loop_stop()
