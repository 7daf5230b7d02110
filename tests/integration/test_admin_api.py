"""The admin API (/api/v1/... on the dashboard listener) and `python -m broker.admin` over it,
with real clients: urllib for HTTP, raw MQTT packets and paho for the clients it acts on."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import paho.mqtt.client as mqtt
import pytest

from broker.auth import hash_password
from broker.protocol import packets as P
from tests.conftest import ROOT, wait_port
from tests.integration.dashboard_http import ADMIN, ADMIN_PW, as_admin, request, start_dashboard, wait_until
from tests.integration.helpers import connect, expect_disconnect
from tests.mqtt_raw import RawClient

pytestmark = pytest.mark.timeout(120)
FAST = {"n": 2 ** 4, "r": 1, "p": 1}


@pytest.fixture
def adm(make_broker, tmp_path):
    return start_dashboard(make_broker, tmp_path)


def test_clients_sessions_and_subscriptions_are_listed(adm):
    a = connect(adm.port, "lister-a")
    a.subscribe("fleet/+/status", qos=1)
    persistent = connect(adm.port, "lister-off", properties={17: 3600})
    persistent.subscribe("fleet/#", qos=2)
    persistent.close()
    try:
        status, r = wait_until(lambda: (lambda x: x if x[1]["matched"] == 2 else None)(
            as_admin(adm.dashboard + "/api/v1/sessions")))
        by = {s["client_id"]: s for s in r["sessions"]}
        assert by["lister-a"]["connected"] is True and by["lister-off"]["connected"] is False
        assert 0 < by["lister-off"]["expires_in"] <= 3600
        _, r = as_admin(adm.dashboard + "/api/v1/sessions?connected=false")
        assert [s["client_id"] for s in r["sessions"]] == ["lister-off"]
        _, r = as_admin(adm.dashboard + "/api/v1/subscriptions")
        assert [(s["client_id"], s["filter"], s["qos"]) for s in r["subscriptions"]] == \
            [("lister-a", "fleet/+/status", 1), ("lister-off", "fleet/#", 2)]
        _, r = as_admin(adm.dashboard + "/api/v1/subscriptions?client_id=lister-off")
        assert r["matched"] == 1
        _, r = as_admin(adm.dashboard + "/api/v1/clients")
        assert [c["client_id"] for c in r["clients"]] == ["lister-a"]
        status, r = as_admin(adm.dashboard + "/api/v1/clients/lister-a")
        assert status == 200 and r["subscriptions"] == [{"filter": "fleet/+/status", "qos": 1}]
        assert as_admin(adm.dashboard + "/api/v1/clients/nobody")[0] == 404
    finally:
        a.close()


def test_kick_disconnects_with_administrative_action(adm):
    c = connect(adm.port, "to-kick")
    status, r = as_admin(adm.dashboard + "/api/v1/clients/to-kick", "DELETE")
    assert status == 200 and r == {"kicked": "to-kick"}
    expect_disconnect(c, 0x98)
    assert as_admin(adm.dashboard + "/api/v1/clients/to-kick", "DELETE")[0] == 404
    assert "action=kick client_id='to-kick' -> ok" in adm.logs()


def test_publish_goes_through_the_broker_retained_and_routed(adm):
    sub = connect(adm.port, "listener")
    sub.subscribe("ops/#", qos=1)
    status, r = as_admin(adm.dashboard + "/api/v1/publish", "POST",
                         {"topic": "ops/notice", "payload": "maintenance at 22:00", "qos": 1,
                          "retain": True, "content_type": "text/plain",
                          "user_properties": [["by", "ops"]]})
    assert status == 200 and r["delivered_to"] == 1
    got = sub.recv(5)
    assert got.type == P.PUBLISH and got.topic == "ops/notice"
    assert got.payload == b"maintenance at 22:00" and got.qos == 1
    late = connect(adm.port, "late")
    late.subscribe("ops/notice")
    retained = late.recv(5)
    assert retained.type == P.PUBLISH and retained.retain
    assert retained.payload == b"maintenance at 22:00"
    status, r = as_admin(adm.dashboard + "/api/v1/publish", "POST",
                         {"topic": "bin/x", "payload": "AP8=", "encoding": "base64"})
    assert status == 200
    for body, words in (({"topic": "a/+"}, "topic name"), ({"topic": "$SYS/x"}, "belong to the broker"),
                        ({"topic": "a", "qos": 3}, "'qos'"), ({"payload": "x"}, "'topic' is required"),
                        ({"topic": "a", "payload": "!!", "encoding": "base64"}, "not base64"),
                        ({"topic": "a", "user_properties": [["k"]]}, "user_properties")):
        status, r = as_admin(adm.dashboard + "/api/v1/publish", "POST", body)
        assert status == 400 and words in r["error"], (body, r)
    sub.close()
    late.close()


def test_retained_messages_are_listed_and_deleted(adm):
    c = connect(adm.port, "retainer")
    for i, t in enumerate(("site/a", "site/b/c")):
        c.publish(t, b"v-" + t.encode(), qos=1, retain=True, pid=i + 1)
    wait_until(lambda: as_admin(adm.dashboard + "/api/v1/retained?filter=site/%23")[1]["matched"] == 2)
    _, r = as_admin(adm.dashboard + "/api/v1/retained?filter=site/%23")
    assert [(x["topic"], x["text"]) for x in r["retained"]] == [("site/a", "v-site/a"),
                                                                 ("site/b/c", "v-site/b/c")]
    status, r = as_admin(adm.dashboard + "/api/v1/retained?topic=site/a", "DELETE")
    assert status == 200
    _, r = as_admin(adm.dashboard + "/api/v1/retained?filter=site/%23")
    assert [x["topic"] for x in r["retained"]] == ["site/b/c"]
    late = connect(adm.port, "late-ret")
    late.subscribe("site/a")
    with pytest.raises(TimeoutError):
        late.recv(0.5)  # nothing retained there any more
    assert as_admin(adm.dashboard + "/api/v1/retained?topic=site/a", "DELETE")[0] == 404
    c.close()
    late.close()


@pytest.mark.parametrize("level, refused", [(P.MQTT_5, 0x8A), (P.MQTT_311, 5)])
def test_banned_client_ids_user_names_and_addresses_are_refused(make_broker, tmp_path, level,
                                                                refused):
    """CONNACK 0x8A Banned (MQTT 3.1.1: return code 5); a connected client that a new ban covers
    is disconnected; bans survive a restart."""
    b = start_dashboard(make_broker, tmp_path)
    live = connect(b.port, "dev-7", level=level)
    status, r = as_admin(b.dashboard + "/api/v1/bans", "POST",
                         {"kind": "clientid", "value": "dev-7", "reason": "stolen"})
    assert status == 200 and r["disconnected"] == ["dev-7"]
    if level == P.MQTT_5:
        expect_disconnect(live, 0x98)
    assert RawClient(b.port, level=level).connect("dev-7").reason_code == refused
    as_admin(b.dashboard + "/api/v1/bans", "POST", {"kind": "username", "value": "mallory"})
    assert RawClient(b.port, level=level).connect("x1", username="mallory").reason_code == refused
    as_admin(b.dashboard + "/api/v1/bans", "POST", {"kind": "address", "value": "127.0.0.0/8",
                                                    "seconds": 3600})
    assert RawClient(b.port, level=level).connect("anyone").reason_code == refused
    _, r = as_admin(b.dashboard + "/api/v1/bans")
    assert [(x["kind"], x["value"]) for x in r["bans"]] == \
        [("address", "127.0.0.0/8"), ("clientid", "dev-7"), ("username", "mallory")]
    # a restart keeps them
    b.stop()
    b.start()
    wait_port(b.dash_port, b.proc)
    assert RawClient(b.port, level=level).connect("dev-7").reason_code == refused
    as_admin(b.dashboard + "/api/v1/bans?kind=address&value=127.0.0.0/8", "DELETE")
    assert RawClient(b.port, level=level).connect("anyone").reason_code == 0
    assert RawClient(b.port, level=level).connect("dev-7").reason_code == refused
    for body, words in (({"kind": "ip", "value": "x"}, "'kind'"),
                        ({"kind": "address", "value": "not-an-ip"}, "not an IP address"),
                        ({"kind": "clientid", "value": ""}, "'value'"),
                        ({"kind": "clientid", "value": "a", "seconds": -1}, "'seconds'")):
        status, r = as_admin(b.dashboard + "/api/v1/bans", "POST", body)
        assert status == 400 and words in r["error"], (body, r)


def test_reload_applies_a_changed_password_file_and_acl_at_once(make_broker, tmp_path):
    pw, acl = tmp_path / "passwd", tmp_path / "acl"
    pw.write_text(f"alice:{hash_password('one', **FAST)}\n")
    acl.write_text("user alice\ntopic read a/#\n")
    b = start_dashboard(make_broker, tmp_path, {"auth.password_file": str(pw),
                                                "auth.acl_file": str(acl),
                                                "auth.reload_interval": 3600,
                                                "auth.cache_seconds": 0})
    pw.write_text(f"alice:{hash_password('one', **FAST)}\ncarol:{hash_password('two', **FAST)}\n")
    acl.write_text("user alice\ntopic read a/#\nuser carol\ntopic read c/#\n")
    assert RawClient(b.port).connect("c1", username="carol", password=b"two").reason_code == 0x86
    status, r = as_admin(b.dashboard + "/api/v1/reload", "POST", {})
    assert status == 200 and r["errors"] == []
    c = connect(b.port, "c1", username="carol", password=b"two")
    assert c.subscribe("c/x").reason_codes == [0]
    acl.write_text("user alice\ntopic read a/#/b\n")
    status, r = as_admin(b.dashboard + "/api/v1/reload", "POST", {})
    assert status == 200 and r["errors"] and "acl:2" in r["errors"][0]
    assert "action=reload errors=1 -> errors" in b.logs()


def test_admin_cli_over_the_api(adm, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BROKER_ADMIN_URL": adm.dashboard,
           "BROKER_ADMIN_USER": ADMIN, "BROKER_ADMIN_PASSWORD": ADMIN_PW}

    def cli(*args, ok=True):
        p = subprocess.run([sys.executable, "-m", "broker.admin", "--data-dir", str(tmp_path),
                            *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert (p.returncode == 0) == ok, p.stderr
        return p

    got = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cli-dev", protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, ud, m: got.append((m.topic, m.payload, m.retain))
    c.on_disconnect = lambda cl, ud, flags, rc, props: got.append(("disconnect", rc.value))
    c.connect("127.0.0.1", adm.port)
    c.loop_start()
    try:
        c.subscribe("cmd/#", qos=1)
        wait_until(lambda: "cli-dev" in cli("clients", "list").stdout)
        assert "cmd/#" in cli("subscriptions", "list").stdout
        cli("publish", "cmd/led", "on", "--qos", "1", "--retain")
        wait_until(lambda: ("cmd/led", b"on", False) in got)
        listed = cli("retained", "list", "--filter", "cmd/#").stdout.splitlines()
        assert listed[0].split() == ["TOPIC", "QOS", "AT", "PAYLOAD"]
        assert listed[1].split()[:2] == ["cmd/led", "1"] and listed[1].endswith("on")
        out = json.loads(cli("--json", "stats").stdout)
        assert out["retained"] == 1 and out["clients_connected"] == 1
        cli("clients", "kick", "cli-dev")
        wait_until(lambda: ("disconnect", 0x98) in got)
        cli("bans", "add", "clientid", "cli-dev", "--reason", "lost")
        assert cli("bans", "list").stdout.splitlines()[1].split()[:2] == ["clientid", "cli-dev"]
        cli("bans", "delete", "clientid", "cli-dev")
        assert cli("bans", "list").stdout == "(none)\n"
        cli("retained", "delete", "cmd/led")
        p = cli("retained", "delete", "cmd/led", ok=False)
        assert "404" in p.stderr and "no retained message" in p.stderr
        cli("reload")
        # wrong credentials: a clear message and a failure status
        env["BROKER_ADMIN_PASSWORD"] = "wrong"
        p = cli("clients", "list", ok=False)
        assert "401" in p.stderr
        # device credentials never work here, and the users command needs no server
        p = cli("users", "--file", str(tmp_path / "ops"), "add", "ann", "--role", "viewer",
                "--password", "pw-ann")
        assert "added 'ann' (viewer)" in p.stdout
        assert cli("users", "--file", str(tmp_path / "ops"), "list").stdout == \
            "NAME  ROLE\nann   viewer\n"
        assert json.loads(cli("--json", "users", "--file", str(tmp_path / "ops"), "list")
                          .stdout) == {"users": [{"name": "ann", "role": "viewer"}]}
    finally:
        c.loop_stop()


def test_viewer_gets_403_on_every_state_change(adm):
    from tests.integration.dashboard_http import VIEWER, VIEWER_PW
    for method, path, body in (("DELETE", "/api/v1/clients/x", None),
                               ("POST", "/api/v1/publish", {"topic": "a"}),
                               ("DELETE", "/api/v1/retained?topic=a", None),
                               ("POST", "/api/v1/bans", {"kind": "clientid", "value": "x"}),
                               ("DELETE", "/api/v1/bans?kind=clientid&value=x", None),
                               ("POST", "/api/v1/reload", {})):
        status, _, raw = request(adm.dashboard + path, method, body, VIEWER, VIEWER_PW,
                                 headers={"X-CSRF-Token": "x"})
        assert status == 403, (method, path)
    assert "refused: not an administrator" in adm.logs()


def test_publish_of_a_topic_mqtt_cannot_carry_is_a_400_and_subscribers_stay(adm):
    """The admin API's publish is held to a PUBLISH's checks: U+0000 [MQTT-4.7.3-2] and a topic
    over 65535 bytes [MQTT-4.7.3-3] are refused with 400 saying why; nothing is retained, and a
    '#' subscriber (3.1.1 and 5) stays connected."""
    subs = [RawClient(adm.port, level=level) for level in (4, 5)]
    for i, c in enumerate(subs):
        c.connect(f"all-{i}")
        c.subscribe("#")
    for topic, says in (("a\x00b", "[MQTT-4.7.3-2]"), ("t/" + "x" * 70_000, "[MQTT-4.7.3-3]")):
        status, r = as_admin(adm.dashboard + "/api/v1/publish", "POST",
                             {"topic": topic, "payload": "x", "retain": True})
        assert status == 400 and says in r["error"], r
    _, r = as_admin(adm.dashboard + "/api/v1/retained")
    assert r["matched"] == 0
    as_admin(adm.dashboard + "/api/v1/publish", "POST", {"topic": "ok", "payload": "fine"})
    for c in subs:
        got = c.recv_type(P.PUBLISH)
        assert (got.topic, got.payload) == ("ok", b"fine")
    late = RawClient(adm.port)
    late.connect("late")
    late.subscribe("#")
    late.send(P.PingReq())
    assert late.recv().type == P.PINGRESP   # no retained message before it


def test_refused_changes_are_audited_one_line_each(adm):
    """A change refused with 400 (bad input) or 403 (a viewer) is audited with its reason; a
    line break in the path (%0A) cannot forge another audit line."""
    from tests.integration.dashboard_http import VIEWER, VIEWER_PW
    status, r = as_admin(adm.dashboard + "/api/v1/publish", "POST", {"topic": "a/#", "payload": "x"})
    assert status == 400
    status, _, _ = request(adm.dashboard + "/api/v1/retained%0Aaudit:%20user='root'%20action=ban%20-%3E%20ok",
                           "DELETE", user=VIEWER, password=VIEWER_PW, headers={"X-CSRF-Token": "x"})
    assert status == 403
    lines = [x for x in adm.logs().splitlines() if "audit:" in x]
    assert any("action=POST /api/v1/publish" in x and "refused" in x and "wildcard" in x
               for x in lines), lines
    forged = [x for x in lines if "retained" in x and "DELETE" in x]
    assert len(forged) == 1 and "\\x0aaudit: user='root'" in forged[0], lines
    assert not [x for x in lines if x.split("audit:", 1)[1].startswith(" user='root' action=ban")]
