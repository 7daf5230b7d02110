"""What the cluster writes to its messages topic and reads back (cluster/records.py)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.message import Message
from broker.protocol import properties as PR
from cluster import records as R
from kafka_client.record import SinkRecord, decode_body, encode_body, to_kafka

# MQTT strings: UTF-8 without U+0000 [MQTT-1.5.4-2]; topic names: no wildcards [MQTT-3.3.2-2]
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
topic_name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
                     min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(topic=topic_name, payload=st.binary(max_size=50), qos=st.integers(0, 2),
       retain=st.booleans(), username=st.none() | text, ups=st.lists(st.tuples(text, text), max_size=4),
       content_type=st.none() | text, corr=st.none() | st.binary(max_size=8),
       expiry=st.none() | st.integers(1, 10_000))
def test_a_message_crosses_the_log_with_every_property(topic, payload, qos, retain, username, ups,
                                                       content_type, corr, expiry):
    """[MQTT-3.3.2-18] user properties in order, content type, correlation data, QoS, retain,
    the publisher, and the expiry counted from the first acceptance [MQTT-3.3.2-6]; the record
    is the sink's record contract (the same bytes as to_kafka + encode_body) plus mqtt.node."""
    props = {}
    if ups:
        props[PR.USER_PROPERTY] = ups
    if content_type is not None:
        props[PR.CONTENT_TYPE] = content_type
    if corr is not None:
        props[PR.CORRELATION_DATA] = corr
    now = 1000.0
    msg = Message(topic, payload, qos, retain, props or None,
                  None if expiry is None else now + expiry, "dev-1", 1_700_000_000.5)
    body = R.message_body(msg, "dev-1", username, 5, "n1", "n1-x-1", now)
    key, value, headers = decode_body(body)
    rec = SinkRecord(topic=topic, payload=payload, qos=qos, retain=retain, client_id="dev-1",
                     username=username, protocol=5, accepted_at_ms=0, message_id="n1-x-1",
                     content_type=content_type, correlation_data=corr,
                     user_properties=ups or None, message_expiry=expiry)
    k2, v2, h2, _ = to_kafka(rec)
    assert body == encode_body(k2, v2, h2 + [(R.H_NODE, b"n1")])
    got, sender, node = R.decode_message(key, value, headers, 1_700_000_000_500, 2000.0,
                                         1_700_000_002.5)  # read 2 s after its acceptance
    assert (got.topic, got.payload, got.qos, got.retain, sender, node) == \
        (topic, payload, qos, retain, "dev-1", "n1")
    assert (got.props or {}) == props
    if expiry is None:
        assert got.expires_at is None
    else:
        assert abs(got.expires_at - (2000.0 + expiry - 2.0)) < 1e-6


# ------------------------------------------------------------------ malformed records
# Whatever bytes reach a node (a bug, another version, a process writing to Kafka): the decoders
# return what a node writes or raise records.Malformed, never anything else.
FIELDS = sorted({f for _, spec in R.CONTROL.values() for f in spec} |
                {"topic", "payload", "qos", "retain", "delay", "props", "subs", "pos", "inflight",
                 "next_pid", "qos2", "b", "38", "9", "1"})
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats() | text,
    lambda inner: st.lists(inner, max_size=4) |
    st.dictionaries(st.sampled_from(FIELDS) | text, inner, max_size=6),
    max_leaves=25)
records = st.fixed_dictionaries({"t": st.sampled_from(sorted(R.CONTROL)) | text},
                                optional={f: json_values for f in FIELDS if f != "t"})
WILL = {"topic": "w/t", "payload": "\xff", "qos": 1, "retain": False, "delay": 3, "expiry": 9,
        "props": {"38": [["a", "b"]], "9": {"b": "\x01"}, "1": 1}}
CHECKPOINT = {"subs": [["a/#", 1, 0, 1, 0, 5, {"0": 3}]], "pos": {"0": 7}, "inflight": [[0, 7, 1, 0]],
              "next_pid": 2, "qos2": [3], "expiry": 60, "user": None}
