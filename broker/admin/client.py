"""A small client of the dashboard's admin API (what ``python -m broker.admin`` uses).

Logs in once (POST /api/login: one password check), then sends the session cookie and its
X-CSRF-Token with every request, as the page does.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from http.cookies import SimpleCookie
from typing import Any


class APIError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


class AdminClient:
    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.user, self.password = user, password
        self.timeout = timeout
        self.cookie: str | None = None
        self.csrf: str | None = None

    def _send(self, method: str, path: str, body: Any = None,
              query: dict | None = None) -> tuple[int, dict[str, str], bytes]:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.cookie:
            req.add_header("Cookie", self.cookie)
            req.add_header("X-CSRF-Token", self.csrf or "")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()
        except urllib.error.URLError as e:
            raise APIError(0, f"cannot reach the dashboard at {self.url} ({e.reason}); is the "
                              "broker running with [dashboard] enabled = true?") from None

    def login(self) -> dict:
        status, headers, raw = self._send("POST", "/api/login",
                                          {"user": self.user, "password": self.password})
        body = _json(raw)
        if status != 200:
            raise APIError(status, body.get("error", raw[:200].decode("utf-8", "replace")))
        cookie = SimpleCookie(headers.get("Set-Cookie", ""))
        self.cookie = "; ".join(f"{k}={m.value}" for k, m in cookie.items())
        self.csrf = body["csrf_token"]
        return body

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> dict:
        if self.cookie is None:
            self.login()
        status, _, raw = self._send(method, path, body, query)
        data = _json(raw)
        if status >= 400:
            raise APIError(status, data.get("error", raw[:200].decode("utf-8", "replace")))
        return data


def _json(raw: bytes) -> dict:
    try:
        v = json.loads(raw or b"{}")
        return v if isinstance(v, dict) else {"value": v}
    except ValueError:
        return {}
