"""The dashboard's HTTP API through real sockets, against a broker process (no Spark needed:
the history endpoint's answers from Spark are in tests/e2e/test_dashboard_history.py)."""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from broker.auth import hash_password
from tests.conftest import free_port, wait_port

pytestmark = pytest.mark.timeout(120)


def get(url: str, user: str | None = None, password: str | None = None, timeout: float = 30):
    req = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(url: str, **kw):
    status, _, body = get(url, **kw)
    return status, json.loads(body)


@pytest.fixture
def dash(make_broker):
    port, metrics = free_port(), free_port()
    b = make_broker({"dashboard.enabled": True, "dashboard.port": port,
                     "dashboard.sample_seconds": 0.5, "dashboard.max_topics": 50,
                     "dashboard.connect_url": f"sc://127.0.0.1:{free_port()}",
                     "metrics.enabled": True, "metrics.port": metrics})
    wait_port(port, b.proc)
    wait_port(metrics, b.proc)
    b.dashboard = f"http://127.0.0.1:{port}"
    b.metrics = f"http://127.0.0.1:{metrics}"
    return b


def client(b, cid, protocol=mqtt.MQTTv5, user=None, password=None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=protocol)
    if user:
        c.username_pw_set(user, password)
    c.connect("127.0.0.1", b.port)
    c.loop_start()
    return c


