"""Bytes <-> packets for protocol levels 3 (MQIsdp), 4 (3.1.1) and 5.

`Decoder.feed(data)` takes bytes as they arrive and returns the complete packets;
the `encode_*` functions return wire bytes. Errors raise MalformedPacket /
ProtocolError carrying the MQTT 5 reason code.
"""
from __future__ import annotations

import struct
from typing import Any

from . import packets as P
from . import reason_codes as rc
from .errors import MalformedPacket, ProtocolError
from .properties import (NO_LIMITS, Limits, decode_binary, decode_properties, decode_utf8,
                         encode_binary, encode_properties, encode_utf8, encode_vbi)

_H = struct.Struct(">H")
_pack_H = _H.pack
_pack_HH = struct.Struct(">HH").pack

# Fixed header flags that must be exactly this value [MQTT-2.1.3-1]: PUBREL [MQTT-3.6.1-1],
# SUBSCRIBE [MQTT-3.8.1-1], UNSUBSCRIBE [MQTT-3.10.1-1], DISCONNECT [MQTT-3.14.1-1],
# AUTH [MQTT-3.15.1-1]; PUBLISH is checked on its own.
_REQUIRED_FLAGS = {P.CONNECT: 0, P.CONNACK: 0, P.PUBACK: 0, P.PUBREC: 0, P.PUBREL: 2,
                   P.PUBCOMP: 0, P.SUBSCRIBE: 2, P.SUBACK: 0, P.UNSUBSCRIBE: 2, P.UNSUBACK: 0,
                   P.PINGREQ: 0, P.PINGRESP: 0, P.DISCONNECT: 0, P.AUTH: 0}
# MQTT 3.1 (level 3) lets a client set DUP on a PUBREL, SUBSCRIBE or UNSUBSCRIBE it sends again
# (3.1's section 2.1, "DUP"); 3.1.1 made those flags fixed. Accepted at level 3 only.
_DUP_IN_31 = frozenset((P.PUBREL, P.SUBSCRIBE, P.UNSUBSCRIBE))

# A QoS 1/2 PUBLISH up to this size keeps its bytes as received (Publish.raw: forwarded with the
# packet id patched, instead of encoded again); a larger one would hold its payload twice
RAW_QOS12_MAX = 4096
PROTOCOL_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
# CONNECT's first 7 bytes (Protocol Name "MQTT" as a UTF-8 string, Protocol Level) for 3.1.1 and 5
_PROTOCOLS = {b"\x00\x04MQTT\x04": ("MQTT", 4), b"\x00\x04MQTT\x05": ("MQTT", 5)}


