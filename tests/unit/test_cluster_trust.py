"""What a cluster node accepts from its Kafka topics (cluster/node.py ClusterNode._apply,
cluster/trust.py, cluster/records.py): only records signed with the cluster's key, as the sink's
forwarder signs its records (kafka_client/headers.py H_SIG), and only records whose content a
node could have written; anything else is ignored and counted, never applied, never delivered,
and never stops the node. Bans travel as control records and apply on every node."""
from __future__ import annotations

import itertools
import json
import time

import pytest

from broker.admin.bans import BanList
from broker.core.message import Message
from cluster import control as C
from cluster import records as R
from cluster.node import ClusterNode
from cluster.trust import Trust
from kafka_client.record import encode_body
from settings import ClusterConfig
from tests.sansio import Client, expect_disconnect, make, nothing, recv_publish
from tests.unit.test_cluster_reading import IDS, KEY, PROPS, TS, body, client, fetched

OTHER_KEY = b"o" * 32
CONTROL = "mqtt.cluster.control"
MESSAGES = "mqtt.cluster.messages"


@pytest.fixture
def node():
    broker, _ = make()
    n = ClusterNode(ClusterConfig(enabled=True, node_id="n2"), "127.0.0.1:1", wall=lambda: 1000.0,
                    key=KEY)
    n.attach(broker)
    n.routed_upto = {0: 0}
    n.state = C.ControlState("n2", n.inc, time.monotonic)
    return n


SEQ = itertools.count(1)


def control(key: str, rec: object) -> bytes:
    """A control record body (value: JSON of `rec`, numbered as a node numbers its records, or
    these bytes as they are)."""
    if isinstance(rec, dict) and "seq" not in rec:
        rec = {**rec, "seq": next(SEQ)}
    value = rec if isinstance(rec, bytes) else json.dumps(rec).encode()
    return encode_body(key.encode(), value, [])


def apply_control(node: ClusterNode, bodies: list[bytes], key: bytes | None = KEY,
                  base: int = 0) -> None:
    node._apply([(CONTROL, 0, fetched(bodies, base, CONTROL, key), base)])


def raw(key: bytes, value: bytes | None) -> bytes:
    """A messages or retained record body with these bytes as its key and value (numbered as a
    node numbers them)."""
    from cluster.produce import _tombstone
    headers = [("mqtt.message_id", f"n1-i1-{next(IDS)}".encode())]
    return _tombstone(key, headers) if value is None else encode_body(key, value, headers)


def join(node_id: str, inc: str = "i1") -> bytes:
    return control(f"n:{node_id}", C.node_record("join", node_id, inc, at=999.0))


def claim(node_id: str, inc: str, cid: str) -> bytes:
    return control(f"c:{cid}", C.claim_record(node_id, inc, "r1", True, 0, None, None))


# ------------------------------------------------------------------ signatures
def test_messages_signed_by_a_node_are_delivered_and_others_ignored_and_counted(node):
    """A process with access to Kafka but not the cluster's key cannot publish to the node's
    subscribers: a record without a signature, one signed with another key and one altered
    after signing are dropped, each counted by reason."""
    sub = client(node, "sub", "t/#")
    good = Trust(KEY).sign(MESSAGES, body("t/1", b"signed"), TS)
    altered = good.replace(b"signed", b"forged")
    unsigned = body("t/2", b"unsigned")
    other = Trust(OTHER_KEY).sign(MESSAGES, body("t/3", b"other key"), TS)
    node._apply([(MESSAGES, 0, fetched([unsigned, other, altered, good], 0, key=None), 0)])
    assert recv_publish(sub).payload == b"signed"
    assert nothing(sub)
    stats = node.stats()["cluster"]
    assert (stats["ignored_unsigned"], stats["ignored_other_key"], stats["ignored_forged"]) == \
        (1, 1, 1)
    assert node.counters["delivered"] == 1


def test_an_unsigned_claim_does_not_disconnect_the_client(node):
    """A forged claim on a client id connected here would take it over [MQTT-3.1.4-3]: unsigned,
    it is not applied and the client stays connected."""
    apply_control(node, [join("n2", node.inc)])
    c = Client(node.broker)
    c.connect("victim")
    apply_control(node, [claim("n2", node.inc, "victim")], base=1)  # (the node's own claim)
    owner = node.state.clients["victim"]
    apply_control(node, [join("evil"), claim("evil", "i1", "victim")], key=None, base=2)
    assert node.state.clients["victim"] is owner and "evil" not in node.state.members
    assert nothing(c) and node.broker.sessions["victim"].connection is not None
    assert node.trust.ignored["unsigned"] == 2


def test_an_unsigned_join_does_not_evict_a_node(node):
    """A join of a new incarnation of a node ends the old one (its clients dropped): unsigned,
    it is ignored; signed with the cluster's key, it is applied."""
    apply_control(node, [join("n1", "first")])
    apply_control(node, [join("n1", "forged")], key=None, base=1)
    apply_control(node, [join("n1", "forged")], key=OTHER_KEY, base=2)
    assert node.state.members["n1"].inc == "first" and node.state.members["n1"].alive
    assert node.trust.ignored["unsigned"] == 1 and node.trust.ignored["other_key"] == 1
    apply_control(node, [join("n1", "second")], base=3)
    assert node.state.members["n1"].inc == "second"


