"""Query the history table with Spark SQL over the temp view ``messages``.

    python -m sink.query [--table DIR] [--format table|csv|json] "SELECT ... FROM messages"

From Python (what the tests use):

    from sink.history.query import run_sql
    rows = run_sql(spark, "data/history", "SELECT count(*) AS n FROM messages")

While the history job runs, its Spark Connect server (sink/history/job/connect.py, default
sc://127.0.0.1:15002) answers in well under a second, where a local session takes 10+ s to
start: ``sink.query`` uses it when it is there and falls back to a local session when it is
not (``-v`` says which). Any Spark Connect client sees the table as ``messages``:

    SparkSession.builder.remote("sc://127.0.0.1:15002").getOrCreate().sql("SELECT ... FROM messages")

From any plain pyspark session (the file sink's _spark_metadata makes Spark read only
committed batches):

    spark.read.parquet("data/history").createOrReplaceTempView("messages")
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import json
import os
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from settings import HistoryConfig, connect_address  # noqa: F401  (connect_address: sink.query's API)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

DEFAULT_TABLE = HistoryConfig().table             # [history] table
VIEW = "messages"
DEFAULT_CONNECT_URL = HistoryConfig().connect_url  # [history] connect_host / connect_port


class TableMissing(Exception):
    pass


def load_table(spark: SparkSession, table: str = DEFAULT_TABLE) -> DataFrame:
    """The history table as a DataFrame (only batches the job has committed)."""
    from sink.history.schema import HISTORY_SCHEMA
    check_table(table)
    return spark.read.schema(HISTORY_SCHEMA).parquet(table)


def register_view(spark: SparkSession, table: str = DEFAULT_TABLE, view: str = VIEW) -> DataFrame:
    """The view ``messages`` of ``table`` and, once the job has written Sparkplug B rows
    beside it, ``sparkplug_metrics`` and ``sparkplug_state`` (sink/history/sparkplug/)."""
    df = load_table(spark, table)
    df.createOrReplaceTempView(view)
    if view == VIEW:
        from sink.history.sparkplug.table import register_views
        register_views(spark, table)
    return df


def run_sql(spark: SparkSession, table: str, sql: str) -> list[Row]:
    """Run ``sql`` over the view ``messages`` of ``table``; returns a list of Rows."""
    register_view(spark, table)
    return spark.sql(sql).collect()


# ---- output ----------------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """A JSON/CSV-friendly version of a Spark value."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # Spark returns naive datetimes in the session zone (UTC)
            value = value.replace(tzinfo=dt.timezone.utc)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "toJson") and hasattr(value, "metadata"):  # VariantVal (payload_json)
        return json.loads(value.toJson())
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _cell(value: Any, width: int) -> str:
    v = _plain(value)
    text = "NULL" if v is None else (json.dumps(v, ensure_ascii=False)
                                     if isinstance(v, (list, dict)) else str(v))
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(columns: list[str], rows: list, max_width: int = 60) -> str:
    cells = [[_cell(r[i], max_width) for i in range(len(columns))] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |", line]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |" for row in cells]
    out += [line, f"({len(rows)} row{'s' if len(rows) != 1 else ''})"]
    return "\n".join(out)


def write_rows(columns: list[str], rows: list, fmt: str, out: IO[str] = sys.stdout, max_width: int = 60) -> None:
    if fmt == "table":
        print(format_table(columns, rows, max_width), file=out)
    elif fmt == "csv":
        w = csv.writer(out)
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if v is None else (json.dumps(v, ensure_ascii=False)
                                              if isinstance(v, (list, dict)) else v)
                        for v in (_plain(x) for x in r)])
    elif fmt == "json":  # JSON Lines: one object per row
        for r in rows:
            print(json.dumps({c: _plain(r[i]) for i, c in enumerate(columns)},
                             ensure_ascii=False), file=out)
    else:  # pragma: no cover - argparse restricts it
        raise ValueError(fmt)


# ---- checked before any Spark starts ------------------------------------------------------

READ_ONLY = ("SELECT", "WITH", "FROM", "VALUES", "TABLE", "DESCRIBE", "DESC", "SHOW", "EXPLAIN")


class JobNotUp(Exception):
    """A history job runs, but its Spark Connect server does not answer."""


class BadQuery(ValueError):
    """The SQL cannot be run (said before a Spark session is opened for it)."""


