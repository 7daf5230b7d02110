"""QoS 1 / QoS 2 flows in both directions, Receive Maximum, Maximum Packet Size, offline queues
and resend on session resume (MQTT 5.0 sections 4.3, 4.4, 4.9, 3.1.2.11, 3.3) through the
sans-I/O core: client bytes in, broker bytes out. Moved from tests/integration/test_flows.py,
which keeps a smoke set through sockets."""
from __future__ import annotations

import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from tests.sansio import (
    Client,
    ack,
    assert_served,
    bye,
    expect_disconnect,
    lose,
    make,
    nothing,
    props,
    publish,
    publish_ok,
    recv,
    recv_publish,
    recv_type,
    subscribe,
)

PERSIST = {PR.SESSION_EXPIRY_INTERVAL: 300}


def connect(b, client_id, level=P.MQTT_5, expect_present=None, clean_start=True,
            properties=None) -> Client:
    """A connected Client; asserts the CONNACK accepted the connection."""
    c = Client(b, level)
    a = c.connect(client_id, clean=clean_start, props=properties)
    assert a.reason_code == 0, f"CONNACK refused: {a!r}"
    if expect_present is not None:
        assert a.session_present is expect_present, a
    c.connack = a
    return c


def drain_acking(c: Client) -> list:
    """Read and acknowledge PUBLISHes until nothing more comes: (payload, qos, dup) each."""
    got = []
    while not nothing(c):
        m = recv_publish(c)
        got.append((m.payload, m.qos, m.dup))
        ack(c, m)
    return got


def test_qos1_both_directions():
    """4.3.2: PUBLISH QoS 1 -> PUBACK from the broker; the broker's QoS 1 PUBLISH carries a packet
    identifier, and after the client's PUBACK nothing is resent on the connection."""
    b, _ = make()
    sub = connect(b, "sub")
    subscribe(sub, "q1", qos=1)
    pub = connect(b, "pub")
    a = publish_ok(pub, "q1", b"one", qos=1, pid=77)
    assert (a.type, a.reason_code) == (P.PUBACK, 0)
    m = recv_publish(sub)
    assert (m.qos, m.dup, m.payload) == (1, False, b"one") and m.packet_id
    sub.send(P.Ack(P.PUBACK, m.packet_id))
    assert nothing(sub) and not sub.conn.session.inflight_out
    # the packet identifier can be reused once acknowledged (2.2.1)
    publish_ok(pub, "q1", b"two", qos=1, pid=77, expect_code=0)
    m2 = recv_publish(sub)
    assert m2.payload == b"two"
    ack(sub, m2)