class Decoder:
    """Incremental decoder: packets split across reads and several packets per read.

    `level` is the connection's protocol level (set after CONNECT); `max_packet_size`
    bounds inbound packets (DISCONNECT 0x95 when exceeded). `connect_limit`, when given,
    is the smaller bound that applies until `connect_accepted()`, so a client that is not
    connected yet cannot make the broker buffer a huge packet. (Packets that arrived in
    the same read as the CONNECT may be larger: they are in memory already.) `limits`
    (properties.Limits) bounds what one packet may carry: topic filters, User Properties.

    Buffering is linear: a packet split across reads is kept as a list of chunks until
    its fixed header's Remaining Length has arrived, then joined once (no re-copying of
    the whole buffer on every read).
    """

    __slots__ = ("buf", "more", "have", "need", "level", "max_packet_size", "after_connect",
                 "limits")

    def __init__(self, level: int = P.MQTT_5, max_packet_size: int = 268435460,
                 connect_limit: int | None = None, limits: Limits = NO_LIMITS):
        self.buf = b""     # start of an incomplete packet (empty when nothing is buffered)
        self.more: list[bytes] | None = None  # later chunks of that packet, while `need` is known
        self.have = 0      # bytes in buf + more
        self.need = 0      # total size of the incomplete packet, 0 while its header is incomplete
        self.level = level
        self.after_connect = max_packet_size
        self.max_packet_size = (max_packet_size if connect_limit is None
                                else min(connect_limit, max_packet_size))
        self.limits = limits

    def feed(self, data: bytes) -> tuple[list[Any], Exception | None]:
        """Return (packets decoded, error or None). Packets before an error are returned."""
        if not self.buf and is_one_packet(data) and len(data) <= self.max_packet_size:
            one = decode_one(data, self.level, self.limits)  # the common read
            if one[0] and one[0][0].type == P.CONNECT:
                self.level = one[0][0].protocol_level
            return one
        if self.buf:
            if self.need:
                if self.need > self.max_packet_size:  # began in the CONNECT's read, not accepted yet
                    err = self._too_large(self.need, self.max_packet_size)
                    self.buf = b""
                    self.more = None
                    self.have = self.need = 0
                    return [], err
                more = self.more
                if more is None:
                    more = self.more = [self.buf]  # allocated only while a packet is split
                more.append(data)
                self.have += len(data)
                if self.have < self.need:
                    return [], None
                buf = b"".join(more)  # the one copy of a packet that arrived in pieces
                self.more = None
            else:
                buf = self.buf + data  # only the few bytes of an incomplete fixed header waited
        else:
            buf = data
        n = len(buf)
        pos = 0
        out = []
        level = self.level
        limit = self.max_packet_size
        limits = self.limits
        need = 0
        try:
            while n - pos >= 2:
                b1 = buf[pos + 1]
                if b1 < 0x80:
                    length = b1
                    hdr = 2
                else:
                    length = b1 & 0x7F
                    shift = 7
                    hdr = 2
                    while True:
                        if pos + hdr >= n:
                            if hdr >= 5:
                                raise MalformedPacket("remaining length longer than four bytes")
                            length = -1
                            break
                        b = buf[pos + hdr]
                        length |= (b & 0x7F) << shift
                        hdr += 1
                        if not b & 0x80:
                            break
                        shift += 7
                        if hdr >= 5:
                            raise MalformedPacket("remaining length longer than four bytes")
                    if length < 0:
                        break
                end = pos + hdr + length
                if end - pos > limit:  # [MQTT-3.2.2-15] / 4.13: Packet too large
                    raise self._too_large(end - pos, limit)
                if end > n:
                    need = end - pos
                    break
                first = buf[pos]
                if first >> 4 == P.PUBLISH:
                    out.append(decode_publish(buf, pos, pos + hdr, end, level, limits))
                else:
                    pkt = decode_packet(first, buf[pos + hdr:end], level, limits)
                    if pkt.type == P.CONNECT:
                        level = self.level = pkt.protocol_level
                        limit = self.after_connect  # for the rest of this read only
                    out.append(pkt)
                pos = end
        except (MalformedPacket, ProtocolError) as exc:
            self.buf = b""
            self.have = self.need = 0
            return out, exc.with_traceback(None)  # (see decode_one)
        if pos < n:
            self.buf = buf[pos:]  # (no copy for bytes when pos is 0)
            self.have = n - pos
            self.need = need
        else:
            self.buf = b""
            self.have = self.need = 0
        return out, None

    def connect_accepted(self) -> None:
        """The CONNECT was accepted: from now on packets up to `max_packet_size`."""
        self.max_packet_size = self.after_connect

    def _too_large(self, size: int, limit: int) -> MalformedPacket:
        if limit < self.after_connect:
            return MalformedPacket(f"packet of {size} bytes before the CONNECT was accepted exceeds "
                                   f"max_connect_packet_size {limit}", rc.PACKET_TOO_LARGE)
        return MalformedPacket(f"packet of {size} bytes exceeds the maximum packet size {limit}",
                               rc.PACKET_TOO_LARGE)

    def buffered(self) -> int:
        """Bytes of an incomplete packet held."""
        return self.have


def is_one_packet(data: bytes) -> bool:
    """Whether a read is exactly one packet of at most 129 bytes (its Remaining Length in one
    byte: len - 2 < 0x80), which decode_one() decodes without a Decoder's buffering loop."""
    n = len(data)
    return 1 < n < 130 and data[1] == n - 2


def puback_ids(data: bytes) -> list[int] | None:
    """The packet ids of a read holding nothing but whole PUBACKs in their 4-byte form (3.4.2.1:
    Reason Code 0 and no properties, at every level), in order; None for anything else, which
    the Decoder takes (a packet id 0 too: malformed). A subscriber's reads are mostly these."""
    n = len(data)
    if n < 4 or n & 3:
        return None
    ids = []
    for i in range(0, n, 4):
        if data[i] != 0x40 or data[i + 1] != 2:
            return None
        pid = (data[i + 2] << 8) | data[i + 3]
        if pid == 0:  # [MQTT-2.2.1-3]
            return None
        ids.append(pid)
    return ids


