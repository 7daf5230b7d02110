"""The CONNECT checks that need only the packet and the listener's facts (broker/core/connect_checks.py),
as a table: each row is a CONNECT and the refusal it gets (or None), with the statement it checks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker.core.connect_checks import client_id_refusal, login_refusal, will_refusal
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc

CLIENT_IDS = [
    # (client id, level, clean start, code or None, why) [MQTT-3.1.3-8]
    ("", P.MQTT_5, False, None, "v5: an empty id with Clean Start 0 gets an assigned id [MQTT-3.1.3-6]"),
    ("", P.MQTT_311, True, None, "3.1.1: an empty id with clean session is assigned one"),
    ("", P.MQTT_311, False, rc.CLIENT_IDENTIFIER_NOT_VALID, "3.1.1: an empty id needs clean session"),
    ("", P.MQTT_31, True, rc.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 has no assigned ids"),
    ("a" * 23, P.MQTT_311, True, None, "23 characters, the length every server must take"),
    ("a" * 24, P.MQTT_311, True, rc.CLIENT_IDENTIFIER_NOT_VALID, "longer than the limit"),
    ("dev\nforged log line", P.MQTT_5, True, rc.CLIENT_IDENTIFIER_NOT_VALID, "a control character"),
    ("dev\x85", P.MQTT_5, True, rc.CLIENT_IDENTIFIER_NOT_VALID, "a C1 control character"),
    ("dev/1 é", P.MQTT_5, True, None, "any other UTF-8"),
]


@pytest.mark.parametrize("cid,level,clean,code,why", CLIENT_IDS, ids=[r[4] for r in CLIENT_IDS])
def test_client_id_refusals(cid, level, clean, code, why):
    """[MQTT-3.1.3-8]: a client id the server does not accept is refused with 0x85 (3.1.x: 2)."""
    got = client_id_refusal(cid, level, clean, max_length=23)
    assert (got[0] if got else None) == code
    if got:
        assert got[1]  # a reason a person can read


LOGINS = [
    # (user name, properties, identity, anonymous allowed, code or None)
    ("alice", {}, None, False, None),
    (None, {}, None, True, None),
    (None, {}, None, False, rc.NOT_AUTHORIZED),
    (None, {}, "cert-user", False, None),           # the certificate is the user
    ("al\x00ice", {}, None, True, rc.BAD_USER_NAME_OR_PASSWORD),
    ("al\x00ice", {}, "cert-user", True, None),     # the CONNECT's name is not used then
    ("alice", {PR.AUTHENTICATION_METHOD: "SCRAM-SHA-1"}, None, True, rc.BAD_AUTHENTICATION_METHOD),
]


@pytest.mark.parametrize("user,props,identity,anonymous,code", LOGINS)
def test_login_refusals(user, props, identity, anonymous, code):
    """[MQTT-4.12.0-1]: an Authentication Method the server does not support is refused with
    0x8C; user names with control characters and anonymous remote clients are refused before any
    password is checked."""
    got = login_refusal(user, props, identity=identity, anonymous_allowed=anonymous)
    assert (got[0] if got else None) == code


@pytest.mark.parametrize("qos,retain,maximum_qos,retain_available,code", [
    (2, False, 2, True, None),
    (2, False, 1, True, rc.QOS_NOT_SUPPORTED),
    (1, True, 2, False, rc.RETAIN_NOT_SUPPORTED),
    (0, True, 0, True, None),
])
def test_will_refusals(qos, retain, maximum_qos, retain_available, code):
    """[MQTT-3.2.2-12]: a will QoS above Maximum QoS is refused with 0x9B; [MQTT-3.2.2-13]: a
    retained will without retain support with 0x9A."""
    will = SimpleNamespace(qos=qos, retain=retain)
    got = will_refusal(will, maximum_qos, retain_available)
    assert (got[0] if got else None) == code
