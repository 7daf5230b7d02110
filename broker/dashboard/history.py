"""History charts: questions to the history job's Spark Connect server.

The broker never starts Spark, and never loads its client either: a Spark Connect client
(pyspark, grpc, pyarrow: about 120 MiB) would stay in the broker process for good. Questions
are answered by a small child process (history_worker.py, ``python -m
broker.dashboard.history_worker URL``) started at the first question, one question at a time,
that exits after ``[dashboard] history_worker_idle_seconds`` without one. A question that takes
longer than ``history_timeout_seconds`` ends the child (its Spark operations with it); the next
question starts a new one. Every user input is checked here first (topic filter with the
broker's own rules, time range) and reaches Spark as a query parameter, never as SQL text.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mqtt_topics import valid_topic_filter
from settings import history_columns as col
from settings.secrets import TOKEN_ENV

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
           43200, 86400, 172800, 604800)
MAX_BUCKETS = 240        # points per series at most
MAX_SERIES = 8           # numeric topics charted
LATEST_ROWS = 50         # rows of the latest-messages table
MAX_FILTER_BYTES = 65535
MAX_FIELD_CHARS = 200
# a JSON field: names of letters, digits and _, '.' between names, [n] for an array's element
FIELD_PATH = re.compile(r"(?:[A-Za-z0-9_]+|\[[0-9]{1,6}\])(?:\.[A-Za-z0-9_]+|\[[0-9]{1,6}\])*")


class BadRequest(ValueError):
    """Input the person must fix; the message says what and how."""


class JobNotRunning(RuntimeError):
    pass


# ---- input -----------------------------------------------------------------------------------

def _quote(text: str) -> str:
    """A literal in a regex that Java (Spark's RLIKE) and Python read the same way: ASCII
    punctuation escaped, letters and digits (\\1 is a back reference) and non-ASCII as is."""
    return "".join("\\" + ch if ch.isascii() and not ch.isalnum() else ch for ch in text)


def filter_regex(filt: str) -> str:
    """A regex matching exactly the topic names the MQTT topic filter matches (section 4.7)."""
    levels = filt.split("/")
    parts: list[str] = []
    for i, level in enumerate(levels):
        if level == "#":
            prefix = "/".join(parts)
            # 'a/#' matches 'a' and everything below it (4.7.1.2)
            body = ".*" if i == 0 else prefix + "(/.*)?"
            break
        parts.append("[^/]*" if level == "+" else _quote(level))
    else:
        body = "/".join(parts)
    # wildcards at the first level do not match topics starting with '$' [MQTT-4.7.2-1]
    guard = "(?!\\$)" if levels[0] in ("+", "#") else ""
    return f"(?s)^{guard}{body}$"


def check_filter(filt: str | None) -> str:
    if filt is None or filt == "":
        raise BadRequest("give a topic filter, e.g. sensors/# or sensors/+/temp")
    if len(filt.encode("utf-8", "surrogatepass")) > MAX_FILTER_BYTES or "\x00" in filt:
        raise BadRequest("the topic filter is too long or contains a NUL character")
    if filt.startswith("$share/"):
        raise BadRequest("a $share/... filter is a shared subscription, not a topic filter: "
                         "leave out $share/<group>/")
    if not valid_topic_filter(filt):
        raise BadRequest(f"invalid topic filter {filt!r}: '#' must be the last level and alone "
                         "in it, '+' alone in its level (e.g. sensors/+/temp, sensors/#)")
    return filt


def check_field(path: str | None) -> str:
    """A JSON field path of the payloads: ``temp``, ``env.temp``, ``readings[0].value``."""
    if path is None or path.strip() == "":
        raise BadRequest("give a field of the JSON payloads, e.g. temp, env.temp or "
                         "readings[0].value")
    if len(path) > MAX_FIELD_CHARS:
        raise BadRequest(f"the field path is longer than {MAX_FIELD_CHARS} characters")
    if not FIELD_PATH.fullmatch(path):
        raise BadRequest(f"invalid field path {path[:60]!r}: use names of letters, digits and _, "
                         "'.' between nested names and [n] for an array's element, e.g. "
                         "env.temp or readings[0].value")
    return path


def field_json_path(path: str) -> str:
    """The JSON path Spark's try_variant_get reads for a checked field path."""
    return "$" + ("" if path.startswith("[") else ".") + path


def parse_time(value: str | None, name: str) -> float | None:
    """Seconds since the epoch from epoch seconds/milliseconds or ISO 8601 (UTC if no zone)."""
    if value is None or value.strip() == "":
        return None
    v = value.strip()
    try:
        x = float(v)
    except ValueError:
        pass
    else:
        if not math.isfinite(x) or x < 0 or x > 1e14:
            raise BadRequest(f"'{name}' must be a time: epoch seconds (or milliseconds) from 0 "
                             f"or ISO 8601 such as 2026-05-01T10:00:00Z, not {value[:50]!r}")
        return x / 1000.0 if x > 1e11 else x  # milliseconds when that large
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return t.timestamp()
    except (ValueError, OverflowError):
        raise BadRequest(f"'{name}' must be a time such as 2026-05-01T10:00:00Z or epoch "
                         f"seconds, not {value[:50]!r}") from None


@dataclass
class HistoryQuery:
    filter: str
    start: float     # seconds since the epoch, inclusive
    end: float       # exclusive
    bucket: int      # seconds per point
    field: str | None = None  # a JSON field's series (check_field) instead of counts and values

    @property
    def params(self) -> dict:
        day = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).date().isoformat()  # noqa: E731
        p: dict = {"re": filter_regex(self.filter), "t0": int(self.start * 1000),
                   "t1": int(self.end * 1000), "d0": day(self.start), "d1": day(self.end),
                   "b": self.bucket}
        if self.field is not None:
            p["path"] = field_json_path(self.field)
        return p


