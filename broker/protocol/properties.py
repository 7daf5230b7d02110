"""MQTT 5.0 properties (section 2.2.2): identifiers, types, decode and encode.

Properties travel as a plain dict {identifier: value}. User Property (0x26) is a
list of (name, value) pairs in wire order, duplicates kept; Subscription
Identifier (0x0B) is a list of ints (a PUBLISH to a client may carry several).
"""
from __future__ import annotations

import struct
from typing import Any

from . import reason_codes as rc
from .errors import MalformedPacket, ProtocolError

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

BYTE, TWO, FOUR, VBI, UTF8, BINARY, PAIR = range(7)

TYPES = {
    PAYLOAD_FORMAT_INDICATOR: BYTE, MESSAGE_EXPIRY_INTERVAL: FOUR, CONTENT_TYPE: UTF8,
    RESPONSE_TOPIC: UTF8, CORRELATION_DATA: BINARY, SUBSCRIPTION_IDENTIFIER: VBI,
    SESSION_EXPIRY_INTERVAL: FOUR, ASSIGNED_CLIENT_IDENTIFIER: UTF8, SERVER_KEEP_ALIVE: TWO,
    AUTHENTICATION_METHOD: UTF8, AUTHENTICATION_DATA: BINARY, REQUEST_PROBLEM_INFORMATION: BYTE,
    WILL_DELAY_INTERVAL: FOUR, REQUEST_RESPONSE_INFORMATION: BYTE, RESPONSE_INFORMATION: UTF8,
    SERVER_REFERENCE: UTF8, REASON_STRING: UTF8, RECEIVE_MAXIMUM: TWO, TOPIC_ALIAS_MAXIMUM: TWO,
    TOPIC_ALIAS: TWO, MAXIMUM_QOS: BYTE, RETAIN_AVAILABLE: BYTE, USER_PROPERTY: PAIR,
    MAXIMUM_PACKET_SIZE: FOUR, WILDCARD_SUBSCRIPTION_AVAILABLE: BYTE,
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: BYTE, SHARED_SUBSCRIPTION_AVAILABLE: BYTE,
}

# Which properties each packet may carry (section 2.2.2.2). "will" is the Will Properties.
_REASON = {REASON_STRING, USER_PROPERTY}
ALLOWED = {
    "CONNECT": {SESSION_EXPIRY_INTERVAL, AUTHENTICATION_METHOD, AUTHENTICATION_DATA,
                REQUEST_PROBLEM_INFORMATION, REQUEST_RESPONSE_INFORMATION, RECEIVE_MAXIMUM,
                TOPIC_ALIAS_MAXIMUM, USER_PROPERTY, MAXIMUM_PACKET_SIZE},
    "WILL": {PAYLOAD_FORMAT_INDICATOR, MESSAGE_EXPIRY_INTERVAL, CONTENT_TYPE, RESPONSE_TOPIC,
             CORRELATION_DATA, WILL_DELAY_INTERVAL, USER_PROPERTY},
    "CONNACK": {SESSION_EXPIRY_INTERVAL, ASSIGNED_CLIENT_IDENTIFIER, SERVER_KEEP_ALIVE,
                AUTHENTICATION_METHOD, AUTHENTICATION_DATA, RESPONSE_INFORMATION, SERVER_REFERENCE,
                REASON_STRING, RECEIVE_MAXIMUM, TOPIC_ALIAS_MAXIMUM, MAXIMUM_QOS, RETAIN_AVAILABLE,
                USER_PROPERTY, MAXIMUM_PACKET_SIZE, WILDCARD_SUBSCRIPTION_AVAILABLE,
                SUBSCRIPTION_IDENTIFIER_AVAILABLE, SHARED_SUBSCRIPTION_AVAILABLE},
    "PUBLISH": {PAYLOAD_FORMAT_INDICATOR, MESSAGE_EXPIRY_INTERVAL, CONTENT_TYPE, RESPONSE_TOPIC,
                CORRELATION_DATA, SUBSCRIPTION_IDENTIFIER, TOPIC_ALIAS, USER_PROPERTY},
    "PUBACK": _REASON, "PUBREC": _REASON, "PUBREL": _REASON, "PUBCOMP": _REASON,
    "SUBSCRIBE": {SUBSCRIPTION_IDENTIFIER, USER_PROPERTY},
    "SUBACK": _REASON, "UNSUBSCRIBE": {USER_PROPERTY}, "UNSUBACK": _REASON,
    "DISCONNECT": {SESSION_EXPIRY_INTERVAL, REASON_STRING, USER_PROPERTY, SERVER_REFERENCE},
    "AUTH": {AUTHENTICATION_METHOD, AUTHENTICATION_DATA, REASON_STRING, USER_PROPERTY},
}

