"""SinkRecord <-> Kafka record and spool entry encodings."""
import pytest

from kafka_client.record import (
    SinkRecord,
    decode_entry,
    encode_entry,
    encode_record,
    entry_timestamp,
    from_kafka,
    sink_record,
    to_kafka,
)


def full_record(**kw):
    base = dict(topic="sensors/ä/1", payload=bytes(range(256)) * 3, qos=2, retain=True, client_id="cli-1",
                username="bob", protocol=5, accepted_at_ms=1_700_000_000_123, payload_format=1,
                content_type="application/json", response_topic="resp/x", correlation_data=b"\x00\xffcorr",
                message_expiry=3600,
                user_properties=[("k", "v1"), ("k", "v2"), ("ünï", "çödé"), ("empty", ""), ("k", "v1")],
                message_id="abc-1")
    base.update(kw)
    return SinkRecord(**base)


def test_to_kafka_contract():
    rec = full_record()
    key, value, headers, ts = to_kafka(rec)
    assert key == "sensors/ä/1".encode()
    assert value == rec.payload
    assert ts == rec.accepted_at_ms
    assert headers == [
        ("mqtt.message_id", b"abc-1"), ("mqtt.client_id", b"cli-1"), ("mqtt.username", b"bob"),
        ("mqtt.qos", b"2"), ("mqtt.retain", b"1"), ("mqtt.protocol", b"5"),
        ("mqtt.payload_format", b"1"), ("mqtt.content_type", b"application/json"),
        ("mqtt.response_topic", b"resp/x"), ("mqtt.correlation_data", b"\x00\xffcorr"),
        ("mqtt.message_expiry", b"3600"),
        ("mqtt.user.k", b"v1"), ("mqtt.user.k", b"v2"), ("mqtt.user.ünï", "çödé".encode()),
        ("mqtt.user.empty", b""), ("mqtt.user.k", b"v1")]


def test_sink_record_takes_each_mqtt5_property_by_its_identifier():
    """The record of an accepted message (the sink's and the cluster's): every MQTT 5 property
    the contract carries lands in its field, by the identifiers of MQTT 5 section 2.2.2.2."""
    from broker.protocol import properties as PR
    props = {PR.PAYLOAD_FORMAT_INDICATOR: 1, PR.CONTENT_TYPE: "application/json",
             PR.RESPONSE_TOPIC: "resp/x", PR.CORRELATION_DATA: b"\x00\xffcorr",
             PR.USER_PROPERTY: [("k", "v1"), ("k", "v2"), ("ünï", "çödé"), ("empty", ""), ("k", "v1")],
             PR.TOPIC_ALIAS: 3}
    rec = sink_record("sensors/ä/1", bytes(range(256)) * 3, 2, True, "cli-1", "bob", 5,
                      1_700_000_000_123, props, 3600)
    rec.message_id = "abc-1"
    assert rec == full_record()
    bare = sink_record("a", b"", 0, False, "", None, 4, 5, None, None)
    assert bare == SinkRecord(topic="a", payload=b"", qos=0, retain=False, client_id="", username=None,
                              protocol=4, accepted_at_ms=5)


def test_minimal_record_has_only_mandatory_headers():
    rec = SinkRecord(topic="a", payload=b"", qos=0, retain=False, client_id="", username=None, protocol=4,
                     accepted_at_ms=5, message_id="m")
    key, value, headers, ts = to_kafka(rec)
    assert [h[0] for h in headers] == ["mqtt.message_id", "mqtt.client_id", "mqtt.qos", "mqtt.retain",
                                       "mqtt.protocol"]
    assert from_kafka(key, value, headers, ts) == rec


@pytest.mark.parametrize("rec", [
    full_record(),
    full_record(username=None, user_properties=None, correlation_data=b"", payload=b""),
    full_record(protocol=3, qos=0, retain=False, payload_format=0, message_expiry=0),
])
def test_round_trip(rec):
    assert from_kafka(*to_kafka(rec)) == rec


def test_spool_entry_round_trip():
    rec = full_record()
    key, value, headers, ts = to_kafka(rec)
    buf = encode_entry("mqtt.other", key, value, headers, ts)
    assert decode_entry(buf) == ("mqtt.other", key, value, headers, ts)
    assert entry_timestamp(buf) == ts
    assert encode_record(rec, "mqtt.other") == buf
    for cut in (1, 10, len(buf) - 1):
        with pytest.raises(ValueError):
            decode_entry(buf[:cut])


# ---- the broker's cached encoder gives the same bytes --------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kafka_client.record import MessageEncoder, encode_message  # noqa: E402

_text = st.text(max_size=20)
_message = st.tuples(
    st.sampled_from(["mqtt.messages", "other.topic"]), _text,          # Kafka topic, MQTT topic
    st.one_of(st.binary(max_size=300), st.binary(min_size=8190, max_size=8200)),  # varint 2/3 bytes
    st.integers(0, 3), st.booleans(), _text, st.one_of(st.none(), _text),  # qos (3: no ready run)
    st.sampled_from([3, 4, 5, 6]), st.integers(0, 2**53),              # protocol, timestamp
    st.text(alphabet="0123456789abcdef-", min_size=0, max_size=70))  # message id (length varint)


@settings(max_examples=300, deadline=None)
@given(st.lists(_message, min_size=1, max_size=12), st.integers(1, 4))
def test_message_encoder_matches_encode_message(messages, cache_size):
    """Cache hits, misses and a cache starting over (max_entries 1..4) all give the bytes of
    encode_message(); the caches never hold more than max_entries."""
    enc = MessageEncoder(max_entries=cache_size)
    for m in messages + messages:  # the second pass hits the caches
        *head, mid = m
        assert enc.encode(*head, mid.encode()) == encode_message(*head, mid)
    assert max(len(enc._keys), len(enc._senders), len(enc._kts)) <= cache_size
