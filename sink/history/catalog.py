"""The history table in a Spark catalog: ``messages`` (database ``[history] database``), so
spark-sql, pyspark, spark-submit jobs, Spark Connect and JDBC clients say ``SELECT ... FROM
messages`` with no path.

Two catalogs, by setting:

- **embedded Derby** (default, ``metastore_uri = ""``): a Hive metastore in
  ``<metastore_dir>/metastore_db`` (default ``<table>_metastore``). Embedded Derby admits one
  process at a time, so the job does not hold it: its own session (Spark Connect, JDBC) keeps
  ``messages`` in its in-memory catalog, and the job registers the table in the Derby
  metastore once (a short ``spark-sql`` run; again only when the table's location or schema
  changes) for every other process. Those find it through the Spark configuration directory
  the job writes, ``<metastore_dir>/conf``:

      SPARK_CONF_DIR=data/history_metastore/conf .venv/bin/spark-sql -e "SELECT count(*) FROM messages"

- **an external Hive metastore** (``metastore_uri = "thrift://host:9083"``): shared by any
  number of processes; the job's own session uses it and registers the table there.

The table is a Parquet table over the directory, not partitioned in the catalog: every query
plans from the table's newest log version (``_spark_metadata``, sink/history/manifest.py), so
new batches, compactions and expired days are seen at once, with no ``MSCK``/``REFRESH``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from settings import HistoryConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

TABLE_NAME = "messages"
MARKER = "registered.json"


def metastore_dir(hist: HistoryConfig) -> Path:
    d = hist.metastore_dir or (hist.table.rstrip("/") + "_metastore")
    return Path(d[len("file://"):] if d.startswith("file://") else d).absolute()


def table_location(table: str) -> str:
    if "://" in table and not table.startswith("file://"):
        return table
    return str(Path(table[len("file://"):] if table.startswith("file://") else table).resolve())


def quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def create_table_sql(table: str, database: str = "default", name: str = TABLE_NAME) -> str:
    """CREATE TABLE IF NOT EXISTS for the history table: columns of HISTORY_SCHEMA, Parquet,
    LOCATION the table directory (an external table: dropping it keeps the data)."""
    from sink.history.schema import HISTORY_SCHEMA
    cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in HISTORY_SCHEMA.fields)
    loc = table_location(table).replace("\\", "\\\\").replace("'", "\\'")
    return (f"CREATE TABLE IF NOT EXISTS {quote_ident(database)}.{quote_ident(name)} ({cols}) "
            f"USING parquet LOCATION '{loc}'")


def sparkplug_sql(table: str, database: str = "default") -> list[str]:
    """``sparkplug_metrics`` and the view ``sparkplug_state`` beside ``messages``
    (sink/history/sparkplug/table.py)."""
    from sink.history.sparkplug.table import create_sql
    return create_sql(table, database, quote_ident, table_location)


def definition_digest(table: str, database: str) -> str:
    text = ";".join([create_table_sql(table, database), *sparkplug_sql(table, database)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def external(hist: HistoryConfig) -> bool:
    return bool(hist.metastore_uri)


def session_conf(hist: HistoryConfig) -> dict[str, str]:
    """Settings of the job's SparkContext (at launch): its default database and, with an
    external metastore, Hive support pointed at it."""
    out = {}
    if hist.database != "default":
        out["spark.sql.catalog.spark_catalog.defaultDatabase"] = hist.database
    if external(hist):
        out.update({"spark.sql.catalogImplementation": "hive",
                    "spark.hadoop.hive.metastore.uris": hist.metastore_uri})
    return out


def derby_conf(hist: HistoryConfig) -> dict[str, str]:
    """spark-defaults of the Derby metastore's configuration directory."""
    d = metastore_dir(hist)
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={d / 'metastore_db'};create=true",
        "spark.sql.warehouse.dir": str(d / "warehouse"),
        "spark.sql.catalog.spark_catalog.defaultDatabase": hist.database,
        "spark.sql.session.timeZone": "UTC",           # `date` is the UTC day of accepted_at
        "spark.sql.filesourceTableRelationCacheSize": "0",  # each query: the newest version
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={d}",  # derby.log there
    }