def check_sql(sql: str) -> str:
    """The statement to run: one read-only statement, its quotes, brackets and comments closed
    (a trailing ';' dropped). BadQuery says what is wrong; Spark's parser says the rest."""
    depth, i, n, start = 0, 0, len(sql), None
    code: list[str] = []               # the SQL outside strings and comments, to find keywords
    while i < n:
        ch = sql[i]
        if ch in "'\"`":
            j = i + 1
            while j < n and sql[j] != ch:
                j += 2 if sql[j] == "\\" and ch != "`" else 1
            if j >= n:
                raise BadQuery(f"unclosed {ch} from character {i + 1}")
            code.append(" x ")
            i = j + 1
            continue
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j
            continue
        if sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise BadQuery(f"unclosed /* comment from character {i + 1}")
            i = j + 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise BadQuery(f"unmatched ')' at character {i + 1}")
        elif ch == ";":
            if sql[i + 1:].strip(" \t\r\n;"):
                raise BadQuery("more than one statement: give one query (no ';' between two)")
            break
        if start is None and not ch.isspace():
            start = i
        code.append(ch)
        i += 1
    if depth:
        raise BadQuery(f"{depth} unclosed '('")
    words = "".join(code).split()
    if not words:
        raise BadQuery("no SQL given: pass a query, -f FILE, or the query on stdin")
    first = words[0].upper().lstrip("(")
    if first not in READ_ONLY:
        raise BadQuery(f"{words[0]!r}: sink.query only reads the history ({', '.join(READ_ONLY)} "
                       "...); the table is written by the history job alone")
    return sql[:i].strip().rstrip(";").strip()


def check_table(table: str) -> None:
    """A local table path must hold the job's table (TableMissing otherwise); a remote one is
    Spark's to check."""
    path = Path(table[len("file://"):] if table.startswith("file://") else table)
    local = "://" not in table or table.startswith("file://")
    if local and not (path / "_spark_metadata").is_dir() and not any(path.glob("date=*")):
        raise TableMissing(
            f"no history table at {table}: run the job first (python -m sink.job --table "
            f"{table}), or point --table at the directory the job writes")


def read_sql(args: argparse.Namespace) -> str:
    """The query: the argument, -f FILE (- = stdin), or stdin when it is not a terminal."""
    if args.file and args.sql:
        raise BadQuery("give the query either as an argument or with -f, not both")
    if args.file:
        if args.file == "-":
            return sys.stdin.read()
        try:
            return Path(args.file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadQuery(f"cannot read -f {args.file}: {exc}") from None
    if args.sql is not None:
        return args.sql
    if not sys.stdin.isatty():
        return sys.stdin.read()
    raise BadQuery("no SQL given: pass a query, -f FILE, or the query on stdin")


# ---- Spark Connect (the running job's session) or a local session ---------------------------

def connect_reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether something listens at the URL's address (the job's Spark Connect server)."""
    import socket
    try:
        with socket.create_connection(connect_address(url), timeout=timeout):
            return True
    except OSError:
        return False


def connect_session(url: str, token: str | None = None) -> SparkSession:
    """A Spark Connect client session (raises when the server does not answer or refuses the
    token)."""
    from pyspark.sql import SparkSession

    from settings.secrets import client_url
    return SparkSession.builder.remote(client_url(url, token)).getOrCreate()


def running_job(data_dir: str | None, url: str | None = None,
                table: str = DEFAULT_TABLE) -> dict | None:
    """The running history job that announced itself in the data directory (its status file,
    one per table: sink/history/commits.py) and serves Spark Connect at `url`; else the one writing
    `table`; else any (open_session says where it serves)."""
    from sink.history.commits import running_jobs
    jobs = running_jobs(data_dir) if data_dir else []
    here = [j for j in jobs if url and j.get("serves_connect_at") == url]
    mine = [j for j in jobs if "table" in j and j["table"] in (table, os.path.abspath(table))]
    found = here or mine or jobs
    return found[0] if found else None


def job_committed(job: dict) -> bool:
    """Whether the running job has committed a micro-batch (its commits file exists)."""
    path = job["committed_file"] if "committed_file" in job else None  # (a status record's field)
    return not path or os.path.exists(path)


def first_commit_note(job: dict, now: float | None = None) -> str:
    """What a query before the job's first commit says: the answer holds no row of this run yet."""
    ran = (now if now is not None else time.time()) - float(job.get("started_at") or 0)
    since = f"started {ran:.0f} s ago" if job.get("started_at") else "starting"
    return (f"note: the history job (pid {job.get('pid')}, {since}) has not committed its first "
            "micro-batch yet: messages become queryable once it has (its log says each commit); "
            "ask again in a few seconds")


