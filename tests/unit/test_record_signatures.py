"""The broker's record signatures (kafka_client/headers.py H_SIG): the forwarder signs each record body
(kafka_client/record.py sign_body), the history job checks them on the decoded Fetch bytes
(sink/history/verify.py) and drops what is unsigned, signed with another key, or altered, so a
process that can reach Kafka cannot add or change history rows."""
from __future__ import annotations

import hmac
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_client.headers import signature_mac
from kafka_client.record import (
    SinkRecord,
    build_batch,
    encode_body,
    encode_record,
    entry_fields,
    sign_body,
    to_kafka,
)
from kafka_client.recordbatch import decode
from settings import secrets
from sink.history.verify import Verdicts, signed

KEY = secrets.derive(b"k" * 32, secrets.RECORDS)
KID = secrets.key_id(b"k" * 32)
H_SIG_NAME = b"mqtt.sig"
OTHER = secrets.derive(b"o" * 32, secrets.RECORDS)
OTHER_KID = secrets.key_id(b"o" * 32)


def rec(i: int, **kw) -> SinkRecord:
    return SinkRecord(topic=f"t/{i % 3}", payload=str(i).encode() * (i % 5), qos=i % 3, retain=False,
                      client_id=f"c{i}", username=None if i % 2 else f"u{i}", protocol=5,
                      accepted_at_ms=1_800_000_000_000 + i, message_id=f"p-{i:x}", **kw)


def signed_entry(r: SinkRecord, key=KEY, kid=KID, kafka_topic="mqtt.messages") -> tuple[int, bytes]:
    kt, ts, body = entry_fields(encode_record(r, kafka_topic))
    return ts, sign_body(body, kt, ts, signature_mac(key), kid)


def check(records: list[tuple[int, bytes]], topic="mqtt.messages"):
    d = decode(build_batch(records))
    v = Verdicts()
    return signed(d, topic, KEY, KID, v).tolist(), v


def test_signed_records_pass_and_keep_their_contract_headers():
    recs = [rec(i, user_properties=[("a", "b")] if i % 4 == 0 else None) for i in range(12)]
    ok, v = check([signed_entry(r) for r in recs])
    assert ok == [True] * 12 and v.dropped == 0
    kt, ts, body = entry_fields(encode_record(recs[0], "mqtt.messages"))
    from kafka_client.record import decode_body
    key, value, headers = decode_body(sign_body(body, kt, ts, signature_mac(KEY), KID))
    assert headers[:-1] == to_kafka(recs[0])[2]           # the contract's headers, unchanged, then
    assert headers[-1][0] == "mqtt.sig" and len(headers[-1][1]) == 20 and headers[-1][1][:4] == KID


def test_the_signature_is_the_documented_hmac_of_topic_timestamp_and_record():
    """kafka_client/headers.py H_SIG: key id, then the first 16 bytes of HMAC-SHA256 over
    u16 topic length | topic | i64 timestamp | the record from its key up to the signature
    header, computed here with hmac.digest from the contract, not with the signer's code."""
    kt, ts, body = entry_fields(encode_record(rec(7, user_properties=[("a", "b")]), "mqtt.messages"))
    out = sign_body(body, kt, ts, signature_mac(KEY), KID)
    signed_part, sig = out[:-(len(H_SIG_NAME) + 2 + 20)], out[-20:]
    assert sig[:4] == KID
    expected = hmac.digest(KEY, struct.pack(">H", len(kt)) + kt + struct.pack(">q", ts) + signed_part,
                           "sha256")[:16]
    assert sig[4:] == expected


def test_unsigned_other_key_and_altered_records_are_dropped_and_told_apart():
    good = signed_entry(rec(1))
    unsigned = (rec(2).accepted_at_ms, encode_body(*to_kafka(rec(2))[:3]))
    other = signed_entry(rec(3), OTHER, OTHER_KID)
    ts, body = signed_entry(rec(4))
    forged_client = (ts, body.replace(b"c4", b"c9"))             # another mqtt.client_id
    forged_time = (ts + 1, body)                                  # another accept time
    ok, v = check([good, unsigned, other, forged_client, forged_time, good])
    assert ok == [True, False, False, False, False, True]
    assert (v.unsigned, v.other_key, v.forged) == (1, 1, 2)
    assert "another broker's key" in v.describe() and "another producer" in v.describe()


def test_a_record_moved_to_another_kafka_topic_is_dropped():
    ok, v = check([signed_entry(rec(1), kafka_topic="mqtt.a")], topic="mqtt.b")
    assert ok == [False] and v.forged == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=300), st.binary(max_size=20000),
                          st.lists(st.tuples(st.text(max_size=200), st.text(max_size=3000)), max_size=5)),
                min_size=1, max_size=8))
def test_any_sizes_verify(items):
    """Keys, payloads and properties of any length (varints of 1-3 bytes) sign and verify."""
    recs = [SinkRecord(topic=t, payload=p, qos=1, retain=False, client_id="c", username=None,
                       protocol=5, accepted_at_ms=1_800_000_000_000 + i, message_id=f"m{i}",
                       user_properties=props or None) for i, (t, p, props) in enumerate(items)]
    ok, v = check([signed_entry(r) for r in recs])
    assert all(ok) and v.dropped == 0