def write_conf_dir(hist: HistoryConfig) -> Path:
    """``<metastore_dir>/conf``: spark-defaults.conf and hive-site.xml for SPARK_CONF_DIR."""
    conf = metastore_dir(hist) / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    values = derby_conf(hist)
    lines = ["# written by the history job (sink/history/catalog.py): the catalog with the table",
             "# `messages`; use it with SPARK_CONF_DIR=<this directory> spark-sql / pyspark / ..."]
    lines += [f"{k} {v}" for k, v in values.items()]
    _replace(conf / "spark-defaults.conf", "\n".join(lines) + "\n")
    url = values["spark.hadoop.javax.jdo.option.ConnectionURL"].replace("&", "&amp;")
    _replace(conf / "hive-site.xml",
             '<?xml version="1.0"?>\n<configuration>\n'
             f'  <property><name>javax.jdo.option.ConnectionURL</name><value>{url}</value></property>\n'
             f'  <property><name>hive.metastore.warehouse.dir</name>'
             f'<value>{values["spark.sql.warehouse.dir"]}</value></property>\n'
             '</configuration>\n')
    return conf


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def register_in_session(spark: SparkSession, hist: HistoryConfig) -> None:
    """``messages`` in the job's own catalog (in-memory, or the external metastore)."""
    if "://" not in hist.table or hist.table.startswith("file://"):
        Path(table_location(hist.table)).mkdir(parents=True, exist_ok=True)
    # `default` is made by Spark with the catalog: creating it again raced that (Spark warned
    # that it "was created concurrently")
    if hist.database != "default" and not spark.catalog.databaseExists(hist.database):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote_ident(hist.database)}")
    spark.sql(create_table_sql(hist.table, hist.database))
    add_missing_columns(spark, hist.database)
    if local_table(hist):   # the job writes sparkplug_metrics beside local tables only
        make_sparkplug_dir(hist)
        for statement in sparkplug_sql(hist.table, hist.database):
            spark.sql(statement)


def local_table(hist: HistoryConfig) -> bool:
    return "://" not in hist.table or hist.table.startswith("file://")


def make_sparkplug_dir(hist: HistoryConfig) -> None:
    """The directory of sparkplug_metrics (a local table), made before the job writes it: its
    catalog table needs it."""
    from sink.history.sparkplug.table import table_path
    Path(table_location(table_path(hist.table))).mkdir(parents=True, exist_ok=True)


def add_missing_columns(spark: SparkSession, database: str, name: str = TABLE_NAME) -> list[str]:
    """Columns the table gained since its definition was made (``payload_json``): an external
    metastore keeps the older definition (CREATE ... IF NOT EXISTS leaves it), so they are
    added to it (at the end of its columns); returns their names."""
    from sink.history.schema import HISTORY_SCHEMA
    full = f"{quote_ident(database)}.{quote_ident(name)}"
    have = {c.lower() for c in spark.table(full).columns}
    missing = [f for f in HISTORY_SCHEMA.fields if f.name.lower() not in have]
    if missing:
        spark.sql(f"ALTER TABLE {full} ADD COLUMNS (" + ", ".join(
            f"`{f.name}` {f.dataType.simpleString()}" for f in missing) + ")")
        log.info("table %s: added the column(s) %s to its definition in the catalog", full,
                 ", ".join(f.name for f in missing))
    return [f.name for f in missing]