def wait_for_server(url: str, job: dict | None, wait: float,
                    progress: Callable[[str], object] = lambda msg: None) -> bool:
    """Whether the job's server answers at url, waiting up to `wait` seconds while a job that
    announced itself is still starting (its Spark takes 10-30 s), with a progress line."""
    if connect_reachable(url):
        return True
    if job is None or wait <= 0:
        return False
    deadline = time.monotonic() + wait
    started = job.get("started_at") or time.time()
    said = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - said >= 10:    # a line at once, then every 10 s
            said = time.monotonic()
            progress(f"waiting for the history job (pid {job.get('pid')}, started "
                     f"{time.time() - started:.0f} s ago) to serve Spark Connect at {url} ...")
        time.sleep(0.5)
        if connect_reachable(url):
            return True
        from sink.history.commits import job_alive
        if not job_alive(job):
            return False
    return False


def open_session(url: str | None, say: Callable[[str], object] = lambda msg: None, token: str | None = None,
                 job: dict | None = None, wait: float = 0.0,
                 tell: Callable[[str], object] = lambda msg: None,
                 why_local: str = "--local") -> tuple[SparkSession, str]:
    """(spark, "connect" | "local"): the job's Spark Connect server when it answers at url
    (waiting for a job that is starting), else a new local session, said on stderr."""
    serves_at = job.get("serves_connect_at") if job is not None else None
    if job is not None and serves_at and url and serves_at != url:
        say(f"the history job (pid {job.get('pid')}) serves Spark Connect at {serves_at}, "
            f"not at {url}")
        job = None   # nothing to wait for at url: a local session reads the table beside it
    if url:
        if wait_for_server(url, job, wait, tell):
            try:
                spark = connect_session(url, token)
                say(f"using the history job's Spark Connect server at {url}")
                return spark, "connect"
            except Exception as exc:  # a server that does not speak Spark Connect, ...
                text = str(exc)
                if "UNAUTHENTICATED" in text or "nauthenticated" in text:
                    from settings import secrets
                    raise PermissionError(
                        f"the Spark Connect server at {url} refused the token"
                        f"{'' if token else ' (none was found)'}: sink.query reads it from "
                        f"{secrets.TOKEN_FILE} in the broker's data directory's secrets/ "
                        f"(--data-dir / --config data_dir) or ${secrets.TOKEN_ENV}") from None
                say(f"Spark Connect at {url} did not answer ({text.splitlines()[0][:200]})"
                    ": starting a local Spark session (10+ s)")
        elif job is not None:   # never a second Spark beside a job that is starting
            raise JobNotUp(f"the history job (pid {job.get('pid')}) does not serve Spark Connect "
                           f"at {url} yet{f' after {wait:g} s' if wait else ''}: try again when "
                           "it logs 'Spark Connect on ...' (--wait S waits longer), or check "
                           "[history] connect_port and its log")
        else:
            tell(f"the history job is not running (no Spark Connect server at {url}): reading "
                 "the table with a local Spark session (10+ s; --local to ask for it)")
    else:
        say(f"starting a local Spark session ({why_local})")
    from sink.history.spark import get_spark
    return get_spark("mqtt-history-query", log_level="ERROR"), "local"


