"""Interoperability with real client libraries and tools: paho-mqtt (MQTT 5, 3.1.1, 3.1) and
mosquitto_pub / mosquitto_sub, exchanging messages in both directions across protocol levels."""
from __future__ import annotations

import queue
import shutil
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from . import cluster_targets
from .helpers import PR, ack, bye, cid, connect, publish_ok, recv_publish, uniq

pytestmark = pytest.mark.timeout(30)

LEVELS = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}


class Paho:
    """A paho-mqtt client running its network loop in a thread; received messages go to a queue.
    `clean_session` (3.1.x) is paho's constructor argument; v5 takes clean_start in connect_kw."""

    def __init__(self, port: int, level: int = 5, client_id: str | None = None,
                 clean_session: bool = True, **connect_kw):
        self.level = level
        kw = {} if level == 5 else {"clean_session": clean_session}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id or cid("paho"),
                             protocol=LEVELS[level], **kw)
        self.messages: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.connected = threading.Event()
        self.connect_rc = None
        self.session_present = None
        self.disconnects: list = []  # reason codes of the disconnections paho saw
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = lambda c, u, flags, reason_code, p: self.disconnects.append(
            getattr(reason_code, "value", reason_code))
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_subscribe = lambda c, u, mid, codes, p: self.subacks.put((mid, codes))
        self.c.connect("127.0.0.1", port, keepalive=30, **connect_kw)
        self.c.loop_start()
        assert self.connected.wait(5), "paho did not get CONNACK"
        assert self.connect_rc == 0, f"paho connect refused: {self.connect_rc}"

    def _on_connect(self, c, u, flags, reason_code, properties):
        self.connect_rc = reason_code.value if hasattr(reason_code, "value") else reason_code
        self.session_present = flags.session_present
        self.connected.set()

    def subscribe(self, topic: str, qos: int = 1, **kw):
        result, mid = self.c.subscribe(topic, qos, **kw)
        assert result == mqtt.MQTT_ERR_SUCCESS
        got_mid, codes = self.subacks.get(timeout=5)
        assert got_mid == mid
        return [getattr(x, "value", x) for x in codes]

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, properties=None):
        info = self.c.publish(topic, payload, qos, retain, properties=properties)
        info.wait_for_publish(5)
        assert info.is_published()

    def get(self, timeout: float = 5.0):
        return self.messages.get(timeout=timeout)

    def none(self, timeout: float = 0.5) -> bool:
        try:
            m = self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        self.messages.put(m)
        return False

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()

    def drop(self):
        """The TCP connection ends without DISCONNECT (paho's loop stopped first)."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            sock.close()


broker, two_nodes, _ = cluster_targets.broker_fixtures()  # (make_target: not used here)


@pytest.mark.kafka
def test_the_balancer_sends_consecutive_connections_to_alternate_nodes(two_nodes):
    """The premise of the "balancer" parameter: through HAProxy (round robin), a test's
    consecutive connections land on n1, n2, n1, n2 (or n2 first), as each node's log of
    connected client ids shows."""
    lb = cluster_targets.Balancer({n: two_nodes.port(n) for n in ("n1", "n2")}, two_nodes.tmp)
    try:
        ids = [cid("spread") for _ in range(4)]
        for i in ids:
            bye(connect(lb.port, i))
    finally:
        lb.stop()
    time.sleep(0.3)  # the nodes have written their log lines
    where = {n: [i for i in ids if f"client {i} connected" in two_nodes.nodes[n].logs()]
             for n in ("n1", "n2")}
    assert sorted(where.values()) == sorted([ids[0::2], ids[1::2]]), where


@pytest.fixture
def paho_clients():
    made = []

    def make(port, level=5, **kw):
        p = Paho(port, level, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        try:
            p.close()
        except Exception:
            pass


@pytest.mark.parametrize("pub_level,sub_level", [(5, 4), (4, 5), (5, 3), (3, 5), (4, 3), (3, 4), (5, 5),
                                                 (4, 4)])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_levels_exchange(broker, paho_clients, pub_level, sub_level, qos):
    """Clients of different protocol levels (5, 3.1.1, 3.1 MQIsdp) exchange messages at QoS 0-2."""
    topic = uniq(f"interop{pub_level}{sub_level}")
    sub = paho_clients(broker.port, sub_level)
    assert sub.subscribe(topic, qos=2) == [2]
    pub = paho_clients(broker.port, pub_level)
    payloads = [b"first", b"\x00\xffbinary", b"x" * 5000]
    for p in payloads:
        pub.publish(topic, p, qos=qos)
    got = [sub.get() for _ in payloads]
    assert [(m.topic, m.payload, m.qos) for m in got] == [(topic, p, qos) for p in payloads]
    assert sub.none(0.3)


def test_paho_v5_properties_and_v311_subscriber(broker, paho_clients):
    """v5 properties reach a paho v5 subscriber unaltered; a 3.1.1 subscriber gets the payload."""
    topic = uniq("interopprops")
    s5, s4 = paho_clients(broker.port, 5), paho_clients(broker.port, 4)
    s5.subscribe(topic, 1)
    s4.subscribe(topic, 1)
    pub = paho_clients(broker.port, 5)
    p = Properties(PacketTypes.PUBLISH)
    p.UserProperty = [("a", "1"), ("b", "2"), ("a", "3")]
    p.ResponseTopic = "reply/here"
    p.CorrelationData = b"\x01\x02"
    p.ContentType = "text/plain"
    p.PayloadFormatIndicator = 1
    p.MessageExpiryInterval = 60
    pub.publish(topic, b"with-props", 1, properties=p)
    m5, m4 = s5.get(), s4.get()
    assert m5.payload == m4.payload == b"with-props"
    mp = m5.properties
    assert mp.UserProperty == [("a", "1"), ("b", "2"), ("a", "3")]
    assert (mp.ResponseTopic, mp.CorrelationData, mp.ContentType, mp.PayloadFormatIndicator) == \
        ("reply/here", b"\x01\x02", "text/plain", 1)
    assert 0 < mp.MessageExpiryInterval <= 60


def test_paho_v5_without_alias_maximum_gets_topic_names(broker, paho_clients):
    """[MQTT-3.3.2-11]: paho v5 sends no Topic Alias Maximum (it cannot resolve inbound aliases), so
    the broker must send every topic name in full, also for repeated topics."""
    base = uniq("interopalias")
    sub = paho_clients(broker.port, 5)
    sub.subscribe(base + "/#", 1)
    raw = connect(broker.port)
    topics = [f"{base}/{i % 3}" for i in range(9)]
    for i, t in enumerate(topics):
        publish_ok(raw, t, b"%d" % i, qos=1, pid=i + 1)
    got = [(m.topic, m.payload) for m in (sub.get() for _ in topics)]
    expected = [(t, b"%d" % i) for i, t in enumerate(topics)]
    if isinstance(broker, cluster_targets.Balancer):
        # through the balancer the publisher and the subscriber are on different nodes, which
        # order per topic only: the specification requires order per topic [MQTT-4.6.0-5]
        # [MQTT-4.6.0-6], not across topics (on one node, across topics too: docs/cluster.md)
        got, expected = sorted(got, key=lambda x: x[0]), sorted(expected, key=lambda x: x[0])
    assert got == expected
    bye(raw)


def test_paho_retained_across_levels(broker, paho_clients):
    """A retained message from a 3.1.1 client reaches new v5 and 3.1 subscribers with RETAIN=1."""
    topic = uniq("interopret")
    pub = paho_clients(broker.port, 4)
    pub.publish(topic, b"state", 1, retain=True)
    for level in (5, 3):
        s = paho_clients(broker.port, level)
        s.subscribe(topic, 1)
        m = s.get()
        assert (m.payload, m.retain) == (b"state", True)
    pub.publish(topic, b"", 1, retain=True)


def test_raw_v5_and_paho_v311_both_ways(broker, paho_clients):
    """The raw v5 client and a paho 3.1.1 client exchange QoS 2 messages both ways; the 3.1.1
    client's message reaches v5 without properties."""
    t1, t2 = uniq("rawpaho"), uniq("pahoraw")
    p4 = paho_clients(broker.port, 4)
    p4.subscribe(t1, 2)
    raw = connect(broker.port)
    raw.subscribe(t2, qos=2)
    publish_ok(raw, t1, b"to-paho", qos=2, properties={PR.USER_PROPERTY: [("k", "v")]})
    m = p4.get()
    assert (m.payload, m.qos) == (b"to-paho", 2)
    p4.publish(t2, b"to-raw", 2)
    r = recv_publish(raw)
    assert (r.payload, r.qos, r.properties) == (b"to-raw", 2, None)
    ack(raw, r)
    bye(raw)


