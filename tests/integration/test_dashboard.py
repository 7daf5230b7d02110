"""The dashboard's HTTP API through real sockets, against a broker process (no Spark needed:
the history endpoint's answers from Spark are in tests/e2e/test_dashboard_history.py)."""
from __future__ import annotations

import base64
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time

import paho.mqtt.client as mqtt
import pytest

from broker.auth import hash_password
from tests.conftest import ROOT, free_port, wait_port
from tests.integration.dashboard_http import (
    ADMIN,
    ADMIN_PW,
    VIEWER,
    VIEWER_PW,
    request,
    start_dashboard,
    wait_until,
)
from tests.integration.dashboard_http import get as _get
from tests.integration.dashboard_http import get_json as _get_json

pytestmark = pytest.mark.timeout(120)
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def get(url, user=VIEWER, password=VIEWER_PW, **kw):
    """As the read-only operator unless told otherwise."""
    return _get(url, user, password, **kw)


def get_json(url, user=VIEWER, password=VIEWER_PW, **kw):
    return _get_json(url, user=user, password=password, **kw)


@pytest.fixture
def dash(make_broker, tmp_path):
    metrics = free_port()
    b = start_dashboard(make_broker, tmp_path, {
        "dashboard.sample_seconds": 0.5, "dashboard.max_topics": 50,
        "metrics.enabled": True, "metrics.port": metrics, "metrics.sys_interval": 1})
    wait_port(metrics, b.proc)
    b.metrics = f"http://127.0.0.1:{metrics}"
    return b


def client(b, cid, protocol=mqtt.MQTTv5, user=None, password=None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=protocol)
    if user:
        c.username_pw_set(user, password)
    c.connect("127.0.0.1", b.port)
    c.loop_start()
    return c


def test_page_and_vendored_chart_library_are_served(dash):
    status, headers, body = get(dash.dashboard + "/")
    assert status == 200 and b"uPlot.iife.min.js" in body and b"app.js" in body
    status, _, body = get(dash.dashboard + "/static/vendor/uPlot.iife.min.js")
    assert status == 200 and b"uPlot" in body[:200] and b"MIT" in body[:200]
    status, _, _ = get(dash.dashboard + "/static/../api.py")
    assert status in (403, 404)
    status, headers, body = get(dash.dashboard + "/favicon.ico")
    assert status == 200 and headers["Content-Type"].startswith("image/svg") and b"<svg" in body
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
        r = wait_until(lambda: (lambda r: r if r["matched"] == 2 and all(
            c["subscriptions"] for c in r["clients"]) else None)(get_json(dash.dashboard + "/api/clients")[1]))
        by = {c["client_id"]: c for c in r["clients"]}
        assert by["sensor-a"]["protocol"] == "3.1.1" and by["sensor-a"]["username"] == "alice"
        assert by["sensor-b"]["protocol"] == "5.0" and by["sensor-b"]["username"] is None
        assert by["sensor-a"]["subscriptions"] == [{"filter": "cmd/a/#", "qos": 1}]
        assert by["sensor-b"]["subscriptions"] == [{"filter": "cmd/b/+", "qos": 2}]
        assert by["sensor-a"]["address"].startswith("127.0.0.1:")
        assert ISO_UTC.match(by["sensor-a"]["connected_since"]), by["sensor-a"]
        assert abs(_epoch(by["sensor-a"]["connected_since"]) - time.time()) < 120
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
        for _ in range(30):
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
        assert ISO_UTC.match(r["now"]) and all(ISO_UTC.match(q["t"]) for q in r["points"])
        last = r["points"][-1]["t"]
        _, r2 = get_json(dash.dashboard + f"/api/live?since={last}")
        assert all(q["t"] > last for q in r2["points"])
        status, r = get_json(dash.dashboard + "/api/live?since=yesterday")
        assert status == 400 and "since" in r["error"]
    finally:
        c.loop_stop()
        c.disconnect()