def main(argv: list[str] | None = None) -> int:
    from settings import environment
    p = argparse.ArgumentParser(
        prog="python -m sink.query",
        description="Run Spark SQL over the history table, visible as the view 'messages'.",
        formatter_class=environment.HelpFormatter,
        epilog="Example: python -m sink.query \"SELECT client_id, count(*) AS n FROM messages "
               "GROUP BY client_id ORDER BY n DESC\"   Binary values print as UTF-8 when valid, "
               "else as base64:<...>; times are UTC.\n\n" + environment.epilog(environment.QUERY))
    p.add_argument("sql", nargs="?", help="the SQL statement (the table is the view 'messages'); "
                                          "or -f FILE, or on stdin")
    p.add_argument("-f", "--file", metavar="FILE", help="read the query from FILE (- = stdin)")
    p.add_argument("--config", metavar="FILE",
                   help="the broker's config: [history] table and connect address, data_dir")
    p.add_argument("--data-dir", metavar="DIR",
                   help="the broker's data directory, where the Spark Connect token is "
                        "(default ./data, or data_dir of --config)")
    p.add_argument("--table", metavar="DIR", default=None,
                   help=f"history table directory, read by a local Spark session (default "
                        f"{DEFAULT_TABLE}; without --table the job's Spark Connect answers, "
                        "with its table: its clients read only its catalog's tables)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="output: readable table (default), csv, or json (one object per line)")
    p.add_argument("--max-width", type=int, default=60, metavar="N",
                   help="table format: cut cells longer than N characters (default 60)")
    p.add_argument("--connect", metavar="URL", default=environment.SINK_CONNECT_URL.get(),
                   help="the running history job's Spark Connect server, used when it answers "
                        f"(default $SINK_CONNECT_URL or {DEFAULT_CONNECT_URL})")
    p.add_argument("--wait", type=float, default=120.0, metavar="S",
                   help="while a history job is starting, wait up to S seconds for its Spark "
                        "Connect server (default 120; 0 = do not wait)")
    p.add_argument("--local", action="store_true",
                   help="always start a local Spark session (ignore a running job's server)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say on stderr whether Spark Connect or a local session answered")
    args = p.parse_args(argv)
    from settings import ConfigError, report
    try:
        from settings import load
        cfg = load(args.config)
    except ConfigError as exc:
        return report(exc)
    data_dir = args.data_dir or cfg.data_dir
    default_table = cfg.history.table
    if args.connect is None:
        args.connect = cfg.history.connect_url
    if not args.local:
        try:
            connect_address(args.connect)
        except ValueError as exc:
            if args.connect != environment.SINK_CONNECT_URL.get():
                p.error(f"--connect: {exc}")
            return report(ConfigError("SINK_CONNECT_URL", "must be sc://HOST:PORT (the history "
                                      "job's Spark Connect server)", args.connect))

    def say(msg: str) -> None:
        if args.verbose:
            print(f"sink.query: {msg}", file=sys.stderr)

    def tell(msg: str) -> None:
        print(f"sink.query: {msg}", file=sys.stderr, flush=True)

    try:  # everything that can be checked without Spark, before Spark
        sql = check_sql(read_sql(args))
        job = None if args.local else running_job(data_dir, args.connect, default_table)
        reachable = not args.local and connect_reachable(args.connect)
        if args.local or (not reachable and job is None) or args.table is not None:
            table = args.table or default_table
            if "://" not in table:
                check_table(table)
    except BadQuery as exc:
        tell(f"error: {exc}")
        return 2
    except TableMissing as exc:
        tell(f"error: {exc}")
        return 2

    import logging
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)  # we print the error
    from pyspark.errors import AnalysisException, ParseException

    from settings import secrets
    started = time.monotonic()
    try:
        spark, how = open_session(None if args.local or args.table is not None else args.connect, say,
                                  token=secrets.connect_token(data_dir), job=job,
                                  wait=args.wait, tell=tell,
                                  why_local="--local" if args.local else
                                  "--table: a table named by its path is read here; the job's "
                                  "Spark Connect reads only its catalog tables")
    except (PermissionError, JobNotUp) as exc:
        tell(f"error: {exc}")
        return 2
    opened = time.monotonic()
    try:
        if how == "local" or args.table is not None:
            # Over Spark Connect the path is resolved by the server: make it absolute here.
            table = args.table or default_table
            register_view(spark, os.path.abspath(table) if "://" not in table else table)
        df = spark.sql(sql)
        rows = df.collect()
        write_rows(df.columns, rows, args.format, max_width=args.max_width)
        if job is not None and not job_committed(job):
            tell(first_commit_note(job))
        say(f"answered by {'Spark Connect' if how == 'connect' else 'a local Spark session'} "
            f"in {time.monotonic() - opened:.2f} s (+ {opened - started:.2f} s to open the "
            "session)")
        return 0
    except TableMissing as exc:
        tell(f"error: {exc}")
        return 2
    except (ParseException, AnalysisException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        print(f"sink.query: error in the SQL: {first}\n(the table is the view '{VIEW}'; "
              f"columns: see python -m sink.query \"DESCRIBE {VIEW}\")", file=sys.stderr)
        return 2
    except Exception as exc:   # Spark failed to run it (a worker, the server): one line, no trace
        first = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else repr(exc)
        tell(f"error: Spark could not run the query ({type(exc).__name__}: {first})"
             + (": see the history job's log" if how == "connect" else ""))
        return 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
