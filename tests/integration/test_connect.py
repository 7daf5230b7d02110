"""CONNECT / CONNACK / DISCONNECT, sessions, keep alive and wills through real sockets: the cases
whose point is the socket (the close the peer sees, the server's once-a-second timer, a lost TCP
connection, one connection's packets closing another). The rules themselves (MQTT 5.0 3.1, 3.2,
3.14, 3.15, 4.1 and the 3.1.1 counterparts) are tested through the sans-I/O core in
tests/unit/test_core_connect.py."""
from __future__ import annotations

import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from tests.sansio import connect_bytes

from .helpers import (
    PR,
    P,
    RawClient,
    ack,
    assert_served,
    bye,
    cid,
    connect,
    expect_disconnect,
    props,
    publish_ok,
    raw_connect_bytes,
    read_until_closed,
    recv_publish,
    uniq,
)

pytestmark = pytest.mark.timeout(30)


def watcher(port: int, topic: str, qos: int = 1) -> RawClient:
    w = connect(port)
    w.subscribe(topic, qos=qos)
    return w


# ---------------------------------------------------------------- protocol name / level / flags

def test_first_packet_not_connect_closes(broker):
    """[MQTT-3.1.0-1]: the first packet must be CONNECT; otherwise the connection is closed."""
    got = raw_connect_bytes(broker.port, b"\xc0\x00")  # PINGREQ
    assert b"\xd0\x00" not in got
    assert_served(broker.port)


# ---------------------------------------------------------------- client identifiers

def test_empty_client_id_v311_persistent_rejected(broker):
    """3.1.1 [MQTT-3.1.3-8]: an empty client id with clean session 0 -> return code 2 and close."""
    c = RawClient(broker.port, level=P.MQTT_311)
    ack_ = c.connect("", clean_start=False)
    assert ack_.reason_code == rc.V4_IDENTIFIER_REJECTED
    read_until_closed(c)
    assert_served(broker.port)


# ---------------------------------------------------------------- sessions

def test_session_takeover_0x8E(broker):
    """[MQTT-3.1.4-3]: a second connection with the same client id takes over: the old one gets
    DISCONNECT 0x8E and is closed; the new one works and keeps the session's subscriptions."""
    me, topic = cid("take"), uniq("take")
    old = connect(broker.port, me, properties={PR.SESSION_EXPIRY_INTERVAL: 60})
    old.subscribe(topic, qos=1)
    new = connect(broker.port, me, clean_start=False, expect_present=True)
    expect_disconnect(old, rc.SESSION_TAKEN_OVER)
    pub = connect(broker.port)
    publish_ok(pub, topic, b"to-new", qos=1, expect_code=0)
    assert recv_publish(new).payload == b"to-new"
    bye(new, pub)


# ---------------------------------------------------------------- keep alive

@pytest.mark.timeout(15)
def test_keep_alive_timeout_0x8D(broker):
    """[MQTT-3.1.2-22]: no packet within 1.5 x Keep Alive: DISCONNECT 0x8D and close; the will
    is published (abnormal end)."""
    topic = uniq("kawill")
    w = watcher(broker.port, topic)
    c = connect(broker.port, keep_alive=1, will=P.Will(topic, b"ka-will", 1))
    t0 = time.monotonic()
    expect_disconnect(c, rc.KEEP_ALIVE_TIMEOUT, timeout=6)
    elapsed = time.monotonic() - t0
    assert 1.4 <= elapsed <= 4.0, elapsed
    assert recv_publish(w).payload == b"ka-will"
    bye(w)


# ---------------------------------------------------------------- wills

def test_will_published_on_abnormal_close(broker):
    """[MQTT-3.1.2-8]: the will is published when the connection closes without DISCONNECT, with its
    properties (delay interval excluded)."""
    topic = uniq("will")
    w = watcher(broker.port, topic)
    wprops = {PR.CONTENT_TYPE: "text/plain", PR.USER_PROPERTY: [("k", "v"), ("k", "w")],
              PR.RESPONSE_TOPIC: "will/reply", PR.CORRELATION_DATA: b"\x01"}
    c = connect(broker.port, will=P.Will(topic, b"gone", 1, False, wprops))
    c.close()
    m = recv_publish(w)
    assert (m.topic, m.payload, m.qos) == (topic, b"gone", 1)
    assert props(m) == wprops
    ack(w, m)
    bye(w)


# ---------------------------------------------------------------- the socket path gives the same bytes

def test_connect_raw_v5_encoding_roundtrip(broker):
    """Sanity: the CONNECT forged by connect_bytes() is accepted through a socket as through the
    core (the negative cases forging one field each are in tests/unit/test_core_connect.py)."""
    got = raw_connect_bytes(broker.port, connect_bytes(client_id=cid()) + encode(P.Disconnect()))
    assert got[0] == 0x20 and got[2:4] == b"\x00\x00", got