def registered(hist: HistoryConfig) -> bool:
    try:
        m = json.loads((metastore_dir(hist) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return m.get("digest") == definition_digest(hist.table, hist.database)


def register_in_derby(hist: HistoryConfig, timeout: float = 600,
                      started: Callable[[subprocess.Popen[Any]], object] | None = None) -> bool:
    """Register the table in the embedded Derby metastore with a short spark-sql run (unless
    it is there already, with this location and schema). False when it could not (another
    process holds the Derby database: tried again at the job's next start). ``started``
    receives the spark-sql process (so that a stopping job can end it)."""
    if external(hist):
        return True
    conf = write_conf_dir(hist)
    if registered(hist):
        return True
    import pyspark
    spark_sql = Path(pyspark.__file__).parent / "bin" / "spark-sql"
    db = quote_ident(hist.database)
    sql = (f"CREATE DATABASE IF NOT EXISTS {db}; DROP TABLE IF EXISTS {db}.{TABLE_NAME}; "
           f"{create_table_sql(hist.table, hist.database)};")
    if local_table(hist):   # sparkplug_metrics and sparkplug_state beside it
        from sink.history.sparkplug.table import TABLE_NAME as SPARKPLUG
        make_sparkplug_dir(hist)
        sql += f" DROP TABLE IF EXISTS {db}.{SPARKPLUG}; " + " ".join(
            f"{s};" for s in sparkplug_sql(hist.table, hist.database))
    env = {**os.environ, "SPARK_CONF_DIR": str(conf)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    cmd = [str(spark_sql), "--master", "local[1]", "--driver-memory", "512m",
           "--driver-java-options", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
           f"-Dderby.system.home={metastore_dir(hist)}", "--conf", "spark.ui.enabled=false",
           "-e", sql]
    try:
        proc = subprocess.Popen(cmd, cwd=str(metastore_dir(hist)), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, preexec_fn=_lowest_priority)
        if started:
            started(proc)
        _, err = proc.communicate(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot register the table in the Derby metastore %s: %s",
                    metastore_dir(hist), exc)
        return False
    if proc.returncode != 0:
        err = err.strip().splitlines()  # type: ignore[assignment]  # (its lines)
        why = next((ln for ln in err if "Another instance of Derby" in ln or "Error" in ln),
                   err[-1] if err else f"exit status {proc.returncode}")
        log.warning("cannot register the table in the Derby metastore %s (is a spark-sql or "
                    "pyspark session using it? tried again at the next start): %s",
                    metastore_dir(hist), why[:300])
        return False
    _replace(metastore_dir(hist) / MARKER, json.dumps(
        {"digest": definition_digest(hist.table, hist.database), "database": hist.database,
         "table": TABLE_NAME, "location": table_location(hist.table)}) + "\n")
    log.info("table %s.%s registered in the Derby metastore %s: SPARK_CONF_DIR=%s spark-sql "
             "-e \"SELECT count(*) FROM messages\"", hist.database, TABLE_NAME,
             metastore_dir(hist), conf)
    return True


def _lowest_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass


class Registration(threading.Thread):
    """register_in_derby in a thread: the job does not wait for the spark-sql run (about
    20 s of CPU and 300 MB, once per table). It starts ``delay`` s after the job, at the
    lowest priority: at the job's start it took the CPU the job's Python processes needed to
    start within Spark's fixed 10 s. A job that stops first ends it."""

    def __init__(self, hist: HistoryConfig, delay: float = 60.0) -> None:
        super().__init__(name="catalog-registration", daemon=True)
        self.hist, self.delay = hist, delay
        self.proc: subprocess.Popen | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        if not self._halt.wait(self.delay):
            register_in_derby(self.hist, started=lambda p: setattr(self, "proc", p))

    def stop(self) -> None:
        self._halt.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()


def start_registration(hist: HistoryConfig) -> Registration | None:
    """Register the table in the Derby metastore in the background when it is not yet there
    (None: nothing to do: an external metastore, a remote table, or registered already)."""
    if external(hist) or "://" in hist.table and not hist.table.startswith("file://"):
        return None
    if registered(hist):
        write_conf_dir(hist)
        return None
    t = Registration(hist)
    t.start()
    return t
