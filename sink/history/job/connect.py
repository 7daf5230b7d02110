"""Spark Connect: the job's session answers queries while it runs (the server's start and stop,
its port and token), and whether the JDBC/ODBC endpoint is served."""
from __future__ import annotations

import logging
from typing import Any

from sink.history.job.config import Job, UsageError

log = logging.getLogger(__name__)

Spark = Any   # a SparkSession (pyspark is imported only where Spark runs)

CONNECT_TOKEN_CONF = "spark.connect.authenticate.token"


def connect_enabled(job: Job) -> bool:
    # an --available-now run ends when Kafka is drained: nothing to serve
    return job.history.connect and not job.available_now


def jdbc_enabled(job: Job) -> bool:
    """[history] jdbc: the JDBC/ODBC endpoint (sink/history/thrift.py), not in an --available-now run."""
    return job.history.jdbc and not job.available_now


def connect_conf(job: Job) -> dict[str, str]:
    """Where the Spark Connect server of the job's SparkContext listens (read when it starts).

    Under spark-submit the SparkContext exists before this code runs: pass the same settings
    as --conf (see deploy/spark-submit.md)."""
    if not connect_enabled(job):
        return {}
    return {"spark.connect.grpc.binding.address": job.history.connect_host,
            "spark.connect.grpc.binding.port": str(job.history.connect_port)}


def check_connect_port(job: Job) -> None:
    """Fail early, with what to do, when the Spark Connect port is taken."""
    if not connect_enabled(job):
        return
    import socket
    host, port = job.history.connect_host, job.history.connect_port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UsageError(
                f"cannot serve Spark Connect on {host}:{port} ({exc}): is another history job "
                "running? Use --connect-port N ([history] connect_port), or --no-connect "
                "([history] connect = false)") from None


def set_connect_token(spark: Spark, token: str) -> None:
    """Give the Spark Connect server its token in the running SparkContext's own SparkConf (the
    SparkEnv's: read from there when the server starts, Connect.getAuthenticateToken), never as
    a launch setting: PySpark launches the JVM with every setting of the builder as ``--conf
    KEY=VALUE`` on its command line, which every local user reads (``ps``, /proc/PID/cmdline).
    Set after the SQL session exists, so no SQL session's settings (``SET``) copy it either."""
    spark.sparkContext._jsc.sc().conf().set(CONNECT_TOKEN_CONF, token)


def serve_connect(spark: Spark, job: Job) -> None:
    """Start the Spark Connect server in this session's SparkContext (the table ``messages`` is
    in its catalog already: sink/history/catalog.py) and say where to connect."""
    if not connect_enabled(job):
        return
    # Started only now (not with spark.plugins at SparkContext start): the server's sessions
    # derive from the first session it sees, which must be this one with `messages` in its
    # catalog, not one a client's early request would make the server create on its own.
    jvm = spark.sparkContext._jvm
    from settings import environment, secrets
    if job.data_dir:   # clients need the token (settings/secrets.py): made before Spark starts
        token = secrets.connect_token(job.data_dir, create=True)
        assert token is not None   # made when missing (create=True)
        set_connect_token(spark, token)
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    token = ("$" + secrets.TOKEN_ENV if environment.SPARK_CONNECT_TOKEN.is_set() else
             secrets.secret_path(job.data_dir, secrets.TOKEN_FILE) if job.data_dir else None)
    log.info("Spark Connect on %s%s: query the table as `messages`, e.g. python -m sink.query "
             "\"SELECT count(*) FROM messages\"", job.history.connect_url,
             f" (clients need the token in {token})" if token else " (no token: open to every "
             "local process)")


def stop_connect(spark: Spark, job: Job) -> None:
    """Stop the Spark Connect server before its SparkContext: started by serve_connect (not as
    a plugin of the context), it would otherwise answer clients (the dashboard's history charts)
    from a stopped context until the JVM exits."""
    if not connect_enabled(job):
        return
    try:
        svc = spark.sparkContext._jvm.org.apache.spark.sql.connect.service.SparkConnectService
        # (nothing when it was not started, or is stopped already)
        svc.stop(getattr(svc, "stop$default$1")(), getattr(svc, "stop$default$2")())
    except Exception as exc:  # stopping anyway: the JVM ends with the job
        log.debug("cannot stop the Spark Connect server: %s", exc)