def wait_until(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_page_and_vendored_chart_library_are_served(dash):
    status, headers, body = get(dash.dashboard + "/")
    assert status == 200 and b"uPlot.iife.min.js" in body and b"app.js" in body
    status, _, body = get(dash.dashboard + "/static/vendor/uPlot.iife.min.js")
    assert status == 200 and b"uPlot" in body[:200] and b"MIT" in body[:200]
    status, _, _ = get(dash.dashboard + "/static/../api.py")
    assert status in (403, 404)
    # the metrics listener still serves Prometheus and health beside it
    status, _, body = get(dash.metrics + "/metrics")
    assert status == 200 and b"mqtt_connections" in body
    assert get(dash.metrics + "/health")[0] == 200


def test_clients_listed_with_details_and_searchable(dash):
    a = client(dash, "sensor-a", mqtt.MQTTv311, user="alice")
    b = client(dash, "sensor-b")
    try:
        a.subscribe("cmd/a/#", qos=1)
        b.subscribe("cmd/b/+", qos=2)
        r = wait_until(lambda: (lambda r: r if r["matched"] == 2 and all(c["subscriptions"] for c in r["clients"]) else None)(
            get_json(dash.dashboard + "/api/clients")[1]))
        by = {c["client_id"]: c for c in r["clients"]}
        assert by["sensor-a"]["protocol"] == "3.1.1" and by["sensor-a"]["username"] == "alice"
        assert by["sensor-b"]["protocol"] == "5.0" and by["sensor-b"]["username"] is None
        assert by["sensor-a"]["subscriptions"] == [{"filter": "cmd/a/#", "qos": 1}]
        assert by["sensor-b"]["subscriptions"] == [{"filter": "cmd/b/+", "qos": 2}]
        assert by["sensor-a"]["address"].startswith("127.0.0.1:")
        assert abs(by["sensor-a"]["connected_since"] - time.time()) < 120
        assert by["sensor-a"]["inflight"] == 0 and by["sensor-a"]["queued"] == 0
        _, r = get_json(dash.dashboard + "/api/clients?q=SOR-B")
        assert [c["client_id"] for c in r["clients"]] == ["sensor-b"] and r["connected"] == 2
        _, r = get_json(dash.dashboard + "/api/clients?q=nobody")
        assert r["clients"] == [] and r["matched"] == 0
        _, r = get_json(dash.dashboard + "/api/clients?limit=1")
        assert len(r["clients"]) == 1 and r["matched"] == 2
    finally:
        for c in (a, b):
            c.loop_stop()
            c.disconnect()


def test_topics_tree_has_retained_values_and_rates(dash):
    c = client(dash, "pub")
    try:
        c.publish("home/kitchen/temp", b"21.5", qos=1, retain=True).wait_for_publish(5)
        c.publish("home/bin", b"\xff\x00", qos=0, retain=True)
        c.publish("$internal/x", b"1", qos=1, retain=True).wait_for_publish(5)
        for i in range(20):
            c.publish("home/hall/motion", str(i).encode(), qos=1).wait_for_publish(5)

        def rated():
            _, r = get_json(dash.dashboard + "/api/topics?filter=home/%23")
            by = {t["topic"]: t for t in r["topics"]}
            return by if by.get("home/hall/motion", {}).get("rate", 0) > 0 else None
        by = wait_until(rated)
        assert by["home/kitchen/temp"]["retained"]["text"] == "21.5"
        assert by["home/kitchen/temp"]["retained"]["qos"] == 1
        assert by["home/bin"]["retained"]["base64"] == base64.b64encode(b"\xff\x00").decode()
        assert by["home/hall/motion"]["count"] == 20 and "retained" not in by["home/hall/motion"]
        _, r = get_json(dash.dashboard + "/api/topics")
        assert not any(t["topic"].startswith("$") for t in r["topics"])  # '#' skips $ topics
        status, r = get_json(dash.dashboard + "/api/topics?filter=home/%23/x")
        assert status == 400 and "invalid topic filter" in r["error"]
    finally:
        c.loop_stop()
        c.disconnect()


def test_per_topic_counters_are_bounded(dash):
    """dashboard.max_topics = 50: 200 distinct topics never make the counter hold more."""
    c = client(dash, "many")
    try:
        for i in range(200):
            c.publish(f"many/{i}", b"x", qos=1).wait_for_publish(5)
        _, r = get_json(dash.dashboard + "/api/topics?filter=many/%23")
        assert r["max_counted_topics"] == 50 and r["counted_topics"] <= 50
        assert 0 < r["matched"] <= 50
    finally:
        c.loop_stop()
        c.disconnect()


def test_live_series_have_rates_by_qos(dash):
    c = client(dash, "live")
    try:
        for i in range(30):
            c.publish("live/t", b"1", qos=1).wait_for_publish(5)

        def seen():
            _, r = get_json(dash.dashboard + "/api/live")
            return r if any(p["in"][1] > 0 for p in r["points"]) else None
        r = wait_until(seen)
        p = r["points"][-1]
        assert set(p["dropped"]) >= {"queue_full", "expired", "slow_consumer", "sink_refused"}
        assert r["totals"]["received_by_qos"][1] >= 30 and r["totals"]["connections"] >= 1
        assert r["sink"] is None  # no sink in this broker
        assert r["history"]["running"] is False
        last = r["points"][-1]["t"]
        _, r2 = get_json(dash.dashboard + f"/api/live?since={last}")
        assert all(q["t"] > last for q in r2["points"])
        status, r = get_json(dash.dashboard + "/api/live?since=yesterday")
        assert status == 400 and "since" in r["error"]
    finally:
        c.loop_stop()
        c.disconnect()


@pytest.mark.parametrize("query, status, words", [
    ("filter=a/%23/b", 400, "invalid topic filter"),
    ("filter=sport%2Btennis", 400, "invalid topic filter"),
    ("filter=", 400, "give a topic filter"),
    ("filter=%24share/g/a", 400, "shared subscription"),
    ("filter=a&from=2026-05-01T10:00:00Z&to=2026-05-01T10:00:00Z", 400, "empty time range"),
    ("filter=a&from=2026-05-02T00:00:00Z&to=2026-05-01T00:00:00Z", 400, "empty time range"),
    ("filter=a&from=tuesday", 400, "'from' must be a time"),
    ("filter=a&from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z", 400, "longer than 31 days"),
    ("filter=sensors/%23", 503, "the history job is not running"),
])
def test_history_bad_input_and_job_not_running_get_clear_json_errors(dash, query, status, words):
    got, r = get_json(dash.dashboard + "/api/history?" + query)
    assert got == status and words in r["error"], r
    assert "Traceback" not in r["error"]


def test_dashboard_needs_the_brokers_passwords(make_broker, tmp_path):
    pw = tmp_path / "passwd"
    pw.write_text(f"alice:{hash_password('wonderland')}\nbob:{hash_password('builder')}\n")
    port = free_port()
    b = make_broker({"auth.password_file": str(pw), "dashboard.enabled": True,
                     "dashboard.port": port, "dashboard.users": "alice"})
    wait_port(port, b.proc)
    url = f"http://127.0.0.1:{port}"
    for path in ("/", "/api/live", "/api/clients", "/static/app.js"):
        status, headers, body = get(url + path)
        assert status == 401, path
        assert headers.get("WWW-Authenticate", "").startswith("Basic realm=")
    assert get(url + "/api/live", "alice", "wrong")[0] == 401
    assert get(url + "/api/live", "mallory", "wonderland")[0] == 401
    assert get(url + "/api/live", "bob", "builder")[0] == 401  # not in dashboard.users
    status, _, body = get(url + "/api/live", "alice", "wonderland")
    assert status == 200 and "points" in json.loads(body)
    assert get(url + "/", "alice", "wonderland")[0] == 200
    assert b.alive()


def test_bad_dashboard_setting_stops_the_broker_with_a_message(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT
    p = subprocess.run([sys.executable, "-m", "broker", "--port", str(free_port()),
                        "--data-dir", str(tmp_path), "--set", "dashboard.enabled=true",
                        "--set", "dashboard.sample_seconds=0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "dashboard.sample_seconds" in p.stderr