@pytest.mark.parametrize("keep_until", ["history", "kafka"])
def test_live_points_carry_the_history_jobs_lag_when_the_sink_runs(make_broker, tmp_path, keep_until):
    """The Lag chart's "history job: since last commit" line: every live point has
    history_lag_seconds, from the sink that follows the job's commits (keep_until = "history":
    a number of seconds; "kafka": null, and the sink's figures say so)."""
    b = start_dashboard(make_broker, tmp_path, {
        "dashboard.sample_seconds": 0.5, "sink.enabled": True, "sink.forwarder": "thread",
        "sink.bootstrap_servers": f"127.0.0.1:{free_port()}", "sink.keep_until": keep_until})
    c = client(b, "lag")
    try:
        c.publish("lag/t", b"1", qos=1).wait_for_publish(5)

        def points():
            _, r = get_json(b.dashboard + "/api/live")
            return r if len(r["points"]) >= 2 else None
        r = wait_until(points)
        assert r["sink"] is not None and "history_lag_seconds" in r["sink"]
        for p in r["points"]:
            assert "history_lag_seconds" in p and "kafka_lag_seconds" in p, p
            if keep_until == "history":
                assert isinstance(p["history_lag_seconds"], (int, float)) and p["history_lag_seconds"] >= 0
            else:
                assert p["history_lag_seconds"] is None
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


