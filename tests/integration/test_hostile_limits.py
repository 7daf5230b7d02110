"""Hostile clients through real sockets: inbound topic aliases cannot hold memory (bounded in
number by Topic Alias Maximum and in bytes by mqtt.max_topic_alias_bytes), session expiry caps
cannot be bypassed, the number of sessions is bounded (README "Listeners, limits").
RSS is VmRSS of the broker process (as tests/integration/test_memory_bounds.py)."""
import socket
import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from tests.conftest import BrokerProcess
from tests.integration.helpers import (
    PR,
    P,
    assert_served,
    bye,
    cid,
    connect,
    expect_disconnect,
    props,
    publish_ok,
    recv_publish,
    uniq,
)
from tests.integration.test_memory_bounds import PeakRSS
from tests.mqtt_raw import RawClient


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


# ---------------------------------------------------------------- session expiry caps
NEVER = 0xFFFFFFFF


def leave_persistent(port: int, client_id: str, level: int = P.MQTT_5, connect_expiry: int = 0,
                     disconnect_expiry: int | None = None) -> None:
    """A persistent session with one subscription, then a DISCONNECT (with a v5 Session Expiry
    Interval when given)."""
    c = connect(port, client_id, level=level, clean_start=False, expect_present=False,
                properties={PR.SESSION_EXPIRY_INTERVAL: connect_expiry} if connect_expiry else None)
    assert c.subscribe(uniq("keep"), qos=1).reason_codes == [1]
    c.send(P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: disconnect_expiry})
           if disconnect_expiry is not None else P.Disconnect())
    c.expect_closed()


def present(port: int, client_id: str, level: int = P.MQTT_5, connect_expiry: int = 0) -> bool:
    c = connect(port, client_id, level=level, clean_start=False,
                properties={PR.SESSION_EXPIRY_INTERVAL: connect_expiry} if connect_expiry else None)
    bye(c)
    return c.connack.session_present


def test_disconnect_expiry_capped_by_session_expiry_maximum(tmp_path):
    """A v5 client connecting with 1 s and raising the interval to 'never' on DISCONNECT used to
    keep its session forever; with mqtt.session_expiry_maximum = 3 it is gone after 3 s."""
    b = lean(tmp_path, **{"mqtt.session_expiry_maximum": 3})
    try:
        gone, kept = cid("never"), cid("control")
        leave_persistent(b.port, gone, connect_expiry=1, disconnect_expiry=NEVER)
        leave_persistent(b.port, kept, connect_expiry=1, disconnect_expiry=NEVER)
        assert present(b.port, kept, connect_expiry=1)  # capped, not ended
        time.sleep(6)  # 3 s cap + the once-a-second expiry tick, with room for a loaded machine
        assert not present(b.port, gone, connect_expiry=1)
    finally:
        alive = b.alive()
        b.stop()
    assert alive, "the broker died:\n" + b.logs()[-3000:]


def test_311_persistent_session_expires_after_persistent_client_expiration(tmp_path):
    """3.1.1 clean session 0 sessions used to be kept forever; now for
    mqtt.persistent_client_expiration seconds offline."""
    b = lean(tmp_path, **{"mqtt.persistent_client_expiration": 3})
    try:
        gone, kept = cid("v311"), cid("v311-control")
        leave_persistent(b.port, gone, level=P.MQTT_311)
        leave_persistent(b.port, kept, level=P.MQTT_311)
        assert present(b.port, kept, level=P.MQTT_311)
        time.sleep(6)
        assert not present(b.port, gone, level=P.MQTT_311)
    finally:
        b.stop()


def test_stored_never_expiring_sessions_are_capped_on_restart(tmp_path):
    """Sessions stored as 'never expires' (3.1.1 clean session 0 and v5 0xFFFFFFFF, under a config
    allowing that, as older versions stored 3.1.1 sessions) are capped by the config of the broker
    that restores them: gone after the cap, while a client that comes back in time resumes."""
    first = BrokerProcess(tmp_path, settings={"mqtt.session_expiry_maximum": NEVER,
                                              "mqtt.persistent_client_expiration": NEVER}).start()
    ids = {name: cid(name) for name in ("v4", "v5", "v4-control", "v5-control")}
    try:
        for name, client_id in ids.items():
            if name.startswith("v4"):
                leave_persistent(first.port, client_id, level=P.MQTT_311)
            else:
                leave_persistent(first.port, client_id, connect_expiry=NEVER)
    finally:
        first.stop()  # SIGTERM: the sessions are on disk
    second = BrokerProcess(tmp_path, settings={"mqtt.session_expiry_maximum": 4,
                                               "mqtt.persistent_client_expiration": 3}).start()
    try:
        assert present(second.port, ids["v4-control"], level=P.MQTT_311)  # restored
        assert present(second.port, ids["v5-control"], connect_expiry=1)
        time.sleep(7)
        assert not present(second.port, ids["v4"], level=P.MQTT_311)
        assert not present(second.port, ids["v5"], connect_expiry=1)
    finally:
        second.stop()


