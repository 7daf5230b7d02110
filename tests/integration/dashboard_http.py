"""HTTP helpers for the dashboard and admin API tests: a real client (urllib) against a broker
process, with operators' accounts made the way an operator makes them."""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

from broker.admin.accounts import set_account
from tests.conftest import free_port, wait_port

ADMIN, ADMIN_PW = "root", "root-secret"
VIEWER, VIEWER_PW = "watcher", "watcher-secret"


def request(url: str, method: str = "GET", body=None, user: str | None = None,
            password: str | None = None, headers: dict | None = None, timeout: float = 30):
    """(status, headers, body bytes); body: dict (sent as JSON) or bytes."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method)
    if isinstance(body, dict):
        req.add_header("Content-Type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def get(url: str, user: str | None = None, password: str | None = None, **kw):
    return request(url, user=user, password=password, **kw)


def get_json(url: str, **kw):
    status, _, body = get(url, **kw)
    return status, json.loads(body)


def as_admin(url: str, method: str = "GET", body=None, **kw):
    """The admin account with HTTP Basic (and the custom header a state change needs)."""
    headers = {"X-CSRF-Token": "cli", **kw.pop("headers", {})}
    status, _, raw = request(url, method, body, ADMIN, ADMIN_PW, headers=headers, **kw)
    return status, json.loads(raw or b"{}")


def make_accounts(data_dir) -> str:
    path = str(data_dir / "operators")
    set_account(path, ADMIN, "admin", ADMIN_PW)
    set_account(path, VIEWER, "viewer", VIEWER_PW)
    return path


def start_dashboard(make_broker, tmp_path, settings: dict | None = None, args=None):
    """A broker with the dashboard on a free port and two operators (admin, viewer)."""
    port = free_port()
    b = make_broker({"dashboard.enabled": True, "dashboard.port": port,
                     "dashboard.users_file": make_accounts(tmp_path),
                     "dashboard.connect_url": f"sc://127.0.0.1:{free_port()}",
                     **(settings or {})}, args)
    wait_port(port, b.proc)
    b.dashboard = f"http://127.0.0.1:{port}"
    b.dash_port = port
    return b


def wait_until(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError("timed out")
