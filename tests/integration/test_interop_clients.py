"""Interoperability with two more widely used client libraries: MQTT.js (the npm package mqtt,
pinned in tests/clients/mqttjs/package.json, run by node through tests/clients/mqttjs/driver.js)
and gmqtt (an asyncio MQTT 5 client, pinned in requirements-dev.txt). Each test runs on one
broker, on a node of a two-node cluster and through HAProxy over the two nodes
(tests/integration/cluster_targets.py): properties at QoS 0-2, MQTT.js 3.1.1 with 5 both ways,
retained messages, persistent sessions, takeover, topic aliases and wills."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import gmqtt
import pytest
from gmqtt.mqtt.constants import MQTTv50

from . import cluster_targets
from .helpers import cid, uniq

pytestmark = pytest.mark.timeout(60)

MQTTJS = Path(__file__).resolve().parents[1] / "clients" / "mqttjs"

broker, two_nodes, _ = cluster_targets.broker_fixtures()  # (make_target: not used here)


@pytest.fixture(params=["same-node", "other-node"])
def ports(request, broker):
    """(the port a client first connects to, the one it comes back to): on a cluster node, the
    node it was on or the other one; one broker, and the balancer, have one port for both
    (through the balancer the rotation decides which node each connection reaches)."""
    return broker.port, getattr(broker, "ports", {}).get(request.param, broker.port)


def retained_wait(broker) -> float:
    """How long a later subscriber may need to see the retained message the test set (or
    cleared) last: none on one broker; on a cluster a node that did not accept it knows it once
    it has read it from Kafka, milliseconds later (docs/cluster.md, "What is guaranteed, and
    what is not"), so there a subscriber subscribes again until it does, within 5 s."""
    return 5.0 if cluster_targets.on_cluster(broker) else 0.0


def in_order_per_topic(broker, got: list, expected: list) -> tuple[list, list]:
    """Through the balancer a publisher and its subscriber are on different nodes, which keep
    the order per topic only: the specification requires order per topic [MQTT-4.6.0-5]
    [MQTT-4.6.0-6], not across topics (docs/cluster.md)."""
    if isinstance(broker, cluster_targets.Balancer):
        return sorted(got, key=lambda m: m[0]), sorted(expected, key=lambda m: m[0])
    return got, expected


# ---------------------------------------------------------------- MQTT.js

class MqttJs:
    """One MQTT.js client in a node process (driver.js): commands as JSON lines on its stdin,
    its events as JSON lines on its stdout, collected by a thread."""

    def __init__(self, port: int, client_id: str | None = None, level: int = 5, **connect):
        if not (MQTTJS / "node_modules" / "mqtt").is_dir() or shutil.which("node") is None:
            pytest.fail("MQTT.js is not installed (node and tests/clients/mqttjs/node_modules): "
                        "run scripts/test.sh (it runs npm ci --prefix tests/clients/mqttjs)")
        self.proc = subprocess.Popen(["node", str(MQTTJS / "driver.js")], cwd=MQTTJS,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.events: dict[str, list] = defaultdict(list)
        self.taken: dict[str, int] = defaultdict(int)
        self.cond = threading.Condition()
        self.exited = False
        threading.Thread(target=self._read, daemon=True).start()
        self.client_id = client_id or cid("mqttjs")
        self.send(op="connect", port=port, clientId=self.client_id, protocolVersion=level,
                  **connect)
        self.connack = self.next("connect")
        assert self.connack["reasonCode"] == 0, self.connack

    def _read(self) -> None:
        for line in self.proc.stdout:
            e = json.loads(line)
            with self.cond:
                self.events[e["event"]].append(e)
                self.cond.notify_all()
        with self.cond:
            self.exited = True
            self.cond.notify_all()

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def poll(self, kind: str, timeout: float) -> dict | None:
        """The next event of this kind not yet taken, or None if none comes within `timeout`."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.events[kind]) > self.taken[kind] or self.exited,
                               timeout)
            if len(self.events[kind]) <= self.taken[kind]:
                if self.exited:
                    raise AssertionError(f"MQTT.js exited before a {kind}: {self.proc.stderr.read()}")
                return None
            self.taken[kind] += 1
            e = self.events[kind][self.taken[kind] - 1]
        if kind == "message":
            e["payload"] = bytes.fromhex(e["payload"]["hex"])
        return e

    def next(self, kind: str, timeout: float = 10.0) -> dict:
        """The next event of this kind not yet taken."""
        e = self.poll(kind, timeout)
        if e is None:
            raise AssertionError(f"MQTT.js: no {kind} within {timeout} s; saw {dict(self.events)}")
        return e

    def none(self, kind: str = "message", timeout: float = 0.3) -> bool:
        """No (further) event of this kind within `timeout`."""
        time.sleep(timeout)
        with self.cond:
            return len(self.events[kind]) == self.taken[kind]

    def subscribe(self, topic: str, qos: int = 1) -> list:
        self.send(op="subscribe", topic=topic, qos=qos)
        ack = self.next("suback")
        assert ack["error"] is None, ack
        return ack["granted"]

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                properties: dict | None = None) -> dict:
        """Published: for QoS 1 and 2 once acknowledged (PUBACK, PUBCOMP)."""
        self.send(op="publish", topic=topic, payload={"hex": payload.hex()}, qos=qos,
                  retain=retain, properties=properties)
        done = self.next("published")
        assert done["error"] is None, done
        return done

    def message(self, timeout: float = 10.0) -> dict:
        return self.next("message", timeout)

    def end(self) -> None:
        """A normal DISCONNECT (0x00), then the process ends."""
        self.send(op="end")
        self.next("ended")
        self.stop()

    def drop(self) -> None:
        """The TCP connection closes without DISCONNECT."""
        self.send(op="drop")
        self.next("close")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stderr):
            f.close()


@pytest.fixture
def mqttjs():
    made: list[MqttJs] = []

    def make(port: int, client_id: str | None = None, level: int = 5, **connect) -> MqttJs:
        c = MqttJs(port, client_id, level, **connect)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


PROPS_JS = {"userProperties": {"a": ["1", "3"], "b": "2"}, "contentType": "text/plain",
            "responseTopic": "reply/here", "correlationData": {"hex": "0102"},
            "payloadFormatIndicator": True, "messageExpiryInterval": 60}


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqttjs_v5_message_keeps_its_properties(broker, mqttjs, qos):
    """[MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-20]: MQTT.js
    v5 publishes with a payload format indicator, response topic, correlation data, user
    properties and content type; an MQTT.js v5 subscriber gets them unaltered at the QoS it
    asked for, and the message expiry interval no larger than sent [MQTT-3.3.2-6]."""
    topic = uniq("mqttjsprops")
    sub = mqttjs(broker.port)
    assert sub.subscribe(topic, 2) == [2]
    pub = mqttjs(broker.port)
    pub.publish(topic, b"with-props", qos, properties=PROPS_JS)
    m = sub.message()
    assert (m["topic"], m["payload"], m["qos"], m["retain"]) == (topic, b"with-props", qos, False)
    p = m["properties"]
    expiry = p.pop("messageExpiryInterval")
    assert 0 < expiry <= 60
    assert p == {k: v for k, v in PROPS_JS.items() if k != "messageExpiryInterval"}
    if qos:
        assert isinstance(m["messageId"], int) and 1 <= m["messageId"] <= 65535
    assert sub.none()


@pytest.mark.parametrize("pub_level,sub_level", [(4, 5), (5, 4), (4, 4)])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqttjs_v311_and_v5_exchange(broker, mqttjs, pub_level, sub_level, qos):
    """MQTT.js at protocol level 4 (3.1.1) and 5 exchange messages both ways at QoS 0-2, in
    order: a 3.1.1 subscriber gets the payload of a v5 message with a user property, a v5
    subscriber a 3.1.1 message without user properties."""
    topic = uniq(f"mqttjs{pub_level}{sub_level}")
    sub = mqttjs(broker.port, level=sub_level)
    assert sub.subscribe(topic, 2) == [2]
    pub = mqttjs(broker.port, level=pub_level)
    payloads = [b"first", b"\x00\xffbinary", b"x" * 5000]
    props = {"userProperties": {"k": "v"}} if pub_level == 5 else None
    for p in payloads:
        pub.publish(topic, p, qos, properties=props)
    got = [sub.message() for _ in payloads]
    assert [(m["topic"], m["payload"], m["qos"]) for m in got] == [(topic, p, qos) for p in payloads]
    if sub_level == 5:
        assert all(m["properties"].get("userProperties") == (props or {}).get("userProperties")
                   for m in got), got
    assert sub.none()


def test_mqttjs_retained_message_reaches_later_subscriber_until_cleared(broker, mqttjs):
    """[MQTT-3.3.1-5] [MQTT-3.3.1-9]: a retained message from MQTT.js reaches a later MQTT.js
    subscriber with RETAIN=1; [MQTT-3.3.1-6] [MQTT-3.3.1-7]: an empty retained publish clears
    it, so the next subscriber gets nothing."""
    topic = uniq("mqttjsret")
    pub = mqttjs(broker.port)
    pub.publish(topic, b"state", 1, retain=True)
    s1 = mqttjs(broker.port)
    m = js_retained(broker, s1, topic, b"state")
    assert m is not None and (m["topic"], m["payload"], m["retain"], m["qos"]) == \
        (topic, b"state", True, 1)
    pub.publish(topic, b"", 1, retain=True)
    # the clearing message itself reaches the existing subscriber (RETAIN=0: a live message)
    m = s1.message()
    assert (m["payload"], m["retain"]) == (b"", False)
    s2 = mqttjs(broker.port)
    assert js_retained(broker, s2, topic, None) is None
    assert s1.none() and s2.none()


def js_retained(broker, sub: MqttJs, topic: str, expect: bytes | None) -> dict | None:
    """The retained message a subscription to `topic` brings (None: none within 0.5 s); on a
    cluster subscribing again until it is the `expect`ed one (retained_wait)."""
    deadline = time.monotonic() + retained_wait(broker)
    while True:
        assert sub.subscribe(topic, 1) == [1]
        m = sub.poll("message", 0.5)
        if (m is None if expect is None else m is not None and m["payload"] == expect) or \
                time.monotonic() >= deadline:
            return m


def persistent_js(mqttjs, port: int, client_id: str) -> MqttJs:
    return mqttjs(port, client_id, clean=False, properties={"sessionExpiryInterval": 300})


@pytest.mark.parametrize("how", ["disconnect", "dropped"])
def test_mqttjs_persistent_session_resumes_with_its_queued_messages(ports, mqttjs, how):
    """[MQTT-3.1.2-5] [MQTT-3.2.2-3]: MQTT.js v5 (Clean Start 0, session expiry 300 s) subscribes
    at QoS 1 and 2, goes away (DISCONNECT, or the connection drops), QoS 1 and 2 messages are
    published, and it comes back (a cluster: to the same node or the other one): session
    present, every queued message once, in order per topic [MQTT-4.6.0-6], and its connection
    kept."""
    first, back = ports
    t1, t2, client_id = uniq("jspersist1"), uniq("jspersist2"), cid("jspersist")
    a = persistent_js(mqttjs, first, client_id)
    assert a.connack["sessionPresent"] is False
    assert a.subscribe(t1, 1) == [1]
    assert a.subscribe(t2, 2) == [2]
    if how == "disconnect":
        a.end()
    else:
        a.drop()
    time.sleep(0.3)  # the broker has seen the connection end
    pub = mqttjs(first)
    sent = [(t1, b"q1-a", 1), (t2, b"q2-a", 2), (t1, b"q1-b", 1), (t2, b"q2-b", 2)]
    for topic, payload, qos in sent:
        pub.publish(topic, payload, qos)
    b = persistent_js(mqttjs, back, client_id)
    assert b.connack["sessionPresent"] is True
    got = [(m["topic"], m["payload"], m["qos"]) for m in (b.message() for _ in sent)]
    # in order per topic: MQTT.js hands a QoS 2 message over at its PUBREL, after QoS 1
    # messages sent later on the other topic
    assert sorted(got, key=lambda m: m[0]) == sorted(sent, key=lambda m: m[0])
    assert b.none(timeout=0.5)
    pub.publish(t2, b"live", 2)
    assert b.message()["payload"] == b"live"
    assert b.events["disconnect"] == [] and b.events["close"] == [], dict(b.events)


def test_mqttjs_takeover_disconnects_the_old_connection(ports, mqttjs):
    """[MQTT-3.1.4-3]: a second MQTT.js v5 connection with the client id of a connected one (a
    cluster: on the same node or the other one): the old one gets DISCONNECT 0x8E and is
    closed, the new one resumes the session and keeps working."""
    first, back = ports
    topic, client_id = uniq("jstakeover"), cid("jstakeover")
    a = persistent_js(mqttjs, first, client_id)
    assert a.subscribe(topic, 1) == [1]
    b = persistent_js(mqttjs, back, client_id)
    assert b.connack["sessionPresent"] is True
    assert a.next("disconnect")["reasonCode"] == 0x8E
    a.next("close")
    pub = mqttjs(first)
    for payload in (b"to-new-1", b"to-new-2"):
        pub.publish(topic, payload, 1)
    assert [b.message()["payload"] for _ in range(2)] == [b"to-new-1", b"to-new-2"]
    assert a.none("message", 0.3)
    assert b.events["disconnect"] == [] and b.events["close"] == [], dict(b.events)


def test_mqttjs_topic_aliases_both_ways_keep_topics_and_order(broker, mqttjs):
    """MQTT.js publishes with autoAssignTopicAlias / autoUseTopicAlias (aliases to the broker,
    3.3.2.3.4), and a subscriber that announces a Topic Alias Maximum gets aliases from the
    broker, never above its maximum [MQTT-3.3.2-11]: every message arrives with its own topic,
    in order per topic [MQTT-4.6.0-6]."""
    base = uniq("jsalias")
    sub = mqttjs(broker.port, properties={"topicAliasMaximum": 2})
    assert sub.subscribe(base + "/#", 1) == [1]
    pub = mqttjs(broker.port, autoAssignTopicAlias=True, autoUseTopicAlias=True)
    topics = [f"{base}/{i % 3}" for i in range(12)]
    for i, t in enumerate(topics):
        pub.publish(t, b"%d" % i, 1)
    got = [sub.message() for _ in topics]
    aliases = [m["properties"].get("topicAlias") for m in got]
    assert any(aliases) and all(a is None or 1 <= a <= 2 for a in aliases), aliases
    got_pairs, expected = in_order_per_topic(
        broker, [(m["topic"], m["payload"]) for m in got], [(t, b"%d" % i) for i, t in enumerate(topics)])
    assert got_pairs == expected
    assert sub.none()


@pytest.mark.parametrize("how", ["killed", "disconnect"])
def test_mqttjs_will_sent_on_abnormal_end_only(broker, mqttjs, how):
    """[MQTT-3.1.2-8]: MQTT.js v5 with a will (delay 0) whose process is killed (the connection
    ends without DISCONNECT): the will reaches a subscriber; [MQTT-3.1.2-10]: after a normal
    DISCONNECT (0x00) it is not sent."""
    topic = uniq("jswill")
    sub = mqttjs(broker.port)
    assert sub.subscribe(topic, 1) == [1]
    w = mqttjs(broker.port, will={"topic": topic, "payload": "gone", "qos": 1,
                                  "properties": {"willDelayInterval": 0,
                                                 "userProperties": {"w": "1"}}})
    if how == "killed":
        w.stop()
        m = sub.message()
        assert (m["topic"], m["payload"], m["qos"]) == (topic, b"gone", 1)
        assert m["properties"]["userProperties"] == {"w": "1"}
    else:
        w.end()
        assert sub.none(timeout=1.0)


def test_mqttjs_and_gmqtt_exchange_properties(broker, mqttjs):
    """An MQTT.js v5 message with properties reaches a gmqtt subscriber, and a gmqtt one an
    MQTT.js subscriber, with them unaltered [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17]
    [MQTT-3.3.2-20]."""
    t1, t2 = uniq("js2g"), uniq("g2js")
    js = mqttjs(broker.port)
    assert js.subscribe(t2, 1) == [1]

    async def run():
        g = await Gmqtt.connect(broker.port)
        assert await g.subscribe(t1, 1) == [1]
        js.publish(t1, b"from-js", 1, properties={"userProperties": {"k": "v"},
                                                  "correlationData": {"hex": "0a0b"}})
        topic, payload, qos, props = await g.message()
        assert (topic, payload, qos) == (t1, b"from-js", 1)
        assert props["user_property"] == [("k", "v")] and props["correlation_data"] == [b"\x0a\x0b"]
        await g.publish(t2, b"from-gmqtt", 1, content_type="text/plain",
                        response_topic="reply/g")
        await g.close()

    asyncio.run(run())
    m = js.message()
    assert (m["topic"], m["payload"]) == (t2, b"from-gmqtt")
    assert (m["properties"]["contentType"], m["properties"]["responseTopic"]) == \
        ("text/plain", "reply/g")


# ---------------------------------------------------------------- gmqtt

class Gmqtt:
    """A gmqtt client; received messages go to a queue. It does not reconnect by itself: the
    test decides when a client comes back."""

    def __init__(self, client_id: str | None, clean: bool, will, props: dict):
        self.c = gmqtt.Client(client_id or cid("gmqtt"), clean_session=clean, will_message=will,
                              **props)
        self.messages: asyncio.Queue = asyncio.Queue()
        self.subacks: dict[int, asyncio.Future] = {}
        self.session_present: bool | None = None
        self.disconnects: list[int | None] = []  # the broker's DISCONNECT reason codes
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_disconnect = self._on_disconnect

    @classmethod
    async def connect(cls, port: int, client_id: str | None = None, clean: bool = True,
                      will=None, **props) -> Gmqtt:
        g = cls(client_id, clean, will, props)
        await asyncio.wait_for(g.c.connect("127.0.0.1", port, keepalive=30, version=MQTTv50), 10)
        assert g.c.is_connected
        g.c._is_active = False  # gmqtt's switch for its automatic reconnection, which it lacks in its API
        return g

    def _on_connect(self, client, flags, rc, properties):
        self.session_present = bool(flags)

    def _on_message(self, client, topic, payload, qos, properties):
        self.messages.put_nowait((topic, payload, qos, properties))
        return 0

    def _on_subscribe(self, client, mid, qos, properties):
        f = self.subacks.pop(mid, None)
        if f is not None and not f.done():
            f.set_result(list(qos))

    def _on_disconnect(self, client, packet, *exc):
        # a DISCONNECT from the broker: its reason code first; the connection's end: empty
        self.disconnects.append(packet[0] if isinstance(packet, bytes | bytearray) and packet else None)

    async def subscribe(self, topic: str, qos: int = 1) -> list:
        mid = self.c.subscribe(topic, qos)
        f = self.subacks[mid] = asyncio.get_running_loop().create_future()
        return await asyncio.wait_for(f, 10)

    async def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                      **props) -> None:
        """Published: for QoS 1 and 2 once acknowledged (gmqtt keeps a message until its PUBACK
        or PUBCOMP; its store's wait_empty is how its own connect() waits for that)."""
        self.c.publish(topic, payload, qos, retain, **props)
        await asyncio.wait_for(self.c._persistent_storage.wait_empty(), 10)

    async def message(self, timeout: float = 10.0):
        return await asyncio.wait_for(self.messages.get(), timeout)

    async def none(self, timeout: float = 0.3) -> bool:
        await asyncio.sleep(timeout)
        return self.messages.empty()

    async def close(self) -> None:
        """A normal DISCONNECT (0x00)."""
        await self.c.disconnect()

    def drop(self) -> None:
        """The TCP connection closes without DISCONNECT."""
        self.c._connection._transport.abort()


PROPS_G = {"user_property": [("a", "1"), ("b", "2"), ("a", "3")], "content_type": "text/plain",
           "response_topic": "reply/here", "correlation_data": b"\x01\x02", "payload_format_id": 1,
           "message_expiry_interval": 60}


@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_gmqtt_v5_message_keeps_its_properties(broker, qos):
    """[MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-18]
    [MQTT-3.3.2-20]: gmqtt publishes with properties; a gmqtt subscriber gets them unaltered
    (user properties in order) at the QoS it asked for, the message expiry interval no larger
    than sent [MQTT-3.3.2-6]."""
    topic = uniq("gprops")
    sub = await Gmqtt.connect(broker.port)
    assert await sub.subscribe(topic, 2) == [2]
    pub = await Gmqtt.connect(broker.port)
    await pub.publish(topic, b"with-props", qos, **PROPS_G)
    t, payload, got_qos, p = await sub.message()
    assert (t, payload, got_qos, p["retain"]) == (topic, b"with-props", qos, 0)
    assert 0 < p["message_expiry_interval"][0] <= 60
    assert p["user_property"] == PROPS_G["user_property"]
    assert {k: p[k] for k in ("content_type", "response_topic", "correlation_data",
                              "payload_format_id")} == \
        {"content_type": ["text/plain"], "response_topic": ["reply/here"],
         "correlation_data": [b"\x01\x02"], "payload_format_id": [1]}
    assert await sub.none()
    await pub.close()
    await sub.close()


async def test_gmqtt_retained_message_reaches_later_subscriber_until_cleared(broker):
    """[MQTT-3.3.1-5] [MQTT-3.3.1-9]: a retained message from gmqtt reaches a later gmqtt
    subscriber with RETAIN=1; [MQTT-3.3.1-6] [MQTT-3.3.1-7]: an empty retained publish clears
    it."""
    topic = uniq("gret")
    pub = await Gmqtt.connect(broker.port)
    await pub.publish(topic, b"state", 1, retain=True)
    s1 = await Gmqtt.connect(broker.port)
    m = await g_retained(broker, s1, topic, b"state")
    assert m is not None
    t, payload, qos, p = m
    assert (t, payload, qos, p["retain"]) == (topic, b"state", 1, 1)
    await pub.publish(topic, b"", 1, retain=True)
    t, payload, qos, p = await s1.message()
    assert (payload, p["retain"]) == (b"", 0)
    s2 = await Gmqtt.connect(broker.port)
    assert await g_retained(broker, s2, topic, None) is None
    assert await s1.none() and await s2.none()
    for c in (pub, s1, s2):
        await c.close()


async def g_retained(broker, sub: Gmqtt, topic: str, expect: bytes | None):
    """The retained message a subscription to `topic` brings (None: none within 0.5 s); on a
    cluster subscribing again until it is the `expect`ed one (retained_wait)."""
    deadline = time.monotonic() + retained_wait(broker)
    while True:
        assert await sub.subscribe(topic, 1) == [1]
        try:
            m = await sub.message(0.5)
        except TimeoutError:
            m = None
        if (m is None if expect is None else m is not None and m[1] == expect) or \
                time.monotonic() >= deadline:
            return m


@pytest.mark.parametrize("how", ["disconnect", "dropped"])
async def test_gmqtt_persistent_session_resumes_with_its_queued_messages(broker, ports, how):
    """[MQTT-3.1.2-5] [MQTT-3.2.2-3]: gmqtt (Clean Start 0, session expiry 300 s) subscribes at
    QoS 1 and 2, goes away (DISCONNECT, or the connection drops), QoS 1 and 2 messages are
    published, and it comes back (a cluster: to the same node or the other one): session
    present, every queued message once, in order (on a cluster: per topic [MQTT-4.6.0-6], as a
    session rebuilt on another node gets them from Kafka, where each topic has its own order:
    docs/cluster.md, "What is guaranteed, and what is not")."""
    first, back = ports
    t1, t2, client_id = uniq("gpersist1"), uniq("gpersist2"), cid("gpersist")
    a = await Gmqtt.connect(first, client_id, clean=False, session_expiry_interval=300)
    assert a.session_present is False
    assert await a.subscribe(t1, 1) == [1]
    assert await a.subscribe(t2, 2) == [2]
    if how == "disconnect":
        await a.close()
    else:
        a.drop()
    await asyncio.sleep(0.3)  # the broker has seen the connection end
    pub = await Gmqtt.connect(first)
    sent = [(t1, b"q1-a", 1), (t2, b"q2-a", 2), (t1, b"q1-b", 1), (t2, b"q2-b", 2)]
    for topic, payload, qos in sent:
        await pub.publish(topic, payload, qos)
    b = await Gmqtt.connect(back, client_id, clean=False, session_expiry_interval=300)
    assert b.session_present is True
    got = [(await b.message())[:3] for _ in sent]
    if cluster_targets.on_cluster(broker):
        got, sent = sorted(got, key=lambda m: m[0]), sorted(sent, key=lambda m: m[0])
    assert got == sent
    assert await b.none(0.5)
    await pub.publish(t1, b"live", 1)
    assert (await b.message())[1] == b"live"
    assert b.disconnects == [] and b.c.is_connected
    await pub.close()
    await b.close()


async def test_gmqtt_takeover_disconnects_the_old_connection(ports):
    """[MQTT-3.1.4-3]: a second gmqtt connection with the client id of a connected one (a
    cluster: on the same node or the other one): the old one gets DISCONNECT 0x8E, the new
    one resumes the session and keeps working."""
    first, back = ports
    topic, client_id = uniq("gtakeover"), cid("gtakeover")
    a = await Gmqtt.connect(first, client_id, clean=False, session_expiry_interval=300)
    assert await a.subscribe(topic, 1) == [1]
    b = await Gmqtt.connect(back, client_id, clean=False, session_expiry_interval=300)
    assert b.session_present is True
    deadline = time.monotonic() + 5
    while not a.disconnects and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert a.disconnects[:1] == [0x8E], a.disconnects
    pub = await Gmqtt.connect(first)
    await pub.publish(topic, b"to-new", 1)
    assert (await b.message())[:2] == (topic, b"to-new")
    assert await a.none(0.3)
    assert b.disconnects == [] and b.c.is_connected
    for c in (pub, b):
        await c.close()


@pytest.mark.parametrize("how", ["dropped", "disconnect"])
async def test_gmqtt_will_sent_on_abnormal_end_only(broker, how):
    """[MQTT-3.1.2-8]: gmqtt with a will (delay 0) whose connection drops without DISCONNECT:
    the will reaches a subscriber; [MQTT-3.1.2-10]: after a normal DISCONNECT it is not sent."""
    topic = uniq("gwill")
    sub = await Gmqtt.connect(broker.port)
    assert await sub.subscribe(topic, 1) == [1]
    will = gmqtt.Message(topic, b"gone", qos=1, will_delay_interval=0)
    w = await Gmqtt.connect(broker.port, will=will)
    if how == "dropped":
        w.drop()
        t, payload, qos, _ = await sub.message()
        assert (t, payload, qos) == (topic, b"gone", 1)
    else:
        await w.close()
        assert await sub.none(1.0)
    await sub.close()
