"""The checks of a CONNECT that need nothing but the packet and the listener's facts: pure
functions returning the refusal (CONNACK reason code, why) or None, as mochi-mqtt's
ConnectValidate. Connection.on_connect runs them before anything stateful (bans, the password
check, admission, the session); Connection.accept runs will_refusal once authenticated.

Codes are the MQTT 5 ones; the connection maps them to 3.1.x CONNACK codes when it refuses.
"""
from __future__ import annotations

import re
from typing import Any

from ..protocol import packets as P
from ..protocol import properties as PR
from ..protocol import reason_codes as rc

# Control characters (C0, DEL, C1) are refused in client ids and user names, as Mosquitto does:
# [MQTT-1.5.4-2] lets a receiver treat them as malformed; they would forge or break log lines
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")

Refusal = tuple[int, str]


def client_id_refusal(client_id: str, level: int, clean_start: bool,
                      max_length: int) -> Refusal | None:
    """An empty client id (the broker assigns one) or the client's own: when it is refused."""
    if not client_id:
        if level != P.MQTT_5 and not clean_start:  # [MQTT-3.1.3-8] (3.1.1)
            return rc.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs clean session"
        if level == P.MQTT_31:
            return rc.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 needs a client id"
        return None  # [MQTT-3.1.3-6]: the broker assigns one
    if len(client_id) > max_length:  # [MQTT-3.1.3-8] refused: CONNACK 0x85, close
        return rc.CLIENT_IDENTIFIER_NOT_VALID, "client id too long"
    if CONTROL_CHARACTERS.search(client_id):  # [MQTT-1.5.4-2], [MQTT-3.1.3-8]: 0x85 / 2
        return (rc.CLIENT_IDENTIFIER_NOT_VALID,
                "the client id contains control characters (U+0000-U+001F, U+007F-U+009F)")
    return None


def login_refusal(username: str | None, props: Any, *, identity: str | None,
                  anonymous_allowed: bool) -> Refusal | None:
    """The user name and the authentication method, before any password is checked.
    `identity`: the listener's user from a TLS certificate (None: the CONNECT's user name
    counts); `anonymous_allowed`: anonymous clients may connect from where this one is."""
    if identity is None and username is not None and CONTROL_CHARACTERS.search(username):
        # 0x86: "the data in the user name or password is malformed" (3.2.2.2); 3.1.x: 4
        return (rc.BAD_USER_NAME_OR_PASSWORD,
                "the user name contains control characters (U+0000-U+001F, U+007F-U+009F)")
    if username is None and identity is None and not anonymous_allowed:
        return (rc.NOT_AUTHORIZED, "anonymous clients may connect only from this machine: "
                "connect with a user name and password (the broker's operator may set "
                "auth.allow_anonymous = true)")
    if PR.AUTHENTICATION_METHOD in props:  # [MQTT-4.12.0-1] CONNACK 0x8C, close
        return rc.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured on this broker"
    return None


def will_refusal(will: Any, maximum_qos: int, retain_available: bool) -> Refusal | None:
    """A will the broker does not support (a malformed one is the codec's, or raised by the
    connection as a protocol error)."""
    if will.qos > maximum_qos:  # [MQTT-3.2.2-12]
        return rc.QOS_NOT_SUPPORTED, "will QoS above the maximum QoS"
    if will.retain and not retain_available:  # [MQTT-3.2.2-13]
        return rc.RETAIN_NOT_SUPPORTED, "retained messages are not available"
    return None
