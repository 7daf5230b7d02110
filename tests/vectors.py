"""Byte fixtures shared by the codec tests, the sans-I/O core tests and the fuzzer's seed corpus.

Each Vector is literal wire bytes (written out by hand from the spec, or captured: the
seeds/003 article's Wireshark dumps), never produced by our own encoder, so the codec is
checked against the spec rather than against itself:
- valid vectors carry the packet object they decode to, and whether our encoder produces
  exactly these bytes (`canonical`: False where the wire allows several forms, e.g. the
  long form of a success PUBCOMP, 3.7.2.1);
- malformed vectors carry the error the decoder reports and its MQTT 5 reason code (which
  a v5 connection gets in its DISCONNECT, 4.13; a 3.1.1 connection is closed).
`rule` names the spec statement a vector exercises ("(3.1.1)": numbered as in MQTT 3.1.1).
"""
from __future__ import annotations

from dataclasses import dataclass

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.errors import MalformedPacket, ProtocolError

V3, V4, V5 = P.MQTT_31, P.MQTT_311, P.MQTT_5
O = P.SubscriptionOptions


def h(s: str) -> bytes:
    return bytes.fromhex(" ".join(s.split()))


@dataclass(frozen=True)
class Vector:
    name: str
    level: int              # the connection's protocol level when the bytes arrive
    data: bytes
    packet: object = None   # what it decodes to (None: malformed)
    canonical: bool = True  # encode(packet, level) == data
    error: type | None = None
    reason: int | None = None  # the error's reason code
    rule: str = ""
    captured: bool = False  # real wire data (seeds/003)

    @property
    def malformed(self) -> bool:
        return self.error is not None

    def __repr__(self):  # pytest ids
        return self.name


def ok(name, level, data, packet, canonical=True, rule="", captured=False) -> Vector:
    return Vector(name, level, data, packet, canonical, rule=rule, captured=captured)


def bad(name, level, data, error, reason, rule="") -> Vector:
    return Vector(name, level, data, None, False, error, reason, rule)


def _publish_of_length(first: int, remaining: int, level: int = V5) -> bytes:
    """A QoS 0 PUBLISH on topic "t" whose Remaining Length is `remaining` (edge lengths, 1.5.5)."""
    head = h("00 01 74") + (b"\x00" if level == V5 else b"")
    n, vbi = remaining, bytearray()
    while True:
        n, d = divmod(n, 128)
        vbi.append(d | (0x80 if n else 0))
        if not n:
            break
    return bytes((first,)) + bytes(vbi) + head + b"x" * (remaining - len(head))


def _edge(level: int, remaining: int, vbi: str) -> Vector:
    data = _publish_of_length(0x30, remaining, level)
    assert data[1:1 + len(h(vbi))] == h(vbi)
    n = remaining - (4 if level == V5 else 3)
    return ok(f"publish_v{level}_remaining_{remaining}", level, data, P.Publish("t", b"x" * n),
              rule="1.5.5")


_CAPTURED_PUBLISH = h("""30 31 00 07 72 65 71 75 65 73 74 10 02 00 00 01 2c 08 00 08
72 65 73 70 6f 6e 73 65 54 68 69 73 20 69 73 20 61 20 51 6f
53 20 30 20 6d 65 73 73 61 67 65""")



def _seed_publish(qos: int, packet_id: int) -> bytes:
    d = _CAPTURED_PUBLISH
    return bytes((0x30 | qos << 1, d[1] + 2)) + d[2:11] + packet_id.to_bytes(2, "big") + d[11:]