def test_qos2_both_directions():
    """4.3.3: PUBLISH -> PUBREC -> PUBREL -> PUBCOMP inbound; PUBLISH -> PUBREC -> PUBREL ->
    PUBCOMP outbound, with the broker's PUBREL for the same packet identifier."""
    b, _ = make()
    sub = connect(b, "sub")
    subscribe(sub, "q2", qos=2)
    pub = connect(b, "pub")
    publish(pub, "q2", b"exactly", qos=2, pid=300)
    rec = recv_type(pub, P.PUBREC)
    assert (rec.packet_id, rec.reason_code) == (300, 0)
    m = recv_publish(sub)
    assert (m.qos, m.payload, m.dup) == (2, b"exactly", False)
    pub.send(P.Ack(P.PUBREL, 300))
    comp = recv_type(pub, P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (300, 0)
    sub.send(P.Ack(P.PUBREC, m.packet_id))
    rel = recv_type(sub, P.PUBREL)
    assert (rel.packet_id, rel.reason_code) == (m.packet_id, 0)
    sub.send(P.Ack(P.PUBCOMP, m.packet_id))
    assert nothing(sub) and nothing(pub)
    assert not sub.conn.session.inflight_out and not pub.conn.session.inflight_in


def test_qos2_exactly_once_repeat_before_pubrel():
    """[MQTT-4.3.3-10]: a QoS 2 PUBLISH repeated (DUP=1) before PUBREL is acknowledged again but not
    delivered twice; after PUBCOMP the same packet identifier is a new message."""
    b, _ = make()
    sub = connect(b, "sub")
    subscribe(sub, "q2once", qos=2)
    pub = connect(b, "pub")
    publish(pub, "q2once", b"m", qos=2, pid=5)
    assert recv_type(pub, P.PUBREC).packet_id == 5
    for _ in range(2):
        publish(pub, "q2once", b"m", qos=2, pid=5, dup=True)
        rec = recv_type(pub, P.PUBREC)
        assert (rec.packet_id, rec.reason_code) == (5, 0)
    m = recv_publish(sub)
    assert m.payload == b"m"
    ack(sub, m)
    assert nothing(sub), "QoS 2 message delivered twice"
    pub.send(P.Ack(P.PUBREL, 5))
    assert recv_type(pub, P.PUBCOMP).reason_code == 0
    publish_ok(pub, "q2once", b"m2", qos=2, pid=5)
    m = recv_publish(sub)
    assert m.payload == b"m2"
    ack(sub, m)


def test_pubrel_unknown_packet_id_0x92():
    """4.3.3 / 3.7.2.1: PUBREL for a packet identifier not in use -> PUBCOMP 0x92; a second PUBREL
    after a completed flow too."""
    b, _ = make()
    c = connect(b, "c")
    c.send(P.Ack(P.PUBREL, 4242))
    comp = recv_type(c, P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (4242, rc.PACKET_IDENTIFIER_NOT_FOUND)
    publish_ok(c, "rel", b"x", qos=2, pid=9)
    c.send(P.Ack(P.PUBREL, 9))
    comp = recv_type(c, P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (9, rc.PACKET_IDENTIFIER_NOT_FOUND)


def test_qos2_ids_start_in_the_shared_read_only_empty_set():
    """A session awaits no PUBREL until its first QoS 2 PUBLISH: it shares NO_IDS, which stays
    empty (a write raises TypeError); the first QoS 2 PUBLISH gives the session its own set."""
    from broker.core.empties import NO_IDS
    b, _ = make()
    c = connect(b, "c")
    s = b.sessions["c"]
    assert s.inflight_in is NO_IDS
    with pytest.raises(TypeError):
        NO_IDS.add(1)
    publish(c, "ids", b"x", qos=2, pid=3)
    assert recv_type(c, P.PUBREC).reason_code == rc.NO_MATCHING_SUBSCRIBERS
    assert s.inflight_in == {3} and s.inflight_in is not NO_IDS and not NO_IDS
    c.send(P.Ack(P.PUBREL, 3))
    assert recv_type(c, P.PUBCOMP).reason_code == 0 and not s.inflight_in


def test_a_session_keeps_no_empty_replay_or_queue_once_they_are_sent():
    """Retained messages replayed for a SUBSCRIBE [MQTT-3.3.1-9] and messages queued beyond the
    client's Receive Maximum [MQTT-3.3.4-9] are sent in order; once both are sent the session
    holds no empty deque for them (624 bytes each, in every session that ever subscribed)."""
    from broker.core.empties import NOTHING
    b, _ = make()
    pub = connect(b, "pub")
    for i in range(3):
        publish_ok(pub, f"r/{i}", b"%d" % i, qos=1, pid=i + 1, retain=True)
    c = connect(b, "c", properties={PR.RECEIVE_MAXIMUM: 1})
    s = b.sessions["c"]
    subscribe(c, "r/#", qos=1)
    for i in range(3):
        publish_ok(pub, "r/0", b"q%d" % i, qos=1, pid=10 + i)   # queued behind the replay
    assert s.feeds is not NOTHING or s.queue is not NOTHING   # waiting for the window
    got = drain_acking(c)
    assert [p for p, _, _ in got] == [b"0", b"1", b"2", b"q0", b"q1", b"q2"]
    assert s.feeds is NOTHING and s.queue is NOTHING   # the shared read-only empty
    # and a later replay or queue makes its deque again
    publish_ok(pub, "r/0", b"q3", qos=1, pid=20)
    publish_ok(pub, "r/0", b"q4", qos=1, pid=21)
    assert [p for p, _, _ in drain_acking(c)] == [b"q3", b"q4"]
    assert s.queue is NOTHING


def test_pubrel_does_not_hide_an_error_of_the_store():
    """PUBREL's lookup is an explicit test, not `except AttributeError`: a store that fails while
    forgetting the id raises, rather than being answered as an unknown packet id (0x92)."""
    b, _ = make()
    c = connect(b, "c")
    publish(c, "ids", b"x", qos=2, pid=3)
    recv_type(c, P.PUBREC)

    class Broken:
        def qos2_remove(self, client_id, pid):
            raise AttributeError("a bug in the store")

    b.sessions["c"].store = Broken()
    with pytest.raises(AttributeError, match="a bug in the store"):
        c.conn.on_pubrel(P.Ack(P.PUBREL, 3))


def test_pubrec_unknown_packet_id_gets_pubrel_0x92():
    """3.6.2.1: PUBREC for a packet identifier the broker did not send -> PUBREL 0x92."""
    b, _ = make()
    c = connect(b, "c")
    c.send(P.Ack(P.PUBREC, 999))
    rel = recv_type(c, P.PUBREL)
    assert (rel.packet_id, rel.reason_code) == (999, rc.PACKET_IDENTIFIER_NOT_FOUND)
    c.send(P.PingReq())
    recv_type(c, P.PINGRESP)
    assert not c.conn.close_requested


def test_pubrec_error_ends_flow_and_frees_slot():
    """4.3.3 / [MQTT-3.3.4-9]: a PUBREC with a reason code >= 0x80 ends the QoS 2 flow (no PUBREL)
    and frees the Receive Maximum slot."""
    b, _ = make()
    c = connect(b, "c", properties={PR.RECEIVE_MAXIMUM: 1})
    subscribe(c, "recerr", qos=2)
    pub = connect(b, "pub")
    publish_ok(pub, "recerr", b"a", qos=2, pid=1)
    publish_ok(pub, "recerr", b"b", qos=2, pid=2)
    m = recv_publish(c)
    assert m.payload == b"a"
    assert nothing(c)  # Receive Maximum 1: "b" waits
    c.send(P.Ack(P.PUBREC, m.packet_id, rc.UNSPECIFIED_ERROR))
    m2 = recv_publish(c)  # no PUBREL for the refused one; the next message comes
    assert m2.payload == b"b"
    ack(c, m2)
    assert nothing(c)


@pytest.mark.parametrize("pub_qos,sub_qos", [(2, 1), (2, 0), (1, 0), (0, 2), (1, 2)])
def test_qos_downgrade_to_subscription(pub_qos, sub_qos):
    """[MQTT-3.8.4-8]: delivered at the minimum of the published QoS and the granted QoS."""
    b, _ = make()
    sub = connect(b, "sub")
    assert subscribe(sub, "down", qos=sub_qos).reason_codes == [sub_qos]
    pub = connect(b, "pub")
    publish_ok(pub, "down", b"d", qos=pub_qos)
    m = recv_publish(sub)
    assert m.qos == min(pub_qos, sub_qos)
    assert (m.packet_id is None) == (m.qos == 0)
    ack(sub, m)


def test_resend_unacknowledged_on_resume_with_dup():
    """[MQTT-4.4.0-1], [MQTT-3.3.1-1]: on resume the broker resends unacknowledged QoS 1 and QoS 2
    PUBLISHes with DUP=1 and the same packet identifiers, PUBREL for PUBREC'd ones, in the
    original order, then the queued messages."""
    b, _ = make()
    sub = connect(b, "me", properties=PERSIST)
    subscribe(sub, "resume", qos=2)
    pub = connect(b, "pub")
    publish_ok(pub, "resume", b"q1", qos=1, pid=1)
    publish_ok(pub, "resume", b"q2-norec", qos=2, pid=2)
    publish_ok(pub, "resume", b"q2-rec", qos=2, pid=3)
    first = [recv_publish(sub) for _ in range(3)]
    assert [(m.payload, m.dup) for m in first] == [(b"q1", False), (b"q2-norec", False),
                                                   (b"q2-rec", False)]
    sub.send(P.Ack(P.PUBREC, first[2].packet_id))
    assert recv_type(sub, P.PUBREL).packet_id == first[2].packet_id
    lose(sub)  # lose the connection with all three unfinished
    publish_ok(pub, "resume", b"queued", qos=1, pid=4)
    sub = connect(b, "me", clean_start=False, expect_present=True, properties=PERSIST)
    again = [recv(sub) for _ in range(4)]
    assert [(p.type, getattr(p, "packet_id", None)) for p in again[:3]] == [
        (P.PUBLISH, first[0].packet_id), (P.PUBLISH, first[1].packet_id),
        (P.PUBREL, first[2].packet_id)]
    assert [(m.payload, m.dup, m.qos) for m in again[:2]] == [(b"q1", True, 1), (b"q2-norec", True, 2)]
    assert again[3].type == P.PUBLISH and (again[3].payload, again[3].dup) == (b"queued", False)
    ack(sub, again[0])
    ack(sub, again[1])
    sub.send(P.Ack(P.PUBCOMP, again[2].packet_id))
    ack(sub, again[3])
    assert nothing(sub)
    bye(sub)
    # everything acknowledged: nothing is resent on the next resume
    sub = connect(b, "me", clean_start=False, expect_present=True)
    assert nothing(sub)


def test_offline_queue_delivered_in_order():
    """4.1: a persistent session queues QoS 1/2 messages while offline (not QoS 0 by default) and
    delivers them in order on reconnection."""
    b, _ = make()
    sub = connect(b, "me", properties=PERSIST)
    subscribe(sub, "queue", qos=2)
    bye(sub)
    pub = connect(b, "pub")
    for i in range(5):
        publish_ok(pub, "queue", b"m%d" % i, qos=(1, 2, 0, 1, 2)[i], pid=i + 1)
    sub = connect(b, "me", clean_start=False, expect_present=True)
    assert drain_acking(sub) == [(b"m0", 1, False), (b"m1", 2, False), (b"m3", 1, False),
                                 (b"m4", 2, False)]


def test_offline_queue_qos0_when_configured():
    """queue_qos0_messages=true: QoS 0 messages are queued for offline persistent sessions too."""
    b, _ = make(queue_qos0_messages=True)
    sub = connect(b, "me", properties=PERSIST)
    subscribe(sub, "queue0", qos=0)
    bye(sub)
    pub = connect(b, "pub")
    publish(pub, "queue0", b"zero", qos=0)
    publish_ok(pub, "queue0", b"one", qos=1)
    sub = connect(b, "me", clean_start=False, expect_present=True)
    assert [(m.payload, m.qos) for m in (recv_publish(sub), recv_publish(sub))] == \
        [(b"zero", 0), (b"one", 0)]


def test_offline_queue_limit_drops_newest():
    """max_queued_messages: when the queue is full the newest messages are dropped."""
    b, _ = make(max_queued_messages=3)
    sub = connect(b, "me", properties=PERSIST)
    subscribe(sub, "qlim", qos=1)
    bye(sub)
    pub = connect(b, "pub")
    for i in range(6):
        publish_ok(pub, "qlim", b"%d" % i, qos=1, pid=i + 1)
    sub = connect(b, "me", clean_start=False, expect_present=True)
    assert [p for p, _, _ in drain_acking(sub)] == [b"0", b"1", b"2"]


def test_resume_respects_new_receive_maximum():
    """[MQTT-3.3.4-9]: the Receive Maximum of the new connection limits the queued messages sent
    on resume; the rest follow in order as they are acknowledged."""
    b, _ = make()
    sub = connect(b, "me", properties=PERSIST)
    subscribe(sub, "qrm", qos=1)
    bye(sub)
    pub = connect(b, "pub")
    for i in range(4):
        publish_ok(pub, "qrm", b"%d" % i, qos=1, pid=i + 1)
    sub = connect(b, "me", clean_start=False, expect_present=True,
                  properties={PR.RECEIVE_MAXIMUM: 1, **PERSIST})
    got = []
    for _ in range(4):
        m = recv_publish(sub)
        assert nothing(sub), "more than Receive Maximum in flight"
        got.append(m.payload)
        ack(sub, m)
    assert got == [b"0", b"1", b"2", b"3"]


def test_inbound_maximum_packet_size_0x95():
    """[MQTT-3.2.2-15] / 4.13: the broker advertises Maximum Packet Size; a larger PUBLISH gets
    DISCONNECT 0x95 and is not delivered; a PUBLISH at the limit is accepted."""
    b, _ = make(maximum_packet_size=200)
    c = connect(b, "c")
    assert props(c.connack)[PR.MAXIMUM_PACKET_SIZE] == 200
    topic = "mps/" + "t" * 10
    sub = connect(b, "sub")
    subscribe(sub, topic, qos=1)
    # total size = 1 + 2 (remaining length) + 2 + len(topic) + 2 (pid) + 1 (props) + payload
    fits = 200 - (1 + 2 + 2 + len(topic) + 2 + 1)
    publish_ok(c, topic, b"f" * fits, qos=1, expect_code=0)
    assert recv_publish(sub).payload == b"f" * fits
    publish(c, topic, b"f" * (fits + 1), qos=1, pid=2)
    expect_disconnect(c, rc.PACKET_TOO_LARGE)
    assert nothing(sub)
    assert_served(b)


@pytest.mark.parametrize("qos", [0, 1])
def test_outbound_maximum_packet_size_not_sent(qos):
    """[MQTT-3.1.2-24]: a message larger than the client's Maximum Packet Size is not sent to it
    (other subscribers get it); the following smaller message is delivered."""
    b, _ = make()
    small = connect(b, "small", properties={PR.MAXIMUM_PACKET_SIZE: 100})
    big = connect(b, "big")
    subscribe(small, "cmps", qos=1)
    subscribe(big, "cmps", qos=1)
    pub = connect(b, "pub")
    publish_ok(pub, "cmps", b"L" * 150, qos=qos, pid=1)
    publish_ok(pub, "cmps", b"s", qos=qos, pid=2)
    m = recv_publish(small)
    assert m.payload == b"s"
    ack(small, m)
    assert nothing(small)
    assert [recv_publish(big).payload for _ in range(2)] == [b"L" * 150, b"s"]


def test_qos2_exactly_once_across_reconnect():
    """[MQTT-4.3.3-10], 4.4: a QoS 2 PUBLISH resent (DUP=1) after reconnecting, before PUBREL, is not
    delivered again; the PUBREL on the new connection completes the flow."""
    b, _ = make()
    sub = connect(b, "sub")
    subscribe(sub, "q2re", qos=2)
    pub = connect(b, "me", properties=PERSIST)
    publish(pub, "q2re", b"once", qos=2, pid=7)
    assert recv_type(pub, P.PUBREC).packet_id == 7
    lose(pub)
    pub = connect(b, "me", clean_start=False, expect_present=True, properties=PERSIST)
    publish(pub, "q2re", b"once", qos=2, pid=7, dup=True)
    assert recv_type(pub, P.PUBREC).packet_id == 7
    pub.send(P.Ack(P.PUBREL, 7))
    comp = recv_type(pub, P.PUBCOMP)
    assert (comp.packet_id, comp.reason_code) == (7, 0)
    m = recv_publish(sub)
    assert m.payload == b"once"
    ack(sub, m)
    assert nothing(sub), "delivered twice"


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_31])
def test_resend_on_resume_v311(level):
    """3.1.1 [MQTT-4.4.0-1]: a clean-session-0 client gets unacknowledged messages again with DUP=1
    (an MQTT 3.1 client too, whose CONNACK has no session present flag: its byte stays 0)."""
    b, _ = make()
    sub = Client(b, level)
    sub.connect("me", clean=False)
    subscribe(sub, "resume4", qos=1)
    pub = connect(b, "pub")
    publish_ok(pub, "resume4", b"again", qos=1)
    first = recv_publish(sub)
    assert first.dup is False
    lose(sub)
    sub = Client(b, level)
    assert sub.connect("me", clean=False).session_present is (level == P.MQTT_311)
    m = recv_publish(sub)
    assert (m.payload, m.dup, m.packet_id) == (b"again", True, first.packet_id)
    ack(sub, m)
    assert nothing(sub)


def test_resume_resends_within_smaller_receive_maximum_MQTT_3_3_4_9():
    """[MQTT-3.3.4-9]: on resume, unacknowledged messages are resent no faster than the
    client's (new) Receive Maximum allows; each acknowledgement releases the next one."""
    b, _ = make()
    sub = connect(b, "me", properties=PERSIST)
    subscribe(sub, "rm/small", qos=1)
    pub = connect(b, "pub")
    for i in range(3):
        publish(pub, "rm/small", b"%d" % i, qos=1, pid=i + 1)
        recv_type(pub, P.PUBACK)
    first = [recv_publish(sub) for _ in range(3)]
    lose(sub)
    again = connect(b, "me", clean_start=False, expect_present=True,
                    properties={**PERSIST, PR.RECEIVE_MAXIMUM: 1})
    got = []
    for expected in first:
        p = recv_publish(again)
        assert (p.packet_id, p.payload, p.dup) == (expected.packet_id, expected.payload, True)
        assert nothing(again)  # nothing more until this one is acknowledged
        again.send(P.Ack(P.PUBACK, p.packet_id))
        got.append(p.payload)
    assert got == [b"0", b"1", b"2"]