VALID = [  # one record of each kind as a node writes it (keys below)
    {"t": "join", "node": "n1", "inc": "i2", "seq": 1, "at": 5.0},
    {"t": "evict", "node": "n1", "inc": "i1", "by": "n1", "by_inc": "i1", "seq": 2, "at": 5.0},
    {"t": "claim", "node": "n1", "inc": "i1", "seq": 3, "req": "r", "clean": False, "expiry": 60,
     "will": WILL, "user": "u"},
    {"t": "state", "node": "n1", "inc": "i1", "seq": 4, "epoch": 1, "connected": False, "expiry": 60,
     "expires_at": 70.0, "will": WILL, "will_at": 3.0, "user": None, "session": CHECKPOINT,
     "final": True},
    {"t": "end", "node": "n1", "inc": "i1", "seq": 5, "epoch": 1, "fired": True},
    {"t": "ban", "node": "n1", "inc": "i1", "seq": 6, "kind": "clientid", "value": "x",
     "reason": "", "until": None, "at": 1.0, "by": "a"},
]


@st.composite
def mutated(draw):
    """A valid record with a few fields, at any depth, replaced by any JSON or left out."""
    rec = json.loads(json.dumps(draw(st.sampled_from(VALID))))
    for _ in range(draw(st.integers(1, 3))):
        d = rec
        while True:
            inner = [k for k, v in d.items() if isinstance(v, dict)] if isinstance(d, dict) else []
            if not inner or not draw(st.booleans()):
                break
            d = d[draw(st.sampled_from(inner))]
        if not d:
            break
        k = draw(st.sampled_from(sorted(d)))
        if draw(st.booleans()):
            del d[k]
        else:
            d[k] = draw(json_values)
    return rec


def key_of(rec: dict) -> bytes:
    t = rec.get("t")
    if t in ("join", "evict", "beat", "leave"):
        return b"n:" + str(rec.get("node")).encode()
    if t in ("ban", "unban"):
        return f"b:{rec.get('kind')}:{rec.get('value')}".encode()
    return b"c:x"


def test_the_valid_records_of_every_kind_decode_and_apply():
    for rec in VALID:
        k, got = R.decode_control(key_of(rec), json.dumps(rec).encode())
        assert got == rec
        _apply_everywhere(k, got)
keys = st.sampled_from([b"n:n1", b"c:x", b"b:clientid:x", b"", b"\xff", b"n:"]) | st.binary(max_size=12)


def _apply_everywhere(key: str, rec: dict | None) -> None:
    """What reads a decoded control record: ControlState.apply, and the will decoder."""
    from cluster import control as C
    state = C.ControlState("n1", "i1", lambda: 0.0)
    state.apply(0, "n:n1", C.node_record("join", "n1", "i1"), 0.0)
    state.apply(1, key, rec, 0.0)
    if rec and rec.get("will"):
        R.will_message(rec["will"], "x", 0.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(key=st.none() | keys, value=st.none() | st.binary(max_size=200))
def test_any_bytes_decode_to_a_control_record_or_malformed(key, value):
    try:
        k, rec = R.decode_control(key, value)
    except R.Malformed:
        return
    _apply_everywhere(k, rec)


@settings(max_examples=300, deadline=None)
@given(rec=records | json_values | mutated(), key=st.none() | keys)
def test_any_json_decodes_to_a_control_record_or_malformed(rec, key):
    """Valid records with fields changed to any JSON, objects with the fields of every kind, any
    other JSON: either a record a node writes, which applies without an error, or Malformed."""
    if key is None and isinstance(rec, dict):
        key = key_of(rec)
    try:
        k, got = R.decode_control(key, json.dumps(rec).encode())
    except R.Malformed:
        return
    _apply_everywhere(k, got)


HEADERS = [R.H_NODE, "mqtt.client_id", "mqtt.qos", "mqtt.retain", "mqtt.message_expiry",
           "mqtt.payload_format", "mqtt.content_type", "mqtt.response_topic",
           "mqtt.correlation_data", "mqtt.user.a", "mqtt.user.\x00"]


@settings(max_examples=200, deadline=None)
@given(key=st.none() | st.binary(max_size=20) | text.map(str.encode),
       value=st.none() | st.binary(max_size=20),
       headers=st.lists(st.tuples(st.sampled_from(HEADERS) | text,
                                  st.none() | st.binary(max_size=12) |
                                  st.sampled_from([b"0", b"1", b"2", b"3", b"-1", b"4294967296"])),
                        max_size=6))
def test_any_messages_record_decodes_to_a_message_or_malformed(key, value, headers):
    try:
        msg, _, _ = R.decode_message(key, value, headers, 1_700_000_000_000, 0.0, 1_700_000_000.0)
    except R.Malformed:
        return
    assert R.topic_problem(msg.topic) is None and msg.qos in (0, 1, 2)
