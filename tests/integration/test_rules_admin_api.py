"""Continuous rules on a running broker (`python -m broker --config F`): the rules' MQTT client
($rules) through a real socket, /api/v1/rules and `python -m broker.admin rules ...` over it.
The history job is not running here: adding a rule is refused (its SQL cannot be checked)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from broker.protocol import packets as P
from settings import rules as spec
from tests.conftest import ROOT
from tests.integration.dashboard_http import ADMIN, ADMIN_PW, as_admin, start_dashboard
from tests.integration.helpers import connect
from tests.mqtt_raw import RawClient

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[[history.rules]]
name = "hot"
sql = "SELECT topic, payload_json:temp::double AS temp FROM messages WHERE payload_json:temp::double > 30"
publish = "alerts/hot"
"""


@pytest.fixture
def rb(make_broker, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(CONFIG)
    spec.write_store(str(tmp_path), spec.Store([spec.check(
        {"name": "cold", "sql": "SELECT topic FROM messages", "publish": "alerts/cold"})]))
    b = start_dashboard(make_broker, tmp_path, args=["--config", str(cfg)])
    b.rules_password = (tmp_path / "secrets" / "rules.password").read_text().strip().encode()
    return b


def rules_client(port: int, password: bytes) -> tuple[RawClient, P.Connack]:
    c = RawClient(port)
    return c, c.connect("rules-job", username=spec.RULES_USER, password=password)


def published(c: RawClient, topic: str, pid: int) -> int:
    c.publish(topic, b'{"temp": 31}', qos=1, pid=pid)
    ack = c.recv(5)
    assert ack.type == P.PUBACK
    return ack.reason_code


def test_rules_client_logs_in_with_its_password_and_publishes_to_its_topics_only(rb):
    """The broker's own account, with anonymous clients allowed (no [auth]): a wrong password
    is CONNACK 0x86 [MQTT-3.2.2-8]; with the password of <data_dir>/secrets/rules.password it
    publishes to the rules' topics (a subscriber gets the row) and nowhere else (PUBACK 0x87)."""
    bad, ack = rules_client(rb.port, b"guess")
    assert ack.reason_code == 0x86
    bad.close()
    sub = connect(rb.port, "watcher")
    sub.subscribe("alerts/#", qos=1)
    c, ack = rules_client(rb.port, rb.rules_password)
    assert ack.reason_code == 0
    try:
        assert published(c, "alerts/hot", 1) == 0
        got = sub.recv(5)
        assert got.type == P.PUBLISH and got.topic == "alerts/hot"
        assert published(c, "alerts/cold", 3) == 0               # the store's rule
        assert published(c, "devices/1/cmd", 4) == 0x87          # no rule publishes there
        # removing the store's rule takes its topic away from the client
        status, r = as_admin(rb.dashboard + "/api/v1/rules/cold", "DELETE")
        assert status == 200 and r == {"removed": "cold"}
        assert published(c, "alerts/cold", 5) == 0x87
    finally:
        c.close()
        sub.close()


def test_rules_are_listed_paused_and_removed_through_the_admin_api(rb):
    status, r = as_admin(rb.dashboard + "/api/v1/rules")
    assert status == 200
    assert [(x["name"], x["source"], x["publish"], x["state"]) for x in r["rules"]] == \
        [("hot", "config", "alerts/hot", "not started"), ("cold", "store", "alerts/cold",
                                                          "not started")]
    assert r["status_stale"] is True
    status, r = as_admin(rb.dashboard + "/api/v1/rules/hot", "DELETE")
    assert status == 400 and "defined in the config file: remove it there" in r["error"]
    status, r = as_admin(rb.dashboard + "/api/v1/rules/hot/pause", "POST", {})
    assert status == 200 and r == {"paused": "hot"}
    doc = json.loads((rb.data_dir / "rules" / "rules.json").read_text())
    assert doc["paused"] == ["hot"] and [x["name"] for x in doc["rules"]] == ["cold"]
    status, r = as_admin(rb.dashboard + "/api/v1/rules/hot/resume", "POST", {})
    assert status == 200 and json.loads(
        (rb.data_dir / "rules" / "rules.json").read_text())["paused"] == []
    assert as_admin(rb.dashboard + "/api/v1/rules/nosuch/pause", "POST", {})[0] == 404
    logs = rb.logs()
    assert "action=rule-pause name='hot' -> ok" in logs
    assert "action=rule-resume name='hot' -> ok" in logs
    assert "DELETE /api/v1/rules/hot -> refused" in logs


def test_adding_a_rule_needs_the_job_to_check_its_sql(rb):
    """Nothing checks the SQL but the job's Spark: without the job, 503 saying how to start it,
    and nothing stored; a malformed rule is 400 before that."""
    status, r = as_admin(rb.dashboard + "/api/v1/rules", "POST",
                         {"name": "loud", "sql": "SELECT topic FROM messages", "publish": "a/b"})
    assert status == 503 and "must run to check" in r["error"] and "sink.job" in r["error"]
    status, r = as_admin(rb.dashboard + "/api/v1/rules", "POST",
                         {"name": "loud", "sql": "SELECT 1", "publish": "a/#"})
    assert status == 400 and "no wildcards" in r["error"]
    assert [x["name"] for x in json.loads(
        (rb.data_dir / "rules" / "rules.json").read_text())["rules"]] == ["cold"]


def test_rules_cli_lists_pauses_and_refuses_without_the_job(rb, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BROKER_ADMIN_URL": rb.dashboard,
           "BROKER_ADMIN_USER": ADMIN, "BROKER_ADMIN_PASSWORD": ADMIN_PW}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "broker.admin", "--data-dir", str(tmp_path),
                               *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)

    p = cli("rules", "pause", "cold")
    assert p.returncode == 0, p.stderr
    p = cli("rules", "list")
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "TARGET", "STATE", "ROWS/S", "ROWS", "ERROR"]
    assert lines[1].split()[:4] == ["hot", "config", "alerts/hot", "not"]
    assert lines[2].split()[:4] == ["cold", "store", "alerts/cold", "paused"]
    assert "is the job running?" in p.stdout
    p = cli("rules", "add", "loud", "--sql", "SELECT topic FROM messages", "--publish", "a/b")
    assert p.returncode == 1 and "HTTP 503" in p.stderr and "must run to check" in p.stderr
    p = cli("rules", "remove", "cold")
    assert p.returncode == 0, p.stderr
    p = cli("rules", "remove", "hot")
    assert p.returncode == 1 and "defined in the config file" in p.stderr
