"""History charts: questions to the history job's Spark Connect server.

The broker never starts Spark itself. A Spark Connect client session (pyspark, imported on the
first question) lives in one worker thread, so the event loop never waits for Spark; each
question has a timeout, after which its Spark operations are interrupted. Every user input is
checked here first (topic filter with the broker's own rules, time range) and reaches Spark as
a query parameter, never as SQL text.
"""
from __future__ import annotations

import asyncio
import atexit
import datetime as dt
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mqtt_topics import valid_topic_filter

log = logging.getLogger("broker.dashboard")

BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
           43200, 86400, 172800, 604800)
MAX_BUCKETS = 240        # points per series at most
MAX_SERIES = 8           # numeric topics charted
LATEST_ROWS = 50         # rows of the latest-messages table
MAX_FILTER_BYTES = 65535


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
    parts = []
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


def parse_time(value: str | None, name: str) -> float | None:
    """Seconds since the epoch from epoch seconds/milliseconds or ISO 8601 (UTC if no zone)."""
    if value is None or value.strip() == "":
        return None
    v = value.strip()
    try:
        x = float(v)
        return x / 1000.0 if x > 1e11 else x  # milliseconds when that large
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"'{name}' must be a time such as 2026-05-01T10:00:00Z or epoch "
                         f"seconds, not {value!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


@dataclass
class HistoryQuery:
    filter: str
    start: float     # seconds since the epoch, inclusive
    end: float       # exclusive
    bucket: int      # seconds per point

    @property
    def params(self) -> dict:
        day = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).date().isoformat()  # noqa: E731
        return {"re": filter_regex(self.filter), "t0": int(self.start * 1000),
                "t1": int(self.end * 1000), "d0": day(self.start), "d1": day(self.end),
                "b": self.bucket}


def make_query(filt: str | None, start: str | None, end: str | None, max_days: float,
               now: float | None = None) -> HistoryQuery:
    filt = check_filter(filt)
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
    return HistoryQuery(filt, t0, t1, bucket)


# ---- Spark -----------------------------------------------------------------------------------

WHERE = ("date >= CAST(:d0 AS DATE) AND date <= CAST(:d1 AS DATE) "
         "AND accepted_at >= timestamp_millis(:t0) AND accepted_at < timestamp_millis(:t1) "
         "AND topic RLIKE :re")
BUCKET = "CAST(floor(unix_seconds(accepted_at) / :b) * :b AS BIGINT)"

COUNTS_SQL = f"""SELECT {BUCKET} AS bucket, count(*) AS n FROM messages WHERE {WHERE}
GROUP BY 1 ORDER BY 1"""

VALUES_SQL = f"""WITH v AS (SELECT topic, {BUCKET} AS bucket,
    try_cast(trim(payload_text) AS DOUBLE) AS x FROM messages WHERE {WHERE}),
top AS (SELECT topic FROM v WHERE x IS NOT NULL GROUP BY topic
        ORDER BY count(*) DESC, topic LIMIT {MAX_SERIES})
SELECT v.topic, v.bucket, avg(v.x) AS x, count(*) AS n FROM v JOIN top ON v.topic = top.topic
WHERE v.x IS NOT NULL AND NOT isnan(v.x) AND abs(v.x) != double('infinity')
GROUP BY v.topic, v.bucket ORDER BY v.topic, v.bucket"""

