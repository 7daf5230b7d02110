"""The dashboard's HTTP side (aiohttp, in the broker's event loop): the page and a JSON API.

    GET /                      the page (static/index.html; uPlot charts, vendored)
    GET /api/live?since=T      live series (one point per sample) + totals, sink and job status
    GET /api/clients?q=&limit= connected clients (search by client id)
    GET /api/topics?filter=#   topics with retained values and per-topic rates
    GET /api/history?filter=&from=&to=   counts over time, numeric values, latest messages
                               (answered by the history job's Spark Connect server)

Errors are JSON {"error": "..."} with 400 (bad input), 401, 503 (history job not running),
504 (history timeout) or 500. With a password file ([auth] password_file) every path needs
HTTP Basic credentials from that file (checked off the event loop: scrypt is slow).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import time
from pathlib import Path

from aiohttp import web

from . import JOB_HINT, live
from .history import BadRequest, HistoryClient, JobNotRunning, make_query

log = logging.getLogger("broker.dashboard")

STATIC = Path(__file__).resolve().parent / "static"
REALM = 'Basic realm="MQTT broker dashboard", charset="UTF-8"'


def _json_error(status: int, message: str, **extra) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _int(request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise BadRequest(f"'{name}' must be a whole number, not {raw!r}") from None
    return max(lo, min(hi, v))


class Dashboard:
    def __init__(self, server, settings, passwords=None, committed_file: str | None = None):
        """settings: the DashboardConfig (connect_url resolved); committed_file: where the
        history job reports its progress (None: not on this machine)."""
        self.server = server
        self.s = settings
        self.committed_file = committed_file
        self.passwords = passwords       # broker.auth.PasswordFile, or None: no login
        self.users = set(settings.users)
        self.counter = live.TopicCounter(server.broker, settings.max_topics)
        self.history = HistoryClient(settings.connect_url, settings.history_timeout_seconds,
                                     JOB_HINT)
        self.job = {"running": None, "url": settings.connect_url}
        self.sampler = live.Sampler(server, settings.sample_seconds, settings.keep_points,
                                    self.counter, self.history_status)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------ status of the history job
    def history_status(self) -> dict:
        out = dict(self.job)
        committed = self.committed_file
        if committed:
            from sink.progress import read_committed
            state = read_committed(committed) if os.path.exists(committed) else None
            if state is not None:
                out["last_batch"] = state.get("batch_id")
                out["last_commit_age_seconds"] = round(time.time() - state["written_at"], 1)
        for k, v in live.sink_stats(self.server).items():  # e.g. records not yet committed
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
            except Exception:
                log.exception("dashboard sample failed")
            await asyncio.sleep(self.s.sample_seconds)

    # ------------------------------------------------------------ middlewares
    @web.middleware
    async def _errors(self, request, handler):
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except BadRequest as exc:
            return _json_error(400, str(exc))
        except JobNotRunning as exc:
            return _json_error(503, str(exc), job_running=False)
        except TimeoutError as exc:
            return _json_error(504, str(exc))
        except Exception as exc:
            log.exception("dashboard %s failed", request.path)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return _json_error(500, f"the broker could not answer {request.path}: {first}")

    @web.middleware
    async def _auth(self, request, handler):
        if self.passwords is None:
            return await handler(request)
        user, password = _basic(request.headers.get("Authorization", ""))
        ok = False
        if user is not None and (not self.users or user in self.users):
            ok = await asyncio.get_running_loop().run_in_executor(
                None, self.passwords.check, user, password)
        if not ok:
            return web.json_response(
                {"error": "log in with a user name and password from the broker's password file"},
                status=401, headers={"WWW-Authenticate": REALM})
        return await handler(request)

    # ------------------------------------------------------------ handlers
    async def index(self, request):
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def api_live(self, request):
        try:
            since = float(request.query.get("since") or 0)
        except ValueError:
            raise BadRequest("'since' must be a time in epoch seconds") from None
        return web.json_response({
            "now": time.time(), "sample_seconds": self.s.sample_seconds,
            "points": self.sampler.series(since), "totals": live.overview(self.server),
            "sink": live.sink_stats(self.server) or None,
            "history": self.history_status()})

    async def api_clients(self, request):
        limit = _int(request, "limit", self.s.max_clients_listed, 1, self.s.max_clients_listed)
        q = request.query.get("q", "")[:256]
        return web.json_response(live.clients(self.server.broker, q, limit))

    async def api_topics(self, request):
        from .history import check_filter
        filt = check_filter(request.query.get("filter") or "#")
        limit = _int(request, "limit", self.s.max_topics_listed, 1, self.s.max_topics_listed)
        return web.json_response(live.topics(self.server.broker, self.counter, filt, limit))

    async def api_history(self, request):
        q = make_query(request.query.get("filter"), request.query.get("from"),
                       request.query.get("to"), self.s.history_max_days)
        return web.json_response(await self.history.ask(q))

    # ------------------------------------------------------------ lifecycle
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth],
                              client_max_size=64 * 1024)
        app.router.add_get("/", self.index)
        app.router.add_get("/api/live", self.api_live)
        app.router.add_get("/api/clients", self.api_clients)
        app.router.add_get("/api/topics", self.api_topics)
        app.router.add_get("/api/history", self.api_history)
        app.router.add_static("/static/", STATIC, follow_symlinks=False)
        return app

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.s.host, self.s.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.sampler.sample()  # the baseline for the first rates
        self._tasks = [asyncio.create_task(self._sample()), asyncio.create_task(self._watch_job())]
        log.info("dashboard on http://%s:%s/%s", self.s.host, self.port,
                 " (log in with the broker's password file)" if self.passwords else "")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.counter.close()
        self.history.close()
        if self.runner is not None:
            await self.runner.cleanup()


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