def decode_one(data: bytes, level: int,
               limits: Limits = NO_LIMITS) -> tuple[list[Any], Exception | None]:
    """The packet of a read that is_one_packet() (the caller checked it and the size limit):
    ([packet], None) or ([], error), as Decoder.feed() returns them."""
    first = data[0]
    try:
        if first >> 4 == P.PUBLISH:
            return [decode_publish(data, 0, 2, len(data), level, limits)], None
        return [decode_packet(first, data[2:], level, limits)], None
    except (MalformedPacket, ProtocolError) as exc:
        # returned as a value, without its traceback: that would hold the caller's frames, and
        # through them its connection, in a reference cycle only the garbage collector frees
        return [], exc.with_traceback(None)


def decode_publish(buf: bytes, start: int, body: int, end: int, level: int,
                   limits: Limits = NO_LIMITS) -> P.Publish:
    """PUBLISH (3.3) occupying buf[start:end], variable header at `body`: the hot path,
    so it indexes the read buffer directly instead of slicing the packet out first."""
    first = buf[start]
    qos = (first >> 1) & 3
    if qos == 3:  # [MQTT-3.3.1-4]
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = first & 8
    if dup and qos == 0:  # [MQTT-3.3.1-2]
        raise MalformedPacket("PUBLISH with DUP=1 and QoS 0")
    if end - body < 2:
        raise MalformedPacket("PUBLISH too short for its topic")
    pos = body + 2 + ((buf[body] << 8) | buf[body + 1])
    if pos > end:
        raise MalformedPacket("topic runs past the end of the PUBLISH")
    try:
        topic = str(buf[body + 2:pos], "utf-8")  # [MQTT-3.3.2-1]
    except UnicodeDecodeError:
        raise MalformedPacket("topic name is not well-formed UTF-8") from None
    if "\x00" in topic:  # [MQTT-4.7.3-2]
        raise MalformedPacket("topic name contains U+0000")
    packet_id = None
    if qos:  # only QoS 1 and 2 carry a packet identifier [MQTT-2.2.1-2]
        if pos + 2 > end:
            raise MalformedPacket("PUBLISH too short for its packet identifier")
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        if packet_id == 0:  # [MQTT-2.2.1-3]
            raise MalformedPacket("packet identifier 0")
        pos += 2
    props = None
    if level == P.MQTT_5:
        if pos < end and buf[pos] == 0:
            pos += 1
        else:
            rest = buf[pos:end]
            props, used = decode_properties(rest, 0, "PUBLISH", limits)
            pos += used
    return P.Publish(topic, buf[pos:end], qos, bool(first & 1), bool(dup), packet_id, props,
                     buf[start:end] if not qos or end - start <= RAW_QOS12_MAX else None)


def _packet_id(body: Any, pos: int) -> tuple[int, int]:
    if pos + 2 > len(body):
        raise MalformedPacket("packet too short for its packet identifier")
    pid = (body[pos] << 8) | body[pos + 1]
    if pid == 0:
        raise MalformedPacket("packet identifier 0")
    return pid, pos + 2