def make_query(filt: str | None, start: str | None, end: str | None, max_days: float,
               now: float | None = None, field: str | None = None) -> HistoryQuery:
    """A checked question; with ``field``, about that JSON field of the payloads."""
    filt = check_filter(filt)
    if field is not None:
        field = check_field(field)
    now = time.time() if now is None else now
    t1 = parse_time(end, "to")
    t1 = now if t1 is None else t1
    t0 = parse_time(start, "from")
    t0 = t1 - 3600 if t0 is None else t0
    if t0 >= t1:
        raise BadRequest("empty time range: 'from' must be before 'to'")
    if t1 - t0 > max_days * 86400:
        raise BadRequest(f"the time range is longer than {max_days:g} days "
                         "([dashboard] history_max_days): pick a shorter one")
    span = t1 - t0
    bucket = next((b for b in BUCKETS if span / b <= MAX_BUCKETS), BUCKETS[-1])
    return HistoryQuery(filt, t0, t1, bucket, field)


# ---- Spark -----------------------------------------------------------------------------------

# Column names from settings/history_columns.py; every user input is a parameter (:name).
WHERE = (f"{col.DATE} >= CAST(:d0 AS DATE) AND {col.DATE} <= CAST(:d1 AS DATE) "
         f"AND {col.ACCEPTED_AT} >= timestamp_millis(:t0) "
         f"AND {col.ACCEPTED_AT} < timestamp_millis(:t1) AND {col.TOPIC} RLIKE :re")
BUCKET = f"CAST(floor(unix_seconds({col.ACCEPTED_AT}) / :b) * :b AS BIGINT)"
FINITE = "x IS NOT NULL AND NOT isnan(x) AND abs(x) != double('infinity')"

COUNTS_SQL = f"""SELECT {BUCKET} AS bucket, count(*) AS n FROM {col.TABLE} WHERE {WHERE}
GROUP BY 1 ORDER BY 1"""

