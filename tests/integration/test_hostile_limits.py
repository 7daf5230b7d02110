"""Hostile clients (issue 8) through real sockets: inbound topic aliases cannot hold memory,
session expiry caps cannot be bypassed, the number of sessions is bounded.
RSS is VmRSS of the broker process (as tests/integration/test_memory_bounds.py)."""
import socket
import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from tests.conftest import BrokerProcess
from tests.integration.helpers import (P, PR, assert_served, bye, cid, connect, expect_disconnect,
                                       props, publish_ok, recv_publish, uniq)
from tests.integration.test_memory_bounds import PeakRSS


def lean(tmp_path, **settings) -> BrokerProcess:
    return BrokerProcess(tmp_path, settings={"persistence.enabled": False, "metrics.sys_interval": 0,
                                             **settings}).start()


def alias_flood(port: int, topic_of, n: int = 3000) -> socket.socket:
    """A raw v5 client mapping aliases 1..n to n topics of ~60 KB (QoS 0, never reading);
    returns its socket (closed by the broker or not)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(encode(P.Connect(cid("alias-flood"), P.MQTT_5)))
    try:
        for a in range(1, n + 1):
            s.sendall(encode(P.Publish(topic_of(a), b"x", properties={PR.TOPIC_ALIAS: a})))
    except OSError:
        pass  # closed by the broker: expected once a bound is reached
    return s


@pytest.mark.timeout(600)
def test_alias_flood_memory_is_bounded(tmp_path):
    """3000 aliases mapped to ~60 KB topics ($SYS: refused to clients; then allowed topics nobody
    subscribes to), with topic_alias_maximum raised to 65535: the broker used to store every
    mapping before checking the topic (+178 MiB). Now a refused topic maps nothing and the
    allowed ones stop at mqtt.max_topic_alias_bytes (64 KiB) with DISCONNECT 0x97."""
    b = lean(tmp_path, **{"mqtt.topic_alias_maximum": 65535})
    try:
        grown = {}
        for name, topic_of in (("forbidden ($SYS)", lambda a: f"$SYS/{a}/" + "x" * 60000),
                               ("allowed", lambda a: f"free/{a}/" + "x" * 60000)):
            peak = PeakRSS(b.proc.pid)
            s = alias_flood(b.port, topic_of)
            probe = connect(b.port)
            publish_ok(probe, uniq("sync"), qos=1)  # the broker got through the flood
            time.sleep(0.5)
            grown[name] = peak.grown_mib()
            s.close()
            bye(probe)
        for name, mib in grown.items():
            print(f"\nbroker RSS grew {mib:.1f} MiB with 3000 aliases to ~60 KB {name} topics")
        assert all(mib < 40 for mib in grown.values()), grown
        assert_served(b.port)
    finally:
        alive = b.alive()
        b.stop()
    assert alive, "the broker died:\n" + b.logs()[-3000:]


def test_alias_bytes_bound_disconnect_0x97(make_broker):
    """A mapping that would make the aliases of one connection hold more than
    mqtt.max_topic_alias_bytes gets DISCONNECT 0x97 and its message is not delivered;
    replacing mappings within the bound is fine."""
    b = make_broker({"mqtt.max_topic_alias_bytes": 1000})
    base = uniq("aliasbytes")
    sub = connect(b.port)
    sub.subscribe(f"{base}/#")
    c = connect(b.port)
    topics = [f"{base}/{i}/" + "t" * (250 - len(base) - 3) for i in range(4)]
    assert all(len(t) == 250 for t in topics)
    for i, t in enumerate(topics):
        publish_ok(c, t, b"m", qos=1, pid=i + 1, expect_code=0, properties={PR.TOPIC_ALIAS: i + 1})
    publish_ok(c, "", b"again", qos=1, pid=9, expect_code=0, properties={PR.TOPIC_ALIAS: 4})
    got = [recv_publish(sub) for _ in range(5)]
    assert [m.topic for m in got] == topics + [topics[3]]
    c.publish(f"{base}/x", b"over", qos=1, pid=10, properties={PR.TOPIC_ALIAS: 5})
    seen = expect_disconnect(c, rc.QUOTA_EXCEEDED)
    assert "max_topic_alias_bytes" in props(seen[-1])[PR.REASON_STRING]
    assert sub.nothing(0.5)
    bye(sub)


def test_default_topic_alias_maximum_10(broker):
    """The default Topic Alias Maximum is 10 (Mosquitto's): advertised, and alias 11 is 0x94."""
    c = connect(broker.port)
    assert props(c.connack)[PR.TOPIC_ALIAS_MAXIMUM] == 10
    publish_ok(c, uniq("a10"), qos=1, expect_code=rc.NO_MATCHING_SUBSCRIBERS, properties={PR.TOPIC_ALIAS: 10})
    c.publish(uniq("a11"), b"x", qos=1, pid=2, properties={PR.TOPIC_ALIAS: 11})
    expect_disconnect(c, rc.TOPIC_ALIAS_INVALID)


def test_alias_refused_by_acl_maps_nothing(make_broker, tmp_path):
    """[MQTT-3.3.2-12] with the ACL: a PUBLISH refused by the ACL (PUBACK 0x87) leaves no alias
    behind, and does not leave an earlier mapping of that alias either: using the alias alone
    afterwards is a Protocol Error, never a message on the earlier topic."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite ok/#\n")
    b = make_broker({"auth.acl_file": str(acl)})
    sub = connect(b.port)
    sub.subscribe("ok/#")
    c = connect(b.port)
    publish_ok(c, "secret/x", qos=1, expect_code=rc.NOT_AUTHORIZED, properties={PR.TOPIC_ALIAS: 1})
    c.publish("", b"via-alias", qos=1, pid=2, properties={PR.TOPIC_ALIAS: 1})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    c = connect(b.port)
    publish_ok(c, "ok/a", b"1", qos=1, expect_code=0, properties={PR.TOPIC_ALIAS: 2})
    assert recv_publish(sub).payload == b"1"
    publish_ok(c, "secret/y", b"2", qos=1, pid=2, expect_code=rc.NOT_AUTHORIZED,
               properties={PR.TOPIC_ALIAS: 2})
    c.publish("", b"3", qos=1, pid=3, properties={PR.TOPIC_ALIAS: 2})
    expect_disconnect(c, rc.PROTOCOL_ERROR)
    assert sub.nothing(0.5)
    bye(sub)
