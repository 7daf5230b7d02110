"""The dashboard's HTTP side (aiohttp, in the broker's event loop): the page, its JSON API and
the admin API.

    GET  /                      the page (static/index.html; uPlot charts, vendored); no data
    POST /api/login             {"user", "password"} -> session cookie + {"csrf_token", ...}
    POST /api/logout            ends the session
    GET  /api/me                who is logged in, role, csrf_token
    GET  /api/live?since=T      live series (one point per sample) + totals, sink and job status
    GET  /api/clients?q=&limit= connected clients (search by client id)
    GET  /api/topics?filter=#&limit=   topics with retained values and per-topic rates
    GET  /api/history?filter=&from=&to=   counts over time, numeric values, latest messages
                                (answered by the history job, asked from a child process)
    GET  /api/field?filter=&field=&since=  a JSON field's live series (avg/min/max per sample)
    GET  /api/field/history?filter=&field=&from=&to=  the same field's series from the history
    /api/v1/...                 the admin API (see ADMIN_ROUTES below and docs/operations.md "Dashboard")

Who may ask: every path but the page, its static files and /api/login needs a login with an
operator's account (broker/admin/accounts.py; never the MQTT password file): a session cookie
from /api/login, or HTTP Basic credentials (which open a session too). ``viewer`` reads;
changing anything needs ``admin``. A request that changes state must carry ``X-CSRF-Token``
(the session's token when it comes with the cookie) and no foreign ``Origin``. A Host header
that is not one of the dashboard's names gets 421 (DNS rebinding). Times are ISO 8601 UTC.

Errors are JSON {"error": "..."}: 400 (bad input, with the reason), 401, 403, 404, 421, 429 and
503 (login throttled / busy, with Retry-After), 503 (history job not running), 504 (history
timeout) or 500.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from settings import DashboardConfig
from settings.secrets import connect_token

from ..admin.accounts import Accounts
from ..admin.service import AdminError, AdminService, Refused, audit
from ..auth.origin import origin_allowed
from . import JOB_HINT, live
from .fields import FieldCharts
from .history import BadRequest, HistoryClient, JobNotRunning, check_filter, make_query, parse_time
from .login import COOKIE, Busy, LoginChecks, Session, Sessions, Throttle

if TYPE_CHECKING:
    from ..transport.state import ServerState

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATIC = Path(__file__).resolve().parent / "static"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
MAX_QUERY_TEXT = 256
LOGIN_LOG_SECONDS = 3600.0  # an account's logins from one address: one INFO line this often
LOGIN_HINT = ("log in with a dashboard account (POST /api/login, or HTTP Basic): operators' "
              "accounts are made with python -m broker.admin users add NAME; device "
              "credentials from the MQTT password file do not log in here")


def _json_error(status: int, message: str, headers: dict[str, str] | None = None,
                **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


# ---- query parameters: every malformed one is a 400 that says what is wrong ------------------

class Params:
    """A request's query parameters, checked: unknown or repeated names and malformed values
    raise BadRequest naming the parameter and what it accepts."""

    def __init__(self, request: web.Request, *known: str) -> None:
        q = request.query
        for name in q:
            if name not in known:
                raise BadRequest(f"unknown query parameter {name!r}; this path takes "
                                 + (", ".join(repr(k) for k in known) or "none"))
            if len(q.getall(name)) > 1:
                raise BadRequest(f"query parameter {name!r} is given more than once")
        self.q = q

    def text(self, name: str, default: str = "", limit: int = MAX_QUERY_TEXT) -> str:
        v = self.q.get(name)
        if v is None:
            return default
        if len(v) > limit or "\x00" in v:
            raise BadRequest(f"{name!r} is longer than {limit} characters or contains NUL")
        return v

    def int(self, name: str, default: int, lo: int, hi: int) -> int:
        """A whole number >= lo; above hi it is capped at hi."""
        raw = self.q.get(name)
        if raw is None or raw == "":
            return default
        try:
            v = int(raw, 10)
        except ValueError:
            raise BadRequest(f"{name!r} must be a whole number >= {lo}, not {raw[:50]!r}") from None
        if v < lo:
            raise BadRequest(f"{name!r} must be a whole number >= {lo}, not {v}")
        return min(v, hi)

    def bool(self, name: str) -> bool | None:
        raw = self.q.get(name)
        if raw is None or raw == "":
            return None
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise BadRequest(f"{name!r} must be true or false, not {raw[:50]!r}")

    def time(self, name: str) -> float | None:
        return parse_time(self.q.get(name), name)


async def _body(request: web.Request, limit: int = 2 << 20) -> dict[str, Any]:
    """A JSON object body (400 when it is not one)."""
    if request.content_type != "application/json":
        raise BadRequest("send the body as JSON (Content-Type: application/json)")
    try:
        data = json.loads(await request.text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def _field(data: dict[str, Any], name: str, kind: type, default: Any = None,
           required: bool = False) -> Any:
    v = data.get(name, default)
    if v is None:
        if required:
            raise BadRequest(f"{name!r} is required")
        return None
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise BadRequest(f"{name!r} must be a whole number")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not math.isfinite(v)):
        raise BadRequest(f"{name!r} must be a number")
    if kind in (str, bool, list) and not isinstance(v, kind):
        raise BadRequest(f"{name!r} must be a {kind.__name__}")
    return v


# ---- Host names -------------------------------------------------------------------------------

def host_names(bind: str, extra: Iterable[str] = ()) -> set[str]:
    """Host header names the dashboard answers (lower case, no port)."""
    names = {"localhost", "127.0.0.1", "::1"}
    names.update(h.lower().strip("[]").rstrip(".") for h in extra if h)
    bind = bind.strip("[]")
    if bind in ("", "0.0.0.0", "::"):
        # every address: the machine's own names and addresses too
        for name in {socket.gethostname(), socket.getfqdn()}:
            names.add(name.lower())
            try:
                for info in socket.getaddrinfo(name, None):
                    names.add(str(info[4][0]).split("%")[0].lower())
            except OSError:
                pass
    else:
        names.add(bind.lower())
    return names


def request_host(header: str | None) -> str | None:
    """The name in a Host header (no port, lower case), None when malformed."""
    if not header:
        return None
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        if end < 0 or (h[end + 1:] and not h[end + 1:].startswith(":")):
            return None
        return h[1:end]
    name, _, port = h.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".")


def _basic(header: str) -> tuple[str | None, bytes | None]:
    """(user, password bytes) from an HTTP Basic Authorization header, (None, None) if none."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None, None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None, None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None, None