# ---------------------------------------------------------------- mosquitto clients

MOSQ = {"pub": shutil.which("mosquitto_pub"), "sub": shutil.which("mosquitto_sub")}


def need_mosquitto():
    if not (MOSQ["pub"] and MOSQ["sub"]):
        reason = "mosquitto_pub/mosquitto_sub not installed (apt-get install mosquitto-clients)"
        print("SKIP:", reason)
        pytest.skip(reason)


# mosquitto_sub block-buffers stdout into a pipe: line-buffer it to see the SUBACK line at once
STDBUF = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
MOSQ_V = {5: "mqttv5", 4: "mqttv311", 3: "mqttv31"}


class MosquittoSub:
    """mosquitto_sub in the background; ready once its SUBACK is logged (-d)."""

    def __init__(self, port: int, topic: str, level: int, count: int, qos: int = 1):
        self.proc = subprocess.Popen(
            [*STDBUF, MOSQ["sub"], "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos),
             "-V", MOSQ_V[level], "-C", str(count), "-W", "20", "-d", "-F", "MSG|%t|%q|%r|%p",
             "-i", cid("msub")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if "SUBACK" in line:
                return
        self.proc.kill()
        raise AssertionError("mosquitto_sub did not subscribe: " + "\n".join(self.lines))

    def messages(self, timeout: float = 15) -> list[tuple]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        lines = self.lines + out.splitlines()
        return [tuple(x.split("|", 4)[1:]) for x in lines if x.startswith("MSG|")]


def mosquitto_pub(port: int, topic: str, payload: str, level: int, qos: int = 1, retain=False, extra=()):
    args = [MOSQ["pub"], "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-m", payload, "-q", str(qos),
            "-V", MOSQ_V[level], "-i", cid("mpub"), *extra]
    if retain:
        args.append("-r")
    r = subprocess.run(args, capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("pub_level,sub_level", [(5, 5), (4, 5), (3, 5), (5, 4), (5, 3), (4, 4)])
def test_mosquitto_pub_to_mosquitto_sub(broker, pub_level, sub_level):
    """mosquitto_pub -> broker -> mosquitto_sub across 3.1 / 3.1.1 / 5 at QoS 0-2."""
    need_mosquitto()
    topic = uniq("mosq")
    sub = MosquittoSub(broker.port, topic, sub_level, count=3, qos=2)
    for q in (0, 1, 2):
        mosquitto_pub(broker.port, topic, f"hello-{q}", pub_level, qos=q)
    got = sub.messages()
    if isinstance(broker, cluster_targets.Balancer):
        # three mosquitto_pub runs are three publishers, which the balancer puts on different
        # nodes: order is required per publisher only [MQTT-4.6.0-5], not between publishers
        got = sorted(got, key=lambda m: m[3])
    assert got == [(topic, str(q), "0", f"hello-{q}") for q in (0, 1, 2)]


def test_mosquitto_to_paho_and_back(broker, paho_clients):
    """mosquitto_pub (v5, with a user property) -> paho v5; paho 3.1.1 -> mosquitto_sub v5."""
    need_mosquitto()
    t1, t2 = uniq("mosqpaho"), uniq("pahomosq")
    p5 = paho_clients(broker.port, 5)
    p5.subscribe(t1, 1)
    mosquitto_pub(broker.port, t1, "from-mosq", 5, qos=1, extra=("-D", "publish", "user-property", "k", "v"))
    m = p5.get()
    assert m.payload == b"from-mosq" and m.properties.UserProperty == [("k", "v")]
    sub = MosquittoSub(broker.port, t2, 5, count=1)
    p4 = paho_clients(broker.port, 4)
    p4.publish(t2, b"from-paho", 1)
    assert sub.messages() == [(t2, "1", "0", "from-paho")]


def test_mosquitto_retained_and_raw_client(broker):
    """A retained message from mosquitto_pub (3.1.1) reaches a raw v5 subscriber with RETAIN=1 and is
    deleted by an empty retained publish."""
    need_mosquitto()
    topic = uniq("mosqret")
    mosquitto_pub(broker.port, topic, "kept", 4, qos=1, retain=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1)
    m = recv_publish(c)
    assert (m.payload, m.retain, m.qos) == (b"kept", True, 1)
    ack(c, m)
    bye(c)
    subprocess.run([MOSQ["pub"], "-h", "127.0.0.1", "-p", str(broker.port), "-t", topic, "-r", "-n",
                    "-q", "1"], check=True, timeout=15, capture_output=True)
    c = connect(broker.port)
    c.subscribe(topic, qos=1)
    assert c.nothing(0.5)
    bye(c)


def test_mosquitto_sub_receives_from_raw_v5_with_props(broker):
    """A raw v5 publish with properties reaches mosquitto_sub v5 (which prints them) and 3.1."""
    need_mosquitto()
    topic = uniq("rawmosq")
    s5 = MosquittoSub(broker.port, topic, 5, count=1)
    s3 = MosquittoSub(broker.port, topic, 3, count=1)
    c = connect(broker.port)
    publish_ok(c, topic, b"raw-to-mosq", qos=1, expect_code=0,
               properties={PR.CONTENT_TYPE: "text/plain"})
    assert s5.messages() == [(topic, "1", "0", "raw-to-mosq")]
    assert s3.messages() == [(topic, "1", "0", "raw-to-mosq")]
    bye(c)


# ---------------------------------------------------------------- persistent sessions
# a client reconnecting to the node it was on, or to another node of the cluster, is served as
# by one broker

@pytest.fixture(params=["same-node", "other-node"])
def ports(request, broker):
    """(the port a client first connects to, the one it comes back to): on a cluster node, the
    node it was on or the other one; one broker, and the balancer, have one port for both
    (through the balancer the rotation decides: a client that comes back after one other
    connection is on its first node, after none or two on the other)."""
    return broker.port, getattr(broker, "ports", {}).get(request.param, broker.port)


def persistent_paho(paho_clients, port: int, level: int, client_id: str):
    if level == 5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        return paho_clients(port, 5, client_id=client_id, clean_start=False, properties=props)
    return paho_clients(port, level, client_id=client_id, clean_session=False)


@pytest.mark.parametrize("how", ["disconnect", "dropped"])
@pytest.mark.parametrize("level", [5, 4])
def test_paho_persistent_session_resumes_with_its_queued_messages(ports, paho_clients, level, how,
                                                                  request):
    """[MQTT-3.1.2-5], [MQTT-3.2.2-2], [MQTT-3.2.2-3]: paho (v5 Clean Start 0 with an expiry,
    3.1.1 clean session 0) subscribes, goes away (DISCONNECT, or the connection drops), QoS 1
    messages are published, and it comes back (a cluster: to the same node or the other one):
    session present, the queued messages delivered, and its connection kept (no 0x8E)."""
    first, back = ports
    topic, client_id = uniq("persist"), cid("persist")
    a = persistent_paho(paho_clients, first, level, client_id)
    assert a.session_present is False
    assert a.subscribe(topic, 1) == [1]
    if how == "disconnect":
        a.close()
    else:
        a.drop()
    time.sleep(0.3)  # the broker has seen the connection end
    pub = paho_clients(first, 5)
    for payload in (b"q1", b"q2"):
        pub.publish(topic, payload, 1)
    b = persistent_paho(paho_clients, back, level, client_id)
    assert b.session_present is True
    got = [b.get(10) for _ in range(2)]
    assert [(m.topic, m.payload, m.qos) for m in got] == [(topic, b"q1", 1), (topic, b"q2", 1)]
    pub.publish(topic, b"live", 1)
    assert b.get(10).payload == b"live"
    time.sleep(0.5)
    assert b.disconnects == [] and b.c.is_connected(), f"disconnected: {b.disconnects}"


def test_paho_takeover_keeps_the_new_connection(ports, paho_clients):
    """[MQTT-3.1.4-3]: a second paho v5 connection with the client id of a connected one (a
    cluster: on the same node or the other one): the old connection gets DISCONNECT 0x8E, the
    new one resumes the session and keeps its connection."""
    first, back = ports
    topic, client_id = uniq("takeover"), cid("takeover")
    a = persistent_paho(paho_clients, first, 5, client_id)
    a.c.reconnect_delay_set(60, 60)  # paho would reconnect at once and take the session back
    assert a.subscribe(topic, 1) == [1]
    b = persistent_paho(paho_clients, back, 5, client_id)
    assert b.session_present is True
    deadline = time.monotonic() + 5
    while not a.disconnects and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.disconnects == [0x8E]
    pub = paho_clients(first, 5)
    pub.publish(topic, b"to-new", 1)
    assert b.get(10).payload == b"to-new"
    time.sleep(0.5)
    assert b.disconnects == [] and b.c.is_connected(), f"disconnected: {b.disconnects}"


@pytest.mark.parametrize("level", [5, 4])
def test_mosquitto_sub_persistent_session_gets_what_was_queued(ports, level):
    """mosquitto_sub -c (persistent) subscribes and exits (-E), messages are published, and a
    second mosquitto_sub -c with that client id (a cluster: on the same or the other node) gets
    them."""
    need_mosquitto()
    first, back = ports
    topic, client_id = uniq("mosqpersist"), cid("mosqpersist")
    base = [MOSQ["sub"], "-h", "127.0.0.1", "-t", topic, "-q", "1", "-V", MOSQ_V[level], "-c",
            "-i", client_id, "-F", "MSG|%t|%q|%p"]
    r = subprocess.run([*base, "-p", str(first), "-E"], capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r.stdout + r.stderr
    for i in range(2):
        mosquitto_pub(first, topic, f"queued-{i}", 5, qos=1)
    r = subprocess.run([*base, "-p", str(back), "-C", "2", "-W", "10"], capture_output=True,
                       text=True, timeout=15)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [x for x in r.stdout.splitlines() if x.startswith("MSG|")] == \
        [f"MSG|{topic}|1|queued-{i}" for i in range(2)]