def test_bad_dashboard_setting_stops_the_broker_with_a_message(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT
    p = subprocess.run([sys.executable, "-m", "broker", "--port", str(free_port()),
                        "--data-dir", str(tmp_path), "--set", "dashboard.enabled=true",
                        "--set", "dashboard.sample_seconds=0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "dashboard.sample_seconds" in p.stderr


def _epoch(text: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---- who may use the dashboard -----------------------------------------------------------------

API_PATHS = ("/api/live", "/api/clients", "/api/topics?filter=%23", "/api/history?filter=%23",
             "/api/me", "/api/v1/clients", "/api/v1/sessions", "/api/v1/subscriptions",
             "/api/v1/retained?filter=%23", "/api/v1/bans", "/api/v1/stats")
FAST = {"n": 2 ** 4, "r": 1, "p": 1}


def test_device_credentials_never_reach_the_dashboard(make_broker, tmp_path):
    """Device accounts (the MQTT password file) do not log in: bob, refused `secret/alice/#` by
    the ACL over MQTT, cannot read alice's retained PIN through the dashboard either."""
    pw, acl = tmp_path / "passwd", tmp_path / "acl"
    pw.write_text(f"alice:{hash_password('wonderland', **FAST)}\n"
                  f"bob:{hash_password('builder', **FAST)}\n")
    acl.write_text("user alice\ntopic readwrite secret/alice/#\nuser bob\ntopic readwrite bob/#\n")
    b = start_dashboard(make_broker, tmp_path, {"auth.password_file": str(pw),
                                                "auth.acl_file": str(acl),
                                                "dashboard.login_failures": 1000})
    a = client(b, "alice-phone", user="alice", password="wonderland")
    try:
        a.publish("secret/alice/pin", b"PIN=1234", qos=1, retain=True).wait_for_publish(5)
        for user, password in (("bob", "builder"), ("alice", "wonderland")):
            for path in API_PATHS:
                status, _, body = get(b.dashboard + path, user, password)
                assert status == 401 and b"PIN=1234" not in body, (user, path, status)
            status, _, body = request(b.dashboard + "/api/login", "POST",
                                      {"user": user, "password": password})
            assert status == 401 and "device credentials" in json.loads(body)["error"]
            assert "Set-Cookie" not in dict(_)
        # an operator sees it: the secret is there to be found
        status, r = get_json(b.dashboard + "/api/topics?filter=secret/%23", ADMIN, ADMIN_PW)
        assert status == 200 and r["topics"][0]["retained"]["text"] == "PIN=1234"
    finally:
        a.loop_stop()
        a.disconnect()


def test_every_api_path_needs_a_login_without_a_password_file(dash):
    for path in API_PATHS:
        status, headers, body = get(dash.dashboard + path, None, None)
        assert status == 401, path
        assert "log in" in json.loads(body)["error"]
        assert "WWW-Authenticate" not in headers  # no browser password prompt that caches
    assert get(dash.dashboard + "/api/live", VIEWER, "wrong")[0] == 401
    assert get(dash.dashboard + "/api/live", "nobody", VIEWER_PW)[0] == 401
    # the page itself holds no data: served, and it shows a login form
    status, _, body = get(dash.dashboard + "/", None, None)
    assert status == 200 and b'id="login"' in body


def test_first_start_creates_an_administrator_whose_password_only_the_owner_reads(make_broker,
                                                                                   tmp_path):
    port = free_port()
    b = make_broker({"dashboard.enabled": True, "dashboard.port": port})
    wait_port(port, b.proc)
    secret = tmp_path / "dashboard-admin-password"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "dashboard-users").stat().st_mode) == 0o600
    password = secret.read_text().strip()
    assert len(password) >= 20
    wait_until(lambda: str(secret) in b.logs())
    assert "first administrator 'admin'" in b.logs()
    assert password not in b.logs()  # the log says where it is, never what it is
    status, r = get_json(f"http://127.0.0.1:{port}/api/me", "admin", password)
    assert status == 200 and r["role"] == "admin"
    # a restart keeps the account and does not make another password
    b.stop()
    before = secret.stat().st_mtime_ns
    b = make_broker({"dashboard.enabled": True, "dashboard.port": port})
    wait_port(port, b.proc)
    assert secret.stat().st_mtime_ns == before
    assert get(f"http://127.0.0.1:{port}/api/me", "admin", password)[0] == 200


def test_first_administrator_password_from_the_environment(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "MQTT_BROKER_DASHBOARD__INITIAL_ADMIN_PASSWORD": "from-the-env-1"}
    p = subprocess.Popen([sys.executable, "-m", "broker", "--port", str(free_port()),
                          "--host", "127.0.0.1", "--data-dir", str(tmp_path),
                          "--set", "dashboard.enabled=true", "--set", f"dashboard.port={port}",
                          "--set", "dashboard.initial_admin=boss"], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, p)
        assert not (tmp_path / "dashboard-admin-password").exists()
        status, r = get_json(f"http://127.0.0.1:{port}/api/me", "boss", "from-the-env-1")
        assert status == 200 and r["user"] == "boss" and r["role"] == "admin"
    finally:
        p.terminate()
        p.wait(20)


def _raw_get(port: int, host_header: str, path: str = "/api/live") -> tuple[int, bytes]:
    """A request with exactly this Host header (urllib would set its own)."""
    auth = base64.b64encode(f"{VIEWER}:{VIEWER_PW}".encode()).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nAuthorization: Basic {auth}"
                  f"\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_host_headers_that_are_not_the_dashboards_names_are_refused(make_broker, tmp_path):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 must not read."""
    b = start_dashboard(make_broker, tmp_path, {"dashboard.allowed_hosts": "broker.lan"})
    port = b.dash_port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example",
                 "localhost.", "", "[::2]", "local host"):
        if host == "localhost.":
            continue  # the same name as localhost
        status, body = _raw_get(port, host)
        assert status == 421, host
        assert b"allowed_hosts" in body
    for path in ("/", "/static/app.js"):
        assert _raw_get(port, "evil.example", path)[0] == 421
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST", f"[::1]:{port}",
                 f"broker.lan:{port}"):
        assert _raw_get(port, host)[0] == 200, host


def _login(url, user=ADMIN, password=ADMIN_PW):
    status, headers, body = request(url + "/api/login", "POST", {"user": user, "password": password})
    assert status == 200, body
    cookie = headers["Set-Cookie"]
    return cookie.split(";")[0], json.loads(body), cookie