VALUES_SQL = f"""WITH v AS (SELECT {col.TOPIC} AS topic, {BUCKET} AS bucket,
    try_cast(trim({col.PAYLOAD_TEXT}) AS DOUBLE) AS x FROM {col.TABLE} WHERE {WHERE}),
top AS (SELECT topic FROM v WHERE x IS NOT NULL GROUP BY topic
        ORDER BY count(*) DESC, topic LIMIT {MAX_SERIES})
SELECT v.topic, v.bucket, avg(v.x) AS x, count(*) AS n FROM v JOIN top ON v.topic = top.topic
WHERE v.x IS NOT NULL AND NOT isnan(v.x) AND abs(v.x) != double('infinity')
GROUP BY v.topic, v.bucket ORDER BY v.topic, v.bucket"""

LATEST_SQL = f"""SELECT unix_millis({col.ACCEPTED_AT}) AS at_ms, {col.TOPIC} AS topic,
    {col.CLIENT_ID} AS client_id, {col.QOS} AS qos, {col.RETAIN} AS retain,
    {col.PAYLOAD_TEXT} AS payload_text, base64(substring({col.PAYLOAD}, 1, 200)) AS payload_base64,
    length({col.PAYLOAD}) AS bytes
FROM {col.TABLE} WHERE {WHERE} ORDER BY {col.ACCEPTED_AT} DESC, {col.KAFKA_OFFSET} DESC
LIMIT {LATEST_ROWS}"""

# a JSON field's series: the path (field_json_path of a checked field) is the parameter :path
FIELD_SQL = f"""SELECT bucket, avg(x) AS avg, min(x) AS min, max(x) AS max, count(*) AS n
FROM (SELECT {BUCKET} AS bucket, try_variant_get({col.PAYLOAD_JSON}, :path, 'double') AS x
      FROM {col.TABLE} WHERE {WHERE})
WHERE {FINITE} GROUP BY bucket ORDER BY bucket"""


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC with milliseconds."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def question(q: HistoryQuery) -> dict:
    """What the worker process gets for one question (JSON)."""
    out = {"filter": q.filter, "start": q.start, "end": q.end, "bucket": q.bucket,
           "params": q.params}
    if q.field is not None:
        out["field"] = q.field
    return out


ROOT = str(Path(__file__).resolve().parents[2])   # the directory holding broker/


