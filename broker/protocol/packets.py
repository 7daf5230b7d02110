"""Plain data for the 15 MQTT control packets. No behaviour, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

# Final: the compiled codec and core (broker/native.py) have these values built in, not looked up
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PUBACK: Final = 4
PUBREC: Final = 5
PUBREL: Final = 6
PUBCOMP: Final = 7
SUBSCRIBE: Final = 8
SUBACK: Final = 9
UNSUBSCRIBE: Final = 10
UNSUBACK: Final = 11
PINGREQ: Final = 12
PINGRESP: Final = 13
DISCONNECT: Final = 14
AUTH: Final = 15

TYPE_NAMES = {1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL",
              7: "PUBCOMP", 8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK",
              12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH"}

MQTT_31: Final = 3
MQTT_311: Final = 4
MQTT_5: Final = 5


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict[int, Any] | None = None


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = MQTT_5
    protocol_name: str = "MQTT"
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return CONNECT


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return CONNACK


_PUBLISH_FIELDS = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")


class Publish:
    """PUBLISH. `topic` is a str; empty when only a Topic Alias names it."""
    __slots__ = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties", "raw")

    @property
    def type(self) -> int:
        return PUBLISH

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int | None = None, properties: dict[int, Any] | None = None,
                 raw: bytes | None = None) -> None:
        self.raw = raw  # the packet as received (QoS 1/2: up to codec.RAW_QOS12_MAX), forwarded when the form matches
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Publish) and all(
            getattr(self, k) == getattr(other, k) for k in _PUBLISH_FIELDS)

    def __repr__(self) -> str:
        return ("Publish(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _PUBLISH_FIELDS) + ")")


def publish_pid_offset(raw: bytes, topic_length: int) -> int:
    """Where the packet identifier of a QoS 1/2 PUBLISH as received (`raw`) starts: after the
    fixed header (its Remaining Length 1-4 bytes) and the topic (2 + `topic_length` bytes)."""
    vbi = 1
    while raw[vbi] & 0x80:
        vbi += 1
    return vbi + 3 + topic_length


@dataclass(slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL and PUBCOMP share one shape (3.4-3.7)."""
    type: int
    packet_id: int
    reason_code: int = 0
    properties: dict[int, Any] | None = None


@dataclass(slots=True)
class SubscriptionOptions:
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    topics: list[tuple[str, SubscriptionOptions]]
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return SUBSCRIBE


@dataclass(slots=True)
class Suback:
    packet_id: int
    reason_codes: list[int]
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return SUBACK


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topics: list[str]
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return UNSUBSCRIBE


@dataclass(slots=True)
class Unsuback:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return UNSUBACK


@dataclass(slots=True)
class PingReq:

    @property
    def type(self) -> int:
        return PINGREQ


PINGREQ_PACKET = PingReq()  # the decoded PINGREQ, shared: read, never changed


@dataclass(slots=True)
class PingResp:

    @property
    def type(self) -> int:
        return PINGRESP


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return DISCONNECT


DISCONNECT_NORMAL = Disconnect()  # the decoded empty DISCONNECT, shared: read, never changed


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: dict[int, Any] | None = None

    @property
    def type(self) -> int:
        return AUTH
