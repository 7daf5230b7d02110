"""The dashboard's history questions, answered in a child process of the broker.

    python -m broker.dashboard.history_worker sc://HOST:PORT

Reads one question a line on stdin (JSON, made by history.question()), writes one answer a line
on stdout: {"answer": {...}}, {"error": "not_running"} or {"error": "what went wrong"}; a
continuous rule's SQL to check ({"check_sql": SQL}) is answered {"answer": {"columns": [[name,
type], ...]}} or {"error": "sql", "detail": Spark's message}. Exits at
the end of its input. The Spark Connect client (pyspark, grpc, pyarrow) lives here, never in
the broker process (broker/dashboard/history.py starts and ends this process).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from settings import history_columns as col

from .history import COUNTS_SQL, FIELD_SQL, LATEST_SQL, VALUES_SQL, iso

#: the live stream a rule reads, empty, with the table's columns (checking a rule's SQL)
EMPTY_MESSAGES = "SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in col.COLUMN_TYPES) \
    + " WHERE false"


class SQLRefused(Exception):
    """Spark's analysis refused a rule's SQL: the message is Spark's."""

log = logging.getLogger(__spec__.name if __name__ == "__main__" else __name__)  # (python -m: its module path)


class Worker:
    def __init__(self, url: str) -> None:
        self.url = url
        self._spark: Any = None  # a pyspark SparkSession

    def _session(self) -> Any:
        if self._spark is None:
            from pyspark.sql import SparkSession  # ImportError: answer() says what is missing

            from settings.environment import SPARK_CONNECT_TOKEN
            from settings.secrets import client_url
            # the job's Spark Connect token, handed over in this process's environment by the
            # broker (never on its command line)
            url = client_url(self.url, SPARK_CONNECT_TOKEN.get())
            self._spark = SparkSession.builder.remote(url).create()
        return self._spark

    def answer(self, q: dict) -> dict:
        started = time.monotonic()
        for attempt in (1, 2):
            try:
                spark = self._session()
            except ImportError as exc:  # e.g. the broker's container image: no Spark in it
                return {"error": "no_spark_client", "detail": str(exc)}
            try:
                if "check_sql" in q:
                    return {"answer": check_sql(spark, q["check_sql"])}
                return {"answer": self._run(spark, q, started)}
            except SQLRefused as exc:
                return {"error": "sql", "detail": str(exc)}
            except Exception as exc:
                if not _connection_problem(exc):
                    raise
                if attempt == 2:  # stopped (or restarting) after the broker's port check
                    return {"error": "not_running"}
                # the job was restarted: its server forgot our session; start a new one
                log.info("Spark Connect session lost (%s); reconnecting",
                         str(exc).splitlines()[0][:200])
                self._spark = None
                _drop(spark)
        raise AssertionError("unreachable")

    @staticmethod
    def _run(spark: Any, q: dict, started: float) -> dict:
        args = q["params"]
        if q.get("field") is not None:
            return _field_answer(spark.sql(FIELD_SQL, args=args).collect(), q, started)
        # three independent questions: asked at once (one Spark Connect session serves
        # concurrent operations), so the answer takes about as long as the slowest one
        with ThreadPoolExecutor(3, thread_name_prefix="history-sql") as pool:
            counts_f, values_f, latest_f = (
                pool.submit(lambda sql=sql: spark.sql(sql, args=args).collect())  # type: ignore[misc]
                for sql in (COUNTS_SQL, VALUES_SQL, LATEST_SQL))
            counts = [(r.bucket, r.n) for r in counts_f.result()]
            series: dict[str, list] = {}
            for r in values_f.result():
                series.setdefault(r.topic, []).append([iso(r.bucket), r.x])
            latest = [{"accepted_at": iso(r.at_ms / 1000), "topic": r.topic,
                       "client_id": r.client_id, "qos": r.qos, "retain": r.retain,
                       "payload_text": r.payload_text,
                       "payload_base64": None if r.payload_text is not None else r.payload_base64,
                       "bytes": r.bytes}
                      for r in latest_f.result()]
        return {"filter": q["filter"], "from": iso(q["start"]), "to": iso(q["end"]),
                "bucket_seconds": q["bucket"],
                "counts": [[iso(b), n] for b, n in counts], "total": sum(n for _, n in counts),
                "values": [{"topic": t, "points": pts} for t, pts in series.items()],
                "latest": latest, "seconds": round(time.monotonic() - started, 3)}

    def close(self) -> None:
        if self._spark is not None:
            _drop(self._spark)


def check_sql(spark: Any, sql: str) -> dict:
    """The columns of a rule's SQL over an empty ``messages`` (SQLRefused: Spark's error). The
    SQL is only analysed, as a subquery (so that it cannot be a command, which spark.sql would
    run at once) under a WITH that makes ``messages`` an empty relation with the table's
    columns: one query, as the job's read-only Spark Connect sessions allow (no temporary
    view), and its guard checks the rule's SQL too (no user code, no files)."""
    try:
        schema = spark.sql(f"WITH {col.TABLE} AS ({EMPTY_MESSAGES}) SELECT * FROM (\n{sql}\n) "
                           f"AS rule").schema
    except Exception as exc:
        if _connection_problem(exc):
            raise
        raise SQLRefused(spark_message(str(exc))) from None
    return {"columns": [[f.name, f.dataType.simpleString()] for f in schema.fields]}


def spark_message(text: str) -> str:
    """Spark's error for a person: its first line (the analysed plan and a JVM stack trace
    left out), the SQL excerpt of a syntax error, line numbers those of the rule's SQL (it was
    checked one line down, inside a subquery)."""
    lines = text.strip().split("\n")
    keep = lines[:1]
    if "== SQL ==" in lines:
        i = lines.index("== SQL ==")
        keep += [ln for ln in lines[i + 2:i + 20] if ln != ") AS rule"
                 and not ln.startswith("JVM stacktrace")][:8]
    out = "\n".join(keep).replace("; line", " (line").rstrip(";")
    out = re.sub(r"\bline (\d+)", lambda m: f"line {max(1, int(m.group(1)) - 1)}", out)
    return out[:4000]


def _field_answer(rows: list, q: dict, started: float) -> dict:
    """A JSON field's series: per bucket, [time, avg, min, max, values]."""
    points = [[iso(r.bucket), r.avg, r.min, r.max, r.n] for r in rows]
    return {"filter": q["filter"], "field": q["field"], "from": iso(q["start"]),
            "to": iso(q["end"]), "bucket_seconds": q["bucket"], "points": points,
            "total": sum(p[4] for p in points), "seconds": round(time.monotonic() - started, 3)}


def _connection_problem(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in ("UNAVAILABLE", "SESSION_NOT_FOUND", "INVALID_HANDLE",
                                   "SESSION_CLOSED", "Connection refused", "RetriesExceeded"))


def _drop(spark: Any) -> None:
    """Let a Spark Connect session go without waiting: pyspark's exit hook would retry its
    clean-up calls for minutes when the job (the server) has stopped first."""
    client = getattr(spark, "_client", None)
    if client is not None:
        atexit.unregister(client._on_exit)
    threading.Thread(target=_quietly, args=(spark.stop,), daemon=True).start()


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    w = Worker(argv[0])
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            r = w.answer(json.loads(line))
        except Exception as exc:
            log.exception("history question failed")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            r = {"error": f"the history job could not answer: {first}"}
        out.write(json.dumps(r) + "\n")
        out.flush()
    w.close()
    os._exit(0)  # no pyspark exit hooks: nothing to wait for


if __name__ == "__main__":
    sys.exit(main())