def decode_packet(first: int, body: bytes, level: int, limits: Limits = NO_LIMITS) -> Any:
    ptype = first >> 4
    flags = first & 0x0F
    if ptype == 0:
        raise MalformedPacket("packet type 0 is reserved")
    if flags != _REQUIRED_FLAGS[ptype] and not (  # [MQTT-2.1.3-1]
            level == P.MQTT_31 and ptype in _DUP_IN_31 and flags == _REQUIRED_FLAGS[ptype] | 8):
        raise MalformedPacket(f"invalid fixed header flags for {P.TYPE_NAMES[ptype]}")
    if ptype == P.CONNECT:
        return decode_connect(body, limits)
    v5 = level == P.MQTT_5
    if ptype in (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP):
        pid, pos = _packet_id(body, 0)
        code, props = 0, None
        if v5 and pos < len(body):  # 3.4.2.1: reason code and properties may be omitted
            code = body[pos]
            pos += 1
            if pos < len(body):
                props, pos = decode_properties(body, pos, P.TYPE_NAMES[ptype], limits)
        if pos != len(body):
            raise MalformedPacket(f"{P.TYPE_NAMES[ptype]} has trailing bytes")
        return P.Ack(ptype, pid, code, props)
    if ptype == P.SUBSCRIBE:
        return decode_subscribe(body, v5, limits)
    if ptype == P.UNSUBSCRIBE:
        pid, pos = _packet_id(body, 0)
        props = None
        if v5:
            props, pos = decode_properties(body, pos, "UNSUBSCRIBE", limits)
        topics: list[str] = []
        max_filters = limits.max_filters
        while pos < len(body):
            t, pos = decode_utf8(body, pos)  # [MQTT-3.10.3-1]
            if not t:  # [MQTT-4.7.3-1]: at least one character
                raise MalformedPacket("UNSUBSCRIBE with a zero-length topic filter")
            if max_filters and len(topics) == max_filters:  # as SUBSCRIBE (0x97)
                raise ProtocolError(f"UNSUBSCRIBE with more than {max_filters} topic filters "
                                    f"(mqtt.max_filters_per_subscribe)", rc.QUOTA_EXCEEDED)
            topics.append(t)
        if not topics:  # [MQTT-3.10.3-2]
            raise ProtocolError("UNSUBSCRIBE with no topic filter")
        return P.Unsubscribe(pid, topics, props)
    if ptype in (P.PINGREQ, P.PINGRESP):
        if body:
            raise MalformedPacket(f"{P.TYPE_NAMES[ptype]} with a payload")
        return P.PINGREQ_PACKET if ptype == P.PINGREQ else P.PingResp()
    if ptype == P.DISCONNECT:
        if not body:  # 3.1.1's only form, v5's normal one (3.14.2.1: no Reason Code: 0x00)
            return P.DISCONNECT_NORMAL
        code, props = 0, None
        if v5:
            code = body[0]
            if len(body) > 1:
                props, pos = decode_properties(body, 1, "DISCONNECT", limits)
                if pos != len(body):
                    raise MalformedPacket("DISCONNECT has trailing bytes")
        elif body:
            raise MalformedPacket("DISCONNECT with a payload")
        return P.Disconnect(code, props)
    if ptype == P.AUTH:
        if not v5:
            raise MalformedPacket("AUTH exists only in MQTT 5")
        code, props = 0, None
        if body:
            code = body[0]
            props, _ = decode_properties(body, 1, "AUTH", limits)
        return P.Auth(code, props)
    if ptype == P.CONNACK:
        if len(body) < 2:
            raise MalformedPacket("CONNACK too short")
        props = decode_properties(body, 2, "CONNACK")[0] if v5 else None
        return P.Connack(bool(body[0] & 1), body[1], props)
    if ptype in (P.SUBACK, P.UNSUBACK):
        pid, pos = _packet_id(body, 0)
        props = None
        if v5:
            props, pos = decode_properties(body, pos, P.TYPE_NAMES[ptype])
        codes = list(body[pos:])
        return (P.Suback if ptype == P.SUBACK else P.Unsuback)(pid, codes, props)
    raise MalformedPacket(f"unknown packet type {ptype}")


