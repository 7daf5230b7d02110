"""Query the history table with Spark SQL over the temp view ``messages``.

    python -m sink.query [--table DIR] [--format table|csv|json] "SELECT ... FROM messages"

From Python (what the tests use):

    from sink.history.query import run_sql
    rows = run_sql(spark, "data/history", "SELECT count(*) AS n FROM messages")

While the history job runs, its Spark Connect server (sink/history/job.py, default
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

from settings import HistoryConfig, connect_address  # noqa: F401  (connect_address: sink.query's API)

DEFAULT_TABLE = HistoryConfig().table             # [history] table
VIEW = "messages"
DEFAULT_CONNECT_URL = HistoryConfig().connect_url  # [history] connect_host / connect_port


class TableMissing(Exception):
    pass


def load_table(spark, table: str = DEFAULT_TABLE):
    """The history table as a DataFrame (only batches the job has committed)."""
    from sink.history.schema import HISTORY_SCHEMA
    path = Path(table[len("file://"):] if table.startswith("file://") else table)
    local = "://" not in table or table.startswith("file://")
    if local and not (path / "_spark_metadata").is_dir() and not any(path.glob("date=*")):
        raise TableMissing(
            f"no history table at {table}: run the job first (python -m sink.job --table "
            f"{table}), or point --table at the directory the job writes")
    return spark.read.schema(HISTORY_SCHEMA).parquet(table)


def register_view(spark, table: str = DEFAULT_TABLE, view: str = VIEW):
    df = load_table(spark, table)
    df.createOrReplaceTempView(view)
    return df


def run_sql(spark, table: str, sql: str) -> list:
    """Run ``sql`` over the view ``messages`` of ``table``; returns a list of Rows."""
    register_view(spark, table)
    return spark.sql(sql).collect()


# ---- output ----------------------------------------------------------------------------------

def _plain(value):
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
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _cell(value, width: int) -> str:
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


def write_rows(columns: list[str], rows: list, fmt: str, out=sys.stdout, max_width: int = 60):
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


# ---- Spark Connect (the running job's session) or a local session ---------------------------

def connect_reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether something listens at the URL's address (the job's Spark Connect server)."""
    import socket
    try:
        with socket.create_connection(connect_address(url), timeout=timeout):
            return True
    except OSError:
        return False


def connect_session(url: str):
    """A Spark Connect client session (raises when the server does not answer)."""
    from pyspark.sql import SparkSession
    return SparkSession.builder.remote(url).getOrCreate()


def open_session(url: str | None, say=lambda msg: None):
    """(spark, "connect" | "local"): the job's Spark Connect server when it answers at url,
    else a new local session."""
    if url:
        if connect_reachable(url):
            try:
                spark = connect_session(url)
                say(f"using the history job's Spark Connect server at {url}")
                return spark, "connect"
            except Exception as exc:  # a server that does not speak Spark Connect, ...
                say(f"Spark Connect at {url} did not answer ({str(exc).splitlines()[0][:200]})"
                    ": starting a local Spark session (10+ s)")
        else:
            say(f"no Spark Connect server at {url} (the history job is not running, or runs "
                "with connect = false): starting a local Spark session (10+ s)")
    else:
        say("starting a local Spark session (--local)")
    from sink.history.spark import get_spark
    return get_spark("mqtt-history-query", log_level="ERROR"), "local"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sink.query",
        description="Run Spark SQL over the history table, visible as the view 'messages'.",
        epilog="Example: python -m sink.query \"SELECT client_id, count(*) AS n FROM messages "
               "GROUP BY client_id ORDER BY n DESC\"   Binary values print as UTF-8 when valid, "
               "else as base64:<...>; times are UTC.")
    p.add_argument("sql", help="the SQL statement (the table is the view 'messages')")
    p.add_argument("--table", metavar="DIR", default=None,
                   help=f"history table directory (default {DEFAULT_TABLE}; over Spark Connect: "
                        "the job's table)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="output: readable table (default), csv, or json (one object per line)")
    p.add_argument("--max-width", type=int, default=60, metavar="N",
                   help="table format: cut cells longer than N characters (default 60)")
    p.add_argument("--connect", metavar="URL",
                   default=os.environ.get("SINK_CONNECT_URL", DEFAULT_CONNECT_URL),
                   help="the running history job's Spark Connect server, used when it answers "
                        f"(default $SINK_CONNECT_URL or {DEFAULT_CONNECT_URL})")
    p.add_argument("--local", action="store_true",
                   help="always start a local Spark session (ignore a running job's server)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say on stderr whether Spark Connect or a local session answered")
    args = p.parse_args(argv)
    if not args.local:
        try:
            connect_address(args.connect)
        except ValueError as exc:
            if args.connect != os.environ.get("SINK_CONNECT_URL"):
                p.error(f"--connect: {exc}")
            from settings import ConfigError, report
            return report(ConfigError("SINK_CONNECT_URL", "must be sc://HOST:PORT (the history "
                                      "job's Spark Connect server)", args.connect))

    import logging
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)  # we print the error
    from pyspark.errors import AnalysisException, ParseException
    started = time.monotonic()

    def say(msg: str) -> None:
        if args.verbose:
            print(f"sink.query: {msg}", file=sys.stderr)

    spark, how = open_session(None if args.local else args.connect, say)
    opened = time.monotonic()
    try:
        if how == "local" or args.table is not None:
            # Over Spark Connect the path is resolved by the server: make it absolute here.
            table = args.table or DEFAULT_TABLE
            register_view(spark, os.path.abspath(table) if "://" not in table else table)
        df = spark.sql(args.sql)
        rows = df.collect()
        write_rows(df.columns, rows, args.format, max_width=args.max_width)
        say(f"answered by {'Spark Connect' if how == 'connect' else 'a local Spark session'} "
            f"in {time.monotonic() - opened:.2f} s (+ {opened - started:.2f} s to open the "
            "session)")
        return 0
    except TableMissing as exc:
        print(f"sink.query: error: {exc}", file=sys.stderr)
        return 2
    except (ParseException, AnalysisException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        print(f"sink.query: error in the SQL: {first}\n(the table is the view '{VIEW}'; "
              f"columns: see python -m sink.query \"DESCRIBE {VIEW}\")", file=sys.stderr)
        return 2
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