def test_login_opens_a_session_cookie_that_scripts_and_the_page_reuse(dash):
    jar, me, raw = _login(dash.dashboard)
    attrs = [a.strip().lower() for a in raw.split(";")]
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/" in attrs
    assert "secure" not in attrs  # plain http here: Secure only on https
    assert me["role"] == "admin" and me["csrf_token"] and ISO_UTC.match(me["expires_at"])
    for _ in range(3):
        assert request(dash.dashboard + "/api/live", headers={"Cookie": jar})[0] == 200
    status, _, body = request(dash.dashboard + "/api/me", headers={"Cookie": jar})
    assert json.loads(body)["user"] == ADMIN
    # logout ends it, server-side
    request(dash.dashboard + "/api/logout", "POST", b"",
            headers={"Cookie": jar, "X-CSRF-Token": me["csrf_token"]})
    assert request(dash.dashboard + "/api/live", headers={"Cookie": jar})[0] == 401
    # HTTP Basic opens a session too (one hash), given back as a cookie
    status, headers, _ = get(dash.dashboard + "/api/live", VIEWER, VIEWER_PW)
    assert status == 200 and "broker_session=" in headers.get("Set-Cookie", "")


def test_a_script_logging_in_at_every_call_logs_one_line_not_one_per_call(dash):
    """The admin CLI and scripts log in afresh at every call: one INFO "logged in" line per
    account and address, not one per call (the changes they make are audited one by one)."""
    for _ in range(5):
        _login(dash.dashboard)
    _login(dash.dashboard, VIEWER, VIEWER_PW)
    lines = [ln for ln in dash.logs().splitlines() if " INFO " in ln and "logged in from" in ln]
    assert len([ln for ln in lines if repr(ADMIN) in ln]) == 1, lines
    assert len([ln for ln in lines if repr(VIEWER) in ln]) == 1, lines


def test_a_password_change_or_removal_ends_the_accounts_sessions_at_once(dash, tmp_path):
    """The old cookie and the old HTTP Basic password stop working on the next request after
    the accounts file changes; the new password works; a removed account's sessions end."""
    from broker.admin.accounts import delete_account, set_account
    users = str(tmp_path / "operators")
    live = dash.dashboard + "/api/live"
    jar, me, _ = _login(dash.dashboard)
    assert get(live, ADMIN, ADMIN_PW)[0] == 200          # a Basic session, reused below
    assert request(live, headers={"Cookie": jar})[0] == 200
    viewer_jar, _, _ = _login(dash.dashboard, VIEWER, VIEWER_PW)
    set_account(users, ADMIN, "admin", "new-secret")     # python -m broker.admin users passwd
    status, _, body = request(live, headers={"Cookie": jar})
    assert status == 401 and "password" in json.loads(body)["error"]
    assert get(live, ADMIN, ADMIN_PW)[0] == 401
    set_account(users, ADMIN, "admin", "newer-secret")  # changed again, no request since
    assert request(dash.dashboard + "/api/login", "POST",
                   {"user": ADMIN, "password": "new-secret"})[0] == 401
    assert get(live, ADMIN, "newer-secret")[0] == 200
    assert request(live, headers={"Cookie": viewer_jar})[0] == 200   # other accounts go on
    delete_account(users, VIEWER)
    assert request(live, headers={"Cookie": viewer_jar})[0] == 401
    assert get(live, VIEWER, VIEWER_PW)[0] == 401


def test_wrong_passwords_for_an_account_from_one_address_take_turns(dash):
    """After login_failures wrong passwords for one account from one address, its checks are
    one second apart: a burst of guesses is slowed, those beyond the wait bound get 429 with
    Retry-After, nothing hashed; the right password still gets in; other accounts from the same
    address are not slowed."""
    import concurrent.futures
    url = dash.dashboard + "/api/login"
    for _ in range(5):   # [dashboard] login_failures: checked, refused at once
        assert request(url, "POST", {"user": ADMIN, "password": "guess"})[0] == 401
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: request(url, "POST", {"user": ADMIN, "password": "guess"})[0],
                                range(4)))
    assert answers == [401] * 4 and time.monotonic() - t0 >= 2.5   # turns 0, 1, 2, 3 s away
    t0 = time.monotonic()
    assert request(url, "POST", {"user": VIEWER, "password": VIEWER_PW})[0] == 200
    assert time.monotonic() - t0 < 2.0       # another account: no turn to wait for
    status, headers, body = request(url, "POST", {"user": ADMIN, "password": ADMIN_PW})
    assert status == 200                     # after its turn
    # a good login cleared the pair: wrong passwords are checked at once again
    t0 = time.monotonic()
    assert request(url, "POST", {"user": ADMIN, "password": "guess"})[0] == 401
    assert time.monotonic() - t0 < 2.0