def decode_connect(body: bytes, limits: Limits = NO_LIMITS) -> P.Connect:
    """CONNECT (3.1). Errors before the protocol level is known are raised as for v5."""
    known = _PROTOCOLS.get(body[:7])  # the protocol name and level as most clients send them
    if known is not None:
        name, level = known
        pos = 7
    else:
        name, pos = decode_utf8(body, 0)
        if pos >= len(body):
            raise MalformedPacket("CONNECT too short")
        level = body[pos]
        if (name, level) not in (("MQTT", 4), ("MQTT", 5), ("MQIsdp", 3)):
            if name not in ("MQTT", "MQIsdp"):  # [MQTT-3.1.2-1]
                raise MalformedPacket(f"unknown protocol name {name!r}")
            # [MQTT-3.1.2-2]: CONNACK 0x84 / return code 1, then close
            raise ProtocolError(f"unsupported protocol level {level}", rc.UNSUPPORTED_PROTOCOL_VERSION)
        pos += 1
    if pos + 3 > len(body):
        raise MalformedPacket("CONNECT too short")
    flags = body[pos]
    keep_alive = (body[pos + 1] << 8) | body[pos + 2]
    pos += 3
    if flags & 1:  # [MQTT-3.1.2-3] reserved flag
        raise MalformedPacket("CONNECT reserved flag is set")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = bool(flags & 0x20)
    if not will_flag and (will_qos or will_retain):  # [MQTT-3.1.2-11], [MQTT-3.1.2-13]
        raise MalformedPacket("Will QoS/Retain set without the Will Flag")
    if will_qos == 3:  # [MQTT-3.1.2-12]
        raise MalformedPacket("Will QoS 3")
    if level == P.MQTT_311 and not flags & 0x80 and flags & 0x40:  # [MQTT-3.1.2-22] (3.1.1)
        raise MalformedPacket("password flag without user name flag")
    props = None
    if level == P.MQTT_5:
        props, pos = decode_properties(body, pos, "CONNECT", limits)
    client_id, pos = decode_utf8(body, pos)  # [MQTT-3.1.3-3], [MQTT-3.1.3-4]
    will = None
    if will_flag:  # Will Properties, Will Topic, Will Payload present [MQTT-3.1.2-9]
        wprops = None
        if level == P.MQTT_5:
            wprops, pos = decode_properties(body, pos, "WILL", limits)
        wtopic, pos = decode_utf8(body, pos)  # [MQTT-3.1.3-11]
        wpayload, pos = decode_binary(body, pos)
        will = P.Will(wtopic, wpayload, will_qos, will_retain, wprops)
    username = password = None
    if flags & 0x80:  # [MQTT-3.1.2-17], [MQTT-3.1.3-12]
        username, pos = decode_utf8(body, pos)
    if flags & 0x40:  # [MQTT-3.1.2-19]
        password, pos = decode_binary(body, pos)
    if pos != len(body):  # fields without their flag [MQTT-3.1.2-16], [MQTT-3.1.2-18]; [MQTT-3.1.4-1]
        raise MalformedPacket("CONNECT has trailing bytes")
    return P.Connect(client_id, level, name, bool(flags & 2), keep_alive, username, password,
                     will, props)


def decode_subscribe(body: bytes, v5: bool, limits: Limits = NO_LIMITS) -> P.Subscribe:
    pid, pos = _packet_id(body, 0)
    props = None
    if v5:
        props, pos = decode_properties(body, pos, "SUBSCRIBE", limits)
    topics: list[tuple[str, P.SubscriptionOptions]] = []
    max_filters = limits.max_filters
    while pos < len(body):
        filt, pos = decode_utf8(body, pos)  # [MQTT-3.8.3-1]
        if not filt:  # [MQTT-4.7.3-1]: at least one character (Mosquitto: malformed too)
            raise MalformedPacket("SUBSCRIBE with a zero-length topic filter")
        if pos >= len(body):
            raise MalformedPacket("SUBSCRIBE topic filter without options")
        o = body[pos]
        pos += 1
        if v5:
            if o & 0xC0:  # [MQTT-3.8.3-5]
                raise MalformedPacket("SUBSCRIBE options reserved bits set")
            if (o >> 4) & 3 == 3:  # 3.8.3.1: a Protocol Error
                raise ProtocolError("Retain Handling 3")
            if o & 3 == 3:  # 3.8.3.1: a Protocol Error
                raise ProtocolError("SUBSCRIBE requested QoS 3")
        elif o & 0xFC or o & 3 == 3:  # [MQTT-3.8.3-4] (3.1.1): malformed
            raise MalformedPacket("SUBSCRIBE requested QoS 3 or reserved bits set")
        if max_filters and len(topics) == max_filters:  # a limit of this implementation (reason code 0x97)
            raise ProtocolError(f"SUBSCRIBE with more than {max_filters} topic filters "
                                f"(mqtt.max_filters_per_subscribe)", rc.QUOTA_EXCEEDED)
        topics.append((filt, P.SubscriptionOptions(o & 3, bool(o & 4), bool(o & 8), (o >> 4) & 3)))
    if not topics:  # [MQTT-3.8.3-2]
        raise ProtocolError("SUBSCRIBE with no topic filter")
    return P.Subscribe(pid, topics, props)


# ---------------------------------------------------------------- encoding

def _frame(first: int, body: bytes) -> bytes:
    n = len(body)
    if n < 128:
        return bytes((first, n)) + body
    return bytes((first,)) + encode_vbi(n) + body


def encode_publish(topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool,
                   packet_id: int | None, props: bytes | None, level: int) -> bytes:
    """PUBLISH from pre-encoded parts: `topic` is UTF-8 bytes, `props` an encoded block (v5)."""
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    head = _pack_H(len(topic)) + topic
    if qos:
        head += _pack_H(packet_id)
    if level == P.MQTT_5:
        head += props if props else b"\x00"  # [MQTT-2.2.2-1]
    n = len(head) + len(payload)
    if n < 128:
        return bytes((first, n)) + head + payload
    return bytes((first,)) + encode_vbi(n) + head + payload