def test_every_record_a_node_writes_is_signed_and_reads_back_as_its_own():
    """The node signs in one place (the producer): whatever it writes passes its own check."""
    t = Trust(KEY)
    for topic, b in ((MESSAGES, body("a/b", b"x", 2)), (CONTROL, control("n:n1", {"t": "beat"}))):
        signed = t.sign(topic, b, TS)
        assert t.check(topic, signed, TS) is None
        assert t.check("another.topic", signed, TS) == "forged"
        assert t.check(topic, signed, TS + 1) == "forged"
        assert Trust(OTHER_KEY).check(topic, signed, TS) == "other_key"
        assert t.check(topic, b, TS) == "unsigned"


def test_ignored_records_are_logged_at_most_every_ten_seconds(caplog):
    now = [0.0]
    t = Trust(KEY, clock=lambda: now[0])
    with caplog.at_level("WARNING", "cluster"):
        for _ in range(50):
            t.ignore("unsigned", "mqtt.cluster.control offset 1")
        now[0] = 11.0
        t.ignore("forged", "mqtt.cluster.control offset 2")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "1 without a signature" in lines[0]
    assert "49 without a signature" in lines[1] and "1 with a signature that does not match" in lines[1]
    assert t.ignored["unsigned"] == 50


def test_a_signed_record_written_again_is_not_applied_again(node):
    """Anyone who reads Kafka can copy a node's signed records: an old incarnation's join written
    again does not end the live one (its clients dropped), a claim written again does not take
    the client id from its newer owner, and a producer's retried record applies once."""
    old_join = join("n1", "first")
    apply_control(node, [old_join, join("n1", "second")])
    first_claim = claim("n1", "second", "dev")
    apply_control(node, [first_claim, claim("n3", "x", "dev")], base=2)  # (n3 is not a member)
    epoch = node.state.clients["dev"].epoch
    apply_control(node, [old_join, first_claim, first_claim], base=4)
    assert node.state.members["n1"].inc == "second" and node.state.members["n1"].alive
    assert node.state.clients["dev"].epoch == epoch
    assert node.trust.ignored["replayed"] == 3


def test_a_message_or_retained_record_written_again_is_not_applied_again(node):
    """A copy of a node's signed message is not delivered a second time; a copy of an older
    retained message (or of a deletion) does not replace the newer one."""
    sub = client(node, "sub", "t/#")
    m = body("t/1", b"once")
    node._apply([(MESSAGES, 0, fetched([m, body("t/2", b"next")], 0), 0)])
    node._apply([(MESSAGES, 0, fetched([m], 2), 2)])
    assert [recv_publish(sub).payload for _ in range(2)] == [b"once", b"next"] and nothing(sub)
    retained = node.topics.retained
    old, new, r2 = body("r/1", b"old"), body("r/1", b"new"), body("r/2", b"x")
    gone = raw(b"r/2", None)  # (numbered in the order written)
    node._apply([(retained, 0, fetched([old, new, r2, gone], 0, retained), 0)])
    node._apply([(retained, 0, fetched([old, body("r/3", b"y"), gone], 4, retained), 4)])
    kept = {t: bytes(m.payload) for t, m in ((t, node.broker.retained.get(t)) for t in
                                             ("r/1", "r/2", "r/3")) if m is not None}
    assert kept == {"r/1": b"new", "r/3": b"y"}
    assert node.trust.ignored["replayed"] == 3


# ------------------------------------------------------------------ malformed records
@pytest.mark.parametrize("value", [b"[]", b"null", b"7", b'"s"', b"{}", b"not json", b"\xff\xfe",
                                   b'{"t": "claim"}', b'{"t": "join", "node": 1, "inc": "x"}',
                                   b"[" * 100_000, b'{"t": "state", "node": "n1", "inc": "i"}',
                                   b'{"t": "evict", "node": "n2", "inc": "i", "by": null}',
                                   b" " * (R.MAX_CONTROL_BYTES + 1)])
def test_a_malformed_control_record_is_skipped_and_counted_and_the_next_applied(node, value):
    """A control record of any other shape than a node writes (here signed with the cluster's
    key: a node of another version, or a bug) is skipped and counted; the records after it are
    applied."""
    apply_control(node, [encode_body(b"n:n2", value, []), join("n1")])
    assert node.trust.ignored["malformed"] == 1
    assert node.state.members["n1"].alive


def test_a_message_whose_topic_a_publish_could_not_carry_is_not_delivered(node):
    """[MQTT-4.7.3-2] no U+0000, [MQTT-3.3.2-2] no wildcard, mqtt.max_topic_length: a record
    with such a topic is dropped and counted, never delivered, even signed."""
    sub = client(node, "sub", "#")
    limit = node.broker.cfg.max_topic_length
    bad = [raw(b"a\x00b", b"nul"), body("a/+", b"wild"), body("x" * (limit + 1)),
           raw(b"\xff", b"not utf-8"), raw(b"a/c", b"no headers at all")[:-1] + b"\x00"]
    node._apply([(MESSAGES, 0, fetched(bad + [body("a/ok", b"fine")]), 0)])
    assert recv_publish(sub).payload == b"fine"
    assert nothing(sub)
    assert node.trust.ignored["malformed"] == 5