def _foreign_origin(request: web.Request) -> web.Response | None:
    """403 for a request whose Origin is another site than the one it was sent to, else None."""
    origin = request.headers.get("Origin")
    if not origin_allowed(origin, request.headers.get("Host", "")):  # host and port: one origin
        return _json_error(403, f"cross-origin request from {str(origin)[:100]!r} refused")
    return None


def _address(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return str(peer[0]) if peer else "?"


class Dashboard:
    def __init__(self, server: ServerState, settings: DashboardConfig, accounts: Accounts,
                 admin: AdminService) -> None:
        """settings: the DashboardConfig (connect_url resolved); accounts: broker.admin
        Accounts; admin: broker.admin AdminService."""
        self.server = server
        self.s = settings
        self.accounts = accounts
        self.admin = admin
        self.view = admin.view
        self.hosts = host_names(settings.host, settings.allowed_hosts)
        self.sessions = Sessions(settings.session_seconds, settings.max_login_sessions)
        self.throttle = Throttle(settings.login_failures, settings.login_lockout_seconds)
        self.held_logins = 0   # attempts waiting for their turn (Throttle.turn)
        self.logged_in: dict[tuple[str, str], float] = {}  # (user, address) -> last INFO line
        self.logins = LoginChecks(accounts, settings.login_threads, settings.max_pending_logins)
        self.counter = live.TopicCounter(settings.max_topics)
        server.broker.add_hook(self.counter)  # per-topic counts, fed by accepted messages
        self.fields = FieldCharts(settings.max_field_charts, settings.field_payload_bytes,
                                  settings.keep_points)
        server.broker.add_hook(self.fields)   # JSON fields charted live (none: no work)
        data_dir = server.config.data_dir
        self.history = HistoryClient(settings.connect_url, settings.history_timeout_seconds,
                                     JOB_HINT, settings.history_worker_idle_seconds,
                                     token=lambda: connect_token(data_dir))
        self.job: dict[str, Any] = {"running": None, "url": settings.connect_url}
        self.sampler = live.Sampler(self.view, self._io_bytes, settings.sample_seconds,
                                    settings.keep_points, self.counter, self._sink_stats)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self._tasks: list[asyncio.Task] = []

    def _io_bytes(self) -> tuple[int, int]:
        return self.server.bytes_in, self.server.bytes_out

    def _sink_stats(self) -> dict:
        return live.sink_stats(self.view.hook_stats().get("sink"))

    # ------------------------------------------------------------ status of the history job
    def history_status(self) -> dict:
        out = dict(self.job)
        # what the sink knows of the job's commits (keep_until = "history": the status, the
        # records not yet in the table); the broker never reads the job's files itself
        for k, v in self._sink_stats().items():
            if ("history" in k or "uncommitted" in k) and isinstance(v, (int, float)):
                out[k] = v
        return out

    async def _watch_job(self) -> None:
        while True:
            self.job["running"] = await self.history.job_up()
            await asyncio.sleep(5.0)

    async def _sample(self) -> None:
        while True:
            try:
                self.sampler.sample()
                self.fields.sample(time.time())
                self.sessions.expire(self.sessions.clock())
                if self.accounts.reload():  # changed on disk: sessions of changed accounts end
                    self._revalidate_sessions()
            except Exception:
                log.exception("dashboard sample failed")
            await asyncio.sleep(self.s.sample_seconds)

    def _revalidate_sessions(self) -> None:
        """End the sessions of accounts removed, or whose password or role changed."""
        for token, s in list(self.sessions.by_token.items()):
            if self.accounts.stamp(s.user) != s.stamp:
                self.sessions.close(token)

    def _accounts_current(self) -> None:
        """Re-read the accounts file when it changed (a stat) before a request is served."""
        if self.accounts.reload():
            self._revalidate_sessions()

    # ------------------------------------------------------------ middlewares
    @web.middleware
    async def _host(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        name = request_host(request.headers.get("Host"))
        if name not in self.hosts:
            log.info("dashboard: refused Host %s from %s", repr(request.headers.get("Host"))[:100],
                     _address(request))
            return _json_error(421, f"Host {request.headers.get('Host', '')[:100]!r} is not a "
                               f"name of this dashboard: open it at http://127.0.0.1:{self.port}/ "
                               "or add the name to [dashboard] allowed_hosts")
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (BadRequest, AdminError) as exc:
            return _json_error(400, str(exc))
        except JobNotRunning as exc:
            return _json_error(503, str(exc), job_running=False)
        except Refused as exc:
            return _json_error(503, str(exc), headers={"Retry-After": "5"})
        except Busy:
            return _json_error(503, "too many logins are being checked: try again in a moment",
                               headers={"Retry-After": "2"})
        except TimeoutError as exc:
            return _json_error(504, str(exc))
        except Exception as exc:
            log.exception("dashboard %s failed", request.path)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return _json_error(500, f"the broker could not answer {request.path}: {first}")

    def _public(self, request: web.Request) -> bool:
        path = request.path
        if request.method in ("GET", "HEAD"):
            return path in ("/", "/favicon.ico") or path.startswith("/static/")
        return request.method == "POST" and path in ("/api/login", "/api/logout")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._public(request):
            return await handler(request)
        self._accounts_current()
        session, via_cookie = self.sessions.get(request.cookies.get(COOKIE)), True
        new_cookie = None
        if session is None:
            via_cookie = False
            user, password = _basic(request.headers.get("Authorization", ""))
            if user is None or password is None:
                return _json_error(401, LOGIN_HINT)
            login = await self._basic_login(request, user, password)
            if isinstance(login, web.Response):
                return login  # a refusal (401 / 429)
            session = new_cookie = login
        if self.accounts.stamp(session.user) != session.stamp:  # removed, new password or role
            self.sessions.close(session.token)
            return _json_error(401, "your account was changed (password or role) or removed: "
                               "log in again")
        changing = request.method not in SAFE_METHODS
        if changing:
            refused = self._csrf(request, session, via_cookie)
            if refused is not None:
                self._audit_refusal(request, session, refused)
                return refused
            if session.role != "admin":
                audit(session.user, _address(request), f"{request.method} {request.path}",
                      "refused: not an administrator")
                return _json_error(403, f"{session.user!r} is a {session.role}: changing the "
                                   "broker needs an account with the admin role")
        request["session"] = session
        try:
            response = await handler(request)
        except Exception as exc:  # answered by _errors (400, 503, 500...): audited here
            if changing and not request.get("audited"):
                audit(session.user, _address(request), f"{request.method} {request.path}",
                      f"refused: {type(exc).__name__}: {exc}")
            raise
        if changing and not request.get("audited"):
            self._audit_refusal(request, session, response)
        if new_cookie is not None:
            self._set_cookie(request, response, new_cookie)
        return response

    def _audit_refusal(self, request: web.Request, session: Session,
                       response: web.StreamResponse) -> None:
        """A change that was not done (or not audited by its handler): its status and reason."""
        reason = ""
        if isinstance(response, web.Response) and response.body is not None \
                and response.content_type == "application/json":
            try:
                reason = json.loads(bytes(response.body)).get("error", "")  # type: ignore[arg-type]  # bytes body
            except (ValueError, TypeError, AttributeError):
                reason = ""
        audit(session.user, _address(request), f"{request.method} {request.path}",
              f"refused {response.status}" + (f": {reason}" if reason else "")
              if response.status >= 400 else f"{response.status}")

    def _csrf(self, request: web.Request, session: Session, via_cookie: bool) -> web.Response | None:
        refused = _foreign_origin(request)
        if refused is not None:
            return refused
        token = request.headers.get("X-CSRF-Token")
        if not token or (via_cookie and token != session.csrf):
            return _json_error(403, "a request that changes the broker needs the X-CSRF-Token "
                               "header: the csrf_token of POST /api/login or GET /api/me")
        return None

    async def _basic_login(self, request: web.Request, user: str,
                           password: bytes) -> Session | web.Response:
        key = self.sessions.basic_key(user, password)
        s = self.sessions.for_basic(key)
        if s is not None:
            return s
        return await self._check_login(request, user, password, basic=key)

    async def _check_login(self, request: web.Request, user: str, password: bytes,
                           basic: bytes | None = None) -> Session | web.Response:
        """A Session, or the refusal to send (401, 429; Busy raised: 503)."""
        self._accounts_current()   # checked against the file as it is now
        address = _address(request)
        key = (user, address)
        wait = self.throttle.turn(key)
        if wait is None or (wait > 0 and self.held_logins >= self.s.max_waiting_logins):
            after = math.ceil(self.throttle.retry_after(key))
            return _json_error(429, f"too many wrong passwords for {user[:100]!r} from "
                               f"{address}: try again in {after} s",
                               headers={"Retry-After": str(after)})
        if wait > 0:   # its turn: the right password gets in after it, a wrong one is slowed
            self.held_logins += 1
            try:
                await asyncio.sleep(wait)
            finally:
                self.held_logins -= 1
        got = await self.logins.check(address, user, password)
        if got is None:
            self.throttle.failed(key)
            log.info("dashboard: failed login as %s from %s", repr(user)[:100], address)
            return _json_error(401, "wrong user name or password. " + LOGIN_HINT)
        role, stamp = got
        self.throttle.succeeded(key)
        # one INFO line per account and address an hour (a script's or the admin CLI's every
        # call logs in afresh: 14 lines in 2 s); the changes each makes are audited one by one
        now = time.monotonic()
        if now - self.logged_in.get(key, -LOGIN_LOG_SECONDS) >= LOGIN_LOG_SECONDS:
            if len(self.logged_in) >= 10_000:
                self.logged_in.clear()
            self.logged_in[key] = now
            log.info("dashboard: %s (%s) logged in from %s (further logins of this account "
                     "from this address within the hour are logged at DEBUG)",
                     repr(user)[:100], role, address)
        else:
            log.debug("dashboard: %s (%s) logged in from %s", repr(user)[:100], role, address)
        return self.sessions.open(user, role, address, basic, stamp)

    def _set_cookie(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(COOKIE, session.token, max_age=int(self.s.session_seconds),
                            httponly=True, samesite="Strict", secure=request.secure, path="/")

    # ------------------------------------------------------------ login
    async def login(self, request: web.Request) -> web.StreamResponse:
        refused = _foreign_origin(request)
        if refused is not None:
            return refused
        data = await _body(request, 64 * 1024)
        user = _field(data, "user", str, required=True)
        password = _field(data, "password", str, required=True)
        if len(user) > 256 or len(password) > 1024:
            raise BadRequest("the user name or password is too long")
        s = await self._check_login(request, user, password.encode("utf-8"))
        if isinstance(s, web.Response):
            return s
        response = web.json_response(self._me(s))
        self._set_cookie(request, response, s)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        token = request.cookies.get(COOKIE)
        s = self.sessions.get(token)
        if s is not None and request.headers.get("X-CSRF-Token") == s.csrf:
            self.sessions.close(s.token)
        response = web.json_response({"logged_out": True})
        response.del_cookie(COOKIE, path="/")
        return response

    def _me(self, s: Session) -> dict[str, Any]:
        return {"user": s.user, "role": s.role, "csrf_token": s.csrf,
                "expires_at": live.iso(time.time() + s.expires - self.sessions.clock())}

    async def me(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        return web.json_response(self._me(request["session"]))

    # ------------------------------------------------------------ the page's API
    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def favicon(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "favicon.svg", headers={"Content-Type": "image/svg+xml"})

    async def api_live(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "since")
        since = p.time("since") or 0.0
        return web.json_response({
            "now": live.iso(time.time()), "sample_seconds": self.s.sample_seconds,
            "points": self.sampler.series(since), "totals": live.overview(self.view, self._io_bytes),
            "sink": self._sink_stats() or None,
            "cluster": self.view.hook_stats().get("cluster"),  # None on a single broker
            "history": self.history_status(), "user": request["session"].user,
            "role": request["session"].role})

    async def api_clients(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "q", "limit")
        limit = p.int("limit", self.s.max_clients_listed, 1, self.s.max_clients_listed)
        return web.json_response(live.clients(self.view, p.text("q"), limit))

    async def api_topics(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "filter", "limit")
        filt = check_filter(p.text("filter", "#", 65535) or "#")
        limit = p.int("limit", self.s.max_topics_listed, 1, self.s.max_topics_listed)
        return web.json_response(live.topics(self.view, self.counter, filt, limit))

    async def api_history(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "filter", "from", "to")
        q = make_query(p.text("filter", "", 65535), p.q.get("from"), p.q.get("to"),
                       self.s.history_max_days)
        return web.json_response(await self.history.ask(q))

    async def api_field(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "filter", "field", "since")
        chart = self.fields.watch(p.text("filter", "", 65535), p.text("field"))
        return web.json_response({**chart.answer(p.time("since") or 0.0),
                                  "sample_seconds": self.s.sample_seconds})

    async def api_field_history(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "filter", "field", "from", "to")
        q = make_query(p.text("filter", "", 65535), p.q.get("from"), p.q.get("to"),
                       self.s.history_max_days, field=p.text("field"))
        return web.json_response(await self.history.ask(q))

    # ------------------------------------------------------------ the admin API (/api/v1)
    def _audit(self, request: web.Request, action: str, outcome: str = "ok", **details: Any) -> None:
        request["audited"] = True
        audit(request["session"].user, _address(request), action, outcome, **details)

    async def v1_stats(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        st = self.view.stats()
        st = {k: list(v) if isinstance(v, tuple) else v for k, v in st.items()}
        return web.json_response(st)

    async def v1_clients(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "q", "limit")
        limit = p.int("limit", self.s.max_clients_listed, 1, 100_000)
        found, matched = self.view.clients(p.text("q"), limit, subscriptions=1000)
        return web.json_response({"clients": [live.client_json(r) for r in found],
                                  "matched": matched})

    async def v1_client(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        cid = request.match_info["client_id"]
        rec = self.view.client(cid)
        if rec is None:
            node = self.view.locate(cid)  # in a cluster: the node whose session it is
            if node is not None:
                return _json_error(404, f"client {cid!r} is not connected to this node; its "
                                        f"session is on node {node}", node=node)
            return _json_error(404, "no client with this id is connected")
        return web.json_response(live.client_json(rec))

    async def v1_kick(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        cid = request.match_info["client_id"]
        ok = self.admin.kick(cid)
        self._audit(request, "kick", "ok" if ok else "not connected", client_id=cid)
        if not ok:
            return _json_error(404, "no client with this id is connected")
        return web.json_response({"kicked": cid})

    async def v1_sessions(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "q", "limit", "connected")
        limit = p.int("limit", 1000, 1, 100_000)
        found, matched = self.view.sessions(p.text("q"), limit, p.bool("connected"))
        return web.json_response({"sessions": [_plain(r) for r in found], "matched": matched})

    async def v1_subscriptions(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "client_id", "q", "limit")
        limit = p.int("limit", 1000, 1, 100_000)
        cid = p.q.get("client_id")
        if cid is not None:
            cid = p.text("client_id", limit=65535)
        found, matched = self.view.subscriptions(cid, p.text("q"), limit)
        return web.json_response({"subscriptions": [_plain(r) for r in found],
                                  "matched": matched})

    async def v1_retained(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "filter", "limit")
        filt = check_filter(p.text("filter", "#", 65535) or "#")
        limit = p.int("limit", 1000, 1, 100_000)
        found, matched = self.admin.retained(filt, limit)
        return web.json_response({"retained": [
            {"topic": r.topic, "qos": r.qos, "at": live.iso(r.accepted_at) if r.accepted_at else None,
             "expires_in": r.expires_in, **live.preview(r.payload, 64 * 1024)} for r in found],
            "matched": matched})

    async def v1_delete_retained(self, request: web.Request) -> web.StreamResponse:
        topic = Params(request, "topic").text("topic", limit=65535)
        if not topic:
            raise BadRequest("give the retained message's topic: ?topic=a/b")
        ok = self.admin.delete_retained(topic)
        self._audit(request, "delete-retained", "ok" if ok else "none", topic=topic)
        if not ok:
            return _json_error(404, "no retained message on this topic")
        return web.json_response({"deleted": topic})

    async def v1_publish(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        d = await _body(request)
        topic = _field(d, "topic", str, required=True)
        enc = _field(d, "encoding", str, "utf-8")
        text = _field(d, "payload", str, "")
        if enc == "base64":
            try:
                payload = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise BadRequest("'payload' is not base64") from None
        elif enc == "utf-8":
            payload = text.encode("utf-8")
        else:
            raise BadRequest("'encoding' must be 'utf-8' or 'base64'")
        props = _field(d, "user_properties", list, [])
        if not all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x)
                   for x in props):
            raise BadRequest("'user_properties' must be a list of [name, value] strings")
        n = self.admin.publish(
            topic, payload, qos=_field(d, "qos", int, 0), retain=_field(d, "retain", bool, False),
            content_type=_field(d, "content_type", str), utf8=_field(d, "utf8", bool),
            message_expiry=_field(d, "message_expiry", int), user_properties=props,
            response_topic=_field(d, "response_topic", str), username=request["session"].user)
        self._audit(request, "publish", "ok", topic=topic, bytes=len(payload),
                    qos=d.get("qos", 0), retain=bool(d.get("retain")), delivered=n)
        return web.json_response({"topic": topic, "delivered_to": n})

    async def v1_bans(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        return web.json_response({"bans": [_ban(b) for b in self.admin.list_bans()]})

    async def v1_ban(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        d = await _body(request, 64 * 1024)
        kind = _field(d, "kind", str, required=True)
        value = _field(d, "value", str, required=True)
        ban, kicked = self.admin.ban(kind, value, _field(d, "reason", str, ""),
                                     _field(d, "seconds", float), by=request["session"].user)
        self._audit(request, "ban", "ok", kind=kind, value=value, kicked=len(kicked))
        return web.json_response({"ban": _ban(ban), "disconnected": kicked})

    async def v1_unban(self, request: web.Request) -> web.StreamResponse:
        p = Params(request, "kind", "value")
        kind, value = p.q.get("kind"), p.q.get("value")
        if not kind or not value:
            raise BadRequest("give the ban to remove: ?kind=clientid|username|address&value=...")
        ok = self.admin.unban(kind, value)
        self._audit(request, "unban", "ok" if ok else "none", kind=kind, value=value)
        if not ok:
            return _json_error(404, "no such ban")
        return web.json_response({"removed": {"kind": kind, "value": value}})

    async def v1_reload(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        out = self.admin.reload()
        self._revalidate_sessions()
        self._audit(request, "reload", "errors" if out["errors"] else "ok",
                    errors=len(out["errors"]))
        return web.json_response(out)

    # ------------------------------------------------------------ continuous rules
    def _rules(self) -> Any:
        if self.admin.rules is None:
            raise AdminError("this broker manages no continuous rules")
        return self.admin.rules

    async def v1_rules(self, request: web.Request) -> web.StreamResponse:
        Params(request)
        out = self._rules().list()
        for r in out["rules"]:
            if r.get("last_row_at"):
                r["last_row_at"] = live.iso(r["last_row_at"])
        return web.json_response(out)

    async def v1_rule_add(self, request: web.Request) -> web.StreamResponse:
        """Add a rule: its shape and name here, its SQL by the job's Spark (400 with Spark's
        message; 503 when the job is not running), then stored (the job starts it)."""
        Params(request)
        rules = self._rules()
        rule = rules.prepare(await _body(request, 64 * 1024))
        columns = await self.history.check_sql(rule.sql)
        added = rules.add(rule)
        self._audit(request, "rule-add", "ok", name=rule.name, publish=rule.publish,
                    table=rule.table, sql=rule.sql)
        return web.json_response({"rule": added, "columns": columns})

    async def _rule_change(self, request: web.Request, action: str) -> web.StreamResponse:
        Params(request)
        name = request.match_info["name"]
        rules = self._rules()
        ok = rules.remove(name) if action == "remove" else rules.pause(name, action == "pause")
        self._audit(request, f"rule-{action}", "ok" if ok else "no such rule", name=name)
        if not ok:
            return _json_error(404, f"no rule named {name!r} (python -m broker.admin rules list)")
        return web.json_response({action + "d": name})

    async def v1_rule_pause(self, request: web.Request) -> web.StreamResponse:
        return await self._rule_change(request, "pause")

    async def v1_rule_resume(self, request: web.Request) -> web.StreamResponse:
        return await self._rule_change(request, "resume")

    async def v1_rule_remove(self, request: web.Request) -> web.StreamResponse:
        return await self._rule_change(request, "remove")

    # ------------------------------------------------------------ lifecycle
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._host, self._errors, self._auth],
                              client_max_size=2 << 20)
        r = app.router
        r.add_get("/", self.index)
        r.add_get("/favicon.ico", self.favicon)
        r.add_post("/api/login", self.login)
        r.add_post("/api/logout", self.logout)
        r.add_get("/api/me", self.me)
        r.add_get("/api/live", self.api_live)
        r.add_get("/api/clients", self.api_clients)
        r.add_get("/api/topics", self.api_topics)
        r.add_get("/api/history", self.api_history)
        r.add_get("/api/field", self.api_field)
        r.add_get("/api/field/history", self.api_field_history)
        for method, path, handler in self.admin_routes():
            r.add_route(method, path, handler)
        r.add_static("/static/", STATIC, follow_symlinks=False)
        return app

    def admin_routes(self) -> tuple[tuple[str, str, Handler], ...]:
        return (("GET", "/api/v1/stats", self.v1_stats),
                ("GET", "/api/v1/clients", self.v1_clients),
                ("GET", "/api/v1/clients/{client_id:.+}", self.v1_client),
                ("DELETE", "/api/v1/clients/{client_id:.+}", self.v1_kick),
                ("GET", "/api/v1/sessions", self.v1_sessions),
                ("GET", "/api/v1/subscriptions", self.v1_subscriptions),
                ("GET", "/api/v1/retained", self.v1_retained),
                ("DELETE", "/api/v1/retained", self.v1_delete_retained),
                ("POST", "/api/v1/publish", self.v1_publish),
                ("GET", "/api/v1/bans", self.v1_bans),
                ("POST", "/api/v1/bans", self.v1_ban),
                ("DELETE", "/api/v1/bans", self.v1_unban),
                ("POST", "/api/v1/reload", self.v1_reload),
                ("GET", "/api/v1/rules", self.v1_rules),
                ("POST", "/api/v1/rules", self.v1_rule_add),
                ("POST", "/api/v1/rules/{name}/pause", self.v1_rule_pause),
                ("POST", "/api/v1/rules/{name}/resume", self.v1_rule_resume),
                ("DELETE", "/api/v1/rules/{name}", self.v1_rule_remove))

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.s.host, self.s.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self.stop()
            raise
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started: an asyncio.Server
        self.sampler.sample()  # the baseline for the first rates
        self._tasks = [asyncio.create_task(self._sample()), asyncio.create_task(self._watch_job())]
        log.info("dashboard on http://%s:%s/ (log in with an operator's account; %d in %s)",
                 _url_host(self.s.host), self.port, len(self.accounts.accounts),
                 self.accounts.path)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        try:
            self.server.broker.remove_hook(self.counter)
            self.server.broker.remove_hook(self.fields)
        except ValueError:
            pass
        self.logins.close()
        await self.history.close()
        if self.runner is not None:
            await self.runner.cleanup()


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _plain(rec: Any) -> dict[str, Any]:
    from dataclasses import asdict
    return asdict(rec)


def _ban(b: dict) -> dict:
    return {**b, "until": live.iso(b["until"]) if b.get("until") else None,
            "at": live.iso(b["at"]) if b.get("at") else None}
