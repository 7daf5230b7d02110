"""Query the history table with Spark SQL over the temp view ``messages``.

    python -m sink.query [--table DIR] [--format table|csv|json] "SELECT ... FROM messages"

From Python (what the tests use):

    from sink.query import run_sql
    rows = run_sql(spark, "data/history", "SELECT count(*) AS n FROM messages")

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
import sys
from decimal import Decimal
from pathlib import Path

DEFAULT_TABLE = "./data/history"
VIEW = "messages"


class TableMissing(Exception):
    pass


def load_table(spark, table: str = DEFAULT_TABLE):
    """The history table as a DataFrame (only batches the job has committed)."""
    from sink.schema import HISTORY_SCHEMA
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sink.query",
        description="Run Spark SQL over the history table, visible as the view 'messages'.",
        epilog="Example: python -m sink.query \"SELECT client_id, count(*) AS n FROM messages "
               "GROUP BY client_id ORDER BY n DESC\"   Binary values print as UTF-8 when valid, "
               "else as base64:<...>; times are UTC.")
    p.add_argument("sql", help="the SQL statement (the table is the view 'messages')")
    p.add_argument("--table", metavar="DIR", default=DEFAULT_TABLE,
                   help=f"history table directory (default {DEFAULT_TABLE})")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="output: readable table (default), csv, or json (one object per line)")
    p.add_argument("--max-width", type=int, default=60, metavar="N",
                   help="table format: cut cells longer than N characters (default 60)")
    args = p.parse_args(argv)

    import logging
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)  # we print the error
    from pyspark.errors import AnalysisException, ParseException
    from sink.spark import get_spark
    spark = get_spark("mqtt-history-query", log_level="ERROR")
    try:
        register_view(spark, args.table)
        df = spark.sql(args.sql)
        rows = df.collect()
        write_rows(df.columns, rows, args.format, max_width=args.max_width)
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