# ---------------------------------------------------------------- mqtt.max_sessions
def refused(port: int, client_id: str, level: int):
    c = RawClient(port, level=level)
    ack = c.connect(client_id)
    c.expect_closed()
    return ack


def test_max_sessions_refuses_new_sessions_not_resume(tmp_path):
    """mqtt.max_sessions = 3 with one offline persistent session and two connected clients: a new
    client id gets CONNACK 0x97 (v5) / return code 3 (3.1.1, 3.1) and the connection is closed;
    resuming, taking over and Clean Start on held ids are accepted; one WARNING names the key."""
    b = lean(tmp_path, **{"mqtt.max_sessions": 3})
    try:
        offline, c1, c2 = cid("offline"), cid("c1"), cid("c2")
        leave_persistent(b.port, offline, connect_expiry=300)
        one = connect(b.port, c1)
        two = connect(b.port, c2, level=P.MQTT_311)
        ack = refused(b.port, cid("new5"), P.MQTT_5)
        assert ack.reason_code == rc.QUOTA_EXCEEDED
        assert "try again later" in props(ack)[PR.REASON_STRING]
        assert refused(b.port, cid("new4"), P.MQTT_311).reason_code == 3
        assert refused(b.port, cid("new3"), P.MQTT_31).reason_code == 3
        assert present(b.port, offline, connect_expiry=300)  # resume
        taker = connect(b.port, c1)  # takeover
        expect_disconnect(one, rc.SESSION_TAKEN_OVER)
        bye(connect(b.port, offline))  # Clean Start 1 on a held id: replaces it, then ends
        publish_ok(two, uniq("still"), qos=1)  # the connected clients were not affected
        fresh = connect(b.port, cid("fresh"))  # room again since the clean session ended
        bye(taker, two, fresh)
        log = b.logs()
        warned = [line for line in log.splitlines() if "WARNING" in line]
        assert len(warned) == 1, log[-3000:]  # one WARNING, not one per refused CONNECT
        assert "refused a new session" in warned[0] and "mqtt.max_sessions" in warned[0]
        assert_served(b.port)
    finally:
        b.stop()


@pytest.mark.timeout(300)
def test_publishes_walking_branching_wildcard_filters_do_not_stall_another_client(tmp_path):
    """One SUBSCRIBE of 1,000 filters of 128 levels branching 1,000 ways into '+' levels, then
    1,000 QoS 0 PUBLISHes on new 128-level topics that walk every branch granted: before, all
    1,000 were stored and each PUBLISH took 40-90 ms, so another client's PINGREQ waited tens of
    seconds. Now most of the filters get 0x97 (mqtt.max_wildcard_levels) and reads are handled
    in slices that give way to the others: the other client's PINGREQs are answered within a
    generous bound (2 s, on a busy machine) all the while."""
    b = lean(tmp_path)
    try:
        pinger = RawClient(b.port, timeout=30)
        assert pinger.connect(cid("pinger")).reason_code == 0
        att = RawClient(b.port, timeout=60)
        assert att.connect(cid("brancher")).reason_code == 0
        filters = ["/".join(["+" if i >> k & 1 else "a" for k in range(10)] + ["+"] * 117 + ["end"])
                   for i in range(1000)]
        att.send(P.Subscribe(1, [(f, P.SubscriptionOptions(0)) for f in filters]))
        codes = att.recv_type(P.SUBACK).reason_codes
        assert 0 < codes.count(0) < 10 and codes.count(rc.QUOTA_EXCEEDED) == 1000 - codes.count(0)
        burst = b"".join(encode(P.Publish("/".join(["a"] * 10 + [f"n{j}"] + ["x"] * 117), b"p"))
                         for j in range(1000))
        att.sock.sendall(burst)
        att.send(P.PingReq())  # answered once the whole burst was handled
        worst, done, pings = 0.0, False, 0
        att.sock.settimeout(0.001)
        while not done:
            pings += 1
            t0 = time.perf_counter()
            pinger.send(P.PingReq())
            assert pinger.recv_type(P.PINGRESP) is not None
            worst = max(worst, time.perf_counter() - t0)
            try:
                done = att.sock.recv(2) == b"\xd0\x00"
            except (TimeoutError, socket.timeout):
                pass
        assert pings > 1 and worst < 2.0, f"another client's PINGREQ took {worst:.2f} s ({pings})"
        assert_served(b.port)
    finally:
        b.stop()