VALID = [
    # ---- captured MQTT 5.0 bytes (/work/shared/seeds/003_*.txt)
    ok("seed_publish_qos0_expiry_response_topic", V5, _CAPTURED_PUBLISH,
       P.Publish("request", b"This is a QoS 0 message", 0, False, False, None,
                 {PR.MESSAGE_EXPIRY_INTERVAL: 300, PR.RESPONSE_TOPIC: "response"}), captured=True),
    ok("seed_puback_no_matching_subscribers", V5, h("40 04 64 4a 10 00"),
       P.Ack(P.PUBACK, 0x644A, rc.NO_MATCHING_SUBSCRIBERS), captured=True),
    ok("seed_pubrec_no_matching_subscribers", V5, h("50 04 11 c2 10 00"),
       P.Ack(P.PUBREC, 0x11C2, rc.NO_MATCHING_SUBSCRIBERS), captured=True),
    # the seeds/003 exchanges at QoS 1 and 2 ("32 33 00 ..", "34 33 00 ..": the captured PUBLISH
    # with the packet identifier its PUBACK / PUBREC carries)
    ok("seed_publish_qos1", V5, _seed_publish(1, 0x644A),
       P.Publish("request", b"This is a QoS 0 message", 1, False, False, 0x644A,
                 {PR.MESSAGE_EXPIRY_INTERVAL: 300, PR.RESPONSE_TOPIC: "response"})),
    ok("seed_publish_qos2", V5, _seed_publish(2, 0x11C2),
       P.Publish("request", b"This is a QoS 0 message", 2, False, False, 0x11C2,
                 {PR.MESSAGE_EXPIRY_INTERVAL: 300, PR.RESPONSE_TOPIC: "response"})),
    # success with an explicit reason code: we send the short form (3.6.2.1, 3.7.2.1)
    ok("seed_pubrel", V5, h("62 03 11 c2 00"), P.Ack(P.PUBREL, 0x11C2), canonical=False,
       captured=True),
    ok("seed_pubcomp", V5, h("70 04 11 c2 00 00"), P.Ack(P.PUBCOMP, 0x11C2), canonical=False,
       captured=True),

    # ---- CONNECT (3.1)
    ok("connect_v5_minimal", V5, h("10 0f 00 04 4d 51 54 54 05 02 00 3c 00 00 02 63 31"),
       P.Connect("c1", V5, keep_alive=60)),
    ok("connect_v5_empty_client_id", V5, h("10 0d 00 04 4d 51 54 54 05 02 00 3c 00 00 00"),
       P.Connect("", V5, keep_alive=60), rule="[MQTT-3.1.3-6]"),
    ok("connect_v5_will_user_password_properties", V5, h("""
       10 3d 00 04 4d 51 54 54 05 ee 00 1e
       0f 11 00 00 00 78 21 00 0a 26 00 01 6b 00 01 76
       00 03 64 65 76
       0c 18 00 00 00 05 03 00 04 74 65 78 74
       00 03 77 2f 74 00 03 62 79 65 00 01 75 00 02 70 77"""),
       P.Connect("dev", V5, clean_start=True, keep_alive=30, username="u", password=b"pw",
                 will=P.Will("w/t", b"bye", 1, True, {PR.WILL_DELAY_INTERVAL: 5,
                                                      PR.CONTENT_TYPE: "text"}),
                 properties={PR.SESSION_EXPIRY_INTERVAL: 120, PR.RECEIVE_MAXIMUM: 10,
                             PR.USER_PROPERTY: [("k", "v")]}),
       rule="[MQTT-3.1.3-1]"),
    ok("connect_v311", V4, h("10 0e 00 04 4d 51 54 54 04 02 00 3c 00 02 63 31"),
       P.Connect("c1", V4, keep_alive=60)),
    ok("connect_v311_user_password", V4,
       h("10 15 00 04 4d 51 54 54 04 c2 00 3c 00 02 63 31 00 01 75 00 02 70 77"),
       P.Connect("c1", V4, keep_alive=60, username="u", password=b"pw")),
    ok("connect_v31_mqisdp", V3, h("10 10 00 06 4d 51 49 73 64 70 03 02 00 3c 00 02 63 31"),
       P.Connect("c1", V3, protocol_name="MQIsdp", keep_alive=60)),

    # ---- CONNACK (3.2)
    ok("connack_v5_success", V5, h("20 03 00 00 00"), P.Connack(False, 0)),
    ok("connack_v5_assigned_client_id", V5, h("20 0a 00 00 07 12 00 04 61 75 74 6f"),
       P.Connack(False, 0, {PR.ASSIGNED_CLIENT_IDENTIFIER: "auto"}), rule="[MQTT-3.2.2-16]"),
    ok("connack_v311_session_present", V4, h("20 02 01 00"), P.Connack(True, 0)),
    ok("connack_v311_refused_version", V4, h("20 02 00 01"), P.Connack(False, 1)),

    # ---- PUBLISH (3.3)
    ok("publish_v5_qos1", V5, h("32 0a 00 03 61 2f 62 00 0a 00 68 69"),
       P.Publish("a/b", b"hi", 1, False, False, 10)),
    ok("publish_v5_qos2_dup_retain_alias", V5, h("3d 0b 00 01 74 11 c2 05 01 01 23 00 01"),
       P.Publish("t", b"", 2, True, True, 0x11C2,
                 {PR.PAYLOAD_FORMAT_INDICATOR: 1, PR.TOPIC_ALIAS: 1})),
    ok("publish_v5_user_properties_in_order", V5,
       h("30 17 00 01 74 12 26 00 01 6b 00 01 31 26 00 01 61 00 01 78 09 00 01 ff 21"),
       P.Publish("t", b"!", properties={PR.USER_PROPERTY: [("k", "1"), ("a", "x")],
                                        PR.CORRELATION_DATA: b"\xff"}),
       rule="[MQTT-3.3.2-18]"),
    ok("publish_v311_qos1", V4, h("32 09 00 03 61 2f 62 00 0a 68 69"),
       P.Publish("a/b", b"hi", 1, False, False, 10)),
    ok("publish_v311_qos0_retain", V4, h("31 05 00 01 74 6f 6b"), P.Publish("t", b"ok", 0, True)),
    ok("publish_v311_qos1_dup_retain", V4, h("3b 07 00 01 61 00 0a 01 02"),
       P.Publish("a", b"\x01\x02", 1, True, True, 10)),
    _edge(V5, 127, "7f"), _edge(V5, 128, "80 01"), _edge(V5, 16383, "ff 7f"),
    _edge(V5, 16384, "80 80 01"), _edge(V4, 127, "7f"), _edge(V4, 128, "80 01"),

    # ---- PUBACK / PUBREC / PUBREL / PUBCOMP (3.4-3.7)
    ok("puback_v5_short_form", V5, h("40 02 00 01"), P.Ack(P.PUBACK, 1)),
    ok("puback_v5_reason_string", V5, h("40 0a 00 01 10 06 1f 00 03 77 68 79"),
       P.Ack(P.PUBACK, 1, 0x10, {PR.REASON_STRING: "why"})),
    ok("pubrec_v5_failure", V5, h("50 04 00 02 80 00"), P.Ack(P.PUBREC, 2, 0x80)),
    ok("pubrel_v5_not_found", V5, h("62 04 00 03 92 00"), P.Ack(P.PUBREL, 3, 0x92)),
    ok("pubcomp_v5", V5, h("70 02 ff ff"), P.Ack(P.PUBCOMP, 65535)),
    ok("puback_v311", V4, h("40 02 00 01"), P.Ack(P.PUBACK, 1)),
    ok("pubrec_v311", V4, h("50 02 00 02"), P.Ack(P.PUBREC, 2)),
    ok("pubrel_v311", V4, h("62 02 00 03"), P.Ack(P.PUBREL, 3)),
    ok("pubcomp_v311", V4, h("70 02 00 04"), P.Ack(P.PUBCOMP, 4)),

    # ---- SUBSCRIBE / SUBACK / UNSUBSCRIBE / UNSUBACK (3.8-3.11)
    ok("subscribe_v5_options_and_identifier", V5,
       h("82 0f 00 01 02 0b 07 00 03 61 2f 2b 1d 00 01 23 00"),
       P.Subscribe(1, [("a/+", O(1, True, True, 1)), ("#", O(0))],
                   {PR.SUBSCRIPTION_IDENTIFIER: [7]})),
    ok("subscribe_v311", V4, h("82 08 00 01 00 03 61 2f 62 01"),
       P.Subscribe(1, [("a/b", O(1))])),
    ok("suback_v5", V5, h("90 05 00 01 00 01 8f"), P.Suback(1, [1, 0x8F])),
    ok("suback_v311", V4, h("90 04 00 01 01 80"), P.Suback(1, [1, 0x80])),
    ok("unsubscribe_v5", V5, h("a2 0b 00 02 00 00 01 61 00 03 62 2f 23"),
       P.Unsubscribe(2, ["a", "b/#"])),
    ok("unsubscribe_v311", V4, h("a2 05 00 02 00 01 61"), P.Unsubscribe(2, ["a"])),
    ok("unsuback_v5", V5, h("b0 05 00 02 00 00 11"), P.Unsuback(2, [0, 0x11])),
    ok("unsuback_v311", V4, h("b0 02 00 02"), P.Unsuback(2, [])),

    # ---- PINGREQ / PINGRESP / DISCONNECT / AUTH (3.12-3.15)
    ok("pingreq_v5", V5, h("c0 00"), P.PingReq()),
    ok("pingresp_v5", V5, h("d0 00"), P.PingResp()),
    ok("pingreq_v311", V4, h("c0 00"), P.PingReq()),
    ok("pingresp_v311", V4, h("d0 00"), P.PingResp()),
    ok("disconnect_v5_normal", V5, h("e0 00"), P.Disconnect(0)),
    ok("disconnect_v5_with_will", V5, h("e0 01 04"), P.Disconnect(rc.DISCONNECT_WITH_WILL)),
    ok("disconnect_v5_properties", V5, h("e0 0c 00 0a 11 00 00 00 00 1f 00 02 6f 6b"),
       P.Disconnect(0, {PR.SESSION_EXPIRY_INTERVAL: 0, PR.REASON_STRING: "ok"})),
    ok("disconnect_v311", V4, h("e0 00"), P.Disconnect(0)),
    ok("auth_v5_continue", V5, h("f0 0a 18 08 15 00 05 53 43 52 41 4d"),
       P.Auth(rc.CONTINUE_AUTHENTICATION, {PR.AUTHENTICATION_METHOD: "SCRAM"})),
]