class HistoryClient:
    """Asks the history job from a child process (history_worker.py), one question at a time."""

    def __init__(self, url: str, timeout: float, start_hint: str, idle_seconds: float = 120.0,
                 token: Callable[[], str | None] | None = None) -> None:
        """token(): the job's Spark Connect token (or None), read when a worker starts."""
        from settings import connect_address
        self.url = url
        self.token = token or (lambda: None)
        self.host, self.port = connect_address(url)
        self.timeout = timeout
        self.start_hint = start_hint
        self.idle_seconds = idle_seconds
        self.proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._idle: asyncio.TimerHandle | None = None
        self.started = 0   # worker processes started so far
        self.command = [sys.executable, "-m", "broker.dashboard.history_worker", url]

    def not_running(self) -> str:
        return (f"the history job is not running (start it with {self.start_hint}); the "
                f"dashboard asks its Spark Connect server at {self.url}")

    async def job_up(self, timeout: float = 1.0) -> bool:
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout)
        except (OSError, asyncio.TimeoutError):
            return False
        w.close()
        return True

    async def ask(self, q: HistoryQuery) -> dict:
        if not await self.job_up():
            raise JobNotRunning(self.not_running())
        if self._waiting >= 2:  # one running and one waiting: enough for one page
            raise BadRequest("the history job is busy with earlier questions: try again in a "
                             "moment")
        self._waiting += 1
        try:
            async with self._lock:
                answer = await self._ask(question(q))
        finally:
            self._waiting -= 1
        log.info("history %s over %g s answered in %.2f s (%d messages)", q.filter,
                 q.end - q.start, answer["seconds"], answer["total"])
        return answer

    async def check_sql(self, sql: str) -> list:
        """The columns [[name, type], ...] of a continuous rule's SQL, analysed by the job's
        Spark over an empty ``messages``; BadRequest with Spark's message when it refuses it,
        JobNotRunning when the job is not running (nothing else can check it)."""
        if not await self.job_up():
            raise JobNotRunning(
                f"the history job must run to check a rule's SQL (its Spark analyses it): start "
                f"it with {self.start_hint}, then add the rule again; nothing was stored "
                f"(the broker asks the job's Spark Connect server at {self.url})")
        if self._waiting >= 2:
            raise BadRequest("the history job is busy with earlier questions: try again in a "
                             "moment")
        self._waiting += 1
        try:
            async with self._lock:
                answer = await self._ask({"check_sql": sql}, sql_check=True)
        finally:
            self._waiting -= 1
        return answer["columns"]

    async def _worker(self) -> asyncio.subprocess.Process:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        p = self.proc
        if p is not None and p.returncode is None:
            return p
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        token = self.token()
        if token:
            env[TOKEN_ENV] = token
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
            limit=64 << 20)
        self.started += 1
        log.info("history: started the worker process (pid %d) for %s", self.proc.pid, self.url)
        return self.proc

    async def _ask(self, q: dict, sql_check: bool = False) -> dict:
        proc = await self._worker()
        try:
            proc.stdin.write(json.dumps(q).encode() + b"\n")  # type: ignore[union-attr]  # PIPE
            await proc.stdin.drain()  # type: ignore[union-attr]
            line = await asyncio.wait_for(proc.stdout.readline(), self.timeout)  # type: ignore[union-attr]
        except asyncio.TimeoutError:
            await self._stop_worker()  # ends its Spark operations too
            raise TimeoutError(f"the history job did not answer within {self.timeout:g} s "
                               "([dashboard] history_timeout_seconds): try a shorter range or a "
                               "narrower filter") from None
        except (ConnectionError, BrokenPipeError):
            line = b""
        if not line:
            await self._stop_worker()
            raise RuntimeError("the history worker process ended without an answer (see the "
                               "broker's log)")
        self._idle = asyncio.get_running_loop().call_later(
            self.idle_seconds, lambda: asyncio.ensure_future(self._stop_idle()))
        r = json.loads(line)
        if r.get("error") == "not_running":
            raise JobNotRunning(self.not_running())
        if r.get("error") == "no_spark_client":
            what = "checking a rule's SQL needs" if sql_check else "history charts need"
            raise JobNotRunning(
                f"{what} the Spark Connect client in the broker's Python "
                f"environment (pip install 'pyspark[connect]'), which has none "
                f"({r.get('detail')}); query the history where the job runs: python -m sink.query")
        if r.get("error") == "sql" and sql_check:
            raise BadRequest(f"Spark refused the rule's SQL: {r.get('detail')}")
        if "error" in r:
            raise RuntimeError(r["error"])
        return r["answer"]

    async def _stop_idle(self) -> None:
        if self._lock.locked():
            return
        await self._stop_worker()

    async def _stop_worker(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.returncode is not None:
            return
        try:
            p.stdin.close()  # type: ignore[union-attr]  # the worker exits at end of input...
            await asyncio.wait_for(p.wait(), 2.0)
        except (asyncio.TimeoutError, OSError):
            p.kill()                 # ...or now
            await p.wait()
        log.info("history: the worker process (pid %d) stopped", p.pid)

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        p, self.proc = self.proc, None
        if p is not None and p.returncode is None:
            p.kill()
            await p.wait()


__all__ = ["HistoryClient", "HistoryQuery", "BadRequest", "JobNotRunning", "make_query",
           "filter_regex", "check_filter", "check_field", "parse_time", "question"]