def test_a_retained_record_with_a_bad_topic_is_not_kept(node):
    node._apply([(node.topics.retained, 0, fetched([raw(b"r\x00", b"v")],
                                                   topic=node.topics.retained), 0)])
    assert node.broker.retained_count() == 0 and node.trust.ignored["malformed"] == 1


# ------------------------------------------------------------------ bans
def test_a_ban_made_through_another_node_refuses_and_disconnects_the_client_here(node, tmp_path):
    """A ban is a control record: every node adds it to its list and disconnects the clients it
    covers (0x98); its CONNECTs are refused (0x8A Banned); an unban record lifts it."""
    bans = BanList(str(tmp_path / "bans.json"))
    node.share_bans(bans)
    node.broker.bans = bans.check
    c = Client(node.broker)
    c.connect("dev-7")
    ban = {"kind": "clientid", "value": "dev-7", "reason": "stolen", "until": None, "at": 1.0,
           "by": "admin"}
    apply_control(node, [control(R.ban_key("clientid", "dev-7"), C.ban_record("n1", "i1", ban))])
    expect_disconnect(c, 0x98)
    again = Client(node.broker)
    assert again.connect("dev-7").reason_code == 0x8A
    assert BanList(str(tmp_path / "bans.json")).check("dev-7", None, "127.0.0.1:1")  # kept
    apply_control(node, [control(R.ban_key("clientid", "dev-7"),
                                 C.unban_record("n1", "i1", "clientid", "dev-7"))], base=1)
    assert Client(node.broker).connect("dev-7").reason_code == 0


def test_a_ban_made_here_is_written_to_the_control_topic(node, tmp_path):
    bans = BanList(str(tmp_path / "bans.json"))
    node.share_bans(bans)
    written = []
    node._send = lambda topic, key, value, **kw: written.append(  # type: ignore[method-assign]
        R.decode_control(key, value))

    class Producer:
        def kick(self):
            pass
    node.producer = Producer()  # type: ignore[assignment]
    bans.add("username", "mallory", "spam", None, "admin")
    bans.remove("username", "mallory")
    # (decode_control: what the other nodes will accept)
    assert [(k, r["t"]) for k, r in written] == [("b:username:mallory", "ban"),
                                                 ("b:username:mallory", "unban")]


def test_a_message_of_a_will_in_a_control_record_keeps_its_fields():
    """The decoded will is what records.will_message reads; its delay is kept."""
    from broker.protocol import packets as P
    from broker.protocol import properties as PR
    will = P.Will("w/t", b"\x00\xffbye", 1, True, {PR.WILL_DELAY_INTERVAL: 5,
                                                    PR.USER_PROPERTY: [("k", "v")],
                                                    PR.CORRELATION_DATA: b"\x01"})
    rec = {**C.claim_record("n1", "i", "r", False, 60, R.will_to_dict(will, 0.0), "u"), "seq": 1}
    k, got = R.decode_control(b"c:x", R.dumps(rec))
    msg = R.will_message(got["will"], "x", 0.0, 0.0)
    assert isinstance(msg, Message) and msg.payload == b"\x00\xffbye" and msg.retain
    assert got["will"]["delay"] == 5


def test_a_record_read_by_another_client_checks_as_its_raw_bytes():
    """Session rebuilds and $share streams read with kafka-python (decoded fields): the fields
    re-encode to the bytes the node signed, tombstones included."""
    from cluster.produce import _tombstone
    from kafka_client.record import decode_body
    t = Trust(KEY)
    signed = t.sign(MESSAGES, body("a/b", b"x" * 300, 2, PROPS, 60), TS)
    key, value, headers = decode_body(signed)
    assert t.check_fields(MESSAGES, key, value, headers, TS) is None
    assert t.check_fields(MESSAGES, key, value + b"!", headers, TS) == "forged"
    tomb = t.sign(MESSAGES, _tombstone(b"r/t"), TS)
    assert t.check_fields(MESSAGES, b"r/t", None, [("mqtt.sig", tomb[-20:])], TS) is None


def test_a_fetch_whose_batch_is_corrupt_is_skipped_and_counted(node):
    """A record batch that holds fewer records than its header says (written by a raw client):
    its records are skipped, counted, and the node reads on."""
    import struct

    from kafka_client.record import build_batch
    from kafka_client.recordscan import Scanned
    raw = bytearray(build_batch([(TS, Trust(KEY).sign(CONTROL, join("n1"), TS))]))
    struct.pack_into(">i", raw, 57, 2)  # the batch's record count
    for topic in (CONTROL, node.topics.retained, MESSAGES):
        client(node, "sub", "#")
        node._apply([(topic, 0, Scanned(bytes(raw)), 0)])
    assert node.trust.ignored["malformed"] == 3
    apply_control(node, [join("n1")])
    assert node.state.members["n1"].alive