# Byte properties whose only legal values are 0 and 1.
_BOOLEAN = {PAYLOAD_FORMAT_INDICATOR, REQUEST_PROBLEM_INFORMATION, REQUEST_RESPONSE_INFORMATION,
            MAXIMUM_QOS, RETAIN_AVAILABLE, WILDCARD_SUBSCRIPTION_AVAILABLE,
            SUBSCRIPTION_IDENTIFIER_AVAILABLE, SHARED_SUBSCRIPTION_AVAILABLE}


class Limits:
    """What one inbound packet may carry besides its size (0: no limit), set from [mqtt]:
    topic filters per SUBSCRIBE / UNSUBSCRIBE (max_filters_per_subscribe), User Properties per
    property block and their wire bytes (max_user_properties, max_user_property_bytes). The
    protocol sets none of these; past one the decoder raises ProtocolError with 0x97 Quota
    exceeded (an implementation-imposed limit), before decoding the rest."""
    __slots__ = ("max_filters", "max_user_properties", "max_user_property_bytes")

    def __init__(self, max_filters: int = 0, max_user_properties: int = 0,
                 max_user_property_bytes: int = 0):
        self.max_filters = max_filters
        self.max_user_properties = max_user_properties
        self.max_user_property_bytes = max_user_property_bytes


NO_LIMITS = Limits()  # what decoding broker output and stored state uses

_unpack_H = struct.Struct(">H").unpack_from
_unpack_I = struct.Struct(">I").unpack_from
_pack_H = struct.Struct(">H").pack
_pack_I = struct.Struct(">I").pack


def decode_utf8(buf: Any, pos: int) -> tuple[str, int]:
    """UTF-8 Encoded String (1.5.4): 2-byte length, well-formed UTF-8, no U+0000."""
    if pos + 2 > len(buf):
        raise MalformedPacket("string length runs past the end of the packet")
    n = (buf[pos] << 8) | buf[pos + 1]
    end = pos + 2 + n
    if end > len(buf):
        raise MalformedPacket("string runs past the end of the packet")
    try:
        s = str(buf[pos + 2:end], "utf-8")  # strict: rejects surrogates and overlongs [MQTT-1.5.4-1]
    except UnicodeDecodeError:
        raise MalformedPacket("string is not well-formed UTF-8") from None
    if "\x00" in s:  # [MQTT-1.5.4-2]
        raise MalformedPacket("string contains U+0000")
    return s, end  # a leading U+FEFF is kept, not stripped [MQTT-1.5.4-3]


def decode_binary(buf: Any, pos: int) -> tuple[bytes, int]:
    if pos + 2 > len(buf):
        raise MalformedPacket("binary length runs past the end of the packet")
    n = (buf[pos] << 8) | buf[pos + 1]
    end = pos + 2 + n
    if end > len(buf):
        raise MalformedPacket("binary data runs past the end of the packet")
    return bytes(buf[pos + 2:end]), end


def decode_vbi(buf: Any, pos: int) -> tuple[int, int]:
    """Variable Byte Integer (1.5.5): at most four bytes."""
    value = 0
    shift = 0
    for i in range(4):
        if pos >= len(buf):
            raise MalformedPacket("variable byte integer runs past the end of the packet")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if i and b == 0:  # [MQTT-1.5.5-1]
                raise MalformedPacket("variable byte integer is not minimally encoded")
            return value, pos
        shift += 7
    raise MalformedPacket("variable byte integer longer than four bytes")


def encode_vbi(n: int) -> bytes:
    """Variable Byte Integer in the fewest bytes [MQTT-1.5.5-1]."""
    if n < 128:
        return bytes((n,))
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_utf8(s: str) -> bytes:
    b = s.encode("utf-8")
    return _pack_H(len(b)) + b


def encode_binary(b: bytes) -> bytes:
    return _pack_H(len(b)) + bytes(b)


