"""Which web pages may talk to the broker's HTTP listeners (the dashboard, MQTT over
WebSockets): the browser's ``Origin`` header against the ``Host`` the request was sent to.

A browser sends ``Origin`` with every cross-site WebSocket handshake and every state-changing
request; a page on another site can therefore be told apart from one served by the broker (same
host and port). Clients that are not browsers (devices, scripts) send no ``Origin``: allowed.
"""
from __future__ import annotations

from collections.abc import Iterable


def origin_authority(origin: str) -> str:
    """The host[:port] of an Origin value ("https://a.example:8443" -> "a.example:8443"),
    lower case."""
    return origin.strip().split("://", 1)[-1].split("/", 1)[0].lower()


def origin_allowed(origin: str | None, host: str | None, allowed: Iterable[str] = ()) -> bool:
    """Whether a request with this Origin header may go on: no Origin (not a browser); an
    Origin whose host and port are the Host header's (the same site); or one listed in
    `allowed` (full origins such as "https://app.example.com", compared without case and a
    trailing "/"; "*" allows any)."""
    if origin is None:
        return True
    if host is not None and origin_authority(origin) == host.strip().lower():
        return True
    o = origin.strip().rstrip("/").lower()
    return any(a == "*" or a.strip().rstrip("/").lower() == o for a in allowed)