LATEST_SQL = f"""SELECT unix_millis(accepted_at) AS at_ms, topic, client_id, qos, retain, payload_text,
    base64(substring(payload, 1, 200)) AS payload_base64, length(payload) AS bytes
FROM messages WHERE {WHERE} ORDER BY accepted_at DESC, kafka_offset DESC LIMIT {LATEST_ROWS}"""


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    t = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class HistoryClient:
    """Spark Connect questions from the broker, one at a time, in a worker thread."""

    def __init__(self, url: str, timeout: float, start_hint: str):
        from settings import connect_address
        self.url = url
        self.host, self.port = connect_address(url)
        self.timeout = timeout
        self.start_hint = start_hint
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dashboard-history")
        self._spark = None
        self._lock = threading.Lock()
        self._waiting = 0

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
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, self._answer, q)
        try:
            answer = await asyncio.wait_for(asyncio.shield(fut), self.timeout)
            log.info("history %s over %g s answered in %.2f s (%d messages)", q.filter,
                     q.end - q.start, answer["seconds"], answer["total"])
            return answer
        except asyncio.TimeoutError:
            self._interrupt()
            raise TimeoutError(f"the history job did not answer within {self.timeout:g} s "
                               "([dashboard] history_timeout_seconds): try a shorter range or a "
                               "narrower filter") from None
        finally:
            self._waiting -= 1

    def _interrupt(self) -> None:
        spark = self._spark
        if spark is not None:
            threading.Thread(target=lambda: _quietly(spark.interruptAll), daemon=True).start()

    def _session(self):
        with self._lock:
            if self._spark is None:
                try:
                    from pyspark.sql import SparkSession
                except ImportError as exc:  # e.g. the broker's container image: no Spark in it
                    raise JobNotRunning(
                        f"history charts need the Spark Connect client in the broker's Python "
                        f"environment (pip install 'pyspark[connect]'), which has none ({exc}); "
                        f"query the history where the job runs: python -m sink.query") from None
                self._spark = SparkSession.builder.remote(self.url).create()
            return self._spark

    def _answer(self, q: HistoryQuery) -> dict:
        started = time.monotonic()
        for attempt in (1, 2):
            spark = self._session()
            try:
                return self._run(spark, q, started)
            except Exception as exc:
                if not _connection_problem(exc):
                    raise
                if attempt == 2:  # stopped (or restarting) after the port check
                    raise JobNotRunning(self.not_running()) from None
                # the job was restarted: its server forgot our session; start a new one
                log.info("history: Spark Connect session lost (%s); reconnecting",
                         str(exc).splitlines()[0][:200])
                with self._lock:
                    self._spark = None
                _drop(spark)
        raise AssertionError("unreachable")

    @staticmethod
    def _run(spark, q: HistoryQuery, started: float) -> dict:
        args = q.params
        # three independent questions: asked at once (one Spark Connect session serves
        # concurrent operations), so the answer takes about as long as the slowest one
        with ThreadPoolExecutor(3, thread_name_prefix="dashboard-sql") as pool:
            counts_f, values_f, latest_f = (
                pool.submit(lambda sql=sql: spark.sql(sql, args=args).collect())
                for sql in (COUNTS_SQL, VALUES_SQL, LATEST_SQL))
            counts = [(r.bucket, r.n) for r in counts_f.result()]
            series: dict[str, list] = {}
            for r in values_f.result():
                series.setdefault(r.topic, []).append([r.bucket, r.x])
            latest = [{"accepted_at": _iso(r.at_ms), "topic": r.topic,
                       "client_id": r.client_id, "qos": r.qos, "retain": r.retain,
                       "payload_text": r.payload_text,
                       "payload_base64": None if r.payload_text is not None else r.payload_base64,
                       "bytes": r.bytes}
                      for r in latest_f.result()]
        return {"filter": q.filter, "from": q.start, "to": q.end, "bucket_seconds": q.bucket,
                "counts": counts, "total": sum(n for _, n in counts),
                "values": [{"topic": t, "points": pts} for t, pts in series.items()],
                "latest": latest, "seconds": round(time.monotonic() - started, 3)}

    def close(self) -> None:
        spark = self._spark
        self._spark = None
        if spark is not None:
            _drop(spark)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _connection_problem(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in ("UNAVAILABLE", "SESSION_NOT_FOUND", "INVALID_HANDLE",
                                   "SESSION_CLOSED", "Connection refused", "RetriesExceeded"))


def _drop(spark) -> None:
    """Let a Spark Connect session go without ever holding up the broker: pyspark's exit hook
    would otherwise retry its clean-up calls for minutes when the job (the server) has stopped
    first, and the broker process would not exit. Release the session in the background."""
    client = getattr(spark, "_client", None)
    if client is not None:
        atexit.unregister(client._on_exit)
    threading.Thread(target=_quietly, args=(spark.stop,), daemon=True,
                     name="dashboard-connect-close").start()


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:
        pass


__all__ = ["HistoryClient", "HistoryQuery", "BadRequest", "JobNotRunning", "make_query",
           "filter_regex", "check_filter", "parse_time"]