_M, _PE = MalformedPacket, ProtocolError
MALFORMED = [
    # fixed header (2.1)
    bad("packet_type_0", V5, h("00 00"), _M, rc.MALFORMED_PACKET),
    bad("remaining_length_five_bytes", V5, h("30 80 80 80 80 01"), _M, rc.MALFORMED_PACKET),
    bad("pingreq_reserved_flags", V5, h("c1 00"), _M, rc.MALFORMED_PACKET, "[MQTT-2.1.3-1]"),
    bad("pubrel_flags_0000", V5, h("60 02 00 01"), _M, rc.MALFORMED_PACKET, "[MQTT-3.6.1-1]"),
    bad("subscribe_flags_0000", V5, h("80 06 00 01 00 01 61 00"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.8.1-1]"),
    bad("unsubscribe_flags_0000", V4, h("a0 05 00 02 00 01 61"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.10.1-1]"),
    bad("pingreq_with_payload", V5, h("c0 01 00"), _M, rc.MALFORMED_PACKET),
    bad("auth_in_v311", V4, h("f0 00"), _M, rc.MALFORMED_PACKET),
    bad("remaining_length_five_bytes_pingreq", V5, h("c0 ff ff ff ff 01"), _M, rc.MALFORMED_PACKET,
        "1.5.5"),
    bad("unsubscribe_flags_0000_v5", V5, h("a0 06 00 01 00 00 01 61"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.10.1-1]"),
    bad("subscribe_flags_0000_v311", V4, h("80 06 00 01 00 01 61 01"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.8.1-1]"),
    # PUBLISH (3.3)
    bad("publish_qos3", V5, h("36 04 00 01 61 00"), _M, rc.MALFORMED_PACKET, "[MQTT-3.3.1-4]"),
    bad("publish_qos0_dup", V5, h("38 04 00 01 61 00"), _M, rc.MALFORMED_PACKET, "[MQTT-3.3.1-2]"),
    bad("publish_qos3_v311", V4, h("36 03 00 01 61"), _M, rc.MALFORMED_PACKET, "[MQTT-3.3.1-4]"),
    bad("publish_packet_id_0", V5, h("32 06 00 01 61 00 00 00"), _M, rc.MALFORMED_PACKET,
        "[MQTT-2.2.1-3]"),
    bad("publish_topic_not_utf8", V5, h("30 05 00 02 ff fe 00"), _M, rc.MALFORMED_PACKET,
        "[MQTT-1.5.4-1]"),
    bad("publish_topic_surrogate", V5, h("30 06 00 03 ed a0 80 00"), _M, rc.MALFORMED_PACKET,
        "[MQTT-1.5.4-1]"),
    bad("publish_topic_null", V5, h("30 06 00 03 61 00 62 00"), _M, rc.MALFORMED_PACKET,
        "[MQTT-1.5.4-2]"),
    bad("publish_topic_null_v311", V4, h("30 05 00 03 61 00 62"), _M, rc.MALFORMED_PACKET,
        "[MQTT-1.5.3-2] (3.1.1)"),
    bad("publish_topic_past_end", V5, h("30 03 00 05 61"), _M, rc.MALFORMED_PACKET),
    bad("publish_property_twice", V5, h("30 0c 00 01 61 08 03 00 01 61 03 00 01 62"), _PE,
        rc.PROTOCOL_ERROR, "2.2.2.2"),
    bad("publish_property_not_allowed", V5, h("30 09 00 01 61 05 11 00 00 00 01"), _M,
        rc.MALFORMED_PACKET, "2.2.2.2"),
    bad("publish_unknown_property", V5, h("30 06 00 01 61 02 7f 00"), _M, rc.MALFORMED_PACKET),
    bad("publish_payload_format_2", V5, h("30 06 00 01 61 02 01 02"), _PE, rc.PROTOCOL_ERROR,
        "3.3.2.3.2"),
    bad("publish_qos1_no_packet_id", V5, h("32 05 00 03 6d 2f 78"), _M, rc.MALFORMED_PACKET,
        "2.2.1"),
    bad("publish_property_length_past_end", V5, h("32 0a 00 03 6d 2f 78 00 01 09 01 01"), _M,
        rc.MALFORMED_PACKET, "2.2.2.1"),
    bad("publish_property_past_its_block", V5, h("32 0b 00 03 6d 2f 78 00 01 02 02 00 78"), _M,
        rc.MALFORMED_PACKET, "2.2.2.1"),
    bad("publish_user_property_not_utf8", V5,
        h("32 0f 00 03 6d 2f 78 00 01 06 26 00 01 ff 00 00 78"), _M, rc.MALFORMED_PACKET,
        "[MQTT-1.5.4-1]"),
    bad("publish_message_expiry_twice", V5,
        h("32 13 00 03 6d 2f 78 00 01 0a 02 00 00 00 05 02 00 00 00 06 78"), _PE,
        rc.PROTOCOL_ERROR, "3.3.2.3.3"),
    bad("publish_payload_format_twice", V5, h("32 0d 00 03 6d 2f 78 00 01 04 01 00 01 00 78"),
        _PE, rc.PROTOCOL_ERROR, "3.3.2.3.2"),
    bad("publish_topic_not_utf8_v311", V4, h("30 05 00 02 c3 28 78"), _M, rc.MALFORMED_PACKET,
        "[MQTT-1.5.3-1] (3.1.1)"),
    # PUBACK..PUBCOMP (3.4-3.7)
    bad("puback_packet_id_0", V5, h("40 02 00 00"), _M, rc.MALFORMED_PACKET),
    bad("puback_too_short", V5, h("40 01 00"), _M, rc.MALFORMED_PACKET),
    bad("pubcomp_v311_trailing_byte", V4, h("70 03 00 01 00"), _M, rc.MALFORMED_PACKET),
    # SUBSCRIBE / UNSUBSCRIBE (3.8, 3.10)
    bad("subscribe_reserved_option_bits", V5, h("82 07 00 01 00 00 01 61 c0"), _M,
        rc.MALFORMED_PACKET, "[MQTT-3.8.3-5]"),
    bad("subscribe_retain_handling_3", V5, h("82 07 00 01 00 00 01 61 30"), _PE,
        rc.PROTOCOL_ERROR, "3.8.3.1"),
    bad("subscribe_qos3", V5, h("82 07 00 01 00 00 01 61 03"), _PE, rc.PROTOCOL_ERROR, "3.8.3.1"),
    bad("subscribe_qos3_v311", V4, h("82 06 00 01 00 01 61 03"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.8.3-4] (3.1.1)"),
    bad("subscribe_no_filter", V5, h("82 03 00 01 00"), _PE, rc.PROTOCOL_ERROR, "[MQTT-3.8.3-2]"),
    bad("subscribe_no_filter_v311", V4, h("82 02 00 01"), _PE, rc.PROTOCOL_ERROR,
        "[MQTT-3.8.3-3] (3.1.1)"),
    bad("subscribe_reserved_bits_v311", V4, h("82 08 00 01 00 03 61 2f 62 04"), _M,
        rc.MALFORMED_PACKET, "[MQTT-3.8.3-4] (3.1.1)"),
    bad("subscribe_filter_without_options", V5, h("82 06 00 01 00 00 01 61"), _M,
        rc.MALFORMED_PACKET),
    bad("subscribe_identifier_0", V5, h("82 09 00 01 02 0b 00 00 01 61 00"), _PE,
        rc.PROTOCOL_ERROR, "3.8.2.1.2"),
    bad("unsubscribe_no_filter", V5, h("a2 03 00 01 00"), _PE, rc.PROTOCOL_ERROR,
        "[MQTT-3.10.3-2]"),
    bad("subscribe_filter_not_utf8", V5, h("82 08 00 01 00 00 02 c3 28 01"), _M,
        rc.MALFORMED_PACKET, "[MQTT-1.5.4-1]"),
    bad("subscribe_packet_id_0", V5, h("82 07 00 00 00 00 01 61 01"), _M, rc.MALFORMED_PACKET,
        "[MQTT-2.2.1-3]"),
    # DISCONNECT (3.14)
    bad("disconnect_v311_payload", V4, h("e0 01 00"), _M, rc.MALFORMED_PACKET),
    bad("disconnect_property_not_allowed", V5, h("e0 04 00 02 01 01"), _M, rc.MALFORMED_PACKET,
        "2.2.2.2"),
    # CONNECT (3.1): answered with a CONNACK failure code (v5) or a close (3.1.1)
    bad("connect_reserved_flag", V5, h("10 0f 00 04 4d 51 54 54 05 03 00 3c 00 00 02 63 31"),
        _M, rc.MALFORMED_PACKET, "[MQTT-3.1.2-3]"),
    bad("connect_protocol_name", V5, h("10 0f 00 04 4d 51 54 58 05 02 00 3c 00 00 02 63 31"),
        _M, rc.MALFORMED_PACKET, "[MQTT-3.1.2-1]"),
    bad("connect_protocol_level_6", V5, h("10 0f 00 04 4d 51 54 54 06 02 00 3c 00 00 02 63 31"),
        _PE, rc.UNSUPPORTED_PROTOCOL_VERSION, "[MQTT-3.1.2-2]"),
    bad("connect_will_qos_without_will", V5,
        h("10 0f 00 04 4d 51 54 54 05 0a 00 3c 00 00 02 63 31"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.1.2-11]"),
    bad("connect_will_retain_without_will", V5,
        h("10 0f 00 04 4d 51 54 54 05 22 00 3c 00 00 02 63 31"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.1.2-13]"),
    bad("connect_will_qos3", V5, h("10 0f 00 04 4d 51 54 54 05 1e 00 3c 00 00 02 63 31"), _M,
        rc.MALFORMED_PACKET, "[MQTT-3.1.2-12]"),
    bad("connect_trailing_bytes", V5,
        h("10 10 00 04 4d 51 54 54 05 02 00 3c 00 00 02 63 31 00"), _M, rc.MALFORMED_PACKET,
        "[MQTT-3.1.4-1]"),
    bad("connect_v311_password_without_user", V4,
        h("10 12 00 04 4d 51 54 54 04 42 00 3c 00 02 63 31 00 02 70 77"), _M,
        rc.MALFORMED_PACKET, "[MQTT-3.1.2-22] (3.1.1)"),
    bad("connect_v311_reserved_flag", V4, h("10 0e 00 04 4d 51 54 54 04 03 00 3c 00 02 63 31"),
        _M, rc.MALFORMED_PACKET, "[MQTT-3.1.2-3]"),
    bad("connect_unknown_property", V5,
        h("10 10 00 04 4d 51 54 54 05 02 00 3c 02 7f 00 00 01 78"), _M, rc.MALFORMED_PACKET,
        "2.2.2.2"),
    bad("connect_client_id_not_utf8", V5, h("10 0f 00 04 4d 51 54 54 05 02 00 3c 00 00 02 c3 28"),
        _M, rc.MALFORMED_PACKET, "[MQTT-1.5.4-1]"),
    bad("connect_receive_maximum_0", V5,
        h("10 11 00 04 4d 51 54 54 05 02 00 3c 03 21 00 00 00 01 78"), _PE, rc.PROTOCOL_ERROR,
        "3.1.2.11.3"),
    # the protocol level is unknown while the fixed header cannot be read: answered as 3.1.1
    # (closed, no CONNACK)
    bad("connect_remaining_length_five_bytes", V4, h("10 ff ff ff ff 7f"), _M,
        rc.MALFORMED_PACKET, "1.5.5"),
]

ALL = VALID + MALFORMED
BY_NAME = {v.name: v for v in ALL}
assert len(BY_NAME) == len(ALL), "vector names must be unique"

CAPTURED = [v.data for v in VALID if v.captured]


def v(name: str) -> Vector:
    return BY_NAME[name]


def of(level: int, *, valid: bool = True, max_size: int | None = None) -> list:
    """The vectors of one protocol level (3.1 counts as 3.1.1 here)."""
    pool = VALID if valid else MALFORMED
    return [x for x in pool if (x.level == level or (level == V4 and x.level == V3))
            and (max_size is None or len(x.data) <= max_size)]