def encode(pkt: Any, level: int = P.MQTT_5) -> bytes:
    """Encode any packet object."""
    t = pkt.type
    v5 = level == P.MQTT_5
    if t == P.PUBLISH:
        return encode_publish(pkt.topic.encode(), pkt.payload, pkt.qos, pkt.retain, pkt.dup,
                              pkt.packet_id, encode_properties(pkt.properties) if v5 else None,
                              level)
    if t in (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP):
        return encode_ack(t, pkt.packet_id, pkt.reason_code, pkt.properties, level)
    if t == P.CONNACK:
        body = bytes((1 if pkt.session_present else 0, pkt.reason_code))
        if v5:
            body += encode_properties(pkt.properties)
        return _frame(0x20, body)
    if t == P.SUBACK or t == P.UNSUBACK:
        body = _pack_H(pkt.packet_id)
        if v5:
            body += encode_properties(pkt.properties)
        if v5 or t == P.SUBACK:
            body += bytes(pkt.reason_codes)
        return _frame(0x90 if t == P.SUBACK else 0xB0, body)
    if t == P.PINGREQ:
        return b"\xc0\x00"
    if t == P.PINGRESP:
        return b"\xd0\x00"
    if t == P.DISCONNECT:
        if not v5 or (pkt.reason_code == 0 and not pkt.properties):
            return b"\xe0\x00"
        body = bytes((pkt.reason_code,))
        if pkt.properties:
            body += encode_properties(pkt.properties)
        return _frame(0xE0, body)
    if t == P.AUTH:
        return _frame(0xF0, bytes((pkt.reason_code,)) + encode_properties(pkt.properties))
    if t == P.CONNECT:
        return encode_connect(pkt)
    if t == P.SUBSCRIBE:
        body = _pack_H(pkt.packet_id)
        if v5:
            body += encode_properties(pkt.properties)
        for filt, o in pkt.topics:
            body += encode_utf8(filt) + bytes((o.qos | (4 if o.no_local else 0) |
                                               (8 if o.retain_as_published else 0) |
                                               (o.retain_handling << 4),))
        return _frame(0x82, body)
    if t == P.UNSUBSCRIBE:
        body = _pack_H(pkt.packet_id)
        if v5:
            body += encode_properties(pkt.properties)
        for filt in pkt.topics:
            body += encode_utf8(filt)
        return _frame(0xA2, body)
    raise ValueError(f"cannot encode {pkt!r}")


def encode_ack(ptype: int, packet_id: int, reason_code: int = 0, props: dict[int, Any] | None = None,
               level: int = P.MQTT_5) -> bytes:
    first = (ptype << 4) | (2 if ptype == P.PUBREL else 0)  # [MQTT-3.6.1-1]
    if level != P.MQTT_5 or (reason_code == 0 and not props):  # 3.4.2.1: short form
        # one struct call, not a tuple made into bytes: 145 -> 60 ns a PUBACK (timeit, compiled)
        return _pack_HH((first << 8) | 2, packet_id)
    # reason code plus a property block (empty when no properties), as common clients send
    body = bytes((packet_id >> 8, packet_id & 0xFF, reason_code)) + encode_properties(props)
    return _frame(first, body)


def encode_connect(c: P.Connect) -> bytes:
    level = c.protocol_level
    flags = (2 if c.clean_start else 0)
    if c.will:
        flags |= 4 | (c.will.qos << 3) | (0x20 if c.will.retain else 0)
    if c.username is not None:
        flags |= 0x80
    if c.password is not None:
        flags |= 0x40
    body = encode_utf8(PROTOCOL_NAMES.get(level, c.protocol_name)) + bytes((level, flags))
    body += _pack_H(c.keep_alive)
    if level == P.MQTT_5:
        body += encode_properties(c.properties)
    body += encode_utf8(c.client_id)
    if c.will:
        if level == P.MQTT_5:
            body += encode_properties(c.will.properties)
        body += encode_utf8(c.will.topic) + encode_binary(c.will.payload)
    if c.username is not None:
        body += encode_utf8(c.username)
    if c.password is not None:
        body += encode_binary(c.password)
    return _frame(0x10, body)