def test_the_owner_logs_in_while_someone_guesses_from_the_same_address(dash):
    """Someone polling wrong passwords for the account from 127.0.0.1 does not lock its owner
    out: every right login, from the same address, gets in after a short wait (at most a few
    turns of one second), over HTTP Basic too."""
    import threading
    url = dash.dashboard + "/api/login"
    stop = threading.Event()
    guesses = []

    def guess():
        while not stop.is_set():
            guesses.append(request(url, "POST", {"user": ADMIN, "password": "guess"})[0])
    attacker = threading.Thread(target=guess, daemon=True)
    attacker.start()
    try:
        wait_until(lambda: len(guesses) >= 6)        # past login_failures: throttled
        answers, waits = [], []
        for i in range(6):
            t0 = time.monotonic()
            if i % 2:
                answers.append(get(dash.dashboard + "/api/me", ADMIN, ADMIN_PW)[0])
            else:
                answers.append(request(url, "POST", {"user": ADMIN, "password": ADMIN_PW})[0])
            waits.append(time.monotonic() - t0)
        assert answers == [200] * 6, (answers, waits)
        assert max(waits) < 10, waits
    finally:
        stop.set()
        attacker.join(30)
    assert 401 in guesses


def test_changes_need_the_admin_role_a_csrf_token_and_the_same_origin(dash):
    url = dash.dashboard + "/api/v1/retained?topic=a/b"
    # a viewer reads but changes nothing
    status, _, body = request(url, "DELETE", user=VIEWER, password=VIEWER_PW,
                              headers={"X-CSRF-Token": "x"})
    assert status == 403 and "admin role" in json.loads(body)["error"]
    jar, me, _ = _login(dash.dashboard)
    for headers in ({"Cookie": jar},                                     # no token
                    {"Cookie": jar, "X-CSRF-Token": "forged"},           # not the session's
                    {"Cookie": jar, "X-CSRF-Token": me["csrf_token"],    # another site
                     "Origin": "http://evil.example"},
                    {"Cookie": jar, "X-CSRF-Token": me["csrf_token"],    # another port
                     "Origin": "http://127.0.0.1:1"}):
        status, _, body = request(url, "DELETE", headers=headers)
        assert status == 403, headers
    status, _, body = request(url, "DELETE", headers={"Cookie": jar, "X-CSRF-Token": me["csrf_token"],
                                                      "Origin": dash.dashboard})
    assert status == 404 and "no retained message" in json.loads(body)["error"]
    # HTTP Basic: the custom header is still needed (a browser may send cached credentials)
    assert request(url, "DELETE", user=ADMIN, password=ADMIN_PW)[0] == 403
    assert request(url, "DELETE", user=ADMIN, password=ADMIN_PW,
                   headers={"X-CSRF-Token": "cli"})[0] == 404
    # a cross-site login form is refused too
    status, _, _ = request(dash.dashboard + "/api/login", "POST",
                           b"user=root&password=root-secret",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400


@pytest.mark.parametrize("path, words", [
    ("/api/history?filter=a&from=nan", "'from' must be a time"),
    ("/api/history?filter=a&to=inf", "'to' must be a time"),
    ("/api/history?filter=a&from=-5", "'from' must be a time"),
    ("/api/history?filter=a&from=1e400", "'from' must be a time"),
    ("/api/history?filter=a&to=9999-99-99", "'to' must be a time"),
    ("/api/history?filter=a&filter=b", "more than once"),
    ("/api/history?filter=a&form=1", "unknown query parameter 'form'"),
    ("/api/live?since=nan", "'since' must be a time"),
    ("/api/live?since=yesterday", "'since' must be a time"),
    ("/api/clients?limit=abc", "'limit' must be a whole number"),
    ("/api/clients?limit=0", "'limit' must be a whole number >= 1"),
    ("/api/clients?limit=1.5", "'limit' must be a whole number"),
    ("/api/clients?q=" + "x" * 300, "'q' is longer than 256"),
    ("/api/topics?filter=a/%23/b", "invalid topic filter"),
    ("/api/topics?limit=-1", "'limit' must be a whole number"),
    ("/api/me?x=1", "unknown query parameter"),
    ("/api/v1/sessions?connected=maybe", "'connected' must be true or false"),
    ("/api/v1/subscriptions?limit=nan", "'limit' must be a whole number"),
    ("/api/v1/retained?filter=%2B%2B", "invalid topic filter"),
    ("/api/v1/stats?verbose=1", "unknown query parameter"),
])
def test_malformed_query_parameters_get_400_with_the_reason(dash, path, words):
    status, r = get_json(dash.dashboard + path)
    assert status == 400 and words in r["error"], r


def test_retained_count_leaves_out_the_brokers_own_sys_topics(dash):
    c = client(dash, "ret")
    try:
        c.publish("plant/valve", b"open", qos=1, retain=True).wait_for_publish(5)
        r = wait_until(lambda: (lambda r: r if r["totals"]["retained_sys"] > 0 else None)(
            get_json(dash.dashboard + "/api/live")[1]))
        assert r["totals"]["retained"] == 1
    finally:
        c.loop_stop()
        c.disconnect()


def test_a_taken_dashboard_port_is_named_in_the_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        mqtt_port = free_port()
        p = subprocess.run([sys.executable, "-m", "broker", "--port", str(mqtt_port),
                            "--host", "127.0.0.1", "--data-dir", str(tmp_path),
                            "--set", "dashboard.enabled=true", "--set", f"dashboard.port={port}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 1
    line = next(x for x in p.stderr.splitlines() if "cannot listen" in x)
    assert f"127.0.0.1:{port}" in line and "[dashboard] port" in line
    assert str(mqtt_port) not in line


def test_json_field_live_series_over_http_and_its_bad_input(dash):
    """/api/field: avg/min/max per sample of a JSON field of matching topics' payloads;
    payloads that are not JSON are skipped and counted; a bad field path or filter is a 400
    that says what to write; without the history job /api/field/history is a 503."""
    url = dash.dashboard + "/api/field?filter=th/%2B&field=env.temp"
    status, r = get_json(url)
    assert status == 200 and r["points"] == [] and r["skipped_bad_json"] == 0, r
    c = client(dash, "thermo")
    try:
        for n in (10, 30):
            c.publish("th/a", json.dumps({"env": {"temp": n}}), qos=1).wait_for_publish(5)
        c.publish("th/b", b"\xff not json", qos=1).wait_for_publish(5)
        c.publish("other/a", json.dumps({"env": {"temp": 99}}), qos=1).wait_for_publish(5)

        def seen():
            _, r = get_json(url)
            return r if sum(p[4] for p in r["points"]) >= 2 and r["skipped_bad_json"] else None
        r = wait_until(seen)   # (the two values may fall in one sample or two)
        pts = r["points"]
        assert sum(p[4] for p in pts) == 2 and r["skipped_bad_json"] == 1, r
        assert min(p[2] for p in pts) == 10.0 and max(p[3] for p in pts) == 30.0, r
        assert all(ISO_UTC.match(p[0]) and p[2] <= p[1] <= p[3] for p in pts), r
    finally:
        c.loop_stop()
        c.disconnect()
    for query, words in (("filter=th/%2B&field=temp%27", "invalid field path"),
                         ("filter=th/%2B&field=", "give a field"),
                         ("filter=th/%23/x&field=temp", "invalid topic filter")):
        status, r = get_json(dash.dashboard + "/api/field?" + query)
        assert status == 400 and words in r["error"], (query, r)
    status, r = get_json(dash.dashboard + "/api/field/history?filter=th/%2B&field=a.b%5B0%5D")
    assert status == 503 and "not running" in r["error"], r
    status, r = get_json(dash.dashboard + "/api/field/history?filter=th/%2B&field=a%20b")
    assert status == 400 and "invalid field path" in r["error"], r