def decode_properties(buf: Any, pos: int, packet: str,
                      limits: Limits = NO_LIMITS) -> tuple[dict[int, Any] | None, int]:
    """Read a property block; return (dict or None when empty, position after it). User
    Properties beyond `limits` raise ProtocolError 0x97 as soon as they are read."""
    length, pos = decode_vbi(buf, pos)
    if length == 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise MalformedPacket("property length runs past the end of the packet")
    allowed = ALLOWED[packet]
    props: dict[int, Any] = {}
    pairs = 0
    pair_bytes = 0
    max_pairs = limits.max_user_properties
    max_pair_bytes = limits.max_user_property_bytes
    while pos < end:
        pid, pos = decode_vbi(buf, pos)
        kind = TYPES.get(pid)
        if kind is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02X}")
        if pid not in allowed:
            raise MalformedPacket(f"property 0x{pid:02X} is not allowed in {packet}")
        if kind == BYTE:
            if pos >= end:
                raise MalformedPacket("property runs past its block")
            value = buf[pos]
            pos += 1
            if pid in _BOOLEAN and value > 1:
                raise ProtocolError(f"property 0x{pid:02X} must be 0 or 1")
        elif kind == TWO:
            if pos + 2 > end:
                raise MalformedPacket("property runs past its block")
            value = _unpack_H(buf, pos)[0]
            pos += 2
        elif kind == FOUR:
            if pos + 4 > end:
                raise MalformedPacket("property runs past its block")
            value = _unpack_I(buf, pos)[0]
            pos += 4
        elif kind == VBI:
            value, pos = decode_vbi(buf, pos)
            if value == 0:  # 3.8.2.1.2: a Subscription Identifier of 0 is a Protocol Error
                raise ProtocolError("Subscription Identifier 0 is not allowed")
        elif kind == UTF8:
            value, pos = decode_utf8(buf, pos)
        elif kind == BINARY:
            value, pos = decode_binary(buf, pos)
        else:  # UTF-8 String Pair: both strings checked as UTF-8 strings [MQTT-1.5.7-1]
            start = pos
            k, pos = decode_utf8(buf, pos)
            v, pos = decode_utf8(buf, pos)
            pairs += 1
            pair_bytes += pos - start
            if max_pairs and pairs > max_pairs:
                raise ProtocolError(f"{packet} with more than {max_pairs} User Properties "
                                    "(mqtt.max_user_properties)", rc.QUOTA_EXCEEDED)
            if max_pair_bytes and pair_bytes > max_pair_bytes:
                raise ProtocolError(f"{packet} with User Properties of more than {max_pair_bytes} "
                                    "bytes (mqtt.max_user_property_bytes)", rc.QUOTA_EXCEEDED)
            props.setdefault(USER_PROPERTY, []).append((k, v))
            continue
        if pos > end:
            raise MalformedPacket("property runs past its block")
        if pid == SUBSCRIPTION_IDENTIFIER and packet == "PUBLISH":
            props.setdefault(pid, []).append(value)
            continue
        if pid in props:  # 2.2.2.2: including a property more than once is a Protocol Error
            raise ProtocolError(f"property 0x{pid:02X} included more than once")
        if pid == SUBSCRIPTION_IDENTIFIER:
            value = [value]
        props[pid] = value
    if pos != end:
        raise MalformedPacket("property block length does not match its content")
    if props.get(RECEIVE_MAXIMUM) == 0:
        raise ProtocolError("Receive Maximum of 0")
    if props.get(MAXIMUM_PACKET_SIZE) == 0:
        raise ProtocolError("Maximum Packet Size of 0")
    return props, pos


def encode_properties(props: dict[int, Any] | None) -> bytes:
    """Encode a property block including its length prefix."""
    if not props:
        return b"\x00"  # no properties: a Property Length of zero [MQTT-2.2.2-1]
    out = bytearray()
    for pid, value in props.items():
        kind = TYPES[pid]
        if kind == PAIR:
            for k, v in value:
                out.append(pid)
                out += encode_utf8(k)
                out += encode_utf8(v)
            continue
        if kind == VBI:
            for v in (value if isinstance(value, (list, tuple)) else (value,)):
                out.append(pid)
                out += encode_vbi(v)
            continue
        out.append(pid)
        if kind == BYTE:
            out.append(value)
        elif kind == TWO:
            out += _pack_H(value)
        elif kind == FOUR:
            out += _pack_I(value)
        elif kind == UTF8:
            out += encode_utf8(value)
        else:
            out += encode_binary(value)
    return encode_vbi(len(out)) + bytes(out)
