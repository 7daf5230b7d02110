"""What the cluster writes to its messages topic and reads back (cluster/records.py)."""
from __future__ import annotations

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
